"""The documentation site builds strictly, renders its math offline, and references only files
that exist: ``mkdocs build --strict`` into a temporary folder, then the built HTML is read.

What it checks: every page loads the vendored KaTeX (script, auto-render, the init script, the
stylesheet) from the site itself and nothing from another host; every font the KaTeX stylesheet
names is in the site; the concepts, attention and sharpness pages carry arithmatex math, inline
and display; every image, script and stylesheet a page references exists; the API reference
and the results pages are built.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

pytestmark = pytest.mark.pages

ROOT = Path(__file__).resolve().parents[1]
KATEX = ("assets/katex/katex.min.js", "assets/katex/contrib/auto-render.min.js",
         "assets/javascripts/katex-init.js")
MATH_PAGES = ("concepts", "attention", "sharpness")
API_OBJECTS = {
    "api/quotients": ["quotientsharp.SymmetryQuotient", "quotientsharp.ClosedFormQuotient",
                      "quotientsharp.FrozenPoint", "quotientsharp.AdaptiveQuotient",
                      "quotientsharp.ProductQuotient"],
    "api/gl": ["quotientsharp.core.gl.GLQuotient", "quotientsharp.core.gl.InvMetric",
               "quotientsharp.core.gl.MixMetric", "quotientsharp.core.gl.EuclideanMetric"],
    "api/diagonal": ["quotientsharp.core.diagonal.DiagonalQuotient"],
    "api/models": ["quotientsharp.models.find_symmetries", "quotientsharp.models.QuotientBinding",
                   "quotientsharp.models.SymmetryReport", "quotientsharp.models.ParameterLayout"],
    "api/sharpness": ["quotientsharp.engine.sharpness",
                      "quotientsharp.engine.SharpnessResult",
                      "quotientsharp.engine.build_geometry", "quotientsharp.engine.ascend"],
    "api/checks": ["quotientsharp.core.checks.check_all"],
    "api/reference": ["quotientsharp.core.reference.christoffel"],
    "api/adapters": ["quotientsharp.core.adapters.geoopt.QuotientManifold",
                     "quotientsharp.core.adapters.pymanopt.PymanoptQuotient"],
    "api/symbolic": ["quotientsharp.core.symbolic.check_quotient",
                     "quotientsharp.core.symbolic.christoffel_symbols",
                     "quotientsharp.core.symbolic.horizontal_projection_matrix"],
}
#: pages that write their formulas in KaTeX only (no formula as inline code)
KATEX_PAGES = ("tutorial-custom-symmetry", "adapters")
#: the longest line a code block of the home page may have without being cut off in a
#: narrow window (the theme scrolls code blocks instead of wrapping them)
HOME_LINE = 60
STUDIES = ("diagonal", "vit", "bert", "minilm", "vit-finetune", "lora", "invariance")


class _References(HTMLParser):
    """The ``src`` of images and scripts and the ``href`` of stylesheets of one page."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.scripts: list[str] = []
        self.stylesheets: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "img" and values.get("src"):
            self.images.append(values["src"])
        elif tag == "script" and values.get("src"):
            self.scripts.append(values["src"])
        elif tag == "link" and values.get("rel") == "stylesheet" and values.get("href"):
            self.stylesheets.append(values["href"])


def _target(site: Path, page: Path, reference: str) -> Path | None:
    """The file a relative reference of ``page`` points to; None for another host."""
    parts = urlsplit(reference)
    if parts.scheme or parts.netloc:
        return None
    if not parts.path:
        return page
    path = unquote(parts.path)
    if path.startswith("/"):             # 404.html: root-relative
        return (site / path.lstrip("/")).resolve()
    return (page.parent / path).resolve()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python", "pymdownx"):
        pytest.importorskip(module)
    folder = tmp_path_factory.mktemp("site")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                          str(folder)], cwd=ROOT, capture_output=True, text=True, check=False,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert run.returncode == 0, run.stderr[-4000:]
    return folder


def _pages(site: Path) -> list[Path]:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 15
    return pages


def test_every_page_loads_the_vendored_katex_and_nothing_from_another_host(site) -> None:
    for page in _pages(site):
        references = _References()
        references.feed(page.read_text())
        for reference in references.scripts + references.stylesheets:
            assert _target(site, page, reference) is not None, (page, reference)
        loaded = {_target(site, page, s) for s in references.scripts}
        assert {(site / path).resolve() for path in KATEX} <= loaded, page
        styles = {_target(site, page, s) for s in references.stylesheets}
        assert (site / "assets/katex/katex.min.css").resolve() in styles, page


def test_every_referenced_image_script_and_stylesheet_exists(site) -> None:
    images = 0
    for page in _pages(site):
        references = _References()
        references.feed(page.read_text())
        for reference in references.images + references.scripts + references.stylesheets:
            target = _target(site, page, reference)
            assert target is not None and target.is_file(), (page.relative_to(site), reference)
        images += len(references.images)
    figures = list((ROOT / "docs/results/figures").rglob("*.png"))
    assert images >= len(figures)


def test_katex_stylesheet_fonts_are_in_the_site(site) -> None:
    css = (site / "assets/katex/katex.min.css").read_text()
    fonts = re.findall(r"url\(([^)]+)\)", css)
    assert len(fonts) >= 15
    for font in fonts:
        assert font.endswith(".woff2"), font
        assert (site / "assets/katex" / font).is_file(), font


def test_math_pages_carry_inline_and_display_math(site) -> None:
    for name in MATH_PAGES:
        html = (site / name / "index.html").read_text()
        inline = re.findall(r'<span class="arithmatex">\\\((.+?)\\\)</span>', html, flags=re.S)
        display = re.findall(r'<div class="arithmatex">\\\[(.+?)\\\]</div>', html, flags=re.S)
        assert len(inline) >= 20 and len(display) >= 3, (name, len(inline), len(display))
        text = re.sub(r"<(code|pre|script)\b.*?</\1>", "", html, flags=re.S)
        text = re.sub(r'<(span|div) class="arithmatex">.*?</\1>', "", text, flags=re.S)
        assert "$" not in text, f"{name}: a $ outside math (unconverted formula?)"
    concepts = (site / "concepts" / "index.html").read_text()
    assert r"\Gamma_x(v, v) = g(x)^{-1}" in concepts


def test_api_reference_documents_the_public_api(site) -> None:
    for page, identifiers in API_OBJECTS.items():
        html = (site / page / "index.html").read_text()
        for identifier in identifiers:
            assert f'id="{identifier}"' in html, (page, identifier)
    assert ":class:" not in (site / "api/sharpness/index.html").read_text()


def test_results_pages_are_built_with_a_figures_section(site) -> None:
    for study in STUDIES:
        html = (site / "results" / study / "index.html").read_text()
        assert 'id="figures"' in html, study
        assert (f"results/figures/{study}" in html) or (f"reproduce {study}" in html), study


def test_figures_hook_embeds_the_files_present_and_only_those(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("results_figures",
                                                  ROOT / "docs/_hooks/results_figures.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    assert "reproduce vit" in hook._figures_section("vit", tmp_path)
    assert "![" not in hook._figures_section("vit", tmp_path)
    folder = tmp_path / "results" / "figures" / "vit"
    folder.mkdir(parents=True)
    for name in ("scatter_b.png", "scatter_a.png", "notes.txt"):
        (folder / name).write_bytes(b"")
    section = hook._figures_section("vit", tmp_path)
    assert re.findall(r"!\[[^]]*\]\(([^ )]+)", section) == [
        "figures/vit/scatter_a.png", "figures/vit/scatter_b.png"]


def _math(html: str) -> tuple[list[str], list[str]]:
    inline = re.findall(r'<span class="arithmatex">\\\((.+?)\\\)</span>', html, flags=re.S)
    display = re.findall(r'<div class="arithmatex">\\\[(.+?)\\\]</div>', html, flags=re.S)
    return inline, display


def test_tutorial_and_adapter_pages_write_math_in_katex(site) -> None:
    for name in KATEX_PAGES:
        html = (site / name / "index.html").read_text()
        inline, _ = _math(html)
        assert len(inline) >= 10, (name, len(inline))
        text = re.sub(r"<(pre|script)\b.*?</\1>", "", html, flags=re.S)
        text = re.sub(r'<(span|div) class="arithmatex">.*?</\1>', "", text, flags=re.S)
        assert "$" not in text, f"{name}: a $ outside math (unconverted formula?)"
        # formulas once written as inline code: none is left outside code blocks
        codes = re.findall(r"<code>(.*?)</code>", text, flags=re.S)
        for pattern in (r"\^T\b", r"Gamma\(", r"\|w_in\|", r"^O\(", r"G H\^"):
            offenders = [c for c in codes if re.search(pattern, c)]
            assert not offenders, (name, pattern, offenders)


def test_home_page_code_is_not_cut_off(site) -> None:
    html = (site / "index.html").read_text()
    blocks = re.findall(r"<pre\b.*?</pre>", html, flags=re.S)
    assert blocks
    for block in blocks:
        text = re.sub(r"<[^>]+>", "", block)
        for line in text.splitlines():
            assert len(line.rstrip()) <= HOME_LINE, line


def test_results_pages_state_their_heading_once(site) -> None:
    for page in sorted((ROOT / "docs" / "results").glob("*.md")):
        html = (site / "results" / page.stem / "index.html").read_text()
        titles = re.findall(r"<h1\b[^>]*>(.*?)</h1>", html, flags=re.S)
        assert len(titles) == 1, (page.name, titles)
        title = re.sub(r"<[^>]+>|&para;|¶", "", titles[0]).strip()
        heading = page.read_text().lstrip().splitlines()[0].lstrip("#").strip()
        assert title == re.sub(r"`", "", heading), (page.name, title, heading)
        subheadings = [re.sub(r"<[^>]+>|&para;|¶", "", h).strip()
                       for h in re.findall(r"<h2\b[^>]*>(.*?)</h2>", html, flags=re.S)]
        assert title not in subheadings, page.name


def test_derivations_readme_is_a_page_listing_every_script(site) -> None:
    readme = (ROOT / "derivations" / "README.md").read_text()
    scripts = sorted(p.name for p in (ROOT / "derivations").glob("*.py"))
    assert len(scripts) >= 3
    html = (site / "derivations" / "index.html").read_text()
    for script in scripts:
        assert f"**`{script}`**" in readme, f"derivations/README.md does not describe {script}"
        assert f"<code>{script}</code>" in html, script
    # the page is the README: a sentence from its middle is on it
    sentence = "exits with status 0 when every check passes"
    page_text = " ".join(re.sub(r"<[^>]+>", "", html).split())
    assert sentence in " ".join(readme.split()) and sentence in page_text
    links = re.findall(r'href="([^"]*derivations/)"', (site / "tutorial-custom-symmetry" /
                                                          "index.html").read_text())
    assert links, "the tutorial links the derivations page"
