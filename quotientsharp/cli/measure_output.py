"""``quotientsharp measure``: what goes out, the table on stdout and the ``--json`` document."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quotientsharp.workflows.labels import bindings_metric

if TYPE_CHECKING:
    import torch


def _installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(device: torch.device) -> dict[str, Any]:
    """What the numbers were computed with: versions of Python, torch, quotientsharp and
    transformers, the platform, the device (and its name on CUDA) and torch's thread counts."""
    import torch

    from quotientsharp import __version__

    info: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__,
        "quotientsharp": __version__, "transformers": _installed("transformers"),
        "numpy": _installed("numpy"), "platform": platform.platform(), "device": str(device),
        "cuda": torch.version.cuda, "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads()}
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
    return info


def measure_label(measure: str, settings: dict[str, Any]) -> str:
    """The name of ``measure`` in the table, with the settings that tell its variants apart."""
    if measure == "geodesic":
        # a user's bindings measure with their own quotients' metric: named by binding
        bindings = settings.get("bindings")
        metric = (f"{bindings_metric(bindings)} metric" if bindings
                  else settings.get("metric"))
        return f"geodesic ({metric}, order {settings['order']})"
    if measure in ("worst_case", "adaptive") and settings.get("p") == "inf":
        return f"{measure} (Linf)"
    return measure


def jsonable(value: Any) -> Any:
    """Plain JSON types: tuples to lists, dtypes and other objects to strings, inf to 'inf'."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


def results_table(rows: Sequence[tuple[str, Any, float]]) -> str:
    """The text table of stdout: one line per ``(label, result, seconds)`` (value, batch range,
    clean loss, the lowest reach estimate over the batches, whether every ball was local,
    time)."""
    from quotientsharp.engine.result import reach_text

    header = (f"{'measure':28s} {'value':>12s} {'min batch':>12s} {'max batch':>12s} "
              f"{'clean loss':>11s} {'reach':>6s} {'local':>5s} {'seconds':>8s}")
    lines = [header, "-" * len(header)]
    for label, result, seconds in rows:
        reach = "-" if result.min_reach is None else reach_text(result.min_reach)
        local = {None: "-", True: "yes", False: "no"}[result.local]
        losses = result.clean_losses
        lines.append(f"{label:28s} {result.value:12.5g} {min(result.per_batch):12.5g} "
                     f"{max(result.per_batch):12.5g} {sum(losses) / len(losses):11.5g} "
                     f"{reach:>6s} {local:>5s} {seconds:8.2f}")
    return "\n".join(lines)


def solver_quality(result: Any) -> dict[str, Any]:
    """The JSON entries of an ascent measure's solver diagnostics: reach, chains, evaluations
    and locality per batch, the convergence traces, the reference solve's gaps, the blocks."""
    entries: dict[str, Any] = {}
    if result.evaluations:
        entries.update(reach=result.reach, min_reach=result.min_reach, chains=result.chains,
                       evaluations=result.evaluations, locality=result.locality,
                       local=result.local)
    if result.traces:
        entries["traces"] = result.traces
    if result.reference_per_batch:
        entries.update(reference_value=result.reference_value, gap=result.gap,
                       relative_gap=result.relative_gap,
                       reference_per_batch=result.reference_per_batch,
                       gap_per_batch=result.gap_per_batch,
                       relative_gap_per_batch=result.relative_gap_per_batch,
                       reference_traces=result.reference_traces)
    if result.blocks is not None:
        entries.update(blocks=result.blocks, block_summary=result.block_summary())
    return entries


def reference_lines(rows: Sequence[tuple[str, Any]]) -> str:
    """One line per measure with a reference solve: its value, the gap and the relative gap."""
    lines = []
    for label, result in rows:
        if result.reference_value is None:
            continue
        reference = result.settings["reference_solve"]
        lines.append(f"{label}: reference solve ({reference['n_iter']} steps, "
                     f"{reference['restarts']} restart(s)) {result.reference_value:.6g}, "
                     f"Auto-PGD {result.value:.6g}: gap {result.gap:.3g} "
                     f"({100 * result.relative_gap:.3g}% of the reference)")
    return "\n".join(lines)


def blocks_table(label: str, summary: Sequence[dict[str, Any]], top: int = 15) -> str:
    """The block-wise table of one measure: the ``top`` blocks with the largest loss change
    (by absolute value; mean over batches), with kind and norm share."""
    # a loss change that was not finite on any batch (None) sorts last and reads "not finite"
    rows = sorted(summary, key=lambda r: -1.0 if r["loss_change"] is None
                  else abs(r["loss_change"]), reverse=True)
    width = max([28, *(len(r["name"]) for r in rows[:top])])
    header = f"{'block':{width}s} {'kind':>9s} {'norm share':>10s} {'loss change':>12s}"
    lines = [f"block-wise, {label}: loss change with only that block's part of the best "
             "perturbation (mean over batches)", header, "-" * len(header)]
    for row in rows[:top]:
        lines.append(f"{row['name']:{width}s} {row['kind']:>9s} {row['norm_share']:10.3%} "
                     + ("  not finite" if row["loss_change"] is None
                        else f"{row['loss_change']:12.5g}"))
    if len(rows) > top:
        lines.append(f"... {len(rows) - top} more block(s) with smaller loss changes "
                     "(all in --json)")
    return "\n".join(lines)


def write_json(path: Path, document: dict[str, Any]) -> None:
    """Write ``document`` to ``path`` (folders created) as indented JSON of plain types."""
    from quotientsharp.workflows.files import write_text_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # atomic: a reader, or a kill mid-write, sees the old document or the new one
    write_text_atomic(path, json.dumps(jsonable(document), indent=2))
