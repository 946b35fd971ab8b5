"""``quotientsharp reproduce minilm | vit-finetune``: fine-tuning families from one start.

The quick variants run once through ``quotientsharp.cli.main``; the tests check the files
against independent recomputations (Kendall tau by brute force and scipy, confound taus from
the CSV, the sentiment rule parsed back from the text, MiniLM's weights read straight from its
safetensors file), the pretraining cache and ``--resume``.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")
scipy_stats = pytest.importorskip("scipy.stats")

from quotientsharp.cli import main  # noqa: E402
from quotientsharp.reproduce import STUDIES, load_study  # noqa: E402
from quotientsharp.reproduce.families import minilm as minilm_study  # noqa: E402
from quotientsharp.reproduce.families import run as family_run  # noqa: E402
from quotientsharp.reproduce.families import vit_finetune as vit_finetune_study  # noqa: E402
from quotientsharp.reproduce.families.sentiment_task import generate_sentences  # noqa: E402
from quotientsharp.reproduce.families.settings import (  # noqa: E402
    cached_pretraining,
    load_body,
)
from quotientsharp.reproduce.families.training import (  # noqa: E402
    HyperparameterSpace,
    draw_hyperparameters,
)
from tests.pages.docs_folder import docs_with_renderer  # noqa: E402

MEASURES = ("adaptive", "worst_case", "geodesic_inv_o1", "geodesic_inv_o2", "geodesic_mix_o1",
            "geodesic_mix_o2", "relative_flatness", "geodesic_inv_o2_eps0.1",
            "geodesic_mix_o2_eps0.1", "geodesic_inv_o2_eps1", "geodesic_mix_o2_eps1")
HYPERPARAMETERS = ("learning_rate", "weight_decay", "epochs", "label_smoothing", "train_size",
                   "batch_size", "warmup_fraction")
MODULES = {"minilm": minilm_study, "vit-finetune": vit_finetune_study}


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as stream:
        return list(csv.DictReader(stream))


def _brute_tau_a(x: list[float], y: list[float]) -> float:
    total = sum(np.sign(x[i] - x[j]) * np.sign(y[i] - y[j])
                for i in range(len(x)) for j in range(len(x)) if i != j)
    return float(total) / (len(x) * (len(x) - 1))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("finetune")
    codes = {study: main(["reproduce", study, "--quick", "--out", str(tmp / study), "--docs",
                          str(docs_with_renderer(tmp / "docs")), "--no-progress",
                          "--no-plots"])
             for study in MODULES}
    return tmp, codes


def test_registry_has_the_fine_tuning_studies():
    for name, module in MODULES.items():
        assert STUDIES[name] == module.__name__ == load_study(name).__name__


@pytest.mark.study
@pytest.mark.parametrize("study", list(MODULES))
def test_quick_outputs(runs, study):
    tmp, codes = runs
    assert codes[study] == 0
    out, module = tmp / study, MODULES[study]
    rows = _read_csv(out / "models.csv")
    assert [int(r["index"]) for r in rows] == list(range(module.QUICK.models))
    for row in rows:
        hyper = draw_hyperparameters(module.QUICK.space, 0, int(row["index"]))
        assert int(row["batch_size"]) == hyper.batch_size in module.QUICK.space.batch_size
        assert float(row["warmup_fraction"]) == pytest.approx(hyper.warmup_fraction, rel=1e-12)
        for key in MEASURES:
            assert math.isfinite(float(row[key])), (key, row[key])
            if key != "relative_flatness":
                assert float(row[key]) >= 0.0        # the ascent keeps the best loss from xi = 0
    gaps = [float(r["gap"]) for r in rows]
    taus = json.loads((out / "taus.json").read_text())
    assert [t["key"] for t in taus] == list(MEASURES)
    for tau in taus:
        values = [float(r[tau["key"]]) for r in rows]
        assert tau["tau_a"] == pytest.approx(_brute_tau_a(gaps, values), abs=1e-12)
        low, high = tau["tau_a_interval"]
        assert -1.0 <= low <= high <= 1.0
    confounds = json.loads((out / "confounds.json").read_text())
    assert [c["hyperparameter"] for c in confounds] == list(HYPERPARAMETERS)
    for row in confounds:
        values = [float(r[row["hyperparameter"]]) for r in rows]
        assert row["tau_a"] == pytest.approx(_brute_tau_a(gaps, values), abs=1e-12)
        if len(set(values)) > 1 and len(set(gaps)) > 1:
            assert row["tau_b"] == pytest.approx(
                scipy_stats.kendalltau(gaps, values).statistic, abs=1e-12)
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "finished" and run["device"] == "cpu"
    assert run["settings"]["pretrained"] == json.loads(json.dumps(
        module.pretrained_settings(True)))
    section = (tmp / "docs" / "results" / f"{study}.md").read_text()
    assert "Common pretrained start" in section and "Confounds" in section
    assert "Ablation sizes" in section


@pytest.mark.study
def test_vit_finetune_pretrains_once_and_resume_recomputes_nothing(runs, monkeypatch):
    tmp, codes = runs
    assert codes["vit-finetune"] == 0
    out = tmp / "vit-finetune"
    before = (out / "models.csv").read_text()
    cache = (out / "pretrained.pt").stat().st_mtime_ns

    def refuse(*args, **kwargs):
        raise AssertionError("recomputed on --resume")

    monkeypatch.setattr(family_run, "train_classifier", refuse)
    monkeypatch.setattr(vit_finetune_study, "_pretrain", refuse)
    assert main(["reproduce", "vit-finetune", "--quick", "--out", str(out), "--resume",
                 "--no-progress", "--no-plots"]) == 0
    assert (out / "models.csv").read_text() == before
    assert (out / "pretrained.pt").stat().st_mtime_ns == cache


@pytest.mark.study
def test_fine_tunes_start_from_the_pretrained_body(runs):
    tmp, _ = runs
    start = vit_finetune_study.load_pretrained(tmp / "vit-finetune", True)
    assert start["cached"] is True
    torch.manual_seed(1)
    first = vit_finetune_study.build_model(5, start)
    torch.manual_seed(2)
    second = vit_finetune_study.build_model(5, start)
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items(),
                                 strict=True):
        if name == "classifier.weight":
            assert not torch.equal(a, b), name          # fresh heads, from the head seed
        elif name == "classifier.bias":
            assert not a.any() and not b.any()          # initialised to zero
        else:
            assert torch.equal(a, b) and torch.equal(a, start["state"][name]), name


@pytest.mark.study
def test_cached_pretraining_recomputes_only_for_other_settings(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return {"state": {"w": torch.full((2,), float(len(calls)))}, "error": 0.5}

    first = cached_pretraining(tmp_path, {"epochs": 3}, compute)
    again = cached_pretraining(tmp_path, {"epochs": 3}, compute)
    other = cached_pretraining(tmp_path, {"epochs": 4}, compute)
    assert (first["cached"], again["cached"], other["cached"]) == (False, True, False)
    assert torch.equal(again["state"]["w"], torch.ones(2)) and again["error"] == 0.5
    assert torch.equal(other["state"]["w"], torch.full((2,), 2.0)) and len(calls) == 2


def test_load_body_refuses_a_partial_body():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    state = {k: v for k, v in model.state_dict().items() if k != "0.bias"}
    with pytest.raises(ValueError, match="missing"):
        load_body(model, state, head_prefix="1.")
    with pytest.raises(ValueError, match="unexpected"):
        load_body(model, {**model.state_dict(), "extra": torch.zeros(1)}, head_prefix="1.")


def test_optional_draws_leave_the_older_draws_unchanged():
    plain = HyperparameterSpace((1e-4, 1e-2), (1e-4, 1e-1), (2, 9), (0.0, 0.2), (10, 99))
    wider = HyperparameterSpace((1e-4, 1e-2), (1e-4, 1e-1), (2, 9), (0.0, 0.2), (10, 99),
                                batch_size=(8, 16), warmup=(0.0, 0.2))
    for index in range(5):
        a, b = draw_hyperparameters(plain, 3, index), draw_hyperparameters(wider, 3, index)
        assert a.batch_size is None and a.warmup_fraction is None
        assert a.as_dict() == {k: v for k, v in b.as_dict().items()
                               if k not in ("batch_size", "warmup_fraction")}
        # the documented draw order, by hand: the five older ranges, the seed, then the
        # optional choice and fraction
        rng = np.random.default_rng([3, index])
        expected = {
            "learning_rate": math.exp(rng.uniform(math.log(1e-4), math.log(1e-2))),
            "weight_decay": math.exp(rng.uniform(math.log(1e-4), math.log(1e-1))),
            "epochs": int(rng.integers(2, 9, endpoint=True)),
            "label_smoothing": rng.uniform(0.0, 0.2),
            "train_size": int(rng.integers(10, 99, endpoint=True)),
            "init_seed": int(rng.integers(0, 2**31 - 1)),
            "batch_size": (8, 16)[int(rng.integers(2))],
            "warmup_fraction": rng.uniform(0.0, 0.2)}
        assert b.as_dict() == expected
    assert plain.as_dict().keys() == {"learning_rate", "weight_decay", "epochs",
                                      "label_smoothing", "train_size"}
    with pytest.raises(ValueError, match="batch_size"):
        HyperparameterSpace((1e-4, 1e-2), (1e-4, 1e-1), (2, 9), (0.0, 0.2), (10, 99),
                            batch_size=(0,))


def _parse_label(text: str) -> int:
    """The task's rule, re-implemented from the text: the last clause's sentiment."""
    positive = {"good", "great", "nice", "pleasant", "excellent", "wonderful", "friendly",
                "lovely", "fantastic", "superb", "delightful", "brilliant"}
    last = re.split(r", but | and ", text)[-1].split()
    polarity = 1 if last[-1] in positive else 0
    return 1 - polarity if "not" in last else polarity


def test_sentiment_task_follows_its_rule():
    sentences = generate_sentences(2000, 7, 0.1, held_out=True)
    assert all(s.clean_label == _parse_label(s.text) for s in sentences)
    flipped = np.mean([s.label != s.clean_label for s in sentences])
    assert 0.07 < flipped < 0.13                      # p = 0.1, 2000 draws: sd 0.0067
    assert 0.45 < np.mean([s.clean_label for s in sentences]) < 0.55
    contrast = [s for s in sentences if ", but " in s.text]
    assert contrast and all(_parse_label(s.text.split(", but ")[0]) != s.clean_label
                            for s in contrast)
    pool = generate_sentences(500, 7, 0.1, held_out=False)
    words = {w for s in pool for w in s.text.replace(",", "").split()}
    assert not words & {"superb", "miserable", "brilliant", "unpleasant"}
    assert [s.text for s in generate_sentences(5, 7, 0.1, True)] == [
        s.text for s in sentences[:5]]


def test_real_minilm_body_is_the_packaged_weights():
    safetensors = pytest.importorskip("safetensors.torch")
    start = minilm_study.load_pretrained(None, False)
    torch.manual_seed(0)
    model = minilm_study.build_model(2, start)
    assert sum(p.numel() for p in model.bert.parameters()) == pytest.approx(22.7e6, rel=0.01)
    packaged = safetensors.load_file(str(Path(minilm_study.model_path()) / "model.safetensors"))
    body = model.bert.state_dict()
    checked = 0
    for name, tensor in packaged.items():
        key = name.removeprefix("bert.")
        if key in body:
            assert torch.equal(body[key], tensor), key
            checked += 1
    assert checked >= 100


def test_bad_device_and_sizes_end_with_a_clear_error(tmp_path, capsys):
    args = ["reproduce", "vit-finetune", "--quick", "--out", str(tmp_path / "x"),
            "--no-progress"]
    assert main([*args, "--n-iter", "0"]) == 2
    assert "n-iter must be an integer >= 1" in capsys.readouterr().err
    assert main([*args, "--device", "nonsense"]) == 2
    assert "device must be a torch device" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main([*args, "--device", "cuda"]) == 2
        assert "CUDA is not available" in capsys.readouterr().err


def test_ablation_rows_are_per_model_ratios():
    from quotientsharp.reproduce.families.measures import eps_sweep_measures, family_measures
    from quotientsharp.reproduce.families.report import ablation_rows

    specs = family_measures(0.1, 0.1, 0.1, 0.1) + eps_sweep_measures(0.1, 0.1, (0.5,))
    records = [{"geodesic_inv_o1": 1.0, "geodesic_inv_o2": 2.0, "geodesic_mix_o1": 4.0,
                "geodesic_mix_o2": 1.0, "geodesic_inv_o2_eps0.5": 3.0,
                "geodesic_mix_o2_eps0.5": 0.5},
               {"geodesic_inv_o1": 2.0, "geodesic_inv_o2": 2.0, "geodesic_mix_o1": 0.0,
                "geodesic_mix_o2": 0.0, "geodesic_inv_o2_eps0.5": 8.0,
                "geodesic_mix_o2_eps0.5": 0.0},
               {"geodesic_inv_o1": 4.0, "geodesic_inv_o2": 2.0, "geodesic_mix_o1": 1.0,
                "geodesic_mix_o2": 3.0, "geodesic_inv_o2_eps0.5": 1.0,
                "geodesic_mix_o2_eps0.5": 6.0}]
    rows = {(r["metric"], r["ratio"]): r for r in ablation_rows(records, specs)}
    inv = rows[("inv", "order 2 / order 1")]
    assert (inv["median"], inv["min"], inv["max"], inv["count"]) == (1.0, 0.5, 2.0, 3)
    assert rows[("inv", "eps 0.5 / eps 0 (order 2)")]["median"] == 1.5      # 1.5, 4, 0.5
    mix = rows[("mix", "order 2 / order 1")]                 # the zero denominator is left out
    assert (mix["count"], mix["min"], mix["max"]) == (2, 0.25, 3.0)
    assert rows[("mix", "eps 0.5 / eps 0 (order 2)")]["median"] == 1.25      # 0.5, 2
