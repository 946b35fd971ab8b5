"""The machine-readable headline numbers of each study: ``docs/results/data/<study>.json``,
``{"study": str, "rows": [row, ...]}`` with the keys :data:`ROW_KEYS` per row (``tau``, ``low``,
``high``: a Kendall tau and its 95 % interval; ``paper``: the paper's value or ``None``). The
summary of the results page is rendered from them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from quotientsharp.workflows.files import write_json_atomic

#: Data files in the same folder that are not headline files: ``reach.json``, the solver reach
#: study's results, which the family pages' reach statements read.
NOT_HEADLINES = ("reach",)
#: Keys of a row, in the order they are written.
ROW_KEYS = ("setting", "measure", "tau", "low", "high", "paper", "note")


def headline_path(docs_dir: Path, study: str) -> Path:
    """``docs_dir/results/data/<study>.json``."""
    if not isinstance(study, str) or not study or "/" in study or study.startswith("."):
        raise ValueError(f"study must be a plain name, got {study!r}")
    return Path(docs_dir) / "results" / "data" / f"{study}.json"


def _number(row: Mapping[str, Any], key: str, where: str) -> float:
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: {key} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or not -1.0 <= value <= 1.0:
        raise ValueError(f"{where}: {key} must be a finite Kendall tau in [-1, 1], got {value}")
    return value


def check_rows(rows: Sequence[Mapping[str, Any]], study: str = "rows") -> list[dict[str, Any]]:
    """The rows as plain dicts in :data:`ROW_KEYS` order; ``ValueError`` for a missing or
    extra key, an empty setting or measure, a tau or bound that is not a finite number in
    [-1, 1], ``low > high``, or the same (setting, measure) twice."""
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        raise ValueError(f"{study}: rows must be a list of dicts, got {type(rows).__name__}")
    checked, seen = [], set()
    for index, row in enumerate(rows):
        where = f"{study}: rows[{index}]"
        if not isinstance(row, Mapping):
            raise ValueError(f"{where} must be a dict, got {type(row).__name__}")
        if set(row) != set(ROW_KEYS):
            raise ValueError(f"{where} must have exactly the keys {list(ROW_KEYS)}; missing "
                             f"{sorted(set(ROW_KEYS) - set(row))}, extra "
                             f"{sorted(set(row) - set(ROW_KEYS))}")
        for key in ("setting", "measure", "note"):
            if not isinstance(row[key], str):
                raise ValueError(f"{where}: {key} must be a string, got {row[key]!r}")
        if not row["setting"].strip() or not row["measure"].strip():
            raise ValueError(f"{where}: setting and measure must be non-empty")
        tau, low, high = (_number(row, key, where) for key in ("tau", "low", "high"))
        if low > high:
            raise ValueError(f"{where}: low {low} > high {high}")
        paper = None if row["paper"] is None else _number(row, "paper", where)
        pair = (row["setting"], row["measure"])
        if pair in seen:
            raise ValueError(f"{where}: setting {pair[0]!r} has measure {pair[1]!r} twice")
        seen.add(pair)
        checked.append({"setting": row["setting"], "measure": row["measure"], "tau": tau,
                        "low": low, "high": high, "paper": paper, "note": row["note"]})
    return checked


def write_headline(docs_dir: Path, study: str, rows: list[dict[str, Any]]) -> Path:
    """Write the headline ``rows`` (:data:`ROW_KEYS`, in the order the summary shows them) of
    ``study`` (a plain file name) to ``docs_dir/results/data/<study>.json``; its path."""
    if study in NOT_HEADLINES:
        raise ValueError(f"{study!r} names a data file that is not a headline file")
    path = headline_path(docs_dir, study)
    checked = check_rows(rows, study)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"study": study, "rows": checked})
    return path
