"""The paper's studies, run by ``quotientsharp reproduce STUDY``.

Each study is a module with

- ``HELP``: one line for ``quotientsharp reproduce --help``;
- ``add_arguments(parser)``: its command-line options;
- ``run(args) -> int``: the exit status;
- optionally ``OPTIONS``: the path of a torch-free module whose ``add_arguments`` (or the
  function named after a colon, ``"module.path:function"``) declares the options, so that
  ``quotientsharp reproduce STUDY --help`` answers without importing torch.

:data:`STUDIES` maps a study name to its module path; a study module registers itself by a
one-line entry here, and :mod:`quotientsharp.cli.reproduce` builds its subcommands from
the registry. Each study hands its units of work (a model, a grid point) to the runner that
``quotientsharp study`` uses (:class:`quotientsharp.workflows.resumable.ResumableRun`: records
written as they finish, ``--resume``, ranks under torchrun); Kendall tau, results files and
plots are in :mod:`quotientsharp.workflows` too. The generated ``docs/results.md`` and its
sections are :mod:`quotientsharp.reproduce.results_page`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: Study name -> module path. Later studies (``vit``, ``bert``, ``invariance``) add a line.
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
    missing = [attr for attr in ("add_arguments", "run") if not callable(getattr(module, attr,
                                                                                  None))]
    if missing:
        raise TypeError(f"study module {STUDIES[name]!r} lacks {missing}")
    return module


__all__ = ["STUDIES", "load_study"]
