"""The paper's studies, run by ``quotientsharp reproduce STUDY``.

Each study is a module with ``HELP`` (one line for ``--help``; its docstring is the study's
description) and ``run(config) -> int``, the exit status for its configuration (a frozen
dataclass of :mod:`quotientsharp.reproduce.config`); its options are declared in
:mod:`quotientsharp.cli.reproduce_options`. :data:`STUDIES` maps a study name to its module.
The studies write data only; the Markdown of ``docs/results/`` is rendered from it by
``docs/_hooks/results_pages/`` of a checkout (:mod:`quotientsharp.reproduce.results_page`).
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
