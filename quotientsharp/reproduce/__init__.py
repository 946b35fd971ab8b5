"""The paper's studies, run by ``quotientsharp reproduce STUDY``.

Each study is a module with

- ``HELP``: one line for ``quotientsharp reproduce --help``;
- ``run(config) -> int``: the exit status, for its configuration, a frozen dataclass of
  :mod:`quotientsharp.reproduce.config` (:class:`~quotientsharp.reproduce.config.ReproduceConfig`
  and the fields of its kind of study).

Its command-line options, and the configuration they make, are declared in
:mod:`quotientsharp.cli.reproduce_options`.

:data:`STUDIES` maps a study name to its module path; a study module registers itself by a
one-line entry here (and one in the options' table), and :mod:`quotientsharp.cli.reproduce`
builds its subcommands from the registry. Each study hands its units of work (a model, a grid
point) to the runner that ``quotientsharp study`` uses
(:class:`quotientsharp.workflows.resumable.ResumableRun`: records written as they finish,
``--resume``, ranks under torchrun); Kendall tau, results files and plots are in
:mod:`quotientsharp.workflows` too. The studies write data only (their results folder, the
headline and page data under ``docs/results/data/``); the Markdown of ``docs/results/`` is
rendered from that data by ``docs/_hooks/results_pages/`` of a checkout, which
:mod:`quotientsharp.reproduce.results_page` loads from the folder given to ``--docs``.
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
