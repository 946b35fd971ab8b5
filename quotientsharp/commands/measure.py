"""``quotientsharp measure MODEL DATA``: sharpness of a saved model on a dataset.

MODEL is one of

- a HuggingFace model directory (``config.json`` and the weights, as ``save_pretrained``
  writes them). The class named in ``config.json``'s ``architectures`` is loaded (e.g.
  ``BertForSequenceClassification``), offline, with eager attention; every weight must be in
  the directory (a missing tensor, such as an untrained classification head, is an error);
- a file written by ``torch.save(module)`` (a whole ``nn.Module``, loaded with
  ``weights_only=False``: only load files you trust).

DATA is one of

- a JSON-lines file (``.jsonl``, one object per line). Either text rows
  ``{"text": "...", "label": 1}`` (optional ``"text_pair"`` for sentence pairs), tokenised with
  the tokenizer saved in the MODEL directory (or ``--tokenizer DIR``), offline; or pre-tokenised
  rows ``{"input_ids": [101, 7592, 102], "label": 1}`` with optional ``"attention_mask"`` and
  ``"token_type_ids"`` (lists of the same length), padded per batch with the config's
  ``pad_token_id`` (0 if it has none) and attention mask 0. Rows with ``input_ids`` need no
  tokenizer. Labels are integers (cross-entropy) or numbers (``--loss mse``); ``"labels"`` is
  accepted for ``"label"``;
- a file written by ``torch.save``: a tuple ``(X, Y)``, a dict with ``"x"`` and ``"y"``, or a
  ``torch.utils.data.TensorDataset`` (the last tensor is the target, the others are the
  inputs, passed positionally). Batches are ``model(X[i:i + B])`` against ``Y[i:i + B]``.

The data are split into consecutive batches of ``--batch-size`` (the last one may be smaller),
at most ``--max-batches`` of them; every measure runs on the same batches, per batch, and
reports the mean over batches (``quotientsharp.sharpness``). A table goes to stdout; ``--json
OUT`` also writes the settings, every per-batch value and the values as JSON. Exit status 0 on
success, 2 on bad input (with a one-line error on stderr).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["add_parser", "load_batches", "load_measured_model", "run"]

PROG = "quotientsharp measure"
ASCENT_MEASURES = ("worst_case", "adaptive", "geodesic")
#: Files whose presence in a model directory means that it holds a tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json",
                   "spiece.model", "sentencepiece.bpe.model", "tokenizer.model")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


class InputError(ValueError):
    """Bad user input: reported as one line on stderr, exit status 2."""


# ---------------------------------------------------------------------------- parser
def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``measure`` subcommand on an ``argparse`` subparsers object."""
    parser = subparsers.add_parser(
        "measure", help="sharpness of a saved model (HuggingFace directory or torch.save'd "
        "module) on a dataset (JSONL or torch.save'd tensors)", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="HuggingFace model directory or torch.save'd nn.Module")
    parser.add_argument("data", help="JSONL file (text or input_ids rows) or torch.save'd "
                        "(X, Y) / {'x', 'y'} / TensorDataset")
    parser.add_argument("--measure", action="append", default=None, metavar="NAME",
                        help="average, worst_case, adaptive, geodesic or relative_flatness; "
                        "repeat (or give a comma list) for several (default: geodesic)")
    parser.add_argument("--rho", type=float, default=None,
                        help="radius (standard deviation for average); required except for "
                        "relative_flatness")
    parser.add_argument("--metric", default="inv",
                        help="geodesic: inv, mix or euclidean (default inv)")
    parser.add_argument("--order", default="2", help="geodesic: 1, 2 or exact (default 2)")
    parser.add_argument("--eps", type=float, default=0.0,
                        help="geodesic: Gram relaxation G^T G + eps I (default 0)")
    parser.add_argument("--p", default="2", help="worst_case and adaptive: 2 or inf "
                        "(default 2)")
    parser.add_argument("--samples", type=int, default=1,
                        help="average: Gaussian draws per batch (default 1)")
    parser.add_argument("--layer", default=None, help="relative_flatness: module name "
                        "(default: the last nn.Linear)")
    parser.add_argument("--loss", default="cross_entropy",
                        help="cross_entropy (default) or mse")
    parser.add_argument("--batch-size", type=int, default=32, help="examples per batch "
                        "(default 32)")
    parser.add_argument("--max-batches", type=int, default=None,
                        help="use at most this many batches (default: all)")
    parser.add_argument("--n-iter", type=int, default=20,
                        help="Auto-PGD steps of the ascent measures (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--max-length", type=int, default=128,
                        help="text rows: truncate to this many tokens (default 128)")
    parser.add_argument("--tokenizer", default=None, metavar="DIR",
                        help="tokenizer directory for text rows (default: the MODEL directory)")
    parser.add_argument("--dtype", choices=["float32", "float64"], default=None,
                        help="cast the model (default: as saved)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT",
                        help="also write settings, per-batch values and values to OUT")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bars (default: only on a terminal)")
    parser.set_defaults(func=run)
    return parser


# ---------------------------------------------------------------------------- option checks
def _measure_names(requested: Sequence[str] | None) -> list[str]:
    from ..sharpness import MEASURES

    aliases = {"worst-case": "worst_case", "relative-flatness": "relative_flatness"}
    names: list[str] = []
    for item in requested or ["geodesic"]:
        for part in item.split(","):
            part = part.strip()
            name = aliases.get(part, part)
            if name not in MEASURES:
                raise InputError(f"--measure: unknown measure {part!r}; choose from "
                                 f"{', '.join(sorted(MEASURES))}")
            if name not in names:
                names.append(name)
    return names


def _positive_int(value: int | None, option: str) -> None:
    if value is not None and value < 1:
        raise InputError(f"{option} must be an integer >= 1, got {value}")


def _order(text: str) -> int | str:
    if text in ("1", "2"):
        return int(text)
    if text == "exact":
        return text
    raise InputError(f"--order must be 1, 2 or exact, got {text!r}")


def _check_options(args: argparse.Namespace, measures: Sequence[str]) -> dict[str, Any]:
    """Validated options shared by all measures."""
    if args.loss not in ("cross_entropy", "mse"):
        raise InputError(f"--loss must be cross_entropy or mse, got {args.loss!r}")
    if args.metric not in ("inv", "mix", "euclidean"):
        raise InputError(f"--metric must be inv, mix or euclidean, got {args.metric!r}")
    if args.p not in ("2", "inf"):
        raise InputError(f"--p must be 2 or inf, got {args.p!r}")
    for value, option in ((args.batch_size, "--batch-size"), (args.max_batches, "--max-batches"),
                          (args.n_iter, "--n-iter"), (args.samples, "--samples"),
                          (args.max_length, "--max-length")):
        _positive_int(value, option)
    if args.seed < 0:
        raise InputError(f"--seed must be >= 0, got {args.seed}")
    needs_radius = [m for m in measures if m != "relative_flatness"]
    if needs_radius and args.rho is None:
        raise InputError(f"--rho is required for {', '.join(needs_radius)}")
    if args.rho is not None and not (math.isfinite(args.rho) and args.rho > 0):
        raise InputError(f"--rho must be a finite number > 0, got {args.rho}")
    if not (math.isfinite(args.eps) and args.eps >= 0):
        raise InputError(f"--eps must be a finite number >= 0, got {args.eps}")
    return {"order": _order(args.order)}


# ---------------------------------------------------------------------------- model
def _quiet_transformers():
    """Silence transformers' load reports and progress bars; returns a restore function."""
    from transformers.utils import logging as hf_logging

    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    def restore() -> None:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()

    return restore


def _import_transformers(what: str):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError as err:
        raise InputError(f"{what} needs the 'transformers' package (pip install "
                         "quotientsharp[hf])") from err
    return transformers


def _load_pretrained(directory: Path) -> nn.Module:
    from torch import nn

    transformers = _import_transformers(f"MODEL directory {directory}")
    restore = _quiet_transformers()
    try:
        config = transformers.AutoConfig.from_pretrained(directory, local_files_only=True)
        architectures = getattr(config, "architectures", None) or []
        model_class = getattr(transformers, architectures[0], None) if architectures else None
        if not (isinstance(model_class, type) and issubclass(model_class, nn.Module)):
            model_class = transformers.AutoModelForSequenceClassification
        model, info = model_class.from_pretrained(directory, local_files_only=True,
                                                  attn_implementation="eager",
                                                  output_loading_info=True)
    finally:
        restore()
    missing = list(info.get("missing_keys") or [])
    if missing:
        shown = ", ".join(sorted(missing)[:6]) + (", ..." if len(missing) > 6 else "")
        raise InputError(f"MODEL {directory}: the weights lack {len(missing)} tensor(s) of "
                         f"{model_class.__name__} ({shown}); a fresh, untrained part would be "
                         "measured. Save the complete model with save_pretrained")
    return model


def load_measured_model(path: str | os.PathLike) -> nn.Module:
    """The model behind MODEL (see the module docstring), in eval mode, on the CPU."""
    from torch import nn

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"MODEL {path} does not exist")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise InputError(f"MODEL directory {path} has no config.json (expected a "
                             "HuggingFace model saved with save_pretrained)")
        model = _load_pretrained(path)
    else:
        from ..models.cli import load_model

        model = load_model(path)
        if any(p.is_meta for p in model.parameters()):
            raise InputError(f"MODEL {path} is a config without weights; give a directory "
                             "written by save_pretrained or a torch.save'd module")
    if not isinstance(model, nn.Module):
        raise InputError(f"MODEL {path} holds a {type(model).__name__}, not a torch.nn.Module")
    return model.eval()


# ---------------------------------------------------------------------------- data
def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"DATA {path}, line {number}: not valid JSON ({err.msg})") \
                    from err
            if not isinstance(row, dict):
                raise InputError(f"DATA {path}, line {number}: expected a JSON object, got "
                                 f"{type(row).__name__}")
            if "label" not in row and "labels" in row:
                row["label"] = row.pop("labels")
            if "label" not in row:
                raise InputError(f"DATA {path}, line {number}: no 'label' entry (keys: "
                                 f"{sorted(row)})")
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
            raise InputError(f"DATA {path}: cross-entropy needs integer class labels; for "
                             "real-valued targets pass --loss mse")
        bad = [(row["_line"], v) for row, v in zip(rows, values, strict=True)
               if v < 0 or (num_labels is not None and v >= num_labels)]
        if bad:
            line, value = bad[0]
            limit = (f" in [0, {num_labels}): the model has {num_labels} labels"
                     if num_labels is not None else " (negative)")
            raise InputError(f"DATA {path}, line {line}: label {value} is not a class "
                             f"index{limit}")
        return torch.tensor(values, dtype=torch.long)
    try:
        return torch.tensor(values, dtype=torch.float32)
    except ValueError as err:
        raise InputError(f"DATA {path}: labels of unequal lengths ({err})") from err


def _token_list(row: dict[str, Any], key: str, path: Path, length: int | None) -> list[int]:
    value = row[key]
    if (not isinstance(value, list) or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise InputError(f"DATA {path}, line {row['_line']}: {key!r} must be a non-empty list "
                         "of integers")
    if length is not None and len(value) != length:
        raise InputError(f"DATA {path}, line {row['_line']}: {key!r} has {len(value)} entries, "
                         f"input_ids has {length}")
    return value


def _pretokenised_batch(rows: Sequence[dict[str, Any]], path: Path,
                        pad_id: int) -> dict[str, torch.Tensor]:
    import torch

    ids = [_token_list(row, "input_ids", path, None) for row in rows]
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
    return batch


def _find_tokenizer(model_path: Path, tokenizer_dir: str | None):
    """A tokenizer from ``--tokenizer`` or the MODEL directory, or ``None`` if there is none."""
    directory = Path(tokenizer_dir) if tokenizer_dir is not None else model_path
    if tokenizer_dir is not None and not directory.is_dir():
        raise FileNotFoundError(f"--tokenizer {directory} is not a directory")
    if not directory.is_dir() or not any((directory / f).is_file() for f in TOKENIZER_FILES):
        if tokenizer_dir is not None:
            raise InputError(f"--tokenizer {directory} holds no tokenizer files "
                             f"({', '.join(TOKENIZER_FILES)})")
        return None
    transformers = _import_transformers("tokenising text rows")
    restore = _quiet_transformers()
    try:
        return transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    finally:
        restore()


def _text_batch(rows: Sequence[dict[str, Any]], path: Path, tokenizer,
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


def _jsonl_batches(path: Path, model: nn.Module, model_path: Path, args: argparse.Namespace
                   ) -> tuple[list[dict[str, torch.Tensor]], int, str]:
    rows = _read_jsonl(path)
    config = getattr(model, "config", None)
    num_labels = getattr(config, "num_labels", None) if config is not None else None
    pretokenised = "input_ids" in rows[0]
    for row in rows:
        if ("input_ids" in row) != pretokenised:
            raise InputError(f"DATA {path}, line {row['_line']}: mixes pre-tokenised rows "
                             "('input_ids') and text rows ('text'); use one kind")
    tokenizer = None
    if not pretokenised:
        tokenizer = _find_tokenizer(model_path, args.tokenizer)
        if tokenizer is None:
            raise InputError(f"DATA {path} has text rows but MODEL {model_path} has no "
                             "tokenizer (none of " + ", ".join(TOKENIZER_FILES) + "); pass "
                             "--tokenizer DIR or give pre-tokenised rows {\"input_ids\": [...], "
                             "\"attention_mask\": [...], \"label\": ...}")
    pad_id = getattr(config, "pad_token_id", None) if config is not None else None
    pad_id = pad_id if isinstance(pad_id, int) else 0
    batches = []
    for start in range(0, len(rows), args.batch_size):
        if args.max_batches is not None and len(batches) >= args.max_batches:
            break
        chunk = rows[start:start + args.batch_size]
        inputs = (_pretokenised_batch(chunk, path, pad_id) if pretokenised
                  else _text_batch(chunk, path, tokenizer, args.max_length))
        batches.append({**inputs, "labels": _labels(chunk, path, args.loss, num_labels)})
    kind = "pre-tokenised JSONL" if pretokenised else "text JSONL"
    return batches, sum(len(b["labels"]) for b in batches), kind


def _tensor_pair(loaded: Any, path: Path) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    import torch
    from torch.utils.data import TensorDataset

    if isinstance(loaded, TensorDataset):
        tensors = tuple(loaded.tensors)
        if len(tensors) < 2:
            raise InputError(f"DATA {path}: the TensorDataset holds {len(tensors)} tensor(s); "
                             "it needs inputs and a target")
        inputs, target = tensors[:-1], tensors[-1]
    elif isinstance(loaded, dict):
        keys = {str(k).lower(): k for k in loaded}
        if "x" not in keys or "y" not in keys:
            raise InputError(f"DATA {path}: a dict needs entries 'x' and 'y', got "
                             f"{sorted(map(str, loaded))}")
        inputs, target = (loaded[keys["x"]],), loaded[keys["y"]]
    elif isinstance(loaded, (tuple, list)) and len(loaded) == 2:
        inputs, target = (loaded[0],), loaded[1]
    else:
        raise InputError(f"DATA {path} holds a {type(loaded).__name__}; expected a tuple (X, Y), "
                         "a dict with 'x' and 'y', or a TensorDataset")
    for name, tensor in [*(("X", t) for t in inputs), ("Y", target)]:
        if not isinstance(tensor, torch.Tensor):
            raise InputError(f"DATA {path}: {name} is a {type(tensor).__name__}, not a tensor")
        if tensor.dim() == 0:
            raise InputError(f"DATA {path}: {name} is a 0-dim tensor; the first dimension "
                             "indexes examples")
    sizes = {t.shape[0] for t in (*inputs, target)}
    if len(sizes) != 1:
        raise InputError(f"DATA {path}: inputs and target disagree in their number of examples "
                         f"({sorted(sizes)})")
    if target.shape[0] == 0:
        raise InputError(f"DATA {path} holds no examples")
    return tuple(inputs), target


def _tensor_batches(path: Path, args: argparse.Namespace) -> tuple[list[tuple], int, str]:
    import torch

    unreadable = (pickle.UnpicklingError, RuntimeError, EOFError, ImportError, AttributeError,
                  ValueError)
    try:
        try:
            loaded = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            # a TensorDataset is a pickled object: trusted like the module file itself
            loaded = torch.load(path, map_location="cpu", weights_only=False)
    except unreadable as err:
        raise InputError(f"DATA {path} is neither JSON lines ({', '.join(JSONL_SUFFIXES)}) nor "
                         f"a torch.save file: {str(err).splitlines()[0]}") from err
    inputs, target = _tensor_pair(loaded, path)
    if args.loss == "cross_entropy" and target.is_floating_point() and target.dim() == 1:
        raise InputError(f"DATA {path}: Y is a floating vector; cross-entropy needs integer "
                         "class labels (or class probabilities [N, C]); pass --loss mse for "
                         "regression")
    batches = []
    count = target.shape[0]
    for start in range(0, count, args.batch_size):
        if args.max_batches is not None and len(batches) >= args.max_batches:
            break
        stop = start + args.batch_size
        x = tuple(t[start:stop] for t in inputs)
        batches.append((x[0] if len(x) == 1 else x, target[start:stop]))
    return batches, sum(len(b[1]) for b in batches), "tensors"


def load_batches(data_path: str | os.PathLike, model: nn.Module, model_path: str | os.PathLike,
                 args: argparse.Namespace) -> tuple[list, int, str]:
    """``(batches, number of examples used, data kind)`` for DATA (see the module docstring)."""
    path, model_path = Path(data_path), Path(model_path)
    if not path.is_file():
        raise FileNotFoundError(f"DATA {path} does not exist" if not path.exists()
                                else f"DATA {path} is not a file")
    if path.suffix.lower() in JSONL_SUFFIXES:
        return _jsonl_batches(path, model, model_path, args)
    return _tensor_batches(path, args)


# ---------------------------------------------------------------------------- measuring
def _options_for(measure: str, args: argparse.Namespace, order: int | str) -> dict[str, Any]:
    options: dict[str, Any] = {"loss": args.loss, "seed": args.seed, "progress": args.progress}
    if measure in ASCENT_MEASURES:
        options["n_iter"] = args.n_iter
    if measure == "geodesic":
        options.update(metric=args.metric, order=order, eps=args.eps)
    if measure in ("worst_case", "adaptive"):
        options["p"] = 2 if args.p == "2" else "inf"
    if measure == "average":
        options["samples"] = args.samples
    if measure == "relative_flatness" and args.layer is not None:
        options["layer"] = args.layer
    return options


def _label(measure: str, settings: dict[str, Any]) -> str:
    if measure == "geodesic":
        return f"geodesic ({settings['metric']}, order {settings['order']})"
    if measure in ("worst_case", "adaptive") and settings.get("p") == "inf":
        return f"{measure} (Linf)"
    return measure


def _jsonable(value: Any) -> Any:
    """Plain JSON types: tuples to lists, dtypes and other objects to strings, inf to 'inf'."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


def _table(rows: Sequence[dict[str, Any]]) -> str:
    header = (f"{'measure':28s} {'value':>12s} {'min batch':>12s} {'max batch':>12s} "
              f"{'clean loss':>11s} {'seconds':>8s}")
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(f"{row['label']:28s} {row['value']:12.5g} {min(row['per_batch']):12.5g} "
                     f"{max(row['per_batch']):12.5g} "
                     f"{sum(row['clean_losses']) / len(row['clean_losses']):11.5g} "
                     f"{row['seconds']:8.2f}")
    return "\n".join(lines)


def _measure(args: argparse.Namespace) -> int:
    import torch

    from ..sharpness import sharpness

    measures = _measure_names(args.measure)
    checked = _check_options(args, measures)
    model = load_measured_model(args.model)
    try:
        device = torch.device(args.device)
    except RuntimeError as err:
        raise InputError(f"--device: {err}") from err
    model = model.to(device=device)
    if args.dtype is not None:
        model = model.to(dtype=getattr(torch, args.dtype))
    batches, examples, data_kind = load_batches(args.data, model, args.model, args)
    parameters = sum(p.numel() for p in model.parameters())
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
    print(f"{PROG}: {type(model).__name__} ({parameters:,} parameters, {', '.join(dtypes)}, "
          f"{device}) on {examples} examples ({data_kind}) in {len(batches)} batch(es) of <= "
          f"{args.batch_size}")

    rows, results = [], {}
    for measure in measures:
        rho = None if measure == "relative_flatness" else args.rho
        tic = time.perf_counter()
        try:
            result = sharpness(model, batches, measure=measure, rho=rho,
                               **_options_for(measure, args, checked["order"]))
        except (TypeError, ValueError, IndexError, RuntimeError) as err:
            # the model and the data do not fit together (or an option does not fit the model)
            raise InputError(f"{measure} sharpness of MODEL {args.model} on DATA {args.data} "
                             f"failed: {err}") from err
        seconds = time.perf_counter() - tic
        row = {"label": _label(measure, result.settings), "value": result.value,
               "per_batch": result.per_batch, "clean_losses": result.clean_losses,
               "seconds": seconds}
        rows.append(row)
        results[measure] = {
            "value": result.value, "per_batch": result.per_batch,
            "clean_losses": result.clean_losses, "perturbed_losses": result.perturbed_losses,
            "perturbation_norms": result.perturbation_norms, "excluded": result.excluded,
            "settings": result.settings, "seconds": seconds}
    print(_table(rows))

    if args.json is not None:
        document = {
            "model": str(args.model), "data": str(args.data),
            "model_class": type(model).__name__, "parameters": parameters,
            "examples": examples, "data_kind": data_kind, "batches": len(batches),
            "settings": {"measures": measures, "rho": args.rho, "metric": args.metric,
                         "order": checked["order"], "eps": args.eps, "p": args.p,
                         "samples": args.samples, "layer": args.layer, "loss": args.loss,
                         "batch_size": args.batch_size, "max_batches": args.max_batches,
                         "n_iter": args.n_iter, "seed": args.seed,
                         "max_length": args.max_length, "dtype": args.dtype or dtypes,
                         "device": str(device)},
            "results": results,
            "value": {measure: results[measure]["value"] for measure in measures},
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(_jsonable(document), indent=2))
        print(f"wrote {args.json}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Execute the subcommand; returns the process exit status (2 on bad input)."""
    try:
        return _measure(args)
    except (OSError, ValueError, TypeError, KeyError, IndexError, RuntimeError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2
