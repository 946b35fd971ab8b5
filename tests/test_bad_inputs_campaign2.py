"""The second bad-input campaign (issue 24): every input it found silent or unclear, each with
the outcome a user now gets. "0 silent" is checkable here: every case below either raises an
error naming its culprit or returns the right number, and a test fails otherwise.

Left to the binding check (another module): a wrong-shaped ``vertical()``, a detached
``from_point`` and an overriding ``horizontal_projection`` that is not idempotent.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import quotientsharp as qs
from quotientsharp.cli import main
from quotientsharp.workflows import measuring
from quotientsharp.workflows.files import read_jsonl
from quotientsharp.workflows.locks import OutputLock, OutputLockedError
from quotientsharp.workflows.records import ResultsDirectory

# the campaign's models are small MLPs without symmetry: geodesic sharpness says it equals
# adaptive there (tested in test_symmetry_check.py); here the inputs' own errors are the subject
pytestmark = pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")

ROOT = Path(__file__).resolve().parents[1]


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def _batches(n: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(12, 4, generator=generator),
             torch.randint(0, 3, (12,), generator=generator)) for _ in range(n)]


def _measure(model, batches, measure="worst_case", **options):
    settings = {"rho": 0.1, "n_iter": 3, "progress": False, **options}
    if measure == "average":
        settings.pop("n_iter")
    return qs.sharpness(model, batches, measure=measure, **settings)


def _global_states():
    return (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())  # noqa: NPY002


def _same_states(a, b) -> bool:
    return torch.equal(a[0], b[0]) and a[1] == b[1] and bool((a[2] == b[2]).all())


# ---------------------------------------------------------------------------- wrong numbers
class ForcedDropout(nn.Module):
    """Dropout forced on in the forward, whatever the module's mode."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.last = nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(F.dropout(torch.tanh(self.first(x)), 0.5, training=True))


class NumpyNoise(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x) * float(1 + 0.01 * np.random.rand())  # noqa: NPY002


@pytest.mark.parametrize("measure", ["worst_case", "geodesic", "average"])
def test_forced_dropout_raises_and_leaves_the_global_random_state(measure):
    torch.manual_seed(3)
    model = ForcedDropout()
    before = _global_states()
    with pytest.raises(ValueError, match="forward is not deterministic.*torch's global "
                                         "generator.*F.dropout"):
        _measure(model, _batches(), measure)
    assert _same_states(before, _global_states())


def test_numpy_draws_in_the_forward_are_found_too():
    with pytest.raises(ValueError, match="not deterministic.*NumPy"):
        _measure(NumpyNoise(), _batches())


def test_a_successful_call_leaves_the_global_random_state():
    model = _mlp()
    before = _global_states()
    _measure(model, _batches(), "average", samples=2)
    _measure(model, _batches(), "worst_case", random_init=True)
    assert _same_states(before, _global_states())


class NanWhenMoved(nn.Module):
    """A finite output at its own parameters only: every perturbed loss is NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)
        self.reference = self.layer.weight.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer(x)
        return out if torch.equal(self.layer.weight, self.reference) else out * math.nan


@pytest.mark.parametrize("measure", ["worst_case", "adaptive", "geodesic", "average"])
def test_skip_with_no_finite_evaluation_raises(measure):
    # the start xi = 0 is the clean loss, finite: it used to be reported as a sharpness of 0
    with pytest.raises(ValueError, match="No (perturbed evaluation|draw) was finite"):
        _measure(NanWhenMoved(), _batches(), measure, nonfinite="skip")


# ---------------------------------------------------------------------------- silent, now refused
def test_a_complex_loss_is_refused():
    def complex_loss(output, target):
        return F.cross_entropy(output, target).to(torch.complex64)

    with pytest.raises(TypeError, match="batch 0: the loss returned a complex tensor"):
        _measure(_mlp(), _batches(), loss=complex_loss)


@pytest.fixture(scope="module")
def bert():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        vocab_size=40, max_position_embeddings=16, num_labels=3, pad_token_id=0,
        attn_implementation="eager", initializer_range=0.3)
    return transformers.BertForSequenceClassification(config).eval()


def _bert_batch(dtype=torch.int64):
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 40, (4, 7), generator=generator)
    return {"input_ids": ids.to(dtype), "attention_mask": torch.ones(4, 7, dtype=torch.int64),
            "labels": torch.randint(0, 3, (4,), generator=generator)}


def test_an_attention_mask_of_the_wrong_shape_is_refused(bert):
    batch = _bert_batch()
    batch["attention_mask"] = torch.ones(4, 9, dtype=torch.int64)   # all ones, dropped by HF
    with pytest.raises(ValueError, match=r"attention_mask has shape \(4, 9\) but input_ids "
                                         r"has shape \(4, 7\)"):
        _measure(bert, [batch], "geodesic", n_iter=2)


# ---------------------------------------------------------------------------- the default path
def test_int32_token_ids_equal_int64_on_bert(bert):
    wide = _measure(bert, [_bert_batch(torch.int64)], "geodesic", n_iter=2)
    narrow = _measure(bert, [_bert_batch(torch.int32)], "geodesic", n_iter=2)
    assert narrow.settings["touched_rows"] is True
    assert narrow.value == pytest.approx(wide.value, rel=1e-6, abs=1e-9)
    assert narrow.settings["restricted_rows"] == wide.settings["restricted_rows"]


class Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.table, self.head = nn.Embedding(10, 4), nn.Linear(4, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.table(ids).mean(1))


def _ids(low=0, high=10):
    generator = torch.Generator().manual_seed(5)
    return (torch.randint(low, high, (6, 5), generator=generator),
            torch.randint(0, 3, (6,), generator=generator))


def test_int32_token_ids_equal_int64_on_a_custom_embedding():
    ids, labels = _ids()
    wide = _measure(Bag(), [(ids, labels)], "adaptive")
    narrow = _measure(Bag(), [(ids.int(), labels)], "adaptive")
    assert narrow.value == pytest.approx(wide.value, rel=1e-6)


# ---------------------------------------------------------------------------- unclear errors
@pytest.mark.parametrize("shift, token", [(10, "token id 1[0-9]"), (-10, "token id -")])
def test_ids_outside_a_custom_embedding_are_named(shift, token):
    ids, labels = _ids()
    with pytest.raises(ValueError, match=f"batch 0: input 0 holds {token}.*vocabulary \\[0, 10\\)"):
        _measure(Bag(), [(ids + shift, labels)])


def test_meta_device_model_buffers_and_batches_are_named():
    with torch.device("meta"):
        model = _mlp()
    with pytest.raises(ValueError, match=r"\['0.weight'.*meta device"):
        _measure(model, _batches())
    with_buffer = _mlp()
    with_buffer.register_buffer("scale", torch.ones(3, device="meta"))
    with pytest.raises(ValueError, match=r"\['scale'\].*meta device"):
        _measure(with_buffer, _batches())
    x, y = _batches()[0]
    with pytest.raises(ValueError, match="batch 0's inputs holds a tensor on the meta device"):
        _measure(_mlp(), [(x.to("meta"), y)])
    with pytest.raises(ValueError, match="batch 0's target holds a tensor on the meta device"):
        _measure(_mlp(), [(x, y.to("meta"))])


def test_an_integer_rho_beyond_float64_is_named():
    with pytest.raises(ValueError, match="rho must be a finite number > 0 that fits in a float64"):
        _measure(_mlp(), _batches(), rho=10 ** 400)


class InfScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)
        self.register_buffer("scale", torch.tensor([1.0, math.inf, 1.0]), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x) * self.scale


def test_inf_in_a_non_persistent_buffer_is_named():
    with pytest.raises(ValueError, match=r"clean loss on batch 0 is not finite.*buffer\(s\) "
                                         r"\['scale'\] contain inf"):
        _measure(InfScale(), _batches())


def test_raw_torch_errors_of_the_forward_name_the_inputs():
    x, y = _batches()[0]
    with pytest.raises(ValueError, match=r"batch 0: the model's forward failed on inputs "
                                         r"\{input 0: \(12, 5\) float32\}.*mat1 and mat2"):
        _measure(_mlp(), [(torch.randn(12, 5), y)])
    with pytest.raises(ValueError, match=r"input 0: \(12, 4\) int64\} \(parameters float32\)"):
        _measure(_mlp(), [(x.long(), y)], "average")


def test_integer_tensors_never_reach_a_normal_draw():
    quotient = qs.GLQuotient(metric="inv")
    with pytest.raises(TypeError, match="random_point: dtype must be a floating dtype"):
        quotient.random_point(shapes=[(5, 2), (4, 2)], dtype=torch.int64)
    x = quotient.random_point(shapes=[(5, 2), (4, 2)], dtype=torch.float64)
    with pytest.raises(TypeError, match=r"random_tangent: x\[0\] has dtype torch.int64"):
        quotient.random_tangent(tuple(t.long() for t in x))


def test_one_tensor_for_a_tuple_is_named():
    quotient = qs.GLQuotient(metric="inv")
    x = quotient.random_point(shapes=[(5, 2), (4, 2)], dtype=torch.float64)
    with pytest.raises(TypeError, match="u must be a tuple of 2 tensors.*got Tensor"):
        quotient.horizontal_projection(x, x[0])
    with pytest.raises(TypeError, match="x must be a tuple of 2 tensors.*got Tensor"):
        quotient.inner(x[0], x, x)
    with pytest.raises(TypeError, match="batches must be an iterable of batches, got Tensor"):
        _measure(_mlp(), _batches()[0][0])


# ---------------------------------------------------------------------------- files and studies
@pytest.fixture(scope="module")
def study_files(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("campaign2")
    for index in range(3):
        torch.save(_mlp(index), root / f"net{index}.pt")
    generator = torch.Generator().manual_seed(0)
    torch.save((torch.randn(12, 4, generator=generator),
                torch.randint(0, 3, (12,), generator=generator)), root / "data.pt")
    (root / "models.csv").write_text("model,gap\n" + "".join(
        f"net{i}.pt,{0.1 * (i + 1)}\n" for i in range(3)))
    return root


def _study(root: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["study", str(root / "models.csv"), "--data", str(root / "data.pt"),
                     "--measure", "adaptive", "--rho", "0.1", "--n-iter", "2", "--no-progress",
                     "--no-plots", "--bootstrap", "50", "--out", str(out), *extra])
    return code, stdout.getvalue(), stderr.getvalue()


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


def _hold(path: Path) -> subprocess.Popen:
    """Another process that takes the output's lock and keeps it until killed."""
    script = textwrap.dedent(f"""
        import sys, time
        from quotientsharp.workflows.locks import OutputLock
        lock = OutputLock({str(path)!r}).acquire()      # held while referenced
        print("held", flush=True)
        time.sleep(120)
    """)
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())
            if p.is_file() and not p.name.startswith(".quotientsharp.lock")}


def test_a_second_study_on_a_held_folder_fails_at_once_and_changes_nothing(study_files,
                                                                          tmp_path):
    out = tmp_path / "out"
    assert _study(study_files, out)[0] == 0
    before = _snapshot(out)
    holder = _hold(out)
    try:
        tic = time.perf_counter()
        code, _, stderr = _study(study_files, out, "--resume")
        assert time.perf_counter() - tic < 20
        assert code == 2
        assert f"--out {out} is being written by process {holder.pid}" in stderr
        assert "host" in stderr
        code, _, stderr = _study(study_files, out)            # a fresh run: nothing deleted
        assert code == 2 and str(holder.pid) in stderr
        assert _snapshot(out) == before
        with pytest.raises(OutputLockedError, match=str(out)):
            ResultsDirectory(out, "quotientsharp study", {}, resume=True, owned=[])
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # the holder is gone (killed, its lock released by the OS): the folder is free again
    code, _, stderr = _study(study_files, out, "--resume")
    assert code == 0, stderr
    assert len(read_jsonl(out / "models.jsonl")) == 3


# each process imports the package first, then waits for the go file, so that both runs start
# their study at the same moment; a short pause per model keeps the winner's run (and its lock)
# alive while the other one starts
_RACER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from quotientsharp.cli import main
    from quotientsharp.workflows import measuring
    go, original = Path(sys.argv[1]), measuring.measure_entry
    def paused(*args, **kwargs):
        time.sleep(0.2)
        return original(*args, **kwargs)
    measuring.measure_entry = paused
    print("ready", flush=True)
    while not go.exists():
        time.sleep(0.002)
    sys.exit(main(sys.argv[2:]))
""")


def test_two_studies_started_at_once_on_one_folder_one_refuses_nothing_mixed(study_files,
                                                                            tmp_path):
    out, go = tmp_path / "out", tmp_path / "go"
    racers = {}
    for rho in ("0.1", "0.2"):
        argv = ["study", str(study_files / "models.csv"), "--data", str(study_files / "data.pt"),
                "--measure", "adaptive", "--rho", rho, "--n-iter", "2", "--no-progress",
                "--no-plots", "--bootstrap", "20", "--out", str(out)]
        racers[rho] = subprocess.Popen(
            [sys.executable, "-c", _RACER, str(go), *argv], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    for racer in racers.values():
        assert racer.stdout is not None and racer.stdout.readline().strip() == "ready"
    go.touch()
    finished = {rho: (racer.wait(timeout=120), *racer.communicate())
                for rho, racer in racers.items()}
    codes = sorted(code for code, _, _ in finished.values())
    assert codes == [0, 2], finished
    winner = next(rho for rho, (code, _, _) in finished.items() if code == 0)
    loser = next(rho for rho in finished if rho != winner)
    stderr = finished[loser][2]
    assert f"--out {out} is being written by process {racers[winner].pid}" in stderr
    assert "host" in stderr
    # the winner's outputs are complete, and hold its measurement and nothing of the other's
    key, other = f"adaptive_rho{winner}", f"adaptive_rho{loser}"
    records = read_jsonl(out / "models.jsonl")
    assert sorted(r["name"] for r in records) == ["net0.pt", "net1.pt", "net2.pt"]
    assert all(list(r["sharpness"]) == [key] for r in records)
    header, *rows = (out / "models.csv").read_text().splitlines()
    assert header.split(",")[-1] == key and len(rows) == 3
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "finished"
    assert [entry["key"] for entry in run["settings"]["grid"]] == [key]
    for name in ("models.csv", "taus.json", "taus.csv", "report.md", "run.json"):
        assert other not in (out / name).read_text(), name
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*.tmp"))


def test_a_second_measure_json_to_the_same_file_fails_at_once(study_files, tmp_path):
    target = tmp_path / "result.json"
    holder = _hold(target)
    try:
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            code = main(["measure", str(study_files / "net0.pt"), str(study_files / "data.pt"),
                         "--measure", "adaptive", "--rho", "0.1", "--n-iter", "2",
                         "--no-progress", "--json", str(target)])
        assert code == 2
        assert f"--json {target} is being written by process {holder.pid}" in stderr.getvalue()
        assert not target.exists()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


def test_a_second_verify_json_to_the_same_file_fails_at_once(tmp_path):
    target = tmp_path / "rows.json"
    holder = _hold(target)
    try:
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            code = main(["verify", "--seeds", "1", "--dtype", "float64", "--json", str(target)])
        assert code == 2
        assert f"--json {target} is being written by process {holder.pid}" in stderr.getvalue()
        assert not target.exists()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


def test_a_kill_mid_write_leaves_a_temporary_file_the_next_writer_removes(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    script = textwrap.dedent(f"""
        import os, time
        from pathlib import Path
        from quotientsharp.workflows import files
        from quotientsharp.workflows.locks import OutputLock
        lock = OutputLock(Path({str(out)!r})).acquire()
        def stuck(fd):
            print("writing", flush=True)
            time.sleep(120)
        files.os.fsync = stuck
        files.write_csv_atomic(Path({str(out)!r}) / "models.csv", ["a"], [{{"a": 1}}])
    """)
    writer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    writer.stdout.close()
    assert [p.name for p in out.glob(".models.csv.*.tmp")]     # what SIGKILL leaves
    with OutputLock(out):
        assert not list(out.glob("*.tmp")) and not list(out.glob(".*.tmp"))
    assert not (out / "models.csv").exists()


def test_measure_json_is_written_atomically_and_locked_by_name(tmp_path):
    from quotientsharp.cli.measure_output import write_json

    target = tmp_path / "sub" / "r.json"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / ".r.json.123.tmp").write_text("left by a killed writer")
    with OutputLock(target, "--json"):
        write_json(target, {"value": 1.5})
        assert not list((tmp_path / "sub").glob(".r.json.*.tmp"))
    assert json.loads(target.read_text()) == {"value": 1.5}


# ---------------------------------------------------------------------------- text files
def test_a_non_utf8_manifest_and_data_file_are_named(study_files, tmp_path):
    manifest = tmp_path / "models.csv"
    manifest.write_bytes(b"model,gap\nnet0.pt,0.1\n" + b"caf\xe9.pt,0.2\n")
    stderr_io = io.StringIO()
    with contextlib.redirect_stderr(stderr_io), contextlib.redirect_stdout(io.StringIO()):
        code = main(["study", str(manifest), "--data", str(study_files / "data.pt"),
                     "--measure", "adaptive", "--rho", "0.1", "--no-progress",
                     "--out", str(tmp_path / "o2")])
    assert code == 2 and str(manifest) in stderr_io.getvalue()
    assert "UTF-8" in stderr_io.getvalue()
    data = tmp_path / "data.jsonl"
    data.write_bytes(b'{"text": "caf\xe9", "label": 0}\n')
    stderr_io = io.StringIO()
    with contextlib.redirect_stderr(stderr_io), contextlib.redirect_stdout(io.StringIO()):
        code = main(["measure", str(study_files / "net0.pt"), str(data), "--measure",
                     "adaptive", "--rho", "0.1", "--no-progress"])
    assert code == 2 and str(data) in stderr_io.getvalue()


# ---------------------------------------------------------------------------- pinned behaviour
def test_the_model_runs_in_eval_mode_and_its_modes_come_back():
    # a dropout left in train mode by the test: only sharpness() itself can switch it off
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Dropout(0.5), nn.Linear(8, 3))
    assert model.training
    first = _measure(model, _batches(), "worst_case")
    second = _measure(model, _batches(), "worst_case")
    assert model.training and all(m.training for m in model.modules())
    # the value of the same weights without any dropout at all: eval mode, whatever the caller's
    without = nn.Sequential(*[m for m in model if not isinstance(m, nn.Dropout)])
    reference = _measure(without, _batches(), "worst_case")
    assert first.value == second.value == pytest.approx(reference.value, rel=1e-6)


def test_an_hf_config_that_does_not_match_its_weights_is_named(bert, tmp_path):
    from quotientsharp.workflows.saved_models import load_measured_model

    bert.save_pretrained(tmp_path / "bert")
    config = json.loads((tmp_path / "bert" / "config.json").read_text())
    config["intermediate_size"] = 48                    # the weights have 32
    (tmp_path / "bert" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json does not match the weights.*"
                                         r"intermediate.dense.weight: weights \(32, 16\), "
                                         r"config \(48, 16\)"):
        load_measured_model(tmp_path / "bert")


def test_the_average_measure_reports_the_mean_norm_of_its_draws():
    # delta ~ N(0, rho^2 I) in 67 coordinates: E ||delta|| = rho sqrt(2) Gamma(34) / Gamma(33.5),
    # about rho sqrt(66.5); 64 draws put the mean within 1 % of it (a mutation survivor
    # subtracted the norms)
    model = _mlp()
    dimension = sum(p.numel() for p in model.parameters())
    result = _measure(model, _batches(), "average", samples=64)
    expected = 0.1 * math.sqrt(2) * math.exp(math.lgamma((dimension + 1) / 2)
                                             - math.lgamma(dimension / 2))
    assert result.perturbation_norms[0]["total"] == pytest.approx(expected, rel=0.05)


class TwoTables(nn.Module):
    """Word and kind embeddings, each indexed by its own input."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(6)
        self.words, self.kinds = nn.Embedding(10, 4), nn.Embedding(3, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, ids: torch.Tensor, kinds: torch.Tensor) -> torch.Tensor:
        return self.head((self.words(ids) + self.kinds(kinds)).mean(1))


@pytest.mark.parametrize("touched_rows", [True, False])
@pytest.mark.parametrize("words_shift, kinds_shift, named", [
    (0, 3, r"input 1 holds index [3-5], outside the embedding table 'kinds' \(rows \[0, 3\)\)"),
    (0, -3, r"input 1 holds index -[1-3], outside the embedding table 'kinds' \(rows \[0, 3\)\)"),
    (-10, 0, r"input 0 holds index -[1-9]0?, outside the embedding table 'words' "
             r"\(rows \[0, 10\)\)"),
])
def test_ids_outside_one_of_several_tables_name_the_table_and_input(words_shift, kinds_shift,
                                                                    named, touched_rows):
    ids, labels = _ids()
    kinds = torch.remainder(ids, 3)
    with pytest.raises(ValueError, match=f"batch 0: .*{named}"):
        _measure(TwoTables(), [((ids + words_shift, kinds + kinds_shift), labels)],
                 touched_rows=touched_rows)


@pytest.mark.parametrize("token_type", [2, -1])
def test_token_type_ids_outside_bert_name_the_token_type_table(bert, token_type):
    batch = _bert_batch()
    batch["token_type_ids"] = torch.full_like(batch["input_ids"], token_type)
    with pytest.raises(ValueError, match=f"token_type_ids holds index {token_type}, outside the "
                                         r"embedding table 'bert.embeddings.token_type_embeddings"
                                         r"' \(rows \[0, 2\)\)"):
        _measure(bert, [batch], "geodesic", n_iter=2)
