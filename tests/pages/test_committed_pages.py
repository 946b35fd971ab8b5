"""Every committed results page regenerates byte for byte from the committed data.

The renderer (``docs/_hooks/results_pages``) turns the data under ``docs/results/data/`` into
the section files of ``docs/results/`` and the page ``docs/results.md``. A section whose study
has page data (``docs/results/data/pages/<study>.json``) is rendered from it; the summary's
tables come from the headline files, the family pages' solver reach statements from
``reach.json``. The sections written before the studies wrote page data have none yet
(:data:`WITHOUT_PAGE_DATA`): their text is kept as committed, and they get page data when their
study is next run with ``--docs docs``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from results_pages import (
    page_data_path,
    read_page_data,
    regenerate_results_page,
    render_section,
    write_section,
)

from quotientsharp.reproduce import STUDIES
from quotientsharp.reproduce.results_page import check_renderer, renderer

DOCS = Path(__file__).resolve().parents[2] / "docs"

#: Committed sections without page data, and what their renderer would need: the results
#: folders of the runs that made them were not committed, and rerunning would retrain the
#: models (float32 training differs between machines and thread counts).
WITHOUT_PAGE_DATA = {
    "diagonal": "results/diagonal/ of the --full run at abdd1678df86 (analysis, records of "
                "the 12 runs)",
    "invariance": "results/invariance/ of the run at e2eae913e643 (every precision's points)",
}


def _sections(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.glob("*.md"))}


@pytest.mark.pages
def test_every_committed_page_regenerates_byte_for_byte_from_the_committed_data(
        tmp_path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(DOCS / "results", docs / "results")
    sections = sorted(path.stem for path in (DOCS / "results").glob("*.md"))
    rendered = [s for s in sections if s != "summary" and page_data_path(DOCS, s).is_file()]
    for study in rendered:
        document = read_page_data(docs, study)
        write_section(docs, study, render_section(document), document["provenance"])
    regenerate_results_page(docs)
    assert _sections(docs / "results") == _sections(DOCS / "results")
    assert (docs / "results.md").read_bytes() == (DOCS / "results.md").read_bytes()
    # the sections without page data are exactly the documented ones
    assert sorted(set(sections) - set(rendered) - {"summary"}) == sorted(WITHOUT_PAGE_DATA)
    assert set(WITHOUT_PAGE_DATA) <= set(STUDIES)


@pytest.mark.pages
def test_the_committed_page_data_is_what_the_renderer_reads() -> None:
    for path in sorted((DOCS / "results" / "data" / "pages").glob("*.json")):
        document = json.loads(path.read_text())
        assert document == read_page_data(DOCS, path.stem)
        assert set(document["provenance"]) == {"version", "commit", "dirty", "command", "date"}


def test_a_docs_folder_without_the_renderer_is_refused_naming_docs(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"--docs .*no results-page renderer"):
        check_renderer(tmp_path)
    with pytest.raises(ValueError, match="--docs"):
        renderer(tmp_path)
    # the checkout's docs folder has one, imported by its file path
    assert renderer(DOCS).render_section is not None


@pytest.mark.pages
def test_a_study_pointed_at_an_empty_docs_folder_stops_before_it_runs(tmp_path, capsys) -> None:
    from quotientsharp.cli import main

    code = main(["reproduce", "diagonal", "--quick", "--out", str(tmp_path / "out"),
                 "--docs", str(tmp_path / "empty"), "--no-progress"])
    assert code == 2
    assert "--docs" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    code = main(["reproduce", "summary", "--docs", str(DOCS.parent / "no-such-docs")])
    assert code == 2
