"""The file readers under :mod:`.loading` and :mod:`.peft_loading`, shared with DATA's: a bad
file is one ``ValueError`` naming its role and its path.

A HuggingFace config is built on the meta device: the architecture without weights, and no
download. ``torch`` and ``transformers`` are imported only when a model is read.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quotientsharp.core.scalars import shortened

if TYPE_CHECKING:
    from torch import nn

#: What ``torch.load`` raises for bytes that are not (wholly) a ``torch.save`` file (the
#: unpickler, fed other bytes, fails in any of these ways).
UNREADABLE_TORCH_FILE = (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, KeyError,
                         IndexError, TypeError, OverflowError, struct.error)
#: How a ``torch.save`` file begins: a zip archive (the format since torch 1.6) or a pickle
#: (protocol 2 or later, the older format).
_ZIP_MAGIC, _PICKLE_MAGIC = b"PK\x03\x04", b"\x80"


def first_line(err: BaseException, limit: int = 200) -> str:
    """``err`` as ``Type: first line of its message``, at most ``limit`` characters (a bare
    ``KeyError``'s message is only the key)."""
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= limit else text[:limit - 3] + "..."


class DuplicateKeyError(ValueError):
    """A JSON object that gives one key twice (:func:`unique_keys`)."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` of ``json.loads``: the object's dict, or a
    :class:`DuplicateKeyError` naming the first key given twice (``json`` keeps the last value
    of a repeated key without a word, and the first would be ignored)."""
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        repeated = next(key for index, key in enumerate(keys) if key in keys[:index])
        raise DuplicateKeyError(f"the key {repeated!r} is given twice in one object (JSON "
                                "would keep the last value silently); give it once")
    return dict(pairs)


def read_json_file(path: Path, label: str) -> Any:
    """The JSON value in the file ``path``; a ``ValueError`` naming ``label`` (``"MODEL"``) and
    the file when it is not UTF-8 or not valid JSON (Python's own errors name neither), or
    when an object gives one key twice."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(f"{label} {path} is not valid JSON: not UTF-8 text (byte "
                         f"{raw[err.start]:#04x} at offset {err.start})") from None
    try:
        return json.loads(text, object_pairs_hook=unique_keys)
    except DuplicateKeyError as err:
        raise ValueError(f"{label} {path}: {err}") from None
    except json.JSONDecodeError as err:
        several = (" (it holds more than one JSON value, as a JSON lines file does)"
                   if err.msg == "Extra data" else "")
        raise ValueError(f"{label} {path} is not valid JSON: {err}{several}") from None


def begins_as_json_object(path: Path) -> bool:
    """Whether the file ``path`` begins with ``{`` (after white space and a byte order mark): a
    JSON object, or JSON lines, never a torch.save file."""
    with path.open("rb") as handle:
        return handle.read(64).lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{")


def _zip_problem(path: Path) -> str | None:
    """Why the zip archive ``path`` is not one ``torch.save`` wrote, or ``None``."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError, EOFError):
        return ("it begins as a zip archive (torch.save's format) but is damaged or truncated "
                "(no zip directory at its end): copy or save it again")
    if not any(name.endswith("/data.pkl") for name in names):
        shown = shortened(names, 3)
        return f"it is a zip archive that torch.save did not write (no data.pkl in it: {shown})"
    return None


def _text_start(head: bytes) -> str | None:
    """``head`` as text when it is printable UTF-8 (a character cut at the end dropped)."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.reason != "unexpected end of data":
            return None
        text = head[:err.start].decode("utf-8")
    printable = all(c.isprintable() or c in "\r\n\t" for c in text)
    return text.lstrip("\ufeff") if printable and text.strip() else None


def torch_file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a ``torch.save`` file by its first bytes (empty, text, a zip
    archive of other files or a damaged one), or ``None``: then ``torch.load`` tries it."""
    with path.open("rb") as handle:
        head = handle.read(64)
    if not head:
        return "the file is empty (0 bytes)"
    if head.startswith(_ZIP_MAGIC):
        return _zip_problem(path)
    text = None if head.startswith(_PICKLE_MAGIC) else _text_start(head)
    return None if text is None else f"it is a text file beginning {text.splitlines()[0][:40]!r}"


def load_torch_file(path: Path, label: str, neither: str, weights_only: bool | None) -> Any:
    """The object that ``torch.save`` wrote to ``path``, on the CPU (``weights_only``:
    ``True``, tensors and containers only; ``False``, any object of a trusted file; ``None``,
    the former then the latter); anything else is a ``ValueError`` naming ``label`` and why."""
    import torch

    if (problem := torch_file_problem(path)) is not None:
        raise ValueError(f"{label} {path} is neither {neither}: {problem}")
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=weights_only is not False)
        except pickle.UnpicklingError:
            if weights_only is not None:
                raise
            # an object other than tensors (a TensorDataset): trusted like the module file
            return torch.load(path, map_location="cpu", weights_only=False)
    except (ImportError, AttributeError) as err:
        # torch.save pickles a class by its import path: one defined in the saving script's
        # __main__ (or in a module not on sys.path here) cannot be found again
        raise ValueError(f"{label} {path} holds an object whose class cannot be imported here "
                         f"({str(err).splitlines()[0]}): torch.save stores the class by its "
                         "import path, so define it in a module importable where you run "
                         "quotientsharp (on sys.path or PYTHONPATH, not in the saving script "
                         "itself) and save again") from err
    except UNREADABLE_TORCH_FILE as err:
        with path.open("rb") as handle:
            head = handle.read(8)
        why = (f"its pickle cannot be read, truncated or damaged? ({first_line(err)})"
               if head.startswith(_PICKLE_MAGIC) else f"it begins with the bytes {head!r}, "
               "neither a zip archive nor a pickle (the two formats of torch.save)")
        raise ValueError(f"{label} {path} is neither {neither}: {why}") from err


def architecture_class(transformers: Any, architectures: object,
                       config_file: Path) -> type[nn.Module] | None:
    """The transformers class named first in a config's ``architectures`` (``None`` where the
    entry is absent or empty: the caller's Auto class decides).

    Raises
    ------
    ValueError
        Naming the class and ``config_file``, if transformers has no model class of that name
        (a custom or misspelt architecture) or the entry is not a list of class names: the
        Auto class would otherwise build another model without a word.
    """
    from torch import nn

    if architectures is None or architectures == []:
        return None
    if not (isinstance(architectures, list) and all(isinstance(a, str) for a in architectures)):
        raise ValueError(f"MODEL {config_file}: 'architectures' must be a list of class names, "
                         f"got {architectures!r:.80}")
    model_class = getattr(transformers, architectures[0], None)
    if not (isinstance(model_class, type) and issubclass(model_class, nn.Module)):
        raise ValueError(f"MODEL {config_file}: architectures names {architectures[0]!r}, not "
                         f"a model class of transformers {transformers.__version__} (a custom "
                         "or misspelt class?); name a transformers class there, or load the "
                         "model in Python and pass it to quotientsharp's API")
    return model_class


def _config_model(config_file: Path) -> nn.Module:
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError as err:
        raise RuntimeError("reading a HuggingFace config needs the 'transformers' package "
                           "(pip install quotientsharp[hf])") from err
    data = read_json_file(config_file, "MODEL")
    if not isinstance(data, dict) or "model_type" not in data:
        raise ValueError(f"MODEL {config_file} is not a HuggingFace config: no 'model_type' "
                         "entry")
    model_type = data["model_type"]
    try:
        config_class = transformers.CONFIG_MAPPING[model_type]
    except (KeyError, TypeError) as err:
        raise ValueError(f"MODEL {config_file}: model_type {model_type!r} is unknown to "
                         f"transformers {transformers.__version__}") from err
    model_class = architecture_class(transformers, data.get("architectures"), config_file)
    try:
        config = config_class.from_dict(data)
        # meta tensors: the architecture without allocating (or initialising) any weights
        with torch.device("meta"):
            if model_class is not None:
                return model_class(config)
            return transformers.AutoModel.from_config(config)
    except (TypeError, ValueError, KeyError, AttributeError) as err:
        raise ValueError(f"MODEL {config_file}: transformers cannot build the {model_type} "
                         f"model it describes ({first_line(err)})") from err

