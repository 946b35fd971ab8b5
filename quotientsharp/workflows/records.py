"""A study's results folder (:class:`ResultsDirectory`): ``run.json``, the append-only record
files and their per-rank shards (``models.rank{r}.jsonl`` under torchrun), the ``--resume``
check; :class:`~quotientsharp.workflows.resumable.ResumableRun` fills it."""

from __future__ import annotations

import json
import os
import platform
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from quotientsharp._version import __version__
from quotientsharp.workflows.files import (
    append_jsonl,
    read_jsonl,
    write_csv_atomic,
    write_json_atomic,
    write_jsonl_atomic,
)
from quotientsharp.workflows.locks import OutputLock
from quotientsharp.workflows.process_group import rank_and_world_size


def _version(module_name: str) -> str | None:
    try:
        module = __import__(module_name)
    except ImportError:
        return None
    return str(getattr(module, "__version__", "unknown"))


def environment_versions() -> dict[str, Any]:
    """The versions of Python and the packages, the platform, CPU and thread counts."""
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__,
            "numpy": _version("numpy"), "quotientsharp": __version__,
            "scipy": _version("scipy"), "matplotlib": _version("matplotlib"),
            "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads()}


#: The versions a ``--resume`` must share with the run it continues (``run.json``'s
#: ``environment``): records of two versions of the package or of torch would be mixed.
RESUME_VERSIONS = ("quotientsharp", "torch")


def shard_name(name: str, rank: int) -> str:
    """The per-rank shard of a JSONL file: ``shard_name("models.jsonl", 3)`` is
    ``"models.rank3.jsonl"``."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be an integer >= 0, got {rank!r}")
    stem, _, suffix = name.rpartition(".")
    return f"{stem}.rank{rank}.{suffix}"


def shard_paths(folder: Path, name: str) -> list[Path]:
    """The shard files of ``name`` present in ``folder`` (any world size), by rank."""
    stem, _, suffix = name.rpartition(".")
    matcher = re.compile(re.escape(stem) + r"\.rank(\d+)\." + re.escape(suffix) + "$")
    found = [(int(match.group(1)), path)
             for path in Path(folder).glob(f"{stem}.rank*.{suffix}")
             if (match := matcher.match(path.name))]
    return [path for _, path in sorted(found)]


def is_main_rank() -> bool:
    """Whether this process reports (prints): rank 0 of the process group, or the only one."""
    return rank_and_world_size()[0] == 0


class ResultsDirectory:
    """A study's output folder, with ``run.json`` (:attr:`run_info`) and ``--resume``.

    Parameters
    ----------
    path
        The folder (created if missing).
    study, settings
        The study's name and everything that determines its results (JSON-serialisable), in
        ``run.json``; with ``resume`` they must equal those saved there.
    resume
        Keep the existing records; without it the study's files (``owned``) are deleted first.
    owned, sharded
        File names inside ``path`` that the study writes, and the JSONL files among them that
        ranks may write as per-rank shards (:func:`shard_name`).
    """

    def __init__(self, path: Path, study: str, settings: Mapping[str, Any], resume: bool,
                 owned: Iterable[str], sharded: Iterable[str] = ()) -> None:
        self.path = Path(path)
        self.study = study
        self.settings = json.loads(json.dumps(dict(settings)))   # as it will read back
        self.resume = bool(resume)
        self.sharded = sorted(set(sharded))
        self.owned = sorted(set(owned) | {"run.json"} | set(self.sharded))
        if self.path.exists() and not self.path.is_dir():
            raise NotADirectoryError(f"--out {self.path} exists and is not a directory")
        self.path.mkdir(parents=True, exist_ok=True)
        # one writer per folder: a second run on it fails here, before reading anything
        self.lock = OutputLock(self.path, "--out").acquire()
        try:
            self._open(study)
        except BaseException:
            self.lock.release()
            raise

    def _open(self, study: str) -> None:
        """Check (``--resume``) or clear the folder, and write ``run.json``; under the lock."""
        self.run_file = self.path / "run.json"
        previous = self._previous_run()
        ours = [self.path / name for name in self.owned]
        ours += [path for name in self.sharded for path in shard_paths(self.path, name)]
        leftovers = [path.name for path in ours if path.exists()]
        if self.resume and previous is None and leftovers:
            raise ValueError(f"--resume: {self.path} holds {leftovers[:3]} but no run.json, so "
                             "its settings cannot be checked; run without --resume to start "
                             "afresh")
        environment = environment_versions()
        command = " ".join(sys.argv) if sys.argv else ""
        if self.resume and previous is not None:
            self._check_same_settings(previous)
            self._check_same_versions(previous, environment)
            self.run_info: dict[str, Any] = previous
            self.run_info["resumed"] = previous.get("resumed", 0) + 1
        else:
            for path in ours:
                path.unlink(missing_ok=True)
            self.run_info = {"study": study, "status": "running", "settings": self.settings,
                             "resumed": 0}
        self.run_info["status"] = "running"
        # not a setting: a run may be resumed under any number of processes
        self.run_info["world_size"] = rank_and_world_size()[1]
        self.run_info["world_sizes"] = [*self.run_info.get("world_sizes", []),
                                        self.run_info["world_size"]]
        # the first session's environment and command stay: a resume adds its command only
        if "environment" in self.run_info:
            self.run_info["resume_commands"] = [*self.run_info.get("resume_commands", []),
                                                command]
        else:
            self.run_info["environment"], self.run_info["command"] = environment, command
        self.save_run_info()

    def _previous_run(self) -> dict[str, Any] | None:
        if not self.run_file.exists():
            return None
        try:
            data = json.loads(self.run_file.read_text())
        except json.JSONDecodeError as err:
            if self.resume:
                raise ValueError(f"--resume: {self.run_file} is not valid JSON ({err}); "
                                 "delete the folder or run without --resume") from err
            return None
        if self.resume and (not isinstance(data, dict) or data.get("study") != self.study):
            raise ValueError(f"--resume: {self.run_file} belongs to study "
                             f"{data.get('study') if isinstance(data, dict) else None!r}, not "
                             f"{self.study!r}; choose another --out")
        return data

    def _check_same_settings(self, previous: Mapping[str, Any]) -> None:
        saved = previous.get("settings", {})
        keys = sorted(set(saved) | set(self.settings))
        differing = [k for k in keys if saved.get(k) != self.settings.get(k)]
        if differing:
            details = ", ".join(f"{k}: saved {saved.get(k)!r}, now {self.settings.get(k)!r}"
                                for k in differing[:6])
            raise ValueError(f"--resume: the settings differ from the run saved in "
                             f"{self.run_file} ({details}); use the same options or another "
                             "--out, or run without --resume to start afresh")

    def _check_same_versions(self, previous: Mapping[str, Any],
                             environment: Mapping[str, Any]) -> None:
        saved = previous.get("environment")
        if not isinstance(saved, Mapping):
            return
        changed = [f"{name} {saved[name]} -> {environment.get(name)}" for name in RESUME_VERSIONS
                   if saved.get(name) is not None and saved[name] != environment.get(name)]
        if changed:
            raise ValueError(f"--resume: {self.run_file} was recorded under other versions "
                             f"({', '.join(changed)}); records of two versions would be mixed: "
                             "install the recorded versions, use another --out, or run without "
                             "--resume to start afresh")

    def close(self) -> None:
        """Release the folder's lock (the process's end releases it too)."""
        self.lock.release()

    def file(self, name: str) -> Path:
        """Path of one of the study's files."""
        return self.path / name

    def save_run_info(self, **updates: Any) -> None:
        """Merge ``updates`` into ``run.json`` and write it atomically."""
        self.run_info.update(updates)
        write_json_atomic(self.run_file, self.run_info)

    def records(self, name: str) -> list[dict[str, Any]]:
        """The finished records of JSONL file ``name`` (a torn last line is repaired away)."""
        return read_jsonl(self.file(name), repair=True)

    def append(self, name: str, record: Mapping[str, Any]) -> None:
        """Append one record to JSONL file ``name``, flushed and synced before returning."""
        append_jsonl(self.file(name), record)

    def merged_records(self, name: str, key: str, repair: bool = True) -> list[dict[str, Any]]:
        """The records of ``name``, then those of its rank shards whose ``key`` is new (a
        consolidation cut short leaves records twice); ``repair=False`` while other ranks may
        still be appending."""
        records: dict[Any, dict[str, Any]] = {}
        for path in [self.file(name), *shard_paths(self.path, name)]:
            for record in read_jsonl(path, repair=repair):
                if key not in record:
                    raise ValueError(f"{path}: a record without {key!r}")
                records.setdefault(record[key], record)
        return list(records.values())

    def consolidate(self, name: str, key: str) -> list[dict[str, Any]]:
        """Fold the rank shards of ``name`` into it (rewritten atomically, sorted by ``key``,
        before the shards go), while no other rank writes; the merged records."""
        shards = shard_paths(self.path, name)
        records = self.merged_records(name, key)
        if shards:
            records = sorted(records, key=lambda record: record[key])
            write_jsonl_atomic(self.file(name), records)
            for shard in shards:
                shard.unlink(missing_ok=True)
        return records

    def write_csv(self, name: str, columns: Sequence[str],
                  rows: Iterable[Mapping[str, Any]]) -> None:
        """(Re)write CSV file ``name`` with a header and ``rows``, atomically."""
        write_csv_atomic(self.file(name), columns, rows)

