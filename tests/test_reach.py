"""The reach statements of the family pages, from the solver reach study's data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from results_pages.reach_statements import (
    BEGIN,
    END,
    PAGE_SOURCES,
    reach_statement,
    refresh_reach_statements,
)
from results_pages.sections import HAND_WRITTEN_MARKER

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _reach(mix_min: float) -> dict:
    def entry(low: float) -> dict:
        return {"ascent": {"min": low, "median": 100.0, "problems": 2}}

    by_measure = {"adaptive": {"0.1": entry(99.5)}, "worst_case": {"0.02": entry(99.9)},
                  "geodesic_inv_o2": {"0.1": entry(100.0)},
                  "geodesic_mix_o2": {"0.02": entry(mix_min), "0.1": entry(1.0)}}
    return {"families": {"vit": {
        "page_rhos": {"adaptive": 0.1, "worst_case": 0.02, "inv": 0.1, "mix": 0.02},
        "models": [{"diverged": False}, {"diverged": False}], "batches": 1,
        "ascent_steps": 20, "reach": by_measure}}}


@pytest.mark.pages
def test_the_statement_quotes_each_measure_at_the_page_radius_and_judges_it() -> None:
    good = reach_statement("vit", _reach(99.2))
    assert good is not None and good.startswith(BEGIN) and good.endswith(END)
    # mix at the page's 0.02, not at 0.1 where it would read 1.00
    assert "geodesic mix (order 2) (ρ = 0.02) 99.20 / 100.00 %" in good
    assert "1.00 /" not in good and "within solver error there" in good
    # the verdict is scoped to the problems measured, never to the whole page
    assert "not every model and batch of the page" in good
    bad = reach_statement("vit", _reach(73.25))
    assert bad is not None and "Not every comparison" in bad
    assert "reaches only geodesic mix (order 2) 73.25 %, so" in bad
    # a page measured on another family says so; a page without a source gets nothing
    assert "not on these BERT models" in (reach_statement("bert", _reach(99.2)) or "")
    assert reach_statement("minilm", _reach(99.2)) is None
    # where the page's own family was measured, its own data, without the note
    both = _reach(99.2)
    both["families"]["bert"] = _reach(50.0)["families"]["vit"]
    own = reach_statement("bert", both) or ""
    assert "reaches only geodesic mix (order 2) 50.00 %" in own and "not on these" not in own
    assert reach_statement("diagonal", _reach(99.2)) is None
    missing = _reach(99.2)
    del missing["families"]["vit"]["reach"]["adaptive"]["0.1"]
    with pytest.raises(ValueError, match="no radius 0.1 for adaptive"):
        reach_statement("vit", missing)


@pytest.mark.pages
def test_refresh_puts_the_statement_before_the_hand_written_part_once(tmp_path) -> None:
    folder = tmp_path / "results"
    (folder / "data").mkdir(parents=True)
    (folder / "vit.md").write_text(f"## ViT\n\ntables\n\n{HAND_WRITTEN_MARKER}\n\nby hand\n")
    (folder / "bert.md").write_text("## BERT\n\ntables\n")
    assert refresh_reach_statements(tmp_path) == []          # no reach data: nothing
    (folder / "data" / "reach.json").write_text(json.dumps(_reach(99.2)))
    assert sorted(p.name for p in refresh_reach_statements(tmp_path)) == ["bert.md", "vit.md"]
    vit = (folder / "vit.md").read_text()
    assert vit.index("tables") < vit.index(BEGIN) < vit.index(HAND_WRITTEN_MARKER)
    assert vit.endswith("by hand\n") and vit.count(BEGIN) == 1
    assert (folder / "bert.md").read_text().rstrip().endswith(END)
    # new data replaces the statement; the same data changes nothing
    (folder / "data" / "reach.json").write_text(json.dumps(_reach(50.0)))
    refresh_reach_statements(tmp_path)
    vit = (folder / "vit.md").read_text()
    assert vit.count(BEGIN) == 1 and "Not every comparison" in vit
    assert refresh_reach_statements(tmp_path) == []


@pytest.mark.pages
def test_the_committed_family_pages_state_the_committed_reach_data() -> None:
    data = DOCS / "results" / "data" / "reach.json"
    if not data.is_file():
        pytest.skip("no reach data committed")
    reach = json.loads(data.read_text())
    for page in PAGE_SOURCES:
        statement = reach_statement(page, reach)
        assert statement is not None, page
        assert statement in (DOCS / "results" / f"{page}.md").read_text(), page


@pytest.mark.pages
def test_the_statement_of_a_searched_family_counts_the_flagged_shortfalls() -> None:
    reach = _reach(73.25)
    for by_rho in reach["families"]["vit"]["reach"].values():
        for entry in by_rho.values():
            short = int(entry["ascent"]["min"] < 99)
            entry["flags"] = {"problems": 2, "short": short, "short_flagged": short,
                              "reaching_reach_flagged": 0, "not_local": 0}
    # one short problem at the page's radii (mix at 0.02; mix at 0.1 is not compared there)
    text = reach_statement("vit", reach) or ""
    assert "The default solver (the reach search, the study's 20 Auto-PGD steps" in text
    assert "(1 problem), its result flagged 1 of them" in text
    # data of the one-ascent study keep their wording
    assert "The study's ascent (20 Auto-PGD steps" in (reach_statement("vit", _reach(73.25))
                                                      or "")


@pytest.mark.pages
def test_the_reach_page_sums_the_warnings_of_every_family_and_names_the_unflagged() -> None:
    from results_pages.reach import _totals_lines

    def flags(problems: int, short: int, flagged: int, false: int, not_local: int) -> dict:
        return {"flags": {"problems": problems, "short": short, "short_flagged": flagged,
                          "reaching_reach_flagged": false, "not_local": not_local}}

    families = {
        "vit": {"reach": {"worst_case": {"0.1": flags(4, 3, 1, 1, 0), "0.3": flags(4, 0, 0, 0, 0)},
                          "geodesic_mix_o2": {"0.1": flags(4, 2, 2, 0, 4)}}},
        "lora": {"reach": {"adaptive": {"0.1": flags(3, 1, 0, 2, 1),
                                        "0.3": {"refused": "too large"}}}},
    }
    text = "\n".join(_totals_lines(families))
    assert "15 problems; the default fell short of 99 % of the best value found on 6" in text
    assert "flagged 3 of them. Not flagged: 3: vit worst_case at ρ = 0.1 (2); lora " in text
    assert "lora adaptive at ρ = 0.1 (1). The reach estimate flagged 3 problems" in text
    assert "5 balls were not local" in text and "geodesic_mix_o2" not in text
    # every shortfall flagged: no list; no warnings tables at all: no paragraph
    families["vit"]["reach"]["worst_case"]["0.1"] = flags(4, 3, 3, 0, 0)
    families["lora"]["reach"]["adaptive"]["0.1"] = flags(3, 1, 1, 0, 0)
    assert "Not flagged: 0. The reach" in "\n".join(_totals_lines(families))
    assert _totals_lines({"vit": {"reach": {"adaptive": {"0.1": {"ascent": {}}}}}}) == []
