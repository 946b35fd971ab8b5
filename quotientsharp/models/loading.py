"""Loading a model for discovery: a HuggingFace config, a directory with ``config.json``, a saved
PEFT adapter directory (:mod:`.peft_loading`) or a ``torch.save``'d module (read by :mod:`.files`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from quotientsharp.models.files import _config_model, begins_as_json_object, load_torch_file
from quotientsharp.models.peft_loading import load_peft_directory, saved_adapters

if TYPE_CHECKING:
    from torch import nn


def load_model(path: str | os.PathLike) -> nn.Module:
    """Build or load the module that ``path`` describes (see the module docstring)."""
    from torch import nn

    path = Path(path)
    if path.is_dir():
        if saved_adapters(path):   # saved PEFT adapters (in it, or in named subdirectories)
            return load_peft_directory(path)
        config_file = path / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(f"MODEL directory {path} has no config.json")
        return _config_model(config_file)
    if not path.is_file():
        raise FileNotFoundError(f"MODEL {path} does not exist")
    if path.suffix == ".json" or begins_as_json_object(path):
        return _config_model(path)
    loaded = load_torch_file(path, "MODEL", "a config JSON nor a torch-saved module",
                             weights_only=False)
    if isinstance(loaded, nn.Module):
        return loaded
    if isinstance(loaded, dict):
        raise ValueError(f"MODEL {path} holds a {type(loaded).__name__} (a state dict?), not a "
                         "module: symmetry discovery needs the architecture; save the module "
                         "itself with torch.save(model, path)")
    raise ValueError(f"MODEL {path} holds a {type(loaded).__name__}, not a torch.nn.Module")
