"""The public surface a reader can hold (issue 39).

- only a package's ``__init__.py`` declares ``__all__``: a module inside a package exports
  nothing of its own, its names are imported from where they are defined;
- all the ``__all__`` lists together hold at most 150 names, and each name is there;
- ``dir(quotientsharp)`` lists the public names only (no ``sys``, ``importlib``, ``annotations``
  that the package imports for itself), and ``import quotientsharp`` imports no torch;
- every ``qs.NAME`` of the README, the docs and the examples is a public name of the package;
- the version of the package is the version of ``pyproject.toml``.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import quotientsharp

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "quotientsharp"


def _exports(path: Path) -> list[str] | None:
    """The literal ``__all__`` of a module's source, or ``None`` where it declares none."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        else:
            continue
        if any(isinstance(target, ast.Name) and target.id == "__all__" for target in targets):
            value = ast.literal_eval(node.value) if node.value is not None else []
            return list(value)
    return None


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_exports() -> dict[str, list[str]]:
    found = {}
    for path in sorted(PACKAGE.rglob("__init__.py")):
        names = _exports(path)
        if names is not None:
            found[_module_name(path)] = names
    return found


def test_only_packages_declare_all():
    declaring = [str(path.relative_to(ROOT)) for path in sorted(PACKAGE.rglob("*.py"))
                 if path.name != "__init__.py" and _exports(path) is not None]
    assert declaring == []


def test_the_public_names_are_few():
    counts = {package: len(names) for package, names in _package_exports().items()}
    assert sum(counts.values()) <= 150, counts


@pytest.mark.parametrize("package", sorted(_package_exports()))
def test_every_exported_name_is_there_once(package):
    names = _package_exports()[package]
    assert len(names) == len(set(names))
    module = importlib.import_module(package)
    missing = [name for name in names if not hasattr(module, name)]
    assert missing == []


def test_dir_of_the_package_is_its_public_names():
    listed = dir(quotientsharp)
    assert listed == sorted(quotientsharp.__all__)
    for leaked in ("annotations", "importlib", "sys", "types", "Any", "TYPE_CHECKING"):
        assert leaked not in listed


def test_importing_the_package_imports_no_torch():
    code = ("import sys, quotientsharp; "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               cwd=ROOT, timeout=120)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.strip() == "[]"


def _documented_names() -> dict[str, set[str]]:
    """``qs.NAME`` as the README, the docs and the examples write it, by file."""
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
               *sorted((ROOT / "examples").rglob("*.py")),
               *sorted((ROOT / "benchmarks").rglob("*.py"))]
    pattern = re.compile(r"\bqs\.([A-Za-z_]\w*)")
    found: dict[str, set[str]] = {}
    for path in sources:
        if path.is_file():
            names = set(pattern.findall(path.read_text(errors="replace")))
            if names:
                found[str(path.relative_to(ROOT))] = names
    return found


def test_every_name_the_docs_use_is_public():
    public = set(quotientsharp.__all__) | {"__file__", "__version__"}
    unknown = {path: sorted(names - public) for path, names in _documented_names().items()
               if names - public}
    assert unknown == {}


def test_the_version_is_the_projects():
    tomllib = pytest.importorskip("tomllib")        # the standard library's from Python 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert quotientsharp.__version__ == project["version"]
    assert re.fullmatch(r"0\.3\.\d+", project["version"])
