"""A saved PEFT LoRA adapter directory is read as PEFT reads it, by every command.

A tiny BERT base is saved with ``save_pretrained``; a sequence-classification LoRA on it
(``task_type="SEQ_CLS"``, its classifier in ``modules_to_save``) is trained a few steps, so
``B != 0``, and saved with ``save_pretrained``. ``symmetries``, ``measure`` and ``study`` on the
directory must give what they give on the in-memory model (``torch.save``'d): the same
symmetries, the same sharpness values. A fresh adapter (``B = 0``) is degenerate, not a pair;
a directory whose saved values do not load is refused, never measured with fresh values.
Nothing reaches the network: a base model that is not a local directory fails at once, in one
line that says how the path is read; a damaged adapter file is named.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import shutil
import socket
import warnings
from pathlib import Path

import pytest
import torch

from quotientsharp.cli import main
from quotientsharp.cli.symmetries import report_to_dict
from quotientsharp.models import find_symmetries
from quotientsharp.models.loading import load_model
from quotientsharp.models.peft_loading import load_peft_directory
from quotientsharp.workflows.saved_models import load_measured_model

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
safetensors_torch = pytest.importorskip("safetensors.torch")

OPTIONS = ["--rho", "0.1", "--n-iter", "3", "--batch-size", "8", "--no-progress"]


def _call(*arguments: object) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main([*map(str, arguments)])
    return code, stdout.getvalue(), stderr.getvalue()


def _lora(base: Path, steps: int) -> torch.nn.Module:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForSequenceClassification.from_pretrained(
            base, num_labels=3, attn_implementation="eager")
        model = peft.get_peft_model(model, peft.LoraConfig(
            task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["query", "value"]))
    optimiser = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        ids = torch.randint(0, 40, (8, 10), generator=generator)
        labels = torch.randint(0, 3, (8,), generator=generator)
        model(input_ids=ids, labels=labels).loss.backward()
        optimiser.step()
        optimiser.zero_grad()
    return model.eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """``base/`` (a tiny BertModel), ``adapter/`` (trained), ``fresh/`` (B = 0), the trained
    in-memory model as ``model.pt``, and token data ``data.pt``."""
    root = tmp_path_factory.mktemp("peft")
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, vocab_size=40,
                                     max_position_embeddings=16, initializer_range=0.3,
                                     attn_implementation="eager")
    transformers.BertModel(config).save_pretrained(root / "base")
    trained = _lora(root / "base", steps=4)
    assert any(float(p.detach().abs().max()) > 0 for n, p in trained.named_parameters()
               if "lora_B" in n)
    trained.save_pretrained(root / "adapter")
    torch.save(trained, root / "model.pt")
    _lora(root / "base", steps=0).save_pretrained(root / "fresh")
    generator = torch.Generator().manual_seed(2)
    torch.save((torch.randint(0, 40, (16, 10), generator=generator),
                torch.randint(0, 3, (16,), generator=generator)), root / "data.pt")
    return root


def test_symmetries_of_the_directory_are_those_of_the_in_memory_model(saved):
    code, stdout, stderr = _call("symmetries", saved / "adapter", "--json")
    assert code == 0, stderr
    in_memory = report_to_dict(find_symmetries(torch.load(saved / "model.pt",
                                                          weights_only=False)))
    assert json.loads(stdout) == json.loads(json.dumps(in_memory))
    assert [a["status"] for a in json.loads(stdout)["adapters"]] == ["pair"] * 4
    assert "classifier" in stdout                  # the head is loaded, not dropped


def test_a_fresh_saved_adapter_is_degenerate(saved):
    # the command says it once, as a note of its report, not as a raw Python warning too
    code, stdout, stderr = _call("symmetries", saved / "fresh", "--json")
    assert code == 0, stderr
    assert stderr == ""
    report = json.loads(stdout)
    assert {a["status"] for a in report["adapters"]} == {"degenerate"}
    assert any("degenerate LoRA adapter(s)" in note for note in report["notes"])


def test_measure_of_the_directory_equals_the_in_memory_model(saved, tmp_path):
    values = []
    for model in (saved / "adapter", saved / "model.pt"):
        out = tmp_path / f"{model.stem}.json"
        code, _, stderr = _call("measure", model, saved / "data.pt", *OPTIONS, "--measure",
                                "adaptive,geodesic", "--metric", "mix", "--json", out)
        assert code == 0, stderr
        values.append({k: r["value"] for k, r in json.loads(out.read_text())["results"].items()})
    assert values[0] == values[1]
    assert len(values[0]) == 2


def test_study_value_of_the_directory_equals_the_in_memory_model(saved, tmp_path):
    (tmp_path / "models.csv").write_text(f"name,model,gap\ndir,{saved / 'adapter'},0.1\n"
                                         f"file,{saved / 'model.pt'},0.2\n")
    code, _, stderr = _call("study", tmp_path / "models.csv", "--data", saved / "data.pt",
                            *OPTIONS, "--measure", "geodesic", "--metric", "mix",
                            "--bootstrap", "0", "--no-plots", "--out", tmp_path / "out")
    assert code == 0, stderr
    with (tmp_path / "out" / "models.csv").open() as handle:
        rows = {row["name"]: row for row in csv.DictReader(handle)}
    keys = [k for k in rows["dir"] if k.startswith("geodesic")]
    assert keys and all(rows["dir"][k] == rows["file"][k] for k in keys)


def test_resume_after_the_adapters_base_changed_refuses(saved, tmp_path):
    # the adapter's folder is unchanged, but its values are of the base it is measured on
    base, adapter = tmp_path / "base", tmp_path / "adapter"
    shutil.copytree(saved / "base", base)
    shutil.copytree(saved / "adapter", adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps(
        {**config, "base_model_name_or_path": str(base)}))
    (tmp_path / "models.csv").write_text(f"name,model,gap\nadapter,{adapter},0.1\n"
                                         f"file,{saved / 'model.pt'},0.2\n")
    command = ["study", tmp_path / "models.csv", "--data", saved / "data.pt", *OPTIONS,
               "--measure", "adaptive", "--bootstrap", "0", "--no-plots",
               "--out", tmp_path / "out"]
    code, _, stderr = _call(*command)
    assert code == 0, stderr
    code, stdout, stderr = _call(*command, "--resume")
    assert code == 0 and "measured now: 0" in stdout, stderr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.BertModel.from_pretrained(base)
    with torch.no_grad():
        model.embeddings.word_embeddings.weight.mul_(2.0)     # retrained in place
    model.save_pretrained(base)
    code, _, stderr = _call(*command, "--resume")
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert "record of 'adapter'" in stderr and "base model of the adapter" in stderr


def test_loading_the_directory_raises_no_warning(saved):
    from quotientsharp.workflows.saved_models import load_measured_model

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = load_measured_model(saved / "adapter")
    assert type(model.base_model.model).__name__ == "BertForSequenceClassification"


def test_values_that_do_not_load_are_refused_by_every_command(saved, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_bytes(
        (saved / "adapter" / "adapter_config.json").read_bytes())
    tensors = safetensors_torch.load_file(str(saved / "adapter" / "adapter_model.safetensors"))
    dropped = next(k for k in tensors if "lora_B" in k)
    del tensors[dropped]
    safetensors_torch.save_file(tensors, str(broken / "adapter_model.safetensors"))
    code, _, stderr = _call("symmetries", broken)
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert "do not load" in stderr and "missing" in stderr
    code, _, stderr = _call("measure", broken, saved / "data.pt", *OPTIONS)
    assert code == 2 and "do not load" in stderr, stderr


class NetworkUsed(BaseException):
    """Raised where a test's code reaches for the network: no retry loop catches it."""


@pytest.fixture
def no_network(monkeypatch) -> list[tuple]:
    """Every attempt to resolve a host name or open a connection, recorded and refused at once;
    with ``HF_HUB_OFFLINE=0``, so that only the code under test keeps a load offline."""
    attempts: list[tuple] = []

    def refuse(*arguments: object, **keywords: object) -> None:
        attempts.append(arguments)
        raise NetworkUsed(f"network access: {arguments!r}")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    return attempts


def _with_base(saved: Path, target: Path, base: str) -> Path:
    """A copy of the trained adapter in ``target`` whose adapter_config.json names ``base``."""
    shutil.copytree(saved / "adapter", target)
    settings = json.loads((target / "adapter_config.json").read_text())
    settings["base_model_name_or_path"] = base
    (target / "adapter_config.json").write_text(json.dumps(settings))
    return target


@pytest.mark.parametrize("base", ["bert-base-uncased", "no/such/base", "../base"])
def test_a_base_that_is_no_local_directory_fails_at_once_offline(saved, tmp_path, monkeypatch,
                                                                 no_network, base):
    adapter = _with_base(saved, tmp_path / "work" / "adapter", base)
    shutil.copytree(saved / "base", tmp_path / "work" / "base")   # ../base from the adapter
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)       # relative paths are read from here, as PEFT reads them
    for command in (["symmetries", adapter], ["measure", adapter, saved / "data.pt", *OPTIONS]):
        code, _, stderr = _call(*command)
        assert code == 2 and stderr.count("\n") == 1, stderr
        assert f"error: MODEL {adapter}: adapter_config.json names the base model {base!r}" \
            in stderr
        assert f"current working directory, {elsewhere}" in stderr
        assert "set base_model_name_or_path to the local directory" in stderr
        assert (f"from the adapter's folder it is {(tmp_path / 'work' / 'base').resolve()}"
                in stderr) == (base == "../base")
    with pytest.raises(FileNotFoundError, match="Hub names are never downloaded"):
        load_peft_directory(adapter, weights=True)
    assert no_network == []


def test_discovery_needs_only_the_base_config_beside_the_adapter(saved, tmp_path, no_network):
    adapter = _with_base(saved, tmp_path / "adapter", "bert-base-uncased")
    shutil.copy(saved / "base" / "config.json", adapter / "config.json")
    code, stdout, stderr = _call("symmetries", adapter, "--json")
    assert code == 0, stderr
    code, expected, stderr = _call("symmetries", saved / "adapter", "--json")
    assert code == 0, stderr
    assert json.loads(stdout) == json.loads(expected)
    code, _, stderr = _call("measure", adapter, saved / "data.pt", *OPTIONS)
    assert code == 2 and "bert-base-uncased" in stderr, stderr   # measuring needs the weights
    assert no_network == []


def test_loading_a_saved_adapter_reaches_no_network(saved, no_network):
    model = load_measured_model(saved / "adapter")
    assert type(model.base_model.model).__name__ == "BertForSequenceClassification"
    assert isinstance(load_model(saved / "adapter"), peft.PeftModel)
    assert no_network == []


def test_an_adapter_saved_as_bin_loads_the_same_values(saved, tmp_path):
    adapter = tmp_path / "adapter"
    shutil.copytree(saved / "adapter", adapter)
    tensors = safetensors_torch.load_file(str(adapter / "adapter_model.safetensors"))
    (adapter / "adapter_model.safetensors").unlink()
    torch.save(tensors, adapter / "adapter_model.bin")
    # the base has no classifier: PEFT keeps a fresh one as modules_to_save's original_module
    torch.manual_seed(0)
    loaded = load_measured_model(adapter).state_dict()
    torch.manual_seed(0)
    reference = load_measured_model(saved / "adapter").state_dict()
    assert loaded.keys() == reference.keys()
    assert all(torch.equal(loaded[k], reference[k]) for k in loaded)


@pytest.mark.parametrize("damage", ["config", "safetensors", "bin"])
def test_a_damaged_adapter_file_is_named(saved, tmp_path, damage):
    adapter = tmp_path / "adapter"
    shutil.copytree(saved / "adapter", adapter)
    weights = adapter / "adapter_model.safetensors"
    if damage == "config":
        named = adapter / "adapter_config.json"
        named.write_text("{'peft_type': 'LORA'}")
    elif damage == "safetensors":
        named = weights
        weights.write_bytes(weights.read_bytes()[:100])
    else:
        named = adapter / "adapter_model.bin"
        weights.unlink()
        named.write_text("a,b\n1,2\n")
    for command in (["symmetries", adapter], ["measure", adapter, saved / "data.pt", *OPTIONS]):
        code, _, stderr = _call(*command)
        assert code == 2 and stderr.count("\n") == 1, stderr
        assert f"error: MODEL {named} " in stderr, stderr


def _drawn_and_saved(model: torch.nn.Module, target: Path) -> torch.nn.Module:
    """``model`` with its trainable tensors drawn from N(0, 0.3^2) (adapter factors with
    B != 0, a head), saved in ``target``, in eval mode."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.normal_(0.0, 0.3)
    model.save_pretrained(target)
    return model.eval()


def _saved_lora(saved: Path, target: Path, **settings: object) -> torch.nn.Module:
    """A LoRA of ``settings`` on a 3-label classifier of the saved base, its factors drawn
    (B != 0), saved in ``target``; the in-memory model is returned."""
    torch.manual_seed(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForSequenceClassification.from_pretrained(
            saved / "base", num_labels=3, attn_implementation="eager")
        model = peft.get_peft_model(model, peft.LoraConfig(
            r=4, lora_alpha=8, target_modules=["query", "value"], **settings))
    return _drawn_and_saved(model, target)


def _logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.randint(0, 40, (4, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_a_classifier_neither_in_the_base_nor_saved_is_refused(saved, tmp_path):
    # no task_type: PEFT saves no classifier, and the base (a BertModel) has none either
    _saved_lora(saved, tmp_path / "adapter")
    code, _, stderr = _call("measure", tmp_path / "adapter", saved / "data.pt", *OPTIONS)
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert "classifier.weight" in stderr and "freshly initialised" in stderr
    assert "modules_to_save" in stderr
    code, _, stderr = _call("symmetries", tmp_path / "adapter")     # the structure is known
    assert code == 0, stderr


def test_a_head_beside_other_modules_to_save_keeps_its_labels(saved, tmp_path):
    # PEFT writes modules_to_save = ["pooler.dense", "classifier", "score"]: the labels are the
    # classifier's rows (3), not the pooler's (16)
    model = _saved_lora(saved, tmp_path / "adapter", task_type="SEQ_CLS",
                        modules_to_save=["pooler.dense"])
    torch.manual_seed(0)
    loaded = load_measured_model(tmp_path / "adapter")
    assert torch.equal(_logits(loaded), _logits(model))


@pytest.mark.parametrize(("key", "value", "named"), [
    ("r", 8, "size mismatch"), ("target_modules", ["nowhere"], "No modules were targeted"),
    ("modules_to_save", None, "size mismatch")])
def test_an_edited_adapter_config_that_does_not_fit_is_named(saved, tmp_path, key, value, named):
    adapter = tmp_path / "adapter"
    shutil.copytree(saved / "adapter", adapter)
    settings = json.loads((adapter / "adapter_config.json").read_text())
    settings[key] = value
    (adapter / "adapter_config.json").write_text(json.dumps(settings))
    for command in (["symmetries", adapter], ["measure", adapter, saved / "data.pt", *OPTIONS]):
        code, _, stderr = _call(*command)
        assert code == 2 and stderr.count("\n") == 1, stderr
        assert f"error: MODEL {adapter}: adapter 'default' does not fit" in stderr
        assert named in stderr and "adapter_config.json" in stderr


def _classifier_base(saved: Path, target: Path, labels: int, head: str = "seq") -> Path:
    """The saved base with a head of its own (drawn), saved with save_pretrained in
    ``target``: a classifier of ``labels`` labels, or (``head="mlm"``) a masked-LM head."""
    torch.manual_seed(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load = (transformers.BertForMaskedLM if head == "mlm"
                else transformers.AutoModelForSequenceClassification)
        model = load.from_pretrained(saved / "base", attn_implementation="eager",
                                     **({} if head == "mlm" else {"num_labels": labels}))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.startswith(("classifier", "cls")):
                parameter.normal_(0.0, 0.3)
    model.save_pretrained(target)
    return target


def _lora_on(base: Path, target: Path, labels: int, **settings: object) -> torch.nn.Module:
    """A sequence-classification LoRA of ``labels`` labels on the saved ``base`` (its head
    rebuilt when the base's has another number of labels, as fine-tuning does), factors
    drawn, saved in ``target``; the in-memory model is returned."""
    torch.manual_seed(6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForSequenceClassification.from_pretrained(
            base, num_labels=labels, ignore_mismatched_sizes=True, attn_implementation="eager")
        model = peft.get_peft_model(model, peft.LoraConfig(
            task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["query", "value"],
            **settings))
    return _drawn_and_saved(model, target)


def test_a_head_of_other_labels_than_the_base_s_is_read_from_the_adapter(saved, tmp_path):
    # the base is a 2-label classifier, the adapter's saved head has 3 labels: transformers
    # refused the base's head ("ignore_mismatched_sizes", pointing at a silenced report)
    base = _classifier_base(saved, tmp_path / "base", labels=2)
    model = _lora_on(base, tmp_path / "adapter", labels=3)
    loaded = load_measured_model(tmp_path / "adapter")
    assert loaded.base_model.model.config.num_labels == 3
    assert torch.equal(_logits(loaded), _logits(model))
    code, _, stderr = _call("measure", tmp_path / "adapter", saved / "data.pt", *OPTIONS)
    assert code == 0 and stderr == "", stderr


def test_a_base_whose_config_drops_saved_layers_is_refused(saved, tmp_path):
    # the base's config.json edited to one layer: the adapter (on layer 0 only) fits, and the
    # base's layer-1 weights were dropped, measuring a one-layer model with exit status 0
    base = _classifier_base(saved, tmp_path / "base", labels=3)
    settings = json.loads((base / "config.json").read_text())
    settings["num_hidden_layers"] = 1
    (base / "config.json").write_text(json.dumps(settings))
    _lora_on(base, tmp_path / "adapter", labels=3, layers_to_transform=[0])
    code, _, stderr = _call("measure", tmp_path / "adapter", saved / "data.pt", *OPTIONS)
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert f"error: MODEL {tmp_path / 'adapter'}: the weights of the base model" in stderr
    assert "bert.encoder.layer.1." in stderr and "config.json" in stderr


def test_a_base_saved_with_another_task_s_head_loads(saved, tmp_path):
    # the masked-LM head (cls.predictions) has no place in a classifier: dropped, as PEFT does
    # (the masked LM has no pooler: the adapter saves the one it was trained with)
    base = _classifier_base(saved, tmp_path / "base", labels=3, head="mlm")
    model = _lora_on(base, tmp_path / "adapter", labels=3, modules_to_save=["pooler.dense"])
    assert torch.equal(_logits(load_measured_model(tmp_path / "adapter")), _logits(model))


def test_a_base_saved_quantised_without_its_package_is_named(saved, tmp_path):
    # a QLoRA-like base (bitsandbytes' quantization_config) where bitsandbytes is missing:
    # transformers' ImportError was a raw traceback with exit status 1, for every command
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("bitsandbytes is installed: the base loads")
    base = _classifier_base(saved, tmp_path / "base", labels=3)
    _lora_on(base, tmp_path / "adapter", labels=3)
    settings = json.loads((base / "config.json").read_text())
    settings["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (base / "config.json").write_text(json.dumps(settings))
    code, _, stderr = _call("measure", tmp_path / "adapter", saved / "data.pt", *OPTIONS)
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert f"error: MODEL {tmp_path / 'adapter'}: adapter_config.json names the base" in stderr
    assert "not installed" in stderr and "bitsandbytes" in stderr
    code, _, stderr = _call("symmetries", tmp_path / "adapter")     # the structure is known
    assert code == 0, stderr


def test_a_model_saved_beside_adapter_checkpoints_is_that_model(saved, tmp_path):
    # a Trainer's output: adapter checkpoints in checkpoint-*/, the final (merged) model in
    # the folder itself; the checkpoint's adapter on its base was measured, with exit status 0
    base = _classifier_base(saved, tmp_path / "base", labels=3)
    model = _lora_on(base, tmp_path / "out" / "checkpoint-10", labels=3)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:       # trained on after the checkpoint
                parameter.add_(0.2)
    final = model.merge_and_unload()
    final.save_pretrained(tmp_path / "out")
    loaded = load_measured_model(tmp_path / "out")
    assert type(loaded).__name__ == "BertForSequenceClassification"
    assert torch.equal(_logits(loaded), _logits(final))
    assert type(load_model(tmp_path / "out")).__name__ == "BertForSequenceClassification"
    # the checkpoint itself is still an adapter
    assert type(load_measured_model(tmp_path / "out" / "checkpoint-10")).__name__ == (
        "PeftModelForSequenceClassification")


def test_a_folder_of_trainer_checkpoints_only_is_refused_naming_the_latest(saved, tmp_path):
    # checkpoint-5, -10 and -20 and nothing else: "checkpoint-10" sorts first, and its adapter
    # was measured with exit status 0 (not the latest, and named nowhere in the output)
    out = tmp_path / "out"
    for step in (5, 10, 20):
        shutil.copytree(saved / "adapter", out / f"checkpoint-{step}")
    for command in (["symmetries", out], ["measure", out, saved / "data.pt", *OPTIONS]):
        code, _, stderr = _call(*command)
        assert code == 2 and stderr.count("\n") == 1, stderr
        assert (f"error: MODEL {out}: holds 3 Trainer checkpoints (checkpoint-5, checkpoint-10, "
                f"checkpoint-20) and no adapter of its own" in stderr), stderr
        assert f"{out / 'checkpoint-20'} (the latest)" in stderr
    # one checkpoint is no choice; a checkpoint given itself is read
    shutil.rmtree(out / "checkpoint-5")
    shutil.rmtree(out / "checkpoint-10")
    assert type(load_measured_model(out)).__name__ == "PeftModelForSequenceClassification"
    assert type(load_measured_model(out / "checkpoint-20")).__name__ == (
        "PeftModelForSequenceClassification")


@pytest.mark.parametrize(("folder", "named"), [("default", "which PEFT names 'default' too"),
                                                ("v1.0", "a name with a '.'")])
def test_a_subdirectory_that_cannot_name_an_adapter_is_refused(saved, tmp_path, folder, named):
    # "default/" beside the directory's own adapter replaced it (a silent other model, exit
    # status 0); "v1.0/" ended with torch's KeyError (a traceback from symmetries)
    adapter = tmp_path / "adapter"
    shutil.copytree(saved / "adapter", adapter)
    _saved_lora(saved, adapter / folder, task_type="SEQ_CLS")
    for command in (["symmetries", adapter], ["measure", adapter, saved / "data.pt", *OPTIONS]):
        code, _, stderr = _call(*command)
        assert code == 2 and stderr.count("\n") == 1, stderr
        assert f"error: MODEL {adapter}: " in stderr and named in stderr, stderr
    # the subdirectory's own adapter is still read when given itself
    assert type(load_measured_model(adapter / folder)).__name__ == (
        "PeftModelForSequenceClassification")


def test_an_adapter_saved_after_merge_and_unload_is_named(saved, tmp_path):
    # merge_and_unload removes the LoRA layers: save_pretrained then writes no tensors, and
    # PEFT's KeyError for the head ("base_model.model.classifier.weight") was all one read
    model = _saved_lora(saved, tmp_path / "unused", task_type="SEQ_CLS")
    model.merge_and_unload()
    model.save_pretrained(tmp_path / "adapter")
    for command in (["symmetries", tmp_path / "adapter"],
                    ["measure", tmp_path / "adapter", saved / "data.pt", *OPTIONS]):
        code, _, stderr = _call(*command)
        assert code == 2 and stderr.count("\n") == 1, stderr
        assert f"error: MODEL {tmp_path / 'adapter' / 'adapter_model.safetensors'} holds no " \
               "tensors" in stderr and "merge_and_unload" in stderr, stderr


def test_a_saved_file_without_the_head_it_declares_is_named(saved, tmp_path):
    # modules_to_save names the classifier, the file lacks it: PEFT's bare KeyError
    adapter = tmp_path / "adapter"
    shutil.copytree(saved / "adapter", adapter)
    weights = adapter / "adapter_model.safetensors"
    tensors = safetensors_torch.load_file(str(weights))
    safetensors_torch.save_file({k: v for k, v in tensors.items() if "classifier" not in k},
                                str(weights))
    for command in (["symmetries", adapter], ["measure", adapter, saved / "data.pt", *OPTIONS]):
        code, _, stderr = _call(*command)
        assert code == 2 and stderr.count("\n") == 1, stderr
        assert f"error: MODEL {adapter}: adapter 'default' does not fit" in stderr
        assert "classifier.weight" in stderr and "modules_to_save" in stderr, stderr


def test_measure_refuses_to_write_into_the_base_model_of_an_adapter(saved):
    # a file there changes the base's contents, which a study of the adapter fingerprints
    before = sorted(path.name for path in (saved / "base").iterdir())
    code, _, stderr = _call("measure", saved / "adapter", saved / "data.pt", "--rho", "0.1",
                            "--n-iter", "2", "--no-progress", "--json", saved / "base" / "x.json")
    assert code == 2 and "is inside the base model of MODEL's adapter" in stderr
    assert sorted(path.name for path in (saved / "base").iterdir()) == before
