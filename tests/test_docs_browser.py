"""The documentation renders in a real browser: math everywhere, code that is never cut off.

``mkdocs build --strict`` into a temporary folder, served on 127.0.0.1; each page below is
copied next to itself with a small script added, and headless chromium loads the copy, runs the
page's own JavaScript (KaTeX renders the math client-side), waits for the math and the fonts,
and then the script writes its measurements into the page as JSON, which ``--dump-dom``
returns. The window is 1280 px wide: the theme's text column is then ~700 px.

What it checks:

- math pages: every formula ``pymdownx.arithmatex`` marked is rendered by KaTeX, without a
  KaTeX error, and no raw ``$$``, ``\\(``, ``\\[`` or TeX command is left in the text outside
  the rendered math and the code;
- code blocks (every ``pre > code`` of every page loaded): nothing is hidden past the right
  edge (``scrollWidth <= clientWidth``: long lines wrap, docs/assets/stylesheets/code.css), and
  no character lies under the theme's copy button.

Skipped where chromium is not installed (``apt-get install chromium``).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = next(filter(None, (shutil.which(name) for name in
                              ("chromium", "chromium-browser", "google-chrome"))), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium): the docs "
    "are not checked in a browser")

#: pages whose code blocks are checked (and, like every page loaded, their math)
CODE_PAGES = ("tutorial-custom-symmetry", "lora", "cli")
#: pages with inline and display math: the generated results pages and hand-written ones
MATH_PAGES = ("results/diagonal", "results", "concepts", "tutorial-custom-symmetry", "lora")
PAGES = tuple(dict.fromkeys(CODE_PAGES + MATH_PAGES))
WINDOW = "1280,2000"
#: a raw math delimiter or TeX command in the rendered text: math KaTeX did not render
RAW_MATH = re.compile(r"\$\$|\\[()\[\]]|\\[A-Za-z]{2,}")

#: runs in the page after its own scripts: waits (at most ~5 s) until KaTeX has rendered every
#: formula and the fonts are loaded, then measures and writes JSON into <pre id=RESULT>
MEASURE = r"""
(function () {
  const article = () => document.querySelector("article") || document.body;
  const pending = () => [...article().querySelectorAll(".arithmatex")]
    .filter(e => !e.querySelector(".katex")).length;
  function overlaps(a, b) {
    return a.right > b.left && a.left < b.right && a.bottom > b.top && a.top < b.bottom;
  }
  function covered(code, box) {           // the characters of `code` under `box`
    let found = "";
    const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    for (let node; (node = walker.nextNode());) {
      const whole = document.createRange(); whole.selectNodeContents(node);
      if (![...whole.getClientRects()].some(r => overlaps(r, box))) continue;
      for (let k = 0; k < node.data.length; k++) {
        if (/\s/.test(node.data[k])) continue;
        const range = document.createRange(); range.setStart(node, k); range.setEnd(node, k + 1);
        if ([...range.getClientRects()].some(r => overlaps(r, box))) found += node.data[k];
      }
    }
    return found;
  }
  function measure() {
    const root = article();
    const out = { window: window.innerWidth, article: root.clientWidth, code: [], raw: [],
                  formulas: root.querySelectorAll(".arithmatex").length, pending: pending(),
                  errors: [...root.querySelectorAll(".katex-error")].map(e => e.textContent) };
    root.querySelectorAll("pre > code").forEach(code => {
      const nav = code.parentElement.querySelector(".md-code__nav, .md-clipboard");
      out.code.push({ start: code.textContent.slice(0, 60), scroll: code.scrollWidth,
                      client: code.clientWidth,
                      covered: nav ? covered(code, nav.getBoundingClientRect()) : "" });
    });
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let node; (node = walker.nextNode());) {
      if (node.parentElement.closest("script, style, code, pre, .katex")) continue;
      const match = node.data.match(RAW);
      if (match) out.raw.push(node.data.slice(Math.max(0, match.index - 40), match.index + 40));
    }
    const result = document.createElement("pre");
    result.id = "RESULT";
    result.textContent = JSON.stringify(out);
    document.body.appendChild(result);
  }
  let tries = 0;
  function wait() {
    if (pending() && ++tries < 50) { setTimeout(wait, 100); return; }
    document.fonts.ready.then(() => setTimeout(measure, 100));
  }
  window.addEventListener("load", wait);
})();
"""
RESULT = "qs-browser-check"


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def _render(site: Path, port: int, page: str, profile: Path) -> dict:
    """Load ``page`` in headless chromium and return what the measuring script wrote."""
    source = site / page / "index.html"
    script = MEASURE.replace("RAW", RAW_MATH.pattern.join(("/", "/"))).replace("RESULT",
                                                                               RESULT)
    source.with_name("browser-check.html").write_text(
        source.read_text().replace("</body>", f"<script>{script}</script></body>"))
    url = f"http://127.0.0.1:{port}/{page}/browser-check.html"
    run = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=10000",
         f"--window-size={WINDOW}", "--dump-dom", url],
        capture_output=True, text=True, timeout=120, check=False)
    match = re.search(rf'<pre id="{RESULT}">(.*?)</pre>', run.stdout, flags=re.S)
    assert match, f"{page}: the measuring script wrote nothing (chromium exit " \
                  f"{run.returncode}): {run.stderr[-2000:]}"
    return json.loads(html.unescape(match.group(1)))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, dict]:
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python", "pymdownx"):
        pytest.importorskip(module)
    site = tmp_path_factory.mktemp("site")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                            str(site)], cwd=ROOT, capture_output=True, text=True, check=False,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert build.returncode == 0, build.stderr[-4000:]
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        return {page: _render(site, server.server_address[1], page,
                              tmp_path_factory.mktemp("chromium-profile")) for page in PAGES}
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("page", PAGES)
def test_the_page_is_laid_out_at_the_width_checked(rendered, page) -> None:
    measured = rendered[page]
    assert measured["window"] == 1280 and 600 <= measured["article"] <= 800, measured


@pytest.mark.parametrize("page", MATH_PAGES)
def test_every_formula_renders_and_no_raw_math_is_left(rendered, page) -> None:
    measured = rendered[page]
    assert measured["formulas"] >= 5, f"{page}: {measured['formulas']} formulas"
    assert measured["pending"] == 0, f"{page}: {measured['pending']} formulas not rendered"
    assert not measured["errors"], f"{page}: KaTeX errors {measured['errors']}"
    assert not measured["raw"], f"{page}: raw math in the rendered text: {measured['raw']}"


@pytest.mark.parametrize("page", PAGES)
def test_no_code_block_hides_text(rendered, page) -> None:
    blocks = rendered[page]["code"]
    if page in CODE_PAGES:
        assert len(blocks) >= 5, f"{page}: {len(blocks)} code blocks"
    cut = [(b["start"], b["scroll"], b["client"]) for b in blocks if b["scroll"] > b["client"]]
    assert not cut, f"{page}: code blocks wider than their box (start, scroll, client): {cut}"
    hidden = [(b["start"], b["covered"]) for b in blocks if b["covered"]]
    assert not hidden, f"{page}: characters under the copy button: {hidden}"
