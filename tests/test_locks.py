"""The output locks of ``quotientsharp.workflows.locks``: a second writer of a folder or of a
``--json`` file fails at once and changes nothing; two studies started at once on one folder
mix nothing; ``measure --json`` is written atomically under the lock of its name.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from quotientsharp.cli import main
from quotientsharp.workflows.files import read_jsonl
from quotientsharp.workflows.locks import OutputLock, OutputLockedError
from quotientsharp.workflows.records import ResultsDirectory

#: these tests measure small MLPs without symmetry: the warning that says so is
#: expected here (tests/test_symmetry_check.py checks it)
pytestmark = pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")


ROOT = Path(__file__).resolve().parents[1]


def _study(root: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["study", str(root / "models.csv"), "--data", str(root / "data.pt"),
                     "--measure", "adaptive", "--rho", "0.1", "--n-iter", "2", "--no-progress",
                     "--no-plots", "--bootstrap", "50", "--out", str(out), *extra])
    return code, stdout.getvalue(), stderr.getvalue()


def _hold(path: Path) -> subprocess.Popen:
    """Another process that takes the output's lock and keeps it until killed."""
    script = textwrap.dedent(f"""
        import sys, time
        from quotientsharp.workflows.locks import OutputLock
        lock = OutputLock({str(path)!r}).acquire()      # held while referenced
        print("held", flush=True)
        time.sleep(120)
    """)
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())
            if p.is_file() and not p.name.startswith(".quotientsharp.lock")}


def test_a_second_study_on_a_held_folder_fails_at_once_and_changes_nothing(study_files,
                                                                          tmp_path):
    out = tmp_path / "out"
    assert _study(study_files, out)[0] == 0
    before = _snapshot(out)
    holder = _hold(out)
    try:
        tic = time.perf_counter()
        code, _, stderr = _study(study_files, out, "--resume")
        assert time.perf_counter() - tic < 20
        assert code == 2
        assert f"--out {out} is being written by process {holder.pid}" in stderr
        assert "host" in stderr
        code, _, stderr = _study(study_files, out)            # a fresh run: nothing deleted
        assert code == 2 and str(holder.pid) in stderr
        assert _snapshot(out) == before
        with pytest.raises(OutputLockedError, match=str(out)):
            ResultsDirectory(out, "quotientsharp study", {}, resume=True, owned=[])
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # the holder is gone (killed, its lock released by the OS): the folder is free again
    code, _, stderr = _study(study_files, out, "--resume")
    assert code == 0, stderr
    assert len(read_jsonl(out / "models.jsonl")) == 3


# each process imports the package first, then waits for the go file, so that both runs start
# their study at the same moment; a short pause per model keeps the winner's run (and its lock)
# alive while the other one starts
_RACER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from quotientsharp.cli import main
    from quotientsharp.workflows import measuring
    go, original = Path(sys.argv[1]), measuring.measure_entry
    def paused(*args, **kwargs):
        time.sleep(0.2)
        return original(*args, **kwargs)
    measuring.measure_entry = paused
    print("ready", flush=True)
    while not go.exists():
        time.sleep(0.002)
    sys.exit(main(sys.argv[2:]))
""")


def test_two_studies_started_at_once_on_one_folder_one_refuses_nothing_mixed(study_files,
                                                                            tmp_path):
    out, go = tmp_path / "out", tmp_path / "go"
    racers = {}
    for rho in ("0.1", "0.2"):
        argv = ["study", str(study_files / "models.csv"), "--data", str(study_files / "data.pt"),
                "--measure", "adaptive", "--rho", rho, "--n-iter", "2", "--no-progress",
                "--no-plots", "--bootstrap", "20", "--out", str(out)]
        racers[rho] = subprocess.Popen(
            [sys.executable, "-c", _RACER, str(go), *argv], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    for racer in racers.values():
        assert racer.stdout is not None and racer.stdout.readline().strip() == "ready"
    go.touch()
    finished = {rho: (racer.wait(timeout=120), *racer.communicate())
                for rho, racer in racers.items()}
    codes = sorted(code for code, _, _ in finished.values())
    assert codes == [0, 2], finished
    winner = next(rho for rho, (code, _, _) in finished.items() if code == 0)
    loser = next(rho for rho in finished if rho != winner)
    stderr = finished[loser][2]
    assert f"--out {out} is being written by process {racers[winner].pid}" in stderr
    assert "host" in stderr
    # the winner's outputs are complete, and hold its measurement and nothing of the other's
    key, other = f"adaptive_rho{winner}", f"adaptive_rho{loser}"
    records = read_jsonl(out / "models.jsonl")
    assert sorted(r["name"] for r in records) == ["net0.pt", "net1.pt", "net2.pt"]
    assert all(list(r["sharpness"]) == [key] for r in records)
    header, *rows = (out / "models.csv").read_text().splitlines()
    assert header.split(",")[-1] == key and len(rows) == 3
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "finished"
    assert [entry["key"] for entry in run["settings"]["grid"]] == [key]
    for name in ("models.csv", "taus.json", "taus.csv", "report.md", "run.json"):
        assert other not in (out / name).read_text(), name
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*.tmp"))


def test_a_second_measure_json_to_the_same_file_fails_at_once(study_files, tmp_path):
    target = tmp_path / "result.json"
    holder = _hold(target)
    try:
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            code = main(["measure", str(study_files / "net0.pt"), str(study_files / "data.pt"),
                         "--measure", "adaptive", "--rho", "0.1", "--n-iter", "2",
                         "--no-progress", "--json", str(target)])
        assert code == 2
        assert f"--json {target} is being written by process {holder.pid}" in stderr.getvalue()
        assert not target.exists()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


def test_a_second_verify_json_to_the_same_file_fails_at_once(tmp_path):
    target = tmp_path / "rows.json"
    holder = _hold(target)
    try:
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            code = main(["verify", "--seeds", "1", "--dtype", "float64", "--json", str(target)])
        assert code == 2
        assert f"--json {target} is being written by process {holder.pid}" in stderr.getvalue()
        assert not target.exists()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


def test_measure_json_is_written_atomically_and_locked_by_name(tmp_path):
    from quotientsharp.cli.measure import write_json

    target = tmp_path / "sub" / "r.json"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / ".r.json.123.tmp").write_text("left by a killed writer")
    with OutputLock(target, "--json"):
        write_json(target, {"value": 1.5})
        assert not list((tmp_path / "sub").glob(".r.json.*.tmp"))
    assert json.loads(target.read_text()) == {"value": 1.5}


@pytest.mark.parametrize("late", [0.3, None])
def test_a_holder_that_writes_its_details_late_is_named_or_said_to_have_none(tmp_path, late):
    # the race of two runs started at once: the winner holds the lock but has not written its
    # details; the loser waits for them up to a second (late = None: they never come)
    out = tmp_path / "out"
    out.mkdir()
    lock = OutputLock(out)
    write = ("" if late is None else
             f"time.sleep({late}); Path({str(lock.holder_path)!r}).write_text("
             "json.dumps({'pid': os.getpid(), 'host': 'here', 'since': 'now'}))")
    script = textwrap.dedent(f"""
        import json, os, time
        from pathlib import Path
        from filelock import FileLock
        held = FileLock({str(lock.lock_path)!r})
        held.acquire()
        print("held", flush=True)
        {write}
        time.sleep(60)
    """)
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(OutputLockedError) as info:
            lock.acquire()
        message = str(info.value)
        if late is None:
            assert "another process (it has not written its details yet)" in message
        else:
            assert f"is being written by process {holder.pid} on host 'here'" in message
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
