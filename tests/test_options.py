"""The options of ``quotientsharp.sharpness`` (``quotientsharp.engine.options``): a bad value
raises naming the option; the largest seed is accepted.
"""

from __future__ import annotations

import math

import pytest

from tests.test_functional import _adaptive, _batches, _measure, _mlp

#: these tests measure small MLPs without symmetry: the warning that says so is
#: expected here (tests/test_symmetry_check.py checks it)
pytestmark = pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")


@pytest.mark.parametrize("options, error, message", [
    ({"measure": "geodesic", "symmetries": 42}, TypeError, "symmetries must be .*got int 42"),
    ({"seed": 2 ** 70}, ValueError, r"seed must be an integer in \[0, 2\*\*64\)"),
    ({"seed": -1}, ValueError, "seed must be"),
    ({"seed": 1.5}, TypeError, "seed must be an integer"),
    ({"progress": "no"}, TypeError, "progress must be True or False"),
    ({"nonfinite": "ignore"}, ValueError, "nonfinite must be raise or skip"),
])
def test_bad_options_raise_naming_the_option(mlp_and_batches, options, error, message):
    net, batches = mlp_and_batches
    with pytest.raises(error, match=message):
        _adaptive(net, batches, **options)


def test_largest_seed_is_accepted(mlp_and_batches):
    net, batches = mlp_and_batches
    assert math.isfinite(_adaptive(net, batches[:1], seed=2 ** 64 - 1).value)


def test_an_integer_rho_beyond_float64_is_named():
    with pytest.raises(ValueError, match="rho must be a finite number > 0 that fits in a float64"):
        _measure(_mlp(), _batches(), rho=10 ** 400)
