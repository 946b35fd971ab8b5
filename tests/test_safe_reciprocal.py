"""``safe_reciprocal``: ``1 / c`` with ``0`` at ``c = 0``, for the adaptive metric's ``1 / |w|``.

Its fast form (no autograd: one tensor, written in place) and its differentiable form must give
the same bits, and both the value of the definition: over dtypes, magnitudes from 1e-30 to
1e30, subnormals, signed zeros, infinities and NaN.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quotientsharp.core.adaptive import safe_reciprocal

INTEGER_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16,
                torch.float32: torch.int32, torch.float64: torch.int64}


def _values(seed: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    spread = 10.0 ** torch.randint(-30, 31, (4000,), generator=gen)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-310,
                            -1e-310, 1.0, -1.0])
    values = torch.cat([torch.randn(4000, generator=gen, dtype=torch.float64) * spread, special])
    return values.to(dtype).reshape(-1, 1).expand(-1, 3).contiguous()


@pytest.mark.parametrize("dtype", list(INTEGER_VIEW))
@pytest.mark.parametrize("absolute", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_fast_and_the_differentiable_forms_give_the_same_bits(dtype, absolute,
                                                                   seed) -> None:
    c = _values(seed, dtype)
    fast = safe_reciprocal(c, absolute=absolute)
    leaf = c.clone().requires_grad_(True)
    with torch.enable_grad():
        differentiable = safe_reciprocal(leaf, absolute=absolute)
    assert differentiable.requires_grad and not fast.requires_grad
    view = INTEGER_VIEW[dtype]
    assert torch.equal(fast.view(view), differentiable.detach().view(view))
    assert torch.equal(c.view(view), _values(seed, dtype).view(view))  # the input is untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_value_is_the_definition(dtype) -> None:
    c = _values(2, dtype)
    reference = c.numpy().copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = np.where(reference == 0, 0.0, 1.0 / reference).astype(reference.dtype)
    got = safe_reciprocal(c).numpy()
    np.testing.assert_array_equal(got, expected)                  # NaN where c is NaN
    assert not np.signbit(got[reference == 0]).any()              # +0, also for c = -0


def test_the_differentiable_form_has_a_finite_gradient_at_zero() -> None:
    c = torch.tensor([0.0, 2.0, -0.5], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(safe_reciprocal(c, absolute=True).sum(), c)
    torch.testing.assert_close(grad, torch.tensor([0.0, -0.25, 4.0], dtype=torch.float64),
                               rtol=0, atol=0)
