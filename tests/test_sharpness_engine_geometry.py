"""End to end: the engine's perturbations are horizontal, in every case where that can fail.

For a loss invariant under the group the raised gradient is horizontal already (its metric
product with a vertical vector is the loss's derivative along the orbit, zero), whatever the
metric. The projection in the ascent's direction step shows only when the loss is *not*
invariant. The model below adds a symmetry-breaking penalty to its logits, so an engine that
skipped the projection would return perturbations with a vertical component. Measured with
``eps > 0`` (metrics invariant only under the orthogonal group) and with the Euclidean metric
on attention pairs, at order 1 so that the displacement is ``xi`` itself.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from quotientsharp import GLQuotient, sharpness
from quotientsharp.models import ParameterLayout, SymmetryCheckError, find_symmetries


class BrokenSymmetryAttention(nn.Module):
    """Self-attention whose logits also depend on ``|W_in|^2``: not GL(h)-invariant."""

    def __init__(self, width: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.head = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed, _ = self.attention(x, x, x, need_weights=False)
        weight = self.attention.in_proj_weight
        penalty = weight.square().sum() + weight.pow(3).sum()
        # a different shift per class: cross-entropy ignores a shift common to all logits
        classes = torch.arange(3, dtype=mixed.dtype, device=mixed.device)
        return self.head(mixed.mean(1)) + 0.5 * penalty * classes


def _batches():
    gen = torch.Generator().manual_seed(3)
    return [(torch.randn(6, 5, 8, generator=gen, dtype=torch.float64),
             torch.randint(0, 3, (6,), generator=gen))]


@pytest.mark.parametrize(("metric", "eps"), [("euclidean", 0.0), ("inv", 0.3), ("mix", 0.3),
                                             ("inv", 0.0)])
def test_perturbations_are_horizontal_when_the_loss_breaks_the_symmetry(metric, eps) -> None:
    torch.manual_seed(0)
    model = BrokenSymmetryAttention().double()
    # the run-time check refuses such a model; measured anyway on request
    with pytest.raises(SymmetryCheckError, match="the qk pairs of attention"):
        sharpness(model, _batches(), measure="geodesic", metric=metric, eps=eps, order=1,
                  rho=0.2, n_iter=6, progress=False)
    result = sharpness(model, _batches(), measure="geodesic", metric=metric, eps=eps, order=1,
                       rho=0.2, n_iter=6, keep_perturbations=True, progress=False,
                       check_symmetry=False)
    assert result.value > 0
    params = {n: p.detach() for n, p in model.named_parameters()}
    layout = ParameterLayout(find_symmetries(model), params)
    base = layout.to_coordinates(params)
    moved = layout.to_coordinates(result.perturbations[0])     # order 1: the displacement is xi
    quotient = GLQuotient(metric, eps)
    for point, xi in zip(base.gl, moved.gl, strict=True):
        assert float(xi[0].abs().max()) > 0
        error = quotient.horizontality_error(tuple(point), tuple(xi))
        assert float(error.max()) < 1e-8, (metric, eps, error)


def test_the_symmetry_breaking_gradient_is_not_horizontal() -> None:
    """The premise of the test above: here the raised gradient has a vertical part."""
    torch.manual_seed(0)
    model = BrokenSymmetryAttention().double()
    x, y = _batches()[0]
    params = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    loss = nn.functional.cross_entropy(torch.func.functional_call(model, params, (x,)), y)
    grads = dict(zip(params, torch.autograd.grad(loss, list(params.values())), strict=True))
    layout = ParameterLayout(find_symmetries(model), params)
    base = layout.to_coordinates({n: p.detach() for n, p in params.items()})
    egrad = layout.to_coordinates(grads)
    quotient = GLQuotient("euclidean")
    errors = [float(quotient.horizontality_error(tuple(p), tuple(g)).max())
              for p, g in zip(base.gl, egrad.gl, strict=True)]
    assert max(errors) > 1e-3
