"""``quotientsharp study``: reading the manifest, the list of models and their generalisation.

A CSV file (a header line, then one line per model) or a JSON-lines file; each row has
``model``, and optionally ``name`` and ``symmetry``, and ``gap`` or ``train`` and ``test``; other
keys are carried to the outputs. Paths are relative to the manifest's folder; blank lines and,
in CSV, ``#`` lines are skipped (``docs/study.md`` describes the format).
"""

from __future__ import annotations

import csv
import difflib
import json
import math
import os
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quotientsharp.workflows.data import (
    JSONL_SUFFIXES,
    existing_file,
    jsonl_objects,
    utf8_lines,
)
from quotientsharp.workflows.options import InputError

#: The keys of a manifest row with a meaning; any other key is carried to the outputs.
MANIFEST_KEYS = ("name", "model", "gap", "train", "test", "symmetry")


@dataclass(frozen=True)
class ManifestEntry:
    """One model of a study.

    Attributes
    ----------
    name
        Its name in the outputs.
    model
        Its path (resolved against the manifest's folder).
    gap
        The generalisation gap given in the manifest, or ``None`` when it is computed from
        ``train`` and ``test``.
    train, test
        Data files to compute the gap from (both or neither).
    extra
        The row's other keys, as text (numbers as JSON writes them).
    line
        The line of the manifest it came from.
    written
        The ``model`` entry as written in the manifest (shown in the outputs).
    symmetry
        ``MODULE:FUNCTION`` of a symmetry of the user's own for this model (as
        ``--symmetry``), or ``None``.
    """

    name: str
    model: Path
    gap: float | None = None
    train: Path | None = None
    test: Path | None = None
    extra: Mapping[str, str] = field(default_factory=dict)
    line: int = 0
    written: str = ""
    symmetry: str | None = None

    @property
    def computes_gap(self) -> bool:
        """Whether the gap is computed from ``train`` and ``test`` data."""
        return self.gap is None

    def identity(self) -> dict[str, str | None]:
        """What a finished record must match to be kept on ``--resume``: the model and the
        data of its gap (a gap given in the manifest may change without remeasuring)."""
        return {"model": str(self.model),
                "train": None if self.train is None else str(self.train),
                "test": None if self.test is None else str(self.test),
                **({"symmetry": self.symmetry} if self.symmetry else {})}


def _text(value: Any) -> str:
    """A manifest value as text: strings stripped, numbers as JSON writes them."""
    if value is None:
        return ""
    return value.strip() if isinstance(value, str) else json.dumps(value)


def _csv_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    lines = [(number, line) for number, line in utf8_lines(path, "MANIFEST")
             if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise InputError(f"MANIFEST {path} is empty: it needs a header line (model,gap,...) "
                         "and one line per model")
    numbers = [number for number, _ in lines]
    reader = csv.reader(line for _, line in lines)
    header = [column.strip() for column in next(reader)]
    if reader.line_num != 1:
        raise InputError(f"MANIFEST {path}, line {numbers[0]}: a quoted column name is not "
                         "closed on the header line")
    if len(set(header)) != len(header) or "" in header:
        raise InputError(f"MANIFEST {path}, line {numbers[0]}: the header has empty or "
                         f"repeated column names ({header})")
    for index, values in enumerate(reader, start=1):
        number = numbers[index]
        if reader.line_num != index + 1:
            # a quoted value ran over the line's end: each row is one line of the file
            raise InputError(f"MANIFEST {path}, line {number}: a quoted value is not closed "
                             "on its line (a row of the manifest is one line; remove the line "
                             "break or the stray quote)")
        if len(values) != len(header):
            raise InputError(f"MANIFEST {path}, line {number}: {len(values)} value(s) for the "
                             f"{len(header)} column(s) of the header")
        yield number, dict(zip(header, values, strict=True))


def _gap(value: Any, where: str) -> float | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise InputError(f"{where}: gap must be a number, got {value!r}")
    try:
        gap = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{where}: gap must be a number, got {value!r}") from None
    if not math.isfinite(gap):
        raise InputError(f"{where}: gap must be finite, got {value!r}")
    return gap


def _path(value: Any, folder: Path, key: str, where: str, directory_ok: bool) -> Path | None:
    text = _text(value)
    if not text:
        return None
    path = Path(os.path.expanduser(text))
    path = path if path.is_absolute() else folder / path
    if not path.exists():
        raise InputError(f"{where}: {key} {path} does not exist")
    if not directory_ok and not path.is_file():
        raise InputError(f"{where}: {key} {path} is not a file")
    return path


def _entry(row: Mapping[str, Any], folder: Path, where: str, number: int) -> ManifestEntry:
    model_text = _text(row.get("model"))
    model = _path(model_text, folder, "model", where, directory_ok=True)
    if model is None:
        raise InputError(f"{where}: no 'model' entry (keys: {sorted(row)}); each row names a "
                         "model directory or torch.save file")
    extra = {str(key): _text(value) for key, value in row.items()
             if key not in MANIFEST_KEYS}
    # before the checks of gap, train and test: a 'Gap' column is a misspelt gap, not none
    _refuse_near_misses(extra, where)
    gap = _gap(row.get("gap"), where)
    train = _path(row.get("train"), folder, "train", where, directory_ok=False)
    test = _path(row.get("test"), folder, "test", where, directory_ok=False)
    if (train is None) != (test is None):
        raise InputError(f"{where}: give both 'train' and 'test' data (to compute the gap) or "
                         "neither")
    if gap is None and train is None:
        raise InputError(f"{where}: no 'gap' and no 'train' and 'test' data: give the model's "
                         "generalisation gap, or the data to compute it from")
    if gap is not None and train is not None:
        raise InputError(f"{where}: both a 'gap' and 'train'/'test' data: give one of them, "
                         "so that it is clear which gap is used")
    name = _text(row.get("name")) or model_text.rstrip("/\\")
    symmetry = _text(row.get("symmetry")) or None
    return ManifestEntry(name, model, gap, train, test, extra, number, model_text, symmetry)


def _refuse_near_misses(extra: Mapping[str, Any], where: str) -> None:
    """Refuse a carried key that is one of :data:`MANIFEST_KEYS` misspelt (``symetry``,
    ``Name``): carried to the outputs as it is, its meaning would be lost without a word (a
    user's symmetry not used, the name not given)."""
    for key in extra:
        folded = key.strip().lower()
        close = ([k for k in MANIFEST_KEYS if k == folded]
                 or difflib.get_close_matches(folded, MANIFEST_KEYS, n=1, cutoff=0.8))
        if close:
            raise InputError(f"{where}: the key {key!r} is not one of {list(MANIFEST_KEYS)}; "
                             f"did you mean {close[0]!r}? (rename it if it is a column of your "
                             "own, carried to the outputs)")


def read_manifest(path: str | os.PathLike, reserved: Sequence[str] = ()) -> list[ManifestEntry]:
    """The models of a manifest (see the module docstring), in file order.

    Parameters
    ----------
    path
        A ``.csv`` or ``.jsonl`` file.
    reserved
        Column names of the outputs that a key of the manifest may not take (its other keys
        are carried to the output CSV next to them).

    Returns
    -------
    list of ManifestEntry
        At least two (a rank correlation needs pairs), with distinct names and models.
    """
    path = existing_file(path, "MANIFEST")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        rows = _csv_rows(path)
    elif suffix in JSONL_SUFFIXES:
        rows = jsonl_objects(path, "MANIFEST")
    else:
        raise InputError(f"MANIFEST {path}: unknown format {suffix or '(no suffix)'}; use a .csv "
                         "file with a header line or a .jsonl file")
    folder = path.resolve().parent
    entries: list[ManifestEntry] = []
    names: dict[str, int] = {}
    models: dict[Path, int] = {}
    for number, row in rows:
        where = f"MANIFEST {path}, line {number}"
        entry = _entry(row, folder, where, number)
        clash = sorted(set(entry.extra) & set(reserved))
        if clash:
            raise InputError(f"{where}: the key(s) {clash} are names of output columns; rename "
                             "them in the manifest")
        # names equal up to Unicode normalisation ('e' + combining accent, 'é') look the same
        # in every output
        key = unicodedata.normalize("NFC", entry.name)
        if key in names:
            same = "" if key == entry.name else " (there in another Unicode form of the same text)"
            raise InputError(f"{where}: the name {entry.name!r} is already used on line "
                             f"{names[key]}{same}; names must be unique")
        resolved = entry.model.resolve()
        if resolved in models:
            raise InputError(f"{where}: model {entry.model} is already listed on line "
                             f"{models[resolved]}")
        names[key], models[resolved] = number, number
        entries.append(entry)
    if len(entries) < 2:
        raise InputError(f"MANIFEST {path} lists {len(entries)} model(s); a rank correlation "
                         "needs at least 2")
    return entries
