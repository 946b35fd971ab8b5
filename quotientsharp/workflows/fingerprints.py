"""What a finished record was measured from, by content: the identity checked on ``--resume``.

A record names its model and its gap's data by path (:meth:`ManifestEntry.identity`); a
checkpoint replaced at the same path would keep its stale record on ``--resume``. The identity
of a record therefore also holds the SHA-256 of each file's bytes (of every file, with its
relative name, for a folder such as a HuggingFace model directory): a changed file changes the
identity and the resume refuses the folder (:func:`~.runner.run_study`), naming the model.

Hashing reads each file once per process (the result is kept by path, size and modification
time), far less than loading and measuring the model it names.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from quotientsharp.workflows.manifest import ManifestEntry

__all__ = ["content_identity", "content_sha256"]

_CACHE: dict[tuple[str, int, int], str] = {}


def _file_sha256(path: Path) -> str:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _CACHE:
        digest = hashlib.sha256()
        with path.open("rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
        _CACHE[key] = digest.hexdigest()
    return _CACHE[key]


def content_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes, or of a folder's files (relative names and hashes, sorted;
    hidden files left out)."""
    path = Path(path)
    if not path.is_dir():
        return _file_sha256(path)
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*")
                   if p.is_file() and not any(part.startswith(".")
                                              for part in p.relative_to(path).parts))
    for file in files:
        digest.update(f"{file.relative_to(path).as_posix()}\0{_file_sha256(file)}\n".encode())
    return digest.hexdigest()


def content_identity(entry: ManifestEntry) -> dict[str, Any]:
    """:meth:`ManifestEntry.identity` with the SHA-256 of the model and of the gap's data."""
    identity: dict[str, Any] = dict(entry.identity())
    for key, path in (("model", entry.model), ("train", entry.train), ("test", entry.test)):
        identity[f"{key}_sha256"] = None if path is None else content_sha256(path)
    return identity
