"""Loading a model for discovery: a HuggingFace config, a directory with ``config.json``, a saved
PEFT adapter directory (:mod:`.peft_loading`) or a ``torch.save``'d module.

A config is built on the meta device: the architecture without weights, and no download.
``torch`` and ``transformers`` are imported only when a model is loaded.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn


def _config_model(config_file: Path) -> nn.Module:
    import torch
    from torch import nn

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError as err:
        raise RuntimeError("reading a HuggingFace config needs the 'transformers' package "
                           "(pip install quotientsharp[hf])") from err
    with config_file.open() as handle:
        data = json.load(handle)
    if not isinstance(data, dict) or "model_type" not in data:
        raise ValueError(f"{config_file} is not a HuggingFace config: no 'model_type' entry")
    model_type = data["model_type"]
    try:
        config_class = transformers.CONFIG_MAPPING[model_type]
    except KeyError as err:
        raise ValueError(f"{config_file}: model_type {model_type!r} is unknown to transformers "
                         f"{transformers.__version__}") from err
    config = config_class.from_dict(data)
    architectures = data.get("architectures") or []
    model_class = getattr(transformers, architectures[0], None) if architectures else None
    # meta tensors: the architecture without allocating (or initialising) any weights
    with torch.device("meta"):
        if isinstance(model_class, type) and issubclass(model_class, nn.Module):
            return model_class(config)
        return transformers.AutoModel.from_config(config)


def load_model(path: str | os.PathLike) -> nn.Module:
    """Build or load the module that ``path`` describes (see the module docstring)."""
    import torch
    from torch import nn

    path = Path(path)
    if path.is_dir():
        from quotientsharp.models.peft_loading import load_peft_directory, saved_adapters

        if saved_adapters(path):   # saved PEFT adapters (in it, or in named subdirectories)

            return load_peft_directory(path)
        config_file = path / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(f"MODEL directory {path} has no config.json")
        return _config_model(config_file)
    if not path.is_file():
        raise FileNotFoundError(f"MODEL {path} does not exist")
    if path.suffix == ".json":
        return _config_model(path)
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=False)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as err:
        with path.open("rb") as handle:
            if handle.read(1) == b"{":
                return _config_model(path)
        raise ValueError(f"MODEL {path} is neither a config JSON nor a torch-saved module: "
                         f"{err}") from err
    except (ImportError, AttributeError) as err:
        # torch.save(module) pickles the class by its import path: a class defined in the
        # saving script's __main__ (or a module not on sys.path here) cannot be found again
        raise ValueError(f"MODEL {path} holds a module whose class cannot be imported here "
                         f"({str(err).splitlines()[0]}): torch.save(model) stores the class "
                         "by its import path, so define it in a module importable where you "
                         "run quotientsharp (on sys.path or PYTHONPATH, not in the saving "
                         "script itself) and save again") from err
    if isinstance(loaded, nn.Module):
        return loaded
    if isinstance(loaded, dict):
        raise ValueError(f"MODEL {path} holds a {type(loaded).__name__} (a state dict?), not a "
                         "module: symmetry discovery needs the architecture; save the module "
                         "itself with torch.save(model, path)")
    raise ValueError(f"MODEL {path} holds a {type(loaded).__name__}, not a torch.nn.Module")
