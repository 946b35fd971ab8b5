"""Import paths of release 0.1, kept for one release with a ``DeprecationWarning``.

Release 0.2 put the package in layers, one folder each (``core``, ``models``, ``engine``,
``workflows``, ``reproduce``, ``cli``). A user's ``from quotientsharp.gl import GLQuotient`` or
``import quotientsharp.sharpness.solver`` still works: :class:`MovedModuleFinder`, on
``sys.meta_path``, answers an old dotted name with the module at its new home, under the old
name too, and warns once per name. The table below is the only list of moves; the CHANGELOG
gives the same table for readers.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence

__all__ = ["MOVED", "MovedModuleFinder", "install", "new_name"]

#: Old module path -> new module path, both relative to ``quotientsharp``. A submodule of an
#: old package moves with it (``gl.point`` -> ``core.gl.point``).
MOVED: dict[str, str] = {
    "adapters": "core.adapters",
    "adaptive": "core.adaptive",
    "checks": "core.checks",
    "diagonal": "core.diagonal",
    "frozen": "core.frozen",
    "gl": "core.gl",
    "linalg": "core.linalg",
    "metric": "core.metric",
    "product": "core.product",
    "quotient": "core.quotient",
    "reference": "core.reference",
    "symbolic": "core.symbolic",
    "validation": "core.validation",
    "models.cli": "cli.symmetries",
    "sharpness": "engine",
    "distributed": "engine.distributed",
    "study": "workflows",
    "commands": "cli",
    "commands.measure": "cli.measure",
    "commands.measure_data": "workflows.data",
    "commands.measure_model": "workflows.saved_models",
    "commands.measure_options": "workflows.options",
    "commands.measure_output": "cli.measure_output",
    "commands.process_group": "workflows.process_group",
    "commands.reproduce": "cli.reproduce",
    "commands.study": "cli.study",
    "commands.verify": "cli.verify",
    "experiments": "reproduce",
    "experiments.common": "workflows.records",
    "experiments.labels": "workflows.labels",
    "experiments.tau_intervals": "workflows.taus",
    "experiments.study_options": "reproduce.options",
    "experiments.batched_ascent": "reproduce.diagonal.batched_ascent",
    "experiments.diagonal": "reproduce.diagonal.entry",
    **{f"experiments.diagonal_{part}": f"reproduce.diagonal.{part}"
       for part in ("analysis", "data", "exact", "full", "measures", "options", "page",
                    "report", "settings", "study", "training")},
    **{f"experiments.family_{part}": f"reproduce.families.{part}"
       for part in ("data", "measures", "options", "pretrained", "report", "run", "settings",
                    "training")},
    **{f"experiments.{study}": f"reproduce.families.{study}"
       for study in ("bert", "minilm", "sentiment_task", "transformer_common", "vit",
                     "vit_finetune")},
    "experiments.invariance": "reproduce.invariance.study",
    "experiments.invariance_report": "reproduce.invariance.report",
}

_PACKAGE = "quotientsharp"


def new_name(fullname: str) -> str | None:
    """The new dotted name of an old module path, or ``None`` if ``fullname`` did not move.

    The longest moved prefix (by whole components) decides: ``quotientsharp.gl.point`` ->
    ``quotientsharp.core.gl.point``.
    """
    if not fullname.startswith(_PACKAGE + "."):
        return None
    parts = fullname[len(_PACKAGE) + 1:].split(".")
    for cut in range(len(parts), 0, -1):
        head = ".".join(parts[:cut])
        if head in MOVED:
            return ".".join([_PACKAGE, MOVED[head], *parts[cut:]])
    return None


class _AliasLoader(importlib.abc.Loader):
    """Hands out the module at its new path, which keeps its own name and spec."""

    def __init__(self, target: types.ModuleType) -> None:
        self.target = target
        self.spec = target.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.target

    def exec_module(self, module: types.ModuleType) -> None:
        # the import system has just set ``__spec__`` to the alias's spec: give it back
        module.__spec__ = self.spec


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds old module paths (:data:`MOVED`) and warns that they moved."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        moved_to = new_name(fullname)
        if moved_to is None:
            return None
        warnings.warn(f"{fullname} moved to {moved_to} in quotientsharp 0.2; the old path "
                      "works until 0.3", DeprecationWarning, stacklevel=2)
        target_module = importlib.import_module(moved_to)
        spec = importlib.machinery.ModuleSpec(fullname, _AliasLoader(target_module))
        spec.submodule_search_locations = getattr(target_module, "__path__", None)
        return spec


def install() -> None:
    """Put the finder first on ``sys.meta_path``, once.

    First, so that a submodule of an old package path (``quotientsharp.gl.point``) is never
    loaded a second time from the old package's search path as a module of its own.
    """
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
