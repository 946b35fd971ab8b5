"""Family studies (ViT, BERT): the per-model CSV columns, the Kendall taus and the docs section.

:func:`csv_columns` names the columns of ``models.csv``, :func:`tau_rows` computes Kendall's tau
between the generalisation gap and each measure, next to the paper's value, and
:func:`family_section` writes the markdown section ``docs/results/<study>.md``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .family_measures import MeasureSpec
from .family_settings import FamilyStudy

__all__ = [
    "csv_columns",
    "family_section",
    "spec_label",
    "tau_rows",
]


def spec_label(spec: MeasureSpec, greek: bool = True) -> str:
    """The readable name of a measure of the study: measure, metric, order and radius."""
    from .labels import measure_label

    return measure_label(spec.measure, metric=spec.options.get("metric"),
                         order=spec.options.get("order"), rho=spec.rho,
                         p=spec.options.get("p"), greek=greek)


def csv_columns(specs: Sequence[MeasureSpec]) -> list[str]:
    """Columns of the per-model CSV (per-batch values stay in the JSONL file)."""
    return (["index", "learning_rate", "weight_decay", "epochs", "label_smoothing",
             "train_size", "init_seed", "parameters", "final_train_objective", "train_error",
             "test_error", "gap", "train_loss", "test_loss"]
            + [spec.key for spec in specs] + ["diverged", "train_seconds", "measure_seconds"])


def tau_rows(records: Sequence[Mapping[str, Any]], specs: Sequence[MeasureSpec],
             paper: Mapping[str, float]) -> list[dict[str, Any]]:
    """Kendall tau-a and tau-b between the gap and each measure, next to the paper's value."""
    from .common import kendall_tau_a, kendall_tau_b

    gaps = [r["gap"] for r in records]
    rows = []
    for spec in specs:
        values = [r[spec.key] for r in records]
        enough = len(records) >= 2
        rows.append({"key": spec.key, "measure": spec.label, "rho": spec.rho,
                     "tau_a": kendall_tau_a(gaps, values) if enough else None,
                     "tau_b": kendall_tau_b(gaps, values) if enough else None,
                     "paper": paper.get(spec.paper_key) if spec.paper_key else None})
    return rows


def _ranks_text(world_size: int) -> str:
    return (f" per rank, {world_size} ranks under torchrun, each model trained and measured "
            "whole on one rank") if world_size > 1 else ""


def _format_rho(rho: float | None) -> str:
    return "—" if rho is None else f"{rho:g}"


def family_section(study: FamilyStudy, settings: Mapping[str, Any],
                   records: Sequence[Mapping[str, Any]], taus: Sequence[Mapping[str, Any]],
                   wall_seconds: float, threads: int, resumed: int,
                   world_size: int = 1) -> str:
    """The markdown section ``docs/results/<study>.md`` (``world_size``: ranks of this session,
    mentioned when above 1)."""
    from .common import TauRow, tau_table

    table = tau_table([TauRow(row["measure"] if row["rho"] is None
                              else f"{row['measure']} (rho {_format_rho(row['rho'])})",
                              row["tau_a"], row["tau_b"], row["paper"],
                              "" if row["paper"] is None else "paper: other setting")
                       for row in taus])
    counted = [r for r in records if not r["diverged"]]
    diverged = [r["index"] for r in records if r["diverged"]]
    space = settings["hyperparameter_space"]
    quick = settings["quick"]
    command = f"quotientsharp reproduce {study.name}" + (" --quick" if quick else "")
    folder = f"results/{study.name}" + ("-quick" if quick else "")
    lines = [f"## {study.title}", ""]
    if quick:
        lines += ["**A `--quick` smoke run (tiny training, few ascent steps): the numbers mean "
                  "nothing.**", ""]
    lines += [
        f"Reproduce: `{command} --docs docs` (outputs in `{folder}/`: per-model CSV and JSONL "
        "written as each model finishes, `taus.json`, one scatter plot per measure, "
        f"`run.json`). This run: {len(records)} models, {len(counted)} counted, wall time "
        f"{wall_seconds / 60:.1f} min ({threads} torch thread(s)"
        f"{_ranks_text(world_size)}{', resumed' if resumed else ''}).",
        "",
        " ".join(study.description.split()),
        "",
        f"- Architecture: `{json.dumps(settings['model_config'], sort_keys=True)}`.",
        f"- Per model i, drawn from `numpy.random.default_rng([{settings['seed']}, i])` (no "
        f"model is filtered or redrawn): learning rate log-uniform in "
        f"{space['learning_rate']}, weight decay log-uniform in {space['weight_decay']}, epochs "
        f"uniform in {space['epochs']}, label smoothing uniform in "
        f"{space['label_smoothing']}, training-set size uniform in {space['train_size']}, "
        f"initialisation seed. AdamW, batch {settings['train_batch_size']}, 5% warm-up then "
        "cosine decay, dropout 0.",
    ]
    if counted:
        gaps = [r["gap"] for r in counted]
        train_errors = [r["train_error"] for r in counted]
        test_errors = [r["test_error"] for r in counted]
        lines.append(
            f"- Generalisation gap = test error - train error (0-1 errors): range "
            f"[{min(gaps):+.3f}, {max(gaps):+.3f}]; train error [{min(train_errors):.3f}, "
            f"{max(train_errors):.3f}], test error [{min(test_errors):.3f}, "
            f"{max(test_errors):.3f}].")
    if diverged:
        lines.append(f"- Diverged in training (kept in the records, left out of the taus): "
                     f"models {diverged}.")
    lines += [
        f"- Sharpness on the same {settings['sharpness_points']} training points for every "
        f"model (the first points of the pool, inside every training set), in "
        f"{settings['sharpness_points'] // settings['sharpness_batch_size']} batches of "
        f"{settings['sharpness_batch_size']}, per batch then averaged; Auto-PGD with "
        f"{settings['n_iter']} steps from xi = 0, eta0 = 2 rho. Geodesic: attention heads in "
        "the GL(h) quotient, every other parameter in the adaptive metric along straight "
        "lines. Radii fixed once, before the study, from pilot models (on which the perturbed "
        "loss rose by about 0.005-0.5 nats, far above round-off); the same for every model "
        "and never adjusted to any correlation.",
        "",
        f"Kendall tau between the gap and each sharpness measure over the {len(counted)} "
        f"counted models. The paper's column is {study.paper_setting}: a different setting "
        "(large pretrained models, fine-tuned), shown for orientation only.",
        "",
        table,
    ]
    return "\n".join(lines) + "\n"
