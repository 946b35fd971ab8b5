"""Every ```python block of the documentation pages runs, page by page, in order.

The blocks of one page share a namespace (later blocks use what earlier ones defined) and run in
a temporary working directory. A block preceded by a ``<!-- no-test -->`` line is skipped; that
marker is for code that cannot run offline, and the pages listed in :data:`PAGES_WITH_CODE` must
keep most of their blocks tested. ``docs/tutorial-custom-symmetry.md`` has its own test
(``tests/test_tutorial.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
OWN_TEST = {"tutorial-custom-symmetry.md"}
#: Pages written with runnable code, and how many blocks each has at least.
PAGES_WITH_CODE = {"attention.md": 6, "adapters.md": 2, "sharpness.md": 6, "cli.md": 1}
SKIP_MARKER = "<!-- no-test -->"


def python_blocks(text: str) -> list[tuple[int, str, bool]]:
    """``(line number, code, skipped)`` for each ```python block of a markdown text."""
    blocks = []
    position = 0
    for match in re.finditer(r"^```python[ \t]*\n(.*?)^```[ \t]*$", text, flags=re.S | re.M):
        preceding = text[position:match.start()].rstrip().splitlines()
        skipped = bool(preceding) and preceding[-1].strip() == SKIP_MARKER
        line = text.count("\n", 0, match.start()) + 2
        blocks.append((line, match.group(1), skipped))
        position = match.end()
    return blocks


def _pages() -> list[str]:
    return sorted(p.name for p in DOCS.glob("*.md") if p.name not in OWN_TEST)


def test_block_extraction_sees_markers_and_order() -> None:
    text = ("intro\n```python\na = 1\n```\n<!-- no-test -->\n```python\nb = 2\n```\n"
            "```bash\nls\n```\n```python\nc = a + 1\n```\n")
    blocks = python_blocks(text)
    assert [(code, skipped) for _, code, skipped in blocks] == [
        ("a = 1\n", False), ("b = 2\n", True), ("c = a + 1\n", False)]
    assert blocks[0][0] == 3


def test_pages_with_code_exist_and_are_mostly_tested() -> None:
    for name, minimum in PAGES_WITH_CODE.items():
        blocks = python_blocks((DOCS / name).read_text())
        tested = [b for b in blocks if not b[2]]
        assert len(tested) >= minimum, (name, len(tested))
        assert len(tested) >= len(blocks) - 1, f"{name}: more than one block is skipped"


@pytest.mark.parametrize("page", _pages())
def test_page_code_runs(page: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = DOCS / page
    namespace: dict = {"__name__": f"docs_{path.stem}"}
    for line, code, skipped in python_blocks(path.read_text()):
        if skipped:
            continue
        # pad with blank lines so that tracebacks point at the right line of the page
        exec(compile("\n" * (line - 1) + code, str(path), "exec"), namespace)  # noqa: S102
