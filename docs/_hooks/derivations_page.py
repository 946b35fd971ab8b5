"""MkDocs hook: the page ``derivations.md`` shows ``derivations/README.md``.

The README lives next to the scripts it describes, outside ``docs/``, where MkDocs cannot link
to it. Rather than keep a copy, the page ``docs/derivations.md`` is a stub whose body is
replaced at build time by the README (its own first heading stands in for the stub's), so the
site always shows the README as committed.
"""

from __future__ import annotations

from pathlib import Path

PAGE = "derivations.md"


def readme_page(docs_dir: Path) -> str:
    """The README's text as the page's Markdown, with a line naming its source."""
    readme = (docs_dir.parent / "derivations" / "README.md").read_text()
    title, _, body = readme.partition("\n")
    source = ("The scripts are in the repository's `derivations/` folder; this page is its "
              "`README.md`.")
    return f"{title}\n\n{source}\n{body}"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri == PAGE:
        return readme_page(Path(config["docs_dir"]))
    return markdown
