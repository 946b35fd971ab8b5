"""The product quotient's own bookkeeping, against its factors run one by one.

The contract tests (``tests/test_quotient_contract.py``) hold a product to the same autograd
references as every quotient. What they cannot see is the product's plumbing: how it cuts a
flat point, algebra element or group element into its factors' pieces and glues the results
back, what its defaults are, and what it says when an argument is wrong. Each test here
computes the answer by calling the factors themselves, in a loop the test writes out, and
compares with the product's answer. The products have three factors of different algebra
sizes, a folded factor and a rotary factor (whose group elements are ``h x h`` matrices while
its algebra has fewer coordinates), so that an offset, a shape or a dimension mixed up in the
product changes a value.
"""

from __future__ import annotations

import pytest
import torch

import quotientsharp as qs
from tests.test_quotient_contract import _tutorial_quotient

DTYPE = torch.float64


def _three_factors() -> tuple[qs.ProductQuotient, tuple[tuple[int, ...], ...]]:
    """Diagonal (3 rescalings), rotary GL over 2 folded heads, GL inv: the algebra sizes are
    3, 2 x (rotary coordinates) and 4, the group sizes 3, 2 x 16 and 4."""
    product = qs.ProductQuotient([qs.DiagonalQuotient("inv", d=3),
                                  qs.RotaryQuotient("mix", head_dim=4),
                                  qs.GLQuotient("inv")],
                                 folded=[0, 1, 0], names=["diagonal", "heads", "heads"])
    shapes = ((3,), (3,), (2, 6, 4), (2, 5, 4), (5, 2), (4, 2))
    return product, shapes


def _point(product, shapes, batch=(), seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = product.random_point(batch, shapes=shapes, generator=gen, dtype=DTYPE)
    u = tuple(torch.randn(t.shape, generator=gen, dtype=DTYPE) for t in x)
    return x, u


def _parts(product, tensors):
    """The flat tuple cut into the factors' tuples, by the factors' own tensor counts."""
    parts, start = [], 0
    for q in product.factors:
        size = len(q.point_ndims)
        parts.append(tuple(tensors[start:start + size]))
        start += size
    assert start == len(tensors)
    return parts


def _pieces(product, x, flat, group):
    """A flat algebra or group element cut into the factors' own elements, by the factors' own
    shapes (over the folded dimensions)."""
    pieces, start = [], 0
    for q, part, f in zip(product.factors, _parts(product, x), product.folded, strict=True):
        own = tuple(q.group_shape(part) if group else q.algebra_shape(part))
        fold = tuple(part[0].shape[part[0].dim() - q.point_ndims[0] - f:
                                    part[0].dim() - q.point_ndims[0]])
        size = int(torch.Size(fold).numel() * torch.Size(own).numel())
        pieces.append(flat[..., start:start + size].reshape(*flat.shape[:-1], *fold, *own))
        start += size
    assert start == flat.shape[-1]
    return pieces


def _glue(pieces, batch):
    return torch.cat([p.reshape(*batch, -1) for p in pieces], dim=-1)


def _equal(a, b):
    assert len(a) == len(b)
    for s, t in zip(a, b, strict=True):
        assert s.shape == t.shape
        assert torch.equal(s, t)


# ---------------------------------------------------------------------------- construction
def test_the_constructor_names_what_is_wrong() -> None:
    gl, diagonal = qs.GLQuotient("inv"), qs.DiagonalQuotient("inv", d=3)
    with pytest.raises(TypeError, match="factors must be a non-empty sequence of "
                                        "SymmetryQuotient"):
        qs.ProductQuotient([])
    with pytest.raises(TypeError, match="factors must be a non-empty sequence of "
                                        "SymmetryQuotient"):
        qs.ProductQuotient([gl, "diagonal"])          # type: ignore[list-item]
    with pytest.raises(ValueError, match="folded and names need one entry per factor"):
        qs.ProductQuotient([gl, diagonal], folded=[1])
    with pytest.raises(ValueError, match="folded and names need one entry per factor"):
        qs.ProductQuotient([gl, diagonal], names=["a", "b", "c"])
    with pytest.raises(ValueError, match=r"folded must hold integers >= 0, got \[0, -1\]"):
        qs.ProductQuotient([gl, diagonal], folded=[0, -1])


def test_name_invariance_and_fresh_gradients_follow_the_factors() -> None:
    gl, diagonal = qs.GLQuotient("inv"), qs.DiagonalQuotient("inv", d=3)
    product = qs.ProductQuotient([gl, diagonal])
    assert product.name == f"{gl.name} x {diagonal.name}"
    assert product.names == [gl.name, diagonal.name]
    assert product.invariant is True
    assert qs.ProductQuotient([gl, qs.DiagonalQuotient("euclidean", d=3)]).invariant is False
    # a user's quotient without an ``invariant`` attribute is taken as invariant
    user = _tutorial_quotient()(point_shapes=[(4,), (3,)])
    assert not hasattr(user, "invariant")
    assert qs.ProductQuotient([user, gl]).invariant is True
    assert qs.ProductQuotient([user, qs.GLQuotient("mix", eps=0.3)]).invariant is False

    x = product.random_point(shapes=((5, 2), (4, 2), (3,), (3,)), dtype=DTYPE,
                             generator=torch.Generator().manual_seed(0))
    assert product.frozen_point(x).new_gradients is True
    # the user's generic frozen point does not promise fresh gradients, so neither does a
    # product holding it
    mixed = qs.ProductQuotient([user, gl])
    y = mixed.random_point(shapes=((4,), (3,), (5, 2), (4, 2)), dtype=DTYPE,
                           generator=torch.Generator().manual_seed(0))
    assert mixed.frozen_point(y).new_gradients is False


def test_a_point_of_the_wrong_length_or_a_bad_factor_is_named() -> None:
    product, shapes = _three_factors()
    x, _ = _point(product, shapes)
    with pytest.raises(ValueError, match="a point of the product has 6 tensors, got 5"):
        product.split(x[:5])
    with pytest.raises(ValueError, match="a point of the product has 6 tensors, got 5"):
        product.frozen_point(x[:5])
    # a factor's own check names the point, the factor's index and its name
    bad = list(x)
    bad[5] = bad[5][:, :1]                     # H of the GL factor with 1 column, G with 2
    with pytest.raises(ValueError, match=r"^x \(factor 2, gl-inv\)"):
        product.check_point(tuple(bad))
    with pytest.raises(ValueError, match=r"^theta \(factor 2, gl-inv\)"):
        product.check_point(tuple(bad), "theta")
    # the product's own check (a tuple of tensors) names the point too
    with pytest.raises(TypeError, match=r"^x\[5\] must be a torch.Tensor"):
        product.check_point((*x[:5], "not a tensor"))
    with pytest.raises(TypeError, match=r"^theta\[5\] must be a torch.Tensor"):
        product.check_point((*x[:5], "not a tensor"), "theta")


# ---------------------------------------------------------------------------- the metric
@pytest.mark.parametrize("scale", [1e-3, 1.0, 30.0])
def test_named_norms_sum_the_factors_of_one_name(scale) -> None:
    product, shapes = _three_factors()
    x, u = _point(product, shapes, batch=(2,))
    u = tuple(scale * t for t in u)
    norms = product.frozen_point(x).named_norms(u)
    assert sorted(norms) == ["diagonal", "heads", "total"]
    squares = []
    for q, part, tangent, f in zip(product.factors, _parts(product, x), _parts(product, u),
                                   product.folded, strict=True):
        square = q.norm(part, tangent).square()
        squares.append(square.sum(-1) if f else square)
    torch.testing.assert_close(norms["diagonal"], squares[0].sqrt(), rtol=1e-12, atol=0)
    torch.testing.assert_close(norms["heads"], (squares[1] + squares[2]).sqrt(), rtol=1e-12,
                               atol=0)
    torch.testing.assert_close(norms["total"], sum(squares).sqrt(), rtol=1e-12, atol=0)
    torch.testing.assert_close(product.norm(x, u), norms["total"], rtol=1e-12, atol=0)


# ---------------------------------------------------------------------------- geodesics
def _factorwise_geodesic(product, x, u, t, orders, steps):
    return tuple(p for q, part, tangent, order in zip(product.factors, _parts(product, x),
                                                      _parts(product, u), orders, strict=True)
                 for p in q.frozen_point(part).geodesic(tangent, t, order, steps))


def test_the_geodesic_defaults_are_unit_time_and_second_order() -> None:
    product, shapes = _three_factors()
    x, u = _point(product, shapes)
    u = tuple(0.2 * t for t in u)
    _equal(product.frozen_point(x).geodesic(u),
           _factorwise_geodesic(product, x, u, 1.0, [2, 2, 2], 64))


def test_the_exact_geodesic_passes_time_and_steps_to_every_factor() -> None:
    product, shapes = _three_factors()
    x, u = _point(product, shapes)
    u = tuple(0.2 * t for t in u)
    point = product.frozen_point(x)
    three = _factorwise_geodesic(product, x, u, 0.5, ["exact"] * 3, 3)
    _equal(point.geodesic(u, 0.5, "exact", 3), three)
    _equal(point.geodesic_exact(u, 0.5, 3), three)
    # the default is 64 steps to t = 1, and the number of steps matters (RK4 for mix)
    default = _factorwise_geodesic(product, x, u, 1.0, ["exact"] * 3, 64)
    _equal(point.geodesic_exact(u), default)
    _equal(point.geodesic(u, order="exact"), default)
    assert not torch.equal(default[2], _factorwise_geodesic(product, x, u, 1.0,
                                                            ["exact"] * 3, 65)[2])
    # one order per factor
    _equal(point.geodesic(u, 0.7, [1, "exact", 2], 5),
           _factorwise_geodesic(product, x, u, 0.7, [1, "exact", 2], 5))


def test_orders_per_factor_are_checked_by_geodesic_and_check_ball() -> None:
    product = qs.ProductQuotient([qs.GLQuotient("inv"), qs.DiagonalQuotient("mix", d=3)])
    x = product.random_point(shapes=((5, 2), (4, 2), (3,), (3,)), dtype=DTYPE,
                             generator=torch.Generator().manual_seed(0))
    point = product.frozen_point(x)
    u = tuple(torch.zeros_like(t) for t in x)
    for wrong in ([2], [2, 2, 2]):
        message = rf"order needs one entry per factor \(2\), got {len(wrong)}"
        with pytest.raises(ValueError, match=message):
            point.geodesic(u, order=wrong)
        with pytest.raises(ValueError, match=message):
            point.check_ball(1.0, wrong)
    for invalid in (3, "EXACT", [2, 3]):
        with pytest.raises(ValueError, match="order must be 1, 2 or 'exact'"):
            point.check_ball(1.0, invalid)
    # the diagonal mix factor refuses an exact path over a large ball; the GL factor does not
    point.check_ball(1e6, 2)
    point.check_ball(1e6, ["exact", 2])
    with pytest.raises(ValueError, match="order='exact' with the mix metric"):
        point.check_ball(1e6, "exact")
    with pytest.raises(ValueError, match="order='exact' with the mix metric"):
        point.check_ball(1e6, [2, "exact"])


# ---------------------------------------------------------------------------- the group
@pytest.mark.parametrize("batch", [(), (2,), (2, 3)], ids=str)
def test_algebra_and_group_elements_are_cut_and_glued_factor_by_factor(batch) -> None:
    product, shapes = _three_factors()
    x, u = _point(product, shapes, batch=batch)
    gen = torch.Generator().manual_seed(1)
    parts = _parts(product, x)
    sizes = []
    for q, part, f in zip(product.factors, parts, product.folded, strict=True):
        folded = part[0].shape[len(batch):len(batch) + f].numel()
        sizes.append((folded * torch.Size(q.algebra_shape(part)).numel(),
                      folded * torch.Size(q.group_shape(part)).numel()))
    assert product.algebra_shape(x) == (sum(a for a, _ in sizes),)
    assert product.group_shape(x) == (sum(g for _, g in sizes),)
    assert product.algebra_shape(x) != product.group_shape(x)      # the rotary factor

    a = torch.randn(*batch, *product.algebra_shape(x), generator=gen, dtype=DTYPE)
    a_pieces = _pieces(product, x, a, group=False)
    _equal(product.vertical(x, a),
           tuple(t for q, part, piece in zip(product.factors, parts, a_pieces, strict=True)
                 for t in q.vertical(part, piece)))

    g = product.group_exp_at(x, a)
    assert g.shape == (*batch, *product.group_shape(x))
    _equal((g,), (_glue([q.group_exp_at(part, piece) for q, part, piece
                         in zip(product.factors, parts, a_pieces, strict=True)], batch),))

    g_pieces = _pieces(product, x, g, group=True)
    _equal(product.act(x, g),
           tuple(t for q, part, piece in zip(product.factors, parts, g_pieces, strict=True)
                 for t in q.act(part, piece)))
    _equal(product.act_tangent(x, u, g),
           tuple(t for q, part, tangent, piece in zip(product.factors, parts,
                                                      _parts(product, u), g_pieces, strict=True)
                 for t in q.act_tangent(part, tangent, piece)))


@pytest.mark.parametrize("batch", [(), (2,)], ids=str)
def test_random_group_elements_are_each_factors_own_draw(batch) -> None:
    product, shapes = _three_factors()
    x, _ = _point(product, shapes, batch=batch)
    parts = _parts(product, x)

    def factorwise(seed, **scale):
        gen = torch.Generator().manual_seed(seed)
        return _glue([q.random_group_element(part, generator=gen, **scale)
                      for q, part in zip(product.factors, parts, strict=True)], batch)

    for scale in (0.1, 3.0):
        drawn = product.random_group_element(x, scale=scale,
                                             generator=torch.Generator().manual_seed(4))
        _equal((drawn,), (factorwise(4, scale=scale),))
    default = product.random_group_element(x, generator=torch.Generator().manual_seed(4))
    _equal((default,), (factorwise(4, scale=1.0),))
    assert not torch.equal(default, factorwise(4, scale=3.0))


def test_random_points_are_each_factors_own_draw_on_the_asked_device() -> None:
    product, shapes = _three_factors()
    drawn = product.random_point((2,), shapes=shapes, dtype=DTYPE,
                                 generator=torch.Generator().manual_seed(5))
    assert tuple(t.shape for t in drawn) == tuple((2, *s) for s in shapes)
    gen = torch.Generator().manual_seed(5)
    own, start = [], 0
    for q, f in zip(product.factors, product.folded, strict=True):
        mine = shapes[start:start + len(q.point_ndims)]
        start += len(q.point_ndims)
        own.extend(q.random_point((2, *mine[0][:f]), shapes=[s[f:] for s in mine],
                                  generator=gen, dtype=DTYPE))
    _equal(drawn, tuple(own))
    # the shapes given win over the quotient's own, and the device is the one asked for
    product.point_shapes = tuple((7, *s[1:]) if len(s) == 1 else s for s in shapes)
    assert product.random_point(shapes=shapes)[0].shape == (3,)
    assert product.random_point()[0].shape == (7,)
    on_meta = product.random_point(shapes=shapes, device="meta")
    assert all(t.device.type == "meta" for t in on_meta)


def test_group_exp_without_a_point_says_to_pass_the_point() -> None:
    product, shapes = _three_factors()
    x, _ = _point(product, shapes)
    a = torch.zeros(*product.algebra_shape(x), dtype=DTYPE)
    with pytest.raises(NotImplementedError, match=r"depends on the point: call "
                                                  r"group_exp_at\(x, a\)"):
        product.group_exp(a)
    # with the point, exp(0) is the identity of every factor: it moves nothing
    for moved, original in zip(product.act(x, product.group_exp_at(x, a)), x, strict=True):
        torch.testing.assert_close(moved, original, rtol=1e-14, atol=1e-14)
