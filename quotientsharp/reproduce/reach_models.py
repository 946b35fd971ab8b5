"""Solver reach on transformer models for ``quotientsharp reproduce reach``: a tiny float64 BERT
and trained models of the families, measured with the default solver and ``reference_solve``."""

from __future__ import annotations

import importlib
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Steps of the default ascent (the engine's default).
DEFAULT_STEPS = 20
#: The family measures whose reach is measured: the ones the family pages compare (orders 1
#: and the eps sweep are variants of these and cost as much again).
REACH_MEASURES = ("adaptive", "worst_case", "geodesic_inv_o2", "geodesic_mix_o2")


@dataclass(frozen=True)
class FamilyReach:
    """The reach measurement on family ``study``: its first ``models``, the first ``batches``
    (``None``: all) and the ``restarts`` of the strong ascent of ``10 * n_iter`` steps."""

    study: str
    models: int
    batches: int | None
    restarts: int


#: The full run: the first 3 models of each family, every batch, a strong solve of 10 times the
#: steps with 2 restarts (the engine's 4 would double the study's two CPU-hours).
FAMILIES = tuple(FamilyReach(name, models=3, batches=None, restarts=2)
                 for name in ("vit", "minilm", "bert", "vit-finetune", "lora"))
#: ``--quick``: one model of each family's quick variant (MiniLM's and LoRA's are tiny random
#: BERTs).
QUICK_FAMILIES = tuple(FamilyReach(family.study, models=1, batches=1, restarts=1)
                       for family in FAMILIES)


def percent(values: Sequence[float], best: Sequence[float]) -> dict[str, float]:
    """min and median of ``100 * value / best`` over the problems (``best > 0`` checked)."""
    shares = []
    for value, top in zip(values, best, strict=True):
        if not (math.isfinite(value) and math.isfinite(top)) or top <= 0:
            raise ValueError(f"reach needs a finite, positive best value, got best={top!r}, "
                             f"value={value!r}")
        shares.append(100.0 * value / top)
    if not shares:
        raise ValueError("reach needs at least one problem")
    return {"min": min(shares), "median": statistics.median(shares), "problems": len(shares)}


def measure_reach(model: Any, batches: Sequence[Any], measures: Mapping[str, Mapping[str, Any]],
                  rhos: Sequence[float], n_iter: int, reference: bool | Mapping[str, Any],
                  seed: int = 0) -> dict[str, dict[str, Any]]:
    """Each measure (name -> options of :func:`quotientsharp.sharpness`) at each radius with
    the default solver and the strong solve ``reference`` (``reference_solve``): name ->
    ``f"{rho:g}"`` -> per batch lists (``ascent``, ``one_ascent``: its first run, ``reference``,
    ``reach_estimate``, ``local``, evaluations), or ``{"refused": reason}``."""
    import warnings

    import quotientsharp as qs

    out: dict[str, dict[str, Any]] = {name: {} for name in measures}
    for name, options in measures.items():
        for rho in rhos:
            try:
                with warnings.catch_warnings():
                    # the warning is what this study checks: it is read off the result
                    warnings.simplefilter("ignore", qs.ReachWarning)
                    result = qs.sharpness(model, batches, rho=rho, n_iter=n_iter, seed=seed,
                                          progress=False, reference_solve=reference, **options)
            except ValueError as err:
                out[name][f"{rho:g}"] = {"refused": str(err).split("\n")[0]}
                continue
            out[name][f"{rho:g}"] = {
                "ascent": list(result.per_batch),
                # the trace holds the best value after each evaluation, run after run, the
                # first entry the start: entry n_iter ends the first run, one ascent from xi = 0
                "one_ascent": [trace[n_iter] for trace in result.traces],
                "reference": list(result.reference_per_batch),
                "reach_estimate": list(result.reach),
                "local": [where["local"] for where in result.locality],
                "evaluations": list(result.evaluations),
                "reference_evaluations": [len(trace) for trace in result.reference_traces]}
    return out


def _flags(entry: Mapping[str, Any], best: Sequence[float]) -> dict[str, int]:
    """Problems short of ``REACH_TARGET`` of the best value, those of them flagged (low reach
    estimate or a ball not local), false alarms of the reach estimate, balls not local."""
    from quotientsharp.engine.result import REACH_TARGET

    counts = {"problems": 0, "short": 0, "short_flagged": 0, "reaching_reach_flagged": 0,
              "not_local": 0}
    for value, top, estimate, local in zip(entry["ascent"], best, entry["reach_estimate"],
                                           entry["local"], strict=True):
        low_estimate = estimate is not None and estimate < REACH_TARGET
        counts["problems"] += 1
        counts["not_local"] += int(not local)
        if value < REACH_TARGET * top:
            counts["short"] += 1
            counts["short_flagged"] += int(low_estimate or not local)
        else:
            counts["reaching_reach_flagged"] += int(low_estimate)
    return counts


def reach_shares(values: Mapping[str, Mapping[str, Any]],
                 ) -> dict[str, dict[str, dict[str, Any]]]:
    """Name -> rho -> :func:`measure_reach`'s values pooled over the problems, as shares of
    each problem's best value (the largest of the three solves'; problems with no loss
    increase counted in ``no_increase``), with :func:`_flags`, or ``{"refused": reason}``."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, by_rho in values.items():
        out[name] = {}
        for rho, entry in by_rho.items():
            if "refused" in entry:
                out[name][rho] = {"refused": entry["refused"]}
                continue
            problems = list(zip(entry["ascent"], entry["one_ascent"], entry["reference"],
                                strict=True))
            if not all(math.isfinite(v) for problem in problems for v in problem):
                # max() skips a NaN depending on its place: refuse it instead of dropping it
                raise ValueError(f"reach of {name} at rho={rho}: a value that is not finite "
                                 "(the default, its first run or the strong solve)")
            best = [max(problem) for problem in problems]
            kept = [i for i, top in enumerate(best) if top > 0]
            if not kept:
                out[name][rho] = {"refused": "no solve found a loss increase on any problem"}
                continue
            pick = {key: [entry[key][i] for i in kept]
                    for key in ("ascent", "one_ascent", "reach_estimate", "local")}
            top = [best[i] for i in kept]
            out[name][rho] = {
                "ascent": percent(pick["ascent"], top),
                "one_ascent": percent(pick["one_ascent"], top),
                "flags": _flags(pick, top),
                "evaluations": statistics.median(entry["evaluations"]),
                "reference_evaluations": statistics.median(entry["reference_evaluations"]),
                "no_increase": len(best) - len(kept)}
    return out


def _tiny_bert(seed: int) -> Any:
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        vocab_size=50, max_position_embeddings=32, num_labels=3, attn_implementation="eager",
        initializer_range=0.3)  # type: ignore[call-arg]
    model: Any = transformers.BertForSequenceClassification(config)
    return model.to(torch.float64).eval()


#: The tiny BERT's measures: the family studies' adaptive, geodesic inv and mix of order 2.
TINY_BERT_MEASURES: dict[str, dict[str, Any]] = {
    "adaptive": {"measure": "adaptive"},
    "geodesic_inv_order2": {"measure": "geodesic", "metric": "inv", "order": 2},
    "geodesic_mix_order2": {"measure": "geodesic", "metric": "mix", "order": 2}}


def tiny_bert_unit(rhos: Sequence[float], batches: int, seed: int) -> dict[str, Any]:
    """:func:`measure_reach` on a tiny float64 BERT (random weights with ``initializer_range``
    0.3, so that attention matters) and ``batches`` random batches of 8 sequences of 12."""
    import torch

    model = _tiny_bert(seed)
    generator = torch.Generator().manual_seed(1000 + seed)
    data = [{"input_ids": torch.randint(0, 50, (8, 12), generator=generator),
             "attention_mask": torch.ones(8, 12, dtype=torch.long),
             "labels": torch.randint(0, 3, (8,), generator=generator)}
            for _ in range(batches)]
    return measure_reach(model, data, TINY_BERT_MEASURES, rhos, DEFAULT_STEPS, True, seed)


def family_study_of(name: str) -> Any:
    """The :class:`~quotientsharp.reproduce.families.settings.FamilyStudy` of family study
    ``name``."""
    from quotientsharp.reproduce import STUDIES

    if name not in STUDIES or not STUDIES[name].startswith("quotientsharp.reproduce.families"):
        raise ValueError(f"family must be a family study, got {name!r}")
    return importlib.import_module(STUDIES[name]).STUDY


def family_rhos(name: str, rhos: Sequence[float]) -> list[float]:
    """``rhos`` and the radii the family's page compares its measures at, ascending."""
    study = family_study_of(name)
    own = {float(study.rhos[key]) for key in ("adaptive", "worst_case", "inv", "mix")}
    return sorted({float(rho) for rho in rhos} | own)


def family_unit(family: FamilyReach, index: int, rhos: Sequence[float], quick: bool,
                out: Path, status: Callable[[str], None]) -> dict[str, Any]:
    """Train model ``index`` of the family as its study does (study seed 0) and measure the
    reach of :data:`REACH_MEASURES` at ``rhos``: its record with ``values``."""
    import time

    from quotientsharp.reproduce.families.data import sharpness_batches
    from quotientsharp.reproduce.families.measures import family_measures
    from quotientsharp.reproduce.families.run import train_family_model

    study = family_study_of(family.study)
    variant = study.quick if quick else study.full
    data = study.load_data(quick)
    start_weights = None if study.pretrained is None else study.pretrained.load(out, quick)
    model, record = train_family_model(study, data, variant, 0, index, status, start_weights)
    reference = {"n_iter": 10 * variant.n_iter, "restarts": family.restarts}
    record.update(family=family.study, ascent_steps=variant.n_iter, reference=reference,
                  values=None)
    if model is None:
        return record
    batches = sharpness_batches(data, variant.sharpness_points,
                                variant.sharpness_batch_size)[:family.batches]
    record["batches"] = len(batches)
    specs = family_measures(1.0, 1.0, 1.0, 1.0)   # the radii come from ``rhos``
    measures = {spec.key: {"measure": spec.measure, **spec.options} for spec in specs
                if spec.key in REACH_MEASURES}
    status(f"{family.study} model {index}: measuring")
    start = time.perf_counter()
    record["values"] = measure_reach(model, batches, measures, rhos, variant.n_iter, reference)
    record["measure_seconds"] = time.perf_counter() - start
    return record
