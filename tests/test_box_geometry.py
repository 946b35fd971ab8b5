"""The L-infinity box's fused operations against their per-tensor definitions.

``BoxGeometry`` runs its point, clamp and sign direction as ``torch._foreach_*`` calls, so that
a step on a device is a few launches however many parameter tensors there are. These tests
hold each fused call to the per-tensor formula it replaces, bit for bit: over seeds and
dtypes, with zero scales (fixed coordinates), signed zeros, infinities and NaN, and with a
batch of problems broadcast against one point.
"""

from __future__ import annotations

import pytest
import torch

from quotientsharp.engine.ball import BoxGeometry
from tests.test_ball import _gl_ball
from tests.tuple_helpers import ComputingOperators, vanishing_off_rows

SHAPES = [(4, 3), (), (0, 2), (5,), (2, 2, 3)]
INTEGER_VIEW = {torch.float16: torch.int16, torch.float32: torch.int32,
                torch.float64: torch.int64}


def _same_bits(a, b) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype
        and torch.equal(x.contiguous().view(INTEGER_VIEW[x.dtype]),
                        y.contiguous().view(INTEGER_VIEW[y.dtype]))
        for x, y in zip(a, b, strict=True))


def _box(seed: int, dtype: torch.dtype, radius: float = 0.3):
    gen = torch.Generator().manual_seed(seed)
    base = tuple(torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in SHAPES)
    scale = tuple(w.abs() for w in base)
    for c in scale:
        if c.numel() > 1:
            c.view(-1)[0] = 0.0                # a fixed coordinate: its bound is 0
    return BoxGeometry(base, scale, radius), gen


def _special(seed: int, like, batch=()):
    """Tangent tuples with signed zeros, values beyond the bounds, infinities and NaN."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t in like:
        v = torch.randn((*batch, *t.shape), generator=gen, dtype=torch.float64).to(t.dtype)
        flat = v.view(-1)
        for i, value in enumerate([-0.0, 0.0, 5.0, -5.0, float("inf"), float("nan")]):
            if i < flat.numel():
                flat[i] = value
        out.append(v)
    return tuple(out)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("batch", [(), (3,)], ids=["one", "batched"])
def test_fused_box_operations_equal_the_per_tensor_formulas_bit_for_bit(dtype, seed,
                                                                         batch) -> None:
    box, _ = _box(seed, dtype)
    xi = _special(seed + 1, box.base, batch)
    bounds = tuple(box.radius * c for c in box.scale)
    clamped = tuple(torch.maximum(torch.minimum(d, b), -b)
                    for d, b in zip(xi, bounds, strict=True))
    assert _same_bits(box.project(xi), clamped)
    assert _same_bits(box.clip(xi), clamped)
    assert _same_bits(box.point(xi), tuple(w + d for w, d in zip(box.base, xi, strict=True)))
    assert _same_bits(box.direction(xi), tuple(c * torch.sign(e) for c, e in
                                               zip(box.scale, xi, strict=True)))
    # a fresh tuple is clamped in place: the same values, the caller's storage
    fresh = tuple(d.clone() for d in xi)
    clipped = box.clip(fresh, fresh=True)
    assert _same_bits(clipped, clamped)
    if not batch:
        assert all(a is b for a, b in zip(clipped, fresh, strict=True))
    # fixed coordinates stay where they are, and nothing leaves the box but NaN
    for d, b in zip(box.project(xi), bounds, strict=True):
        inside = d.isnan() | ((d <= b) & (d >= -b))
        assert bool(inside.all())


def test_project_and_a_clip_not_fresh_leave_their_input_alone() -> None:
    box, _ = _box(5, torch.float64)
    xi = _special(6, box.base)
    copies = tuple(d.clone() for d in xi)
    box.project(xi)
    box.clip(xi)
    assert _same_bits(xi, copies)


@pytest.mark.parametrize("method", ["point", "project", "direction"])
def test_a_tuple_of_another_length_is_refused_by_name(method) -> None:
    box, _ = _box(7, torch.float64)
    name = "egrad" if method == "direction" else "xi"
    with pytest.raises(ValueError, match=rf"^{name} has 4 tensors, the geometry 5$"):
        getattr(box, method)(box.zeros()[:4])


def _operators_of_one_step(count: int) -> int:
    gen = torch.Generator().manual_seed(count)
    base = tuple(torch.randn(3, generator=gen, dtype=torch.float64) for _ in range(count))
    box = BoxGeometry(base, tuple(w.abs() for w in base), 0.2)
    xi = box.random_start(gen)
    egrad = tuple(torch.randn(3, generator=gen, dtype=torch.float64) for _ in range(count))
    counter = ComputingOperators()
    with counter:
        direction = box.direction(egrad)
        moved = box.clip(tuple(torch._foreach_add(list(xi), list(direction), alpha=0.1)),
                         fresh=True)
        box.project(moved)
        box.point(moved)
    return counter.count


def test_operators_of_a_box_step_do_not_grow_with_the_number_of_tensors() -> None:
    few, many = _operators_of_one_step(5), _operators_of_one_step(60)
    assert few == many, (few, many)      # a per-tensor loop would add 55 x its operators


# ------------------------------------------------------------------------ touched rows
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_box_cut_to_rows_is_the_box_on_vectors_that_vanish_off_them(seed) -> None:
    box, gen = _box(seed, torch.float64)
    box.block_norms(box.zeros())                      # fills the 1/c cache before the cut
    rows = {0: torch.tensor([0, 2, 3]), 4: torch.tensor([1])}
    cut = box.on_rows(rows)

    def restrict(v):
        return tuple(t.index_select(0, rows[i]) if i in rows else t for i, t in enumerate(v))

    xi = vanishing_off_rows(_special(seed + 1, box.base), rows)
    egrad = vanishing_off_rows(tuple(torch.randn(t.shape, generator=gen, dtype=torch.float64)
                                     for t in box.base), rows)
    for full, part in ((box.project(xi), cut.project(restrict(xi))),
                       (box.point(xi), cut.point(restrict(xi))),
                       (box.direction(egrad), cut.direction(restrict(egrad)))):
        assert _same_bits(restrict(full), part)
    # the sign of a vanishing gradient vanishes: the ascent never leaves the rows
    assert _same_bits(box.direction(egrad), vanishing_off_rows(box.direction(egrad), rows))
    inside = vanishing_off_rows(box.random_start(gen), rows)
    assert torch.equal(cut.block_norms(restrict(inside))["total"],
                       box.block_norms(inside)["total"])
    # tensors off the cut are shared, not copied
    assert cut.base[1] is box.base[1] and cut._bounds[1] is box._bounds[1]
    assert cut.base[0].shape == (3, 3) and box.base[0].shape == (4, 3)


@pytest.mark.parametrize("slot", [-1, 5, 1])
def test_a_box_refuses_rows_of_a_missing_or_0_dim_slot(slot) -> None:
    box, _ = _box(0, torch.float64)              # slot 1 is the 0-dim tensor
    with pytest.raises(ValueError, match=rf"^on_rows: slot {slot} is not a tensor of rows"):
        box.on_rows({slot: torch.tensor([0])})


def test_the_box_clamps_signs_and_measures_in_scaled_units():
    from quotientsharp.engine.ball import BoxGeometry

    base = (torch.tensor([1.0, -2.0, 0.0]), torch.tensor([[3.0]]))
    scale = (base[0].abs(), torch.ones(1, 1))
    box = BoxGeometry(base, scale, 0.5)
    xi = (torch.tensor([2.0, -0.4, 5.0]), torch.tensor([[-0.7]]))
    expected = (torch.tensor([0.5, -0.4, 0.0]), torch.tensor([[-0.5]]))
    for got, want in zip(box.clip(xi), expected, strict=True):
        torch.testing.assert_close(got, want)
    for got, want in zip(box.point(xi), (base[0] + xi[0], base[1] + xi[1]), strict=True):
        torch.testing.assert_close(got, want)
    direction = box.direction((torch.tensor([-3.0, 2.0, 1.0]), torch.tensor([[-1e-9]])))
    torch.testing.assert_close(direction[0], torch.tensor([-1.0, 2.0, 0.0]))
    torch.testing.assert_close(direction[1], torch.tensor([[-1.0]]))
    # |xi / c| largest entry; a c = 0 coordinate counts 0 (it cannot move)
    torch.testing.assert_close(box.block_norms(xi)["total"], torch.tensor(2.0))
    generator = torch.Generator().manual_seed(1)
    draws = torch.stack([box.random_start(generator)[0] for _ in range(300)])
    assert bool((draws[:, 0].abs() <= 0.5).all()) and bool((draws[:, 1].abs() <= 1.0).all())
    assert not draws[:, 2].any()
    assert float(draws[:, 0].min()) < -0.4 and float(draws[:, 0].max()) > 0.4
    assert all(not z.any() and z.shape == b.shape for z, b in zip(box.zeros(), base,
                                                                  strict=True))
    with pytest.raises(ValueError, match="no coordinates to perturb"):
        BoxGeometry((), (), 0.5)


def test_random_starts_are_drawn_in_the_points_dtype():
    """A float64 point gets float64 radii and box offsets, not widened float32 draws."""
    from quotientsharp.engine.ball import BoxGeometry

    _, x, _, ball, _ = _gl_ball("mix", torch.float64, 33, 0.5)
    generator = torch.Generator().manual_seed(34)
    radii = torch.stack([ball.norm(ball.random_start(generator)) / 0.5 for _ in range(20)])
    assert float((radii - radii.float().double()).abs().max()) > 1e-12
    box = BoxGeometry(x, tuple(torch.ones_like(t) for t in x), 0.5)
    start = box.random_start(generator)
    assert all(s.dtype == torch.float64 for s in start)
    assert float(max((s - s.float().double()).abs().max() for s in start)) > 1e-12


def test_the_box_direction_of_a_zero_gradient_is_zero_and_its_clip_copies():
    from quotientsharp.engine.ball import BoxGeometry

    base = (torch.tensor([1.0, -2.0, 3.0]), torch.zeros(0))
    box = BoxGeometry(base, (base[0].abs(), torch.zeros(0)), 0.5)
    direction = box.direction((torch.tensor([0.0, -1.0, 2.0]), torch.zeros(0)))
    torch.testing.assert_close(direction[0], torch.tensor([0.0, -2.0, 3.0]))
    xi = (torch.tensor([2.0, 0.1, -9.0]), torch.zeros(0))
    kept = xi[0].clone()
    clipped = box.clip(xi)
    assert torch.equal(xi[0], kept)                  # the caller's vector is not clamped
    torch.testing.assert_close(clipped[0], torch.tensor([0.5, 0.1, -1.5]))
    # an empty block (a zero-size tensor) counts 0 in the largest scaled entry
    torch.testing.assert_close(box.block_norms(xi)["total"], torch.tensor(3.0))
