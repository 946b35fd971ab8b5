"""``quotientsharp reproduce reach``: how much of the best-found maximum the default solver
reaches, whether its warnings say so, per measure, against the radius rho.

On diagonal nets, a tiny float64 BERT and the first trained models of each family study
(:mod:`quotientsharp.reproduce.reach_models`), at each ``rho`` of :data:`RHOS`
(``docs/results/reach.md`` describes each part). A few hours of one core; ``--quick``: 2 radii,
2 nets, 1 BERT batch and one model of each quick family. Units go to ``OUT/units.jsonl`` as each
finishes (``--resume``, torchrun); then ``OUT/reach.json`` and ``OUT/page.json``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from quotientsharp.core.scalars import check_int
from quotientsharp.engine.blocks import LOCALITY_RULE
from quotientsharp.engine.solver import AscentSettings
from quotientsharp.reproduce.config import ReachConfig, check_config, run_study_command
from quotientsharp.reproduce.diagonal.data import derived_seed, draw_hyperparameters, make_problem
from quotientsharp.reproduce.diagonal.exact import (
    REFERENCE_MEASURES,
    mix_exact_maxima,
    mix_rate_ball_maxima,
    reference_maxima,
)
from quotientsharp.reproduce.diagonal.measures import MEASURES, measure_nets, sharpness_batches
from quotientsharp.reproduce.diagonal.settings import DiagonalSettings
from quotientsharp.reproduce.diagonal.training import train_nets
from quotientsharp.reproduce.reach_models import (
    DEFAULT_STEPS,
    FAMILIES,
    QUICK_FAMILIES,
    family_rhos,
    family_study_of,
    family_unit,
    percent,
    reach_shares,
    tiny_bert_unit,
)
from quotientsharp.reproduce.results_page import page_document, write_page
from quotientsharp.workflows.files import write_json_atomic
from quotientsharp.workflows.resumable import ResumableRun

HELP = "solver reach against rho: the default solver's share of the best-found maximum"

#: The radii of the study (``--quick``: the first two).
RHOS = (0.02, 0.1, 0.3)


def diagonal_reach(rhos: Sequence[float], nets: int, seed: int,
                   overrides: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Measure -> rho -> reach on diagonal nets; ``overrides``: diagonal settings."""
    settings = DiagonalSettings.quick(**{"nets": nets, "seed": seed,
                                         "reference_iterations": 400, "reference_restarts": 3,
                                         **(overrides or {})})
    problem = make_problem(settings)
    trained = train_nets(problem, draw_hyperparameters(settings), settings)
    healthy = [i for i in sorted(trained) if not trained[i].diverged]
    if not healthy:
        raise ValueError("every diagonal net diverged: no reach to report")
    u = torch.tensor([trained[i].u for i in healthy], dtype=torch.float64)
    v = torch.tensor([trained[i].v for i in healthy], dtype=torch.float64)
    inputs, targets = sharpness_batches(problem, settings)
    chosen = [m for m in MEASURES if m.name in ("adaptive", "geodesic_inv_exact",
                                                "geodesic_mix_exact",
                                                "geodesic_mix_exact_rateball")]
    exact = {"geodesic_mix_exact": mix_exact_maxima,
             "geodesic_mix_exact_rateball": mix_rate_ball_maxima}
    out: dict[str, dict[str, Any]] = {m.name: {} for m in chosen}
    for rho in rhos:
        default = measure_nets(u, v, inputs, targets, rho, AscentSettings(n_iter=DEFAULT_STEPS),
                               chosen)
        strong = reference_maxima(u, v, inputs, targets, rho, settings.reference_ascent,
                                  [derived_seed(seed, f"reach:{i}") for i in healthy],
                                  REFERENCE_MEASURES)
        for spec in chosen:
            candidates = [default[spec.name]]
            if spec.name in strong:
                candidates.append(strong[spec.name])
            if spec.name in exact:
                candidates.append(exact[spec.name](u, v, inputs, targets, rho))
            best = torch.stack(candidates).amax(0)
            out[spec.name][f"{rho:g}"] = percent(default[spec.name].flatten().tolist(),
                                                  best.flatten().tolist())
    return out


def _pooled(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The values of several models' records, each list the batches of every model."""
    pooled: dict[str, dict[str, Any]] = {}
    for record in records:
        for measure, by_rho in record["values"].items():
            for rho, entry in by_rho.items():
                into = pooled.setdefault(measure, {}).setdefault(rho, {})
                if "refused" in entry:
                    into["refused"] = entry["refused"]
                    continue
                for column, values in entry.items():
                    into.setdefault(column, []).extend(values)
    return pooled


def _family_results(family: Any, rhos: Sequence[float],
                    records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    study = family_study_of(family.study)
    measured = [r for r in records if r["values"] is not None]
    if not measured:
        raise ValueError(f"every {family.study} model diverged: no reach to report")
    own = study.rhos
    return {"title": study.title, "models": [
                {key: r.get(key) for key in ("index", "diverged", "train_error", "test_error",
                                             "gap", "train_seconds", "measure_seconds")}
                for r in records],
            "batches": measured[0]["batches"], "rhos": list(rhos),
            "ascent_steps": records[0]["ascent_steps"], "reference": records[0]["reference"],
            "page_radii": (f"adaptive {own['adaptive']:g}, worst case {own['worst_case']:g}, "
                           f"inv {own['inv']:g}, mix {own['mix']:g}"),
            "page_rhos": {key: float(own[key]) for key in ("adaptive", "worst_case", "inv",
                                                           "mix")},
            "reach": reach_shares(_pooled(measured))}


def reach_study(out: Path, *, quick: bool = False, seed: int = 0, threads: int = 1,
                docs: Path | None = None, rhos: Sequence[float] | None = None,
                nets: int | None = None, batches: int | None = None, resume: bool = False,
                diagonal_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run (or resume) the study, write ``out/reach.json`` and ``out/page.json`` (and with
    ``docs`` the page and ``docs/results/data/reach.json``); the results. The units (diagonal
    nets, tiny BERT, each family model) go through
    :class:`~quotientsharp.workflows.resumable.ResumableRun`; ``rhos``, ``nets``, ``batches`` and
    ``diagonal_overrides`` replace the full and quick sizes.
    """
    threads = check_int("threads", threads, 1)
    rhos = tuple(rhos) if rhos is not None else RHOS[:2] if quick else RHOS
    nets = nets if nets is not None else 2 if quick else 6
    batches = batches if batches is not None else 1 if quick else 4
    families = QUICK_FAMILIES if quick else FAMILIES
    radii = {f.study: family_rhos(f.study, rhos) for f in families}
    by_unit = {f"{f.study}:{index}": (f, index) for f in families for index in range(f.models)}
    units = ["diagonal", "tiny-bert", *by_unit]
    settings = {"rhos": list(rhos), "seed": seed, "quick": quick,
                "diagonal": {"nets": nets, "overrides": diagonal_overrides or {}},
                "tiny_bert": {"batches": batches},
                "families": {f.study: {**dataclasses.asdict(f), "rhos": radii[f.study]}
                             for f in families}}
    out = Path(out)

    def work(unit: str, status: Any) -> dict[str, Any]:
        if unit == "diagonal":
            return {"unit": unit, "reach": diagonal_reach(rhos, nets, seed, diagonal_overrides)}
        if unit == "tiny-bert":
            return {"unit": unit, "values": tiny_bert_unit(rhos, batches, seed)}
        family, index = by_unit[unit]
        return {"unit": unit, **family_unit(family, index, radii[family.study], quick, out,
                                            status)}

    run = ResumableRun(out, units, study="reach", settings=settings, resume=resume,
                       owned=["units.jsonl", "reach.json", "page.json"], records="units.jsonl",
                       key="unit", unit="unit", description="reach", progress=False)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        run.open()
        records = run.run(work)
    finally:
        torch.set_num_threads(saved)
    command = ("quotientsharp reproduce reach" + (" --quick" if quick else "")
               + (f" --seed {seed}" if seed else "") + " --docs docs")

    def finish(folder: Any, wall: float) -> dict[str, Any]:
        results: dict[str, Any] = {
            "rhos": list(rhos), "seed": seed, "threads": threads, "out": str(out),
            "world_sizes": folder.run_info.get("world_sizes", [run.world_size]),
            "wall_seconds": wall,
            "diagonal_nets": nets, "bert_batches": batches,
            "diagonal": {measure: {rho: {"ascent": entry} for rho, entry in by_rho.items()}
                         for measure, by_rho in records["diagonal"]["reach"].items()},
            "bert": reach_shares(records["tiny-bert"]["values"]),
            "families": {f.study: _family_results(
                f, radii[f.study], [records[f"{f.study}:{i}"] for i in range(f.models)])
                for f in families},
            # how `local` was judged: a page of an earlier run says which rule
            "locality_rule": LOCALITY_RULE}
        document = page_document("reach", {"results": results, "command": command})
        write_json_atomic(folder.file("reach.json"), results)
        write_json_atomic(folder.file("page.json"), document)
        if docs is not None:
            # the family pages' reach statements read it (docs/_hooks/results_pages)
            data = Path(docs) / "results" / "data" / "reach.json"
            data.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(data, results)
            write_page(Path(docs), document)
        return results

    return run.finish(finish)


def run(config: ReachConfig) -> int:
    """Run ``quotientsharp reproduce reach`` as ``config`` says; the exit status."""
    check_config(config, ReachConfig, "reach")
    out = config.out if config.out is not None else Path(
        "results/reach-quick" if config.quick else "results/reach")
    return run_study_command(
        "reach", "units", out,
        lambda: reach_study(out, quick=config.quick, seed=config.seed, threads=config.threads,
                            docs=config.docs, resume=config.resume),
        lambda results: print("\n".join(console_lines(results))))


def console_lines(results: dict[str, Any]) -> list[str]:
    """One plain line per part, measure and radius: the default solver's reach (min /
    median, percent of the best value found) and, where measured, the problems it fell short
    on and how many of them its result flagged."""
    parts = {"diagonal": results["diagonal"], "tiny BERT": results["bert"],
             **{name: family["reach"] for name, family in results["families"].items()}}
    lines = []
    for part, reach in parts.items():
        for measure, by_rho in reach.items():
            for rho, entry in by_rho.items():
                if "refused" in entry:
                    lines.append(f"{part} {measure} rho={rho}: refused ({entry['refused']})")
                    continue
                share = entry["ascent"]
                line = (f"{part} {measure} rho={rho}: reach {share['min']:.2f} / "
                        f"{share['median']:.2f} %")
                if "flags" in entry:
                    line += (f", {entry['flags']['short']} short, "
                             f"{entry['flags']['short_flagged']} of them flagged")
                lines.append(line)
    return lines
