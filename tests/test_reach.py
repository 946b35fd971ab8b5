"""The solver reach study's pieces: the default ascent read off the strong ascent's trace, the
shares of the best value found, and the reach statements of the family pages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quotientsharp.reproduce.reach_models import measure_reach, percent, reach_shares
from quotientsharp.reproduce.reach_statements import (
    BEGIN,
    END,
    PAGE_SOURCES,
    reach_statement,
    refresh_reach_statements,
)
from quotientsharp.reproduce.results_page import HAND_WRITTEN_MARKER

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _tiny_bert_and_batch(seed: int):
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(seed)
    config = transformers.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, vocab_size=30,
                                     max_position_embeddings=16, num_labels=3,
                                     attn_implementation="eager", initializer_range=0.3)
    model = transformers.BertForSequenceClassification(config).to(torch.float64).eval()
    generator = torch.Generator().manual_seed(seed)
    batch = {"input_ids": torch.randint(0, 30, (4, 6), generator=generator),
             "attention_mask": torch.ones(4, 6, dtype=torch.long),
             "labels": torch.randint(0, 3, (4,), generator=generator)}
    return model, [batch]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("options", [{"measure": "adaptive"},
                                     {"measure": "geodesic", "metric": "inv", "order": 2}])
def test_the_default_ascent_read_off_the_reference_trace_is_a_20_step_ascent(seed,
                                                                             options) -> None:
    import quotientsharp as qs

    model, batches = _tiny_bert_and_batch(seed)
    values = measure_reach(model, batches, {"m": options}, [0.3], n_iter=2,
                           reference={"n_iter": 20, "restarts": 1})["m"]["0.3"]
    # independent: the default ascent run on its own
    alone = qs.sharpness(model, batches, rho=0.3, n_iter=20, progress=False, reach=False,
                         **options)
    assert values["default"] == alone.per_batch
    assert values["reference"][0] >= values["default"][0]
    # no default column when the measured ascent is the default one
    plain = measure_reach(model, batches, {"m": options}, [0.3], n_iter=20,
                          reference={"n_iter": 20, "restarts": 0})["m"]["0.3"]
    assert "default" not in plain and plain["ascent"] == alone.per_batch


def test_shares_are_of_the_best_value_of_each_problem() -> None:
    values = {"m": {"0.1": {"ascent": [1.0, 2.0, 3.0], "reference": [2.0, 1.0, 3.0],
                            "default": [1.5, 2.5, 0.0]}},
              "r": {"0.1": {"refused": "too large"}}}
    shares = reach_shares(values)
    # best per problem: 2, 2.5, 3
    assert shares["m"]["0.1"]["ascent"] == {"min": 50.0, "median": 80.0, "problems": 3}
    assert shares["m"]["0.1"]["default"] == {"min": 0.0, "median": 75.0, "problems": 3}
    assert shares["r"]["0.1"] == {"refused": "too large"}
    with pytest.raises(ValueError, match="finite, positive best"):
        percent([0.0], [0.0])
    with pytest.raises(ValueError, match="at least one problem"):
        percent([], [])


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
