"""Two held-out tasks (not among benchmarks/optimisers.py's TASKS), generated offline from the
sentiment task's word lists, in the two-clause format of the benchmark's generator.

- negation: label 1 iff the sentence contains "not" anywhere. Each clause is negated
  independently with probability 1 - sqrt(1/2) ~ 0.293, so P(label 1) = 1/2.
- subject: label 1 iff the FIRST clause's subject is in a fixed half of the 16 subjects
  (SUBJECT_HALF, drawn once with numpy seed 12345); the second clause's subject is drawn from
  all 16, independently. Negation w.p. 1/2 per clause, as in the benchmark's generator.

Both use numpy streams (seed, 101) and (seed, 102); splits use the benchmark's _sentences
(train seed 0 without held-out adjectives, validation seed 1, test seed 2, with them).
"""
from __future__ import annotations

import math

import numpy as np

from quotientsharp.reproduce.families import sentiment_task as words

_perm = np.random.default_rng(12345).permutation(len(words.SUBJECTS))
SUBJECT_HALF = frozenset(words.SUBJECTS[i] for i in sorted(_perm[: len(words.SUBJECTS) // 2]))
P_NEG_BALANCED = 1.0 - math.sqrt(0.5)


def _clause(rng, adjectives, p_negated):
    negated = bool(rng.random() < p_negated)
    adjective = adjectives[rng.integers(len(adjectives))]
    subject = words.SUBJECTS[rng.integers(len(words.SUBJECTS))]
    parts = [subject, words.VERBS[rng.integers(len(words.VERBS))]]
    parts += ["not"] if negated else []
    parts += [words.ADVERBS[rng.integers(len(words.ADVERBS))]] if rng.random() < 0.5 else []
    return " ".join(parts + [adjective]), subject, negated


def _sentence(rng, adjectives, p_negated):
    (c0, s0, n0), (c1, s1, n1) = (_clause(rng, adjectives, p_negated) for _ in range(2))
    connective = ("and", ", but", ", while", ";")[rng.integers(4)]
    text = f"{c0}{connective if connective[0] in ',;' else ' ' + connective} {c1}"
    return text, (s0, n0), (s1, n1)


def _adjectives(held_out):
    return [a for a in words.POSITIVE + words.NEGATIVE if held_out or a not in words.HELD_OUT]


def negation_sentences(count: int, seed: int, held_out: bool):
    rng = np.random.default_rng([seed, 101])
    adjectives = _adjectives(held_out)
    out = []
    for _ in range(count):
        text, (_, n0), (_, n1) = _sentence(rng, adjectives, P_NEG_BALANCED)
        label = int(n0 or n1)
        assert label == int(" not " in f" {text} ")
        out.append((text, label))
    return out


def subject_sentences(count: int, seed: int, held_out: bool):
    rng = np.random.default_rng([seed, 102])
    adjectives = _adjectives(held_out)
    out = []
    for _ in range(count):
        text, (s0, _), _ = _sentence(rng, adjectives, 0.5)
        out.append((text, int(s0 in SUBJECT_HALF)))
    return out


NEW_GENERATORS = {"negation": negation_sentences, "subject": subject_sentences}


# ---- two further (harder) tasks, added after the first two saturated near zero loss
def sameverb_sentences(count: int, seed: int, held_out: bool):
    """label 1 iff both clauses use the same verb; the second clause's verb equals the first's
    with probability 1/2 (else one of the other three), so labels are balanced."""
    rng = np.random.default_rng([seed, 103])
    adjectives = _adjectives(held_out)
    out = []
    for _ in range(count):
        verbs = []
        clauses = []
        for k in range(2):
            if k == 0:
                verb = words.VERBS[rng.integers(len(words.VERBS))]
            else:
                same = bool(rng.random() < 0.5)
                others = [v for v in words.VERBS if v != verbs[0]]
                verb = verbs[0] if same else others[rng.integers(len(others))]
            verbs.append(verb)
            parts = [words.SUBJECTS[rng.integers(len(words.SUBJECTS))], verb]
            parts += ["not"] if rng.random() < 0.5 else []
            parts += [words.ADVERBS[rng.integers(len(words.ADVERBS))]] if rng.random() < 0.5 \
                else []
            clauses.append(" ".join(parts + [adjectives[rng.integers(len(adjectives))]]))
        connective = ("and", ", but", ", while", ";")[rng.integers(4)]
        text = f"{clauses[0]}{connective if connective[0] in ',;' else ' ' + connective} " \
               f"{clauses[1]}"
        out.append((text, int(verbs[0] == verbs[1])))
    return out


def polarity_sentences(count: int, seed: int, held_out: bool):
    """label = lexical polarity of the FIRST clause's adjective (1 if in POSITIVE), ignoring
    any "not" (which the sentiment tasks would apply); held-out adjectives only in val/test."""
    rng = np.random.default_rng([seed, 104])
    adjectives = _adjectives(held_out)
    out = []
    for _ in range(count):
        text, _, _ = _sentence(rng, adjectives, 0.5)
        first_clause_words = text.replace(",", " ,").replace(";", " ;").split()
        # the first adjective in the sentence belongs to the first clause
        first_adj = next(w for w in first_clause_words
                         if w in words.POSITIVE or w in words.NEGATIVE)
        out.append((text, int(first_adj in words.POSITIVE)))
    return out


NEW_GENERATORS.update({"sameverb": sameverb_sentences, "polarity": polarity_sentences})
