"""``quotientsharp reproduce bert|vit-finetune --study-seeds S``: a family replicated over study
seeds at quick size, through the same command and runner as the full study.

The tests check the records (each carries its study seed; its hyperparameters are the draws of
``(study seed, index)``; each seed has its own pool order), the statistics against independent
recomputations (scipy's tau-b per seed, the pooled tau as their mean, the paired differences
as differences of the pooled taus), the page's structure (per-seed columns, pooled column,
paired differences with Holm), the headline file, and that ``--resume`` recomputes nothing.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")
scipy_stats = pytest.importorskip("scipy.stats")

from quotientsharp.cli import main  # noqa: E402
from quotientsharp.reproduce.families import bert as bert_study  # noqa: E402
from quotientsharp.reproduce.families import run as family_run  # noqa: E402
from quotientsharp.reproduce.families.data import shuffled_pool  # noqa: E402
from quotientsharp.reproduce.families.training import draw_hyperparameters  # noqa: E402
from tests.pages.docs_folder import docs_with_renderer  # noqa: E402

SEEDS, MODELS = 2, 4
HEADLINE = ("adaptive", "geodesic_inv", "geodesic_mix")
PAIRS = {"inv - adaptive": ("geodesic_inv_o2", "adaptive"),
         "mix - inv": ("geodesic_mix_o2", "geodesic_inv_o2"),
         "mix - adaptive": ("geodesic_mix_o2", "adaptive")}


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def seeded_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("seeds")
    code = main(["reproduce", "bert", "--quick", "--study-seeds", str(SEEDS), "--models",
                 str(MODELS), "--seed", "3", "--out", str(tmp / "bert"), "--docs",
                 str(docs_with_renderer(tmp / "docs")), "--no-progress", "--no-plots"])
    return tmp, code


@pytest.mark.study
def test_records_carry_their_seed_and_its_draws(seeded_run):
    tmp, code = seeded_run
    assert code == 0
    records = _read_jsonl(tmp / "bert" / "models.jsonl")
    assert sorted(r["unit"] for r in records) == list(range(SEEDS * MODELS))
    for record in records:
        seed, index = 3 + record["unit"] // MODELS, record["unit"] % MODELS
        assert (record["study_seed"], record["index"]) == (seed, index)
        drawn = draw_hyperparameters(bert_study.QUICK.space, seed, index).as_dict()
        assert {key: record[key] for key in drawn} == drawn
    with (tmp / "bert" / "models.csv").open(newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert [int(r["study_seed"]) for r in rows] == [r["study_seed"] for r in records]
    settings = json.loads((tmp / "bert" / "run.json").read_text())["settings"]
    assert settings["study_seeds"] == [3, 4]


def test_each_seed_draws_its_own_pool_order():
    data = bert_study.load_data(quick=True)
    first, second = shuffled_pool(data, 3), shuffled_pool(data, 4)
    # a permutation of the pool: the same sequences with their labels, in another order
    for shuffled in (first, second):
        pairs = {(tuple(ids.tolist()), int(label)) for ids, label in
                 zip(shuffled.train_inputs["input_ids"], shuffled.train_labels, strict=True)}
        assert pairs == {(tuple(ids.tolist()), int(label)) for ids, label in
                         zip(data.train_inputs["input_ids"], data.train_labels, strict=True)}
        assert torch.equal(shuffled.test_labels, data.test_labels)
    assert not torch.equal(first.train_inputs["input_ids"][:64],
                           second.train_inputs["input_ids"][:64])


@pytest.mark.study
def test_statistics_against_independent_recomputations(seeded_run):
    tmp, _ = seeded_run
    records = [r for r in _read_jsonl(tmp / "bert" / "models.jsonl") if not r["diverged"]]
    stats = json.loads((tmp / "bert" / "seeds.json").read_text())
    assert stats["seeds"] == [3, 4]
    pooled = {row["key"]: row for row in stats["pooled"]}
    for key in ("adaptive", "geodesic_inv_o2", "geodesic_mix_o2", "worst_case"):
        per_seed = []
        for block in stats["per_seed"]:
            mine = [r for r in records if r["study_seed"] == block["study_seed"]]
            want = scipy_stats.kendalltau([r["gap"] for r in mine], [r[key] for r in mine],
                                          variant="b").statistic
            got = next(row["tau_b"] for row in block["taus"] if row["key"] == key)
            assert got == pytest.approx(want, abs=1e-12)
            per_seed.append(want)
        assert pooled[key]["tau_b"] == pytest.approx(np.mean(per_seed), abs=1e-12)
        low, high = pooled[key]["tau_b_interval"]
        assert -1.0 <= low <= high <= 1.0
    differences = {row["label"]: row for row in stats["differences"]}
    assert set(differences) == set(PAIRS)
    for label, (first, second) in PAIRS.items():
        row = differences[label]
        assert row["difference"] == pytest.approx(pooled[first]["tau_b"]
                                                  - pooled[second]["tau_b"], abs=1e-12)
        assert row["p_value"] <= row["p_holm"] <= 1.0
        assert row["significant"] == (row["p_holm"] < 0.05)


@pytest.mark.pages
@pytest.mark.study
def test_page_shows_seeds_pooled_taus_and_paired_differences(seeded_run):
    tmp, _ = seeded_run
    page = (tmp / "docs" / "results" / "bert.md").read_text()
    assert "--study-seeds 2 --models 4 --seed 3" in page
    assert "| measure | seed 3 | seed 4 | pooled [95% cluster interval] |" in page
    table = [line for line in page.splitlines() if line.startswith("| geodesic mix (order 2)")]
    assert len(table) == 1 and table[0].count("|") == 6
    for label in PAIRS:
        assert f"| {label} |" in page
    assert "Holm" in page and "two-stage cluster bootstrap" in page
    stats = json.loads((tmp / "bert" / "seeds.json").read_text())
    for row in stats["pooled"]:
        if row["key"] == "geodesic_mix_o2":
            low, high = row["tau_b_interval"]
            assert f"{row['tau_b']:+.2f} [{low:+.2f}, {high:+.2f}]" in table[0]


@pytest.mark.study
def test_headline_file_holds_the_pooled_rows(seeded_run):
    tmp, _ = seeded_run
    headline = json.loads((tmp / "docs" / "results" / "data" / "bert.json").read_text())
    stats = json.loads((tmp / "bert" / "seeds.json").read_text())
    pooled = {row["key"]: row for row in stats["pooled"]}
    rows = {row["measure"]: row for row in headline["rows"]}
    for measure, key in zip(HEADLINE, ("adaptive", "geodesic_inv_o2", "geodesic_mix_o2"),
                            strict=True):
        assert rows[measure]["tau"] == pooled[key]["tau_b"]
        assert [rows[measure]["low"], rows[measure]["high"]] == pooled[key]["tau_b_interval"]
        assert "2 study seeds" in rows[measure]["setting"]


@pytest.mark.study
def test_resume_recomputes_nothing(seeded_run, monkeypatch):
    tmp, _ = seeded_run
    out = tmp / "bert"
    before = (out / "models.csv").read_text()

    def refuse(*args, **kwargs):
        raise AssertionError("a finished model was trained again on --resume")

    monkeypatch.setattr(family_run, "train_classifier", refuse)
    monkeypatch.setattr(family_run, "measure_model", refuse)
    outcome = family_run.family_study(bert_study.STUDY, out, quick=True, models=MODELS, seed=3,
                                      study_seeds=SEEDS, resume=True, plots=False)
    assert outcome.computed_now == []
    assert (out / "models.csv").read_text() == before


@pytest.mark.parametrize("value", ["0", "-1"])
def test_study_seeds_must_be_positive(tmp_path, capsys, value):
    code = main(["reproduce", "bert", "--quick", "--study-seeds", value, "--out",
                 str(tmp_path / "bert"), "--no-progress", "--no-plots"])
    assert code == 2
    assert "study-seeds must be an integer >= 1" in capsys.readouterr().err


@pytest.mark.study
@pytest.mark.parametrize("name", ["vit-finetune", "minilm"])
def test_fine_tuning_family_runs_over_study_seeds(tmp_path, name):
    """The fine-tuning families take the option through the same driver: a tiny run, two
    seeds of three models, every model of its seed's draws."""
    from quotientsharp.reproduce import load_study

    study = load_study(name).STUDY
    out = tmp_path / name
    code = main(["reproduce", name, "--quick", "--study-seeds", "2", "--models", "3",
                 "--out", str(out), "--no-progress", "--no-plots"])
    assert code == 0
    records = _read_jsonl(out / "models.jsonl")
    assert sorted((r["study_seed"], r["index"]) for r in records) == [
        (s, i) for s in (0, 1) for i in range(3)]
    for record in records:
        drawn = draw_hyperparameters(study.quick.space, record["study_seed"],
                                     record["index"]).as_dict()
        assert {key: record[key] for key in drawn} == drawn
    stats = json.loads((out / "seeds.json").read_text())
    assert [block["models"] for block in stats["per_seed"]] == [
        sum(1 for r in records if r["study_seed"] == s and not r["diverged"]) for s in (0, 1)]
