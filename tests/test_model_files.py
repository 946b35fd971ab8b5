"""A MODEL file or directory that cannot be read is one line naming MODEL and the file, with
the reason, from the API (``load_model``, ``load_measured_model``) and from ``quotientsharp
symmetries`` and ``quotientsharp measure`` (exit status 2): an empty file, a CSV, random
bytes, a zip archive that torch did not write, a torch.save file cut short, a config that is
not valid JSON (a file, a directory's ``config.json``, a JSON lines file given as MODEL), a
directory whose weights are damaged.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

from quotientsharp.cli import main
from quotientsharp.models.loading import load_model
from quotientsharp.workflows.saved_models import load_measured_model


def _call(*arguments: object) -> tuple[int, str]:
    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        code = main([*map(str, arguments)])
    return code, stderr.getvalue()


@pytest.fixture(scope="module")
def files(saved_mlp, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad-models")
    contents = {"empty.pt": b"", "table.csv": b"a,b,label\n1,2,0\n",
                "random.pt": bytes(range(7, 207)), "truncated.pt":
                saved_mlp["net"].read_bytes()[:300], "config.json": b"{'model_type': 'bert'}",
                "rows.jsonl": b'{"input_ids": [1], "label": 0}\n{"input_ids": [2], "label": 1}\n',
                "latin1.json": b'{"model_type": "caf\xe9"}'}
    paths = {}
    for name, content in contents.items():
        paths[name] = root / name
        paths[name].write_bytes(content)
    with zipfile.ZipFile(root / "archive.zip", "w") as archive:
        archive.writestr("weights/notes.txt", "not a module")
    paths["archive.zip"] = root / "archive.zip"
    (root / "directory").mkdir()
    (root / "directory" / "config.json").write_text('{"model_type": "bert",}')
    paths["directory"] = root / "directory"
    return paths


#: file -> (where the message names, the start of what it says after the path)
NOT_A_MODULE = {"empty.pt": "the file is empty (0 bytes)",
                "table.csv": "it is a text file beginning 'a,b,label'",
                "random.pt": "it begins with the bytes",
                "truncated.pt": "it begins as a zip archive",
                "archive.zip": "it is a zip archive that torch.save did not write"}
NOT_JSON = {"config.json": "config.json", "rows.jsonl": "rows.jsonl",
            "latin1.json": "latin1.json", "directory": "directory/config.json"}


@pytest.mark.parametrize("name", sorted(NOT_A_MODULE))
def test_a_file_that_is_not_a_module_is_named(files, name):
    path = files[name]
    for load in (load_model, load_measured_model):
        with pytest.raises(ValueError) as raised:
            load(path)
        message = str(raised.value)
        assert message.startswith(f"MODEL {path} is neither a config JSON nor a torch-saved "
                                  f"module: {NOT_A_MODULE[name]}"), message
        assert "\n" not in message


@pytest.mark.parametrize("name", sorted(NOT_JSON))
def test_a_config_that_is_not_json_is_named(files, name):
    named = files[name].parent / NOT_JSON[name]
    with pytest.raises(ValueError, match=rf"^MODEL {re.escape(str(named))} is not valid JSON: "):
        load_model(files[name])
    with pytest.raises(ValueError, match=rf"^MODEL {re.escape(str(named))} is not valid JSON: "):
        load_measured_model(files[name])


def test_json_lines_given_as_model_say_so(files):
    with pytest.raises(ValueError, match="more than one JSON value, as a JSON lines file"):
        load_model(files["rows.jsonl"])


@pytest.mark.parametrize("name", [*sorted(NOT_A_MODULE), *sorted(NOT_JSON)])
def test_both_commands_print_one_line_naming_model(files, saved_mlp, name):
    path = files[name]
    for command in (["symmetries", path], ["measure", path, saved_mlp["data"], "--rho", "0.1",
                                           "--no-progress"]):
        code, stderr = _call(*command)
        assert code == 2, stderr
        assert stderr.count("\n") == 1, stderr
        assert stderr.startswith(f"quotientsharp {command[0]}: error: MODEL {path}"), stderr


def test_a_module_file_still_loads(saved_mlp, tmp_path):
    assert isinstance(load_model(saved_mlp["net"]), torch.nn.Sequential)
    legacy = tmp_path / "legacy.pt"
    torch.save(torch.load(saved_mlp["net"], weights_only=False), legacy,
               _use_new_zipfile_serialization=False)
    assert isinstance(load_model(legacy), torch.nn.Sequential)


@pytest.fixture(scope="module")
def saved_bert(tmp_path_factory) -> Path:
    transformers = pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("bad-hf")
    config = transformers.BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=16, vocab_size=20,
                                     max_position_embeddings=16, num_labels=2)
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")       # transformers' save progress and notes
        transformers.BertForSequenceClassification(config).save_pretrained(root / "good")
    torch.save((torch.randint(0, 20, (4, 6)), torch.randint(0, 2, (4,))), root / "tokens.pt")
    return root


@pytest.mark.parametrize("damage", ["empty", "truncated"])
def test_damaged_weights_of_a_directory_are_named(saved_bert, tmp_path, damage):
    directory = tmp_path / "model"
    directory.mkdir()
    for source in (saved_bert / "good").iterdir():
        (directory / source.name).write_bytes(source.read_bytes())
    weights = directory / "model.safetensors"
    weights.write_bytes(b"" if damage == "empty" else weights.read_bytes()[:200])
    with pytest.raises(ValueError, match=rf"^MODEL {re.escape(str(directory))}: transformers "
                                         "cannot load its weights"):
        load_measured_model(directory)
    code, stderr = _call("measure", directory, saved_bert / "tokens.pt", "--rho", "0.1",
                         "--no-progress")
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert f"MODEL {directory}" in stderr


def test_a_directory_config_that_is_not_an_object_is_named(saved_bert, tmp_path):
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(["bert"]))
    with pytest.raises(ValueError, match=rf"^MODEL {re.escape(str(directory))}.config\.json is "
                                         "not a HuggingFace config"):
        load_measured_model(directory)


@pytest.mark.parametrize("architectures", [["FooBarModel"], "BertModel", [3]])
def test_an_architecture_transformers_does_not_know_is_refused(saved_bert, tmp_path,
                                                               architectures):
    # the Auto class built a BERT of its own choice (BertForSequenceClassification for
    # measure, BertModel for symmetries) without a word, though the docs say the class
    # named in architectures is loaded
    directory = tmp_path / "model"
    directory.mkdir()
    for source in (saved_bert / "good").iterdir():
        (directory / source.name).write_bytes(source.read_bytes())
    config_file = directory / "config.json"
    config = json.loads(config_file.read_text())
    config["architectures"] = architectures
    config_file.write_text(json.dumps(config))
    said = (r"architectures names 'FooBarModel', not a model class of transformers"
            if architectures == ["FooBarModel"] else "'architectures' must be a list of class "
            "names")
    for load, path in ((load_model, directory), (load_model, config_file),
                       (load_measured_model, directory)):
        with pytest.raises(ValueError, match=rf"^MODEL {re.escape(str(config_file))}: {said}"):
            load(path)
    for command in (["symmetries", directory], ["measure", directory, saved_bert / "tokens.pt",
                                                "--rho", "0.1", "--no-progress"]):
        code, stderr = _call(*command)
        assert code == 2 and stderr.count("\n") == 1, stderr
        assert f"MODEL {config_file}: " in stderr
    del config["architectures"]                 # absent: the Auto class decides, as before
    config_file.write_text(json.dumps(config))
    assert type(load_model(directory)).__name__ == "BertModel"
    assert type(load_measured_model(directory)).__name__ == "BertForSequenceClassification"


def test_a_config_with_a_repeated_key_is_named(saved_bert, tmp_path):
    # transformers reads config.json with json.loads, which keeps the last of a repeated key
    directory = tmp_path / "model"
    directory.mkdir()
    for source in (saved_bert / "good").iterdir():
        (directory / source.name).write_bytes(source.read_bytes())
    config = (directory / "config.json").read_text()
    (directory / "config.json").write_text(config.replace("{", '{"hidden_size": 4,', 1))
    with pytest.raises(ValueError, match=r"config\.json: the key 'hidden_size' is given twice"):
        load_measured_model(directory)
