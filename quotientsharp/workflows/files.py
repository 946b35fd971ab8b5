"""Files a reader may open while they are written: atomic rewrites (a temporary file renamed
over the old one) and append-only JSONL whose torn last line is dropped on reading."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO


def writes_over(output: Path, source: Path) -> bool:
    """Whether writing ``output`` would write over ``source`` (the same file, by path, link
    or hard link) or into it (``source`` a folder)."""
    resolved, origin = output.resolve(), source.resolve()
    if resolved == origin or (origin.is_dir() and resolved.is_relative_to(origin)):
        return True
    with contextlib.suppress(OSError):
        return output.exists() and source.exists() and os.path.samefile(output, source)
    return False


@contextlib.contextmanager
def _atomic_stream(path: Path, newline: str | None = None) -> Iterator[TextIO]:
    """A UTF-8 text stream to a temporary file beside ``path``, synced and renamed over it when
    the block ends (on an error, removed)."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # the mode open(path, "w") gives a new file: mkstemp's 0600 would stay
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(temporary, 0o666 & ~mask)
        with os.fdopen(handle, "w", encoding="utf-8", newline=newline) as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` atomically."""
    write_text_atomic(path, json.dumps(data, indent=1) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with _atomic_stream(path) as stream:
        stream.write(text)


def write_jsonl_atomic(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Write ``records``, one JSON object per line, to ``path`` atomically."""
    with _atomic_stream(path) as stream:
        for record in records:
            stream.write(json.dumps(record, allow_nan=True) + "\n")


def write_csv_atomic(path: Path, columns: Sequence[str],
                     rows: Iterable[Mapping[str, Any]]) -> None:
    """Write a CSV file (a header, then ``rows``; missing cells empty) to ``path`` atomically."""
    with _atomic_stream(path, newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow(row)


def append_jsonl(path: Path, record: Mapping[str, Any]) -> None:
    """Append one record to a JSONL file in one ``write``, flushed and synced."""
    line = json.dumps(record, allow_nan=True)
    with Path(path).open("a") as stream:
        stream.write(line + "\n")
        stream.flush()
        os.fsync(stream.fileno())


def read_jsonl(path: Path, repair: bool = False) -> list[dict[str, Any]]:
    """The records of a JSONL file (``[]`` if it does not exist). A torn last line (no newline)
    is dropped, and with ``repair`` cut from the file so that later appends start clean."""
    path = Path(path)
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.split("\n")
    torn = lines[-1] != ""
    complete, records = lines[:-1], []
    for number, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: line {number} is not valid JSON ({err})") from err
        if not isinstance(record, dict):
            raise ValueError(f"{path}: line {number} is not a JSON object")
        records.append(record)
    if torn and repair:
        with path.open("r+") as stream:
            stream.truncate(len(text) - len(lines[-1]))
    return records

