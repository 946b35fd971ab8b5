"""``quotientsharp reproduce vit | bert | invariance``: quick variants end to end, and resume.

Each quick variant runs once through ``quotientsharp.cli.main`` (module-scoped fixtures); the
tests then check the files it wrote against independent recomputations (Kendall tau from the
CSV by scipy and by brute force, the task's labelling rule, the function-preserving
reparametrisation), and that ``--resume`` recomputes nothing, or exactly the missing record.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")
scipy_stats = pytest.importorskip("scipy.stats")

from quotientsharp.cli import main  # noqa: E402
from quotientsharp.reproduce import STUDIES, load_study  # noqa: E402
from quotientsharp.reproduce.families import bert as bert_study  # noqa: E402
from quotientsharp.reproduce.families import run as family_run  # noqa: E402
from quotientsharp.reproduce.families import vit as vit_study  # noqa: E402
from quotientsharp.reproduce.families.data import sharpness_batches  # noqa: E402
from quotientsharp.reproduce.families.run import family_study  # noqa: E402
from quotientsharp.reproduce.families.training import draw_hyperparameters  # noqa: E402
from quotientsharp.reproduce.invariance import study as invariance_study  # noqa: E402
from tests.pages.docs_folder import docs_with_renderer  # noqa: E402

MEASURE_KEYS = ("adaptive", "worst_case", "geodesic_inv_o1", "geodesic_inv_o2",
                "geodesic_mix_o1", "geodesic_mix_o2", "relative_flatness")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as stream:
        return list(csv.DictReader(stream))


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _brute_tau_a(x: list[float], y: list[float]) -> float:
    total = 0.0
    for i in range(len(x)):
        for j in range(len(x)):
            if i != j:
                total += math.copysign(1, x[i] - x[j]) * math.copysign(1, y[i] - y[j]) \
                    if x[i] != x[j] and y[i] != y[j] else 0.0
    return total / (len(x) * (len(x) - 1))


def _run_quick(study: str, tmp: Path, *extra: str) -> int:
    return main(["reproduce", study, "--quick", "--out", str(tmp / study), "--docs",
                 str(docs_with_renderer(tmp / "docs")), "--no-progress", *extra])


@pytest.fixture(scope="module")
def family_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("families")
    codes = {study: _run_quick(study, tmp) for study in ("vit", "bert")}
    return tmp, codes


@pytest.fixture(scope="module")
def invariance_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("invariance")
    # float64 only: the float32 and bfloat16 runs are tests/test_invariance_study.py's
    return tmp, _run_quick("invariance", tmp, "--dtypes", "float64")


def test_registry_has_the_three_studies():
    for name in ("vit", "bert", "invariance"):
        module = load_study(name)
        assert STUDIES[name] == module.__name__
        assert callable(module.run) and module.HELP


@pytest.mark.study
@pytest.mark.parametrize("study", ["vit", "bert"])
def test_family_quick_outputs(family_runs, study):
    tmp, codes = family_runs
    assert codes[study] == 0
    out = tmp / study
    module = {"vit": vit_study, "bert": bert_study}[study]
    rows = _read_csv(out / "models.csv")
    records = _read_jsonl(out / "models.jsonl")
    assert [int(r["index"]) for r in rows] == list(range(module.QUICK.models))
    assert [r["index"] for r in records] == list(range(module.QUICK.models))
    for row, record in zip(rows, records, strict=True):
        assert row["diverged"] == "False"
        for key in ("train_error", "test_error", "gap", *MEASURE_KEYS):
            assert math.isfinite(float(row[key])), (key, row[key])
            assert float(row[key]) == pytest.approx(record[key], rel=1e-12)
        assert float(row["gap"]) == pytest.approx(
            float(row["test_error"]) - float(row["train_error"]), abs=1e-12)
        # every ascent measure starts at xi = 0 and keeps the best loss: never negative
        for key in MEASURE_KEYS[:-1]:
            assert record[key] >= 0.0
            assert len(record[f"{key}_per_batch"]) == (module.QUICK.sharpness_points
                                                       // module.QUICK.sharpness_batch_size)
        hyper = draw_hyperparameters(module.QUICK.space, 0, record["index"])
        assert record["learning_rate"] == hyper.learning_rate
        assert record["train_size"] == hyper.train_size

    taus = json.loads((out / "taus.json").read_text())
    gaps = [float(r["gap"]) for r in rows]
    assert [t["key"] for t in taus] == list(MEASURE_KEYS)
    for tau in taus:
        values = [float(r[tau["key"]]) for r in rows]
        assert tau["tau_a"] == pytest.approx(_brute_tau_a(gaps, values), abs=1e-12)
        if len(set(values)) > 1 and len(set(gaps)) > 1:
            assert tau["tau_b"] == pytest.approx(
                scipy_stats.kendalltau(gaps, values).statistic, abs=1e-12)
    paper = {t["key"]: t["paper"] for t in taus}
    assert paper["adaptive"] == module.PAPER["adaptive"]
    assert paper["geodesic_mix_o2"] == module.PAPER["geodesic_mix"]

    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "finished" and run["study"] == study
    assert run["settings"]["seed"] == 0 and run["settings"]["quick"] is True
    assert run["settings"]["hyperparameter_space"]["learning_rate"] == list(
        module.QUICK.space.learning_rate)
    assert {"torch", "python", "numpy"} <= set(run["environment"])
    for key in MEASURE_KEYS:
        assert (out / f"scatter_{key}.png").read_bytes()[:8] == PNG_MAGIC
    section = (tmp / "docs" / "results" / f"{study}.md").read_text()
    assert f"quotientsharp reproduce {study} --quick" in section
    page = (tmp / "docs" / "results.md").read_text()
    assert section.splitlines()[0] in page


@pytest.mark.study
def test_family_resume_recomputes_nothing(family_runs, monkeypatch):
    tmp, codes = family_runs
    assert codes["vit"] == 0
    out = tmp / "vit"
    before = (out / "models.csv").read_text()

    def refuse(*args, **kwargs):
        raise AssertionError("a finished model was trained again on --resume")

    # patched where family_study's per-model step looks them up
    monkeypatch.setattr(family_run, "train_classifier", refuse)
    monkeypatch.setattr(family_run, "measure_model", refuse)
    outcome = family_study(vit_study.STUDY, out, quick=True, resume=True, plots=False)
    assert outcome.computed_now == []
    assert (out / "models.csv").read_text() == before
    assert json.loads((out / "run.json").read_text())["resumed"] == 1


@pytest.mark.study
def test_family_resume_recomputes_exactly_the_missing_model(family_runs):
    tmp, codes = family_runs
    assert codes["bert"] == 0
    out = tmp / "bert"
    lines = (out / "models.jsonl").read_text().splitlines(keepends=True)
    dropped = json.loads(lines[-1])
    # an interrupted run: the last record was never written, its half line is torn
    (out / "models.jsonl").write_text("".join(lines[:-1]) + lines[-1][:40])
    outcome = family_study(bert_study.STUDY, out, quick=True, resume=True, plots=False)
    assert outcome.computed_now == [dropped["index"]]
    again = outcome.records[-1]
    # same (seed, index): same hyperparameters, initialisation and data order, same numbers
    for key in ("train_error", "test_error", *MEASURE_KEYS):
        assert again[key] == pytest.approx(dropped[key], rel=1e-6, abs=1e-9), key
    assert len(_read_csv(out / "models.csv")) == bert_study.QUICK.models


@pytest.mark.study
def test_resume_refuses_other_settings(family_runs):
    tmp, _ = family_runs
    with pytest.raises(ValueError, match="settings differ"):
        family_study(vit_study.STUDY, tmp / "vit", quick=True, resume=True, seed=1)
    code = main(["reproduce", "vit", "--quick", "--out", str(tmp / "vit"), "--resume",
                 "--models", "0", "--no-progress"])
    assert code == 2


def test_hyperparameters_depend_on_seed_and_index_only():
    space = vit_study.FULL.space
    first = [draw_hyperparameters(space, 3, i) for i in range(40)]
    assert first == [draw_hyperparameters(space, 3, i) for i in range(40)]
    assert first != [draw_hyperparameters(space, 4, i) for i in range(40)]
    for hyper in first:
        assert space.learning_rate[0] <= hyper.learning_rate <= space.learning_rate[1]
        assert space.weight_decay[0] <= hyper.weight_decay <= space.weight_decay[1]
        assert space.epochs[0] <= hyper.epochs <= space.epochs[1]
        assert space.train_size[0] <= hyper.train_size <= space.train_size[1]
        assert space.label_smoothing[0] <= hyper.label_smoothing <= space.label_smoothing[1]
    assert len({h.init_seed for h in first}) == len(first)


def test_bert_task_follows_its_rule():
    generator = torch.Generator().manual_seed(5)
    ids, labels, clean = bert_study.generate_sequences(20000, generator)
    assert ids.shape == (20000, bert_study.SEQUENCE_LENGTH)
    assert bool((ids[:, 0] == bert_study.CLS).all())
    assert bool(((ids == bert_study.TOKEN_A).sum(1) == 1).all())
    assert bool(((ids == bert_study.TOKEN_B).sum(1) == 1).all())
    assert bool((ids[:, 1:] >= bert_study.TOKEN_A).all())
    position_a = (ids == bert_study.TOKEN_A).float().argmax(1)
    position_b = (ids == bert_study.TOKEN_B).float().argmax(1)
    assert torch.equal(clean, (position_a < position_b).long())
    flipped = float((labels != clean).double().mean())
    # binomial(20000, 0.1): standard deviation 0.0021, five of them
    assert abs(flipped - bert_study.LABEL_NOISE) < 0.011
    assert abs(float(clean.double().mean()) - 0.5) < 0.02


def test_sharpness_points_lie_in_every_training_set():
    data = vit_study.load_data()
    batches = sharpness_batches(data, vit_study.FULL.sharpness_points,
                                       vit_study.FULL.sharpness_batch_size)
    assert len(batches) == 4
    assert vit_study.FULL.space.train_size[0] >= vit_study.FULL.sharpness_points
    assert torch.equal(batches[1]["pixel_values"], data.train_inputs["pixel_values"][64:128])
    with pytest.raises(ValueError, match="multiple"):
        sharpness_batches(data, 100, 64)


@pytest.mark.study
@pytest.mark.slow
def test_invariance_quick_outputs_and_resume(invariance_run, monkeypatch):
    tmp, code = invariance_run
    assert code == 0
    top = tmp / "invariance"
    out = top / "float64"            # each precision's run in its own folder
    rows = _read_csv(out / "invariance.csv")
    assert [int(r["point"]) for r in rows] == [-1, 0, 1, 2]
    combined = _read_csv(top / "invariance.csv")
    assert [(r["dtype"], int(r["point"])) for r in combined] == [
        ("float64", p) for p in (-1, 0, 1, 2)]
    grid = [float(r["a"]) for r in rows[1:]]
    assert grid == pytest.approx([1e-2, 1.0, 1e2], rel=1e-12)
    original = rows[0]
    for row in rows[1:]:
        # the reparametrisation keeps the function (float64)
        assert float(row["max_logit_change"]) < 1e-9
        for key in ("adaptive", "geodesic_inv_o2", "geodesic_mix_o2"):
            assert float(row[f"change_{key}"]) == pytest.approx(
                float(row[key]) / float(original[key]) - 1.0, rel=1e-9, abs=1e-15)
        assert float(row["change_geodesic_inv_o2"]) == pytest.approx(0.0, abs=1e-6)
        assert float(row["change_geodesic_mix_o2"]) == pytest.approx(0.0, abs=1e-6)
    assert (top / "invariance.png").read_bytes()[:8] == PNG_MAGIC
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "finished" and run["settings"]["grid"] == grid
    assert "Invariance" in (tmp / "docs" / "results.md").read_text()

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded again on --resume")

    monkeypatch.setattr(invariance_study, "load_minilm", refuse)
    before = (out / "invariance.csv").read_text()
    outcome = invariance_study.invariance_study(top, quick=True, resume=True, plots=False,
                                                dtypes="float64")
    assert outcome.computed_now == {"float64": []}
    assert (out / "invariance.csv").read_text() == before
