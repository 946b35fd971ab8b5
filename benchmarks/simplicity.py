"""How big the package is and how much a reader must hold: ``python benchmarks/simplicity.py``.

Reads the source of ``quotientsharp/`` (nothing is imported) and prints one row per count, each
with the command that gives the same number by hand (issue 39):

- lines and modules per layer (``core``, ``models``, ``engine``, ``workflows``, ``reproduce``,
  ``cli``) and in all;
- the public names: the ``__all__`` lists (only a package's ``__init__.py`` has one) and the
  names in them;
- the functions over McCabe complexity 10 and 15 (ruff's C901, read from its JSON output);
- the modules below ``cli/`` that import ``argparse`` (the command line belongs to ``cli``);
- the import cycles: groups of modules that import each other, directly or through others
  (strongly connected components of grimp's import graph, the one import-linter checks);
- with ``--call`` (imports torch and transformers): the distinct modules and functions of
  ``quotientsharp`` that one default ``sharpness(model, batches, "geodesic", rho=0.1)`` call
  on a seeded 2-layer BERT enters (``benchmarks/module_trace.py``'s model, after one untraced
  call, so that lazy imports are not counted).

``--json PATH`` writes the counts as JSON too.
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
import subprocess
import sys
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "quotientsharp"
#: Bottom to top, as in the import-linter contract of ``pyproject.toml``.
LAYERS = ("core", "models", "engine", "workflows", "reproduce", "cli")


@dataclass(frozen=True)
class Count:
    """One row: what is counted, the number, and the shell command that gives it."""

    what: str
    value: int | None
    command: str


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _layer(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 and parts[0] in LAYERS else "package"


def _exports(tree: ast.Module) -> list[str] | None:
    """The literal ``__all__`` of a module, or ``None`` where it assigns none."""
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        else:
            continue
        if any(isinstance(target, ast.Name) and target.id == "__all__" for target in targets):
            try:
                return list(ast.literal_eval(node.value)) if node.value is not None else []
            except ValueError:          # a computed list: counted as a list, its names unknown
                return []
    return None


def _imports_argparse(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "argparse":
            return True
    return False


def size_counts() -> list[Count]:
    """Lines and modules per layer, then in all."""
    lines = dict.fromkeys((*LAYERS, "package"), 0)
    modules = dict.fromkeys((*LAYERS, "package"), 0)
    for path in _sources():
        layer = _layer(path)
        lines[layer] += len(path.read_text().splitlines())
        modules[layer] += 1
    rows = [Count(f"lines in {layer}/ ({modules[layer]} modules)", lines[layer],
                  f"find quotientsharp/{layer} -name '*.py' | xargs cat | wc -l")
            for layer in LAYERS]
    rows.append(Count("lines in all", sum(lines.values()),
                      "find quotientsharp -name '*.py' | xargs cat | wc -l"))
    rows.append(Count("modules", sum(modules.values()),
                      "find quotientsharp -name '*.py' | wc -l"))
    return rows


def surface_counts() -> list[Count]:
    """``__all__`` lists, their names, and ``argparse`` importers below ``cli``."""
    lists = names = outside_packages = argparse_below_cli = 0
    for path in _sources():
        tree = ast.parse(path.read_text())
        exported = _exports(tree)
        if exported is not None:
            lists += 1
            names += len(exported)
            outside_packages += path.name != "__init__.py"
        argparse_below_cli += _layer(path) != "cli" and _imports_argparse(tree)
    grep_all = "grep -rl '^__all__' quotientsharp --include='*.py'"
    return [
        Count("modules with __all__", lists, f"{grep_all} | wc -l"),
        Count("... of them not a package __init__.py", outside_packages,
              f"{grep_all} | grep -v __init__.py | wc -l"),
        Count("names in __all__", names, "python benchmarks/simplicity.py (ast.literal_eval)"),
        Count("argparse importers below cli/", argparse_below_cli,
              "grep -rlE '^\\s*(import argparse|from argparse import)' quotientsharp "
              "--include='*.py' | grep -v '^quotientsharp/cli/' | wc -l"),
    ]


def complexity_counts() -> list[Count]:
    """Functions over McCabe complexity 10 and 15, by ruff's C901; ``None`` without ruff."""
    rows = []
    for limit in (10, 15):
        command = (f"ruff check quotientsharp --select C901 --config "
                   f"'lint.mccabe.max-complexity={limit}' --output-format concise --exit-zero "
                   "| grep -c C901")
        rows.append(Count(f"functions over complexity {limit}", _ruff_c901(limit), command))
    return rows


def _ruff_c901(limit: int) -> int | None:
    ruff = shutil.which("ruff")
    if ruff is None:
        return None
    completed = subprocess.run(
        [ruff, "check", str(PACKAGE), "--select", "C901", "--config",
         f"lint.mccabe.max-complexity={limit}", "--output-format", "json", "--exit-zero",
         "--no-cache"],
        capture_output=True, text=True, cwd=ROOT, timeout=300, check=True)
    return len(json.loads(completed.stdout))


def cycle_counts() -> list[Count]:
    """Import cycles among the package's modules (grimp, as import-linter builds the graph)."""
    import grimp

    graph = grimp.build_graph("quotientsharp")
    modules = sorted(graph.modules)
    # Tarjan's strongly connected components, iteratively (the graph has ~150 nodes)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(
                        graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    cycles = [c for c in components if len(c) > 1]
    return [Count("import cycles (groups of modules importing each other)", len(cycles),
                  "python benchmarks/simplicity.py (grimp graph, strongly connected groups)"),
            Count("... modules in them", sum(len(c) for c in cycles),
                  "python benchmarks/simplicity.py")]


def call_counts() -> list[Count]:
    """Distinct modules and functions of the package one default geodesic call enters."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from module_trace import small_bert

    import quotientsharp as qs

    model, batches = small_bert()

    def call() -> object:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", qs.ReachWarning)
            return qs.sharpness(model, batches, "geodesic", rho=0.1, progress=False)

    call()
    entered: set[tuple[str, str]] = set()

    def profile(frame: Any, event: str, arg: object) -> None:
        module = frame.f_globals.get("__name__", "")
        if event == "call" and isinstance(module, str) and module.startswith("quotientsharp"):
            entered.add((module, frame.f_code.co_qualname))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    how = "python benchmarks/simplicity.py --call"
    return [Count("modules one sharpness() call enters", len({m for m, _ in entered}), how),
            Count("functions one sharpness() call enters", len(entered), how)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Count the size and the public surface of "
                                                 "quotientsharp.")
    parser.add_argument("--json", type=Path, help="also write the counts to this file")
    parser.add_argument("--call", action="store_true",
                        help="also trace one sharpness() call (imports torch and transformers)")
    args = parser.parse_args(argv)
    rows = [*size_counts(), *surface_counts(), *complexity_counts(), *cycle_counts()]
    if args.call:
        rows += call_counts()
    width = max(len(row.what) for row in rows)
    for row in rows:
        value = "n/a" if row.value is None else str(row.value)
        print(f"{row.what:<{width}}  {value:>6}   $ {row.command}")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(row) for row in rows], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
