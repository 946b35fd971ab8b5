"""Fine-tuning families: a pretrained body under a fresh head, and a pretraining cached on disk."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

#: File name of a cached pretraining inside a study's results folder.
PRETRAINED_FILE = "pretrained.pt"


def load_body(model: nn.Module, state: Mapping[str, torch.Tensor],
              head_prefix: str | None) -> None:
    """Copy ``state`` into ``model``, leaving the fresh head under ``head_prefix`` (e.g.
    ``"classifier."``; ``None``: every weight must load) as built; keys of ``state`` under it
    (a pretraining head) are ignored.

    Raises
    ------
    ValueError
        If a body weight is missing from ``state``, or ``state`` holds a weight ``model`` lacks:
        a silently half-loaded body would make every fine-tune start from noise.
    """
    def in_head(key: str) -> bool:
        return head_prefix is not None and key.startswith(head_prefix)

    body = {k: v for k, v in state.items() if not in_head(k)}
    missing, unexpected = model.load_state_dict(body, strict=False)
    missing = [k for k in missing if not in_head(k)]
    if missing or unexpected:
        raise ValueError(f"pretrained weights do not fit the model: missing {missing[:5]}, "
                         f"unexpected {list(unexpected)[:5]}")


def cached_pretraining(folder: Path, settings: Mapping[str, Any],
                       compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The pretraining of ``settings`` (JSON), from ``folder/pretrained.pt`` or computed by
    ``compute`` (a dict with the ``"state"`` and JSON scalars) and saved there; a cache of other
    settings is replaced. ``compute()``'s dict plus ``"settings"`` and ``"cached"``."""
    path = Path(folder) / PRETRAINED_FILE
    wanted = json.loads(json.dumps(dict(settings)))
    if path.exists():
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if json.loads(saved.get("settings_json", "null")) == wanted:
            return {**{k: v for k, v in saved.items() if k != "settings_json"},
                    "settings": wanted, "cached": True}
    result = compute()
    if "state" not in result:
        raise ValueError("the pretraining must return its weights under 'state'")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    # written aside then renamed: an interrupted save never leaves a torn cache behind
    torch.save({**result, "settings_json": json.dumps(wanted)}, partial)
    os.replace(partial, path)
    return {**result, "settings": wanted, "cached": False}
