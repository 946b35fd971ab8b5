"""``benchmarks/run.py --quick`` runs end to end and writes every row (no timing assertions).

Values that do not depend on the machine are checked: the in-place reference protocol of row 6
gives the same adaptive sharpness as the library, the closed forms of row 3 agree with the
autograd reference, and the batched family steps of row 4 agree with the looped ones.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
pytestmark = pytest.mark.benchmark

transformers = pytest.importorskip("transformers")
from tests.tiny_models import tiny_bert_classifier  # noqa: E402


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("benchmarks") / "benchmarks.json"
    completed = subprocess.run([sys.executable, str(BENCHMARKS / "run.py"), "--quick", "--json",
                                str(out)], capture_output=True, text=True, timeout=300,
                               cwd=ROOT)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads(out.read_text()), completed.stdout


def test_quick_run_writes_every_row(quick_results):
    results, stdout = quick_results
    rows = results["rows"]
    assert [row["row"] for row in rows] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    for row in rows:
        assert row["figures"], row["name"]
        for figure in row["figures"]:
            assert math.isfinite(figure["value"]), figure
            assert figure["comparison"] in ("<=", "<", ">=")
            assert isinstance(figure["passed"], bool)
        assert row["passed"] == all(f["passed"] for f in row["figures"])
    assert results["meta"]["quick"] is True
    assert "pass" in stdout or "MISS" in stdout
    assert results["table"].splitlines()[0].startswith("row")


def test_quick_run_values_agree(quick_results):
    rows = {row["row"]: row for row in quick_results[0]["rows"]}
    inplace = rows[6]["details"]
    assert inplace["max_per_batch_difference"] <= 1e-6 * max(1.0, abs(inplace["value_ours"]))
    for case, numbers in rows[3]["details"]["cases"].items():
        assert numbers["relative_difference"] <= 1e-9, case
    families = {k: v for k, v in rows[4]["details"].items() if isinstance(v, dict)}
    assert len(families) >= 2
    assert sum(numbers["in_table"] for numbers in families.values()) == 2
    for name, numbers in families.items():
        assert numbers["max_relative_difference_batched_vs_looped"] <= 1e-4, name
    lora = rows[9]["details"]
    assert Path(lora["figure_path"]).stat().st_size > 0          # the loss curves were drawn
    assert set(lora["final_loss"]) == {"QuotientSGD mix", "QuotientAdamW mix",
                                       "QuotientAdamW mix eps 0.01", "AdamW"}


@pytest.fixture()
def benchmark_modules(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import inplace_adaptive

    return inplace_adaptive


def _tiny_bert():
    model = tiny_bert_classifier()
    generator = torch.Generator().manual_seed(1)
    batches = [{"input_ids": torch.randint(0, 30, (4, 8), generator=generator),
                "attention_mask": torch.ones(4, 8, dtype=torch.long),
                "labels": torch.randint(0, 3, (4,), generator=generator)} for _ in range(2)]
    return model, batches


@pytest.mark.parametrize("n_iter", [1, 7, 20])
def test_inplace_protocol_equals_library_adaptive_sharpness(benchmark_modules, n_iter):
    import quotientsharp as qs

    model, batches = _tiny_bert()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    value, per_batch = benchmark_modules.inplace_adaptive_sharpness(model, batches, rho=0.1,
                                                                   n_iter=n_iter)
    for key, tensor in model.state_dict().items():      # restored exactly
        assert torch.equal(tensor, before[key]), key
    # the protocol is one ascent: the library's without its reach search
    ours = qs.sharpness(model, batches, measure="adaptive", rho=0.1, n_iter=n_iter,
                        progress=False, reach=False)
    # the same iterates; the library's g-norm is one fused reduction per parameter tensor
    # (torch._foreach_norm), the reference's a Python sum of per-tensor sums, so the two agree
    # to float64 rounding (a few ulps), not bit for bit
    assert per_batch == pytest.approx(ours.per_batch, rel=1e-12, abs=0)
    assert value == pytest.approx(ours.value, rel=1e-12, abs=0)
    assert value > 0


def test_inplace_checkpoints_match_the_solver(benchmark_modules):
    from quotientsharp.engine import checkpoints

    for n_iter in range(1, 80):
        assert benchmark_modules.adaptive_checkpoints(n_iter) == checkpoints(n_iter)
    assert benchmark_modules.adaptive_checkpoints(20) == [5, 9, 12, 14, 16, 18, 19, 20]


def test_gpu_step_script_runs_its_python_part_on_the_cpu(tmp_path):
    # benchmarks/gpu.sh calls benchmarks/gpu_step.py on CUDA; its Python part runs here on a
    # tiny model (CUDA graphs need a device: recorded as skipped, never silently)
    out = tmp_path / "gpu_step.json"
    completed = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_step.py"), "--device",
                                "cpu", "--tiny", "--variants", "eager", "compile-steps",
                                "cudagraphs",
                                "--iters", "1", "2", "--repeats", "1", "--json", str(out)],
                               capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert completed.returncode == 0, completed.stderr[-4000:]
    report = json.loads(out.read_text())
    eager = report["variants"]["eager"]
    assert "error" not in eager, eager
    for key in ("per_iteration_over_forward_backward", "launches_per_iteration",
                "memory_beyond_forward_backward_over_parameter_bytes", "setup_s"):
        assert set(eager[key]) == {"adaptive", "geodesic mix", "geodesic inv"}, key
        assert all(math.isfinite(v) for v in eager[key].values()), key
    # a step dispatches at least the work of its forward+backward
    assert min(eager["launches_per_iteration"].values()) >= eager["forward_backward_launches"]
    compiled = report["variants"]["compile-steps"]
    assert "error" not in compiled, compiled
    assert all(math.isfinite(v) for v in compiled["per_iteration_over_forward_backward"].values())
    assert "skipped" in report["variants"]["cudagraphs"]
    assert "gpu_step.py" in (BENCHMARKS / "gpu.sh").read_text()


def test_launches_counts_the_cuda_path_by_operator_on_the_cpu(tmp_path):
    out = tmp_path / "launches.json"
    completed = subprocess.run([sys.executable, str(BENCHMARKS / "launches.py"), "--tiny",
                                "--iters", "1", "3", "--json", str(out)],
                               capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert completed.returncode == 0, completed.stderr[-4000:]
    report = json.loads(out.read_text())
    assert set(report["measures"]) == {"adaptive", "geodesic mix", "geodesic inv",
                                       "worst-case linf"}
    for name, row in report["measures"].items():
        # an iteration is at least a forward and a backward of the model
        assert row["per iteration"] >= report["forward+backward"] / 2, name
        assert row["beyond forward+backward"] == pytest.approx(
            row["per iteration"] - report["forward+backward"]), name
        assert row["largest beyond forward+backward"], name


STUBBORN_STEP = r"""
import os, signal, subprocess, sys, time
# a child that ignores SIGTERM and holds the step's output open, like a compile worker
child = subprocess.Popen([sys.executable, "-c",
                          "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                          "time.sleep(120)"])
with open(sys.argv[1], "w") as handle:
    handle.write(str(child.pid))
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("step started", flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    # a killed child not yet reaped by its (killed) parent is a zombie: gone for our purpose
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_bounded_step_ends_at_its_limit_with_everything_it_started(tmp_path):
    # benchmarks/gpu.sh runs each step through bounded_step.sh: a step and a child that both
    # ignore SIGTERM, the child holding the output open, must still end soon after the limit,
    # with the step's output printed and no process left behind
    pid_file, log = tmp_path / "child.pid", tmp_path / "logs" / "step.log"
    completed = subprocess.run(
        ["bash", str(BENCHMARKS / "bounded_step.sh"), "2", str(log), sys.executable, "-c",
         STUBBORN_STEP, str(pid_file)],
        capture_output=True, text=True, timeout=60)
    assert completed.returncode == 137, completed.stderr
    assert "step started" in completed.stdout
    assert "stopped at its limit of 2 s" in completed.stderr
    assert not _alive(int(pid_file.read_text()))


def test_a_bounded_step_passes_its_exit_status_and_output_through(tmp_path):
    log = tmp_path / "ok.log"
    completed = subprocess.run(
        ["bash", str(BENCHMARKS / "bounded_step.sh"), "30", str(log), sys.executable, "-c",
         "import sys; print('done'); sys.exit(3)"],
        capture_output=True, text=True, timeout=60)
    assert completed.returncode == 3
    assert completed.stdout == "done\n" == log.read_text()
    assert "stopped" not in completed.stderr


def test_gpu_script_bounds_every_step():
    script = (BENCHMARKS / "gpu.sh").read_text()
    steps = [line for line in script.splitlines() if "benchmarks/" in line and ".py" in line
             and not line.lstrip().startswith("#")]
    assert steps and all(line.startswith("bounded ") for line in steps), steps
    assert "| tee" not in script.replace("`timeout | tee`", "")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CPU machine")
def test_gpu_script_refuses_without_a_cuda_device():
    completed = subprocess.run(["bash", str(BENCHMARKS / "gpu.sh")], capture_output=True,
                               text=True, timeout=120, cwd=ROOT)
    assert completed.returncode == 1
    assert "no CUDA device visible to torch" in completed.stderr


def test_end_to_end_memory_runs_the_command_and_its_baseline(tmp_path):
    # benchmarks/peak_rss.py --end-to-end: the `measure` command per measure against a process
    # that loads the same files and runs forward+backward; here on a tiny BERT
    completed = subprocess.run([sys.executable, str(BENCHMARKS / "peak_rss.py"), "--end-to-end",
                                "--hidden", "64", "--layers", "1", "--n-iter", "1"],
                               capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert completed.returncode == 0, completed.stderr[-4000:]
    results = [json.loads(line) for line in completed.stdout.splitlines()]
    assert [r["measure"] for r in results] == ["adaptive", "geodesic mix", "geodesic inv"]
    for result in results:
        assert result["command_peak_bytes"] > result["parameter_bytes"] > 0
        assert result["beyond_baseline_over_parameter_bytes"] == pytest.approx(
            (result["command_peak_bytes"] - result["baseline_peak_bytes"])
            / result["parameter_bytes"])


def test_step_ab_prints_one_ratio_per_measure():
    completed = subprocess.run([sys.executable, str(BENCHMARKS / "step_ab.py"), "--tiny",
                                "--iters", "1", "2"],
                               capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert completed.returncode == 0, completed.stderr[-4000:]
    result = json.loads(completed.stdout)
    assert result["forward_backward_s"] > 0
    for name in ("adaptive", "geodesic mix", "geodesic inv"):
        assert math.isfinite(result[name]), name


def test_fused_paths_switches_the_order_two_point_and_prints_its_figures(benchmark_modules):
    import importlib

    import quotientsharp as qs

    module = importlib.import_module("fused_paths")
    switch = module.Switch()
    gen = torch.Generator().manual_seed(0)
    frozen = qs.GLQuotient("mix").at(tuple(torch.randn(2, 5, 3, generator=gen)
                                           for _ in range(2)))
    u = tuple(torch.randn(2, 5, 3, generator=gen).requires_grad_(True) for _ in range(2))
    names = {}
    for variant in ("fused", "elementary"):
        switch(variant)
        names[variant] = type(frozen.geodesic(u, 1.0, 2)[0].grad_fn).__name__
    switch.restore()
    assert names["fused"] == "OrderTwoGLPathBackward" and names["elementary"] != names["fused"]
    completed = subprocess.run([sys.executable, str(BENCHMARKS / "fused_paths.py"), "--tiny",
                                "--rounds", "1"],
                               capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert completed.returncode == 0, completed.stderr[-4000:]
    figures = json.loads(completed.stdout)
    for key in ("point mix fused ms", "point inv elementary ms", "forward_backward ms",
                "step geodesic mix fused minus elementary ms per iteration",
                "step adaptive fused minus elementary ms per iteration"):
        assert math.isfinite(figures[key]), key


def test_phases_splits_an_iteration_without_counting_twice():
    import importlib

    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    module = importlib.import_module("phases")
    clock = module.PhaseClock()

    def inner() -> None:
        sum(range(20000))

    outer_inner = clock.wrap(inner, "inner")

    def outer() -> None:
        outer_inner()
        sum(range(20000))

    total = module.time.process_time()
    clock.wrap(outer, "outer")()
    spent = module.time.process_time() - total
    assert 0 < clock.seconds["inner"] and 0 < clock.seconds["outer"]
    assert clock.seconds["inner"] + clock.seconds["outer"] <= spent + 1e-6
    completed = subprocess.run([sys.executable, str(BENCHMARKS / "phases.py"), "--tiny",
                                "--iters", "1", "2", "--repeats", "1"],
                               capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert completed.returncode == 0, completed.stderr[-4000:]
    result = json.loads(completed.stdout)
    for name in ("adaptive", "geodesic mix", "geodesic inv"):
        phases = result[name]
        assert {"model forward ms", "backward ms", "path ms", "direction ms", "rescale ms",
                "other ms", "total ms"} <= set(phases), phases
        named = sum(v for k, v in phases.items() if k.endswith(" ms") and k != "total ms")
        assert named == pytest.approx(phases["total ms"], abs=0.05)


def test_compiled_steps_benchmark_times_both_paths_and_the_compile():
    completed = subprocess.run([sys.executable, str(BENCHMARKS / "compiled_steps.py"), "--tiny",
                                "--iters", "2", "3", "--repeats", "1", "--measures", "adaptive"],
                               capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert completed.returncode == 0, completed.stderr[-4000:]
    result = json.loads(completed.stdout)
    assert list(result["per_iteration_over_forward_backward"]) == ["adaptive"]
    ratios = result["per_iteration_over_forward_backward"]["adaptive"]
    assert all(math.isfinite(ratios[k]) for k in ("eager", "compiled",
                                                  "compiled_minus_eager_ms"))
    compile_seconds = result["compile_s"]["adaptive"]
    assert compile_seconds["first_call_wall_s"] > 0
    # the three batches look up different rows: the compile is measured on a new row count
    assert len(set(result["rows"])) == 3, result["rows"]
    assert result["max_relative_value_difference"]["adaptive"] < 1e-5


def test_solver_reach_table_counts_reach_and_flags_per_problem():
    # the table's shares are of the best value any option found for the same problem, and
    # its flag columns split the values at 99 % of that best
    spec = importlib.util.spec_from_file_location("solver_reach", BENCHMARKS / "solver_reach.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    problem = {"model": "m", "measure": "geodesic mix", "rho": 0.1, "batch": 0}
    records = [{**problem, "option": "one ascent (20 steps)", "value": 0.5, "evaluations": 21,
                "flagged": True},
               {**problem, "option": "search (default)", "value": 0.995, "evaluations": 60,
                "flagged": False},
               {**problem, "option": "reference (100 steps, 4 restarts)", "value": 1.0,
                "evaluations": 505, "flagged": False}]
    rows = {line.split(" | ")[1]: line for line in module.table(records).splitlines()[2:]}
    assert rows["one ascent (20 steps)"].endswith("| 50.0 % | 50.0 % | 21 | 1 / 1 | 0 / 0 |")
    assert rows["search (default)"].endswith("| 99.5 % | 99.5 % | 60 | 0 / 0 | 0 / 1 |")
    assert "reference (100 steps, 4 restarts)" in rows


def test_path_check_cost_script_runs_on_a_tiny_model(tmp_path):
    # benchmarks/path_check_cost.py: the check's share of a measurement, with the solve's reach
    out = tmp_path / "cost.json"
    completed = subprocess.run([sys.executable, str(BENCHMARKS / "path_check_cost.py"), "--tiny",
                                "--repeats", "1", "--json", str(out)],
                               capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert completed.returncode == 0, completed.stderr[-4000:]
    report = json.loads(out.read_text())
    for name in ("geodesic inv", "geodesic mix"):
        row = report[name]
        assert row["seconds_checked"] > 0 and row["seconds_unchecked"] > 0
        assert math.isfinite(row["check_share"]) and 0 <= row["reach"] <= 1
