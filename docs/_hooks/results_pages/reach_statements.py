"""The solver reach of each compared measure, stated on the family pages from the reach data.

A family page compares measures by their values at its radii; the solver reach study
(:mod:`quotientsharp.reproduce.reach`) measures how much of the best value found the ascent
reaches there. :func:`reach_statement` writes, for one family page, a paragraph with the reach
of each compared measure at the page's own radius and ascent, read from
``docs/results/data/reach.json``, and whether every one of them is within
:data:`SOLVER_ERROR_PERCENT` of the best value found. :func:`refresh_reach_statements` puts
that paragraph into each family section file (between :data:`BEGIN` and :data:`END`, before
the hand-written part), replacing an older one; the results page assembly calls it, so a
family study that rewrites its section, or a new reach run, regenerates the statement without
rerunning anything else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quotientsharp.reproduce.reach_models import DEFAULT_STEPS

from .sections import HAND_WRITTEN_MARKER

BEGIN = ("<!-- reach statement: generated from docs/results/data/reach.json (quotientsharp "
         "reproduce reach --docs docs) with the results page; do not edit -->")
END = "<!-- /reach statement -->"
#: A comparison counts as within solver error when every compared measure's ascent reaches at
#: least this share of the best value found on every problem: below it the solver's shortfall,
#: not the landscape, can decide a difference between measures.
SOLVER_ERROR_PERCENT = 99.0

#: Family page -> (the closest other family, what that means for this page). A page's own
#: family is used where the reach data has it; a page whose own models were not measured (reach
#: data of an earlier run) is given its closest measured family, and says so.
PAGE_SOURCES: dict[str, tuple[str, str]] = {
    "vit": ("vit", ""),
    "vit-finetune": ("vit", "Measured on the ViT family (`reproduce vit`), whose models have "
                            "the same architecture, radii and 20-step ascent, not on these "
                            "fine-tunes."),
    "bert": ("vit", "Measured on the ViT family (`reproduce vit`), whose transformer has the "
                    "same shape (hidden size 32, 2 layers, 4 heads of dimension 8), radii and "
                    "20-step ascent, not on these BERT models."),
    "minilm": ("minilm", ""),
    "lora": ("minilm", "Measured on full MiniLM fine-tunes (`reproduce minilm`, its 2-step "
                       "ascent on every weight), not on these adapters, whose ascent has 3 "
                       "steps."),
}
_LABELS = {"adaptive": ("adaptive", "adaptive"), "worst_case": ("worst case", "worst_case"),
           "geodesic_inv_o2": ("geodesic inv (order 2)", "inv"),
           "geodesic_mix_o2": ("geodesic mix (order 2)", "mix")}


def reach_statement(page: str, reach: Mapping[str, Any]) -> str | None:
    """The reach paragraph of family page ``page`` (``None``: not a family page, or its
    family is not in ``reach``).

    Parameters
    ----------
    page
        The section's name (``"vit"``).
    reach
        The reach study's results (``docs/results/data/reach.json``).
    """
    if page not in PAGE_SOURCES:
        return None
    families = reach.get("families", {})
    source, note = (page, "") if page in families else PAGE_SOURCES[page]
    family = families.get(source)
    if family is None:
        return None
    radii = family["page_rhos"]
    models = len([m for m in family["models"] if not m["diverged"]])
    parts, defaults, short = [], [], []
    short_problems = flagged = 0
    for key, (label, radius_key) in _LABELS.items():
        rho = radii[radius_key]
        entry = family["reach"][key].get(f"{rho:g}")
        if entry is None:
            raise ValueError(f"the reach data of {source!r} has no radius {rho:g} for {key}: "
                             "rerun quotientsharp reproduce reach")
        if "refused" in entry:
            parts.append(f"{label} (ρ = {rho:g}) refused by the engine")
            short.append(f"{label} (refused)")
            continue
        share = entry["ascent"]
        if "flags" in entry:
            short_problems += entry["flags"]["short"]
            flagged += entry["flags"]["short_flagged"]
        parts.append(f"{label} (ρ = {rho:g}) {share['min']:.2f} / {share['median']:.2f} %")
        if share["min"] < SOLVER_ERROR_PERCENT:
            short.append(f"{label} {share['min']:.2f} %")
        if "default" in entry:
            defaults.append(f"{label} {entry['default']['min']:.2f} / "
                            f"{entry['default']['median']:.2f} %")
    steps = family["ascent_steps"]
    if short:
        verdict = (f"Not every comparison on this page is within solver error (taken here as "
                   f"reaching {SOLVER_ERROR_PERCENT:g} % of the best value found on every "
                   f"problem): on some problem the ascent reaches only {', '.join(short)}, so "
                   "these measures' values, and their differences to other measures, may be "
                   "the solver's shortfall as much as the landscape.")
    else:
        reference = family.get("reference") or {}
        strong = (f" (a solve of {reference['n_iter']} steps with {reference['restarts']} "
                  "random restarts of the same length, itself a lower bound of the maximum)"
                  if reference else "")
        verdict = (f"On these {models} model(s) and {family['batches']} batch(es) each, every "
                   f"compared measure reaches at least {SOLVER_ERROR_PERCENT:g} % of the best "
                   f"value found{strong}: within solver error there. That is a sample, not "
                   "every model and batch of the page; a page measured with the engine's reach "
                   "search has its own table of the reach estimate and the locality of every "
                   "value (docs/sharpness.md, 'Reach and locality').")
    default = ("" if not defaults else
               f" The default {DEFAULT_STEPS}-step ascent reaches, on the same problems and "
               f"radii: {'; '.join(defaults)}.")
    batches = family["batches"]
    searched = any("flags" in entry for by_rho in family["reach"].values()
                   for entry in by_rho.values())
    solver = (f"The default solver (the reach search, the study's {steps} Auto-PGD steps per "
              "chain)" if searched else
              f"The study's ascent ({steps} Auto-PGD steps from ξ = 0)")
    warned = ("" if not searched else
              f" Where a compared measure fell short of {SOLVER_ERROR_PERCENT:g} % "
              f"({short_problems} problem{'' if short_problems == 1 else 's'}), its result "
              f"flagged {flagged} of them with a `qs.ReachWarning`.")
    text = (f"**Solver reach at this page's radii** (from the Solver reach page, `quotientsharp "
            f"reproduce reach --docs docs`). {note + ' ' if note else ''}{solver} reaches, as "
            f"a share of the best value found (min / median over {models} models, {batches} "
            f"batch{'es' if batches > 1 else ''} each): {'; '.join(parts)}.{default} "
            f"{verdict}{warned}")
    return "\n".join([BEGIN, text, END])


def _without_statement(text: str) -> str:
    if BEGIN not in text:
        return text
    start = text.index(BEGIN)
    end = text.index(END, start) + len(END)
    return (text[:start].rstrip() + "\n\n" + text[end:].lstrip()).rstrip() + "\n"


def refresh_reach_statements(docs_dir: Path) -> list[Path]:
    """Rewrite the reach statement of every family section file in ``docs_dir/results/`` from
    ``docs_dir/results/data/reach.json`` (nothing without that file); the files changed."""
    data = Path(docs_dir) / "results" / "data" / "reach.json"
    if not data.is_file():
        return []
    reach = json.loads(data.read_text())
    changed = []
    for page in PAGE_SOURCES:
        path = Path(docs_dir) / "results" / f"{page}.md"
        statement = reach_statement(page, reach)
        if not path.is_file() or statement is None:
            continue
        old = path.read_text()
        text = _without_statement(old)
        if HAND_WRITTEN_MARKER in text:
            at = text.index(HAND_WRITTEN_MARKER)
            text = f"{text[:at].rstrip()}\n\n{statement}\n\n{text[at:]}"
        else:
            text = f"{text.rstrip()}\n\n{statement}\n"
        if text != old:
            path.write_text(text)
            changed.append(path)
    return changed
