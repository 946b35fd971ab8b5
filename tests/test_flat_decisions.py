"""The device decisions over flat buffers (:class:`~quotientsharp.engine.solver.FlatTuple`).

On a device every decision of the ascent is a ``torch.where``; one per tensor was a kernel
launch per parameter tensor, four or five times per iteration. For one problem the best pair
now lives in a few flat buffers and each decision runs over a buffer at once. These tests hold
that shortcut to the per-tensor ``where`` it replaces: the same bits (NaN and infinity on the side
not chosen, signed zeros, half precision, mixed dtypes, empty and 0-dim tensors), the same
ownership (the best pair written in place, a pick a new tuple), a bounded temporary, and a
number of operators that does not grow with the number of tensors.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes

from quotientsharp.engine import AscentSettings, ascend, build_geometry
from quotientsharp.engine.coordinates import other_factor
from quotientsharp.engine.solver import (
    ON_DEVICE,
    FlatTuple,
    choose,
    choose_into,
    flat_spans,
    span_limit,
)
from tests.tuple_helpers import ComputingOperators

SHAPES = [(3, 4), (), (0, 5), (7,), (2, 3, 2), (1,), (6, 1)]
INTEGER_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16,
                torch.float32: torch.int32, torch.float64: torch.int64}


def _tuple(seed: int, dtypes, shapes=SHAPES, poison: bool = False):
    gen = torch.Generator().manual_seed(seed)
    tensors = []
    for i, shape in enumerate(shapes):
        t = torch.randn(shape, generator=gen, dtype=torch.float64)
        if t.numel() > 1:
            t.view(-1)[0] = -0.0                  # a signed zero: where keeps its sign
        if poison and t.numel() > 2:
            t.view(-1)[1] = float("nan")
            t.view(-1)[2] = float("inf") if i % 2 else -float("inf")
        tensors.append(t.to(dtypes[i % len(dtypes)]))
    return tuple(tensors)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(INTEGER_VIEW[t.dtype])


def _same_bits(a, b) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(_bits(x), _bits(y))
        for x, y in zip(a, b, strict=True))


DTYPES = {"float64": [torch.float64], "float32": [torch.float32], "half": [torch.float16],
          "mixed": [torch.float32, torch.float64, torch.float16, torch.bfloat16]}


@pytest.mark.parametrize("dtypes", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("chosen", [True, False])
def test_flat_decisions_equal_the_per_tensor_where_bit_for_bit(dtypes, seed, chosen) -> None:
    flag = torch.tensor(chosen)
    # the side not chosen holds NaN and infinities: an arithmetic select (b + f (a - b))
    # would carry them over, where does not
    new = _tuple(seed, dtypes, poison=not chosen)
    other = _tuple(seed + 10, dtypes, poison=chosen)
    best = ON_DEVICE.own(other)
    reference = tuple(t.clone() for t in other)
    choose_into(flag, new, reference)
    assert _same_bits(ON_DEVICE.keep(flag, new, best), reference)
    assert _same_bits(ON_DEVICE.pick(flag, new, other), choose(flag, new, other))
    assert _same_bits(ON_DEVICE.pick(flag, ON_DEVICE.own(new), other), choose(flag, new, other))


def test_own_is_a_copy_in_flat_buffers() -> None:
    tensors = _tuple(3, DTYPES["mixed"])
    owned = ON_DEVICE.own(tensors)
    assert isinstance(owned, FlatTuple) and _same_bits(owned, tensors)
    assert all(t.is_contiguous() for t in owned)
    storages = {t.untyped_storage().data_ptr() for t in tensors if t.numel()}
    assert not storages & {t.untyped_storage().data_ptr() for t in owned if t.numel()}
    # one buffer per span, each tensor a view of its span's buffer
    assert len(owned.buffers) == len(owned.spans)
    for (start, stop), buffer in zip(owned.spans, owned.buffers, strict=True):
        assert buffer.dim() == 1 and buffer.numel() == sum(t.numel() for t in owned[start:stop])
        assert all(t.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
                   for t in owned[start:stop])
    assert ON_DEVICE.own(()) == ()


def test_keep_writes_into_the_best_pairs_buffers_and_pick_makes_a_new_tuple() -> None:
    flag = torch.tensor(True)
    new, other = _tuple(4, [torch.float64]), _tuple(5, [torch.float64])
    best = ON_DEVICE.own(other)
    pointers = [b.data_ptr() for b in best.buffers]
    kept = ON_DEVICE.keep(flag, new, best)
    assert kept is best and [b.data_ptr() for b in kept.buffers] == pointers
    assert _same_bits(kept, new)
    picked = ON_DEVICE.pick(torch.tensor(False), best, other)
    assert _same_bits(picked, other)
    inputs = {t.untyped_storage().data_ptr() for t in (*best, *other) if t.numel()}
    assert not inputs & {t.untyped_storage().data_ptr() for t in picked if t.numel()}
    picked[0].add_(1.0)                               # the result is the caller's to write
    assert _same_bits(best, new) and _same_bits(other, _tuple(5, [torch.float64]))


@pytest.mark.parametrize("seed", range(6))
def test_spans_cover_the_tuple_in_order_each_of_one_dtype_within_the_limit(seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    count = int(torch.randint(1, 40, (), generator=gen))
    sizes = torch.randint(0, 50, (count,), generator=gen).tolist()
    kinds = torch.randint(0, 3, (count,), generator=gen).tolist()
    dtypes = [(torch.float32, torch.float64, torch.float16)[k] for k in kinds]
    tensors = tuple(torch.zeros(s, dtype=d) for s, d in zip(sizes, dtypes, strict=True))
    spans, limit = flat_spans(tensors), span_limit(tensors)
    assert limit >= max(sizes) and limit >= sum(sizes) / 8
    assert spans[0][0] == 0 and spans[-1][1] == count
    for (_, stop), (following, _) in zip(spans, spans[1:], strict=False):
        assert stop == following
    for start, stop in spans:
        assert start < stop
        assert len({t.dtype for t in tensors[start:stop]}) == 1
        assert sum(sizes[start:stop]) <= limit
    # maximal: a span ends only where the next tensor has another dtype or would not fit
    for (start, stop), _ in zip(spans, spans[1:], strict=False):
        assert (tensors[stop].dtype != tensors[start].dtype
                or sum(sizes[start:stop + 1]) > limit)


@pytest.mark.parametrize("count", [10, 200])
def test_a_decision_dispatches_per_span_not_per_tensor(count) -> None:
    # a span holds up to an eighth of the tuple and two neighbouring spans more than that
    # (else they would be one), so there are at most 17 spans however many tensors
    size = 4000 // count
    gen = torch.Generator().manual_seed(count)
    new = tuple(torch.randn(size, generator=gen) for _ in range(count))
    best = ON_DEVICE.own(tuple(torch.randn(size, generator=gen) for _ in range(count)))
    spans = len(best.spans)
    assert spans <= 17
    flag = torch.tensor(True)
    keep, pick = ComputingOperators(), ComputingOperators()
    with keep:
        ON_DEVICE.keep(flag, new, best)
    with pick:
        ON_DEVICE.pick(flag, best, new)
    assert keep.count == 2 * spans        # a cat of the new span, a where into its buffer
    assert pick.count == 2 * spans        # a cat of b (the result), a where into it
    # the temporary of keep is one span of new, never the whole tuple
    assert keep.largest <= span_limit(new) < count * size


def test_batched_flags_decide_per_tensor_into_the_owned_views() -> None:
    gen = torch.Generator().manual_seed(7)
    flag = torch.tensor([True, False, True])
    new = tuple(torch.randn(3, *s, generator=gen) for s in [(2,), (), (4, 2)])
    other = tuple(torch.randn(3, *s, generator=gen) for s in [(2,), (), (4, 2)])
    best = ON_DEVICE.own(other)
    reference = tuple(t.clone() for t in other)
    choose_into(flag, new, reference)
    kept = ON_DEVICE.keep(flag, new, best)
    assert kept is best and _same_bits(kept, reference)
    assert _same_bits(ON_DEVICE.pick(flag, new, other), choose(flag, new, other))


# ------------------------------------------------------------------------ whole ascents
def _many_tensor_ball(count: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    base = tuple(torch.randn(3, 2, generator=gen, dtype=torch.float64) + 2.0
                 for _ in range(count))
    return build_geometry([other_factor(base, "adaptive", "line")], radius=0.3), gen


def _objective(target, failing=()):
    calls = []

    def objective(xi):
        calls.append(None)
        with _disable_current_modes():          # the objective is not the solver's
            return evaluate(xi)

    def evaluate(xi):
        leaves = tuple(t.detach().requires_grad_(True) for t in xi)
        with torch.enable_grad():
            loss = sum(((a * b).sum().sin() - 0.2 * (a * a).sum()) for a, b in
                       zip(leaves, target, strict=True))
            grads = torch.autograd.grad(loss, leaves)
        if len(calls) in failing:        # an overflowed evaluation: NaN loss and gradient
            return (torch.full_like(loss, float("nan")),
                    tuple(torch.full_like(g, float("nan")) for g in grads))
        return loss.detach(), grads

    return objective


@pytest.mark.parametrize("restarts", [0, 1])
def test_a_failing_ascent_on_the_device_equals_the_host_one_bit_for_bit(restarts) -> None:
    geometry, gen = _many_tensor_ball(12)
    target = tuple(torch.randn(3, 2, generator=gen, dtype=torch.float64) for _ in range(12))
    settings = AscentSettings(n_iter=14, restarts=restarts)
    runs = []
    for host in (True, False):
        objective = _objective(target, failing={3, 4, 9})
        runs.append(ascend(geometry, objective, settings, torch.Generator().manual_seed(2),
                           skip_nonfinite=True, host_decisions=host))
    host, device = runs
    assert torch.isfinite(device.loss) and device.nonfinite_count == host.nonfinite_count > 0
    assert torch.equal(host.loss, device.loss) and torch.equal(host.trace, device.trace)
    assert _same_bits(host.xi, device.xi)


def _operators_per_iteration(count: int) -> float:
    geometry, gen = _many_tensor_ball(count)
    target = tuple(torch.randn(3, 2, generator=gen, dtype=torch.float64)
                   for _ in range(count))
    counts = []
    for n_iter in (4, 8):
        recorder = ComputingOperators()
        with recorder:
            ascend(geometry, _objective(target), AscentSettings(n_iter=n_iter),
                   skip_nonfinite=True, host_decisions=False)
        counts.append(recorder.count)
    return (counts[1] - counts[0]) / 4


def test_the_device_decisions_per_iteration_do_not_grow_with_the_number_of_tensors(
        monkeypatch) -> None:
    # the CUDA path: the adaptive norm's fused form (the CPU's goes tensor by tensor)
    from quotientsharp.core.adaptive import AdaptivePoint

    monkeypatch.setattr(AdaptivePoint, "scratch_norm_devices", frozenset())
    few, many = _operators_per_iteration(6), _operators_per_iteration(60)
    # a decision is two operators per span, and spans are at most 17 (a where per tensor for
    # the best pair and a failed step's pick would add 4 x 54 operators per iteration)
    assert many - few <= 4 * 17, (few, many)


class _ScaledLinear(torch.nn.Module):
    """A model with a 0-dim parameter (a learned temperature, as CLIP's logit scale)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.scale = torch.nn.Parameter(torch.tensor(1.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale


@pytest.mark.parametrize("restarts", [0, 1])
def test_a_zero_dim_parameter_takes_the_device_path(restarts, monkeypatch) -> None:
    # a 0-dim flag lifted to a 0-dim tensor once raised a raw TypeError on the device path
    # (every CUDA run); the restarts' per-run choice is decided per tensor
    import quotientsharp as qs

    torch.manual_seed(0)
    model = _ScaledLinear().double()
    batches = [(torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 3, (6,)))]
    import quotientsharp.engine.measures as measures_module

    def measured() -> float:
        return qs.sharpness(model, batches, measure="adaptive", rho=0.05, n_iter=5,
                            restarts=restarts, random_init=bool(restarts),
                            progress=False).value

    on_host = measured()
    for name in ("ascend", "search"):       # the path a CUDA run takes, on the CPU
        solve = getattr(measures_module, name)
        monkeypatch.setattr(measures_module, name, lambda *a, _solve=solve, **k: _solve(
            *a, **{**k, "host_decisions": False}))
    assert on_host == measured() > 0
