"""Text inputs that are not UTF-8 (a study's manifest, a JSON-lines data file) are named in a
one-line error; so is a DATA file that is neither JSON lines nor a torch.save file (empty,
CSV, random bytes, another zip archive, a torch.save file cut short), by the API and by
``quotientsharp measure`` (exit status 2), with the reason.
"""

from __future__ import annotations

import contextlib
import io
import re
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

import quotientsharp as qs
from quotientsharp.cli import main
from quotientsharp.workflows.data import load_batches
from quotientsharp.workflows.options import BatchSettings
from tests.tiny_models import tiny_bart

#: these tests measure small MLPs without symmetry: the warning that says so is
#: expected here (tests/test_symmetry_check.py checks it)
pytestmark = pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")


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


def _unreadable_data_files(root: Path, good: Path) -> dict[str, Path]:
    """Files that are not DATA, each as a user may give one by mistake."""
    files = {"empty": b"", "csv": b"a,b,label\n1,2,0\n", "random": bytes(range(7, 207)),
             "text": b"hello world\n"}
    paths = {}
    for name, content in files.items():
        paths[name] = root / f"{name}.pt"
        paths[name].write_bytes(content)
    paths["csv_named"] = root / "data.csv"
    paths["csv_named"].write_bytes(files["csv"])
    with zipfile.ZipFile(root / "other.zip", "w") as archive:
        archive.writestr("notes.txt", "not a tensor")
    paths["zip"] = root / "other.zip"
    # a torch.save file cut short (a copy interrupted), in both of torch.save's formats
    paths["truncated"] = root / "truncated.pt"
    paths["truncated"].write_bytes(good.read_bytes()[:300])
    legacy = root / "legacy.pt"
    torch.save((torch.randn(8, 5), torch.randint(0, 3, (8,))), legacy,
               _use_new_zipfile_serialization=False)
    paths["truncated_legacy"] = root / "truncated_legacy.pt"
    paths["truncated_legacy"].write_bytes(legacy.read_bytes()[:60])
    return paths


@pytest.fixture(scope="module")
def bad_data(saved_mlp, tmp_path_factory) -> dict[str, Path]:
    return _unreadable_data_files(tmp_path_factory.mktemp("bad-data"), saved_mlp["data"])


@pytest.mark.parametrize("name", ["empty", "csv", "csv_named", "random", "text", "zip",
                                  "truncated", "truncated_legacy"])
def test_a_file_that_is_not_data_is_named_in_one_line(saved_mlp, bad_data, name, capsys):
    path = bad_data[name]
    model = torch.load(saved_mlp["net"], weights_only=False)
    with pytest.raises(ValueError) as raised:
        load_batches(path, model, saved_mlp["net"], BatchSettings())
    message = str(raised.value)
    assert message.startswith(f"DATA {path} is neither JSON lines (")
    assert "nor a torch.save file: " in message and "\n" not in message
    code = main(["measure", str(saved_mlp["net"]), str(path), "--rho", "0.1", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err == f"quotientsharp measure: error: {message}\n"


def test_why_a_file_is_not_data_is_said(saved_mlp, bad_data):
    model = torch.load(saved_mlp["net"], weights_only=False)
    reasons = {"empty": "empty (0 bytes)", "csv": "text file beginning 'a,b,label'",
               "random": "neither a zip archive nor a pickle", "zip": "no data.pkl in it",
               "truncated": "damaged or truncated", "truncated_legacy": "truncated or damaged"}
    for name, reason in reasons.items():
        with pytest.raises(ValueError, match=re.escape(reason)):
            load_batches(bad_data[name], model, saved_mlp["net"], BatchSettings())


def test_json_lines_under_another_suffix_are_told_the_suffixes(saved_mlp, tmp_path):
    path = tmp_path / "rows.txt"
    path.write_text('{"input_ids": [1, 2], "label": 0}\n')
    model = torch.load(saved_mlp["net"], weights_only=False)
    with pytest.raises(ValueError, match=r"DATA .*rows\.txt begins like JSON lines .* '\.txt'.*"
                                         r"\.jsonl, \.json, \.ndjson"):
        load_batches(path, model, saved_mlp["net"], BatchSettings())


def test_a_broken_tokenizer_file_is_named(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=16, vocab_size=20,
                                     max_position_embeddings=16, num_labels=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # transformers' save progress and notes
        transformers.BertForSequenceClassification(config).save_pretrained(tmp_path / "model")
    (tmp_path / "model" / "tokenizer_config.json").write_text("{'not': 'json'}")
    (tmp_path / "rows.jsonl").write_text('{"text": "a b", "label": 0}\n')
    capsys.readouterr()                       # the progress bar of save_pretrained
    code = main(["measure", str(tmp_path / "model"), str(tmp_path / "rows.jsonl"), "--rho",
                 "0.1", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 2 and captured.err.count("\n") == 1
    assert (f"MODEL {tmp_path / 'model' / 'tokenizer_config.json'} is not valid JSON"
            in captured.err)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_byte_order_mark_is_not_part_of_the_first_line(study_files, tmp_path, suffix):
    # Excel's "CSV UTF-8" and Notepad begin a UTF-8 file with a byte order mark: the first
    # column used to be read as '\ufeffmodel' ("no 'model' entry"), a JSONL row as bad JSON
    from quotientsharp.workflows.data import jsonl_objects
    from quotientsharp.workflows.manifest import read_manifest

    text = ("model,gap\nnet0.pt,0.1\nnet1.pt,0.2\n" if suffix == ".csv" else
            '{"model": "net0.pt", "gap": 0.1}\n{"model": "net1.pt", "gap": 0.2}\n')
    plain, marked = study_files / f"plain{suffix}", study_files / f"marked{suffix}"
    plain.write_text(text, encoding="utf-8")
    marked.write_text(text, encoding="utf-8-sig")
    assert marked.read_bytes().startswith(b"\xef\xbb\xbf")
    assert read_manifest(marked) == read_manifest(plain)
    if suffix == ".jsonl":
        assert list(jsonl_objects(marked, "DATA")) == list(jsonl_objects(plain, "DATA"))


@pytest.mark.parametrize("key, meant", [("symetry", "symmetry"), ("Name", "name"),
                                        ("trian", "train")])
def test_a_misspelt_manifest_key_is_refused_not_carried(study_files, key, meant):
    # a carried key keeps no meaning: a misspelt symmetry would be measured without the user's
    # symmetry, without a word
    from quotientsharp.workflows.manifest import read_manifest
    from quotientsharp.workflows.options import InputError

    path = study_files / "near.csv"
    path.write_text(f"model,gap,{key}\nnet0.pt,0.1,x\nnet1.pt,0.2,y\n")
    with pytest.raises(InputError, match=rf"line 2: the key '{key}' .* did you mean '{meant}'"):
        read_manifest(path)


@pytest.mark.parametrize("key", ["Gap", "gaps"])
def test_a_misspelt_gap_is_named_not_reported_missing(study_files, key):
    # the gap's own check ran first and said "no 'gap'", which names no column of the file
    from quotientsharp.workflows.manifest import read_manifest
    from quotientsharp.workflows.options import InputError

    path = study_files / "near-gap.csv"
    path.write_text(f"model,{key}\nnet0.pt,0.1\nnet1.pt,0.2\n")
    with pytest.raises(InputError, match=rf"line 2: the key '{key}' .* did you mean 'gap'"):
        read_manifest(path)


def test_columns_of_ones_own_are_carried(study_files):
    from quotientsharp.workflows.manifest import read_manifest

    path = study_files / "own.csv"
    path.write_text("model,gap,test_accuracy,seed,gaps_note\nnet0.pt,0.1,0.9,1,a\n"
                    "net1.pt,0.2,0.8,2,b\n")
    entries = read_manifest(path)
    assert entries[0].extra == {"test_accuracy": "0.9", "seed": "1", "gaps_note": "a"}


@pytest.mark.parametrize("kind", ["tensors", "pre-tokenised"])
def test_a_tokenizer_for_data_without_text_is_refused(saved_mlp, tmp_path, kind):
    # a given option counts: --tokenizer with tensors or input_ids changed nothing, silently
    from quotientsharp.workflows.options import InputError

    model = torch.load(saved_mlp["net"], weights_only=False)
    if kind == "tensors":
        path = saved_mlp["data"]
    else:
        path = tmp_path / "rows.jsonl"
        path.write_text('{"input_ids": [1, 2], "label": 0}\n')
    settings = BatchSettings(tokenizer=str(tmp_path))
    with pytest.raises(InputError, match=r"^--tokenizer .* is given but DATA .* holds "
                                         r"(tensors|pre-tokenised rows).* drop --tokenizer"):
        load_batches(path, model, saved_mlp["net"], settings)
    assert load_batches(path, model, saved_mlp["net"], BatchSettings())[1] > 0


def test_a_row_longer_than_the_position_table_is_named(bert, tmp_path):
    # the forward failed deep in torch: "The expanded size of the tensor (28) must match the
    # existing size (16)", naming neither the row nor max_position_embeddings
    from quotientsharp.workflows.options import InputError

    positions = bert.config.max_position_embeddings
    fits, longer = tmp_path / "fits.jsonl", tmp_path / "longer.jsonl"
    fits.write_text('{"input_ids": [1, 2], "label": 0}\n'
                    f'{{"input_ids": {list(range(1, positions + 1))}, "label": 1}}\n')
    longer.write_text('{"input_ids": [1, 2], "label": 0}\n'
                      f'{{"input_ids": {list(range(1, positions + 2))}, "label": 1}}\n')
    batches, count, _ = load_batches(fits, bert, tmp_path, BatchSettings())
    assert count == 2 and batches[0]["input_ids"].shape[-1] == positions
    with pytest.raises(InputError, match=rf"longer\.jsonl, line 2: {positions + 1} tokens, more "
                                         rf"than the model's {positions} positions"):
        load_batches(longer, bert, tmp_path, BatchSettings())


def test_a_text_longer_than_the_position_table_is_told_max_length(bert, tmp_path):
    transformers = pytest.importorskip("transformers")
    from quotientsharp.workflows.options import InputError

    vocabulary = tmp_path / "vocab.txt"
    vocabulary.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                     *"abcdefghij"]) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(vocabulary)).save_pretrained(tmp_path / "tok")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "a b", "label": 0}\n{"text": "' + " ".join("abcdefghij" * 2)
                    + '", "label": 1}\n')
    positions = bert.config.max_position_embeddings
    with pytest.raises(InputError, match=rf"line 2: the text is 22 tokens long \(--max-length "
                                         rf"128\).* pass --max-length {positions} or less"):
        load_batches(rows, bert, tmp_path, BatchSettings(tokenizer=str(tmp_path / "tok")))
    batches, _, _ = load_batches(rows, bert, tmp_path, BatchSettings(
        tokenizer=str(tmp_path / "tok"), max_length=positions))
    assert batches[0]["input_ids"].shape[-1] == positions


@pytest.mark.parametrize("kind", ["tensors", "pre-tokenised"])
def test_a_max_length_for_data_without_text_is_refused(saved_mlp, tmp_path, kind):
    # --max-length 3 left pre-tokenised rows of 9 tokens whole, with exit status 0
    from quotientsharp.workflows.options import InputError

    model = torch.load(saved_mlp["net"], weights_only=False)
    if kind == "tensors":
        path = saved_mlp["data"]
    else:
        path = tmp_path / "rows.jsonl"
        path.write_text('{"input_ids": [1, 2, 3, 4], "label": 0}\n')
    with pytest.raises(InputError, match=r"^--max-length 3 is given but DATA .* holds "
                                         r"(tensors|pre-tokenised rows).* drop --max-length"):
        load_batches(path, model, saved_mlp["net"], BatchSettings(max_length=3))
    assert load_batches(path, model, saved_mlp["net"], BatchSettings())[1] > 0


def test_a_sparse_tensor_in_a_data_file_is_named(saved_mlp, tmp_path):
    # slicing it into batches failed in torch, a message of kilobytes naming neither DATA nor X
    from quotientsharp.workflows.options import InputError

    model = torch.load(saved_mlp["net"], weights_only=False)
    x, y = torch.load(saved_mlp["data"])
    torch.save((x.to_sparse(), y), tmp_path / "sparse.pt")
    with pytest.raises(InputError, match=r"^DATA .*sparse\.pt: X is a sparse_coo tensor; save "
                                         r"it dense"):
        load_batches(tmp_path / "sparse.pt", model, saved_mlp["net"], BatchSettings())


@pytest.mark.parametrize("entries", [{"x": 0, "y": 1, "mask": 0}, {"x": 0, "X": 0, "y": 1},
                                     {"x": 0}])
def test_a_dict_of_other_entries_than_x_and_y_is_refused(saved_mlp, tmp_path, entries):
    # a third entry (a mask, a second input) was left out of the forward with exit status 0
    from quotientsharp.workflows.options import InputError

    model = torch.load(saved_mlp["net"], weights_only=False)
    x, y = torch.load(saved_mlp["data"])
    tensors = (x, y)
    torch.save({key: tensors[index] for key, index in entries.items()}, tmp_path / "d.pt")
    with pytest.raises(InputError, match=r"a dict needs the entries 'x' and 'y' and no others"):
        load_batches(tmp_path / "d.pt", model, saved_mlp["net"], BatchSettings())
    torch.save({"X": x, "Y": y}, tmp_path / "plain.pt")
    batches, count, _ = load_batches(tmp_path / "plain.pt", model, saved_mlp["net"],
                                     BatchSettings())
    assert count == len(y) and torch.equal(batches[0][0], x[:32])


def test_the_loss_of_a_file_with_ignored_labels_is_its_labelled_examples_mean(study_files):
    # each batch's mean is over its labels other than -100, so weighing it by the batch's size
    # counted the ignored ones, and the loss depended on the batch size
    from quotientsharp.workflows.measuring import evaluate

    inputs, labels = torch.load(study_files / "data.pt")
    labels = labels.clone()
    labels[:5] = -100
    model = torch.load(study_files / "net0.pt", weights_only=False).eval()
    with torch.no_grad():
        expected = float(torch.nn.functional.cross_entropy(model(inputs).double(), labels))
    for size in (12, 5, 4):          # 4: the first batch holds ignored labels only
        batches = [(inputs[i:i + size], labels[i:i + size]) for i in range(0, 12, size)]
        assert evaluate(model, batches, "cross_entropy")["loss"] == pytest.approx(expected,
                                                                                rel=1e-6)


def test_ignored_labels_in_a_jsonl_file_are_read_as_in_a_tensor_file(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=16, vocab_size=20,
                                     max_position_embeddings=16, num_labels=3)
    model = transformers.BertForSequenceClassification(config)
    (tmp_path / "rows.jsonl").write_text('{"input_ids": [1, 2, 3], "label": 2}\n'
                                         '{"input_ids": [4, 5, 6], "label": -100}\n')
    batches, _, _ = load_batches(tmp_path / "rows.jsonl", model, tmp_path, BatchSettings())
    assert batches[0]["labels"].tolist() == [2, -100]
    (tmp_path / "bad.jsonl").write_text('{"input_ids": [1, 2, 3], "label": -1}\n')
    with pytest.raises(ValueError, match=r"line 1: label -1 is not a class index in \[0, 3\)"):
        load_batches(tmp_path / "bad.jsonl", model, tmp_path, BatchSettings())


def test_a_study_refuses_to_write_over_its_manifest(study_files, tmp_path, capsys):
    folder = tmp_path / "here"
    folder.mkdir()
    manifest = folder / "models.csv"
    manifest.write_text("model,gap\n" + "".join(
        f"{study_files / f'net{i}.pt'},{0.1 * (i + 1)}\n" for i in range(3)))
    before = manifest.read_bytes()
    code = main(["study", str(manifest), "--data", str(study_files / "data.pt"), "--measure",
                 "adaptive", "--rho", "0.1", "--n-iter", "2", "--no-progress",
                 "--out", str(folder)])
    assert code == 2 and manifest.read_bytes() == before
    assert "would write models.csv over MANIFEST" in capsys.readouterr().err


@pytest.mark.parametrize(("row", "expected"), [
    # read as pre-tokenised, the text was ignored without a word
    ('{"input_ids": [1, 2], "text": "a b", "label": 0}',
     r"line 2: gives pre-tokenised entries \['input_ids'\] and text entries \['text'\]"),
    ('{"text": "a b", "attention_mask": [1, 1], "label": 0}',
     r"line 2: gives pre-tokenised entries \['attention_mask'\] and text entries \['text'\]"),
    # json keeps the last of a repeated key: label 2 was measured, label 0 dropped
    ('{"input_ids": [1, 2], "label": 0, "label": 2}',
     r"line 2: the key 'label' is given twice in one object"),
    # "labels" is read as "label": the message named "labels" an unknown key
    ('{"input_ids": [1, 2], "label": 0, "labels": 1}',
     r"line 2: both 'label' and 'labels' are given"),
])
def test_a_jsonl_row_that_would_lose_an_entry_is_refused(bert, tmp_path, row, expected):
    from quotientsharp.workflows.options import InputError

    path = tmp_path / "rows.jsonl"
    path.write_text('{"input_ids": [3, 4], "label": 1}\n' + row + "\n")
    with pytest.raises(InputError, match=rf"^DATA {re.escape(str(path))}, {expected}"):
        load_batches(path, bert, tmp_path, BatchSettings())


def test_a_manifest_row_with_a_repeated_key_is_refused(study_files, tmp_path):
    from quotientsharp.workflows.manifest import read_manifest

    path = tmp_path / "models.jsonl"
    path.write_text(f'{{"model": "{study_files / "net0.pt"}", "gap": 0.1}}\n'
                    f'{{"model": "{study_files / "net1.pt"}", "gap": 0.1, "gap": 0.3}}\n')
    with pytest.raises(ValueError, match=r"^MANIFEST .*models\.jsonl, line 2: the key 'gap' is "
                                         "given twice"):
        read_manifest(path)


@pytest.mark.parametrize("token", [40, -1, 2 ** 70])
def test_a_token_id_outside_the_vocabulary_names_file_and_line(bert, tmp_path, token):
    # 2**70 failed in torch, "Overflow when unpacking long long", naming nothing; 40 was named
    # by batch, not line
    from quotientsharp.workflows.options import InputError

    path = tmp_path / "rows.jsonl"
    path.write_text('{"input_ids": [1, 2], "label": 0}\n'
                    f'{{"input_ids": [1, {token}], "label": 1}}\n')
    with pytest.raises(InputError, match=rf"^DATA .*rows\.jsonl, line 2: input_ids holds token "
                                         rf"id {token}, outside the model's vocabulary \[0, 40\)"):
        load_batches(path, bert, tmp_path, BatchSettings())


def test_a_token_entry_beyond_64_bits_names_file_and_line(saved_mlp, tmp_path):
    # a model without a vocabulary (the MLP): ids are not checked against one, but torch cannot
    # hold an id of 2**70
    from quotientsharp.workflows.options import InputError

    model = torch.load(saved_mlp["net"], weights_only=False)
    path = tmp_path / "rows.jsonl"
    path.write_text(f'{{"input_ids": [1, {2 ** 70}], "label": 1}}\n')
    with pytest.raises(InputError, match=rf"line 1: input_ids holds token id {2 ** 70}, outside "
                                         "the 64-bit integers"):
        load_batches(path, model, saved_mlp["net"], BatchSettings())


def _tiny_llama(tmp_path: Path) -> tuple[torch.nn.Module, Path]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=30, hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, max_position_embeddings=32,
                                      attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).double().eval()
    model.save_pretrained(tmp_path / "llama")
    return model, tmp_path / "llama"


def test_per_token_labels_of_pretokenised_rows_measure_a_language_model(tmp_path):
    # a causal LM's targets are a label per token: the command refused them as "not integer
    # class labels", so no language model could be measured from a JSONL file
    import json

    model, directory = _tiny_llama(tmp_path)
    rows = [([3, 7, 9, 11, 4], [7, 9, 11, 4, -100]), ([5, 6, 8], [6, 8, -100])]
    path = tmp_path / "lm.jsonl"
    path.write_text("".join(json.dumps({"input_ids": ids, "labels": labels}) + "\n"
                            for ids, labels in rows))
    (batch,), _, _ = load_batches(path, model, directory, BatchSettings(batch_size=2))
    # padded with -100 to the batch's longest row, whatever the config's num_labels (2)
    assert batch["labels"].tolist() == [[7, 9, 11, 4, -100], [6, 8, -100, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1] * 5, [1, 1, 1, 0, 0]]
    expected = qs.sharpness(model, [batch], "adaptive", rho=0.05, n_iter=2, progress=False)
    out = tmp_path / "values.json"
    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        code = main([str(a) for a in ("measure", directory, path, "--measure", "adaptive",
                                      "--rho", "0.05", "--n-iter", "2", "--batch-size", "2",
                                      "--dtype", "float64", "--no-progress", "--json", out)])
    assert code == 0, stderr.getvalue()
    assert json.loads(out.read_text())["results"]["adaptive"]["value"] == expected.value


def test_decoder_inputs_of_pretokenised_rows_measure_a_sequence_to_sequence_model(tmp_path):
    # rows could not give decoder_input_ids (an unknown key), and without them an
    # encoder-decoder is refused: no sequence-to-sequence model could be measured from a file
    import json

    pytest.importorskip("transformers")
    model = tiny_bart(30, 32, torch.float64)
    model.save_pretrained(tmp_path / "bart")
    rows = [([3, 7, 9, 11, 4], [2, 6, 8], [6, 8, 5]), ([5, 6, 8], [2, 9, 10, 12], [9, 10, 12, 7])]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"input_ids": source, "decoder_input_ids": decoder,
                                        "labels": labels}) + "\n"
                            for source, decoder, labels in rows))
    (batch,), _, _ = load_batches(path, model, tmp_path / "bart", BatchSettings(batch_size=2))
    assert batch["decoder_input_ids"].tolist() == [[2, 6, 8, 1], [2, 9, 10, 12]]
    assert batch["decoder_attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert batch["labels"].tolist() == [[6, 8, 5, -100], [9, 10, 12, 7]]
    expected = qs.sharpness(model, [batch], "adaptive", rho=0.05, n_iter=2, progress=False)
    out = tmp_path / "values.json"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main([str(a) for a in ("measure", tmp_path / "bart", path, "--measure",
                                      "adaptive", "--rho", "0.05", "--n-iter", "2",
                                      "--batch-size", "2", "--dtype", "float64", "--no-progress",
                                      "--json", out)])
    assert code == 0
    assert json.loads(out.read_text())["results"]["adaptive"]["value"] == expected.value
    path.write_text(json.dumps({"input_ids": [3, 4], "decoder_input_ids": [2, 5],
                                "labels": [5, 6]}) + "\n" + json.dumps(
        {"input_ids": [3, 4], "labels": [4, 6]}) + "\n")
    with pytest.raises(ValueError, match=r"line 2: no 'decoder_input_ids', which other rows "
                                         "give"):
        load_batches(path, model, tmp_path / "bart", BatchSettings(batch_size=2))


@pytest.mark.parametrize(("row", "expected"), [
    ('{"input_ids": [1, 2, 3], "labels": [2, 3]}', r"line 2: 'label' has 2 entries, input_ids "
                                                   r"has 3"),
    ('{"input_ids": [1, 2], "labels": [2, 30]}', r"line 2: label 30 is not a token in \[0, 30\)"),
    ('{"input_ids": [1, 2], "labels": 1}', r"line 2: the file's labels are per token, so each "
                                           "row's label must be a list of integers"),
])
def test_per_token_labels_that_do_not_fit_their_row_are_named(tmp_path, row, expected):
    from quotientsharp.workflows.options import InputError

    model, directory = _tiny_llama(tmp_path)
    path = tmp_path / "lm.jsonl"
    path.write_text('{"input_ids": [3, 4], "labels": [4, -100]}\n' + row + "\n")
    with pytest.raises(InputError, match=rf"^DATA {re.escape(str(path))}, {expected}"):
        load_batches(path, model, directory, BatchSettings())
