"""The rotary quotient against rotary embeddings written here from their definitions.

Rotary position embeddings (Su et al. 2021) as HF's Llama and GPT-NeoX apply them
("rotate_half": ``x cos + rotate_half(x) sin`` with ``rotate_half(x) = (-x_2, x_1)`` on the two
halves of the rotated dims, frequencies ``base^{-2d/R}`` repeated over both halves) and as GPT-J
applies them ("interleaved": rotations of consecutive pairs). An element of the package's
centraliser applied as ``(G A^{-1}, H A^T)`` must leave every query/key score unchanged, while a
generic GL(h) element must not; with no rotary dims the subgroup is all of GL(h) and the
subgroup projection must equal GLQuotient's closed form.
"""

from __future__ import annotations

import pytest
import torch

import quotientsharp as qs


def _angles(positions: torch.Tensor, rotary_dims: int, base: float = 10000.0) -> torch.Tensor:
    frequencies = base ** (-torch.arange(0, rotary_dims, 2, dtype=torch.float64) / rotary_dims)
    return positions[:, None].double() * frequencies[None, :]       # [tokens, R/2]


def rope(x: torch.Tensor, positions: torch.Tensor, rotary_dims: int, layout: str) -> torch.Tensor:
    """Rotary embedding of ``x``, ``shape=[tokens, h]``; dims ``>= rotary_dims`` pass through."""
    rotated, rest = x[:, :rotary_dims], x[:, rotary_dims:]
    angles = _angles(positions, rotary_dims)
    if layout == "rotate_half":
        cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
        first, second = rotated.chunk(2, dim=-1)
        rotated = rotated * cos + torch.cat([-second, first], -1) * sin
    else:
        cos, sin = angles.cos(), angles.sin()
        even, odd = rotated[:, 0::2], rotated[:, 1::2]
        rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], -1).flatten(1)
    return torch.cat([rotated, rest], -1)


def _scores(G: torch.Tensor, H: torch.Tensor, rotary_dims: int, layout: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randn(7, G.shape[0], generator=gen, dtype=torch.float64)
    keys = torch.randn(7, H.shape[0], generator=gen, dtype=torch.float64)
    positions = torch.arange(7)
    q = rope(tokens @ G, positions, rotary_dims, layout)
    k = rope(keys @ H, positions + 3, rotary_dims, layout)
    return q @ k.T


@pytest.mark.parametrize(("head_dim", "rotary_dims", "layout"),
                         [(8, 8, "rotate_half"), (8, 4, "rotate_half"), (6, 6, "interleaved"),
                          (6, 2, "interleaved")])
@pytest.mark.parametrize("seed", [0, 1])
def test_centraliser_elements_keep_every_rotary_score(head_dim, rotary_dims, layout,
                                                      seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    G = torch.randn(head_dim + 3, head_dim, generator=gen, dtype=torch.float64)
    H = torch.randn(head_dim + 2, head_dim, generator=gen, dtype=torch.float64)
    quotient = qs.RotaryQuotient("mix", head_dim=head_dim, rotary_dims=rotary_dims,
                                 layout=layout)
    A = quotient.random_group_element((G, H), condition=1e3, generator=gen)
    assert float(torch.linalg.cond(A)) == pytest.approx(1e3, rel=1e-6)
    moved = quotient.act((G, H), A)
    before, after = _scores(G, H, rotary_dims, layout), _scores(*moved, rotary_dims, layout)
    assert float((after - before).abs().max() / before.abs().max()) < 1e-10
    # a generic GL(h) element changes the scores: the symmetry really is smaller
    generic = qs.GLQuotient("mix").random_group_element((G, H), condition=10.0, generator=gen)
    changed = _scores(*qs.GLQuotient("mix").act((G, H), generic), rotary_dims, layout)
    assert float((changed - before).abs().max() / before.abs().max()) > 1e-3


@pytest.mark.parametrize("metric", ["inv", "mix", "euclidean"])
@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_no_rotary_dims_is_the_full_gl_quotient(metric, eps) -> None:
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 6, 3, generator=gen, dtype=torch.float64),
         torch.randn(2, 5, 3, generator=gen, dtype=torch.float64))
    u = tuple(torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in x)
    full = qs.GLQuotient(metric, eps)
    subgroup = qs.RotaryQuotient(metric, eps, head_dim=3, rotary_dims=0)
    for a, b in zip(subgroup.horizontal_projection(x, u), full.horizontal_projection(x, u),
                    strict=True):
        assert float((a - b).abs().max() / b.abs().max()) < 1e-10
    assert torch.allclose(subgroup.horizontality_error(x, u), full.horizontality_error(x, u),
                          rtol=1e-9)


def test_rotary_vertical_space_is_smaller_than_gl() -> None:
    """A GL-horizontal vector is rotary-horizontal; not conversely (fewer constraints)."""
    gen = torch.Generator().manual_seed(4)
    x = (torch.randn(9, 4, generator=gen, dtype=torch.float64),
         torch.randn(7, 4, generator=gen, dtype=torch.float64))
    u = tuple(torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in x)
    gl, rotary = qs.GLQuotient("inv"), qs.RotaryQuotient("inv", head_dim=4)
    gl_horizontal = gl.horizontal_projection(x, u)
    assert float(rotary.horizontality_error(x, gl_horizontal)) < 1e-12
    rotary_horizontal = rotary.horizontal_projection(x, u)
    assert float(gl.horizontality_error(x, rotary_horizontal)) > 1e-3
    assert rotary.group_name == "GL(1,C)^2"
    assert qs.RotaryQuotient("mix", head_dim=8, rotary_dims=6).group_name == "GL(1,C)^3 x GL(2)"


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="rotary_dims"):
        qs.RotaryQuotient(head_dim=4, rotary_dims=3)
    with pytest.raises(ValueError, match="layout"):
        qs.RotaryQuotient(head_dim=4, layout="neox")
    with pytest.raises(ValueError, match="head_dim=4"):
        qs.RotaryQuotient(head_dim=4).at((torch.randn(6, 3), torch.randn(5, 3)))


# ---------------------------------------------------------------------------- contract details
@pytest.mark.parametrize("layout", ["rotate_half", "interleaved"])
@pytest.mark.parametrize("rotary_dims", [4, 2, 0])
def test_the_algebra_basis_is_frobenius_orthonormal(layout, rotary_dims):
    from quotientsharp.core.gl.subgroup import rotary_algebra_basis

    basis = rotary_algebra_basis(4, rotary_dims, layout)
    assert basis.dtype == torch.float64
    gram = torch.einsum("kij,lij->kl", basis, basis)
    assert torch.allclose(gram, torch.eye(basis.shape[0], dtype=torch.float64), rtol=0, atol=1e-15)
    assert rotary_algebra_basis(4, rotary_dims, layout, dtype=torch.float32).dtype == torch.float32


def test_a_wrong_head_dimension_names_the_point_and_both_dimensions():
    q = qs.RotaryQuotient("mix", head_dim=4)
    x = (torch.randn(7, 6, dtype=torch.float64), torch.randn(5, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^layer3 has head dimension 6, this rotary quotient "
                                         r"was built for head_dim=4"):
        q.frozen_point(x, "layer3")


def test_a_singular_point_is_named_in_its_error():
    q = qs.RotaryQuotient("inv", head_dim=4)
    G = torch.randn(7, 4, dtype=torch.float64)
    G[:, 3] = G[:, 2]                                    # rank 3 < 4
    with pytest.raises(ValueError, match="layer3"):
        q.frozen_point((G, torch.randn(5, 4, dtype=torch.float64)), "layer3")


def test_vertical_refuses_a_wrong_algebra_element_naming_both_sizes():
    q = qs.RotaryQuotient("mix", head_dim=6, rotary_dims=4)      # 2 planes x 2 + 2 x 2 = 8
    gen = torch.Generator().manual_seed(0)
    x = q.random_point((), generator=gen, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"algebra dimension 8, got \(2, 5\)"):
        q.vertical(x, torch.zeros(2, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"algebra dimension 8, got \[0\.0\]"):
        q.vertical(x, [0.0])


def test_random_point_draws_from_its_generator_only_and_keeps_point_shapes():
    q = qs.RotaryQuotient("mix", head_dim=4, n=9, m=5)
    state = torch.get_rng_state()
    one = q.random_point((2,), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert torch.equal(torch.get_rng_state(), state)
    two = q.random_point((2,), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))
    assert [tuple(c.shape) for c in one] == [(2, 9, 4), (2, 5, 4)]


def test_the_subgroup_point_type_is_made_once_per_metric():
    # the classes are cached by metric; emptied here so that the construction itself runs
    from quotientsharp.core.gl import subgroup
    from quotientsharp.core.gl.inv import InvPoint
    from quotientsharp.core.gl.mix import MixPoint

    saved = dict(subgroup._POINT_TYPES)
    subgroup._POINT_TYPES.clear()
    try:
        made = subgroup.subgroup_point_type(MixPoint)
        assert made.__name__ == "SubgroupMixPoint"
        assert made.__bases__ == (subgroup.SubgroupPoint, MixPoint)
        assert subgroup.subgroup_point_type(MixPoint) is made
        assert subgroup.subgroup_point_type(InvPoint) is not made
    finally:
        subgroup._POINT_TYPES.clear()
        subgroup._POINT_TYPES.update(saved)


def test_head_dimension_errors_name_the_point_for_batched_points_too():
    q = qs.RotaryQuotient("mix", head_dim=4)
    x = (torch.randn(2, 7, 6, dtype=torch.float64), torch.randn(2, 5, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^layer3 has head dimension 6, this rotary"):
        q.frozen_point(x, "layer3")
    mixed = (torch.randn(7, 4, dtype=torch.float64), torch.randn(5, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match="layer3"):
        q.frozen_point(mixed, "layer3")


def test_constructor_errors_say_what_is_wrong():
    with pytest.raises(ValueError, match=r"head_dim must be >= 1, got 0"):
        qs.RotaryQuotient("mix", head_dim=0)
    with pytest.raises(ValueError, match=r"pass both n and m or neither, got n=9, m=None"):
        qs.RotaryQuotient("mix", head_dim=4, n=9)
