"""``quotientsharp measure``: reading DATA into batches, JSON lines or ``torch.save``'d tensors
(:mod:`quotientsharp.cli.measure`); torch is imported only when data are read."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quotientsharp.workflows.options import BatchSettings, InputError
from quotientsharp.workflows.saved_models import import_transformers, quiet_transformers

if TYPE_CHECKING:
    import torch
    from torch import nn

#: Files whose presence in a model directory means that it holds a tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json",
                   "spiece.model", "sentencepiece.bpe.model", "tokenizer.model")
#: The JSON files of a saved tokenizer, checked before transformers reads them.
TOKENIZER_JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                        "added_tokens.json", "vocab.json")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
#: The keys of a pre-tokenised JSONL row, and of a text row, besides its label.
TOKEN_KEYS = ("input_ids", "attention_mask", "token_type_ids", "decoder_input_ids",
              "decoder_attention_mask")
TEXT_KEYS = ("text", "text_pair")
#: The keys a JSONL row may have ("labels" is read as "label").
ROW_KEYS = (*TOKEN_KEYS, *TEXT_KEYS, "label")
#: One past the largest token id a torch.long holds.
_INT64_END = 2 ** 63
_EXPECTED = ("expected 'input_ids' (pre-tokenised, with optional 'attention_mask', "
             "'token_type_ids', and a sequence-to-sequence model's 'decoder_input_ids' and "
             "'decoder_attention_mask') or 'text' (with optional 'text_pair'), and 'label'")


def existing_file(path: str | os.PathLike, label: str) -> Path:
    """``path``, or a ``FileNotFoundError`` naming ``label`` unless it is a file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{label} {path} does not exist" if not path.exists()
                                else f"{label} {path} is not a file")
    return path


def utf8_lines(path: Path, label: str) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a UTF-8 text file (newlines kept, as ``open`` gives them);
    bytes that are not UTF-8 raise an :class:`InputError` naming ``label``, file and line."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                # a byte order mark (Excel's "CSV UTF-8", Notepad) is not part of the first line
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise InputError(f"{label} {path}, line {number}: not UTF-8 text (byte "
                                 f"{raw[err.start]:#04x} at column {err.start + 1}); save the "
                                 "file as UTF-8") from None
            # universal newlines, as text mode reads them
            yield number, text.replace("\r\n", "\n").replace("\r", "\n")


def jsonl_objects(path: Path, label: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-empty line of a JSONL file; an error naming
    ``label`` (``"DATA"``), file and line for anything but a JSON object, or for one that
    gives a key twice."""
    from quotientsharp.models.files import DuplicateKeyError, unique_keys

    for number, line in utf8_lines(path, label):
        if not line.strip():
            continue
        try:
            row = json.loads(line, object_pairs_hook=unique_keys)
        except DuplicateKeyError as err:
            raise InputError(f"{label} {path}, line {number}: {err}") from None
        except json.JSONDecodeError as err:
            raise InputError(f"{label} {path}, line {number}: not valid JSON ({err.msg})") \
                from err
        if not isinstance(row, dict):
            raise InputError(f"{label} {path}, line {number}: expected a JSON object, got "
                             f"{type(row).__name__}")
        yield number, row


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for number, row in jsonl_objects(path, "DATA"):
        where = f"DATA {path}, line {number}"
        if "label" in row and "labels" in row:
            # "labels" is read as "label": with both, one would be dropped
            raise InputError(f"{where}: both 'label' and 'labels' are given (two names of "
                             "one entry); give one")
        if "labels" in row:
            row["label"] = row.pop("labels")
        tokens, texts = ([key for key in keys if key in row] for keys in (TOKEN_KEYS, TEXT_KEYS))
        if tokens and texts:
            # a row is read as pre-tokenised or as text: the other entries would be ignored
            # without a word
            raise InputError(f"{where}: gives pre-tokenised entries {tokens} and text entries "
                             f"{texts}; a row is pre-tokenised ('input_ids') or text ('text'), "
                             "and the other kind would be ignored: give one kind")
        if "label" not in row:
            raise InputError(f"{where}: no 'label' entry (keys: {sorted(row)})")
        unknown = sorted(set(row) - set(ROW_KEYS))
        if unknown or ("input_ids" not in row and "text" not in row):
            what = (f"unknown key(s) {unknown}" if unknown
                    else f"neither 'input_ids' nor 'text' (keys: {sorted(row)})")
            raise InputError(f"{where}: {what}; {_EXPECTED}")
        row["_line"] = number
        rows.append(row)
    if not rows:
        raise InputError(f"DATA {path} holds no rows")
    return rows


def _labels(rows: Sequence[dict[str, Any]], path: Path, loss: str,
            num_labels: int | None) -> torch.Tensor:
    import torch

    values = [row["label"] for row in rows]
    integer = all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    for row, value in zip(rows, values, strict=True):
        flat = value if isinstance(value, list) else [value]
        if not flat or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                               and math.isfinite(v) for v in flat):
            raise InputError(f"DATA {path}, line {row['_line']}: label must be a number or a "
                             f"list of numbers, got {value!r}")
    if loss == "cross_entropy":
        if not integer:
            raise InputError(f"DATA {path}: cross-entropy needs integer class labels (a number "
                             "per row, or a list per token of a pre-tokenised row); for "
                             "real-valued targets pass --loss mse")
        # -100 is cross-entropy's ignored label, as in a tensor file
        bad = [(row["_line"], v) for row, v in zip(rows, values, strict=True)
               if (v < 0 and v != -100) or (num_labels is not None and v >= num_labels)]
        if bad:
            line, value = bad[0]
            limit = (f" in [0, {num_labels}): the model has {num_labels} labels"
                     if num_labels is not None else " (negative)")
            raise InputError(f"DATA {path}, line {line}: label {value} is not a class "
                             f"index{limit} (or -100, ignored)")
        return torch.tensor(values, dtype=torch.long)
    try:
        return torch.tensor(values, dtype=torch.float32)
    except ValueError as err:
        raise InputError(f"DATA {path}: labels of unequal lengths ({err})") from err


def _token_labels(rows: Sequence[dict[str, Any]], path: Path, width: int,
                  vocabulary: int | None) -> torch.Tensor:
    """Per-token class labels of pre-tokenised rows (a language model's targets, each a list
    as long as the row's ``decoder_input_ids`` where it has them, else its ``input_ids``,
    ``-100`` where ignored), padded with ``-100`` to the batch's ``width``,
    ``shape=[rows, width]``; a class is a token, so it lies in the vocabulary (a config's
    ``num_labels`` is a classifier head's, not a language model's)."""
    import torch

    from quotientsharp.engine.batches import IGNORE_INDEX

    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    for index, row in enumerate(rows):
        where = f"DATA {path}, line {row['_line']}"
        value = row["label"]
        if "input_ids" not in row:
            raise InputError(f"{where}: a label per token needs pre-tokenised rows "
                             "('input_ids'), whose tokens the labels align with")
        if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise InputError(f"{where}: the file's labels are per token, so each row's label "
                             f"must be a list of integers, got {value!r:.60}")
        tokens = "decoder_input_ids" if "decoder_input_ids" in row else "input_ids"
        if len(value) != len(row[tokens]):
            raise InputError(f"{where}: 'label' has {len(value)} entries, {tokens} has "
                             f"{len(row[tokens])} (one label per token, -100 ignored)")
        outside = next((v for v in value if v != IGNORE_INDEX and not (
            0 <= v < (vocabulary if vocabulary is not None else _INT64_END))), None)
        if outside is not None:
            limit = (f"in [0, {vocabulary}), the vocabulary" if vocabulary is not None
                     else ">= 0")
            raise InputError(f"{where}: label {outside} is not a token {limit} (or -100, "
                             "ignored)")
        labels[index, :len(value)] = torch.tensor(value, dtype=torch.long)
    return labels


def _token_list(row: dict[str, Any], key: str, path: Path, length: int | None,
                vocabulary: int | None = None) -> list[int]:
    """``row[key]``, checked: a non-empty list of integers (``length`` of them where given)
    that fit torch's 64-bit integers and, with ``vocabulary``, lie in ``[0, vocabulary)``."""
    value = row[key]
    where = f"DATA {path}, line {row['_line']}"
    if (not isinstance(value, list) or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise InputError(f"{where}: {key!r} must be a non-empty list of integers")
    if length is not None and len(value) != length:
        raise InputError(f"{where}: {key!r} has {len(value)} entries, input_ids has {length}")
    low, high = (0, vocabulary) if vocabulary is not None else (-_INT64_END, _INT64_END)
    outside = next((v for v in value if not low <= v < high), None)
    if outside is not None:
        # the batch's check says this too, but without the line; an id beyond 64 bits never
        # got there (torch: "Overflow when unpacking long long")
        raise InputError(f"{where}: {key} holds token id {outside}, " + (
            f"outside the model's vocabulary [0, {vocabulary}) (the size of its input "
            "embedding): was the data tokenised for another model?" if vocabulary is not None
            else "outside the 64-bit integers torch holds token ids in"))
    return value


def _pretokenised_batch(rows: Sequence[dict[str, Any]], path: Path, pad_id: int,
                        vocabulary: int | None) -> dict[str, torch.Tensor]:
    import torch

    ids = [_token_list(row, "input_ids", path, None, vocabulary) for row in rows]
    width = max(len(i) for i in ids)
    batch = {"input_ids": torch.full((len(rows), width), pad_id, dtype=torch.long),
             "attention_mask": torch.zeros(len(rows), width, dtype=torch.long)}
    with_types = any("token_type_ids" in row for row in rows)
    if with_types:
        batch["token_type_ids"] = torch.zeros(len(rows), width, dtype=torch.long)
    for index, (row, tokens) in enumerate(zip(rows, ids, strict=True)):
        batch["input_ids"][index, :len(tokens)] = torch.tensor(tokens)
        mask = (_token_list(row, "attention_mask", path, len(tokens))
                if "attention_mask" in row else [1] * len(tokens))
        batch["attention_mask"][index, :len(tokens)] = torch.tensor(mask)
        if with_types and "token_type_ids" in row:
            batch["token_type_ids"][index, :len(tokens)] = torch.tensor(
                _token_list(row, "token_type_ids", path, len(tokens)))
    if any("decoder_input_ids" in row for row in rows):
        batch.update(_decoder_batch(rows, path, pad_id, vocabulary))
    return batch


def _decoder_batch(rows: Sequence[dict[str, Any]], path: Path, pad_id: int,
                   vocabulary: int | None) -> dict[str, torch.Tensor]:
    """A sequence-to-sequence batch's decoder inputs (every row gives ``decoder_input_ids``),
    padded as the encoder's are, with ``decoder_attention_mask`` 0 on the padding."""
    import torch

    missing = next((row for row in rows if "decoder_input_ids" not in row), None)
    if missing is not None:
        raise InputError(f"DATA {path}, line {missing['_line']}: no 'decoder_input_ids', which "
                         "other rows give; a sequence-to-sequence file gives them in every row")
    ids = [_token_list(row, "decoder_input_ids", path, None, vocabulary) for row in rows]
    width = max(len(i) for i in ids)
    batch = {"decoder_input_ids": torch.full((len(rows), width), pad_id, dtype=torch.long),
             "decoder_attention_mask": torch.zeros(len(rows), width, dtype=torch.long)}
    for index, (row, tokens) in enumerate(zip(rows, ids, strict=True)):
        batch["decoder_input_ids"][index, :len(tokens)] = torch.tensor(tokens)
        mask = (_token_list(row, "decoder_attention_mask", path, len(tokens))
                if "decoder_attention_mask" in row else [1] * len(tokens))
        batch["decoder_attention_mask"][index, :len(tokens)] = torch.tensor(mask)
    return batch


def _find_tokenizer(model_path: Path, tokenizer_dir: str | None) -> Any:
    """A tokenizer from ``--tokenizer`` or the MODEL directory, or ``None`` if there is none."""
    directory = Path(tokenizer_dir) if tokenizer_dir is not None else model_path
    if tokenizer_dir is not None and not directory.is_dir():
        raise FileNotFoundError(f"--tokenizer {directory} is not a directory")
    if not directory.is_dir() or not any((directory / f).is_file() for f in TOKENIZER_FILES):
        if tokenizer_dir is not None:
            raise InputError(f"--tokenizer {directory} holds no tokenizer files "
                             f"({', '.join(TOKENIZER_FILES)})")
        return None
    from quotientsharp.models.files import first_line, read_json_file

    label = "MODEL" if tokenizer_dir is None else "--tokenizer"
    # transformers' message for a broken JSON file names neither the file nor the directory
    for name in TOKENIZER_JSON_FILES:
        if (directory / name).is_file():
            read_json_file(directory / name, label)
    transformers = import_transformers("tokenising text rows")
    restore = quiet_transformers()
    try:
        return transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise InputError(f"{label} {directory}: transformers cannot load its tokenizer "
                         f"({first_line(err, 300)})") from err
    finally:
        restore()


def _text_batch(rows: Sequence[dict[str, Any]], path: Path, tokenizer: Any,
                max_length: int) -> dict[str, torch.Tensor]:
    for row in rows:
        if not isinstance(row.get("text"), str):
            raise InputError(f"DATA {path}, line {row['_line']}: 'text' must be a string (or "
                             "give pre-tokenised 'input_ids')")
    pairs = [row.get("text_pair") for row in rows]
    if any(p is not None for p in pairs) and not all(isinstance(p, str) for p in pairs):
        raise InputError(f"DATA {path}: 'text_pair' must be a string on every row or on none")
    texts = [row["text"] for row in rows]
    encoded = tokenizer(texts, *([pairs] if pairs[0] is not None else []), padding=True,
                        truncation=True, max_length=max_length, return_tensors="pt")
    return {key: value for key, value in encoded.items()
            if key in ("input_ids", "attention_mask", "token_type_ids")}


def _jsonl_batches(path: Path, model: nn.Module, model_path: Path, settings: BatchSettings
                   ) -> tuple[list[dict[str, torch.Tensor]], int, str]:
    from quotientsharp.engine.functional import vocabulary_size

    rows = _read_jsonl(path)
    config = getattr(model, "config", None)
    num_labels = getattr(config, "num_labels", None)
    pretokenised = "input_ids" in rows[0]
    for row in rows:
        if ("input_ids" in row) != pretokenised:
            raise InputError(f"DATA {path}, line {row['_line']}: mixes pre-tokenised rows "
                             "('input_ids') and text rows ('text'); use one kind")
    tokenizer = None
    if pretokenised:
        _no_tokenizer_needed(settings, f"DATA {path} holds pre-tokenised rows ('input_ids')")
    else:
        tokenizer = _find_tokenizer(model_path, settings.tokenizer)
        if tokenizer is None:
            raise InputError(f"DATA {path} has text rows but MODEL {model_path} has no "
                             "tokenizer (none of " + ", ".join(TOKENIZER_FILES) + "); pass "
                             "--tokenizer DIR or give pre-tokenised rows {\"input_ids\": [...], "
                             "\"attention_mask\": [...], \"label\": ...}")
    pad_id = getattr(config, "pad_token_id", None)
    pad_id = pad_id if isinstance(pad_id, int) else 0
    positions = _position_count(model)
    vocabulary = vocabulary_size(model)
    # a label per token (a language model's targets) in any row makes the file's labels so
    per_token = settings.loss == "cross_entropy" and any(
        isinstance(row["label"], list) for row in rows)
    batches: list[dict[str, torch.Tensor]] = []
    for start in range(0, len(rows), settings.batch_size)[:settings.max_batches]:
        chunk = rows[start:start + settings.batch_size]
        inputs = (_pretokenised_batch(chunk, path, pad_id, vocabulary) if pretokenised
                  else _text_batch(chunk, path, tokenizer, settings.max_length))
        if positions is not None:
            _check_positions(inputs, chunk, path, positions, settings.max_length)
        targets = inputs.get("decoder_input_ids", inputs["input_ids"])
        labels = (_token_labels(chunk, path, targets.shape[-1], vocabulary)
                  if per_token else _labels(chunk, path, settings.loss, num_labels))
        batches.append({**inputs, "labels": labels})
    kind = "pre-tokenised JSONL" if pretokenised else "text JSONL"
    return batches, sum(len(b["labels"]) for b in batches), kind


def _position_count(model: nn.Module) -> int | None:
    """The rows of the model's learned position table (an embedding named for positions with
    ``config.max_position_embeddings`` rows); ``None`` without one (rotary, relative)."""
    from torch import nn

    count = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if not isinstance(count, int):
        return None
    tables = (module for name, module in model.named_modules()
              if "position" in name.rsplit(".", 1)[-1] and isinstance(module, nn.Embedding))
    return count if any(table.num_embeddings == count for table in tables) else None


def _check_positions(inputs: dict[str, torch.Tensor], rows: Sequence[dict[str, Any]],
                     path: Path, positions: int, max_length: int) -> None:
    """Refuse a row longer than the model's position table, naming its line: the forward
    would fail deep in torch with a message about tensor sizes."""
    lengths = inputs["attention_mask"].ne(0).sum(-1) if "attention_mask" in inputs else None
    width = inputs["input_ids"].shape[-1]
    if width <= positions:
        return
    index = int(lengths.argmax()) if lengths is not None else 0
    row = rows[index]
    if "input_ids" in row:
        raise InputError(f"DATA {path}, line {row['_line']}: {len(row['input_ids'])} tokens, "
                         f"more than the model's {positions} positions "
                         "(max_position_embeddings of its config); shorten the row")
    raise InputError(f"DATA {path}, line {row['_line']}: the text is {width} tokens long "
                     f"(--max-length {max_length}), more than the model's {positions} "
                     f"positions (max_position_embeddings of its config); pass --max-length "
                     f"{positions} or less")


def _unpack(loaded: Any, path: Path) -> tuple[tuple[Any, ...], Any]:
    """``(inputs, target)`` of a loaded DATA file: a tuple or list ``(X, Y)``, a dict with
    ``x`` and ``y`` (any case), or a ``TensorDataset`` (its last tensor the target)."""
    from torch.utils.data import TensorDataset

    if isinstance(loaded, TensorDataset):
        tensors = tuple(loaded.tensors)
        if len(tensors) < 2:
            raise InputError(f"DATA {path}: the TensorDataset holds {len(tensors)} tensor(s); "
                             "it needs inputs and a target")
        return tensors[:-1], tensors[-1]
    if isinstance(loaded, dict):
        keys = {str(k).lower(): k for k in loaded}
        # another entry (a mask, a second input) would be left out without a word, and of
        # 'x' and 'X' one would be
        if set(keys) != {"x", "y"} or len(loaded) != 2:
            raise InputError(f"DATA {path}: a dict needs the entries 'x' and 'y' and no "
                             f"others, got {sorted(map(str, loaded))}; for several inputs "
                             "save a TensorDataset(X1, X2, ..., Y)")
        return (loaded[keys["x"]],), loaded[keys["y"]]
    if isinstance(loaded, (tuple, list)) and len(loaded) == 2:
        return (loaded[0],), loaded[1]
    raise InputError(f"DATA {path} holds a {type(loaded).__name__}; expected a tuple (X, Y), "
                     "a dict with 'x' and 'y', or a TensorDataset")


def _tensor_pair(loaded: Any, path: Path) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """The inputs and target of a loaded DATA file: tensors with the same, non-zero, number of
    examples."""
    import torch

    inputs, target = _unpack(loaded, path)
    for name, tensor in [*(("X", t) for t in inputs), ("Y", target)]:
        if not isinstance(tensor, torch.Tensor):
            raise InputError(f"DATA {path}: {name} is a {type(tensor).__name__}, not a tensor")
        if tensor.dim() == 0:
            raise InputError(f"DATA {path}: {name} is a 0-dim tensor; the first dimension "
                             "indexes examples")
        if tensor.layout != torch.strided:
            # slicing it into batches fails in torch with a message of several kilobytes
            raise InputError(f"DATA {path}: {name} is a {str(tensor.layout).removeprefix('torch.')}"
                             " tensor; save it dense (tensor.to_dense())")
    sizes = {t.shape[0] for t in (*inputs, target)}
    if len(sizes) != 1:
        raise InputError(f"DATA {path}: inputs and target disagree in their number of examples "
                         f"({sorted(sizes)})")
    if target.shape[0] == 0:
        raise InputError(f"DATA {path} holds no examples")
    return tuple(inputs), target


def _tensor_batches(path: Path, settings: BatchSettings
                    ) -> tuple[list[tuple[Any, torch.Tensor]], int, str]:
    from quotientsharp.models.files import begins_as_json_object, load_torch_file

    if begins_as_json_object(path):
        named = f"its suffix is {path.suffix!r}" if path.suffix else "it has no suffix"
        raise InputError(f"DATA {path} begins like JSON lines (with '{{') but {named}: JSON "
                         "lines are read from a file named with one of the suffixes "
                         f"{', '.join(JSONL_SUFFIXES)}")
    neither = f"JSON lines ({', '.join(JSONL_SUFFIXES)}) nor a torch.save file"
    try:
        loaded = load_torch_file(path, "DATA", neither, weights_only=None)
    except ValueError as err:
        raise InputError(str(err)) from err
    inputs, target = _tensor_pair(loaded, path)
    if settings.loss == "cross_entropy" and target.is_floating_point() and target.dim() == 1:
        raise InputError(f"DATA {path}: Y is a floating vector; cross-entropy needs integer "
                         "class labels (or class probabilities [N, C]); pass --loss mse for "
                         "regression")
    batches: list[tuple[Any, torch.Tensor]] = []
    count = target.shape[0]
    for start in range(0, count, settings.batch_size)[:settings.max_batches]:
        stop = start + settings.batch_size
        x = tuple(t[start:stop] for t in inputs)
        batches.append((x[0] if len(x) == 1 else x, target[start:stop]))
    return batches, sum(len(b[1]) for b in batches), "tensors"


def load_batches(data_path: str | os.PathLike, model: nn.Module, model_path: str | os.PathLike,
                 settings: BatchSettings) -> tuple[list, int, str]:
    """``(batches, number of examples used, data kind)`` for DATA (the forms of
    :mod:`quotientsharp.cli.measure`)."""
    path, model_path = existing_file(data_path, "DATA"), Path(model_path)
    if path.suffix.lower() in JSONL_SUFFIXES:
        return _jsonl_batches(path, model, model_path, settings)
    _no_tokenizer_needed(settings, f"DATA {path} holds tensors")
    return _tensor_batches(path, settings)


def _no_tokenizer_needed(settings: BatchSettings, what: str) -> None:
    """Refuse ``--tokenizer`` (and a ``--max-length`` other than the default) where nothing is
    tokenised: a given option counts, and one that changes nothing would leave the user
    believing it did."""
    if settings.tokenizer is not None:
        raise InputError(f"--tokenizer {settings.tokenizer} is given but {what}: there is no "
                         "text to tokenise; drop --tokenizer, or give text rows "
                         "{\"text\": ..., \"label\": ...}")
    # another length than the default truncated nothing: pre-tokenised rows are taken whole
    if settings.max_length != BatchSettings.max_length:
        raise InputError(f"--max-length {settings.max_length} is given but {what}: only text "
                         "rows are truncated; drop --max-length, or shorten the rows yourself")

