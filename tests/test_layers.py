"""The package's layers: each imports only from the layers below it, and names stay modules.

- the import-linter contract of ``pyproject.toml`` (core -> models -> engine -> workflows ->
  reproduce -> cli) holds on the source, static imports and imports inside functions alike;
- measuring sharpness loads no module of a layer above the engine, at run time too;
- ``import quotientsharp.<sub> as m`` gives a module for every subpackage;
- every import path of release 0.1 still works for one release, warns, and names the very
  module at its new home (no second copy of a module, so no second copy of a class).
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
    (contract,) = config["contracts"]
    assert contract["type"] == "layers"
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
    assert "1 kept, 0 broken" in completed.stdout


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


def test_every_old_import_path_warns_and_gives_the_module_at_its_new_home():
    from quotientsharp._moved import MOVED

    old_names = sorted(MOVED)
    completed = _run_python(f"""
        import importlib, sys, warnings
        failures = []
        for old in {old_names!r}:
            full = "quotientsharp." + old
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                module = importlib.import_module(full)
            from quotientsharp._moved import new_name
            target = importlib.import_module(new_name(full))
            deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)
                            and full in str(w.message)]
            if module is not target:
                failures.append(f"{{full}}: another module than {{target.__name__}}")
            elif not deprecations:
                failures.append(f"{{full}}: no DeprecationWarning")
            elif module.__spec__.name != target.__name__:
                failures.append(f"{{full}}: the new module's spec was overwritten")
        print("\\n".join(failures))
    """)
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert completed.stdout.strip() == ""


def test_a_submodule_of_an_old_package_path_is_the_same_module_and_class():
    completed = _run_python("""
        import warnings
        warnings.simplefilter("ignore", DeprecationWarning)
        from quotientsharp.gl.point import GLPoint as old_point
        from quotientsharp.sharpness.solver import ascend as old_ascend
        from quotientsharp.study import run_study as old_run_study
        from quotientsharp.core.gl.point import GLPoint
        from quotientsharp.engine.solver import ascend
        from quotientsharp.workflows import run_study
        import quotientsharp as qs
        assert old_point is GLPoint and old_ascend is ascend and old_run_study is run_study
        assert callable(qs.sharpness) and qs.sharpness.__module__ == "quotientsharp.engine.api"
        print("ok")
    """)
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert completed.stdout.strip() == "ok"


def test_an_old_path_is_an_error_under_warnings_as_errors():
    """What a user's test suite with ``filterwarnings = error`` sees: the warning names the
    new path."""
    completed = _run_python("""
        import warnings
        warnings.simplefilter("error", DeprecationWarning)
        try:
            import quotientsharp.checks
        except DeprecationWarning as warning:
            print(warning)
    """)
    assert "moved to quotientsharp.core.checks" in completed.stdout


def test_a_path_that_never_existed_is_still_not_found():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("quotientsharp.no_such_module")
