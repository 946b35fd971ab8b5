"""Text inputs that are not UTF-8 (a study's manifest, a JSON-lines data file) are named in a
one-line error.
"""

from __future__ import annotations

import contextlib
import io

import pytest

from quotientsharp.cli import main

#: these tests measure small MLPs without symmetry: the warning that says so is
#: expected here (tests/test_symmetry_check.py checks it)
pytestmark = pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")


def test_a_non_utf8_manifest_and_data_file_are_named(study_files, tmp_path):
    manifest = tmp_path / "models.csv"
    manifest.write_bytes(b"model,gap\nnet0.pt,0.1\n" + b"caf\xe9.pt,0.2\n")
    stderr_io = io.StringIO()
    with contextlib.redirect_stderr(stderr_io), contextlib.redirect_stdout(io.StringIO()):
        code = main(["study", str(manifest), "--data", str(study_files / "data.pt"),
                     "--measure", "adaptive", "--rho", "0.1", "--no-progress",
                     "--out", str(tmp_path / "o2")])
    assert code == 2 and str(manifest) in stderr_io.getvalue()
    assert "UTF-8" in stderr_io.getvalue()
    data = tmp_path / "data.jsonl"
    data.write_bytes(b'{"text": "caf\xe9", "label": 0}\n')
    stderr_io = io.StringIO()
    with contextlib.redirect_stderr(stderr_io), contextlib.redirect_stdout(io.StringIO()):
        code = main(["measure", str(study_files / "net0.pt"), str(data), "--measure",
                     "adaptive", "--rho", "0.1", "--no-progress"])
    assert code == 2 and str(data) in stderr_io.getvalue()
