"""Loading a saved PEFT LoRA adapter for discovery offline: a directory with adapter_config.json.

``peft_model.save_pretrained(path)`` writes ``adapter_config.json`` and the adapter weights
(``adapter_model.safetensors``), but not the base model. The base model's architecture is read
from a ``config.json`` beside ``adapter_config.json``, or else from the local directory that
``base_model_name_or_path`` names (no download). The base is built on the meta device (no base
weights are read or allocated); the adapters are injected with ``peft`` and trainable, and
their saved values are loaded, so that discovery can tell degenerate adapters (``B = 0``) apart.

The adapters' names come from PEFT's layout of the saved files: ``save_pretrained`` writes the
adapter named ``"default"`` into the directory itself and every other named adapter into a
subdirectory of its name (``path/<name>/adapter_config.json``), so a directory may hold one
adapter or several, with or without a ``"default"``. Every one is loaded under its name; the
first (``"default"``, else the first name in sorted order) is the active one, since the files do
not record which adapter was active.

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

__all__ = ["ADAPTER_CONFIG", "load_peft_directory", "saved_adapters"]

#: The file that marks a directory as a saved PEFT adapter.
ADAPTER_CONFIG = "adapter_config.json"
#: The name PEFT gives the adapter it saves into the directory itself.
DEFAULT_ADAPTER = "default"


def saved_adapters(path: str | Path) -> list[tuple[str, Path]]:
    """The adapters saved in directory ``path``, as ``(name, folder)`` pairs.

    ``("default", path)`` when ``path`` holds ``adapter_config.json``, then each subdirectory
    that holds one, named after the subdirectory, in sorted order (PEFT's layout; see the
    module docstring). Empty when ``path`` holds no saved adapter.
    """
    path = Path(path)
    if not path.is_dir():
        return []
    found = [(DEFAULT_ADAPTER, path)] if (path / ADAPTER_CONFIG).is_file() else []
    found += [(child.name, child) for child in sorted(path.iterdir())
              if child.is_dir() and (child / ADAPTER_CONFIG).is_file()]
    return found


def _base_config(path: Path, folder: Path, settings: dict[str, Any]) -> Path:
    """The base model's ``config.json``: in the saved directory ``path``, beside the adapter's
    own ``folder``, or in the local base directory."""
    for beside in (path / "config.json", folder / "config.json"):
        if beside.is_file():
            return beside
    base = settings.get("base_model_name_or_path")
    if isinstance(base, str) and (Path(base) / "config.json").is_file():
        return Path(base) / "config.json"
    raise FileNotFoundError(
        f"{folder / ADAPTER_CONFIG} names the base model {base!r}, which is not a local directory "
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


def _lora_settings(folder: Path) -> dict[str, Any]:
    """The adapter's ``adapter_config.json``, checked to be a LoRA adapter's."""
    with (folder / ADAPTER_CONFIG).open() as handle:
        settings = json.load(handle)
    if not isinstance(settings, dict) or str(settings.get("peft_type", "")).upper() != "LORA":
        raise ValueError(f"{folder / ADAPTER_CONFIG}: peft_type "
                         f"{settings.get('peft_type') if isinstance(settings, dict) else None!r}"
                         ", only LoRA adapters are supported")
    return settings


def load_peft_directory(path: str | Path) -> nn.Module:
    """A ``peft.PeftModel`` from a saved adapter directory (see the module docstring), every
    saved adapter loaded under its name.

    Raises
    ------
    RuntimeError
        If ``peft`` is not installed.
    FileNotFoundError, ValueError
        If ``path`` holds no saved adapter, the base model's config cannot be found offline,
        or an ``adapter_config.json`` is not a LoRA adapter's.
    """
    path = Path(path)
    adapters = saved_adapters(path)
    if not adapters:
        raise FileNotFoundError(f"{path} holds no saved PEFT adapter ({ADAPTER_CONFIG} in it "
                                "or in a subdirectory named after the adapter)")
    settings = {name: _lora_settings(folder) for name, folder in adapters}
    try:
        import peft
    except ImportError as err:
        raise RuntimeError("reading a saved PEFT adapter needs the 'peft' package "
                           "(pip install quotientsharp[lora])") from err
    from quotientsharp.models.loading import _config_model

    first, first_folder = adapters[0]
    base = _config_model(_base_config(path, first_folder, settings[first]))
    with warnings.catch_warnings():
        # PEFT copies the saved values into the meta adapters, a no-op that torch warns about:
        # _load_values assigns them instead
        warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter",
                                category=UserWarning)
        model = peft.PeftModel.from_pretrained(base, str(first_folder), adapter_name=first,
                                               is_trainable=True)
        for name, folder in adapters[1:]:
            model.load_adapter(str(folder), adapter_name=name, is_trainable=True)
    for name, folder in adapters:
        _load_values(model, folder, name)
    return model
