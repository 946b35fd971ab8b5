"""The solver reach page, ``docs/results/reach.md``, from the study's page data.

The study (:mod:`quotientsharp.reproduce.reach`) measures, per part (diagonal nets, a tiny
BERT, the families' models), measure and radius, the default solver's value as a share of the
best value found, its first run's, and how its warnings met its shortfalls
(:func:`quotientsharp.reproduce.reach_models.reach_shares`); its page data holds those
results and the command. :func:`section` lays them out as tables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .sections import locality_rule_note


def _cell(entry: dict[str, Any], column: str = "ascent") -> str:
    if "refused" in entry:
        return "refused by the engine"
    if column not in entry:
        return "—"
    return f"{entry[column]['min']:.2f} / {entry[column]['median']:.2f}"


def _flag_cell(entry: dict[str, Any]) -> str:
    if "refused" in entry:
        return "refused"
    flags = entry["flags"]
    return (f"{flags['short']} short, {flags['short_flagged']} flagged; "
            f"{flags['reaching_reach_flagged']} false; {flags['not_local']} not local; "
            f"{entry['evaluations']:g} / {entry['reference_evaluations']:g}")


def _table(reach: dict[str, dict[str, Any]], rhos: Sequence[float],
           cell: Callable[[dict[str, Any]], str] = _cell) -> list[str]:
    lines = ["| measure | " + " | ".join(f"ρ = {rho:g}" for rho in rhos) + " |",
             "|---|" + "---|" * len(rhos)]
    for measure, by_rho in reach.items():
        lines.append(f"| {measure} | "
                     + " | ".join(cell(by_rho[f"{rho:g}"]) for rho in rhos) + " |")
    return lines + [""]


def _search_tables(reach: dict[str, dict[str, Any]], rhos: Sequence[float]) -> list[str]:
    """The three tables of a part measured with the engine's default solver."""
    return (["The default solver (the reach search), as a percentage of the best value found "
             "(min / median):", ""] + _table(reach, rhos)
            + ["The search's first run alone (one ascent from ξ = 0, the solver of the "
               "releases before 0.3), on the same problems:", ""]
            + _table(reach, rhos, lambda entry: _cell(entry, "one_ascent"))
            + ["The default's warnings against its shortfalls: problems short of 99 % of the "
               "best value found, how many of them the result flagged (a reach estimate "
               "below 0.99 or a ball that is not local), reaching problems flagged by the "
               "reach estimate (false alarms), balls that are not local, and the median "
               "forward+backward passes of the default / of the strong solve:", ""]
            + _table(reach, rhos, _flag_cell))


def _family_lines(name: str, family: dict[str, Any]) -> list[str]:
    models = family["models"]
    trained = ", ".join(f"model {m['index']}: " + ("diverged" if m["diverged"] else
                                                   f"train error {m['train_error']:.3f}, "
                                                   f"test error {m['test_error']:.3f}")
                        for m in models)
    steps = family["ascent_steps"]
    reference = family["reference"]
    lines = [f"### {family['title']}", "",
             f"The first {len(models)} models of `quotientsharp reproduce {name}` (study seed "
             f"0: the study's own hyperparameter draws, model builder and training; "
             f"{trained}), each on every batch of the study's sharpness set "
             f"({family['batches']} per model). The default solver runs the study's own "
             f"{steps} Auto-PGD steps per chain; strong solve: {reference['n_iter']} steps, "
             f"{reference['restarts']} random restart(s) (the engine's reference_solve). "
             f"Radii: the three above and the ones the `{name}` page compares its measures at "
             f"({family['page_radii']}).", ""]
    return lines + _search_tables(family["reach"], family["rhos"])


def _totals_lines(families: Mapping[str, dict[str, Any]]) -> list[str]:
    """The warnings tables summed over every family, measure and radius: how many problems fell
    short of 99 % of the best value found, how many of those were flagged, where the others are,
    and how many reaching problems the reach estimate flagged."""
    totals = {"problems": 0, "short": 0, "short_flagged": 0, "reaching_reach_flagged": 0,
              "not_local": 0}
    unflagged = []
    for name, family in families.items():
        for measure, by_rho in family["reach"].items():
            for rho, entry in by_rho.items():
                flags = entry.get("flags")
                if flags is None:
                    continue
                for key in totals:
                    totals[key] += flags[key]
                missed = flags["short"] - flags["short_flagged"]
                if missed:
                    unflagged.append(f"{name} {measure} at ρ = {rho} ({missed})")
    if not totals["problems"]:
        return []
    missed = totals["short"] - totals["short_flagged"]
    where = f": {'; '.join(unflagged)}" if unflagged else ""
    return ["### Over every family", "",
            f"Summed over the families' warnings tables: {totals['problems']} problems; the "
            f"default fell short of 99 % of the best value found on {totals['short']} and "
            f"flagged {totals['short_flagged']} of them. Not flagged: {missed}{where}. The "
            f"reach estimate flagged {totals['reaching_reach_flagged']} problems that reached; "
            f"{totals['not_local']} balls were not local.", ""]


def section(page: Mapping[str, Any]) -> str:
    """The Markdown section of the study from its page data (``results`` and ``command``)."""
    results, command = page["results"], page["command"]
    rhos = results["rhos"]
    lines = ["## Solver reach against rho (`reproduce reach`)", "",
             f"Reproduce: `{command}` (outputs in `{results['out']}/`). This run: wall time "
             f"{results['wall_seconds'] / 60:.1f} min over {len(results['world_sizes'])} "
             f"session(s) of {', '.join(map(str, results['world_sizes']))} process(es) "
             f"(torchrun ranks), {results['threads']} torch thread(s) each.",
             "",
             "Each cell of a reach table: a solver's value as a percentage of the best value "
             "found for the same problem (a net or model and one batch), min / median over the "
             "problems. The best value is the largest of the default solver's, a strong "
             "solve's (about ten times the budget) and, for mix on the diagonal nets, the "
             "exact maximum: itself a lower bound of the maximum, except where exact. A value "
             "short of 99 % should carry a warning (`qs.ReachWarning`), and a value that "
             "reaches should not, unless its ball is not local: the warnings table counts "
             "both. A measure whose reach falls with rho is ranked partly by its solver's "
             "shortfall: compare measures at a radius where every one of them reaches close "
             "to 100 %.", ""]
    note = locality_rule_note(results.get("locality_rule"))
    if note:
        lines += [*note[1:], ""]
    lines += ["### Diagonal nets", "",
              f"{results['diagonal_nets']} nets of the diagonal study's quick size (d = 200, "
             "trained to 1e-5), 4 batches of 25 each, measured by the diagonal study's own "
             "batched solver (one Auto-PGD ascent of 20 steps from ξ = 0, exact paths); "
             "strong ascent: 400 steps, 3 restarts (from the quadratic model's maximiser, its "
             "negative and a random point); mix maxima exact.", ""]
    lines += _table(results["diagonal"], rhos)
    lines += ["### Tiny float64 BERT", "",
              f"2 layers, 4 heads of dimension 8, random weights (initializer_range 0.3), "
              f"{results['bert_batches']} random batch(es) of 8 sequences of 12 tokens; the "
              "default solver of 20 steps per chain; strong solve: the engine's "
              "reference_solve=True (200 steps, 4 random restarts).", ""]
    lines += _search_tables(results["bert"], rhos)
    for name, family in results["families"].items():
        lines += _family_lines(name, family)
    lines += _totals_lines(results["families"])
    return "\n".join(lines)
