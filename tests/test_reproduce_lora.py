"""``quotientsharp reproduce lora``: LoRA fine-tunes of MiniLM, through the family driver.

The quick variant runs once through ``quotientsharp.cli.main`` (the code path of the real
study, on a tiny random BERT); the tests check the files against independent recomputations
(Kendall tau by brute force and scipy, the drawn ranks redrawn by hand), the page's structure,
and that only the adapters and the head train.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("matplotlib")
scipy_stats = pytest.importorskip("scipy.stats")

from results_pages.sections import SECTION_ORDER  # noqa: E402

from quotientsharp.cli import main  # noqa: E402
from quotientsharp.models import find_symmetries  # noqa: E402
from quotientsharp.reproduce import STUDIES, load_study  # noqa: E402
from quotientsharp.reproduce.families import lora as lora_study  # noqa: E402
from quotientsharp.reproduce.families import minilm  # noqa: E402
from quotientsharp.reproduce.families.run import family_study  # noqa: E402
from quotientsharp.reproduce.families.training import (  # noqa: E402
    Hyperparameters,
    HyperparameterSpace,
    draw_hyperparameters,
)
from tests.pages.docs_folder import docs_with_renderer  # noqa: E402

HYPERPARAMETERS = ("learning_rate", "weight_decay", "epochs", "label_smoothing", "train_size",
                   "batch_size", "warmup_fraction", "rank")


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as stream:
        return list(csv.DictReader(stream))


def _brute_tau_a(x: list[float], y: list[float]) -> float:
    total = sum(np.sign(x[i] - x[j]) * np.sign(y[i] - y[j])
                for i in range(len(x)) for j in range(len(x)) if i != j)
    return float(total) / (len(x) * (len(x) - 1))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora")
    code = main(["reproduce", "lora", "--quick", "--out", str(tmp / "lora"), "--docs",
                 str(docs_with_renderer(tmp / "docs")), "--no-progress", "--no-plots"])
    return tmp, code


def test_registered_like_the_other_studies():
    assert STUDIES["lora"] == lora_study.__name__ == load_study("lora").__name__
    assert SECTION_ORDER.index("minilm") < SECTION_ORDER.index("lora")


@pytest.mark.study
def test_quick_outputs(run):
    tmp, code = run
    assert code == 0
    out = tmp / "lora"
    rows = _read_csv(out / "models.csv")
    assert [int(r["index"]) for r in rows] == list(range(lora_study.QUICK.models))
    for row in rows:
        hyper = draw_hyperparameters(lora_study.QUICK.space, 0, int(row["index"]))
        assert int(row["rank"]) == hyper.rank in lora_study.QUICK.space.rank
        for key in lora_study.MEASURE_KEYS:
            assert math.isfinite(float(row[key])) and float(row[key]) >= 0.0, (key, row[key])
    gaps = [float(r["gap"]) for r in rows]
    taus = json.loads((out / "taus.json").read_text())
    assert [t["key"] for t in taus] == list(lora_study.MEASURE_KEYS)
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
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert settings["pretrained"]["adapters"]["target_modules"] == list(
        lora_study.TARGET_MODULES)
    assert settings["hyperparameter_space"]["rank"] == list(lora_study.QUICK.space.rank)


@pytest.mark.pages
@pytest.mark.study
def test_page_structure(run):
    tmp, code = run
    assert code == 0
    section = (tmp / "docs" / "results" / "lora.md").read_text()
    lines = section.splitlines()
    assert lines[0] == f"## {lora_study.STUDY.title}"
    assert "`quotientsharp reproduce lora --quick --docs docs`" in section
    assert "GL(r) pair (B, A^T)" in section and "attention heads in the GL(h)" not in section
    assert "adapter rank uniform among [1, 2]" in section
    tables = [line for line in lines if line.startswith("| ")]
    measures = [line.split(" | ")[0][2:] for line in tables]
    for label in ("adaptive (rho 0.1)", "geodesic inv (order 2) (rho 0.1)",
                  "geodesic mix (order 2) (rho 0.1)"):
        assert label in measures
    assert "relative flatness" not in measures     # not a measure of this study
    assert "rank" in measures                      # the confound row of the drawn rank
    taus = json.loads((tmp / "lora" / "taus.json").read_text())
    for row in taus:
        # each measure's row carries its tau-a with the interval of taus.json
        low, high = row["tau_a_interval"]
        cell = f"{row['tau_a']:+.2f} [{low:+.2f}, {high:+.2f}]"
        assert any(line.startswith(f"| {row['measure']} (rho ") and cell in line
                   for line in tables), row["key"]
    page = (tmp / "docs" / "results.md").read_text()
    assert section.strip() in page


def test_only_adapters_and_head_train():
    start = minilm.load_pretrained(None, quick=True)
    hyper = draw_hyperparameters(lora_study.QUICK.space, 0, 0)
    torch.manual_seed(hyper.init_seed)
    model = lora_study.add_adapters(lora_study.STUDY.build_model(2, start), hyper)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or ".modules_to_save." in n for n in trainable)
    assert sum("lora_A" in n for n in trainable) == 2 * start["config"]["num_hidden_layers"]
    with pytest.warns(UserWarning, match="degenerate"):
        report = find_symmetries(model)
    # fresh adapters (B = 0): every one found with the drawn rank, none a point of the quotient
    assert len(report.adapters) == 2 * start["config"]["num_hidden_layers"]
    assert {a.r for a in report.adapters} == {hyper.rank}
    assert {a.status for a in report.adapters} == {"degenerate"}


def test_adapters_need_a_rank():
    hyper = Hyperparameters(1e-3, 1e-3, 1, 0.0, 16, 0)
    with pytest.raises(ValueError, match="rank"):
        lora_study.add_adapters(torch.nn.Linear(2, 2), hyper)
    with pytest.raises(ValueError, match="rank"):
        HyperparameterSpace((1e-4, 1e-2), (1e-4, 1e-1), (1, 2), (0.0, 0.1), (10, 20), rank=(0,))


def test_rank_is_drawn_last():
    common = ((1e-4, 1e-2), (1e-4, 1e-1), (1, 4), (0.0, 0.1), (10, 99))
    plain = HyperparameterSpace(*common, batch_size=(8, 16), warmup=(0.0, 0.2))
    ranked = HyperparameterSpace(*common, batch_size=(8, 16), warmup=(0.0, 0.2), rank=(1, 4, 8))
    for index in range(5):
        a, b = draw_hyperparameters(plain, 2, index), draw_hyperparameters(ranked, 2, index)
        assert a.rank is None and "rank" not in a.as_dict()
        assert a.as_dict() == {k: v for k, v in b.as_dict().items() if k != "rank"}
        # by hand: the five ranges, the seed, the batch choice, the warm-up, then the rank
        rng = np.random.default_rng([2, index])
        rng.uniform(), rng.uniform(), rng.integers(1, 4, endpoint=True), rng.uniform()
        rng.integers(10, 99, endpoint=True), rng.integers(0, 2**31 - 1), rng.integers(2)
        rng.uniform(0.0, 0.2)
        assert b.rank == (1, 4, 8)[int(rng.integers(3))]


def test_unknown_measure_keys_are_refused(tmp_path):
    from dataclasses import replace

    study = replace(lora_study.STUDY, measure_keys=("adaptive", "no_such_measure"))
    with pytest.raises(ValueError, match="no_such_measure"):
        family_study(study, tmp_path / "out", quick=True, progress=False, plots=False)
