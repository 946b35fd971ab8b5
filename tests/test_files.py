"""The results files of ``quotientsharp.workflows.files`` are written with the usual mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from quotientsharp.workflows.locks import OutputLock


def test_results_files_are_written_with_the_usual_mode(tmp_path):
    from quotientsharp.workflows.files import write_json_atomic, write_jsonl_atomic

    mask = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "run.json", {"a": 1})
        write_jsonl_atomic(tmp_path / "models.jsonl", [{"a": 1}])
    finally:
        os.umask(mask)
    for name in ("run.json", "models.jsonl"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o644, name
    assert json.loads((tmp_path / "run.json").read_text()) == {"a": 1}


ROOT = Path(__file__).resolve().parents[1]


def test_a_kill_mid_write_leaves_a_temporary_file_the_next_writer_removes(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    script = textwrap.dedent(f"""
        import os, time
        from pathlib import Path
        from quotientsharp.workflows import files
        from quotientsharp.workflows.locks import OutputLock
        lock = OutputLock(Path({str(out)!r})).acquire()
        def stuck(fd):
            print("writing", flush=True)
            time.sleep(120)
        files.os.fsync = stuck
        files.write_csv_atomic(Path({str(out)!r}) / "models.csv", ["a"], [{{"a": 1}}])
    """)
    writer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    writer.stdout.close()
    assert [p.name for p in out.glob(".models.csv.*.tmp")]     # what SIGKILL leaves
    with OutputLock(out):
        assert not list(out.glob("*.tmp")) and not list(out.glob(".*.tmp"))
    assert not (out / "models.csv").exists()
