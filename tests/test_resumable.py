"""The one resumable runner (quotientsharp.workflows.resumable), in one process.

Under torchrun it is exercised by every study in tests/test_reproduce_distributed.py; here:
records on disk as each unit finishes, the mirror, run.json,
--resume computing exactly the missing units, records of units no longer asked for left out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from quotientsharp.workflows.files import read_jsonl
from quotientsharp.workflows.records import ResultsDirectory
from quotientsharp.workflows.resumable import ResumableRun, rank0_value


class _Stop(Exception):
    pass


def _run(out: Path, units: list[int], resume: bool, mirrored: list[list[int]],
         ) -> ResumableRun[int]:
    def mirror(folder: ResultsDirectory, records: Mapping[int, dict[str, Any]]) -> None:
        mirrored.append(list(records))
        folder.write_csv("units.csv", ["unit", "square"], records.values())

    return ResumableRun(out, units, study="demo", settings={"power": 2}, resume=resume,
                        owned=["units.jsonl", "units.csv"], records="units.jsonl", key="unit",
                        unit="square", description="demo", progress=False, mirror=mirror)


def _square(stop_at: int | None = None) -> Callable[[int, Callable[[str], None]], dict]:
    def work(unit: int, status: Callable[[str], None]) -> dict[str, Any]:
        status(f"unit {unit}")
        if unit == stop_at:
            raise _Stop
        return {"unit": unit, "square": unit * unit}

    return work


def test_records_are_written_as_units_finish_and_resume_computes_the_rest(tmp_path):
    out, mirrored = tmp_path / "out", []
    run = _run(out, [3, 1, 2], resume=False, mirrored=mirrored)
    assert run.open() == {}
    with pytest.raises(_Stop) as stopped:
        run.run(_square(stop_at=2))
    assert stopped.value.raised_on_this_rank                # the CLI reports it on this rank
    # the finished units are on disk, mirrored, counted; nothing marks the run finished
    assert read_jsonl(out / "units.jsonl") == [{"unit": 3, "square": 9},
                                               {"unit": 1, "square": 1}]
    assert mirrored == [[3], [3, 1]]
    assert (out / "units.csv").read_text().splitlines() == ["unit,square", "3,9", "1,1"]
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "running" and info["finished_squares"] == 2

    mirrored.clear()
    resumed = _run(out, [3, 1, 2], resume=True, mirrored=mirrored)
    assert list(resumed.open()) == [3, 1]
    calls: list[int] = []

    def counted(unit: int, status: Callable[[str], None]) -> dict[str, Any]:
        calls.append(unit)
        return _square()(unit, status)

    saved: list[int] = []
    records = resumed.run(counted, saved.append)
    assert calls == [2] and saved == [2] and resumed.computed_now == [2]
    assert list(records) == [3, 1, 2]
    assert resumed.finish(lambda folder, wall: (folder.path, wall >= 0)) == (out, True)
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "finished" and info["computed_now"] == [2]
    assert info["finished_squares"] == 3 and info["resumed"] == 1
    # the mirror on --resume (repairing a cut run), after the unit, at the end
    assert mirrored == [[3, 1], [3, 1, 2], [3, 1, 2]]


def test_records_of_units_no_longer_asked_for_are_left_out(tmp_path):
    out = tmp_path / "out"
    first = _run(out, [0, 1, 2], resume=False, mirrored=[])
    first.open()
    first.run(_square())
    first.finish(lambda folder, wall: None)
    fewer = _run(out, [2, 0], resume=True, mirrored=[])
    assert list(fewer.open()) == [2, 0] and fewer.ignored == [1]
    assert list(fewer.run(_square())) == [2, 0] and fewer.computed_now == []


def test_a_check_refuses_the_folder_and_units_must_be_distinct(tmp_path):
    with pytest.raises(ValueError, match="distinct"):
        _run(tmp_path, [1, 1], resume=False, mirrored=[])

    def refuse(finished: Mapping[int, dict[str, Any]]) -> None:
        raise ValueError(f"refused {sorted(finished)}")

    run = ResumableRun(tmp_path, [0], study="demo", settings={}, resume=False,
                       owned=["units.jsonl"], records="units.jsonl", key="unit",
                       unit="square", description="demo", progress=False, check=refuse)
    with pytest.raises(ValueError, match=r"refused \[\]"):
        run.open()


def test_rank0_value_without_a_process_group_is_a_call():
    assert rank0_value(lambda: 7) == 7
    with pytest.raises(RuntimeError, match="no value"):
        rank0_value(lambda: None)
