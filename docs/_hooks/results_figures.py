"""MkDocs hook: show each study's figures on its results page (and link their SVG twins).

``quotientsharp reproduce STUDY`` writes its figures (PNG) to ``results/STUDY/``, which is not
committed, and its page section to ``docs/results/STUDY.md``, which it rewrites on every run
with ``--docs docs``. So the figures are embedded here, at build time, rather than in the
generated page: every PNG in ``docs/results/figures/STUDY/`` is appended to that study's page
under "Figures"; with none there, the section says how to make them. Only files that exist are
referenced. A results page's headings are raised one level (:func:`promote_headings`), so that
its generated heading is the page's title rather than a repetition of it.
"""

from __future__ import annotations

from pathlib import Path

STUDIES = ("diagonal", "vit", "bert", "minilm", "vit-finetune", "lora", "invariance")


def _figures_section(study: str, docs_dir: Path) -> str:
    folder = docs_dir / "results" / "figures" / study
    # the multi-panel figure of every measure first, then one per measure
    figures = (sorted(folder.glob("*.png"), key=lambda f: ("panels" not in f.stem, f.name))
               if folder.is_dir() else [])
    lines = ["", "## Figures", ""]
    copy = (f"`mkdir -p docs/results/figures/{study} && "
            f"cp results/{study}/*.png results/{study}/*.svg docs/results/figures/{study}/`")
    if not figures:
        lines.append(
            f"No figures are committed for this study. `quotientsharp reproduce {study} "
            f"--docs docs` writes them to `results/{study}/` (and this page's tables, from the "
            f"same run); to show them here, copy them with {copy} and rebuild the site.")
        return "\n".join(lines) + "\n"
    lines += [f"From `docs/results/figures/{study}/`, made by the run of the tables above. To "
              f"refresh: `quotientsharp reproduce {study} --docs docs`, then {copy}.", ""]
    # several figures: two per row
    size = '{ width="49%" }' if len(figures) > 1 else ""
    lines.append("\n".join(
        f'![{figure.stem}](figures/{study}/{figure.name} "{figure.name}")'
        + ("" if "panels" in figure.stem else size) for figure in figures))
    vectors = [figure.with_suffix(".svg") for figure in figures
               if figure.with_suffix(".svg").is_file()]
    if vectors:
        lines += ["", "Vector versions (SVG, for print): " + ", ".join(
            f"[{vector.name}](figures/{study}/{vector.name})" for vector in vectors) + "."]
    return "\n".join(lines) + "\n"


def promote_headings(markdown: str) -> str:
    """Raise every heading one level when the page has no level-1 heading.

    A study's section file starts with a level-2 heading, because the same file is also a
    section of ``results.md``. Shown as a page of its own, the theme would add the navigation
    title as a level-1 heading above it, so the page would open with its title twice; with its
    own heading promoted to level 1, the page has one title, the study's. Lines inside fenced
    code blocks are left alone.
    """
    lines = markdown.split("\n")
    fenced = False
    has_title = False
    for line in lines:
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("# "):
            has_title = True
    if has_title:
        return markdown
    out, fenced = [], False
    for line in lines:
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("##"):
            line = line[1:]
        out.append(line)
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    path = page.file.src_uri
    docs_dir = Path(config["docs_dir"])
    if path.startswith("results/"):
        markdown = promote_headings(markdown)
    if path.startswith("results/") and Path(path).stem in STUDIES:
        return markdown.rstrip() + "\n" + _figures_section(Path(path).stem, docs_dir)
    if path == "results.md":
        links = ", ".join(f"[{study}](results/{study}.md#figures)" for study in STUDIES)
        return markdown.rstrip() + f"\n\n## Figures\n\nOn each study's page: {links}.\n"
    return markdown
