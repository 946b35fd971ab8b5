"""The paper's results pages, ``docs/results/``, rendered from the studies' data.

Not part of the installed package: ``quotientsharp reproduce STUDY --docs DIR`` writes the
study's data (``DIR/results/data/``) and then imports this package from
``DIR/_hooks/results_pages/`` by its file path
(:func:`quotientsharp.reproduce.results_page.renderer`), which calls :func:`render_study`. The
modules here import each other relatively, so that they work under whatever name the package
is imported; they may import ``quotientsharp``, never the other way round.

- :func:`render_study`: a study's section ``docs/results/<study>.md`` from its page data
  ``docs/results/data/pages/<study>.json`` (:data:`RENDERERS`), then
  :func:`regenerate_results_page`;
- :func:`regenerate_results_page`: the summary section from the headline files
  (:mod:`.summary`), the family pages' solver reach statements from the reach data
  (:mod:`.reach_statements`), and ``docs/results.md`` from the section files (:mod:`.sections`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from . import diagonal, families, invariance, reach
from .reach_statements import refresh_reach_statements
from .sections import assemble_results_page, write_section
from .summary import write_summary

#: Study -> the function that turns its page data (the ``page`` entry) into its section.
RENDERERS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "diagonal": diagonal.section,
    "vit": families.section,
    "bert": families.section,
    "vit-finetune": families.section,
    "minilm": families.section,
    "lora": families.section,
    "invariance": invariance.section,
    "reach": reach.section,
}


def page_data_path(docs_dir: Path, study: str) -> Path:
    """``docs_dir/results/data/pages/<study>.json``."""
    return Path(docs_dir) / "results" / "data" / "pages" / f"{study}.json"


def read_page_data(docs_dir: Path, study: str) -> dict[str, Any]:
    """The page data of ``study`` (``{"study", "provenance", "page"}``), checked.

    Raises
    ------
    ValueError
        No such file, or not a page data document of ``study``.
    """
    path = page_data_path(docs_dir, study)
    if not path.is_file():
        raise ValueError(f"no page data for {study!r} at {path}: run quotientsharp reproduce "
                         f"{study} --docs {docs_dir}")
    document = json.loads(path.read_text())
    if (not isinstance(document, dict) or set(document) != {"study", "provenance", "page"}
            or document["study"] != study):
        raise ValueError(f"{path}: expected the keys 'study' ({study!r}), 'provenance' and "
                         "'page'")
    return document


def render_section(document: Mapping[str, Any]) -> str:
    """The section Markdown of a page data document, before its provenance stamp."""
    study = document["study"]
    if study not in RENDERERS:
        raise ValueError(f"no renderer for study {study!r}; renderers: {sorted(RENDERERS)}")
    return RENDERERS[study](document["page"])


def render_study(docs_dir: Path, study: str) -> Path:
    """Write ``docs_dir/results/<study>.md`` from the study's page data, then regenerate the
    results page; the section's path."""
    document = read_page_data(docs_dir, study)
    path = write_section(docs_dir, study, render_section(document), document["provenance"])
    regenerate_results_page(docs_dir)
    return path


def regenerate_results_page(docs_dir: Path) -> Path:
    """The summary section (from the headline files, stamped with the provenance of its page
    data; nothing without a headline file), the family sections' solver reach statements
    (from the reach data; nothing without it), then ``docs_dir/results.md`` from the section
    files, listing the registered studies (:data:`quotientsharp.reproduce.STUDIES`) not yet
    run."""
    from quotientsharp.reproduce import STUDIES

    summary = page_data_path(docs_dir, "summary")
    if summary.is_file():
        write_summary(docs_dir, read_page_data(docs_dir, "summary")["provenance"])
    refresh_reach_statements(docs_dir)
    return assemble_results_page(docs_dir, list(STUDIES))


__all__ = ["RENDERERS", "page_data_path", "read_page_data", "regenerate_results_page",
           "render_section", "render_study", "write_section"]
