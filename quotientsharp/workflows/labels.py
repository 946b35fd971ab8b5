"""Readable names of sharpness measures (:func:`measure_label`: ``geodesic sharpness (mix
metric, order 2, ρ = 0.1)`` for the key ``geodesic_mix_order2``), and plot titles."""

from __future__ import annotations

import math
from collections.abc import Sequence

#: The measures of :func:`quotientsharp.sharpness`, in words (here, not from the engine, so that
#: checking ``--measure`` imports no torch; ``tests/test_study_config.py`` holds them equal).
MEASURE_NAMES = {
    "average": "average sharpness",
    "worst_case": "worst-case sharpness",
    "adaptive": "adaptive sharpness",
    "geodesic": "geodesic sharpness",
    "relative_flatness": "relative flatness",
}


def measure_label(measure: str, *, metric: str | None = None, order: int | str | None = None,
                  rho: float | None = None, p: str | float | None = None,
                  greek: bool = True) -> str:
    """The readable name of a measure with the settings that tell its variants apart: the
    geodesic ``metric`` and ``order``, the radius ``rho`` and ``p="inf"`` (the box ball); with
    ``greek``, ``ρ`` and ``L∞`` (plots) rather than ``rho`` and ``Linf``.

    >>> measure_label("geodesic", metric="inv", order="exact", rho=0.1, greek=False)
    'geodesic sharpness (inv metric, exact geodesic, rho = 0.1)'
    """
    name = MEASURE_NAMES.get(measure, measure.replace("_", " "))
    details = []
    if metric is not None:
        details.append(f"{metric} metric")
    if order is not None:
        details.append("exact geodesic" if order == "exact" else f"order {order}")
    if p is not None and str(p) in ("inf", str(math.inf)):
        details.append("L∞ ball" if greek else "Linf ball")
    if rho is not None:
        details.append(f"{'ρ' if greek else 'rho'} = {rho:g}")
    return f"{name} ({', '.join(details)})" if details else name


def bindings_metric(bindings: Sequence[object]) -> str:
    """The metric of geodesic sharpness with a user's bindings (``QuotientBinding`` objects or
    their records in ``result.settings["bindings"]``), named by binding and quotient.

    >>> bindings_metric([{"name": "relu units", "quotient": "relu-neuron"}])
    "binding 'relu units' (relu-neuron)"
    """
    named = []
    for binding in bindings:
        if isinstance(binding, dict):
            name, quotient = binding.get("name"), binding.get("quotient")
        else:
            name = getattr(binding, "name", "?")
            quotient = getattr(getattr(binding, "quotient", None), "name", "?")
        named.append(f"{name!r} ({quotient})")
    return f"binding{'s' if len(named) > 1 else ''} " + ", ".join(named)


def _signed(value: float | None) -> str:
    return "undefined" if value is None else f"{value:+.2f}"


def tau_title(tau_a: float | None, tau_b: float | None, paper: float | None = None,
              interval: tuple[float, float] | None = None, count: int | None = None,
              paper_label: str = "paper") -> str:
    """A plot title: our Kendall taus, the ``interval`` of tau-b, the number of models and the
    paper's tau.

    >>> tau_title(-0.731, -0.735, paper=-0.86)
    'Kendall τ-a -0.73, τ-b -0.73; paper τ -0.86'"""
    text = f"Kendall τ-a {_signed(tau_a)}, τ-b {_signed(tau_b)}"
    if interval is not None:
        text += f" [{interval[0]:+.2f}, {interval[1]:+.2f}]"
    if count is not None:
        text += f" (N = {count})"
    if paper is not None:
        text += f"; {paper_label} τ {paper:+.2f}"
    return text


def decades_note(values: Sequence[float], threshold: float = 4.0) -> str | None:
    """A note for an axis whose finite positive values span at least ``threshold`` decades,
    else ``None``.

    >>> decades_note([3.95e8, 2.27e20, 4.94e46])
    'values span 38 decades (4e+08 to 4.9e+46): log scale'
    """
    positive = [float(v) for v in values if math.isfinite(float(v)) and float(v) > 0]
    if len(positive) < 2:
        return None
    low, high = min(positive), max(positive)
    span = math.log10(high / low)
    if span < threshold:
        return None
    return f"values span {span:.0f} decades ({low:.2g} to {high:.2g}): log scale"
