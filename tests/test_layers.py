"""The package's layers: each imports only from the layers below it, and names stay modules.

- the import-linter contract of ``pyproject.toml`` (core -> models -> engine -> workflows ->
  reproduce -> cli) holds on the source, static imports and imports inside functions alike;
- measuring sharpness loads no module of a layer above the engine, at run time too;
- ``import quotientsharp.<sub> as m`` gives a module for every subpackage;
- the import paths of release 0.1 (``quotientsharp.gl``, ``quotientsharp.sharpness.solver``,
  ``quotientsharp.experiments``...) are gone since 0.3: they raise ``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

import quotientsharp

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("core", "models", "engine", "workflows", "reproduce", "cli")


def _run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


def test_the_contract_lists_the_layers_bottom_up_as_the_package_docstring_does():
    tomllib = pytest.importorskip("tomllib")        # the standard library's from Python 3.11
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract, argparse_contract = config["contracts"]
    assert contract["type"] == "layers"
    # the command line alone parses arguments: every layer below cli is forbidden argparse
    assert argparse_contract["type"] == "forbidden"
    assert argparse_contract["forbidden_modules"] == ["argparse"]
    assert sorted(argparse_contract["source_modules"]) == sorted(
        f"quotientsharp.{name}" for name in LAYERS if name != "cli")
    assert contract["layers"] == [f"quotientsharp.{name}" for name in reversed(LAYERS)]
    folders = {p.name for p in (ROOT / "quotientsharp").iterdir()
               if p.is_dir() and (p / "__init__.py").is_file()}
    assert folders == set(LAYERS)


def test_no_import_runs_up_the_layers():
    pytest.importorskip("importlinter")
    completed = subprocess.run([sys.executable, "-c",
                                "import sys; from importlinter.cli import lint_imports; "
                                "sys.exit(lint_imports(config_filename='pyproject.toml'))"],
                               capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-2000:]
    assert "2 kept, 0 broken" in completed.stdout


def test_the_argparse_contract_breaks_on_an_argparse_import_below_cli(tmp_path):
    """The forbidden contract can fail: a copy of the package with argparse imported in the
    engine breaks it."""
    pytest.importorskip("importlinter")
    import shutil
    shutil.copytree(ROOT / "quotientsharp", tmp_path / "quotientsharp")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "quotientsharp" / "engine" / "options.py", "a") as handle:
        handle.write("\nimport argparse  # noqa: E402\n")
    completed = subprocess.run([sys.executable, "-c",
                                "import sys; sys.path.insert(0, '.'); "
                                "from importlinter.cli import lint_imports; "
                                "sys.exit(lint_imports(config_filename='pyproject.toml'))"],
                               capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert completed.returncode != 0
    assert "quotientsharp.engine is not allowed to import argparse" in completed.stdout


def test_measuring_loads_nothing_above_the_engine():
    completed = _run_python("""
        import sys, torch
        from torch import nn
        import quotientsharp as qs
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
        batch = (torch.randn(6, 4), torch.randint(0, 2, (6,)))
        for measure in ("adaptive", "geodesic", "average"):
            qs.sharpness(model, [batch], measure=measure, rho=0.1, n_iter=2, progress=False) \\
                if measure != "average" else \\
                qs.sharpness(model, [batch], measure=measure, rho=0.1, progress=False)
        qs.checks.check_all(qs.GLQuotient("mix"))
        loaded = sorted(name for name in sys.modules if name.startswith("quotientsharp."))
        print("\\n".join(loaded))
    """)
    assert completed.returncode == 0, completed.stderr[-4000:]
    loaded = completed.stdout.split()
    above = [name for name in loaded
             if name.split(".")[1] in ("workflows", "reproduce", "cli")]
    assert not above, above
    assert "quotientsharp.engine.api" in loaded      # the check saw the engine at work


def _subpackages() -> list[str]:
    return sorted(info.name for info in pkgutil.walk_packages(quotientsharp.__path__,
                                                              "quotientsharp.")
                  if info.ispkg)


@pytest.mark.parametrize("name", _subpackages())
def test_import_as_gives_the_module_of_every_subpackage(name):
    namespace: dict[str, object] = {}
    exec(f"import {name} as module", namespace)
    assert isinstance(namespace["module"], types.ModuleType)
    assert namespace["module"].__name__ == name


def test_the_public_entry_point_stays_the_function():
    import quotientsharp.engine as engine

    assert isinstance(engine, types.ModuleType)
    assert callable(quotientsharp.sharpness)
    assert quotientsharp.sharpness is engine.sharpness


@pytest.mark.parametrize("old", ["quotientsharp.gl", "quotientsharp.gl.point",
                                 "quotientsharp.sharpness.solver", "quotientsharp.study",
                                 "quotientsharp.commands.measure", "quotientsharp.experiments",
                                 "quotientsharp.experiments.diagonal", "quotientsharp.checks"])
def test_an_import_path_of_release_0_1_is_gone(old):
    """0.3 removed the 0.1 paths that 0.2 kept with a ``DeprecationWarning``; the names they
    held are imported from the layers (``quotientsharp.core.gl``, ``quotientsharp.engine``...)."""
    completed = _run_python(f"""
        import importlib, warnings
        warnings.simplefilter("error")
        try:
            importlib.import_module({old!r})
        except ModuleNotFoundError:
            print("gone")
    """)
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert completed.stdout.strip() == "gone"


def test_the_layers_give_what_the_old_paths_gave():
    from quotientsharp.core.gl.point import GLPoint
    from quotientsharp.engine.solver import ascend
    from quotientsharp.workflows import run_study

    assert GLPoint.__module__ == "quotientsharp.core.gl.point"
    assert ascend.__module__ == "quotientsharp.engine.solver"
    assert run_study.__module__ == "quotientsharp.workflows.runner"
    assert callable(quotientsharp.sharpness)
    assert quotientsharp.sharpness.__module__ == "quotientsharp.engine.api"


def test_a_path_that_never_existed_is_still_not_found():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("quotientsharp.no_such_module")
