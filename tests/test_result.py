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
