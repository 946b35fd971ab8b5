"""The paper's studies, run by ``quotientsharp reproduce STUDY``.

Each study is a module with ``HELP`` (its ``--help`` line; its docstring the description) and
``run(config) -> int``, the exit status for a configuration of
:mod:`quotientsharp.reproduce.config`. The studies write data only; ``docs/_hooks/results_pages/``
of a checkout renders the pages of ``docs/results/`` from it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: Study name -> module path.
STUDIES: dict[str, str] = {
    "diagonal": "quotientsharp.reproduce.diagonal.entry",
    "vit": "quotientsharp.reproduce.families.vit",
    "bert": "quotientsharp.reproduce.families.bert",
    "invariance": "quotientsharp.reproduce.invariance.study",
    "minilm": "quotientsharp.reproduce.families.minilm",
    "vit-finetune": "quotientsharp.reproduce.families.vit_finetune",
    "lora": "quotientsharp.reproduce.families.lora",
    "summary": "quotientsharp.reproduce.summary",
    "reach": "quotientsharp.reproduce.reach",
}


def load_study(name: str) -> ModuleType:
    """Import the module of study ``name`` and check that it has the study interface."""
    if name not in STUDIES:
        raise ValueError(f"unknown study {name!r}; choose one of {sorted(STUDIES)}")
    module = importlib.import_module(STUDIES[name])
    if not callable(getattr(module, "run", None)):
        raise TypeError(f"study module {STUDIES[name]!r} lacks ['run']")
    return module


__all__ = ["STUDIES", "load_study"]
