"""The solver reach study's measurement: the default solver and its first chain against a strong
solve, and the shares of the best value found with the warnings counted against the
shortfalls."""

from __future__ import annotations

import pytest

from quotientsharp.reproduce.reach_models import measure_reach, percent, reach_shares
from tests.tiny_models import tiny_bert


def _tiny_bert_and_batch(seed: int):
    pytest.importorskip("transformers")
    import torch

    model = tiny_bert(seed, dtype=torch.float64)
    generator = torch.Generator().manual_seed(seed)
    batch = {"input_ids": torch.randint(0, 30, (4, 6), generator=generator),
             "attention_mask": torch.ones(4, 6, dtype=torch.long),
             "labels": torch.randint(0, 3, (4,), generator=generator)}
    return model, [batch]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("options", [{"measure": "adaptive"},
                                     {"measure": "geodesic", "metric": "inv", "order": 2}])
def test_the_measurement_is_the_default_solver_and_its_first_chain_one_ascent(seed,
                                                                             options) -> None:
    import quotientsharp as qs

    model, batches = _tiny_bert_and_batch(seed)
    values = measure_reach(model, batches, {"m": options}, [0.3], n_iter=5,
                           reference={"n_iter": 20, "restarts": 1})["m"]["0.3"]
    # independent: the default solver and a single ascent, each run on its own
    default = qs.sharpness(model, batches, rho=0.3, n_iter=5, progress=False, **options)
    alone = qs.sharpness(model, batches, rho=0.3, n_iter=5, progress=False, reach=False,
                         **options)
    assert values["ascent"] == default.per_batch
    assert values["reach_estimate"] == default.reach
    assert values["local"] == [where["local"] for where in default.locality]
    assert values["evaluations"] == default.evaluations
    assert values["one_ascent"] == alone.per_batch
    assert values["ascent"][0] >= values["one_ascent"][0]
    # the strong solve: two runs of 20 steps, each trace entry one evaluation
    assert values["reference_evaluations"] == [2 * 21]


def test_shares_are_of_the_best_value_of_each_problem_and_flags_meet_shortfalls() -> None:
    values = {"m": {"0.1": {"ascent": [1.0, 2.0, 3.0, 0.0], "one_ascent": [1.0, 2.0, 1.5, 0.0],
                            "reference": [2.0, 1.0, 3.0, -1.0],
                            "reach_estimate": [0.5, 0.995, 0.9, 1.0],
                            "local": [True, True, False, True],
                            "evaluations": [10, 20, 30, 40],
                            "reference_evaluations": [100, 100, 100, 100]}},
              "r": {"0.1": {"refused": "too large"}}}
    shares = reach_shares(values)["m"]["0.1"]
    # best per problem: 2, 2, 3; the fourth found no increase and has no share
    assert shares["ascent"] == {"min": 50.0, "median": 100.0, "problems": 3}
    assert shares["one_ascent"] == {"min": 50.0, "median": 50.0, "problems": 3}
    assert shares["no_increase"] == 1
    # problem 0 is short and flagged by its estimate; problem 2 reaches, its estimate 0.9 is a
    # false alarm, and its ball is not local
    assert shares["flags"] == {"problems": 3, "short": 1, "short_flagged": 1,
                               "reaching_reach_flagged": 1, "not_local": 1}
    assert shares["evaluations"] == 25.0 and shares["reference_evaluations"] == 100.0
    assert reach_shares(values)["r"]["0.1"] == {"refused": "too large"}


def test_a_share_needs_a_finite_positive_best_and_a_problem() -> None:
    assert percent([1.0, 3.0], [2.0, 3.0]) == {"min": 50.0, "median": 75.0, "problems": 2}
    with pytest.raises(ValueError, match="finite, positive best"):
        percent([0.0], [0.0])
    with pytest.raises(ValueError, match="at least one problem"):
        percent([], [])


@pytest.mark.parametrize("where", ["ascent", "one_ascent", "reference"])
def test_a_value_that_is_not_finite_is_refused_not_dropped(where) -> None:
    entry = {"ascent": [1.0, 2.0], "one_ascent": [1.0, 2.0], "reference": [1.5, 2.0],
             "reach_estimate": [1.0, 1.0], "local": [True, True], "evaluations": [4, 4],
             "reference_evaluations": [40, 40]}
    entry[where] = [float("nan"), 2.0]
    with pytest.raises(ValueError, match="reach of m at rho=0.1: a value that is not finite"):
        reach_shares({"m": {"0.1": entry}})
