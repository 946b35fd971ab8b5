"""Lines per layer and the imports between layers: ``python benchmarks/layers.py``.

Reads the package's source (no module is imported) with grimp, the import graph that
import-linter checks, and prints

- per layer (``core``, ``models``, ``engine``, ``workflows``, ``reproduce``, ``cli``): modules,
  lines and the share of the package;
- every pair of layers with an import between them, with its count, marked ``down`` or ``UP``.

A sound package has no ``UP`` row; ``tests/test_layers.py`` holds the contract itself.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Bottom to top, as in the import-linter contract of ``pyproject.toml``.
LAYERS = ("core", "models", "engine", "workflows", "reproduce", "cli")


def layer_of(module: str) -> str:
    """The layer a dotted module name lies in; ``"package"`` for the top-level files."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "package"


def lines_per_layer(package: Path) -> dict[str, tuple[int, int]]:
    """``layer -> (modules, lines)`` over the ``.py`` files of ``package``."""
    counts: dict[str, list[int]] = {name: [0, 0] for name in (*LAYERS, "package")}
    for path in package.rglob("*.py"):
        relative = path.relative_to(package.parent).with_suffix("")
        entry = counts[layer_of(".".join(relative.parts))]
        entry[0] += 1
        entry[1] += len(path.read_text().splitlines())
    return {name: (modules, lines) for name, (modules, lines) in counts.items()}


def layer_edges() -> Counter[tuple[str, str]]:
    """``(importer layer, imported layer) -> number of module-to-module imports``."""
    import grimp

    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph("quotientsharp")
    edges: Counter[tuple[str, str]] = Counter()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            source, target = layer_of(module), layer_of(imported)
            if source != target:
                edges[source, target] += 1
    return edges


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    sizes = lines_per_layer(ROOT / "quotientsharp")
    total = sum(lines for _, lines in sizes.values())
    print(f"{'layer':<10} {'modules':>7} {'lines':>7} {'share':>6}")
    for name, (modules, lines) in sizes.items():
        print(f"{name:<10} {modules:>7} {lines:>7} {100 * lines / total:>5.1f}%")
    print(f"{'total':<10} {sum(m for m, _ in sizes.values()):>7} {total:>7}")
    print()
    rank = {name: index for index, name in enumerate(LAYERS)}
    upward = 0
    for (source, target), count in sorted(layer_edges().items()):
        if "package" in (source, target):
            direction = "package"
        elif rank[source] > rank[target]:
            direction = "down"
        else:
            direction, upward = "UP", upward + 1
        print(f"{source:>10} -> {target:<10} {count:>4} imports  {direction}")
    print(f"\n{upward} upward layer edge(s)")
    return 1 if upward else 0


if __name__ == "__main__":
    sys.exit(main())
