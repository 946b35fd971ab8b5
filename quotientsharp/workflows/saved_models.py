"""``quotientsharp measure`` and ``study``: the ``--device`` and MODEL, a HuggingFace directory
or a ``torch.save``'d module (:mod:`quotientsharp.cli.measure`); transformers is imported only
when needed."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quotientsharp.core.scalars import shortened
from quotientsharp.workflows.options import InputError

if TYPE_CHECKING:
    import torch
    from torch import nn


def check_device(text: str) -> torch.device:
    """The device of ``--device``, or an :class:`InputError` when this torch or machine lacks
    it."""
    import torch

    try:
        device = torch.device(text)
    except RuntimeError as err:
        raise InputError(f"--device {text!r}: {err}") from err
    if device.type == "meta":
        raise InputError("--device meta holds no data: choose cpu or an accelerator")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch build has no CUDA support" if torch.version.cuda is None
                   else "no CUDA device is visible")
            raise InputError(f"--device {text}: CUDA is not available ({why}; torch "
                             f"{torch.__version__}); use --device cpu")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise InputError(f"--device {text}: this machine has {count} CUDA device(s)")
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"--device {text} is not usable here: {first}") from err
    return device


def quiet_transformers() -> Callable[[], None]:
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


def import_transformers(what: str) -> Any:
    """``transformers``, offline; :class:`InputError` naming ``what`` needs it if missing."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError as err:
        raise InputError(f"{what} needs the 'transformers' package (pip install "
                         "quotientsharp[hf])") from err
    return transformers


def _unreadable_weights(directory: Path, err: Exception) -> InputError:
    """One line for weights that transformers cannot read: damaged, truncated or missing."""
    from quotientsharp.models.files import first_line

    return InputError(f"MODEL {directory}: transformers cannot load its weights "
                      f"({first_line(err, 300)}); are the files save_pretrained wrote there "
                      "damaged, truncated or missing?")


def _load_pretrained(directory: Path) -> nn.Module:
    from safetensors import SafetensorError

    from quotientsharp.models.files import architecture_class, first_line, read_json_file

    transformers = import_transformers(f"MODEL directory {directory}")
    # transformers' own message for a broken config.json names no MODEL and hides the reason
    if not isinstance(read_json_file(directory / "config.json", "MODEL"), dict):
        raise InputError(f"MODEL {directory / 'config.json'} is not a HuggingFace config: "
                         "not a JSON object")
    restore = quiet_transformers()
    try:
        config = transformers.AutoConfig.from_pretrained(directory, local_files_only=True)
        try:
            # a transformers class, looked up by name: typed Any, as the module's attributes are
            model_class: Any = architecture_class(
                transformers, getattr(config, "architectures", None), directory / "config.json")
        except ValueError as err:
            raise InputError(str(err)) from None
        if model_class is None:
            model_class = transformers.AutoModelForSequenceClassification
        try:
            model, info = model_class.from_pretrained(directory, local_files_only=True,
                                                      attn_implementation="eager",
                                                      output_loading_info=True)
        except RuntimeError as err:
            # transformers' own message points at a report it printed (silenced here)
            raise _config_mismatch(directory, model_class, err) from err
        except (OSError, SafetensorError, pickle.UnpicklingError, EOFError) as err:
            raise _unreadable_weights(directory, err) from err
        except ImportError as err:
            # a package the config asks for (bitsandbytes for a model saved quantised)
            raise InputError(f"MODEL {directory}: transformers cannot load it without a "
                             f"package that is not installed here ({first_line(err, 300)})"
                             ) from err
    finally:
        restore()
    missing = list(info.get("missing_keys") or [])
    if missing:
        shown = shortened(sorted(missing), 6)
        raise InputError(f"MODEL {directory}: the weights lack {len(missing)} tensor(s) of "
                         f"{model_class.__name__} ({shown}); a fresh, untrained part would be "
                         "measured. Save the complete model with save_pretrained")
    unused = list(info.get("unexpected_keys") or [])
    if unused:
        # transformers drops weights the config has no place for (a config.json edited to
        # fewer layers): the model measured would be another, smaller one
        shown = shortened(sorted(unused), 6)
        raise InputError(f"MODEL {directory}: the weights hold {len(unused)} tensor(s) that "
                         f"{model_class.__name__} built from config.json has no place for "
                         f"({shown}); they would be left out of the model measured. Was "
                         "config.json edited or copied from another model?")
    return model


def _config_mismatch(directory: Path, model_class: Any, err: RuntimeError) -> Exception:
    """An :class:`InputError` naming the tensors whose shapes in the weights differ from those
    of ``config.json``, or naming ``err`` when the failure is not a shape mismatch."""
    try:
        _, info = model_class.from_pretrained(directory, local_files_only=True,
                                              attn_implementation="eager",
                                              output_loading_info=True,
                                              ignore_mismatched_sizes=True)
    except Exception:  # noqa: BLE001 - the original error is the one to report
        return _unreadable_weights(directory, err)
    mismatched = list(info.get("mismatched_keys") or [])
    if not mismatched:
        return _unreadable_weights(directory, err)
    shown = "; ".join(f"{entry[0]}: weights {tuple(entry[1])}, config {tuple(entry[2])}"
                      if isinstance(entry, (tuple, list)) and len(entry) == 3 else str(entry)
                      for entry in mismatched[:4])
    more = f" (and {len(mismatched) - 4} more)" if len(mismatched) > 4 else ""
    return InputError(f"MODEL {directory}: config.json does not match the weights: "
                      f"{len(mismatched)} tensor(s) have other shapes ({shown}{more}); was "
                      "config.json edited or copied from another model?")


def load_measured_model(path: str | os.PathLike, device: Any = None,
                        dtype: str | None = None) -> nn.Module:
    """The model behind MODEL (see :mod:`quotientsharp.cli.measure`), in eval mode, on
    ``device`` (default the CPU), cast to ``dtype`` (``"float64"``; default as saved)."""
    import torch

    from quotientsharp.models.peft_loading import load_peft_directory, saved_adapters

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"MODEL {path} does not exist")
    if path.is_dir() and saved_adapters(path):
        # a saved PEFT adapter: its base (with weights) and head, as PEFT builds them
        model = load_peft_directory(path, weights=True)
    elif path.is_dir():
        if not (path / "config.json").is_file():
            raise InputError(f"MODEL directory {path} has no config.json (expected a "
                             "HuggingFace model saved with save_pretrained)")
        model = _load_pretrained(path)
    else:
        from quotientsharp.models.loading import load_model

        model = load_model(path)
        if any(p.is_meta for p in model.parameters()):
            raise InputError(f"MODEL {path} is a config without weights; give a directory "
                             "written by save_pretrained or a torch.save'd module")
    # load_model refuses a file that holds no module
    model = model.eval()
    if device is not None:
        model = model.to(device=device)
    return model if dtype is None else model.to(dtype=getattr(torch, dtype))

