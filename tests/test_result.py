"""The result of ``quotientsharp.sharpness`` (``quotientsharp.engine.result``): its summary
names the metric, the order and the norm.
"""

from __future__ import annotations

import pytest

import quotientsharp as qs

#: these tests measure small MLPs without symmetry: the warning that says so is
#: expected here (tests/test_symmetry_check.py checks it)
pytestmark = pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")


def test_summary_names_metric_and_order(mlp_and_batches):
    net, batches = mlp_and_batches
    result = qs.sharpness(net, batches, measure="geodesic", rho=0.1, metric="mix", order=1,
                          n_iter=2, progress=False)
    assert result.summary().startswith("geodesic sharpness (metric mix, order 1) ")
    box = qs.sharpness(net, batches, measure="worst_case", rho=0.01, p="inf", n_iter=2,
                       progress=False)
    assert "(p=inf)" in box.summary()


def _searched(reach: float) -> qs.SharpnessResult:
    """A result of one batch whose two chains agree to ``reach`` (the second over the best)."""
    return qs.SharpnessResult(measure="adaptive", value=1.0, per_batch=[1.0],
                              settings={"rho": 0.1}, perturbation_norms=[{"total": 0.1}],
                              reach=[reach], chains=[[1.0, reach]], chain_shortfalls=[[0.0, 0.0]],
                              evaluations=[8])


@pytest.mark.parametrize("reach, shown", [(0.99996, "0.999"), (0.98951, "0.989"),
                                          (0.29, "0.290"), (1.0, "1.000"), (0.0, "0.000")])
def test_a_reach_estimate_is_never_printed_higher_than_it_is(reach: float, shown: str) -> None:
    # a lower bound rounded up would claim more than was found: 0.99996 as "reach >= 1.000",
    # and 0.98951, which the warning flags as below 0.99, as "0.990"
    result = _searched(reach)
    assert result.summary().endswith(f"reach >= {shown})")
    notes = result.shortfalls()
    if reach < 0.99:
        (note,) = notes
        assert f"reach estimate {shown} " in note
        assert f"the second best reached {shown} of the best" in note
    else:
        assert notes == []
