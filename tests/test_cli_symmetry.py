"""``--symmetry MODULE:FUNCTION`` on ``measure`` and ``study``, a manifest's ``symmetry`` field,
and the note when geodesic sharpness finds no symmetry (issue 22, items 2 and 3)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import quotientsharp as qs
from quotientsharp.cli import main
from tests.bottleneck_symmetry import bottleneck_batches, bottleneck_binding, bottleneck_model

HERE = Path(__file__).parent
OPTIONS = ["--rho", "0.1", "--n-iter", "6", "--batch-size", "16", "--no-progress"]


def _call(*arguments: str) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main([*map(str, arguments)])
    return code, stdout.getvalue(), stderr.getvalue()


@pytest.fixture
def folder(tmp_path, monkeypatch, request) -> tuple[Path, str]:
    """The bottleneck model, its data and a symmetry module (a name of its own per test, since
    imported modules are cached) in the working directory."""
    module = f"bottleneck_{request.node.name.replace('[', '_').replace(']', '').replace('-', '_')}"
    shutil.copy(HERE / "bottleneck_symmetry.py", tmp_path / f"{module}.py")
    (tmp_path / f"{module}_bad.py").write_text(
        "def nothing(model):\n    return 3\n\n"
        "def absent(model):\n"
        f"    from {module} import BottleneckGL\n"
        "    import quotientsharp as qs\n"
        "    return qs.QuotientBinding(BottleneckGL(), ['0.weight', '9.weight'], name='b')\n")
    torch.save(bottleneck_model(), tmp_path / "net.pt")
    torch.save(bottleneck_model(), tmp_path / "net2.pt")
    x = torch.cat([b[0] for b in bottleneck_batches()])
    y = torch.cat([b[1] for b in bottleneck_batches()])
    torch.save((x, y), tmp_path / "data.pt")
    monkeypatch.chdir(tmp_path)
    return tmp_path, module


def test_api_measure_and_study_give_equal_values(folder):
    path, module = folder
    api = qs.sharpness(bottleneck_model(), bottleneck_batches(), rho=0.1, n_iter=6,
                       symmetries=bottleneck_binding(None), progress=False).value
    code, stdout, stderr = _call("measure", path / "net.pt", path / "data.pt", *OPTIONS,
                                 "--symmetry", f"{module}:bottleneck_binding",
                                 "--json", path / "m.json")
    assert code == 0, stderr
    document = json.loads((path / "m.json").read_text())
    (result,) = document["results"].values()
    assert result["value"] == api
    assert result["settings"]["symmetries"] == "bindings"
    assert document["settings"]["symmetry"] == f"{module}:bottleneck_binding"
    assert "note:" not in stdout
    (path / "models.csv").write_text("name,model,gap\na,net.pt,0.1\nb,net2.pt,0.2\n")
    code, stdout, stderr = _call("study", path / "models.csv", "--data", path / "data.pt",
                                 "--measure", "geodesic", *OPTIONS, "--bootstrap", "0",
                                 "--no-plots", "--symmetry", f"{module}:bottleneck_binding",
                                 "--out", path / "flag")
    assert code == 0, stderr
    with (path / "flag" / "models.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    values = [float(v) for row in rows for k, v in row.items() if k.startswith("geodesic")]
    assert values == [api, api]
    # the same from the manifest's field
    (path / "rows.csv").write_text("name,model,gap,symmetry\n"
                                   f"a,net.pt,0.1,{module}:bottleneck_binding\nb,net2.pt,0.2,\n")
    code, stdout, stderr = _call("study", path / "rows.csv", "--data", path / "data.pt",
                                 "--measure", "geodesic", *OPTIONS, "--bootstrap", "0",
                                 "--no-plots", "--out", path / "field")
    assert code == 0, stderr
    with (path / "field" / "models.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    values = [float(v) for row in rows for k, v in row.items() if k.startswith("geodesic")]
    assert values[0] == api and values[1] != api
    # the second row has no symmetry: the study says so
    assert "no symmetry was found or bound" in stdout and "--symmetry" in stdout


@pytest.mark.parametrize(("spec", "words"), [
    ("nomodule_xyz:f", "no module named 'nomodule_xyz'"),
    ("{module}:missing", "has no attribute 'missing'"),
    ("{module}_bad:nothing", "must return a QuotientBinding"),
    ("{module}_bad:absent", "'9.weight'"),
    ("no-colon", "expected MODULE:NAME"),
])
def test_bad_symmetries_are_one_line_errors_naming_the_flag(folder, spec, words):
    path, module = folder
    spec = spec.format(module=module)
    code, _, stderr = _call("measure", path / "net.pt", path / "data.pt", *OPTIONS,
                            "--symmetry", spec)
    assert code == 2
    assert stderr.count("\n") == 1 and "--symmetry" in stderr and words in stderr
    (path / "models.csv").write_text(f"name,model,gap,symmetry\na,net.pt,0.1,{spec}\n"
                                     f"b,net2.pt,0.2,{spec}\n")
    code, _, stderr = _call("study", path / "models.csv", "--data", path / "data.pt",
                            *OPTIONS, "--bootstrap", "0", "--no-plots", "--out", path / "o")
    assert code == 2
    assert stderr.count("\n") == 1 and "'symmetry' field" in stderr and words in stderr


def test_a_failed_measurement_is_named_by_the_users_binding(folder):
    path, module = folder
    torch.save((torch.randn(32, 3), torch.randint(0, 2, (32,))), path / "narrow.pt")
    code, _, stderr = _call("measure", path / "net.pt", path / "narrow.pt", *OPTIONS,
                            "--symmetry", f"{module}:bottleneck_binding")
    assert code == 2
    assert "sharpness of MODEL" in stderr and "binding 'bottleneck'" in stderr
    assert "(inv" not in stderr and "(mix" not in stderr


def test_measure_without_symmetry_prints_the_note(folder, tmp_path):
    torch.manual_seed(0)
    torch.save(torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(),
                                   torch.nn.Linear(5, 4)), tmp_path / "mlp.pt")
    torch.save((torch.randn(32, 6), torch.randint(0, 4, (32,))), tmp_path / "mlp_data.pt")
    code, stdout, stderr = _call("measure", tmp_path / "mlp.pt", tmp_path / "mlp_data.pt",
                                 *OPTIONS, "--measure", "geodesic,adaptive")
    assert code == 0, stderr
    assert stdout.count("note: no symmetry was found or bound") == 1
    assert "geodesic sharpness equals adaptive sharpness" in stdout and "--symmetry" in stdout


ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_symmetries_into_a_closed_pipe_ends_quietly(saved_mlp):
    read, write = os.pipe()
    os.close(read)                                   # the reader (``head``) has gone
    try:
        done = subprocess.run([sys.executable, "-m", "quotientsharp", "symmetries",
                               str(saved_mlp["net"]), "--json"], stdout=write,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=120)
    finally:
        os.close(write)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr
