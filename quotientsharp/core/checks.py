"""Assertable checks of a quotient's geometry: numbers and a pass flag, never plots.

Each check compares one operation with an independent reference (the generic autograd default
of :mod:`quotientsharp.core.reference`, finite differences, an ODE integration) or measures a
property (idempotence, invariance, Taylor slopes). ``check_all`` runs them all::

    >>> results = check_all(DiagonalQuotient("mix"))
    >>> all(r.passed for r in results)
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

import torch

from quotientsharp.core import _tuples as T
from quotientsharp.core import reference
from quotientsharp.core.method_checks import (
    DegeneratePointError,
    QuotientMethodError,
    builtin_quotient,
    check_group_element_moves,
    check_group_identity,
    diagnose,
)
from quotientsharp.core.quotient import ClosedFormQuotient, SymmetryQuotient, declares_invariant
from quotientsharp.core.validation import check_count

Tensors = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one check.

    Attributes
    ----------
    name
        What was checked.
    error
        The measured quantity: a relative error, or a slope for Taylor and order checks.
    tolerance
        The bound the error was held to (for slopes: the expected slope).
    passed
        Whether the check passed. A ``no_override`` check passes: it found nothing wrong,
        though it tested nothing either.
    detail
        Free text: what was compared with what.
    no_override
        ``True`` when the class does not override the operation, so the check compared the
        generic default with itself (its error is 0 by construction). :func:`format_results`
        marks such a row "no override" rather than "pass".
    """

    name: str
    error: float
    tolerance: float
    passed: bool
    detail: str = ""
    no_override: bool = False

    @property
    def status(self) -> str:
        """``"pass"``, ``"FAIL"`` or ``"no override"`` (a default compared with itself)."""
        if not self.passed:
            return "FAIL"
        return "no override" if self.no_override else "pass"


def relative_error(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """``max |a - b| / max(|a|, |b|)`` over all components (0 when both are exactly zero)."""
    diff = max(float((p - r).abs().max()) for p, r in zip(a, b, strict=True))
    size = max(max(float(p.abs().max()), float(r.abs().max())) for p, r in zip(a, b, strict=True))
    if diff == 0.0:
        return 0.0
    return diff / max(size, 1e-300)


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-10 if dtype == torch.float64 else 1e-4


def _overrides(quotient: SymmetryQuotient, method: str) -> bool:
    return getattr(type(quotient), method) is not getattr(SymmetryQuotient, method)


def _no_override(quotient: SymmetryQuotient, method: str) -> bool:
    """Whether a check of ``method`` against its reference compares the default with itself."""
    return not (isinstance(quotient, ClosedFormQuotient) or _overrides(quotient, method))


#: appended to the detail of a check that compared the generic default with itself
_NO_OVERRIDE_NOTE = " (no override: the generic default against itself)"


def _random_tangent_raw(x: Tensors, ndims: Sequence[int], gen: torch.Generator) -> Tensors:
    batch = T.batch_shape(x, ndims)
    return tuple(torch.randn(*batch, *c.shape[c.dim() - k:], generator=gen, dtype=c.dtype,
                             device=gen.device).to(c.device)
                 for c, k in zip(x, ndims, strict=True))


def _random_algebra(q: SymmetryQuotient, x: Tensors, gen: torch.Generator) -> torch.Tensor:
    """A Gaussian algebra element at ``x``, drawn on the generator's device."""
    return torch.randn(*T.batch_shape(x, q.point_ndims), *q.algebra_shape(x), generator=gen,
                       dtype=x[0].dtype, device=gen.device).to(x[0].device)


def _to(device: torch.device, values: Sequence[torch.Tensor]) -> Tensors:
    return tuple(t.to(device) for t in values)


def _test_function(x: Tensors, gen: torch.Generator) -> Callable[[Tensors], torch.Tensor]:
    """A smooth non-quadratic scalar function of a point, summed over the batch."""
    weights, shifts = ([torch.randn(c.shape, generator=gen, dtype=c.dtype, device=gen.device)
                        .to(c.device) for c in x] for _ in range(2))

    def f(y: Tensors) -> torch.Tensor:
        # sum() of tensors over a non-empty point is a tensor (mypy allows the empty sum's 0)
        linear = cast(torch.Tensor, sum((w * c).sum() for w, c in zip(weights, y, strict=True)))
        wave = cast(torch.Tensor, sum(torch.sin(0.5 * c + s).sum()
                                      for c, s in zip(y, shifts, strict=True)))
        return wave + 0.1 * linear * linear
    return f


def _slope_result(name: str, ts: torch.Tensor, errors: torch.Tensor, expected: float,
                  detail: str, floor: float) -> CheckResult:
    errors = errors.to(ts.device)
    if float(errors.max()) <= floor:
        return CheckResult(name, math.inf, expected, True, detail + " (error at rounding: exact)")
    keep = errors > floor
    if int(keep.sum()) < 3:
        return CheckResult(name, math.nan, expected, False, detail + " (too few points above "
                           "rounding to fit a slope)")
    slope = reference.taylor_slope(ts[keep], errors[keep])
    return CheckResult(name, slope, expected, abs(slope - expected) <= 0.25, detail)


def _within_domain(q: SymmetryQuotient, x: Tensors, h: Tensors) -> Tensors:
    """Shrink ``h`` until the geodesics the checks integrate stay inside the manifold (a unit
    vector is long where the metric is small, e.g. mix near ``u * v = 0``)."""
    nd = q.point_ndims
    for _ in range(30):
        try:
            v = T.scale(0.3, h, nd)
            ends = (q.geodesic(x, v, order="exact", steps=8),
                    reference.geodesic_ode(x, v, 1.0, nd, q.christoffel, steps=16))
            if all(bool(torch.isfinite(c).all()) for end in ends for c in end):
                return h
        except ValueError:
            pass
        h = T.scale(0.5, h, nd)
    raise ValueError("could not find a velocity whose geodesic stays inside the manifold")


def _vertical_check(q: SymmetryQuotient, x: Tensors, a: torch.Tensor) -> tuple[str, float, str]:
    """``vertical(x, a)`` against the velocity of ``act(x, exp(s a))`` at ``s = 0``."""
    s0 = torch.zeros((), dtype=x[0].dtype, device=x[0].device)
    _, orbit_velocity = reference.jvp_pair(lambda s: q.act(x, q.group_exp_at(x, s * a)), (s0,),
                                           (torch.ones_like(s0),))
    return ("vertical_is_orbit_velocity", relative_error(q.vertical(x, a), orbit_velocity),
            "vertical(x, a) = d/ds act(x, exp(s a)) at s = 0")


def _action_check(q: SymmetryQuotient, x: Tensors, a: torch.Tensor) -> tuple[str, float, str]:
    """``act`` is an action along the one-parameter subgroup of ``a`` (``exp(0)`` fixes ``x``,
    two half steps make one), which ``vertical_is_orbit_velocity`` sees at first order only;
    a one-parameter subgroup needs ``group_exp`` only, no group product."""
    half = q.group_exp_at(x, 0.5 * a)
    twice = q.act(q.act(x, half), half)
    once = q.act(x, q.group_exp_at(x, a))
    fixed = q.act(x, q.group_exp_at(x, torch.zeros_like(a)))
    return ("act_is_action", max(relative_error(twice, once), relative_error(fixed, x)),
            "act(act(x, exp(a/2)), exp(a/2)) = act(x, exp(a)), and act(x, exp(0)) = x")


def _involutive_check(q: SymmetryQuotient, x: Tensors, a: torch.Tensor, seed: int
                      ) -> tuple[str, float, str]:
    """The Lie bracket of the vertical fields of ``a`` and of a second algebra element ``b`` (drawn
    from ``seed + 1``, so the caller's stream is untouched) is vertical at ``x``.

    The fundamental fields of a group action close under the bracket,
    ``[V_a, V_b] = V_{+-[a, b]}``; ``act_is_action`` tests one-parameter subgroups only, which
    a map acting on two factors by two different orders of the group's product passes (both
    halves agree along each subgroup). The bracket ``DV_b[V_a] - DV_a[V_b]`` is a jvp of
    ``vertical`` in its point; its distance from the span of the vertical basis is a Euclidean
    least-squares residual (by the pseudo-inverse; no metric: the check holds for ``vertical``
    and nothing else), relative to the larger of the bracket's two terms.
    """
    detail = "[V_a, V_b] = DV_b[V_a] - DV_a[V_b] lies in the span of the vertical vectors"
    if torch.Size(q.algebra_shape(x)).numel() == 0:
        return ("vertical_is_involutive", 0.0, detail + " (a trivial group: no vertical field)")
    gen = torch.Generator().manual_seed(seed + 1)
    b = _random_algebra(q, x, gen)
    va, vb = q.vertical(x, a), q.vertical(x, b)
    _, along_a = reference.jvp_pair(lambda y: q.vertical(y, b), (x,), (va,))
    _, along_b = reference.jvp_pair(lambda y: q.vertical(y, a), (x,), (vb,))
    nd = q.point_ndims
    batch = T.batch_shape(x, nd)

    def flat(parts: Sequence[torch.Tensor]) -> torch.Tensor:
        return T.flatten(parts, nd, batch)                                  # [*batch, N]

    bracket = flat(T.sub(along_a, along_b))
    span = torch.stack([flat(v) for v in zip(*reference.vertical_basis(q, x), strict=True)],
                       -1)                                                  # [*batch, N, K]
    # the pseudo-inverse (an SVD): lstsq's default CPU driver (gelsy) rounds differently with
    # the number of threads, and a check's error should not depend on them
    coefficients = torch.linalg.pinv(span) @ bracket.unsqueeze(-1)
    residual = (bracket - (span @ coefficients).squeeze(-1)).norm(dim=-1)
    scale = torch.maximum(flat(along_a).norm(dim=-1), flat(along_b).norm(dim=-1))
    error = residual / scale.clamp_min(torch.finfo(scale.dtype).tiny)
    return ("vertical_is_involutive", float(error.max()) if error.numel() else 0.0, detail)


def _killing_check(q: SymmetryQuotient, x: Tensors, u: Tensors, w: Tensors,
                   a: torch.Tensor) -> tuple[str, float, str]:
    """The metric's invariance along the group's fields, from ``inner`` and ``vertical`` alone
    (no group element, so no ``group_exp``): Killing's equation
    ``D<u, w>_x[V_a] + <DV_a[u], w>_x + <u, DV_a[w]>_x = 0``, the derivative of
    ``<g.u, g.w>_{g.x}`` along ``exp(s a)``, relative to the largest of its three terms."""
    _, moved = reference.jvp_pair(lambda y: q.inner(y, u, w), (x,), (q.vertical(x, a),))
    _, du = reference.jvp_pair(lambda y: q.vertical(y, a), (x,), (u,))
    _, dw = reference.jvp_pair(lambda y: q.vertical(y, a), (x,), (w,))
    terms = torch.stack([moved, q.inner(x, du, w), q.inner(x, u, dw)])
    # at least ||u|| ||w|| |a|, the size of each term at a generic unit (metric_invariance's
    # scale, times the field's): a unit where all three nearly vanish would read its rounding
    # as a relative error of order one
    size = (q.norm(x, u) * q.norm(x, w)
            * a.flatten(a.dim() - len(q.algebra_shape(x))).norm(dim=-1))
    scale = torch.maximum(terms.abs().amax(0), size).clamp_min(torch.finfo(terms.dtype).tiny)
    error = terms.sum(0).abs() / scale
    return ("metric_is_killing", float(error.max()) if error.numel() else 0.0,
            "D<u, w>_x[V_a] + <DV_a u, w>_x + <u, DV_a w>_x = 0 (the metric's invariance along "
            "the group's fields)")


def _symmetry_check(q: SymmetryQuotient, x: Tensors, u: Tensors, w: Tensors
                    ) -> tuple[str, float, str]:
    """``<u, w>_x = <w, u>_x``."""
    return ("inner_symmetric", relative_error((q.inner(x, u, w),), (q.inner(x, w, u),)),
            "<u, w>_x = <w, u>_x")


def _act_tangent_check(q: SymmetryQuotient, x: Tensors, u: Tensors, g: torch.Tensor
                       ) -> tuple[str, float, str]:
    """An overriding ``act_tangent`` against the jvp of ``act``."""
    _, pushed = reference.jvp_pair(lambda y: q.act(y, g), (x,), (u,))
    return ("act_tangent_vs_jvp", relative_error(q.act_tangent(x, u, g), pushed),
            "closed-form pushforward against the jvp of act")


def _invariance_check(q: SymmetryQuotient, x: Tensors, u: Tensors, w: Tensors,
                      g: torch.Tensor) -> tuple[str, float, str]:
    """``<g.u, g.w>_{g.x} = <u, w>_x``, relative to ``||u|| ||w||``."""
    gx = q.act(x, g)
    lhs = q.inner(gx, q.act_tangent(x, u, g), q.act_tangent(x, w, g))
    rhs = q.inner(x, u, w)
    scale = (q.norm(x, u) * q.norm(x, w)).clamp_min(1e-300)
    return ("metric_invariance", float(((lhs - rhs).abs() / scale).max()),
            "<g.u, g.w>_{g.x} = <u, w>_x for a random group element")


@dataclass
class _CheckRun:
    """The point, the random vectors and the results shared by the checks of :func:`check_all`;
    every draw comes from ``gen`` (CPU) in check order, so :data:`_CHECK_GROUPS` keeps its order."""

    q: SymmetryQuotient
    nd: tuple[int, ...]     # q.point_ndims
    x: Tensors
    on_host: Tensors        # x on the generator's device (the CPU), to draw at
    gen: torch.Generator
    seed: int
    tol: float
    u: Tensors
    w: Tensors
    results: list[CheckResult] = field(default_factory=list)

    def add(self, name: str, err: float, detail: str, bound: float | None = None,
            default_of: str | None = None) -> None:
        """Record a check: passed when ``err <= bound`` (default: the dtype's tolerance).

        ``default_of`` names the method whose override the check tests against its reference.
        """
        bound = self.tol if bound is None else bound
        same = default_of is not None and _no_override(self.q, default_of)
        self.results.append(CheckResult(name, err, bound, bool(err <= bound),
                                        detail + (_NO_OVERRIDE_NOTE if same else ""), same))


def _projection_checks(run: _CheckRun) -> None:
    """The horizontal and vertical projections against the reference and each other."""
    q, x, u = run.q, run.x, run.u
    hu = q.horizontal_projection(x, u)
    vu = q.vertical_projection(x, u)
    run.add("horizontal_projection_vs_reference", relative_error(
        hu, reference.horizontal_projection(q, x, u)),
        "closed form against the normal equations over the vertical basis",
        default_of="horizontal_projection")
    run.add("projection_idempotent", relative_error(q.horizontal_projection(x, hu), hu),
            "P(P u) = P u")
    run.add("projections_sum_to_identity", relative_error(T.add(hu, vu), u), "P_h u + P_v u = u")
    cross = (q.inner(x, hu, vu).abs() / q.inner(x, u, u)).max()
    run.add("projections_metric_orthogonal", float(cross), "<P_h u, P_v u> / <u, u>")
    run.add("projection_horizontal", float(reference.horizontality_error(q, x, hu).max()),
            "reference horizontality error of P_h u")
    run.add("horizontality_error_vs_reference",
            abs(float((q.horizontality_error(x, u) - reference.horizontality_error(q, x, u))
                      .abs().max())), "this class's horizontality measure against the reference's",
            bound=max(run.tol, 1e-8))
    run.add("norm_vs_inner", _norm_error(q, x, u), "||u||_x against sqrt(<u, u>_x)",
            default_of="norm")


def _norm_error(q: SymmetryQuotient, x: Tensors, u: Tensors) -> float:
    """Relative error of ``norm`` against the square root of ``inner`` (the adapters call
    ``norm``; an override that returns, say, the squared norm would change their steps)."""
    return relative_error((q.norm(x, u),), (q.inner(x, u, u).clamp_min(0).sqrt(),))


def _frozen_point_checks(run: _CheckRun) -> None:
    """The frozen point ``quotient.at(x)``, what optimisers and the sharpness engine run."""
    q, x, u, w = run.q, run.x, run.u, run.w
    frozen = q.at(x)
    # its own generator, so that the draws of every other check do not depend on it
    gen_frozen = torch.Generator().manual_seed(run.seed + 7919)
    egrad_like = _random_tangent_raw(x, run.nd, gen_frozen)
    frozen_pairs = [
        (frozen.horizontal_projection(u), reference.horizontal_projection(q, x, u)),
        (frozen.riemannian_gradient(egrad_like),
         reference.euclidean_to_riemannian_gradient(q, x, egrad_like)),
        (frozen.christoffel(u, w), reference.christoffel(q, x, u, w)),
        ((frozen.norm(u),), (q.inner(x, u, u).clamp_min(0).sqrt(),)),
    ]
    run.add("frozen_point_vs_reference", max(relative_error(a, b) for a, b in frozen_pairs),
            "quotient.at(x): projection, gradient, Christoffel and norm against the references")
    iso = q.at(run.on_host).isotropic(gen_frozen)  # drawn on the CPU, like every draw here
    run.add("frozen_point_isotropic_finite",
            0.0 if all(bool(torch.isfinite(t).all()) for t in iso) else math.inf,
            "a metric-isotropic draw at x is finite")


def _group_action_checks(run: _CheckRun) -> None:
    """``vertical`` against the orbit, an overriding ``act_tangent``, the metric's invariance."""
    q, x, gen = run.q, run.x, run.gen
    a = _random_algebra(q, x, gen)
    run.add(*_vertical_check(q, x, a))
    # no draw of its own: the checks after it draw the same vectors as before it existed
    run.add(*_action_check(q, x, a), bound=max(run.tol, 1e-9))
    run.add(*_involutive_check(q, x, a, run.seed), bound=max(run.tol, 1e-9))
    g = q.random_group_element(run.on_host, generator=gen).to(x[0].device)
    check_group_element_moves(q, x, g)
    if _overrides(q, "act_tangent"):
        run.add(*_act_tangent_check(q, x, run.u, g))
    run.add(*_symmetry_check(q, x, run.u, run.w))
    if declares_invariant(q):
        run.add(*_invariance_check(q, x, run.u, run.w, g), bound=max(run.tol, 1e-9))
        run.add(*_killing_check(q, x, run.u, run.w, a), bound=max(run.tol, 1e-9))


def _christoffel_checks(run: _CheckRun) -> None:
    """``christoffel`` (bilinear and quadratic) against autograd on the metric, and symmetric."""
    q, x, u, w = run.q, run.x, run.u, run.w
    run.add("christoffel_vs_reference", relative_error(q.christoffel(x, u, w),
                                                       reference.christoffel(q, x, u, w)),
            "bilinear Gamma(u, w) against autograd on the metric", default_of="christoffel")
    run.add("christoffel_quadratic_vs_reference", relative_error(q.christoffel(x, u),
                                                                 reference.christoffel(q, x, u)),
            "Gamma(u, u) against autograd on the metric", default_of="christoffel")
    run.add("christoffel_symmetric", relative_error(q.christoffel(x, u, w),
                                                    q.christoffel(x, w, u)),
            "Gamma(u, w) = Gamma(w, u)")


def _gradient_checks(run: _CheckRun) -> None:
    """The Riemannian gradient against the dense solve, horizontal, and (float64) its Taylor
    slope."""
    q, x, gen = run.q, run.x, run.gen
    f = _test_function(x, gen)
    xg = tuple(c.detach().requires_grad_(True) for c in x)
    egrad = torch.autograd.grad(f(xg), xg)
    rgrad = q.euclidean_to_riemannian_gradient(x, egrad)
    run.add("gradient_vs_reference", relative_error(
        rgrad, reference.euclidean_to_riemannian_gradient(q, x, egrad)),
        "closed form against the dense metric solve",
        default_of="euclidean_to_riemannian_gradient")
    run.add("gradient_horizontal", float(reference.horizontality_error(q, x, rgrad).max()),
            "reference horizontality error of the gradient")
    # what the optimisers read (QuotientAdamW's raise operator): the quotient's and the frozen
    # point's, which check_contract holds to the same reference
    raised = reference.raise_index(q, x, egrad)
    run.add("raise_index_vs_reference", max(relative_error(q.raise_index(x, egrad), raised),
                                            relative_error(q.at(x).raise_index(egrad), raised)),
            "g(x)^{-1} egrad against the dense metric solve", default_of="raise_index")
    if x[0].dtype != torch.float64:
        return
    h = _to(x[0].device, q.random_tangent(run.on_host, generator=gen))
    ts = torch.logspace(-4, -1.5, 9, dtype=torch.float64, device=gen.device)
    f0 = f(x)
    slope = float(q.inner(x, rgrad, h).sum())
    errors = torch.stack([(f(T.axpy(float(t), h, x, run.nd)) - f0 - t * slope).abs()
                          for t in ts])
    run.results.append(_slope_result("gradient_taylor_slope", ts, errors, 2.0,
                                     "|f(x + t h) - f(x) - t <grad f, h>| ~ t^2, h horizontal",
                                     floor=1e-13 * max(1.0, float(f0.abs()))))


def _geodesic_order_checks(run: _CheckRun, h: Tensors) -> None:
    """The order-1 and order-2 geodesics converge to the exact one at slopes 2 and 3."""
    q, x = run.q, run.x
    ts = torch.logspace(-3, -1, 7, dtype=torch.float64, device=run.gen.device)
    # 8 RK4 steps leave an error ~ t^5 / 8^4, far below the t^3 being measured
    # all step sizes at once, on a new leading batch dimension
    xs = tuple(c.expand(len(ts), *c.shape) for c in x)
    hs = tuple(ts.to(c).reshape(-1, *([1] * c.dim())) * c for c in h)
    exact = q.geodesic(xs, hs, order="exact", steps=8)
    for order, expected in ((1, 2.0), (2, 3.0)):
        approx = q.geodesic(xs, hs, order=order)
        errs = torch.stack([(p - r).abs().flatten(1).amax(1)
                            for p, r in zip(approx, exact, strict=True)]).amax(0)
        run.results.append(_slope_result(f"geodesic_order{order}_slope", ts, errs,
                                         expected, f"|order-{order} - exact| ~ t^{expected:.0f}",
                                         floor=1e-14 * max(float(c.abs().max()) for c in x)))


def _exact_geodesic_check(run: _CheckRun, h: Tensors, bound: float = 1e-7) -> None:
    """An overriding closed-form exact geodesic against RK4 integration."""
    v = T.scale(0.3, h, run.nd)
    # RK4 on this class's Gamma, which christoffel_vs_reference holds against autograd
    ode = reference.geodesic_ode(run.x, v, 1.0, run.nd, run.q.christoffel, steps=128)
    run.add("exact_geodesic_vs_ode", relative_error(run.q.geodesic(run.x, v, order="exact"), ode),
            "closed-form exact geodesic against RK4 integration of the geodesic equation",
            bound=bound)


def _geodesic_horizontal_check(run: _CheckRun, h: Tensors) -> None:
    """A geodesic with horizontal start stays horizontal (central difference at ``t = 0.5``)."""
    q, x = run.q, run.x
    v = T.scale(0.3, h, run.nd)
    step = 1e-4
    times = torch.tensor([0.5 + step, 0.5 - step, 0.5], dtype=torch.float64,
                         device=run.gen.device)
    x3 = tuple(c.expand(3, *c.shape) for c in x)
    v3 = tuple(times.to(c).reshape(-1, *([1] * c.dim())) * c for c in v)
    ends = q.geodesic(x3, v3, order="exact", steps=16)
    ahead, behind, mid = (tuple(c[i] for c in ends) for i in range(3))
    velocity = tuple((p - r) / (2 * step) for p, r in zip(ahead, behind, strict=True))
    run.add("geodesic_stays_horizontal",
            float(reference.horizontality_error(q, mid, velocity).max()),
            "a geodesic with horizontal start stays horizontal (velocity at t = 0.5)",
            bound=1e-6)


def _geodesic_checks(run: _CheckRun) -> None:
    """Geodesic orders, an overriding exact geodesic, horizontality kept; in another dtype than
    float64, whose rounding hides the slopes, the overriding exact geodesic only."""
    q, x = run.q, run.x
    float64 = x[0].dtype == torch.float64
    if not (float64 or _overrides(q, "geodesic_exact")):
        return
    h = _within_domain(q, x, _to(x[0].device, q.random_tangent(run.on_host, generator=run.gen)))
    if not float64:
        # a wrong closed form is off at order one, far above the dtype's tolerance
        _exact_geodesic_check(run, h, bound=run.tol)
        return
    _geodesic_order_checks(run, h)
    if _overrides(q, "geodesic_exact"):
        _exact_geodesic_check(run, h)
    if declares_invariant(q):
        _geodesic_horizontal_check(run, h)


def _broadcast_check(run: _CheckRun) -> None:
    """Projection, Christoffel, gradient and inner on a stack equal a loop over its first axis."""
    q, x, u, w, nd = run.q, run.x, run.u, run.w, run.nd
    batch = T.batch_shape(x, nd)
    if len(batch) < 1 or batch[0] <= 1:
        # no axis to loop over (batch_shape=() or a given unbatched point): stack the point with
        # another point of its orbit and fresh vectors, so that a method that reduces over or
        # mixes a batch axis still shows (the draws come last: the other checks are unchanged)
        g = q.random_group_element(run.on_host, generator=run.gen).to(x[0].device)
        x, u, w = (tuple(torch.stack(pair) for pair in zip(first, second, strict=True))
                   for first, second in ((x, q.act(x, g)),
                                         (u, _random_tangent_raw(x, nd, run.gen)),
                                         (w, _random_tangent_raw(x, nd, run.gen))))
        batch = T.batch_shape(x, nd)

    def at(i: int, y: Tensors) -> Tensors:
        return tuple(c.expand(*batch, *c.shape[c.dim() - k:])[i] for c, k in
                     zip(y, nd, strict=True))
    ops: list[tuple[str, Callable[[Tensors, Tensors, Tensors], Tensors]]] = [
        ("horizontal_projection", lambda y, p, _: q.horizontal_projection(y, p)),
        ("christoffel", lambda y, p, r: q.christoffel(y, p, r)),
        ("gradient", lambda y, p, _: q.euclidean_to_riemannian_gradient(y, p)),
        ("inner", lambda y, p, r: (q.inner(y, p, r),)),
    ]
    worst = 0.0
    for _, op in ops:
        stacked = op(x, u, w)
        looped = [op(at(i, x), at(i, u), at(i, w)) for i in range(batch[0])]
        looped_stack = tuple(torch.stack([lp[j] for lp in looped])
                             for j in range(len(stacked)))
        worst = max(worst, relative_error(stacked, looped_stack))
    run.add("broadcast_equals_loop", worst,
            "projection, Christoffel, gradient, inner on a stack against a loop")


#: The checks of :func:`check_all`, in the order they run (and draw from the seed's generator).
_CHECK_GROUPS: tuple[Callable[[_CheckRun], None], ...] = (
    _projection_checks, _frozen_point_checks, _group_action_checks, _christoffel_checks,
    _gradient_checks, _geodesic_checks, _broadcast_check)


def _check_point(quotient: SymmetryQuotient, point: Tensors | None, batch_shape: Sequence[int],
                 gen: torch.Generator, dtype: torch.dtype,
                 device: torch.device | str | None) -> Tensors:
    """``point`` checked, or a random point of ``batch_shape`` drawn from ``gen``."""
    if point is not None:
        return quotient.check_point(tuple(point), "point")
    shapes = quotient.point_shapes or getattr(quotient, "check_shapes", None)
    if shapes is None:
        raise ValueError(f"{type(quotient).__name__} has no point_shapes: pass point=...")
    x = quotient.random_point(batch_shape, shapes=shapes, generator=gen, dtype=dtype)
    return tuple(c.to(device) for c in x) if device is not None else x


def check_all(quotient: SymmetryQuotient, seed: int = 0, dtype: torch.dtype = torch.float64,
              point: Tensors | None = None, batch_shape: Sequence[int] = (3,),
              device: torch.device | str | None = None) -> list[CheckResult]:
    """Run every check on ``quotient`` at a random point (or ``point``).

    Parameters
    ----------
    quotient
        The quotient to check.
    seed
        Seed of all random draws.
    dtype
        Floating dtype of the random point. Tolerances: ``1e-10`` relative in float64,
        ``1e-4`` otherwise; Taylor slopes, geodesic slopes and a geodesic's horizontality are
        checked in float64 only (an overriding exact geodesic is held to RK4 in every dtype).
    point
        Check at this point instead of a random one.
    batch_shape
        Batch shape of the random point.
    device
        Device of the random point (default CPU). The random draws are made on the CPU
        whatever the device, so a check on CUDA uses the same point and vectors.

    Returns
    -------
    list[CheckResult]
    """
    if not isinstance(quotient, SymmetryQuotient):
        raise TypeError(f"quotient must be a SymmetryQuotient instance (e.g. GLQuotient('inv')), "
                        f"got {type(quotient).__name__} {quotient!r}")
    seed = check_count("seed", seed, minimum=0)
    # an empty batch would pass every check without testing anything
    batch_shape = [check_count("batch_shape entries", n) for n in batch_shape]
    gen = torch.Generator().manual_seed(seed)
    x = _check_point(quotient, point, batch_shape, gen, dtype, device)
    nd = quotient.point_ndims
    u = _random_tangent_raw(x, nd, gen)
    w = _random_tangent_raw(x, nd, gen)
    # every random draw comes from the CPU generator, so a device changes no draw
    run = _CheckRun(quotient, nd, x, _to(gen.device, x), gen, seed, _tolerance(x[0].dtype), u, w)
    # what every user of the quotient refuses first (outputs of another dtype or shape, a
    # method writing into its arguments), which the comparisons below can pass or hide
    diagnose(quotient, x)
    try:
        for checks in _CHECK_GROUPS:
            checks(run)
    except (ValueError, RuntimeError, TypeError, IndexError) as err:
        # a failure deep in a check (a Cholesky, a zip) is named by the method that caused it,
        # at the point, then at one element of it (broadcast_equals_loop runs unbatched points)
        diagnose(quotient, x)
        check_group_identity(quotient, x)
        if T.batch_shape(x, quotient.point_ndims).numel() > 1:
            diagnose(quotient, T.first_element(x, quotient.point_ndims))
        raise err
    if any(not math.isfinite(r.error) for r in run.results):
        diagnose(quotient, x)
    return run.results


#: Relative error the contract of :func:`check_contract` is held to. It runs in float64 at a
#: model's real point, which may be ill-conditioned (rounding ``~ eps * condition``, ``1e-10``
#: at a condition of ``1e6``); a wrong formula is off at order one (the defects found: 3-14 %).
CONTRACT_TOLERANCE = 1e-4
#: Largest ``algebra dimension x point size`` for which :func:`check_contract` forms the
#: vertical basis (the reference projection); above it, random vertical vectors stand in.
CONTRACT_BASIS_BUDGET = 4_000_000
#: The operations whose overrides :func:`check_contract` holds to their references.
CONTRACT_METHODS = ("horizontal_projection", "vertical_projection", "raise_index",
                    "euclidean_to_riemannian_gradient", "christoffel", "geodesic",
                    "geodesic_exact", "frozen_point")


def _pairing(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], ndims: Sequence[int]
             ) -> torch.Tensor:
    """The Euclidean pairing ``a . b`` per batch element, ``shape=[*batch]``."""
    return cast(torch.Tensor, sum(T.sum_trailing(p * r, k)
                                  for p, r, k in zip(a, b, ndims, strict=True)))


def _horizontality(q: SymmetryQuotient, x: Tensors, u: Tensors, gen: torch.Generator,
                   basis: bool) -> float:
    """Largest normalised metric product of ``u`` with a vertical vector: over the algebra's
    basis (``basis``), else over four random algebra elements."""
    if basis:
        return float(reference.horizontality_error(q, x, u).max())
    worst = 0.0
    norm_u = q.norm(x, u)
    for _ in range(4):
        v = q.vertical(x, _random_algebra(q, x, gen))
        ratio = q.inner(x, v, u).abs() / (q.norm(x, v) * norm_u).clamp_min(1e-300)
        worst = max(worst, float(ratio.max()))
    return worst


def _within_basis_budget(q: SymmetryQuotient, x: Tensors) -> Tensors | None:
    """``x``, or its first element, where its vertical basis fits
    :data:`CONTRACT_BASIS_BUDGET` entries; ``None`` where neither does."""
    for point in (x, T.first_element(x, q.point_ndims)):
        if torch.Size(q.algebra_shape(point)).numel() * sum(c.numel() for c in point) \
                <= CONTRACT_BASIS_BUDGET:
            return point
    return None


def check_contract(quotient: SymmetryQuotient, x: Tensors, *, seed: int = 0,
                   tolerance: float = CONTRACT_TOLERANCE, group_scale: float = 1.0,
                   group: bool = True) -> list[CheckResult]:
    """The contract of a quotient at the point ``x``, cheaply: what the sharpness engine
    relies on, checked before it measures with a user's quotient.

    Always: ``vertical()`` against the derivative of ``act()`` (``vertical_is_orbit_velocity``),
    ``act()`` a group action along a one-parameter subgroup (``act_is_action``), the symmetry of
    ``inner`` (``inner_symmetric``) and its invariance under a random group element
    (``metric_invariance``, unless the quotient says ``invariant = False``), an overriding
    ``act_tangent`` against the jvp of ``act``, the Lie bracket of two vertical fields vertical
    (``vertical_is_involutive``; at ``x``, or at its first element where the vertical basis of
    ``x`` exceeds :data:`CONTRACT_BASIS_BUDGET` entries, and not at all where that of one
    element does too) and Killing's equation of the metric along a vertical field
    (``metric_is_killing``, unless ``invariant = False``). Then, when the class overrides one of
    :data:`CONTRACT_METHODS`, the operations of its frozen point ``quotient.at(x)`` (what the
    engine runs) against their references: the horizontal projection against the normal
    equations over the vertical basis, the Riemannian gradient by its defining property
    (horizontal, and ``<grad, h>_x = egrad . h`` for horizontal ``h``), the Christoffel
    contraction and ``raise_index`` by the lowered forms of :mod:`~quotientsharp.core.reference`
    (``g(x) Gamma(v, v)`` is the Christoffel covector, autograd on ``inner``), the geodesics of
    orders 1 and 2 against their formulas and the exact one against RK4 integration over a short
    time.

    Every reference is matrix-free (no ``N x N`` metric): the cost is a few evaluations of
    ``inner`` and its autograd, plus ``K`` vertical vectors for the projection, ``K`` the
    algebra's dimension (random vertical vectors instead when ``K x size(x)`` exceeds
    :data:`CONTRACT_BASIS_BUDGET`).

    Parameters
    ----------
    quotient
        The quotient.
    x
        The point (float64 recommended: the tolerance is relative, ``1e-4`` by default).
    seed
        Seed of the random tangent vectors and group element (drawn on ``x``'s device).
    tolerance
        Bound of every relative error.
    group_scale
        Scale of the random group element's algebra element (``random_group_element``).
    group
        Whether to check the group (``vertical`` against ``act``, ``act``, ``act_tangent``,
        the metric's invariance); ``False`` for a user of the metric and its operations only
        (the adapters), which then need no ``group_exp`` (``vertical_is_involutive``, which
        reads ``vertical`` alone, runs either way).

    Returns
    -------
    list[CheckResult]
        One per property checked, in the order above.
    """
    q = quotient
    x = q.check_point(tuple(x), "x")
    # malformed outputs and a metric that is not positive definite, named by method, before
    # the comparisons below (which a NaN or a negative metric would pass or blur)
    diagnose(q, x)
    nd = q.point_ndims
    gen = torch.Generator(device=x[0].device).manual_seed(check_count("seed", seed, minimum=0))
    results: list[CheckResult] = []

    def add(name: str, err: float, detail: str) -> None:
        results.append(CheckResult(name, err, tolerance, bool(err <= tolerance), detail))

    u = _random_tangent_raw(x, nd, gen)
    w = _random_tangent_raw(x, nd, gen)
    a = _random_algebra(q, x, gen)
    if group:
        check_group_identity(q, x)
        add(*_vertical_check(q, x, a))
        add(*_action_check(q, x, group_scale * a))
    add(*_symmetry_check(q, x, u, w))
    rows = _group_element_checks(q, x, u, w, group_scale, gen) if group else []
    # after the group's checks, which name a wrong action or metric more directly
    rows += _vertical_field_checks(q, x, u, w, a, seed)
    results += [CheckResult(name, err, tolerance, bool(err <= tolerance), detail)
                for name, err, detail in [*rows, *_wrapper_checks(q, x, u)]]
    if not any(_overrides(q, m) for m in CONTRACT_METHODS):
        return results

    frozen = q.at(x)
    algebra = torch.Size(q.algebra_shape(x)).numel()
    basis = algebra * sum(c.numel() for c in x) <= CONTRACT_BASIS_BUDGET
    # --- the horizontal projection
    hu = tuple(frozen.horizontal_projection(u))
    if basis:
        add("horizontal_projection_vs_reference",
            relative_error(hu, reference.horizontal_projection(q, x, u)),
            "against the normal equations over the vertical basis")
    else:
        add("projection_horizontal", _horizontality(q, x, hu, gen, basis=False),
            "metric products of P_h u with random vertical vectors")
        add("projection_idempotent", relative_error(frozen.horizontal_projection(hu), hu),
            "P(P u) = P u")
    # horizontal test vectors from the reference (or the projection just checked)
    h = reference.horizontal_projection(q, x, w) if basis else frozen.horizontal_projection(w)
    # --- the Riemannian gradient: horizontal, and <grad, h>_x = egrad . h for horizontal h
    egrad = _random_tangent_raw(x, nd, gen)
    rgrad, squared = frozen.riemannian_gradient_and_squared_norm(egrad)
    add("gradient_vs_reference", max(
        relative_error((q.inner(x, rgrad, h),), (_pairing(egrad, h, nd),)),
        relative_error((q.inner(x, rgrad, hu),), (_pairing(egrad, hu, nd),)),
        relative_error((squared,), (q.inner(x, rgrad, rgrad),))),
        "<grad, h>_x = egrad . h for horizontal h, and its squared norm")
    add("gradient_horizontal", _horizontality(q, x, rgrad, gen, basis),
        "metric products of the gradient with vertical vectors")
    # --- raise_index: g(x) raise(c) = c
    add("raise_index_vs_reference",
        relative_error(reference.lower(q, x, frozen.raise_index(egrad)), egrad),
        "g(x) raise_index(c) = c (the metric by autograd of inner)")
    # --- the Christoffel contraction, lowered: g(x) Gamma(v, v) = the Christoffel covector
    quadratic = q.inner(x, frozen.christoffel(u), w)
    covector = _pairing(reference.christoffel_covector(q, x, u), w, nd)
    bilinear = q.inner(x, frozen.christoffel(u, hu), w)
    polarised = 0.25 * (_pairing(reference.christoffel_covector(q, x, T.add(u, hu)), w, nd)
                        - _pairing(reference.christoffel_covector(q, x, T.sub(u, hu)), w, nd))
    add("christoffel_vs_reference", max(relative_error((quadratic,), (covector,)),
                                        relative_error((bilinear,), (polarised,))),
        "<Gamma(u, v), w>_x against the covector D(g v)[v] - grad <v, v> / 2 by autograd")
    # --- geodesics: orders 1 and 2 by their formulas, the exact one against RK4
    size = max(float(c.abs().max()) for c in x)
    speed = max(float(c.abs().max()) for c in h)
    v = T.scale(1e-2 * size / max(speed, 1e-300), h, nd)
    gamma = frozen.christoffel(v)
    second = tuple(p + r - 0.5 * c for p, r, c in zip(x, v, gamma, strict=True))
    for order, want in ((1, T.add(x, v)), (2, second)):
        add(f"geodesic_order{order}_vs_formula",
            relative_error(T.sub(frozen.geodesic(v, order=order), x), T.sub(want, x)),
            "x + t u" if order == 1 else "x + t u - t^2/2 Gamma(u, u)")
    ode = reference.geodesic_ode(x, v, 1.0, nd, q.christoffel, steps=8)
    exact = frozen.geodesic(v, order="exact", steps=8)
    add("exact_geodesic_vs_ode",
        max(relative_error(T.sub(exact, x), T.sub(ode, x)), _curved_part_error(exact, ode, x, v)),
        "the exact geodesic against RK4 integration of the geodesic equation (8 steps), the "
        "whole move and the part beyond the straight line")
    for name, error, detail in _geodesic_method_checks(q, x, v, ((1, T.add(x, v)), (2, second),
                                                                 ("exact", ode))):
        add(name, error, detail)
    return results


def _group_element_checks(q: SymmetryQuotient, x: Tensors, u: Tensors, w: Tensors,
                          group_scale: float, gen: torch.Generator
                          ) -> list[tuple[str, float, str]]:
    """The contract's checks with a random group element (drawn from ``gen``): it moves the
    point, an overriding ``act_tangent`` is the jvp of ``act``, the metric is invariant."""
    g = q.random_group_element(x, scale=group_scale, generator=gen)
    check_group_element_moves(q, x, g)
    rows = [_act_tangent_check(q, x, u, g)] if _overrides(q, "act_tangent") else []
    return rows + ([_invariance_check(q, x, u, w, g)] if declares_invariant(q) else [])


def _vertical_field_checks(q: SymmetryQuotient, x: Tensors, u: Tensors, w: Tensors,
                           a: torch.Tensor, seed: int) -> list[tuple[str, float, str]]:
    """The contract's checks of ``vertical`` and ``inner`` alone (no ``group_exp``, so the
    adapters' checks run them too): the bracket of two vertical fields is vertical (at ``x``,
    or its first element, within :data:`CONTRACT_BASIS_BUDGET`), Killing's equation."""
    rows = []
    involutive = _within_basis_budget(q, x)
    if involutive is not None:
        first = T.first_element((a,), (len(q.algebra_shape(x)),))[0]
        rows.append(_involutive_check(q, involutive, a if involutive is x else first, seed))
    if declares_invariant(q):
        rows.append(_killing_check(q, x, u, w, a))
    return rows


def _geodesic_method_checks(q: SymmetryQuotient, x: Tensors, v: Tensors,
                            paths: Sequence[tuple[int | str, Tensors]]
                            ) -> list[tuple[str, float, str]]:
    """An override of the quotient's own ``geodesic`` against ``paths`` (order, the point it
    must reach): the adapters' retractions call it, the engine the frozen point's."""
    if not _overrides(q, "geodesic"):
        return []
    return [(f"geodesic_method_order_{kind}", relative_error(
        T.sub(q.geodesic(x, v, order=kind, steps=8), x), T.sub(want, x)),
        f"{type(q).__name__}.geodesic(order={kind!r}) against "
        + ("RK4 integration (8 steps)" if kind == "exact" else "its formula"))
        for kind, want in paths]


def _wrapper_checks(q: SymmetryQuotient, x: Tensors, u: Tensors
                    ) -> list[tuple[str, float, str]]:
    """Overrides of the quotient's methods that only the adapters call (``norm``,
    ``horizontality_error``, ``vertical_projection``) against their definitions: the engine runs
    the frozen point, so a wrong one would change the adapters' steps and nothing else."""
    checks = []
    if _overrides(q, "norm"):
        checks.append(("norm_vs_inner", _norm_error(q, x, u), "||u||_x against sqrt(<u, u>_x)"))
    basis = (torch.Size(q.algebra_shape(x)).numel() * sum(c.numel() for c in x)
             <= CONTRACT_BASIS_BUDGET)
    if basis and _overrides(q, "horizontality_error"):
        checks.append(("horizontality_error_vs_reference", float(
            (q.horizontality_error(x, u) - reference.horizontality_error(q, x, u)).abs().max()),
            "the largest normalised metric product with the vertical basis"))
    if basis and _overrides(q, "vertical_projection"):
        checks.append(("vertical_projection_vs_reference", relative_error(
            q.vertical_projection(x, u), T.sub(u, reference.horizontal_projection(q, x, u))),
            "u minus the horizontal projection of the normal equations"))
    return checks


def _curved_part_error(exact: Tensors, ode: Tensors, x: Tensors, v: Tensors) -> float:
    """Relative error of an exact geodesic's part beyond the line ``x + v`` against the ODE's:
    a wrong cubic term is ``O(|v|)`` of that ``O(|v|^2)`` part but hidden in the whole move. A
    flat metric has no such part (below ``1e-8 |v|``, the rounding of ``x + v``): 0."""
    line = T.add(x, v)
    beyond_exact, beyond_ode = T.sub(exact, line), T.sub(ode, line)
    floor = 1e-8 * max(float(c.abs().max()) for c in v)
    if max(float(c.abs().max()) for c in (*beyond_exact, *beyond_ode)) <= floor:
        return 0.0
    return relative_error(beyond_exact, beyond_ode)


def format_results(results: Sequence[CheckResult], title: str = "") -> str:
    """A plain-text table of check results, one row per check.

    Each row ends in the check's :attr:`CheckResult.status`: ``pass``, ``FAIL``, or
    ``no override`` where the class keeps the generic default, so that the check compared the
    default with itself and tested nothing.

    Parameters
    ----------
    results
        From :func:`check_all`.
    title
        A first line, e.g. the quotient's name.

    Returns
    -------
    str
    """
    lines = [title] if title else []
    width = max(len(r.name) for r in results)
    for r in results:
        value = f"{r.error:.3e}" if math.isfinite(r.error) else str(r.error)
        lines.append(f"  {r.name:<{width}}  {value:>10}  (tol/expected {r.tolerance:.1e})  "
                     f"{r.status}")
    return "\n".join(lines)


def check_user_quotient(quotient: SymmetryQuotient, owner: str, *,
                        shapes: Sequence[Sequence[int]], batch_shape: Sequence[int] = (),
                        dtype: torch.dtype = torch.float64) -> None:
    """Raise a ``ValueError`` naming ``owner`` unless the methods of a quotient not defined by
    the package (:func:`~quotientsharp.core.method_checks.builtin_quotient`) are well formed at
    a random point of ``shapes`` (:func:`~quotientsharp.core.method_checks.diagnose`: output
    counts, shapes, dtypes, finiteness, a positive definite ``inner``); the package's own are
    skipped (the test suite verifies them).

    Then the operations the adapters run against their references
    (:func:`check_contract` with ``group=False``: the symmetry of ``inner``, the bracket of two
    vertical fields (``vertical``, which the horizontal projection reads), Killing's equation
    (the metric's invariance, from ``inner`` and ``vertical``), and the overriding
    projection, gradient, ``raise_index``, Christoffel contraction and geodesics), each failure
    naming the property.

    For the adapters, which check at construction and have no model point: a random
    Gaussian point, as ``random_point`` draws (seed 0, ``dtype``). In a ``dtype`` other than
    float64 (the geoopt adapter's first point of another dtype) only the method checks run.
    Not the checks of
    :func:`check_contract` that draw group elements: they draw them through ``act`` and
    ``group_exp``, which the adapters never call (a class may leave ``group_exp`` at its
    default and still be a valid manifold for them); ``quotientsharp verify --quotient`` runs
    them.
    """
    if builtin_quotient(quotient):
        return
    x = quotient.random_point(tuple(batch_shape), shapes=shapes, dtype=dtype,
                              generator=torch.Generator().manual_seed(0))
    try:
        diagnose(quotient, x)
    except (QuotientMethodError, DegeneratePointError) as err:
        raise ValueError(f"{owner}: {err}" + ("" if dtype == torch.float64 else
                                              f" (in {dtype}, the dtype of the point)")) from err
    if dtype != torch.float64:
        # the contract's comparisons are held to float64's rounding; in another dtype the
        # outputs' dtypes and shapes are what a class gets wrong (a float64 intermediate)
        return
    # a wrong closed form otherwise moves every iterate of the optimiser, silently
    # another seed than the point's: the same draws would make the first tangent vector the
    # point itself, horizontal for a scaling symmetry, which tests no projection
    for result in check_contract(quotient, x, seed=1, group=False):
        if not result.passed:
            raise ValueError(
                f"{owner}: {type(quotient).__name__} fails {result.name} (relative error "
                f"{result.error:.3g}, tolerance {result.tolerance:.3g}: {result.detail}); "
                "`quotientsharp verify --quotient` runs the full checks")
