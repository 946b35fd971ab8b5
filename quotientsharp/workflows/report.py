"""``quotientsharp study``: the rows of ``models.csv`` (no timings, so that a resumed run writes
the same file as an uninterrupted one), the tau table and ``report.md``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from quotientsharp.workflows.grid import GridPoint
from quotientsharp.workflows.manifest import ManifestEntry
from quotientsharp.workflows.options import StudyConfig
from quotientsharp.workflows.taus import sign_convention, tau_interval, without_nan

FIXED_COLUMNS = ("name", "model", "gap", "gap_from")
GENERALISATION_COLUMNS = ("train_loss", "test_loss", "train_error", "test_error")
TRAILING_COLUMNS = ("clean_loss",)


def _gap_formula(gap_from: str) -> str:
    return f"test {gap_from} - train {gap_from}"


#: Options of ``quotientsharp study`` that change the values, in the order the report's
#: command line names those that differ from their defaults (the grid options always).
_VALUE_OPTIONS = ("eps", "p", "samples", "layer", "loss", "batch_size", "max_batches", "n_iter",
                  "seed", "max_length", "tokenizer", "dtype", "gap_from", "chains", "nonfinite",
                  "symmetry")


def value_settings(config: StudyConfig) -> dict[str, Any]:
    """The settings besides the grid, the data and the gap that determine the values, by
    option name."""
    batches = config.batches
    return {"loss": batches.loss, "batch_size": batches.batch_size,
            "max_batches": batches.max_batches, "n_iter": config.solver.n_iter,
            "seed": config.seed, "eps": config.eps, "samples": config.samples,
            "layer": config.layer, "max_length": batches.max_length,
            "tokenizer": batches.tokenizer, "dtype": config.dtype}


def _number(value: float) -> str:
    """A number of the command line that reads back as itself (``0.1``, ``1e-05``; ``%g``'s 6
    digits would give another radius)."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def command_line(manifest: str, config: StudyConfig, grid: Sequence[GridPoint]) -> str:
    """The ``quotientsharp study`` command that reproduces the values of a run (the options
    that determine them; output, bootstrap and display options left out)."""
    measures = list(dict.fromkeys(point.measure for point in grid))
    parts = ["quotientsharp study", manifest, "--data", str(config.data),
             "--measure", ",".join(measures)]
    rhos = list(dict.fromkeys(point.rho for point in grid if point.rho is not None))
    if rhos:
        parts += ["--rho", ",".join(_number(rho) for rho in rhos)]
    if "geodesic" in measures:
        metrics = dict.fromkeys(p.metric for p in grid if p.metric is not None)
        orders = dict.fromkeys(str(p.order) for p in grid if p.order is not None)
        parts += ["--metric", ",".join(metrics), "--order", ",".join(orders)]
    def values(of: StudyConfig) -> dict[str, Any]:
        return {**value_settings(of), "p": of.p, "gap_from": of.gap_from,
                "chains": of.solver.chains, "nonfinite": of.nonfinite, "symmetry": of.symmetry}

    default = StudyConfig(data=config.data, measures=config.measures, rho=config.rho)
    given, defaults = values(config), values(default)
    for name in _VALUE_OPTIONS:
        value = given[name]
        if value != defaults[name]:
            parts += [f"--{name.replace('_', '-')}", _number(value) if isinstance(value, float)
                      else str(value)]
    return " ".join(parts)


def reserved_columns(grid: Sequence[GridPoint]) -> list[str]:
    """The output columns a manifest key may not take."""
    return [*FIXED_COLUMNS, *GENERALISATION_COLUMNS, *TRAILING_COLUMNS,
            *(point.key for point in grid)]


def csv_columns(entries: Sequence[ManifestEntry], grid: Sequence[GridPoint]) -> list[str]:
    """The columns of ``models.csv``: the model and its gap, the train and test losses and
    errors (when some gap is computed), the manifest's other keys, the clean loss and one
    column per grid point."""
    extra: list[str] = []
    for entry in entries:
        extra += [key for key in entry.extra if key not in extra]
    computed = any(entry.computes_gap for entry in entries)
    return [*FIXED_COLUMNS, *(GENERALISATION_COLUMNS if computed else ()), *extra,
            *TRAILING_COLUMNS, *(point.key for point in grid)]


def gap_of(entry: ManifestEntry, record: Mapping[str, Any]) -> float:
    """The model's gap: from the manifest, or computed from its train and test data."""
    return entry.gap if entry.gap is not None else float(record["generalisation"]["gap"])


def csv_row(entry: ManifestEntry, record: Mapping[str, Any], gap_from: str) -> dict[str, Any]:
    """One row of ``models.csv``."""
    row: dict[str, Any] = {"name": entry.name, "model": entry.written or str(entry.model),
                           "gap": gap_of(entry, record),
                           "gap_from": "manifest" if entry.gap is not None
                           else _gap_formula(gap_from)}
    if record.get("generalisation"):
        row.update({key: record["generalisation"].get(key) for key in GENERALISATION_COLUMNS})
    row.update(entry.extra)
    row["clean_loss"] = record.get("clean_loss")
    row.update(record["sharpness"])
    return row


def gap_label(entries: Sequence[ManifestEntry], gap_from: str) -> str:
    """What the gap is, for the plots' horizontal axis."""
    given = {entry.gap is not None for entry in entries}
    if given == {True}:
        return "generalisation gap (from the manifest)"
    if given == {False}:
        return f"generalisation gap ({_gap_formula(gap_from)})"
    return f"generalisation gap (manifest, or {_gap_formula(gap_from)})"


def tau_rows(gaps: Sequence[float], values: Mapping[str, Sequence[float]],
             grid: Sequence[GridPoint], *, resamples: int, confidence: float,
             seed: int) -> list[dict[str, Any]]:
    """Per grid point, its :meth:`GridPoint.as_dict` with the Kendall taus between the gap and
    its ``values`` (grid key -> one per model; pairs with a NaN left out) and their bootstrap
    intervals (``None`` where undefined)."""
    rows = []
    for point in grid:
        kept = without_nan(gaps, values[point.key])
        row: dict[str, Any] = dict.fromkeys(("tau_a", "tau_a_low", "tau_a_high", "tau_b",
                                             "tau_b_low", "tau_b_high"))
        if len(kept[0]) >= 2:
            tau = tau_interval(*kept, resamples, seed, confidence)
            row.update(tau_a=tau.tau_a, tau_a_low=tau.a_low, tau_a_high=tau.a_high,
                       tau_b=tau.tau_b, tau_b_low=tau.b_low, tau_b_high=tau.b_high)
        rows.append({**point.as_dict(), "count": len(kept[0]), **row, "resamples": resamples,
                     "confidence": confidence})
    return rows


def solver_quality(records: Sequence[Mapping[str, Any]], key: str) -> dict[str, Any]:
    """How trustworthy the values of grid point ``key`` are over the models' records: the
    lowest reach estimate ``reach_min``, the shares of (model, batch) values ``reached`` (reach
    at least 0.99) and ``local``, and the largest ratio ``second_order_max`` of the path's
    second- to first-order term; ``None`` where the measure has none."""
    reaches = [r for record in records for r in record.get("reach", {}).get(key) or []
               if r is not None]
    places = [x for record in records for x in record.get("locality", {}).get(key) or []]
    seconds = [x["second_order"] for x in places if x.get("second_order") is not None]
    return {"reach_min": min(reaches) if reaches else None,
            "reached": (sum(r >= 0.99 for r in reaches) / len(reaches)) if reaches else None,
            "local": (sum(bool(x["local"]) for x in places) / len(places)) if places else None,
            "second_order_max": max(seconds) if seconds else None}


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def _with_interval(value: float | None, low: float | None, high: float | None) -> str:
    if value is None:
        return "undefined"
    text = f"{value:+.2f}"
    return text if low is None else f"{text} [{low:+.2f}, {high:+.2f}]"


def tau_table(taus: Sequence[Mapping[str, Any]], markdown: bool = True) -> str:
    """The taus as a markdown table, or as aligned plain text for the console."""
    from quotientsharp.engine.result import reach_text

    level = f"{100 * taus[0]['confidence']:g}%" if taus else "95%"
    header = ["measure", "N", f"Kendall tau-a [{level} interval]",
              f"Kendall tau-b [{level} interval]"]
    cells = [[row["label"], str(row["count"]),
              _with_interval(row["tau_a"], row["tau_a_low"], row["tau_a_high"]),
              _with_interval(row["tau_b"], row["tau_b_low"], row["tau_b_high"])]
             for row in taus]
    if any("reached" in row for row in taus):
        # beside each tau, how far its values can be trusted (solver_quality)
        header += ["reach >= 0.99", "min reach", "local"]
        for cell, row in zip(cells, taus, strict=True):
            low = row.get("reach_min")
            cell += [_share(row.get("reached")), "-" if low is None else reach_text(low),
                     _share(row.get("local"))]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in cells]
        return "\n".join(lines)
    widths = [max(len(line[i]) for line in [header, *cells]) for i in range(len(header))]
    lines = ["  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True))
             .rstrip() for line in [header, *cells]]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def study_report(manifest: str, config: StudyConfig, entries: Sequence[ManifestEntry],
                 records: Mapping[str, Mapping[str, Any]], grid: Sequence[GridPoint],
                 taus: Sequence[Mapping[str, Any]], plots: Sequence[str], *, world_size: int,
                 resumed: int, wall_seconds: float) -> str:
    """The markdown report ``report.md``: what was measured, the tau table, the plots."""
    command, bootstrap = command_line(manifest, config, grid), config.bootstrap
    gaps = [gap_of(entry, records[entry.name]) for entry in entries]
    first = records[entries[0].name]
    classes = sorted({records[entry.name]["model_class"] for entry in entries})
    lines = [
        f"# Sharpness against generalisation: `{manifest}`",
        "",
        f"Made by `{command}` ({len(entries)} models, wall time {wall_seconds:.1f} s"
        + (f", {world_size} ranks under torchrun" if world_size > 1 else "")
        + (", resumed" if resumed else "") + ").",
        "",
        f"- Models: {len(entries)} from `{manifest}` ({', '.join(classes)}).",
        f"- Generalisation: {gap_label(entries, config.gap_kind)}; over the models from "
        f"{min(gaps):.4g} to {max(gaps):.4g}.",
        f"- Sharpness on `{config.data}`: {first['examples']} examples in {first['batches']} "
        f"batch(es) of at most {config.batches.batch_size}, per batch then averaged; "
        f"loss {config.batches.loss}; Auto-PGD with {config.solver.n_iter} steps for the "
        f"ascent measures; seed {config.seed}.",
        f"- Intervals: percentile bootstrap over the models, {bootstrap.resamples} draws, "
        f"seed {bootstrap.seed}, {100 * bootstrap.confidence:g}% (a draw repeats "
        "models; a pair of two copies of one model says nothing about the ranking and is left "
        "out of both taus).",
        "",
        sign_convention("the generalisation gap"),
        "",
        tau_table(taus),
        "",
    ]
    if plots:
        lines += ["## Plots", ""]
        by_key = {point.key: point for point in grid}
        for name in plots:
            key = name.removeprefix("scatter_").removesuffix(".png")
            label = by_key[key].label(greek=False) if key in by_key else key
            lines += [f"![{label}]({name})", ""]
    lines += ["## Files", "",
              "- `models.csv`: one row per model (the gap, the manifest's other keys, one "
              "column per measure);",
              "- `models.jsonl`: the full record of each model (per-batch values, timings);",
              "- `taus.json`, `taus.csv`: the table above, every number;",
              "- `run.json`: settings, versions, timings (checked by `--resume`)."]
    return "\n".join(lines) + "\n"
