"""The contract of ``random_group_element`` for the GL(h) quotient and its rotary subgroup.

The invariance tests draw their group elements here, so a wrong draw would weaken them
silently: an element of the wrong conditioning, outside the subgroup, not reproducible, or
drawn from the global random state. Each property is checked against its definition (singular
values, the block structure of the centraliser, the distribution of the phases), never against
a second call of the code under test.
"""

from __future__ import annotations

import math

import pytest
import torch

import quotientsharp as qs
from quotientsharp.core.gl.subgroup import rotary_planes

#: name -> (factory, factor shapes): GL(3), a rotary subgroup with a non-rotary block, and
#: one with every dimension rotary (interleaved)
QUOTIENTS = {
    "gl": (lambda: qs.GLQuotient("mix"), ((7, 3), (5, 3))),
    "rotary-partial": (lambda: qs.RotaryQuotient("mix", head_dim=6, rotary_dims=4),
                       ((7, 6), (5, 6))),
    "rotary-interleaved": (lambda: qs.RotaryQuotient("inv", head_dim=4, layout="interleaved"),
                           ((7, 4), (5, 4))),
}


def _point(name, batch_g=(), batch_h=(), dtype=torch.float64):
    factory, (shape_g, shape_h) = QUOTIENTS[name]
    gen = torch.Generator().manual_seed(0)
    return factory(), (torch.randn(*batch_g, *shape_g, generator=gen, dtype=dtype),
                       torch.randn(*batch_h, *shape_h, generator=gen, dtype=dtype))


def _draw(q, x, seed, **options):
    return q.random_group_element(x, generator=torch.Generator().manual_seed(seed), **options)


@pytest.mark.parametrize("name", sorted(QUOTIENTS))
@pytest.mark.parametrize("options", [{}, {"kind": "svd"}, {"condition": 30.0}],
                         ids=["exp", "svd", "condition"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shape_dtype_and_reproducibility(name, options, dtype):
    q, x = _point(name, (2, 1), (1, 3), dtype)
    h = x[0].shape[-1]
    state = torch.get_rng_state()
    g = _draw(q, x, 5, **options)
    assert torch.equal(torch.get_rng_state(), state)      # only the given generator is drawn
    assert g.shape == (2, 3, h, h) and g.dtype == dtype
    assert torch.equal(g, _draw(q, x, 5, **options))
    assert not torch.equal(g, _draw(q, x, 6, **options))
    # every batch element is drawn on its own
    flat = g.reshape(-1, h, h)
    assert not any(torch.equal(flat[0], flat[k]) for k in range(1, flat.shape[0]))
    assert bool((torch.linalg.svdvals(g.double()).amin(-1) > 0).all())


@pytest.mark.parametrize("name", sorted(QUOTIENTS))
# 10.3 is not a float32 number: a condition rounded to float32 on the way is off by 2e-8
@pytest.mark.parametrize("condition", [1.0, 1.5, 10.3, 1e3])
@pytest.mark.parametrize("scale", [1.0, 0.3])
def test_condition_number_and_scale_are_exact(name, condition, scale):
    q, x = _point(name, (4,), (4,))
    g = _draw(q, x, 1, condition=condition, scale=scale)
    values = torch.linalg.svdvals(g)
    assert torch.allclose(values[..., 0] / values[..., -1],
                          torch.full((4,), condition, dtype=torch.float64), rtol=1e-10)
    if name == "gl":
        # the geometric mean of the singular values is the scale
        assert torch.allclose(values.log().mean(-1).exp(),
                              torch.full((4,), scale, dtype=torch.float64), rtol=1e-10)
    assert float(values.amax()) <= scale * math.sqrt(condition) * (1 + 1e-10)
    assert float(values.amin()) >= scale / math.sqrt(condition) * (1 - 1e-10)


@pytest.mark.parametrize("name", sorted(QUOTIENTS))
def test_svd_without_condition_is_a_scaled_orthogonal_matrix(name):
    q, x = _point(name, (3,), (3,))
    g = _draw(q, x, 2, kind="svd", scale=0.7)
    eye = torch.eye(g.shape[-1], dtype=g.dtype).expand_as(g)
    assert torch.allclose(g @ g.mT, 0.49 * eye, rtol=0, atol=1e-12)


@pytest.mark.parametrize("h", [1, 2, 3])
def test_svd_elements_have_either_determinant_sign(h):
    # U and V are Haar-distributed on O(h), so det(U V^T) = +-1 with probability 1/2 each: the
    # fraction of negative determinants over 4000 draws is within 5 standard errors of 1/2. A QR
    # factor without its sign fix has a fixed determinant (-1)^(h-1), so det(U V^T) = 1 always
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(4000, 5, h, generator=gen, dtype=torch.float64),
         torch.randn(4000, 4, h, generator=gen, dtype=torch.float64))
    g = _draw(qs.GLQuotient("mix"), x, 4, condition=10.0)
    negative = float((torch.linalg.det(g) < 0).double().mean())
    assert abs(negative - 0.5) <= 5 * math.sqrt(0.25 / 4000), negative


@pytest.mark.parametrize("name", sorted(QUOTIENTS))
@pytest.mark.parametrize("bad", [0.5, 0.999, float("inf"), float("nan")])
def test_a_condition_below_one_or_not_finite_is_refused(name, bad):
    q, x = _point(name)
    with pytest.raises(ValueError, match="condition"):
        _draw(q, x, 0, condition=bad)


@pytest.mark.parametrize("name", sorted(QUOTIENTS))
def test_an_unknown_kind_is_refused_and_the_known_ones_accepted(name):
    q, x = _point(name)
    with pytest.raises(ValueError, match="kind"):
        _draw(q, x, 0, kind="qr")
    for kind in ("exp", "svd"):
        assert _draw(q, x, 0, kind=kind).shape[-1] == x[0].shape[-1]


@pytest.mark.parametrize("name", sorted(QUOTIENTS))
def test_exp_at_scale_zero_is_the_identity(name):
    q, x = _point(name, (2,), (2,))
    g = _draw(q, x, 0, scale=0.0)
    assert torch.equal(g, torch.eye(g.shape[-1], dtype=g.dtype).expand_as(g))


# ---------------------------------------------------------------------------- rotary subgroup
def _rotary_structure(q, g):
    """The blocks of ``g`` on the rotary planes and the non-rotary block; asserts that ``g``
    has the centraliser's structure (a complex scalar per plane, nothing between blocks)."""
    planes = rotary_planes(q.head_dim, q.rotary_dims, q.layout)
    mask = torch.zeros(q.head_dim, q.head_dim, dtype=torch.bool)
    blocks = []
    for i, j in planes:
        a, b = g[..., i, i], g[..., j, i]
        assert torch.allclose(g[..., j, j], a, rtol=0, atol=1e-12)
        assert torch.allclose(g[..., i, j], -b, rtol=0, atol=1e-12)
        blocks.append((a, b))
        mask[[i, i, j, j], [i, j, i, j]] = True
    rest = [d for d in range(q.head_dim) if all(d not in p for p in planes)]
    for d in rest:
        mask[d, rest] = True
    off_blocks = g[..., ~mask]
    assert off_blocks.numel() == 0 or float(off_blocks.abs().max()) == 0.0
    return blocks


@pytest.mark.parametrize("name", ["rotary-partial", "rotary-interleaved"])
@pytest.mark.parametrize("options", [{}, {"condition": 20.0}], ids=["exp", "condition"])
def test_rotary_elements_are_in_the_centraliser_of_the_rotations(name, options):
    q, x = _point(name, (5,), (5,))
    g = _draw(q, x, 3, **options)
    _rotary_structure(q, g)
    # and so they commute with every rotation of the planes by angles of their own
    planes = rotary_planes(q.head_dim, q.rotary_dims, q.layout)
    rotation = torch.eye(q.head_dim, dtype=torch.float64)
    for k, (i, j) in enumerate(planes):
        angle = 0.3 + 0.7 * k
        rotation[i, i] = rotation[j, j] = math.cos(angle)
        rotation[j, i], rotation[i, j] = math.sin(angle), -math.sin(angle)
    assert torch.allclose(g @ rotation, rotation @ g, rtol=0, atol=1e-12)


def test_rotary_phases_are_uniform_on_the_circle():
    # the complex scalar of each plane has a uniform phase: its mean cosine and sine vanish
    # (a phase on a shorter or longer arc would not), within five standard errors
    q, x = _point("rotary-interleaved", (4000,), (4000,))
    blocks = _rotary_structure(q, _draw(q, x, 4, condition=10.0))
    for a, b in blocks:
        phase = torch.atan2(b, a)
        bound = 5 / math.sqrt(2 * phase.numel())
        assert abs(float(phase.cos().mean())) < bound
        assert abs(float(phase.sin().mean())) < bound


@pytest.mark.parametrize("rotary_dims", [2, 0], ids=["one-plane", "one-free-dimension"])
def test_a_single_block_has_the_scale_as_its_singular_values(rotary_dims):
    # one block (one plane, or one dimension outside the planes): no spread to make, so
    # every singular value is the scale, 1 by default, whatever the condition asked for
    q = qs.RotaryQuotient("mix", head_dim=2 if rotary_dims else 1, rotary_dims=rotary_dims)
    h = q.head_dim
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 7, h, generator=gen, dtype=torch.float64),
         torch.randn(3, 5, h, generator=gen, dtype=torch.float64))
    for options, expected in (({"condition": 5.0}, 1.0), ({"condition": 5.0, "scale": 0.3}, 0.3),
                              ({"kind": "svd"}, 1.0)):
        values = torch.linalg.svdvals(_draw(q, x, 1, **options))
        assert torch.allclose(values, torch.full_like(values, expected), rtol=1e-12), options


def test_the_default_scale_of_a_conditioned_element_is_one():
    q, x = _point("gl", (5,), (5,))
    values = torch.linalg.svdvals(_draw(q, x, 2, condition=7.0))
    assert torch.allclose(values.log().mean(-1).exp(), torch.ones(5, dtype=torch.float64),
                          rtol=1e-12)


def test_the_block_outside_the_planes_is_drawn_per_batch_element():
    q, x = _point("rotary-partial", (3,), (3,))
    rest = _draw(q, x, 5, condition=4.0)[..., q.rotary_dims:, q.rotary_dims:]
    assert not torch.allclose(rest[0], rest[1]) and not torch.allclose(rest[1], rest[2])
