"""The paper's studies, run by ``quotientsharp reproduce STUDY``.

Each study is a module with

- ``HELP``: one line for ``quotientsharp reproduce --help``;
- ``add_arguments(parser)``: its command-line options;
- ``run(args) -> int``: the exit status;
- optionally ``OPTIONS``: the path of a torch-free module whose ``add_arguments`` (or the
  function named after a colon, ``"module.path:function"``) declares the options, so that
  ``quotientsharp reproduce STUDY --help`` answers without importing torch.

:data:`STUDIES` maps a study name to its module path; a study module registers itself by a
one-line entry here, and :mod:`quotientsharp.commands.reproduce` builds its subcommands from
the registry. Shared machinery (Kendall tau, results files, ``--resume``, ``run.json``, plots,
the generated ``docs/results.md``) lives in :mod:`quotientsharp.experiments.common`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: Study name -> module path. Later studies (``vit``, ``bert``, ``invariance``) add a line.
STUDIES: dict[str, str] = {
    "diagonal": "quotientsharp.experiments.diagonal",
    "vit": "quotientsharp.experiments.vit",
    "bert": "quotientsharp.experiments.bert",
    "invariance": "quotientsharp.experiments.invariance",
    "minilm": "quotientsharp.experiments.minilm",
    "vit-finetune": "quotientsharp.experiments.vit_finetune",
}


def load_study(name: str) -> ModuleType:
    """Import the module of study ``name`` and check that it has the study interface."""
    if name not in STUDIES:
        raise ValueError(f"unknown study {name!r}; choose one of {sorted(STUDIES)}")
    module = importlib.import_module(STUDIES[name])
    missing = [attr for attr in ("add_arguments", "run") if not callable(getattr(module, attr,
                                                                                  None))]
    if missing:
        raise TypeError(f"study module {STUDIES[name]!r} lacks {missing}")
    return module


__all__ = ["STUDIES", "load_study"]
