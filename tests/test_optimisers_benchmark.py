"""``benchmarks/optimisers.py --quick`` runs end to end: every optimiser on every task (a tiny
random BERT in place of MiniLM), the tables, the figure and the JSON (no timing assertions)."""

from __future__ import annotations

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
    for task_name in ("minilm-sentiment", "minilm-first", "minilm-agreement"):
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


@pytest.mark.parametrize("rule", ["agreement", "first"])
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
        expected = int(sentiments[0] == sentiments[1]) if rule == "agreement" else sentiments[0]
        assert label == expected, text
        connective = next(c for c in ("but", "while", "and", ";") if c in tokens)
        connectives.setdefault(connective, []).append(label)
    # the connective gives the label away for none of them (both labels follow each one)
    assert len(connectives) == 4 and all(set(v) == {0, 1} for v in connectives.values())
