"""The summary section of the results page, rendered from the headline files.

The summary's tables are generated from the headline files every study writes
(``docs/results/data/<study>.json``, :mod:`quotientsharp.reproduce.headline`); its prose is
written by hand below :data:`~results_pages.sections.HAND_WRITTEN_MARKER` and kept. Each
paragraph of that prose that quotes taus names the studies whose data it quotes in a comment
``<!-- numbers from: bert minilm -->``; the test suite checks every tau it quotes against those
files (:func:`prose_numbers`, :func:`unsupported_numbers`).

The results page's regeneration (:func:`results_pages.regenerate_results_page`) rewrites the
summary whenever a study rewrites its section; ``quotientsharp reproduce summary`` rewrites it
alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from quotientsharp.reproduce.headline import NOT_HEADLINES, check_rows

from .sections import SECTION_ORDER, write_section

#: The measures the summary table compares with the paper, in column order.
HEADLINE_MEASURES = ("adaptive", "geodesic_inv", "geodesic_mix")
TITLE = "## Summary: where we agree with the paper, and where we do not"
_LABELS = {"adaptive": "adaptive", "geodesic_inv": "geodesic inv", "geodesic_mix": "geodesic mix"}
#: A tau as the pages quote it: optional sign, one digit, two decimals.
_TAU = re.compile(r"(?<![\w.])([+\-\u2212]?)(\d)\.(\d\d)(?![\d])")
_SOURCES = re.compile(r"<!--\s*numbers from:([^>]*)-->")


def _cell(row: Mapping[str, Any]) -> str:
    text = f"{row['tau']:+.2f} [{row['low']:+.2f}, {row['high']:+.2f}]"
    if row["paper"] is not None:
        text += f" ({row['paper']:+.2f})"
    if row["note"]:
        text += f"; {row['note']}"
    return text


def _sign_agreement(row: Mapping[str, Any]) -> str | None:
    """Whether the interval excludes 0 on the paper's side (``None`` without a paper value)."""
    paper = row["paper"]
    if paper is None or paper == 0:
        return None
    if row["low"] > 0 or row["high"] < 0:
        return "yes" if (row["low"] > 0) == (paper > 0) else "opposite"
    return "interval contains 0"


def _ordered(headlines: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    return ([s for s in SECTION_ORDER if s in headlines]
            + sorted(s for s in headlines if s not in SECTION_ORDER))


def summary_markdown(headlines: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """The generated part of the summary section: the headline table (one line per study and
    setting, the three measures compared with the paper, whether the sign agrees) and the
    table of every other row (other measures, confounds)."""
    lines = [TITLE, "",
             "Generated from the headline files `docs/results/data/<study>.json`, which each "
             "study's `--docs` run writes next to its section (`quotientsharp reproduce "
             "summary --docs docs` regenerates it alone). Kendall tau between generalisation "
             "and sharpness with its 95 % interval, the paper's value in brackets. Rows are "
             "not comparable across settings: our transformer families are small models on "
             "generated or bundled data, the paper's are CLIP ViT-B/32 on ImageNet and "
             "BERT-base on MNLI. 'Agrees in sign' asks whether the interval excludes 0 on "
             "the paper's side.", "",
             "| study | setting | " + " | ".join(_LABELS[m] for m in HEADLINE_MEASURES)
             + " | agrees in sign? |",
             "|---" * (len(HEADLINE_MEASURES) + 3) + "|"]
    others = []
    for study in _ordered(headlines):
        settings: dict[str, dict[str, Mapping[str, Any]]] = {}
        for row in headlines[study]:
            settings.setdefault(row["setting"], {})[row["measure"]] = row
        for setting, rows in settings.items():
            if any(m in rows for m in HEADLINE_MEASURES):
                cells = [(_cell(rows[m]) if m in rows else "—") for m in HEADLINE_MEASURES]
                verdicts = [f"{_LABELS[m].split()[-1]}: {v}" for m in HEADLINE_MEASURES
                            if m in rows and (v := _sign_agreement(rows[m])) is not None]
                lines.append(f"| {study} | {setting} | " + " | ".join(cells) + " | "
                             + ("; ".join(verdicts) or "no paper value") + " |")
            others += [(study, setting, row) for m, row in rows.items()
                       if m not in HEADLINE_MEASURES]
    if others:
        lines += ["", "Other measures, confounds and diagnostics of the same runs:", "",
                  "| study | setting | row | τ [95 % CI] |", "|---|---|---|---|"]
        lines += [f"| {study} | {setting} | {row['measure']} | {_cell(row)} |"
                  for study, setting, row in others]
    return "\n".join(lines) + "\n"


def read_headlines(docs_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every study's headline rows, ``{study: rows}``, from ``docs_dir/results/data/*.json``
    (empty when there is none), each file checked as
    :func:`quotientsharp.reproduce.headline.write_headline` writes it; the files of
    :data:`~quotientsharp.reproduce.headline.NOT_HEADLINES` are left out."""
    folder = Path(docs_dir) / "results" / "data"
    headlines: dict[str, list[dict[str, Any]]] = {}
    if not folder.is_dir():
        return headlines
    for path in sorted(folder.glob("*.json")):
        if path.stem in NOT_HEADLINES:
            continue
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or set(data) != {"study", "rows"}:
            raise ValueError(f"{path}: expected an object with the keys 'study' and 'rows'")
        if data["study"] != path.stem:
            raise ValueError(f"{path}: study {data['study']!r} does not match the file name")
        headlines[path.stem] = check_rows(data["rows"], path.stem)
    return headlines


def write_summary(docs_dir: Path, provenance: Mapping[str, Any]) -> Path | None:
    """Rewrite ``docs_dir/results/summary.md`` from the headline files, stamped with
    ``provenance`` and keeping its hand-written prose; ``None`` (nothing written) when there is
    no headline file."""
    headlines = read_headlines(docs_dir)
    if not headlines:
        return None
    return write_section(docs_dir, "summary", summary_markdown(headlines), provenance)


def prose_numbers(prose: str) -> list[tuple[tuple[str, ...], float, str]]:
    """Every tau quoted in ``prose`` (signed or unsigned, two decimals), with the studies its
    paragraph names in ``<!-- numbers from: ... -->`` (``()`` when it names none).

    Returns
    -------
    list of (studies, value, text)
        Per quoted number: the paragraph's studies, the value and the number as written.
    """
    found = []
    for paragraph in re.split(r"\n\s*\n|\n(?=- )", prose):
        sources = tuple(name for match in _SOURCES.finditer(paragraph)
                        for name in match.group(1).split())
        text = _SOURCES.sub("", paragraph)
        text = re.sub(r"\$[^$]*\$", "", text)  # formulas hold constants, not taus
        for match in _TAU.finditer(text):
            sign = -1.0 if match.group(1) in ("-", "\u2212") else 1.0
            value = sign * float(f"{match.group(2)}.{match.group(3)}")
            found.append((sources, value, match.group(0)))
    return found


def unsupported_numbers(prose: str, headlines: Mapping[str, Sequence[Mapping[str, Any]]]
                        ) -> list[str]:
    """The taus of ``prose`` that no row of the studies its paragraph names holds (as tau,
    bound or paper value, at two decimals); a paragraph that names no study supports none."""
    bad = []
    for sources, value, text in prose_numbers(prose):
        known = {round(float(row[key]), 2) for study in sources
                 for row in headlines.get(study, ())
                 for key in ("tau", "low", "high", "paper") if row[key] is not None}
        if round(value, 2) not in known:
            bad.append(f"{text} (studies: {', '.join(sources) or 'none named'})")
    return bad
