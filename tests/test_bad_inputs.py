"""Bad and edge inputs (issue 16): each gets a clear error that names what is wrong (the batch,
the solver iteration, the argument), or a documented behaviour; no non-finite loss is dropped
silently.

Sections: non-finite losses (the solver, ``average``, the clean loss); per-batch input checks;
frozen parameters; quotient API validation; options; the command line (torch-free help, device,
JSONL keys, several metrics and orders, environment, broken pipes, distributed timeouts, file
modes).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import quotientsharp as qs
from quotientsharp.cli import main
from quotientsharp.engine import NonFiniteLossError

#: These tests measure geodesic sharpness on MLPs, where discovery finds no symmetry: the
#: warning that says so is expected here (tests/test_symmetry_check.py checks it).
pytestmark = pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")

ROOT = Path(__file__).resolve().parents[1]


def _mlp(widths=(5, 8, 3), activation=nn.Tanh) -> nn.Module:
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(a, b), activation()]
    return nn.Sequential(*layers[:-1])


@pytest.fixture
def mlp_and_batches():
    torch.manual_seed(0)
    net = _mlp()
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(6, 5, generator=generator), torch.randint(0, 3, (6,),
                                                                        generator=generator))
               for _ in range(2)]
    return net, batches


def _adaptive(model, batches, **options):
    settings = {"measure": "adaptive", "rho": 0.1, "n_iter": 3, "progress": False, **options}
    return qs.sharpness(model, batches, **settings)


class _PoisonedLoss:
    """Cross-entropy that turns ``bad`` (NaN or inf) from evaluation ``after`` of a batch on.

    Evaluations are counted per batch (by the target's storage): evaluation 0 is the clean one,
    evaluation ``k`` the solver's ``k``-th step. Only the batches in ``batches`` are poisoned.
    """

    def __init__(self, bad: float, after: int = 1, batches: tuple[int, ...] = (0,)) -> None:
        self.bad, self.after, self.batches = bad, after, batches
        self.calls: dict[int, int] = {}
        self.order: list[int] = []

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        key = target.untyped_storage().data_ptr()
        if key not in self.calls:
            self.calls[key] = 0
            self.order.append(key)
        count = self.calls[key]
        self.calls[key] += 1
        loss = F.cross_entropy(output, target)
        if self.order.index(key) in self.batches and count >= self.after:
            return loss * self.bad
        return loss


# ---------------------------------------------------------------------------- 1. non-finite
@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
def test_a_non_finite_perturbed_loss_raises_naming_batch_and_iteration(mlp_and_batches, bad):
    net, batches = mlp_and_batches
    loss = _PoisonedLoss(bad, after=3, batches=(1,))
    with pytest.raises(ValueError, match=r"^batch 1: the perturbed loss is (nan|inf) at solver "
                                         r"iteration 3 of 5") as info:
        _adaptive(net, batches, loss=loss, n_iter=5)
    assert isinstance(info.value, NonFiniteLossError)
    assert "likely cause" in str(info.value) and "nonfinite='skip'" in str(info.value)


def test_a_loss_that_is_nan_at_every_perturbed_point_is_not_a_silent_zero(mlp_and_batches):
    net, batches = mlp_and_batches
    with pytest.raises(ValueError, match="batch 0: .* iteration 1 of 3; 3 of 4 evaluations"):
        qs.sharpness(net, batches[:1], measure="worst_case", rho=0.1, n_iter=3, progress=False,
                     loss=_PoisonedLoss(math.nan))


def test_skip_policy_is_recorded_counted_and_warned(mlp_and_batches):
    net, batches = mlp_and_batches
    with pytest.warns(UserWarning, match="2 perturbed evaluation"):
        result = _adaptive(net, batches[:1], loss=_PoisonedLoss(math.nan, after=2),
                           nonfinite="skip", reach=False)
    assert result.settings["nonfinite"] == "skip"
    assert result.nonfinite_evaluations == [2]
    assert result.value > 0.0                       # the first step's loss, a finite one
    assert "2 non-finite evaluation(s) skipped" in result.summary()
    finite = _adaptive(net, batches[:1])
    assert finite.settings["nonfinite"] == "raise" and finite.nonfinite_evaluations == [0]


def test_skip_keeps_the_best_finite_iterate(mlp_and_batches):
    net, batches = mlp_and_batches
    clean = _adaptive(net, batches[:1], n_iter=2, reach=False)
    with pytest.warns(UserWarning):
        skipped = _adaptive(net, batches[:1], n_iter=4, nonfinite="skip", reach=False,
                            loss=_PoisonedLoss(math.inf, after=3))
    # steps 1 and 2 are those of the unpoisoned two-step run; 3 and 4 were skipped
    assert skipped.nonfinite_evaluations == [2]
    assert skipped.value == clean.value


def test_radius_too_large_for_float32_raises_instead_of_returning_zero(mlp_and_batches):
    net, batches = mlp_and_batches
    for measure in ("worst_case", "adaptive", "geodesic", "average"):
        extra = {} if measure == "average" else {"n_iter": 2}
        with pytest.raises(ValueError, match=r"rho=1e\+30 is too large for the geometry's "
                                             "float32"):
            qs.sharpness(net, batches, measure=measure, rho=1e30, progress=False, **extra)
    with pytest.raises(ValueError, match="eta0"):
        qs.sharpness(net, batches, measure="worst_case", rho=0.1, eta0=1e30, progress=False)


def test_float16_overflow_raises_while_the_float32_copy_measures():
    torch.manual_seed(0)
    net = _mlp((20, 64, 64, 10), nn.ReLU)
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 20, generator=generator), torch.randint(0, 10, (32,),
                                                                    generator=generator)
    options = dict(measure="worst_case", rho=1e3, n_iter=3, progress=False)
    assert math.isfinite(qs.sharpness(net, [(x, y)], **options).value)
    half = _mlp((20, 64, 64, 10), nn.ReLU)
    half.load_state_dict(net.state_dict())
    with pytest.raises(ValueError, match="batch 0: .*half-precision overflow.*float16"):
        qs.sharpness(half.half(), [(x.half(), y)], **options)


def test_average_with_a_nan_perturbed_loss_raises(mlp_and_batches):
    net, batches = mlp_and_batches
    with pytest.raises(ValueError, match="batch 0: the perturbed loss is nan at draw 0 of 2"):
        qs.sharpness(net, batches, measure="average", rho=0.1, samples=2, progress=False,
                     loss=_PoisonedLoss(math.nan))
    with pytest.raises(ValueError, match="No draw was finite"):
        qs.sharpness(net, batches, measure="average", rho=0.1, samples=2, progress=False,
                     loss=_PoisonedLoss(math.nan), nonfinite="skip")
    with pytest.warns(UserWarning, match="skipped"):
        half = qs.sharpness(net, batches[:1], measure="average", rho=0.1, samples=2,
                            progress=False, loss=_PoisonedLoss(math.nan, after=2),
                            nonfinite="skip")
    assert half.nonfinite_evaluations == [1] and math.isfinite(half.value)


@pytest.mark.parametrize("case", ["all labels ignored", "empty batch", "nan buffer",
                                  "nan input"])
def test_a_non_finite_clean_loss_names_its_cause(mlp_and_batches, case):
    net, batches = mlp_and_batches
    (x, y), second = batches[0], batches[1]
    if case == "nan buffer":
        net = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
        net[1].running_mean[2] = math.nan
    bad = {"all labels ignored": (x, torch.full_like(y, -100)), "empty batch": (x[:0], y[:0]),
           "nan buffer": second, "nan input": (x * math.nan, y)}[case]
    expected = {"all labels ignored": r"batch 1: every label is -100",
                "empty batch": r"batch 1 is empty",
                "nan buffer": r"buffer\(s\) \['1.running_mean'\] contain NaN",
                "nan input": r"clean loss on batch 1 is not finite \(nan\): the input\(s\) "
                             r"\['input 0'\] contain NaN"}[case]
    with pytest.raises(ValueError, match=expected):
        _adaptive(net, [batches[0], bad])


def test_clean_loss_cause_for_a_custom_loss_that_ignores_every_label(mlp_and_batches):
    net, batches = mlp_and_batches
    x, y = batches[0]
    with pytest.raises(ValueError, match="batch 0 is not finite .*every label is -100"):
        _adaptive(net, [(x, torch.full_like(y, -100))],
                  loss=lambda out, target: F.cross_entropy(out, target))


# ---------------------------------------------------------------------------- 2. batches
class _Embedding(nn.Module):
    """A token classifier with HuggingFace's ``get_input_embeddings``."""

    def __init__(self, vocabulary: int = 10) -> None:
        super().__init__()
        self.embedding, self.head = nn.Embedding(vocabulary, 4), nn.Linear(4, 3)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embedding

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(input_ids).mean(1))


class _ArgmaxModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x).argmax(-1)


@pytest.mark.parametrize("case", ["sizes differ", "label out of range", "float labels",
                                  "bool labels", "mse with class labels", "mse sizes differ",
                                  "integer output"])
def test_bad_batches_raise_naming_the_batch(mlp_and_batches, case):
    net, batches = mlp_and_batches
    x, y = batches[0]
    options = {}
    bad = {"sizes differ": (x, y[:4]), "label out of range": (x, y + 5),
           "float labels": (x, y.float()), "bool labels": (x, y.bool()),
           "mse with class labels": (x, y), "mse sizes differ": (x, torch.randn(4, 3)),
           "integer output": (x, y)}[case]
    if case.startswith("mse"):
        options["loss"] = "mse"
    if case == "integer output":
        net = _ArgmaxModel()
    error, expected = {
        "sizes differ": (ValueError, r"output has shape \(6, 3\).*labels have shape \(4,\)"),
        "label out of range": (ValueError, r"label [5-7] is out of range.*\[0, 3\)"),
        "float labels": (TypeError, r"float32 target of shape \(6,\).*loss='mse'"),
        "bool labels": (TypeError, "integer class labels"),
        "mse with class labels": (ValueError, r"loss='mse' got integer class labels"),
        "mse sizes differ": (ValueError, r"output \(6, 3\), target \(4, 3\)"),
        "integer output": (TypeError, r"dtype int64 .*not integer predictions"),
    }[case]
    index = 0 if case == "integer output" or case.startswith("mse") else 1
    with pytest.raises(error, match=f"^batch {index}: .*{expected}"):
        _adaptive(net, batches[:1] + [bad] if index else [bad], **options)


def test_integer_labels_of_any_width_measure_the_same(mlp_and_batches):
    net, batches = mlp_and_batches
    x, y = batches[0]
    assert _adaptive(net, [(x, y.int())]).value == _adaptive(net, [(x, y)]).value


def test_token_ids_outside_the_vocabulary_name_the_batch():
    torch.manual_seed(0)
    model = _Embedding(10)
    ids = torch.randint(0, 10, (4, 6))
    y = torch.randint(0, 3, (4,))
    assert math.isfinite(_adaptive(model, [({"input_ids": ids}, y)]).value)
    with pytest.raises(ValueError, match=r"^batch 1: input_ids holds token id 1[0-4], outside "
                                         r"the model's vocabulary \[0, 10\)"):
        _adaptive(model, [({"input_ids": ids}, y), ({"input_ids": ids + 5}, y)])
    with pytest.raises(ValueError, match="token id -1"):
        _adaptive(model, [{"input_ids": ids - 1, "labels": y}])
    with pytest.raises(ValueError, match=r"^batch 0: input 0 holds token id 1[0-9], outside"):
        _adaptive(model, [(ids + 10, y)])              # positional token ids


def test_token_ids_outside_a_bert_vocabulary():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=8, vocab_size=20, num_labels=2,
                                     max_position_embeddings=8, attn_implementation="eager")
    model = transformers.BertForSequenceClassification(config)
    batch = {"input_ids": torch.tensor([[1, 2, 20]]), "labels": torch.tensor([1])}
    with pytest.raises(ValueError, match=r"batch 0: input_ids holds token id 20.*\[0, 20\)"):
        _adaptive(model, [batch])


# ---------------------------------------------------------------------------- 3. frozen
def test_frozen_parameters_are_listed_and_never_perturbed(mlp_and_batches):
    net, batches = mlp_and_batches
    net[0].weight.requires_grad_(False)
    for measure in ("geodesic", "adaptive", "average"):
        extra = {} if measure == "average" else {"n_iter": 2}
        result = qs.sharpness(net, batches, measure=measure, rho=0.1, progress=False,
                              keep_perturbations=True, **extra)
        assert result.frozen == ["0.weight"] and result.excluded == []
        assert all("0.weight" not in p for p in result.perturbations)
    assert _adaptive(_mlp(), batches).frozen == []


# ---------------------------------------------------------------------------- 4. quotients
def _diagonal_point(zero: bool):
    u = torch.tensor([[1.0, 0.0 if zero else 0.5]], dtype=torch.float64)
    v = torch.tensor([[2.0, 3.0]], dtype=torch.float64)
    return (u, v), (torch.ones_like(u), torch.ones_like(v))


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_diagonal_inner_and_norm_at_zero_coordinates_raise(metric):
    quotient = qs.DiagonalQuotient(metric)
    x, u = _diagonal_point(zero=True)
    for method in (lambda: quotient.inner(x, u, u), lambda: quotient.norm(x, u),
                   lambda: quotient.horizontal_projection(x, u)):
        with pytest.raises(ValueError, match=r"x\[0\] \(u\) has zero entries"):
            method()
    with qs.value_checks(False):                 # documented: unchecked, as in the engine
        value = quotient.inner(x, u, u)
    assert math.isinf(float(value)) if metric == "inv" else math.isfinite(float(value))
    finite, v = _diagonal_point(zero=False)
    assert torch.isfinite(quotient.norm(finite, v)).all()


def test_diagonal_euclidean_inner_is_defined_at_zero_and_bare_tensors_are_rejected():
    x, u = _diagonal_point(zero=True)
    assert math.isfinite(float(qs.DiagonalQuotient("euclidean").inner(x, u, u)))
    with pytest.raises(TypeError, match="x must be a tuple of 2 tensors"):
        qs.DiagonalQuotient("inv").inner(torch.ones(2), u, u)


@pytest.mark.parametrize("t, error", [(math.nan, ValueError), (math.inf, ValueError),
                                      ("1", TypeError), (True, TypeError), (None, TypeError)])
def test_geodesic_time_is_validated(t, error):
    gl = qs.GLQuotient("mix")
    generator = torch.Generator().manual_seed(0)
    x = gl.random_point((2,), shapes=((5, 2), (4, 2)), generator=generator,
                        dtype=torch.float64)
    u = gl.random_tangent(x, generator=generator)
    diagonal = qs.DiagonalQuotient("inv")
    y, w = _diagonal_point(zero=False)
    for call in (lambda: gl.geodesic(x, u, t=t), lambda: gl.geodesic(x, u, t=t, order="exact"),
                 lambda: gl.geodesic_exact(x, u, t=t), lambda: diagonal.geodesic(y, w, t=t)):
        with pytest.raises(error, match="^t must be"):
            call()
    assert torch.allclose(gl.geodesic(x, u, t=0.5, order=1)[0], x[0] + 0.5 * u[0])


def test_check_all_rejects_a_name():
    with pytest.raises(TypeError, match="SymmetryQuotient instance"):
        qs.checks.check_all("gl")


# ---------------------------------------------------------------------------- 5. options
@pytest.mark.parametrize("options, error, message", [
    ({"measure": "geodesic", "symmetries": 42}, TypeError, "symmetries must be .*got int 42"),
    ({"seed": 2 ** 70}, ValueError, r"seed must be an integer in \[0, 2\*\*64\)"),
    ({"seed": -1}, ValueError, "seed must be"),
    ({"seed": 1.5}, TypeError, "seed must be an integer"),
    ({"progress": "no"}, TypeError, "progress must be a bool or None"),
    ({"nonfinite": "ignore"}, ValueError, "nonfinite must be one of"),
])
def test_bad_options_raise_naming_the_option(mlp_and_batches, options, error, message):
    net, batches = mlp_and_batches
    with pytest.raises(error, match=message):
        _adaptive(net, batches, **options)


def test_largest_seed_is_accepted(mlp_and_batches):
    net, batches = mlp_and_batches
    assert math.isfinite(_adaptive(net, batches[:1], seed=2 ** 64 - 1).value)


def test_summary_names_metric_and_order(mlp_and_batches):
    net, batches = mlp_and_batches
    result = qs.sharpness(net, batches, measure="geodesic", rho=0.1, metric="mix", order=1,
                          n_iter=2, progress=False)
    assert result.summary().startswith("geodesic sharpness (metric mix, order 1) ")
    box = qs.sharpness(net, batches, measure="worst_case", rho=0.01, p="inf", n_iter=2,
                       progress=False)
    assert "(p=inf)" in box.summary()


# ---------------------------------------------------------------------------- 7. command line
def test_help_imports_no_torch_and_shows_no_rst():
    script = textwrap.dedent("""
        import contextlib, io, json, sys
        from quotientsharp.cli import main
        texts = {}
        for argv in ([], ["verify"], ["symmetries"], ["measure"], ["reproduce"]):
            stream = io.StringIO()
            with contextlib.redirect_stdout(stream):
                try:
                    main([*argv, "--help"])
                except SystemExit:
                    pass
            texts[" ".join(argv)] = stream.getvalue()
        print(json.dumps({"torch": "torch" in sys.modules, "texts": texts}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=True)
    report = json.loads(done.stdout)
    assert report["torch"] is False
    for command, text in report["texts"].items():
        assert text.startswith("usage: quotientsharp"), command
        assert "``" not in text and ":func:" not in text and ":data:" not in text, command
    reproduce = report["texts"]["reproduce"]
    for internal in ("add_arguments", "STUDIES", "module path", "run(args)"):
        assert internal not in reproduce
    for study in ("diagonal", "vit", "bert", "minilm", "vit-finetune", "lora", "invariance"):
        assert study in reproduce


@pytest.mark.parametrize("study", ["diagonal", "vit", "bert", "invariance"])
def test_study_help_imports_no_torch(study):
    """``reproduce STUDY --help`` declares the study's options from a torch-free module."""
    script = textwrap.dedent(f"""
        import contextlib, io, json, sys
        from quotientsharp.cli import main
        stream = io.StringIO()
        with contextlib.redirect_stdout(stream):
            try:
                main(["reproduce", "{study}", "--help"])
            except SystemExit:
                pass
        print(json.dumps({{"torch": "torch" in sys.modules, "text": stream.getvalue()}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=True)
    report = json.loads(done.stdout)
    assert report["torch"] is False
    text = report["text"]
    assert text.startswith(f"usage: quotientsharp reproduce {study}")
    for option in ("--out", "--resume", "--quick", "--seed", "--docs", "--threads",
                   "--dist-timeout"):
        assert option in text, option


def test_measure_names_of_the_command_line_are_the_engines():
    from quotientsharp.engine import MEASURES
    from quotientsharp.workflows.options import MEASURE_NAMES

    assert set(MEASURE_NAMES) == set(MEASURES)


@pytest.fixture(scope="module")
def saved_mlp(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad-inputs")
    torch.manual_seed(0)
    torch.save(_mlp(), root / "net.pt")
    generator = torch.Generator().manual_seed(0)
    torch.save((torch.randn(8, 5, generator=generator),
                torch.randint(0, 3, (8,), generator=generator)), root / "data.pt")
    return {"root": root, "net": root / "net.pt", "data": root / "data.pt"}


def _measure(saved, *arguments: str) -> int:
    return main(["measure", str(saved["net"]), str(saved["data"]), "--rho", "0.1", "--n-iter",
                 "2", "--batch-size", "4", "--no-progress", *arguments])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:3", "nonsense", "meta"])
def test_measure_on_an_unavailable_device_is_one_line_and_exit_2(saved_mlp, capsys, device):
    assert _measure(saved_mlp, "--device", device) == 2
    err = capsys.readouterr().err
    assert err.startswith("quotientsharp measure: error: --device") and err.count("\n") == 1


def test_jsonl_rows_with_unknown_keys_say_which_are_expected(saved_mlp, tmp_path, capsys):
    data = tmp_path / "rows.jsonl"
    for row, expected in (({"tokens": [1, 2], "label": 0}, "unknown key(s) ['tokens']"),
                          ({"label": 0}, "neither 'input_ids' nor 'text'"),
                          ({"input_ids": [1, 2], "attention_masks": [1, 1], "label": 0},
                           "unknown key(s) ['attention_masks']")):
        data.write_text(json.dumps(row) + "\n")
        assert main(["measure", str(saved_mlp["net"]), str(data), "--rho", "0.1"]) == 2
        err = capsys.readouterr().err
        assert expected in err and "expected 'input_ids'" in err and err.count("\n") == 1


def test_several_metrics_and_orders_in_one_call(saved_mlp, tmp_path, capsys):
    out = tmp_path / "out.json"
    assert _measure(saved_mlp, "--measure", "geodesic,adaptive", "--metric", "mix,inv",
                    "--order", "1,2", "--json", str(out)) == 0
    document = json.loads(out.read_text())
    keys = [f"geodesic_{m}_order{o}" for m in ("mix", "inv") for o in (1, 2)] + ["adaptive"]
    assert document["settings"]["keys"] == keys and list(document["results"]) == keys
    assert list(document["value"]) == keys
    for key in keys[:-1]:
        _, metric, order = key.split("_")
        settings = document["results"][key]["settings"]
        assert (settings["metric"], f"order{settings['order']}") == (metric, order)
    net = torch.load(saved_mlp["net"], weights_only=False)
    x, y = torch.load(saved_mlp["data"])
    direct = qs.sharpness(net, [(x[:4], y[:4]), (x[4:], y[4:])], measure="geodesic", rho=0.1,
                          metric="inv", order=1, n_iter=2, progress=False)
    assert document["value"]["geodesic_inv_order1"] == direct.value
    environment = document["environment"]
    assert environment["torch"] == torch.__version__ and environment["quotientsharp"]
    assert environment["device"] == "cpu" and environment["threads"] >= 1
    assert environment["python"].count(".") == 2
    assert "geodesic (mix, order 1)" in capsys.readouterr().out


def test_one_geodesic_variant_keeps_the_plain_key(saved_mlp, tmp_path):
    out = tmp_path / "out.json"
    assert _measure(saved_mlp, "--metric", "mix", "--json", str(out)) == 0
    document = json.loads(out.read_text())
    assert list(document["results"]) == ["geodesic"]
    assert document["settings"]["metric"] == "mix" and document["settings"]["order"] == 2


def test_bad_metric_in_a_list_is_named(saved_mlp, capsys):
    assert _measure(saved_mlp, "--metric", "mix,riemann") == 2
    assert "'riemann'" in capsys.readouterr().err


def test_symmetries_into_a_closed_pipe_ends_quietly(saved_mlp):
    read, write = os.pipe()
    os.close(read)                                   # the reader (``head``) has gone
    try:
        done = subprocess.run([sys.executable, "-m", "quotientsharp", "symmetries",
                               str(saved_mlp["net"]), "--json"], stdout=write,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=120)
    finally:
        os.close(write)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


GLOO_TIMEOUT = ("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
                "waiting 1800000ms for recv operation to complete")


def test_collective_failures_are_described():
    from quotientsharp.engine.distributed import describe_collective_failure

    timed_out = describe_collective_failure(RuntimeError(GLOO_TIMEOUT), 1800.0)
    assert "timed out waiting for the other ranks" in timed_out
    assert "--dist-timeout 1800 s" in timed_out and "--resume" in timed_out
    assert GLOO_TIMEOUT in timed_out
    lost = describe_collective_failure(RuntimeError("[gloo] Connection closed by peer "
                                                    "[127.0.0.1]:1234"))
    assert "lost contact with another rank" in lost and "--resume" in lost
    assert describe_collective_failure(RuntimeError("shape mismatch")) is None


def test_reproduce_reports_a_distributed_timeout_in_one_line(monkeypatch, capsys):
    import torch.distributed as dist

    import quotientsharp.engine.distributed as qd
    import quotientsharp.reproduce as experiments
    from quotientsharp.cli import reproduce

    class Study:
        @staticmethod
        def run(args):
            raise RuntimeError(GLOO_TIMEOUT)

    destroyed = []
    monkeypatch.setattr(experiments, "load_study", lambda name: Study)
    monkeypatch.setattr(qd, "torchrun_world_size", lambda: 2)
    monkeypatch.setattr(qd, "init_distributed", lambda timeout: (0, 2))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: destroyed.append(True))
    args = reproduce.argparse.Namespace(study="vit", dist_timeout=5.0)
    assert reproduce.run(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("quotientsharp reproduce vit: error: rank 0 of 1 timed out")
    assert "--dist-timeout 5 s" in err and "--resume" in err and err.count("\n") == 1
    assert destroyed == [True]


def test_results_files_are_written_with_the_usual_mode(tmp_path):
    from quotientsharp.workflows.files import write_json_atomic, write_jsonl_atomic

    mask = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "run.json", {"a": 1})
        write_jsonl_atomic(tmp_path / "models.jsonl", [{"a": 1}])
    finally:
        os.umask(mask)
    for name in ("run.json", "models.jsonl"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o644, name
    assert json.loads((tmp_path / "run.json").read_text()) == {"a": 1}
