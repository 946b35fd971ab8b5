"""The documentation pages written with runnable code keep most of their code tested.

The blocks themselves run as tests collected by Sybil (``docs/conftest.py``): one test per
```python block of each ``docs/*.md`` page, the blocks of a page sharing one namespace, in order.
A block preceded by ``<!-- skip: next "reason" -->`` is skipped; that marker is for code that
cannot run offline. This file checks, with Sybil's own parser, that each page listed in
:data:`PAGES_WITH_CODE` keeps at least that many tested blocks and skips at most one.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sybil import Document
from sybil.evaluators.python import PythonEvaluator
from sybil.evaluators.skip import Skipper
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

DOCS = Path(__file__).resolve().parents[1] / "docs"
#: Pages written with runnable code, and how many blocks each has at least.
PAGES_WITH_CODE = {"attention.md": 6, "adapters.md": 2, "sharpness.md": 6, "cli.md": 1,
                   "tutorial-custom-symmetry.md": 4, "attention-variants.md": 5,
                   "study.md": 2, "lora.md": 4}


def python_blocks(path: Path) -> list[tuple[int, bool]]:
    """``(line, skipped)`` for each ```python block of a page, as Sybil parses it."""
    blocks, skip_next, skipping = [], False, False
    for example in Document.parse(str(path), PythonCodeBlockParser(), SkipParser()).examples():
        evaluator = example.region.evaluator
        if isinstance(evaluator, Skipper):
            action = example.region.parsed[0]
            skip_next = action == "next"
            skipping = action == "start" or (skipping and action != "end")
        elif isinstance(evaluator, PythonEvaluator):
            blocks.append((example.line, skip_next or skipping))
            skip_next = False
    return blocks


def output_blocks(path: Path) -> list[int]:
    """Lines of the ```output blocks of a page (each one a test: docs/conftest.py)."""
    return [example.line for example in
            Document.parse(str(path), CodeBlockParser(language="output")).examples()]


def _conftest():
    """docs/conftest.py as a module (it is pytest's conftest of docs/, not a package)."""
    spec = importlib.util.spec_from_file_location("quotientsharp_docs_conftest",
                                                  DOCS / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_outputs_match_words_numbers_and_ellipsis() -> None:
    match = _conftest().outputs_match
    assert match("error 1.2e-16 after 100 steps", "error 4.4e-16 after 100 steps")
    assert match("value 0.00743579", "value 0.0074360")               # within 2 %
    assert not match("value 0.00743579", "value 0.0080")              # 8 % off
    assert not match("error 1.2e-16 after 100 steps", "error 1.2e-16 after 101 steps")
    assert not match("christoffel  pass", "christoffel  FAIL")
    assert not match("[0.0156, 1.177]", "[0.0156, 1.177, 3.0]")
    assert match("first\n...\nlast", "first\nmiddle\nmore\nlast")
    assert match("first\n...\nlast", "first\nlast")
    assert not match("first\nlast", "first\nmiddle\nlast")
    assert match("  trailing   \n", "  trailing")


@pytest.mark.parametrize("name", ["tutorial-custom-symmetry.md", "adapters.md"])
def test_every_printing_block_shows_its_output(name: str) -> None:
    """On these pages each python block that prints is followed by its ```output block."""
    text = (DOCS / name).read_text()
    blocks = list(re.finditer(r"```python\n(.*?)```\n", text, flags=re.S))
    printing = [b for b in blocks if re.search(r"^\s*print\(", b.group(1), flags=re.M)]
    assert len(printing) >= 3, name
    for block in printing:
        after = text[block.end():].lstrip("\n")
        line = text[:block.start()].count("\n") + 1
        assert after.startswith("```output\n"), f"{name}:{line}: a print without its output"


def test_block_parsing_sees_skip_markers_and_order(tmp_path) -> None:
    page = tmp_path / "page.md"
    page.write_text('intro\n```python\na = 1\n```\n<!-- skip: next "offline" -->\n```python\n'
                    "b = 2\n```\n```bash\nls\n```\n```python\nc = a + 1\n```\n")
    assert python_blocks(page) == [(2, False), (6, True), (12, False)]


@pytest.mark.parametrize("name", sorted(PAGES_WITH_CODE))
def test_pages_with_code_are_mostly_tested(name: str) -> None:
    blocks = python_blocks(DOCS / name)
    tested = [line for line, skipped in blocks if not skipped]
    assert len(tested) >= PAGES_WITH_CODE[name], (name, len(tested))
    assert len(tested) >= len(blocks) - 1, f"{name}: more than one block is skipped"


def test_sybil_collects_every_block_of_the_top_level_pages() -> None:
    """docs/conftest.py collects one test per block of each top-level page, none below, and
    ``python -m pytest`` without arguments reaches docs/ (``testpaths``)."""
    pyproject = (DOCS.parent / "pyproject.toml").read_text()
    assert re.search(r'^testpaths = \[[^]]*"docs"', pyproject, flags=re.M)
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", str(DOCS)],
                         capture_output=True, text=True, cwd=DOCS.parent, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    collected: dict[str, int] = {}
    for line in run.stdout.splitlines():
        if "::line:" in line:
            page = line.split("::")[0]
            collected[page] = collected.get(page, 0) + 1
    expected = {f"docs/{p.name}": len(python_blocks(p)) + len(output_blocks(p))
                for p in sorted(DOCS.glob("*.md"))}
    expected = {page: count for page, count in expected.items() if count}
    # Sybil also collects each skip marker as an item of its own
    markers = {f"docs/{p.name}": p.read_text().count("<!-- skip:") for p in DOCS.glob("*.md")}
    assert {page: count - markers[page] for page, count in collected.items()} == expected
