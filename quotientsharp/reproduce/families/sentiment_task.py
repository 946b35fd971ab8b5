"""A generated English sentiment task with negation, contrast and unseen adjectives.

Sentences ``<subject> <verb> [not] [<adverb>] <adjective>``, one clause or two joined by ``and``
(same sentiment) or ``, but`` (opposite); the label is the last clause's sentiment, flipped with
probability ``noise``. The :data:`HELD_OUT` adjectives never occur in the training pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quotientsharp.core.scalars import check_int

SUBJECTS = ("the waiter", "the movie", "the hotel", "the food", "the service", "the book",
            "the concert", "the room", "the staff", "the game", "the car", "the show",
            "the teacher", "the meal", "the trip", "the song")
VERBS = ("was", "is", "seemed", "felt")
ADVERBS = ("very", "really", "quite", "rather", "truly")
POSITIVE = ("good", "great", "nice", "pleasant", "excellent", "wonderful", "friendly",
            "lovely", "fantastic", "superb", "delightful", "brilliant")
NEGATIVE = ("bad", "awful", "terrible", "rude", "poor", "horrible", "nasty", "boring",
            "dreadful", "lousy", "miserable", "unpleasant")
#: Adjectives that never occur in the training pool (the last third of each list).
HELD_OUT = frozenset(POSITIVE[8:] + NEGATIVE[8:])


@dataclass(frozen=True)
class Sentence:
    """One generated sentence: the text, the clean label and the label after noise."""

    text: str
    clean_label: int
    label: int


def clause_sentiment(adjective: str, negated: bool) -> int:
    """1 if the clause ``... [not] <adjective>`` is positive, else 0."""
    if adjective in POSITIVE:
        polarity = 1
    elif adjective in NEGATIVE:
        polarity = 0
    else:
        raise ValueError(f"adjective {adjective!r} is in neither word list")
    return 1 - polarity if negated else polarity


def _clause(rng: np.random.Generator, sentiment: int, adjectives: dict[int, list[str]]) -> str:
    negated = bool(rng.random() < 0.5)
    # the adjective's polarity that yields the asked sentiment after the optional negation
    polarity = 1 - sentiment if negated else sentiment
    words = [SUBJECTS[rng.integers(len(SUBJECTS))], VERBS[rng.integers(len(VERBS))]]
    if negated:
        words.append("not")
    if rng.random() < 0.5:
        words.append(ADVERBS[rng.integers(len(ADVERBS))])
    choices = adjectives[polarity]
    words.append(choices[rng.integers(len(choices))])
    return " ".join(words)


def generate_sentences(count: int, seed: int, noise: float, held_out: bool) -> list[Sentence]:
    """``count`` sentences from ``numpy`` seed ``seed``, each label flipped with probability
    ``noise``; the :data:`HELD_OUT` adjectives occur only with ``held_out``."""
    count = check_int("count", count, 1)
    if not 0.0 <= noise <= 0.5:
        raise ValueError(f"noise must be in [0, 0.5], got {noise!r}")
    adjectives = {1: [a for a in POSITIVE if held_out or a not in HELD_OUT],
                  0: [a for a in NEGATIVE if held_out or a not in HELD_OUT]}
    rng = np.random.default_rng(seed)
    sentences = []
    for _ in range(count):
        label = int(rng.integers(2))
        two_clauses = bool(rng.random() < 0.5)
        if two_clauses:
            contrast = bool(rng.random() < 0.5)
            first = _clause(rng, 1 - label if contrast else label, adjectives)
            text = f"{first}{', but' if contrast else ' and'} {_clause(rng, label, adjectives)}"
        else:
            text = _clause(rng, label, adjectives)
        noisy = 1 - label if rng.random() < noise else label
        sentences.append(Sentence(text, label, noisy))
    return sentences
