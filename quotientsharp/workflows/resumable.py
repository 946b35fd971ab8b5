"""The one resumable runner of every study: units of work, a record each, on disk as each
finishes. Each rank appends to its own shard (one writer per file, no locking), so a unit is
safe the moment it finishes and a ``--resume`` under any number of ranks computes exactly the
missing units.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

from quotientsharp.workflows.files import append_jsonl
from quotientsharp.workflows.process_group import (
    gather_indexed,
    rank_and_world_size,
    run_on_rank0,
    shard,
)
from quotientsharp.workflows.progress import progress_bar
from quotientsharp.workflows.records import ResultsDirectory, shard_name

Key = TypeVar("Key", bound=Hashable)     # a model's name or index, a grid point
Value = TypeVar("Value")
#: One unit's record (JSON-serialisable; it holds its key under the runner's ``key`` field).
Record = dict[str, Any]
Work = Callable[[Key, Callable[[str], None]], Record]
Mirror = Callable[[ResultsDirectory, Mapping[Key, Record]], None]


class ResumableRun(Generic[Key]):
    """A study's units of work, run resumably on one process or on every rank of torchrun.

    Make one on every rank with the same arguments, then call :meth:`open`, :meth:`run` and
    :meth:`finish` on every rank.

    Parameters
    ----------
    out, units
        The results folder; every unit's key, in the order of the outputs.
    study, settings, resume, owned
        As in :class:`~quotientsharp.workflows.records.ResultsDirectory`.
    records, key
        The records file (JSONL) among ``owned``, and the field of a record holding its key.
    unit, description, progress
        The progress bar's unit (also ``run.json``'s ``finished_<unit>s``), label, and whether
        it shows (``None``: on a terminal; rank 0 only).
    mirror
        Rank 0's view of the finished records, rewritten after each unit, on ``--resume``
        and at the end.
    check
        Called on rank 0 with the finished records read back, before anything is computed:
        raise to refuse the folder.

    Attributes
    ----------
    folder
        Rank 0's results folder after :meth:`open` (``None`` on the other ranks).
    computed_now, ignored
        The keys computed in this session (after :meth:`run`), and those of records in the
        folder not among ``units`` (after :meth:`open`).
    """

    def __init__(self, out: Path, units: Sequence[Key], *, study: str,
                 settings: Mapping[str, Any], resume: bool, owned: Iterable[str], records: str,
                 key: str, unit: str, description: str, progress: bool | None,
                 mirror: Mirror[Key] | None = None,
                 check: Callable[[Mapping[Key, Record]], None] | None = None) -> None:
        if len(set(units)) != len(units):
            raise ValueError(f"{study}: the units of work must be distinct")
        self.out = Path(out)
        self.units = list(units)
        self.resume = resume
        self.records_file = records
        # rank 0 opens the folder in open()
        self._results_directory = partial(ResultsDirectory, self.out, study, settings, resume,
                                          [*owned], sharded=[records])
        self.key = key
        self.unit = unit
        self.description = description
        self.progress = progress
        self.mirror = mirror
        self.check = check
        self.rank, self.world_size = rank_and_world_size()
        self.folder: ResultsDirectory | None = None
        self.computed_now: list[Key] = []
        self.ignored: list[Key] = []
        self._records: dict[Key, Record] = {}
        self._previous_seconds = 0.0
        self._start = time.perf_counter()

    def open(self) -> dict[Key, Record]:
        """Open (on ``--resume``, check) the folder on rank 0; the records finished earlier, in
        unit order, on every rank."""

        def open_folder() -> tuple[dict[Key, Record], list[Key], float]:
            folder = self.folder = self._results_directory()
            # shards of an interrupted distributed run join the records file before anything
            on_disk = {record[self.key]: record
                       for record in folder.consolidate(self.records_file, self.key)}
            finished = self._in_unit_order(on_disk)
            if self.check is not None:
                self.check(finished)
            if self.resume and self.mirror is not None:
                # the mirror follows the records file: a run cut between the two is repaired
                self.mirror(folder, finished)
            ignored = [key for key in on_disk if key not in finished]
            return finished, ignored, float(folder.run_info.get("wall_seconds", 0.0))

        finished, ignored, self._previous_seconds = rank0_value(open_folder)
        self.ignored = ignored
        self._records = dict(finished)
        self._start = time.perf_counter()
        return dict(finished)

    def run(self, work: Work[Key],
            saved: Callable[[Key], None] | None = None) -> dict[Key, Record]:
        """Compute this rank's share of the units not yet finished; every record, in unit
        order, on every rank. ``work(unit, status)`` returns the unit's record (its exception,
        marked ``raised_on_this_rank``, stops the run); ``saved(key)`` follows each record
        on disk."""
        todo = [key for key in self.units if key not in self._records]
        mine = shard(todo)                          # (position in todo, key)
        bar = progress_bar(len(self._records) + len(mine), self.description,
                           self.progress if self.rank == 0 else False, unit=self.unit)
        computed: list[tuple[int, Record]] = []
        try:
            bar.update(len(self._records))
            for position, key in mine:
                try:
                    record = work(key, bar.set_postfix_str)
                except Exception as err:
                    err.raised_on_this_rank = True  # type: ignore[attr-defined]  # read by the CLI
                    raise
                computed.append((position, record))
                bar.update(1)
                self._save(key, record)
                if saved is not None:
                    saved(key)
        finally:
            bar.close()
        if self.world_size > 1:
            for position, record in enumerate(gather_indexed(computed)):
                self._records[todo[position]] = record
        self._records = self._in_unit_order(self._records)
        self.computed_now = todo
        return dict(self._records)

    def finish(self, write: Callable[[ResultsDirectory, float], Value]) -> Value:
        """On rank 0: fold the shards into the records file, rewrite the mirror, call
        ``write(folder, wall_seconds)`` (the study's own outputs) and mark the run finished in
        ``run.json``; ``write``'s value, on every rank."""
        def complete() -> Value:
            folder = self.rank0_folder()
            wall = self.wall_seconds()
            folder.consolidate(self.records_file, self.key)
            if self.mirror is not None:
                self.mirror(folder, self._records)
            value = write(folder, wall)
            folder.save_run_info(status="finished",
                                 **{f"finished_{self.unit}s": len(self._records)},
                                 wall_seconds=wall, computed_now=self.computed_now)
            folder.close()          # the last write: another run may take the folder now
            return value

        # the value is shared with every rank, so ``None`` only when ``write`` returned it
        return cast(Value, run_on_rank0(complete))

    def wall_seconds(self) -> float:
        """Wall time of every session of the run so far (this one since :meth:`open`)."""
        return self._previous_seconds + time.perf_counter() - self._start

    def rank0_folder(self) -> ResultsDirectory:
        """Rank 0's :attr:`folder`; an error on the other ranks or before :meth:`open`."""
        if self.folder is None:
            raise RuntimeError("the results folder is rank 0's, after open()")
        return self.folder

    def _in_unit_order(self, records: Mapping[Key, Record]) -> dict[Key, Record]:
        return {key: records[key] for key in self.units if key in records}

    def _save(self, key: Key, record: Record) -> None:
        """Put one record on disk (its rank's shard under torchrun); refresh rank 0's mirror."""
        if self.world_size == 1:
            self.rank0_folder().append(self.records_file, record)
            self._records[key] = record
            live = self._records
        else:
            append_jsonl(self.out / shard_name(self.records_file, self.rank), record)
            if self.rank != 0:
                return
            # every rank's finished records; shards read, never repaired (another rank may be
            # writing its last line)
            live = {r[self.key]: r for r in self.rank0_folder().merged_records(
                self.records_file, self.key, repair=False)}
        folder, live = self.rank0_folder(), self._in_unit_order(live)
        if self.mirror is not None:
            self.mirror(folder, live)
        folder.save_run_info(**{f"finished_{self.unit}s": len(live)},
                             wall_seconds=self.wall_seconds())


def rank0_value(function: Callable[[], Value | None]) -> Value:
    """``function()`` called on rank 0 and its value shared with every rank, never ``None``
    (:func:`~quotientsharp.workflows.process_group.run_on_rank0`, typed as ``function``'s)."""
    value = run_on_rank0(function)
    if value is None:
        raise RuntimeError("rank 0 shared no value")
    return value
