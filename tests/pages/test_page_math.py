"""The display formulas of the generated results pages render as math, inside their list.

Python-Markdown (what mkdocs renders with) nests a list item's blocks only when they are
indented by four spaces; the diagonal page's theory section indented its display formulas by
two, so ``pymdownx.arithmatex`` left them as raw ``$$...$$`` and the list broke apart.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from results_pages.diagonal import THEORY

markdown = pytest.importorskip("markdown")
pytest.importorskip("pymdownx")

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _html(text: str) -> str:
    return markdown.markdown(text, extensions=["pymdownx.arithmatex"],
                             extension_configs={"pymdownx.arithmatex": {"generic": True}})


@pytest.mark.pages
@pytest.mark.parametrize("text", [THEORY, (DOCS / "results" / "diagonal.md").read_text(),
                                  (DOCS / "results.md").read_text()],
                         ids=["generator", "diagonal.md", "results.md"])
def test_display_formulas_render_inside_one_list(text):
    start = text.index("### What each measure is at interpolation")
    theory = text[start:]
    end = theory.find("\n#", 5)
    html = _html(theory if end < 0 else theory[:end])
    assert "$$" not in html
    assert html.count('<div class="arithmatex">') == 4
    assert html.count("<ul>") == 1 and html.count("<li>") == 4
