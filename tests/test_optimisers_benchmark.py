"""``benchmarks/optimisers.py --quick`` runs end to end: every optimiser on every task (a tiny
random BERT in place of MiniLM), the tables, the figure and the JSON (no timing assertions)."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.benchmark, pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")]
pytest.importorskip("peft")
pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "optimisers.py"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("optimisers_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    # its dataclasses look their module up in sys.modules
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    out = tmp_path_factory.mktemp("optimisers")
    threads = torch.get_num_threads()
    try:
        results = module.main(["--quick", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    return module, results, out


def test_every_optimiser_runs_on_every_task_it_applies_to(quick_run):
    module, results, _ = quick_run
    assert set(results["tasks"]) == {"minilm-sentiment", "minilm-first", "minilm-agreement",
                                     "minilm-either", "minilm-both", "minilm-second",
                                     "bert-scratch"}
    for task_name, task in results["tasks"].items():
        for name, method in task["methods"].items():
            lora_only = name in ("PEFT Riemannian", "LoRA+")
            assert method["applies"] is not (lora_only and task_name == "bert-scratch")
            if not method["applies"]:
                continue
            assert len(method["runs"]) == len(method["grid"]) * results["seeds"]
            assert method["by_steps"] is not None, (task_name, name)
            assert method["by_steps"]["lr"] in method["grid"]
            for run in method["runs"]:
                assert run["steps"] >= results["steps"] and not run["diverged"]
                steps = [c["step"] for c in run["checkpoints"]]
                assert steps[0] == 0 and results["steps"] in steps


def test_the_paper_method_on_the_library_geometry_equals_peft_on_the_benchmark(quick_run):
    _, results, _ = quick_run
    for task_name in ("minilm-sentiment", "minilm-first", "minilm-agreement", "minilm-either",
                      "minilm-both", "minilm-second"):
        methods = results["tasks"][task_name]["methods"]
        for ours, theirs in zip(methods["RiemannianAdamW"]["runs"],
                                methods["PEFT Riemannian"]["runs"], strict=True):
            step = results["steps"]
            a = next(c for c in ours["checkpoints"] if c["step"] == step)
            b = next(c for c in theirs["checkpoints"] if c["step"] == step)
            assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-5)


def test_the_outputs_are_written(quick_run):
    _, results, out = quick_run
    assert (out / "optimisers.png").stat().st_size > 0
    assert json.loads((out / "optimisers.json").read_text())["steps"] == results["steps"]
    markdown = (out / "optimisers.md").read_text()
    for task in results["tasks"]:
        assert f"### {task}" in markdown
    assert "| AdamW |" in markdown and "n/a (no LoRA adapters)" in markdown


EXPECTED_LABEL = {"agreement": lambda a, b: int(a == b), "first": lambda a, b: a,
                  "second": lambda a, b: b, "either": lambda a, b: int(a + b > 0),
                  "both": lambda a, b: a * b}


@pytest.mark.parametrize("rule", sorted(EXPECTED_LABEL))
def test_the_two_clause_tasks_label_by_their_rule_only(quick_run, rule):
    module, _, _ = quick_run
    from quotientsharp.reproduce.families.sentiment_task import clause_sentiment

    words = module.sentiment_task
    connectives = {}
    for text, label in module.two_clause_sentences(300, 3, True, rule):
        tokens = text.replace(",", " ").replace(";", " ; ").split()
        adjectives = [i for i, w in enumerate(tokens) if w in words.POSITIVE + words.NEGATIVE]
        assert len(adjectives) == 2
        first, second = tokens[:adjectives[0] + 1], tokens[adjectives[0] + 1:]
        sentiments = [clause_sentiment(first[-1], "not" in first),
                      clause_sentiment(tokens[adjectives[1]], "not" in second)]
        assert label == EXPECTED_LABEL[rule](*sentiments), text
        connective = next(c for c in ("but", "while", "and", ";") if c in tokens)
        connectives.setdefault(connective, []).append(label)
    # the connective gives the label away for none of them (both labels follow each one)
    assert len(connectives) == 4 and all(set(v) == {0, 1} for v in connectives.values())


def test_a_budget_in_which_no_run_stepped_is_a_row_not_a_crash(quick_run):
    # an optimiser whose first step alone outlasts the budget of seconds has no rate chosen
    # there (which depends on the machine's load): its row says so
    module, results, _ = quick_run
    edited = copy.deepcopy(results)
    method = edited["tasks"]["minilm-first"]["methods"]["QuotientAdamW (eps 0)"]
    method["by_seconds"] = None
    row = next(line for line in module.table(edited).splitlines()
               if line.startswith("| QuotientAdamW (eps 0) |") and "none" in line)
    assert row.split(" | ").count("none") == 3 and "| - |" in row


NEW_ROW = "QuotientAdamW (eps 0)"


def test_one_optimiser_runs_alone_and_joins_an_earlier_run(quick_run, tmp_path):
    module, previous, out = quick_run
    tasks = ["bert-scratch", "minilm-first"]
    threads = torch.get_num_threads()
    try:
        merged = module.main(["--quick", "--tasks", *tasks, "--optimisers", NEW_ROW,
                              "--merge", str(out / "optimisers.json"), "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    assert merged["methods"] == previous["methods"]
    assert list(merged["tasks"]) == list(previous["tasks"])
    earlier = json.loads((out / "optimisers.json").read_text())
    for task_name, task in merged["tasks"].items():
        assert list(task["methods"]) == list(previous["tasks"][task_name]["methods"])
        assert task["seconds_budget"] == earlier["tasks"][task_name]["seconds_budget"]
        for name, method in task["methods"].items():
            if name != NEW_ROW or task_name not in tasks:
                # every other entry is the earlier file's, untouched
                assert method == earlier["tasks"][task_name]["methods"][name]
                continue
            assert len(method["runs"]) == len(method["grid"]) * merged["seeds"]
            # same starts and batches as the earlier run: the same trajectory within the steps
            for new, old in zip(method["runs"],
                                earlier["tasks"][task_name]["methods"][name]["runs"],
                                strict=True):
                a, b = (module.at_step(run, merged["steps"]) for run in (new, old))
                for figure in ("val_loss", "test_loss", "test_acc"):
                    assert a[figure] == pytest.approx(b[figure], rel=1e-6), figure
    markdown = (tmp_path / "optimisers.md").read_text()
    assert f"| {NEW_ROW} |" in markdown and "| AdamW |" in markdown
    assert (tmp_path / "optimisers.png").stat().st_size > 0


def test_unknown_optimiser_names_the_option(quick_run, capsys):
    module, _, _ = quick_run
    with pytest.raises(SystemExit):
        module.main(["--quick", "--optimisers", "NoSuchAdam"])
    error = capsys.readouterr().err
    assert "--optimisers" in error and "NoSuchAdam" in error


@pytest.mark.parametrize("key", ["steps", "seeds", "quick"])
def test_merge_refuses_runs_of_other_settings(quick_run, key):
    module, results, _ = quick_run
    other = {**results, key: {"steps": 7, "seeds": 2, "quick": False}[key]}
    with pytest.raises(ValueError, match=f"{key}="):
        module.merge(other, {**results, "all_methods": results["methods"],
                             "wall_seconds": {"new": 0.0}})


def test_merge_refuses_another_budget_of_seconds(quick_run):
    module, results, _ = quick_run
    task = results["tasks"]["bert-scratch"]
    new = {**results, "tasks": {"bert-scratch": {**task,
                                                 "seconds_budget": 2 * task["seconds_budget"]}},
           "all_methods": results["methods"], "wall_seconds": {"new": 0.0}}
    with pytest.raises(ValueError, match="bert-scratch"):
        module.merge(results, new)
