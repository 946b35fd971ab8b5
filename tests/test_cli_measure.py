"""The ``quotientsharp`` console script: ``measure`` on saved models and data, ``verify``,
``symmetries``. Every command runs in-process through ``quotientsharp.cli.main``.

``measure`` is held against independent computations: the clean losses against a plain forward
of every example on its own (no padding), the sharpness values against direct calls of
``quotientsharp.sharpness`` on batches built here.
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import quotientsharp as qs
from quotientsharp import sharpness
from quotientsharp.cli import main

transformers = pytest.importorskip("transformers")

NUM_LABELS = 3
VOCAB = 50
HEADS, LAYERS, HIDDEN = 4, 2, 32
WORDS = "the a cat dog sat ran on in mat park hello world big small red".split()


def _bert_config() -> transformers.BertConfig:
    return transformers.BertConfig(
        hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=32,
        num_labels=NUM_LABELS, attn_implementation="eager",
        # larger than BERT's 0.02 so that the attention pairs matter to the loss
        initializer_range=0.3)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """A tiny BERT classifier (with and without a tokenizer), JSONL rows, a torch module and
    tensor files, all written once."""
    root = tmp_path_factory.mktemp("measure")
    torch.manual_seed(0)
    bert = transformers.BertForSequenceClassification(_bert_config()).eval()
    bert.save_pretrained(root / "bert")
    bert.save_pretrained(root / "bert_tok")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    transformers.BertTokenizer(str(vocab)).save_pretrained(root / "bert_tok")

    generator = torch.Generator().manual_seed(1)
    rows = []
    for index in range(10):
        length = int(torch.randint(3, 11, (1,), generator=generator))
        rows.append({"input_ids": torch.randint(1, VOCAB, (length,), generator=generator).tolist(),
                     "label": index % NUM_LABELS})
    rows[1]["attention_mask"] = [1] * len(rows[1]["input_ids"])
    (root / "ids.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    texts = [" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (n,),
                                                             generator=generator))
             for n in (3, 6, 4, 5, 2)]
    text_rows = [{"text": t, "label": i % NUM_LABELS} for i, t in enumerate(texts)]
    (root / "text.jsonl").write_text("".join(json.dumps(r) + "\n" for r in text_rows))

    net = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, NUM_LABELS))
    torch.save(net, root / "net.pt")
    x = torch.randn(20, 5, generator=generator)
    y = torch.randint(0, NUM_LABELS, (20,), generator=generator)
    torch.save((x, y), root / "tuple.pt")
    torch.save({"x": x, "y": y}, root / "dict.pt")
    torch.save(torch.utils.data.TensorDataset(x, y), root / "dataset.pt")
    regression = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 1))
    torch.save(regression, root / "regression.pt")
    torch.save((x, torch.randn(20, 1, generator=generator)), root / "regression_data.pt")
    return {"root": root, "bert": root / "bert", "bert_tok": root / "bert_tok",
            "ids": root / "ids.jsonl", "text": root / "text.jsonl", "net": root / "net.pt",
            "tuple": root / "tuple.pt", "dict": root / "dict.pt",
            "dataset": root / "dataset.pt", "regression": root / "regression.pt",
            "regression_data": root / "regression_data.pt", "rows": rows, "texts": text_rows}


def _run_json(arguments: list, out: Path) -> dict:
    code = main(["measure", *map(str, arguments), "--json", str(out), "--no-progress"])
    assert code == 0
    return json.loads(out.read_text())


def _load_bert(directory: Path) -> nn.Module:
    return transformers.BertForSequenceClassification.from_pretrained(
        directory, attn_implementation="eager").eval()


# ---------------------------------------------------------------------------- HF + JSONL
def test_measure_bert_pretokenised_jsonl(saved, tmp_path, capsys) -> None:
    document = _run_json([saved["bert"], saved["ids"], "--measure", "geodesic", "--measure",
                          "adaptive", "--rho", "0.1", "--n-iter", "3", "--batch-size", "4",
                          "--seed", "2"], tmp_path / "out.json")
    printed = capsys.readouterr().out
    assert "geodesic (inv, order 2)" in printed and "adaptive" in printed

    assert document["model_class"] == "BertForSequenceClassification"
    assert document["examples"] == 10 and document["batches"] == 3
    assert document["settings"]["measures"] == ["geodesic", "adaptive"]
    assert document["settings"]["rho"] == 0.1 and document["settings"]["n_iter"] == 3
    geodesic = document["results"]["geodesic"]
    assert geodesic["settings"]["metric"] == "inv" and geodesic["settings"]["order"] == 2
    assert geodesic["settings"]["gl_pairs"] == 2 * LAYERS * HEADS
    for name in ("geodesic", "adaptive"):
        result = document["results"][name]
        assert len(result["per_batch"]) == 3
        assert math.isclose(result["value"], sum(result["per_batch"]) / 3, rel_tol=1e-12)
        assert document["value"][name] == result["value"] and result["value"] > 0

    # clean loss of each batch: every example on its own, without padding, must agree
    model = _load_bert(saved["bert"])
    rows = saved["rows"]
    for index in range(3):
        chunk = rows[4 * index:4 * index + 4]
        with torch.no_grad():
            losses = [F.cross_entropy(model(input_ids=torch.tensor([r["input_ids"]])).logits,
                                      torch.tensor([r["label"]])) for r in chunk]
        expected = float(torch.stack(losses).mean())
        assert math.isclose(geodesic["clean_losses"][index], expected, rel_tol=1e-5)

    # the values: a direct library call on batches padded here
    batches = []
    for index in range(3):
        chunk = rows[4 * index:4 * index + 4]
        width = max(len(r["input_ids"]) for r in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for i, r in enumerate(chunk):
            ids[i, :len(r["input_ids"])] = torch.tensor(r["input_ids"])
            mask[i, :len(r["input_ids"])] = 1
        batches.append({"input_ids": ids, "attention_mask": mask,
                        "labels": torch.tensor([r["label"] for r in chunk])})
    direct = sharpness(model, batches, measure="geodesic", rho=0.1, n_iter=3, seed=2,
                       progress=False)
    assert direct.per_batch == pytest.approx(geodesic["per_batch"], rel=1e-6)


def test_measure_bert_text_rows_use_the_saved_tokenizer(saved, tmp_path) -> None:
    document = _run_json([saved["bert_tok"], saved["text"], "--measure", "worst_case",
                          "--measure", "relative_flatness", "--rho", "0.05", "--n-iter", "2",
                          "--batch-size", "2", "--max-batches", "2"], tmp_path / "out.json")
    assert document["data_kind"] == "text JSONL"
    assert document["batches"] == 2 and document["examples"] == 4
    assert len(document["results"]["relative_flatness"]["per_batch"]) == 2
    assert document["results"]["relative_flatness"]["settings"]["rho"] is None
    model = _load_bert(saved["bert_tok"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(saved["bert_tok"])
    for index in range(2):
        chunk = saved["texts"][2 * index:2 * index + 2]
        with torch.no_grad():
            losses = [F.cross_entropy(model(**tokenizer(r["text"], return_tensors="pt")).logits,
                                      torch.tensor([r["label"]])) for r in chunk]
        expected = float(torch.stack(losses).mean())
        clean = document["results"]["worst_case"]["clean_losses"][index]
        assert math.isclose(clean, expected, rel_tol=1e-5)


def test_text_rows_without_tokenizer_fail_clearly(saved, capsys) -> None:
    code = main(["measure", str(saved["bert"]), str(saved["text"]), "--rho", "0.1",
                 "--no-progress"])
    assert code == 2
    error = capsys.readouterr().err
    assert "no tokenizer" in error and "input_ids" in error


# ---------------------------------------------------------------------------- module + tensors
def test_measure_torch_module_on_tensor_files(saved, tmp_path) -> None:
    arguments = ["--measure", "average,worst_case", "--measure", "geodesic", "--rho", "0.05",
                 "--n-iter", "3", "--batch-size", "8", "--samples", "2"]
    documents = [_run_json([saved["net"], saved[kind], *arguments], tmp_path / f"{kind}.json")
                 for kind in ("tuple", "dict", "dataset")]
    def without_time(document: dict) -> dict:
        return {name: {k: v for k, v in result.items() if k != "seconds"}
                for name, result in document["results"].items()}

    for document in documents[1:]:
        assert without_time(document) == without_time(documents[0])
    document = documents[0]
    assert document["batches"] == 3 and document["examples"] == 20
    assert document["settings"]["measures"] == ["average", "worst_case", "geodesic"]
    # a Sequential of Linear layers has no symmetry: geodesic falls back to the adaptive block
    assert document["results"]["geodesic"]["settings"]["gl_pairs"] == 0

    net = torch.load(saved["net"], weights_only=False)
    x, y = torch.load(saved["tuple"])
    batches = [(x[i:i + 8], y[i:i + 8]) for i in (0, 8, 16)]
    with torch.no_grad():
        clean = [float(F.cross_entropy(net(bx), by)) for bx, by in batches]
    assert document["results"]["average"]["clean_losses"] == pytest.approx(clean, rel=1e-6)
    direct = sharpness(net, batches, measure="worst_case", rho=0.05, n_iter=3, progress=False)
    assert direct.per_batch == pytest.approx(document["results"]["worst_case"]["per_batch"],
                                             rel=1e-6)


def test_measure_mse_regression_with_max_batches(saved, tmp_path) -> None:
    document = _run_json([saved["regression"], saved["regression_data"], "--loss", "mse",
                          "--measure", "adaptive", "--rho", "0.1", "--n-iter", "2",
                          "--batch-size", "5", "--max-batches", "2", "--dtype", "float64"],
                         tmp_path / "out.json")
    result = document["results"]["adaptive"]
    assert document["batches"] == 2 and len(result["per_batch"]) == 2
    assert result["settings"]["loss"] == "mse" and result["settings"]["geometry_dtype"] == "float64"
    net = torch.load(saved["regression"], weights_only=False).double()
    x, y = torch.load(saved["regression_data"])
    with torch.no_grad():
        clean = [float(F.mse_loss(net(x[i:i + 5].double()), y[i:i + 5].double())) for i in (0, 5)]
    assert result["clean_losses"] == pytest.approx(clean, rel=1e-12)


# ---------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("case", [
    "missing model", "missing data", "unknown measure", "no rho", "bad rho", "bad order",
    "label out of range", "bad json", "no label", "not a module", "config without weights",
    "garbage data", "module and data do not fit", "float labels with cross-entropy",
    "one chain", "chains without an ascent measure",
])
def test_bad_input_gives_clear_error_and_exit_2(saved, tmp_path, capsys, case) -> None:
    root = saved["root"]
    bert, ids, net, pairs = (str(saved[k]) for k in ("bert", "ids", "net", "tuple"))
    rho = ["--rho", "0.1"]
    if case == "label out of range":
        (tmp_path / "d.jsonl").write_text('{"input_ids": [1, 2], "label": 7}\n')
    if case == "bad json":
        (tmp_path / "d.jsonl").write_text('{"input_ids": [1, 2], "label": 0}\nnot json\n')
    if case == "no label":
        (tmp_path / "d.jsonl").write_text('{"input_ids": [1, 2]}\n')
    if case == "config without weights":
        _bert_config().save_pretrained(tmp_path / "config_only")
    if case == "garbage data":
        (tmp_path / "garbage.pt").write_bytes(b"not a torch file at all")
    if case == "float labels with cross-entropy":
        (tmp_path / "d.jsonl").write_text('{"input_ids": [1, 2], "label": 0.5}\n')
    data = str(tmp_path / "d.jsonl")
    arguments, expected = {
        "missing model": ([str(root / "absent"), ids, *rho], "does not exist"),
        "missing data": ([bert, str(root / "absent.jsonl"), *rho], "does not exist"),
        "unknown measure": ([bert, ids, "--measure", "sharpest", *rho], "unknown measure"),
        "no rho": ([bert, ids], "--rho is required"),
        "bad rho": ([bert, ids, "--rho", "-1"], "--rho must be"),
        "bad order": ([bert, ids, "--order", "3", *rho], "--order must be"),
        "label out of range": ([bert, data, *rho], "not a class index"),
        "bad json": ([bert, data, *rho], "line 2: not valid JSON"),
        "no label": ([bert, data, *rho], "no 'label'"),
        "not a module": ([pairs, pairs, *rho], "not a torch.nn.Module"),
        "config without weights": ([str(tmp_path / "config_only"), ids, *rho], "config_only"),
        "garbage data": ([net, str(tmp_path / "garbage.pt"), *rho], "torch.save file"),
        "module and data do not fit": ([net, ids, *rho, "--n-iter", "1"], "failed"),
        "float labels with cross-entropy": ([bert, data, *rho], "--loss mse"),
        "one chain": ([bert, ids, *rho, "--chains", "1"], "--chains must be an integer >= 2"),
        "chains without an ascent measure": ([bert, ids, *rho, "--measure", "average",
                                              "--chains", "3"], "--chains needs an ascent"),
    }[case]
    code = main(["measure", *arguments, "--no-progress"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.startswith("quotientsharp measure: error:")
    assert expected in captured.err, captured.err
    assert captured.err.count("\n") == 1            # one line, no traceback


def test_a_module_whose_class_cannot_be_imported_gives_clear_error(saved, tmp_path, capsys,
                                                                   monkeypatch) -> None:
    # torch.save(module) pickles the class by its import path; where that module is not on the
    # path (a class defined in the saving script), loading must say so, not print a traceback
    (tmp_path / "saving_script_module.py").write_text(
        "import torch\n\nclass Tiny(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.linear = torch.nn.Linear(4, 3)\n\n"
        "    def forward(self, x):\n        return self.linear(x)\n")
    with monkeypatch.context() as patch:
        patch.syspath_prepend(str(tmp_path))
        import saving_script_module
        torch.save(saving_script_module.Tiny(), tmp_path / "tiny.pt")
    sys.modules.pop("saving_script_module")        # as in a new process: not importable
    torch.save((torch.randn(4, 4), torch.randint(0, 3, (4,))), tmp_path / "xy.pt")
    code = main(["measure", str(tmp_path / "tiny.pt"), str(tmp_path / "xy.pt"), "--rho", "0.1",
                 "--no-progress"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.startswith("quotientsharp measure: error: MODEL")
    assert "cannot be imported here" in captured.err and "saving_script_module" in captured.err
    assert captured.err.count("\n") == 1


def test_a_value_short_of_its_maximum_is_a_note_with_the_options_to_use(tmp_path, capsys
                                                                       ) -> None:
    # small value factors: the mix ball moves the output projection by many times its norm
    torch.manual_seed(0)
    model = nn.Sequential(nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, dropout=0.0),
                          nn.Flatten(), nn.Linear(24, 3))
    with torch.no_grad():
        model[0].self_attn.in_proj_weight[16:] *= 1e-3
    torch.save(model, tmp_path / "wide.pt")
    torch.save((torch.randn(8, 3, 8), torch.randint(0, 3, (8,))), tmp_path / "xy.pt")
    arguments = ["measure", str(tmp_path / "wide.pt"), str(tmp_path / "xy.pt"), "--measure",
                 "geodesic", "--metric", "mix", "--rho", "0.3", "--n-iter", "4", "--batch-size",
                 "8", "--no-progress", "--json", str(tmp_path / "out.json")]
    # filterwarnings = error: a ReachWarning escaping the command would fail here
    assert main([*arguments, "--chains", "3"]) == 0
    out = capsys.readouterr().out
    assert "note: geodesic (mix, order 2), batch 0: the ball is not local" in out
    assert "--chains 8 --n-iter 50" in out and "--order exact" in out
    result = json.loads((tmp_path / "out.json").read_text())["results"]["geodesic"]
    assert result["settings"]["reach"]["chains"] == 3
    assert 2 <= len(result["chains"][0]) <= 3
    assert result["locality"][0]["local"] is False
    # the bound on the value's rounding: 64 units in the last place of its larger float32 loss
    larger = max(result["clean_losses"][0], result["perturbed_losses"][0])
    assert result["rounding"] == [64 * torch.finfo(torch.float32).eps * larger]


def test_argument_type_errors_exit_through_argparse(saved, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["measure", str(saved["bert"]), str(saved["ids"]), "--batch-size", "many"])
    assert info.value.code == 2
    assert "--batch-size" in capsys.readouterr().err


# ---------------------------------------------------------------------------- other commands
def test_verify_exits_zero(capsys) -> None:
    assert main(["verify", "--seeds", "1", "--dtype", "float64"]) == 0
    assert " 0 failed" in capsys.readouterr().out


def test_symmetries_of_a_saved_config(tmp_path, capsys) -> None:
    _bert_config().save_pretrained(tmp_path / "cfg")
    for target in (tmp_path / "cfg", tmp_path / "cfg" / "config.json"):
        assert main(["symmetries", str(target)]) == 0
        text = capsys.readouterr().out
        assert f"{2 * LAYERS * HEADS} GL(h) pairs" in text
        assert "every attention-like module was understood" in text
    assert main(["symmetries", str(tmp_path / "cfg"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    head_dim = HIDDEN // HEADS
    assert report["gl_count"] == 2 * LAYERS * HEADS
    assert report["group_dimension"] == 2 * LAYERS * HEADS * head_dim ** 2
    shapes = {(b["n"], b["m"], b["h"]): b["pairs"] for b in report["buckets"]}
    # bias rows appended: qk (d + 1) x d_k on both sides, vo (d + 1) x d_v and d x d_v
    assert shapes == {(HIDDEN + 1, HIDDEN + 1, head_dim): LAYERS * HEADS,
                      (HIDDEN + 1, HIDDEN, head_dim): LAYERS * HEADS}
    assert main(["symmetries", str(tmp_path / "absent")]) == 2


def _measure(saved, *arguments: str) -> int:
    # --n-iter only with an ascent measure (the default geodesic included): else it is refused
    measures = arguments[arguments.index("--measure") + 1] if "--measure" in arguments else ""
    steps = ["--n-iter", "2"] if not measures or {"worst_case", "adaptive", "geodesic"} & set(
        measures.split(",")) else []
    return main(["measure", str(saved["net"]), str(saved["data"]), "--rho", "0.1", *steps,
                 "--batch-size", "4", "--no-progress", *arguments])


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:3", "nonsense", "meta"])
def test_measure_on_an_unavailable_device_is_one_line_and_exit_2(saved_mlp, capsys, device):
    assert _measure(saved_mlp, "--device", device) == 2
    err = capsys.readouterr().err
    assert err.startswith("quotientsharp measure: error: --device") and err.count("\n") == 1


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
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


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
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


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_one_geodesic_variant_keeps_the_plain_key(saved_mlp, tmp_path):
    out = tmp_path / "out.json"
    assert _measure(saved_mlp, "--metric", "mix", "--json", str(out)) == 0
    document = json.loads(out.read_text())
    assert list(document["results"]) == ["geodesic"]
    assert document["settings"]["metric"] == "mix" and document["settings"]["order"] == 2


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_bad_metric_in_a_list_is_named(saved_mlp, capsys):
    assert _measure(saved_mlp, "--metric", "mix,riemann") == 2
    assert "'riemann'" in capsys.readouterr().err


def test_measure_names_of_the_command_line_are_the_engines():
    # the command line keeps its own torch-free list of measures: the names it accepts and
    # offers in its error must be those of the engine's registry
    from quotientsharp.engine import MEASURES
    from quotientsharp.workflows.options import InputError, measure_names

    assert measure_names(",".join(MEASURES)) == list(MEASURES)
    with pytest.raises(InputError, match="choose from") as error:
        measure_names("nonexistent")
    offered = str(error.value).split("choose from ")[1].split(", ")
    assert set(offered) == set(MEASURES)


# ---------------------------------------------------------------------------- the --json output
def _one_line_error(capsys, *needles: str) -> str:
    """The command's stderr: one line ``quotientsharp measure: error: ...`` with every needle,
    and nothing on stdout (it failed before measuring)."""
    captured = capsys.readouterr()
    assert captured.err.startswith("quotientsharp measure: error: "), captured.err
    assert captured.err.count("\n") == 1, captured.err
    for needle in needles:
        assert needle in captured.err, captured.err
    assert captured.out == "", captured.out
    return captured.err


@pytest.mark.parametrize("target", ["net", "data", "symlink to data", "hard link to data"])
def test_json_onto_the_model_or_the_data_is_refused_and_leaves_them_intact(saved_mlp, tmp_path,
                                                                         capsys, target):
    model, data = saved_mlp["net"], saved_mlp["data"]
    before = {path: path.read_bytes() for path in (model, data)}
    out = {"net": model, "data": data}.get(target, tmp_path / "link.pt")
    if target == "symlink to data":
        out.symlink_to(data)
    if target == "hard link to data":
        os.link(data, out)
    assert _measure(saved_mlp, "--measure", "adaptive", "--json", str(out)) == 2
    role = "MODEL" if target == "net" else "DATA"
    _one_line_error(capsys, f"--json {out}", f"the same file as {role}")
    assert {path: path.read_bytes() for path in (model, data)} == before


def test_json_inside_a_model_directory_is_refused(saved, tmp_path, capsys):
    before = sorted(path.name for path in saved["bert"].iterdir())
    for out in (saved["bert"] / "config.json", saved["bert"] / "runs" / "out.json"):
        code = main(["measure", str(saved["bert"]), str(saved["ids"]), "--rho", "0.1",
                     "--no-progress", "--json", str(out)])
        assert code == 2
        _one_line_error(capsys, f"--json {out}", "MODEL")
    assert sorted(path.name for path in saved["bert"].iterdir()) == before


@pytest.mark.parametrize("command", ["measure", "verify"])
def test_json_onto_a_fifo_is_refused_and_the_fifo_stays(saved_mlp, tmp_path, capsys, command):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    if command == "measure":
        code = _measure(saved_mlp, "--json", str(fifo))
    else:
        code = main(["verify", "--seeds", "1", "--dtype", "float64", "--json", str(fifo)])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.startswith(f"quotientsharp {command}: error: --json {fifo} ")
    assert "FIFO" in captured.err and captured.err.count("\n") == 1
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_bad_json_paths_are_one_line_naming_json_before_measuring(saved_mlp, tmp_path, capsys):
    folder = tmp_path / "folder"
    folder.mkdir()
    data = saved_mlp["data"]
    for out, needle in (("", "--json needs a file path, got ''"),
                        (str(folder), f"--json {folder} is a folder"),
                        (f"{data}/out.json", f"--json {data}/out.json: {data} is a file"),
                        (f"{data}/deeper/out.json", f"{data} is a file, not a folder")):
        assert _measure(saved_mlp, "--json", out) == 2, out
        _one_line_error(capsys, needle)
    assert list(folder.iterdir()) == []


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_json_in_a_folder_where_no_file_can_be_made_names_the_folder(saved_mlp, capsys):
    assert _measure(saved_mlp, "--json", "/proc/out.json") == 2
    error = _one_line_error(capsys, "--json /proc/out.json", "folder /proc")
    assert "another process" not in error


def test_json_in_a_missing_folder_is_written_there(saved_mlp, tmp_path, capsys):
    out = tmp_path / "new" / "folder" / "out.json"
    assert _measure(saved_mlp, "--measure", "adaptive", "--json", str(out)) == 0
    document = json.loads(out.read_text())
    settings = document["settings"]
    # the options left out: the defaults the settings applied, not None
    assert (settings["p"], settings["eps"], settings["samples"]) == ("2", 0.0, 1)
    assert settings["nonfinite"] == "raise" and document["warnings"] == []
    assert not any(path.name.startswith(".quotientsharp-probe") for path in out.parent.iterdir())


# ---------------------------------------------------------------------------- options given in vain
@pytest.mark.parametrize("measures, option, needs", [
    ("geodesic", ["--p", "inf"], "worst_case and adaptive"),
    ("geodesic", ["--p", "2"], "worst_case and adaptive"),       # given, if to its default
    ("adaptive", ["--metric", "mix"], "geodesic"),
    ("adaptive", ["--order", "exact"], "geodesic"),
    ("average,worst_case", ["--eps", "0.1"], "geodesic"),
    ("adaptive", ["--symmetry", "mine:bind"], "geodesic"),
    ("adaptive,geodesic", ["--samples", "4"], "average"),
    ("average", ["--layer", "0"], "relative_flatness"),
])
def test_an_option_of_measures_not_measured_is_refused(saved_mlp, capsys, measures, option,
                                                       needs):
    assert _measure(saved_mlp, "--measure", measures, *option) == 2
    _one_line_error(capsys, f"{option[0]} applies to {needs} only",
                    f"--measure gives {measures.replace(',', ', ')}")


@pytest.mark.parametrize("measures, option, message", [
    ("relative_flatness", ["--rho", "0.1"], "--rho applies to every measure but "
     "relative_flatness, and --measure gives relative_flatness only"),
    ("average", ["--rho", "0.1", "--n-iter", "20"],          # given, if to its default
     "--n-iter needs an ascent measure (worst_case, adaptive or geodesic); --measure gives "
     "average"),
    ("average,relative_flatness", ["--rho", "0.1", "--n-iter", "5"],
     "--n-iter needs an ascent measure"),
])
def test_a_radius_or_steps_no_measure_takes_are_refused(saved_mlp, capsys, measures, option,
                                                       message):
    # each was ignored with exit status 0, where quotientsharp.sharpness refuses them
    arguments = [str(saved_mlp["net"]), str(saved_mlp["data"]), "--batch-size", "4",
                 "--no-progress", "--measure", measures]
    assert main(["measure", *arguments, *option]) == 2
    _one_line_error(capsys, message)
    rho = [] if measures == "relative_flatness" else ["--rho", "0.1"]
    assert main(["measure", *arguments, *rho]) == 0


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_the_options_of_the_measures_measured_are_taken(saved_mlp, tmp_path):
    out = tmp_path / "out.json"
    assert _measure(saved_mlp, "--measure", "average,worst_case,geodesic,relative_flatness",
                    "--samples", "2", "--p", "inf", "--eps", "0.01", "--order", "1",
                    "--layer", "2", "--json", str(out)) == 0
    results = json.loads(out.read_text())["results"]
    assert results["average"]["settings"]["samples"] == 2
    assert results["worst_case"]["settings"]["p"] == "inf"
    assert results["geodesic"]["settings"]["eps"] == 0.01
    assert results["geodesic"]["settings"]["order"] == 1


# ---------------------------------------------------------------------------- --nonfinite
@pytest.fixture(scope="module")
def overflowing(tmp_path_factory) -> dict[str, Path]:
    """A float16 MLP on inputs so large that some (not all) Gaussian draws of radius 10
    overflow float16 in the forward."""
    root = tmp_path_factory.mktemp("overflow")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 3)).half()
    torch.save(net, root / "half.pt")
    generator = torch.Generator().manual_seed(0)
    torch.save(((30 * torch.randn(6, 4, generator=generator)).half(),
                torch.randint(0, 3, (6,), generator=generator)), root / "data.pt")
    return {"net": root / "half.pt", "data": root / "data.pt"}


def test_nonfinite_skip_on_the_command_line_keeps_the_finite_draws(overflowing, tmp_path,
                                                                  capsys):
    arguments = ["measure", str(overflowing["net"]), str(overflowing["data"]), "--measure",
                 "average", "--rho", "10", "--samples", "16", "--no-progress"]
    assert main(arguments) == 2
    error = capsys.readouterr().err
    assert "not finite" in error and "--nonfinite skip" in error and error.count("\n") == 1
    out = tmp_path / "out.json"
    assert main([*arguments, "--nonfinite", "skip", "--json", str(out)]) == 0
    printed = capsys.readouterr()
    assert "UserWarning" not in printed.err
    document = json.loads(out.read_text())
    result = document["results"]["average"]
    assert document["settings"]["nonfinite"] == "skip"
    assert result["settings"]["nonfinite"] == "skip" and math.isfinite(result["value"])
    skipped = [note for note in printed.out.splitlines() if "were skipped" in note]
    assert len(skipped) == 1 and skipped[0].startswith("note: ")
    assert document["warnings"] == [skipped[0].removeprefix("note: ")]


def test_nonfinite_takes_raise_or_skip_only(saved_mlp, capsys):
    with pytest.raises(SystemExit) as info:
        _measure(saved_mlp, "--nonfinite", "ignore")
    assert info.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("quotientsharp measure: error: argument --nonfinite")
    assert error.count("\n") == 1


# ---------------------------------------------------------------------------- warnings as notes
@pytest.fixture(scope="module")
def fresh_adapter(tmp_path_factory) -> dict[str, Path]:
    """A PEFT LoRA adapter saved right after ``get_peft_model`` (B = 0: degenerate), its tiny
    BERT base beside it, and token data."""
    peft = pytest.importorskip("peft")
    root = tmp_path_factory.mktemp("fresh-lora")
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, vocab_size=40,
                                     max_position_embeddings=16, attn_implementation="eager")
    transformers.BertModel(config).save_pretrained(root / "base")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # the untrained classification head
        model = transformers.AutoModelForSequenceClassification.from_pretrained(
            root / "base", num_labels=3, attn_implementation="eager")
        model = peft.get_peft_model(model, peft.LoraConfig(
            task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["query", "value"]))
    model.save_pretrained(root / "adapter")
    generator = torch.Generator().manual_seed(0)
    torch.save((torch.randint(0, 40, (4, 6), generator=generator),
                torch.randint(0, 3, (4,), generator=generator)), root / "data.pt")
    return {"adapter": root / "adapter", "data": root / "data.pt"}


def _without_warnings(arguments: list[str], capsys) -> tuple[int, str, str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(arguments)
    captured = capsys.readouterr()
    assert [str(w.message) for w in caught] == []
    assert "UserWarning" not in captured.err
    return code, captured.out, captured.err


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_a_degenerate_adapter_is_a_note_of_measure_not_a_warning(fresh_adapter, capsys):
    code, out, err = _without_warnings(
        ["measure", str(fresh_adapter["adapter"]), str(fresh_adapter["data"]), "--rho", "0.1",
         "--n-iter", "2", "--measure", "geodesic,adaptive", "--no-progress"], capsys)
    assert code == 0, err
    notes = [line for line in out.splitlines() if "LoRA adapter(s) are degenerate" in line]
    # once, though each measure finds the symmetries again
    assert len(notes) == 1 and notes[0].startswith("note: 2 LoRA adapter(s) are degenerate")


def test_a_degenerate_adapter_is_in_the_symmetries_report_not_a_warning(fresh_adapter, capsys):
    code, out, err = _without_warnings(["symmetries", str(fresh_adapter["adapter"])], capsys)
    assert code == 0 and err == ""
    assert "note: 2 degenerate LoRA adapter(s)" in out
    code, out, err = _without_warnings(["symmetries", str(fresh_adapter["adapter"]), "--json"],
                                       capsys)
    report = json.loads(out)                    # stdout is the JSON alone
    assert code == 0 and err == ""
    assert {adapter["status"] for adapter in report["adapters"]} == {"degenerate"}
    assert any("degenerate LoRA adapter(s)" in note for note in report["notes"])



@pytest.mark.parametrize("measures, advice", [
    ("adaptive", "use a smaller --rho"),
    ("adaptive,worst_case", "use --measure adaptive (its ball moves every weight in proportion "
                            "to its size), or a smaller --rho")])
def test_the_locality_advice_names_only_options_the_measures_take(
        tmp_path, capsys, measures: str, advice: str) -> None:
    # --order and --metric are refused without geodesic: advising them for a far adaptive or
    # worst-case ball sent the user to an error
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3)).double()
    torch.save(model, tmp_path / "net.pt")
    torch.save((torch.randn(8, 6, dtype=torch.float64), torch.randint(0, 3, (8,))),
               tmp_path / "xy.pt")
    assert main(["measure", str(tmp_path / "net.pt"), str(tmp_path / "xy.pt"), "--measure",
                 measures, "--rho", "50", "--n-iter", "3", "--batch-size", "8",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "the ball is not local" in out
    assert f"where the ball is not local, {advice} (docs/sharpness.md" in out
    assert "--order exact" not in out and "--metric" not in out


def test_the_table_never_prints_a_reach_higher_than_it_is() -> None:
    # the lowest reach is a lower bound: 0.99996 rounded would read 1.000, and 0.98951, which
    # the note flags as below 0.99, would read 0.990
    from quotientsharp.cli.measure import results_table
    for reach, shown in ((0.99996, "0.999"), (0.98951, "0.989")):
        result = qs.SharpnessResult(measure="adaptive", value=1.0, per_batch=[1.0],
                                    settings={"rho": 0.1}, perturbation_norms=[{"total": 0.1}],
                                    clean_losses=[2.0], reach=[1.0, reach],
                                    evaluations=[8, 8])
        row = results_table([("adaptive", result, 1.0)]).splitlines()[-1]
        assert row.split()[-3] == shown


def test_nonfinite_with_relative_flatness_alone_is_refused(saved_mlp, capsys):
    # relative flatness perturbs nothing: --nonfinite skip was accepted and changed nothing
    assert main(["measure", str(saved_mlp["net"]), str(saved_mlp["data"]), "--measure",
                 "relative_flatness", "--nonfinite", "skip", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("quotientsharp measure: error: --nonfinite applies to average, "
                          "worst_case, adaptive and geodesic only") and err.count("\n") == 1


def test_a_value_within_its_rounding_gets_no_advice_to_search_longer(saved_mlp, capsys) -> None:
    # the note under the table advised "search longer" for any shortfall, though a value within
    # the rounding of its losses has a reach of 1.000 and advice of its own (a finer dtype)
    assert main(["measure", str(saved_mlp["net"]), str(saved_mlp["data"]), "--measure",
                 "adaptive", "--rho", "1e-7", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "is not resolved to 1 %" in printed and "search longer" not in printed
