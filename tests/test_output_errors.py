"""A locked, read-only or full output gives one line from every command that writes.

Tests run as root, whom ``chmod`` does not stop, so each unwritable output is simulated: a lock
held by another process, a path whose parent is a file, and the file writes monkeypatched to
raise ``OSError(ENOSPC)`` or ``OSError(EROFS)``. Every command (``study``, ``reproduce STUDY``
for every study, ``measure --json``, ``verify --json``) must answer with one line
``quotientsharp COMMAND: error: ...`` and exit status 2, never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import io
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from quotientsharp.cli import main
from quotientsharp.reproduce import STUDIES
from quotientsharp.workflows import files
from quotientsharp.workflows.locks import OutputLockedError

HOLD = """
import sys, time
from pathlib import Path
from quotientsharp.workflows.locks import OutputLock
lock = OutputLock(Path(sys.argv[1]), sys.argv[2]).acquire()   # held while referenced
print("held", flush=True)
time.sleep(120)
"""


def _call(*arguments: object) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main([*map(str, arguments)])
    return code, stdout.getvalue(), stderr.getvalue()


def _one_line(code: int, stderr: str, command: str, *words: str) -> None:
    assert code == 2, stderr
    assert stderr.count("\n") == 1, stderr
    assert stderr.startswith(f"quotientsharp {command}: error: "), stderr
    assert "Traceback" not in stderr
    for word in words:
        assert word in stderr, (word, stderr)


@contextlib.contextmanager
def _held(output: Path, what: str) -> Iterator[None]:
    """``output``'s lock held by another process for the block."""
    with subprocess.Popen([sys.executable, "-c", HOLD, str(output), what],
                          stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None and process.stdout.readline().strip() == "held"
            yield
        finally:
            process.kill()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Two saved MLPs, their data and a manifest with gaps."""
    root = tmp_path_factory.mktemp("outputs")
    for seed in (0, 1):
        torch.manual_seed(seed)
        torch.save(nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)),
                   root / f"net{seed}.pt")
    torch.save((torch.randn(16, 4), torch.randint(0, 3, (16,))), root / "data.pt")
    (root / "models.csv").write_text("model,gap\nnet0.pt,0.1\nnet1.pt,0.2\n")
    (root / "a_file").write_text("not a folder\n")
    return root


def _study(inputs: Path, out: Path) -> list[object]:
    return ["study", inputs / "models.csv", "--data", inputs / "data.pt", "--measure",
            "adaptive", "--rho", "0.1", "--n-iter", "2", "--no-progress", "--bootstrap", "0",
            "--no-plots", "--out", out]


def _measure(inputs: Path, out: Path) -> list[object]:
    return ["measure", inputs / "net0.pt", inputs / "data.pt", "--measure", "adaptive",
            "--rho", "0.1", "--n-iter", "2", "--no-progress", "--json", out]


def _full(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """Every atomic write (``run.json``, CSV, ``--json``) and every appended record fails with
    ``OSError(code)``."""

    def refuse(path, *args, **kwargs):
        raise OSError(code, __import__("os").strerror(code), str(path))

    monkeypatch.setattr(files, "_atomic_stream", refuse)
    monkeypatch.setattr(files, "append_jsonl", refuse)


@pytest.mark.parametrize("command", ["study", "measure"])
def test_locked_output_is_one_line(inputs, tmp_path, command):
    build = _study if command == "study" else _measure
    out = tmp_path / ("out" if command == "study" else "m.json")
    if command == "study":
        out.mkdir()
    with _held(out, "--out" if command == "study" else "--json"):
        code, _, stderr = _call(*build(inputs, out))
    _one_line(code, stderr, command, "is being written by process")


@pytest.mark.parametrize("command", ["study", "measure"])
def test_path_through_a_file_is_one_line(inputs, command):
    build = _study if command == "study" else _measure
    code, _, stderr = _call(*build(inputs, inputs / "a_file" / "out"))
    _one_line(code, stderr, command, "a_file")


@pytest.mark.parametrize("code_", [errno.ENOSPC, errno.EROFS], ids=["ENOSPC", "EROFS"])
@pytest.mark.parametrize("command", ["study", "measure"])
def test_full_or_read_only_disk_is_one_line(inputs, tmp_path, monkeypatch, command, code_):
    build = _study if command == "study" else _measure
    _full(monkeypatch, code_)
    code, _, stderr = _call(*build(inputs, tmp_path / ("out" if command == "study"
                                                         else "m.json")))
    _one_line(code, stderr, command, errno.errorcode[code_])


def test_verify_json_locked_is_one_line(tmp_path):
    out = tmp_path / "checks.json"
    with _held(out, "--json"):
        code, _, stderr = _call("verify", "--json", out)
    _one_line(code, stderr, "verify", "is being written by process")


@pytest.mark.parametrize("name", sorted(STUDIES))
@pytest.mark.parametrize("error", [
    OSError(errno.ENOSPC, "No space left on device", "results/x/run.json"),
    OSError(errno.EROFS, "Read-only file system", "results/x/models.jsonl"),
    OutputLockedError("--out results/x is being written by process 1 on host 'h'"),
], ids=["ENOSPC", "EROFS", "locked"])
def test_every_reproduce_study_reports_output_errors_in_one_line(monkeypatch, name, error):
    def run(args):
        raise error

    import quotientsharp.reproduce as reproduce

    monkeypatch.setattr(reproduce, "load_study",
                        lambda study: types.SimpleNamespace(run=run, GENERALISATION=None))
    code, _, stderr = _call("reproduce", name)
    _one_line(code, stderr, f"reproduce {name}",
              "being written" if isinstance(error, OutputLockedError)
              else errno.errorcode[error.errno])


@pytest.mark.parametrize("name", sorted(n for n in STUDIES if n != "summary"))
def test_reproduce_refuses_a_locked_folder_before_computing(tmp_path, name):
    out = tmp_path / "out"
    out.mkdir()
    with _held(out, "--out"):
        start = time.perf_counter()
        code, _, stderr = _call("reproduce", name, "--out", out)
    _one_line(code, stderr, f"reproduce {name}", "is being written by process", str(out))
    assert time.perf_counter() - start < 30


def test_reproduce_diagonal_under_a_file_is_one_line(inputs):
    code, _, stderr = _call("reproduce", "diagonal", "--quick", "--out",
                            inputs / "a_file" / "out")
    _one_line(code, stderr, "reproduce diagonal", "a_file")
