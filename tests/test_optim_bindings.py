"""QuotientSGD accepts exactly the bindings sharpness() accepts (issue 40, item 6).

Both run :func:`quotientsharp.models.binding.validate_bindings` and the structure check, so a
binding one refuses the other refuses with the same message; and QuotientSGD steps what it
accepts correctly: the direction reaches the parameters through the differential of
``from_point``, so an affine map steps right.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import quotientsharp as qs
from quotientsharp.core.gl import GLQuotient
from quotientsharp.models import QuotientBinding, QuotientSGD
from tests.test_binding_contract import ReLUNeuron, WrongChristoffel, _binding, _mlp
from tests.tiny_models import Factored


def _data():
    x = torch.randn(16, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = torch.randn(16, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    return x, y


def _pair(name="product", shift=0.0):
    return QuotientBinding(GLQuotient("mix"), ["left", "right"],
                           to_point=lambda p: (p["left"] - shift, p["right"].T),
                           from_point=lambda point: {"left": point[0] + shift,
                                                     "right": point[1].T},
                           name=name)


def _refusals(model, bindings):
    """The messages of sharpness() and of QuotientSGD for the same bindings."""
    x, y = _data()
    messages = []
    with pytest.raises(ValueError) as info:
        qs.sharpness(model, [(x, y)], measure="geodesic", rho=0.01, n_iter=1, loss="mse",
                     symmetries=bindings, progress=False)
    messages.append(str(info.value))
    with pytest.raises(ValueError) as info:
        QuotientSGD(model, lr=0.1, symmetries=bindings)
    messages.append(str(info.value))
    return messages


@pytest.mark.parametrize("case", ["overlap", "unknown", "reserved", "round trip"])
def test_what_sharpness_refuses_quotient_sgd_refuses_with_the_same_message(case):
    model = Factored()
    if case == "overlap":
        bindings = [_pair("a"), _pair("b")]
        expected = "parameter 'left' is in two bindings ('a' and 'b')"
    elif case == "unknown":
        bindings = [QuotientBinding(GLQuotient("mix"), ["left", "nope"], name="a")]
        expected = "binding 'a' names 'nope', which is not a trainable parameter"
    elif case == "reserved":
        bindings = [_pair("other")]
        expected = "a binding may not be named 'other'"
    else:
        bindings = [QuotientBinding(GLQuotient("mix"), ["left", "right"],
                                    to_point=lambda p: (p["left"], p["right"].T),
                                    from_point=lambda x: {"left": 2 * x[0], "right": x[1].T},
                                    name="a")]
        expected = "from_point is not the inverse of to_point"
    sharpness_message, optimizer_message = _refusals(model, bindings)
    assert expected in sharpness_message
    assert optimizer_message == sharpness_message


def test_a_broken_user_quotient_is_refused_by_quotient_sgd_as_by_sharpness():
    with pytest.raises(qs.SymmetryCheckError, match="binding 'relu units'.*christoffel"):
        QuotientSGD(_mlp(), lr=0.1, symmetries=[_binding(WrongChristoffel())])


def test_an_affine_from_point_steps_along_the_riemannian_gradient():
    shift = 0.7
    model = Factored()
    optimizer = QuotientSGD(model, lr=0.1, symmetries=[_pair(shift=shift)])
    left, right = model.left.detach().clone(), model.right.detach().clone()
    x, y = _data()
    (model(x) - y).square().mean().backward()
    grad_left, grad_right = model.left.grad.clone(), model.right.grad.clone()
    optimizer.step()
    # the geometry at the point (left - shift, right^T); the parameters move by its gradient,
    # not by from_point of it (which would add the shift)
    point = (left - shift, right.T)
    rgrad = GLQuotient("mix").at(point).riemannian_gradient((grad_left, grad_right.T))
    torch.testing.assert_close(model.left.detach(), left - 0.1 * rgrad[0])
    torch.testing.assert_close(model.right.detach(), right - 0.1 * rgrad[1].T)


def test_any_quotient_sharpness_accepts_is_stepped():
    model = _mlp()
    optimizer = QuotientSGD(model, lr=0.05, symmetries=[_binding(ReLUNeuron())])
    x = torch.randn(32, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    y = torch.randint(0, 3, (32,), generator=torch.Generator().manual_seed(4))
    losses = []
    for _ in range(5):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
