"""The headline files of the studies, the summary generated from them, and its prose checked
against them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from results_pages.sections import HAND_WRITTEN_MARKER
from results_pages.summary import (
    prose_numbers,
    read_headlines,
    summary_markdown,
    unsupported_numbers,
    write_summary,
)

from quotientsharp.reproduce.headline import (
    check_rows,
    headline_path,
    write_headline,
)
from quotientsharp.reproduce.results_page import regenerate_results_page
from tests.pages.docs_folder import docs_with_renderer

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _row(setting: str = "s", measure: str = "adaptive", tau: float = -0.5, low: float = -0.7,
         high: float = -0.3, paper: float | None = -0.68, note: str = "") -> dict:
    return {"setting": setting, "measure": measure, "tau": tau, "low": low, "high": high,
            "paper": paper, "note": note}


def test_headline_files_round_trip(tmp_path) -> None:
    rows = [_row(), _row(measure="geodesic_mix", tau=0.1, low=-0.1, high=0.3, paper=None,
                         note="n")]
    path = write_headline(tmp_path, "diagonal", rows)
    assert path == tmp_path / "results" / "data" / "diagonal.json"
    data = json.loads(path.read_text())
    assert data == {"study": "diagonal", "rows": rows}
    write_headline(tmp_path, "bert", [_row(setting="b")])
    assert read_headlines(tmp_path) == {"bert": [_row(setting="b")], "diagonal": rows}
    assert read_headlines(tmp_path / "nothing") == {}


@pytest.mark.parametrize(("change", "message"), [
    ({"tau": math.nan}, "finite Kendall tau"),
    ({"high": 1.5}, "finite Kendall tau"),
    ({"tau": True}, "must be a number"),
    ({"low": 0.0, "high": -0.1}, "low 0.0 > high"),
    ({"setting": " "}, "non-empty"),
    ({"note": None}, "note must be a string"),
    ({"paper": "x"}, "paper must be a number"),
])
def test_a_bad_row_is_refused_naming_its_field(change, message) -> None:
    with pytest.raises(ValueError, match=message):
        check_rows([{**_row(), **change}], "bert")


def test_bad_rows_and_files_are_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="exactly the keys"):
        check_rows([{**_row(), "extra": 1}])
    with pytest.raises(ValueError, match="twice"):
        check_rows([_row(), _row()])
    with pytest.raises(ValueError, match="list of dicts"):
        check_rows("rows")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="plain name"):
        headline_path(tmp_path, "../bert")
    path = write_headline(tmp_path, "vit", [_row()])
    path.write_text(json.dumps({"study": "bert", "rows": []}))
    with pytest.raises(ValueError, match="does not match the file name"):
        read_headlines(tmp_path)


def test_the_summary_table_is_generated_from_the_files_and_keeps_the_prose(tmp_path) -> None:
    write_headline(tmp_path, "bert", [
        _row("BERT", "adaptive", 0.31, 0.06, 0.56, 0.06),
        _row("BERT", "geodesic_mix", 0.48, 0.24, 0.67, -0.38),
        _row("BERT", "confound: train_size", -0.34, -0.61, -0.04, None)])
    write_headline(tmp_path, "diagonal", [_row("diag", "geodesic_inv", -0.5, -0.6, 0.1, -0.83)])
    summary = tmp_path / "results" / "summary.md"
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.write_text(f"## old\n\n{HAND_WRITTEN_MARKER}\n\nprose by hand\n")
    regenerate_results_page(docs_with_renderer(tmp_path))
    text = summary.read_text()
    assert text.endswith("prose by hand\n") and "## old" not in text
    table = [line for line in text.splitlines() if line.startswith("| ")]
    # studies in the page's order (diagonal before bert), the three headline columns
    assert table[1].startswith("| diagonal | diag | — | -0.50 [-0.60, +0.10] (-0.83) | — |")
    assert "inv: interval contains 0" in table[1]
    assert table[2].startswith("| bert | BERT | +0.31 [+0.06, +0.56] (+0.06) | — | "
                               "+0.48 [+0.24, +0.67] (-0.38) |")
    assert table[2].endswith("adaptive: yes; mix: opposite |")
    assert "| bert | BERT | confound: train_size | -0.34 [-0.61, -0.04] |" in text
    # and the results page holds the regenerated summary
    assert "+0.48 [+0.24, +0.67]" in (tmp_path / "results.md").read_text()
    assert write_summary(tmp_path / "empty", {}) is None


def test_prose_numbers_belong_to_the_studies_their_paragraph_names() -> None:
    headlines = {"bert": [_row("BERT", "confound: train_size", -0.34, -0.61, -0.04, None)],
                 "vit": [_row("ViT", "confound: train_size", -0.41, -0.60, -0.20, None)]}
    good = "- <!-- numbers from: bert --> size ranks the gap with -0.34 [-0.61, -0.04]."
    assert unsupported_numbers(good, headlines) == []
    # the summary's old slip: ViT's -0.41 quoted for BERT
    wrong = "- <!-- numbers from: bert --> more strongly than any measure (-0.41)."
    assert unsupported_numbers(wrong, headlines) == ["-0.41 (studies: bert)"]
    assert unsupported_numbers("- no source named: +0.12", headlines) == [
        "+0.12 (studies: none named)"]
    # formulas and other numbers are not taus
    assert prose_numbers("- $2 \\rho^2 = 0.02$ and 4.9e5, 86.8 %, 100x") == []
    assert [v for _, v, _ in prose_numbers("- a \u22120.25, b 0.50, c +1.00")] == [
        -0.25, 0.5, 1.0]


def test_the_committed_summary_prose_quotes_only_numbers_of_the_data_files() -> None:
    headlines = read_headlines(DOCS)
    assert headlines, "docs/results/data/ holds no headline file"
    text = (DOCS / "results" / "summary.md").read_text()
    assert HAND_WRITTEN_MARKER in text
    prose = text[text.index(HAND_WRITTEN_MARKER):]
    assert prose_numbers(prose), "the summary's prose quotes no tau"
    assert unsupported_numbers(prose, headlines) == []
    # the generated table is the one the files give
    generated = text[:text.index(HAND_WRITTEN_MARKER)]
    assert summary_markdown(headlines).split("\n", 1)[1].strip() in generated


def test_the_reach_data_beside_the_headline_files_is_not_read_as_one(tmp_path) -> None:
    write_headline(tmp_path, "bert", [_row(setting="b")])
    (tmp_path / "results" / "data" / "reach.json").write_text(json.dumps({"families": {}}))
    assert read_headlines(tmp_path) == {"bert": [_row(setting="b")]}
    with pytest.raises(ValueError, match="not a headline file"):
        write_headline(tmp_path, "reach", [_row()])
