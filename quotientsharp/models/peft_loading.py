"""Loading a saved PEFT LoRA adapter for discovery offline: a directory with adapter_config.json.

``peft_model.save_pretrained(path)`` writes ``adapter_config.json`` and the adapter weights
(``adapter_model.safetensors``), but not the base model. The base model's architecture is read
from a ``config.json`` beside ``adapter_config.json``, or else from the local directory that
``base_model_name_or_path`` names (no download). The base is built on the meta device (no base
weights are read or allocated); the adapters are injected with ``peft`` and trainable, and
their saved values are loaded, so that discovery can tell degenerate adapters (``B = 0``) apart.

``peft`` (``pip install quotientsharp[lora]``), ``transformers`` and ``safetensors`` are imported
only here, when such a directory is loaded.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

__all__ = ["ADAPTER_CONFIG", "load_peft_directory"]

#: The file that marks a directory as a saved PEFT adapter.
ADAPTER_CONFIG = "adapter_config.json"


def _base_config(path: Path, settings: dict[str, Any]) -> Path:
    """The base model's ``config.json``: beside the adapter, or in the local base directory."""
    beside = path / "config.json"
    if beside.is_file():
        return beside
    base = settings.get("base_model_name_or_path")
    if isinstance(base, str) and (Path(base) / "config.json").is_file():
        return Path(base) / "config.json"
    raise FileNotFoundError(
        f"{path / ADAPTER_CONFIG} names the base model {base!r}, which is not a local directory "
        "with config.json; offline discovery needs the base model's architecture: put its "
        f"config.json beside {ADAPTER_CONFIG}, or save the whole model with "
        "torch.save(peft_model, file)")


def _load_values(model: nn.Module, path: Path, adapter: str) -> int:
    """Replace the adapter's meta parameters by the saved tensors; returns how many."""
    import torch
    from torch import nn

    weights = path / "adapter_model.safetensors"
    if weights.is_file():
        from safetensors.torch import load_file

        saved = load_file(str(weights))
    elif (path / "adapter_model.bin").is_file():
        saved = torch.load(path / "adapter_model.bin", map_location="cpu", weights_only=True)
    else:
        return 0
    loaded = 0
    for module in model.modules():
        for local, parameter in list(module._parameters.items()):
            if parameter is None or not parameter.is_meta:
                continue
            # PEFT saves "...lora_A.weight" for "...lora_A.<adapter>.weight" (and
            # "...lora_embedding_A" for "...lora_embedding_A.<adapter>"): find the owner's name
            for name, owner in model.named_modules():
                if owner is module:
                    full = f"{name}.{local}" if name else local
                    break
            key = full.replace(f".{adapter}.", ".")
            if key.endswith(f".{adapter}"):
                key = key[: -len(adapter) - 1]
            if key in saved and tuple(saved[key].shape) == tuple(parameter.shape):
                module._parameters[local] = nn.Parameter(
                    saved[key].to(parameter.dtype), requires_grad=parameter.requires_grad)
                loaded += 1
    return loaded


def load_peft_directory(path: str | Path) -> nn.Module:
    """A ``peft.PeftModel`` from a saved adapter directory (see the module docstring).

    Raises
    ------
    RuntimeError
        If ``peft`` is not installed.
    FileNotFoundError, ValueError
        If the base model's config cannot be found offline, or ``adapter_config.json`` is not
        a LoRA adapter's.
    """
    path = Path(path)
    with (path / ADAPTER_CONFIG).open() as handle:
        settings = json.load(handle)
    if not isinstance(settings, dict) or str(settings.get("peft_type", "")).upper() != "LORA":
        raise ValueError(f"{path / ADAPTER_CONFIG}: peft_type "
                         f"{settings.get('peft_type') if isinstance(settings, dict) else None!r}"
                         ", only LoRA adapters are supported")
    try:
        import peft
    except ImportError as err:
        raise RuntimeError("reading a saved PEFT adapter needs the 'peft' package "
                           "(pip install quotientsharp[lora])") from err
    from quotientsharp.models.loading import _config_model

    base = _config_model(_base_config(path, settings))
    with warnings.catch_warnings():
        # PEFT copies the saved values into the meta adapters, a no-op that torch warns about:
        # _load_values assigns them instead
        warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter",
                                category=UserWarning)
        model = peft.PeftModel.from_pretrained(base, str(path), is_trainable=True)
    _load_values(model, path, "default")
    return model
