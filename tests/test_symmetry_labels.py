"""Labels say what was measured with a user's symmetry (issue 40, item 9).

Before, ``study --symmetry`` called its geodesic measure "inv metric" (the unused ``--metric``),
``--metric inv,mix`` gave two identical columns under two labels, and ``measure`` printed two
identical rows and never said that ``--metric`` did not apply.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest
import torch

from quotientsharp.cli.sharpness_options import add_sharpness_options, sharpness_config
from quotientsharp.workflows.grid import build_grid
from quotientsharp.workflows.options import InputError
from tests.bottleneck_symmetry import bottleneck_batches, bottleneck_model
from tests.test_cli_symmetry import _call  # (code, stdout, stderr) of the CLI

HERE = Path(__file__).parent
OPTIONS = ["--rho", "0.1", "--n-iter", "3", "--batch-size", "16", "--no-progress"]


@pytest.fixture
def folder(tmp_path, monkeypatch, request) -> tuple[Path, str]:
    module = f"labels_{request.node.name.replace('[', '_').replace(']', '').replace('-', '_')}"
    shutil.copy(HERE / "bottleneck_symmetry.py", tmp_path / f"{module}.py")
    torch.save(bottleneck_model(), tmp_path / "net.pt")
    torch.save(bottleneck_model(seed=1), tmp_path / "net2.pt")
    x = torch.cat([b[0] for b in bottleneck_batches()])
    y = torch.cat([b[1] for b in bottleneck_batches()])
    torch.save((x, y), tmp_path / "data.pt")
    monkeypatch.chdir(tmp_path)
    return tmp_path, f"{module}:bottleneck_binding"


def test_measure_names_the_binding_and_its_metric(folder):
    path, spec = folder
    code, stdout, stderr = _call("measure", path / "net.pt", path / "data.pt", *OPTIONS,
                                 "--symmetry", spec, "--json", path / "m.json")
    assert code == 0, stderr
    assert "geodesic (binding 'bottleneck' (bottleneck-gl) metric, order 2)" in stdout
    assert "inv" not in stdout.split("note:")[0].split("\n", 1)[1]
    assert "--metric" not in stdout          # not given, so nothing to say about it


def test_measure_says_when_a_given_metric_did_not_apply(folder):
    path, spec = folder
    code, stdout, stderr = _call("measure", path / "net.pt", path / "data.pt", *OPTIONS,
                                 "--symmetry", spec, "--metric", "mix")
    assert code == 0, stderr
    assert f"note: --metric mix did not apply: with --symmetry {spec}" in stdout


def test_several_metrics_with_a_symmetry_are_refused(folder):
    path, spec = folder
    code, stdout, stderr = _call("measure", path / "net.pt", path / "data.pt", *OPTIONS,
                                 "--symmetry", spec, "--metric", "inv,mix")
    assert code == 2
    assert "--metric inv,mix: with --symmetry" in stderr and "same value" in stderr
    code, _, stderr = _call("study", path / "m.csv", "--data", path / "data.pt", *OPTIONS,
                            "--symmetry", spec, "--metric", "inv,mix")
    assert code == 2 and "--metric inv,mix: with --symmetry" in stderr


def _grid(*arguments: str):
    parser = argparse.ArgumentParser()
    add_sharpness_options(parser, radius_list=True)
    args = parser.parse_args(list(arguments))
    return build_grid(sharpness_config(args))


def test_the_study_grid_names_a_user_symmetry_not_the_unused_metric():
    (point,) = _grid("--measure", "geodesic", "--rho", "0.1", "--symmetry", "mysym:bind")
    assert point.key == "geodesic_own_order2_rho0.1"
    assert point.label(greek=False) == ("geodesic sharpness (mysym:bind bindings' metric, "
                                        "order 2, rho = 0.1)")
    assert "inv" not in point.label()
    assert point.as_dict()["symmetry"] == "mysym:bind"
    (plain,) = _grid("--measure", "geodesic", "--rho", "0.1")
    assert plain.key == "geodesic_inv_order2_rho0.1" and "symmetry" not in plain.as_dict()
    with pytest.raises(InputError, match="--metric inv,mix: with --symmetry mysym:bind"):
        _grid("--measure", "geodesic", "--rho", "0.1", "--metric", "inv,mix",
              "--symmetry", "mysym:bind")


def test_the_study_report_and_columns_use_the_symmetry_label(folder):
    path, spec = folder
    (path / "models.csv").write_text("name,model,gap\na,net.pt,0.1\nb,net2.pt,0.2\n")
    code, stdout, stderr = _call("study", path / "models.csv", "--data", path / "data.pt",
                                 "--measure", "geodesic", *OPTIONS, "--bootstrap", "0",
                                 "--no-plots", "--symmetry", spec, "--out", path / "out")
    assert code == 0, stderr
    header = (path / "out" / "models.csv").read_text().splitlines()[0]
    assert "geodesic_own_order2_rho0.1" in header and "geodesic_inv" not in header
    report = (path / "out" / "report.md").read_text()
    assert f"{spec} bindings' metric" in report and "inv metric" not in report
    taus = json.loads((path / "out" / "taus.json").read_text())
    assert "inv metric" not in json.dumps(taus)


def test_rows_with_their_own_symmetry_are_named_in_the_label(folder):
    # no --symmetry, but one manifest row binds its own: that row's value is not "inv metric"
    path, spec = folder
    (path / "models.csv").write_text(
        f"name,model,gap,symmetry\na,net.pt,0.1,{spec}\nb,net2.pt,0.2,\n")
    code, stdout, stderr = _call("study", path / "models.csv", "--data", path / "data.pt",
                                 "--measure", "geodesic", *OPTIONS, "--bootstrap", "0",
                                 "--no-plots", "--out", path / "out")
    assert code == 0, stderr
    report = (path / "out" / "report.md").read_text()
    assert "inv or a row's own symmetry's metric" in report
    taus = json.loads((path / "out" / "taus.json").read_text())
    assert taus[0]["symmetry"] == "rows' own" and taus[0]["key"] == "geodesic_inv_order2_rho0.1"
    # a manifest without a symmetry column keeps the plain label
    (path / "plain.csv").write_text("name,model,gap\na,net.pt,0.1\nb,net2.pt,0.2\n")
    code, _, stderr = _call("study", path / "plain.csv", "--data", path / "data.pt",
                            "--measure", "geodesic", *OPTIONS, "--bootstrap", "0",
                            "--no-plots", "--out", path / "plain")
    assert code == 0, stderr
    assert "or a row's own" not in (path / "plain" / "report.md").read_text()
