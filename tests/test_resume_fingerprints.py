"""``study --resume`` identifies a user's symmetry by content and the run by its versions.

A record keeps the fingerprint of the symmetry it was measured with (the source of the user's
modules and a hash of the bindings); ``run.json`` keeps the package and torch versions of the
first session. A resume after the symmetry module's source changed, or under another version,
refuses in one line naming what changed; an unchanged resume works and rewrites nothing it
recorded.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
import torch

import quotientsharp as qs
from quotientsharp.cli import main
from quotientsharp.workflows import measuring
from quotientsharp.workflows.files import read_jsonl
from quotientsharp.workflows.fingerprints import fingerprint_change, symmetry_fingerprint
from tests.bottleneck_symmetry import (
    BottleneckGL,
    bottleneck_batches,
    bottleneck_binding,
    bottleneck_model,
)
from tests.test_functional import _mlp
from tests.test_locks import _study

HERE = Path(__file__).parent
OPTIONS = ["--rho", "0.1", "--n-iter", "4", "--batch-size", "16", "--no-progress",
           "--measure", "geodesic", "--bootstrap", "0", "--no-plots"]


def _call(*arguments: object) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main([*map(str, arguments)])
    return code, stdout.getvalue(), stderr.getvalue()


@pytest.fixture
def study(tmp_path, monkeypatch, request) -> tuple[Path, Path, list[object]]:
    """A finished study of two bottleneck models with a symmetry module of the test's own
    (imported modules are cached: one name per test): the module, the output folder and the
    command that made it."""
    module = f"fp_{request.node.name.replace('[', '_').replace(']', '').replace('-', '_')}"
    shutil.copy(HERE / "bottleneck_symmetry.py", tmp_path / f"{module}.py")
    torch.save(bottleneck_model(), tmp_path / "net.pt")
    torch.save(bottleneck_model(seed=3), tmp_path / "net2.pt")
    x = torch.cat([b[0] for b in bottleneck_batches()])
    y = torch.cat([b[1] for b in bottleneck_batches()])
    torch.save((x, y), tmp_path / "data.pt")
    (tmp_path / "models.csv").write_text("name,model,gap\na,net.pt,0.1\nb,net2.pt,0.2\n")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    command: list[object] = ["study", tmp_path / "models.csv", "--data", tmp_path / "data.pt",
                             *OPTIONS, "--symmetry", f"{module}:bottleneck_binding",
                             "--out", out]
    code, _, stderr = _call(*command)
    assert code == 0, stderr
    return tmp_path / f"{module}.py", out, command


def _recorded(out: Path) -> dict[str, object]:
    run = json.loads((out / "run.json").read_text())
    return {key: run[key] for key in ("settings", "environment", "command", "study")}


def test_unchanged_resume_works_and_rewrites_nothing_recorded(study):
    _, out, command = study
    records = (out / "models.jsonl").read_bytes()
    recorded = _recorded(out)
    assert all(json.loads(line)["symmetry_fingerprint"]["modules"]
               for line in records.splitlines())
    code, _, stderr = _call(*command, "--resume")
    assert code == 0, stderr
    assert (out / "models.jsonl").read_bytes() == records
    assert _recorded(out) == recorded
    run = json.loads((out / "run.json").read_text())
    assert run["resumed"] == 1 and len(run["resume_commands"]) == 1


def test_resume_after_the_symmetry_source_changed_refuses(study):
    source, out, command = study
    records = (out / "models.jsonl").read_bytes()
    source.write_text(source.read_text() + "\n# an edit after the first run\n")
    code, _, stderr = _call(*command, "--resume")
    assert code != 0
    assert stderr.count("\n") == 1, stderr
    assert "--resume" in stderr and source.stem in stderr and "source" in stderr
    assert (out / "models.jsonl").read_bytes() == records


@pytest.mark.parametrize("package", ["torch", "quotientsharp"])
def test_resume_under_another_version_refuses_and_keeps_the_recorded_one(study, package):
    _, out, command = study
    run = json.loads((out / "run.json").read_text())
    run["environment"][package] = "0.0.1"
    (out / "run.json").write_text(json.dumps(run))
    code, _, stderr = _call(*command, "--resume")
    assert code != 0
    assert stderr.count("\n") == 1, stderr
    assert f"{package} 0.0.1 -> " in stderr
    assert json.loads((out / "run.json").read_text())["environment"][package] == "0.0.1"


def test_fingerprint_sees_the_bindings_not_only_the_function():
    model = bottleneck_model()
    binding = bottleneck_binding(model)
    same = symmetry_fingerprint(bottleneck_binding, [bottleneck_binding(model)])
    assert fingerprint_change(same, symmetry_fingerprint(bottleneck_binding, [binding])) is None
    assert "tests.bottleneck_symmetry" in same["modules"]
    other = [
        qs.QuotientBinding(BottleneckGL(), ["0.weight", "1.weight"], name="renamed"),
        qs.QuotientBinding(BottleneckGL(), ["1.weight", "0.weight"], name="bottleneck"),
        qs.QuotientBinding(qs.GLQuotient("mix"), ["0.weight", "1.weight"], name="bottleneck"),
    ]
    for changed in other:
        change = fingerprint_change(same, symmetry_fingerprint(bottleneck_binding, [changed]))
        assert change is not None and "bindings" in change
    mix = symmetry_fingerprint(bottleneck_binding, [qs.QuotientBinding(
        qs.GLQuotient("mix"), ["0.weight", "1.weight"])])
    inv = symmetry_fingerprint(bottleneck_binding, [qs.QuotientBinding(
        qs.GLQuotient("inv"), ["0.weight", "1.weight"])])
    assert mix["bindings"] != inv["bindings"]
    assert "predates" in str(fingerprint_change(None, same))


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_a_checkpoint_replaced_in_place_refuses_the_resume(study_files, monkeypatch, tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    for name in ("net0.pt", "net1.pt", "net2.pt", "data.pt", "models.csv"):
        (root / name).write_bytes((study_files / name).read_bytes())
    out = tmp_path / "out"
    calls = []
    original = measuring.measure_entry

    def stop_at_the_third(*args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(1)
        return original(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(measuring, "measure_entry", stop_at_the_third)
        assert _study(root, out)[0] == 130
    records = read_jsonl(out / "models.jsonl")
    assert len(records) == 2 and all(r["identity"]["model_sha256"] for r in records)
    torch.save(_mlp(7), root / "net0.pt")             # same path, other weights
    code, _, stderr = _study(root, out, "--resume")
    assert code == 2
    assert "record of 'net0.pt'" in stderr and "model " in stderr and "SHA-256" in stderr
    # an unchanged checkpoint resumes
    (root / "net0.pt").write_bytes((study_files / "net0.pt").read_bytes())
    code, stdout, stderr = _study(root, out, "--resume")
    assert code == 0, stderr
    assert "measured now: 1" in stdout


def _adaptive_study(study_files: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    return _call("study", study_files / "models.csv", "--data", study_files / "data.pt",
                 "--measure", "adaptive", "--rho", "0.1", "--n-iter", "2", "--no-progress",
                 "--bootstrap", "0", "--no-plots", "--out", out, *extra)


def test_a_resume_with_other_threads_refuses_naming_them(study_files, tmp_path):
    # torch's thread count orders its reductions: values differ in the last digits, and one
    # study would mix two arithmetics
    out = tmp_path / "out"
    code, _, stderr = _adaptive_study(study_files, out, "--threads", "1")
    assert code == 0, stderr
    records = (out / "models.jsonl").read_bytes()
    code, _, stderr = _adaptive_study(study_files, out, "--threads", "2", "--resume")
    assert code != 0 and "threads" in stderr and "--resume" in stderr, stderr
    assert (out / "models.jsonl").read_bytes() == records
    code, _, stderr = _adaptive_study(study_files, out, "--threads", "1", "--resume")
    assert code == 0, stderr


def test_the_settings_identify_a_tokenizer_folder_by_its_contents(study_files, tmp_path):
    from quotientsharp.workflows.grid import build_grid
    from quotientsharp.workflows.options import BatchSettings, StudyConfig
    from quotientsharp.workflows.runner import study_settings

    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    (tokenizer / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
    config = StudyConfig(data=study_files / "data.pt", measures=["adaptive"], rho=[0.1],
                         batches=BatchSettings(tokenizer=str(tokenizer)))
    grid = build_grid(config)
    before = study_settings(config, grid)
    assert study_settings(config, grid) == before
    (tokenizer / "vocab.txt").write_text("[PAD]\n[UNK]\nworld\n")     # edited in place
    after = study_settings(config, grid)
    assert after["tokenizer"] == before["tokenizer"]
    assert after["tokenizer_sha256"] != before["tokenizer_sha256"]
    untouched = StudyConfig(data=study_files / "data.pt", measures=["adaptive"], rho=[0.1])
    assert "tokenizer_sha256" not in study_settings(untouched, build_grid(untouched))
