"""What a quotient must define, and how every quotient with several metrics selects one.

- :class:`~quotientsharp.SymmetryQuotient` is abstract: a subclass without ``inner``,
  ``vertical``, ``act`` or ``algebra_shape`` (or ``point_ndims``) fails at instantiation, not
  at its first call, with a message that names what is missing and where to read about it;
- :class:`~quotientsharp.ClosedFormQuotient` needs its frozen-point class,
  :class:`~quotientsharp.core.quotient.MetricFamilyQuotient` its registry of metrics;
- GL (and rotary), diagonal and adaptive quotients select, report and reject metrics the same
  way: one :class:`~quotientsharp.core.metric.MetricRegistry` per family.
"""

from __future__ import annotations

import abc
import copy
import math
import pickle
import re
from collections.abc import Callable

import pytest
import torch

import quotientsharp as qs
from quotientsharp.core.adaptive import AdaptiveEuclideanPoint, AdaptivePoint
from quotientsharp.core.diagonal import DiagonalInvMetric
from quotientsharp.core.frozen import EuclideanMetricPoint
from quotientsharp.core.gl import InvMetric
from quotientsharp.core.metric import Metric, MetricRegistry
from quotientsharp.core.quotient import (
    REQUIRED_METHODS,
    ClosedFormQuotient,
    MetricFamilyQuotient,
    SymmetryQuotient,
)
from tests.test_functional import _batches, _measure, _mlp

REQUIRED = ("inner", "vertical", "act", "algebra_shape")


# ---------------------------------------------------------------------------- a minimal quotient
# the positive rescaling of a ReLU neuron (the tutorial's quotient), one method per entry
def _inner(self, x, u, v):
    return ((u[0] * v[0]).sum(-1) / x[0].square().sum(-1)
            + (u[1] * v[1]).sum(-1) / x[1].square().sum(-1))


def _vertical(self, x, a):
    return a * x[0], -a * x[1]


def _act(self, x, g):
    return g * x[0], x[1] / g


def _algebra_shape(self, x):
    return (1,)


METHODS = {"inner": _inner, "vertical": _vertical, "act": _act, "algebra_shape": _algebra_shape}


def _quotient_class(without: tuple[str, ...] = (), **extra: object) -> type:
    members = {name: method for name, method in METHODS.items() if name not in without}
    return type("NeuronQuotient", (SymmetryQuotient,), {"point_ndims": (1, 1), **members,
                                                        **extra})


def test_the_required_methods_are_abstract():
    assert SymmetryQuotient.__abstractmethods__ == frozenset(REQUIRED)
    assert tuple(REQUIRED_METHODS) == REQUIRED
    # a closed-form quotient has its metric from its frozen point
    assert ClosedFormQuotient.__abstractmethods__ == frozenset(REQUIRED) - {"inner"}
    with pytest.raises(TypeError, match="Can't instantiate abstract class SymmetryQuotient"):
        SymmetryQuotient()


@pytest.mark.parametrize("missing", REQUIRED)
def test_a_missing_method_fails_at_instantiation_naming_it(missing):
    incomplete = _quotient_class(without=(missing,))       # defining the class is fine
    with pytest.raises(TypeError) as info:
        incomplete(point_shapes=[(4,), (3,)])
    message = str(info.value)
    assert f"Can't instantiate abstract class NeuronQuotient: it does not implement {missing}."\
        in message
    assert REQUIRED_METHODS[missing] in message             # the signature and what it is
    assert "docs/tutorial-custom-symmetry.md" in message
    for other in set(REQUIRED) - {missing}:
        assert f"  - {REQUIRED_METHODS[other]}" not in message


def test_several_missing_methods_are_all_named_in_the_documented_order():
    with pytest.raises(TypeError) as info:
        _quotient_class(without=("algebra_shape", "inner", "act"))()
    assert "it does not implement inner, act, algebra_shape." in str(info.value)
    lines = [line for line in str(info.value).splitlines() if line.startswith("  - ")]
    assert lines == [f"  - {REQUIRED_METHODS[name]}" for name in ("inner", "act",
                                                                  "algebra_shape")]


def test_an_abstract_member_of_a_users_own_base_is_named_with_its_class():
    class Scaled(_quotient_class()):
        @abc.abstractmethod
        def scale(self) -> float:
            """A user's own abstract member."""

    with pytest.raises(TypeError, match=r"does not implement scale\. Define in Scaled:\n"
                                        r"  - scale \(abstract in Scaled\)"):
        Scaled()

    class Unit(Scaled):
        def scale(self) -> float:
            return 1.0

    assert Unit().scale() == 1.0


def test_point_ndims_is_required_at_instantiation():
    no_layout = _quotient_class(point_ndims=())
    with pytest.raises(TypeError, match="NeuronQuotient must set point_ndims"):
        no_layout()


def test_a_complete_minimal_subclass_works():
    quotient = _quotient_class()(point_shapes=[(4,), (3,)])
    x = quotient.random_point((5,), generator=torch.Generator().manual_seed(0),
                              dtype=torch.float64)
    xi = quotient.random_tangent(x)
    torch.testing.assert_close(quotient.norm(x, xi), torch.ones(5, dtype=torch.float64))
    assert bool(quotient.is_horizontal(x, xi).all())
    results = qs.checks.check_all(quotient, seed=0)
    assert all(r.passed for r in results), [r for r in results if not r.passed]


def test_a_closed_form_quotient_needs_its_point_type():
    members = {name: METHODS[name] for name in ("vertical", "act", "algebra_shape")}
    bare = type("BareClosedForm", (ClosedFormQuotient,), {"point_ndims": (1, 1), **members})
    with pytest.raises(TypeError, match=r"does not implement point_type\. Define in "
                                        r"BareClosedForm:\n  - point_type: the ClosedFormPoint"):
        bare()

    class NeuronPoint(EuclideanMetricPoint):
        pass

    complete = type("EuclideanNeurons", (bare,), {"point_type": NeuronPoint})
    quotient = complete()
    x = (torch.ones(3, dtype=torch.float64), torch.ones(2, dtype=torch.float64))
    assert isinstance(quotient.at(x), NeuronPoint)
    assert float(quotient.inner(x, x, x)) == 5.0
    # overriding frozen_point instead is the other way to supply the formulas
    own = type("OwnFrozenPoint", (bare,), {"frozen_point": lambda self, x: NeuronPoint(self, x)})
    assert isinstance(own().at(x), NeuronPoint)


def test_a_metric_family_quotient_needs_its_registry():
    members = {name: METHODS[name] for name in ("vertical", "act", "algebra_shape")}
    bare = type("NoRegistry", (MetricFamilyQuotient,), {"point_ndims": (1, 1), **members})
    with pytest.raises(TypeError, match=r"does not implement metrics\. Define in NoRegistry:\n"
                                        r"  - metrics: the MetricRegistry"):
        bare("inv")


BUILT_INS: dict[str, Callable[[], SymmetryQuotient]] = {
    "gl": lambda: qs.GLQuotient("mix"),
    "gl-eps": lambda: qs.GLQuotient(metric="inv", eps=1e-3),
    "rotary": lambda: qs.RotaryQuotient("inv", head_dim=4),
    "diagonal": lambda: qs.DiagonalQuotient("inv"),
    "adaptive": lambda: qs.AdaptiveQuotient("adaptive", shapes=[(3,)]),
    "product": lambda: qs.ProductQuotient([qs.GLQuotient("inv"), qs.DiagonalQuotient("mix")]),
}


@pytest.mark.parametrize("name", BUILT_INS)
def test_built_in_quotients_instantiate_copy_and_pickle(name):
    """The instantiation check lives in ``__new__``: copies and pickles go through it too."""
    quotient = BUILT_INS[name]()
    for clone in (copy.copy(quotient), copy.deepcopy(quotient),
                  pickle.loads(pickle.dumps(quotient))):
        assert type(clone) is type(quotient)
        assert clone.name == quotient.name
        assert getattr(clone, "metric", None) == getattr(quotient, "metric", None)


# ---------------------------------------------------------------------------- metric selection
#: family -> (factory of a quotient from ``metric=``, its registry's names, its metric base)
FAMILIES: dict[str, tuple[Callable[..., MetricFamilyQuotient], tuple[str, ...], str]] = {
    "GLQuotient": (lambda metric: qs.GLQuotient(metric), ("inv", "mix", "euclidean"),
                   "GLMetric"),
    "RotaryQuotient": (lambda metric: qs.RotaryQuotient(metric, head_dim=4),
                       ("inv", "mix", "euclidean"), "GLMetric"),
    "DiagonalQuotient": (lambda metric: qs.DiagonalQuotient(metric),
                         ("inv", "mix", "euclidean"), "DiagonalMetric"),
    "AdaptiveQuotient": (lambda metric: qs.AdaptiveQuotient(metric, shapes=[(3,)]),
                         ("adaptive", "euclidean"), "ScaledEuclideanMetric"),
}
POINTS = {"GLQuotient": ((5, 3), (4, 3)), "RotaryQuotient": ((5, 4), (4, 4)),
          "DiagonalQuotient": ((3,), (3,)), "AdaptiveQuotient": ((3,),)}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_selects_and_reports_its_metric_the_same_way(family):
    make, names, base = FAMILIES[family]
    registry = make(names[0]).metrics
    assert isinstance(registry, MetricRegistry)
    assert registry.names == names and tuple(registry) == names
    assert registry.base.__name__ == base
    gen = torch.Generator().manual_seed(0)
    x = tuple(torch.randn(shape, generator=gen, dtype=torch.float64) for shape in POINTS[family])
    for name in names:
        quotient = make(name)
        metric = quotient.metric
        # read back: the object, its name, its class in the registry
        assert isinstance(metric, registry.base) and type(metric) is registry.types[name]
        assert metric.name == name and str(metric) == name
        assert f"metric={name!r}" in repr(quotient)
        # the object selects the same as its name
        assert make(metric).metric == metric
        assert quotient.invariant == metric.group_invariant
        # the metric object's point class holds the formulas; nothing is copied onto the
        # instance (no instance attribute shadowing a class attribute)
        assert isinstance(quotient.at(x), metric.point_type)
        assert "point_type" not in vars(quotient) and "metric" not in type(quotient).__dict__
        assert type(quotient).metrics is registry


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_rejects_an_unknown_metric_with_one_message(family):
    make, names, base = FAMILIES[family]
    registry = make(names[0]).metrics
    with pytest.raises(ValueError) as info:
        make("fisher")
    assert str(info.value) == (f"metric must be one of {names} for {registry.family}, got "
                               "'fisher'")
    other = DiagonalInvMetric() if base != "DiagonalMetric" else InvMetric()
    with pytest.raises(TypeError, match=re.escape(f"metric must be a metric name {names} or a "
                                                  f"{base} for {registry.family}, got "
                                                  f"{type(other).__name__}")):
        make(other)
    with pytest.raises(TypeError, match="metric must be a metric name"):
        make(None)


def test_the_registries_name_their_quotient_and_keep_the_public_constants():
    from quotientsharp.core import adaptive, diagonal, gl

    assert qs.GLQuotient.metrics.family == "GLQuotient"
    assert qs.RotaryQuotient.metrics is qs.GLQuotient.metrics    # the metric on the total space
    for module, quotient in ((gl, qs.GLQuotient), (diagonal, qs.DiagonalQuotient)):
        assert module.METRICS == quotient.metrics.names
        assert module.METRIC_TYPES == dict(quotient.metrics.types)
    assert adaptive.METRICS == qs.AdaptiveQuotient.metrics.names == ("adaptive", "euclidean")
    with pytest.raises(ValueError, match="distinct names"):
        MetricRegistry("Twice", Metric, [InvMetric, InvMetric])


def test_the_adaptive_metrics_are_point_classes_like_the_others():
    """The Euclidean scale ``c = 1`` is the class constant of its point class, not a string
    compared when a point is frozen."""
    w = (torch.tensor([0.5, -2.0, 0.0], dtype=torch.float64),)
    u = (torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64),)
    adaptive = qs.AdaptiveQuotient("adaptive", point_ndims=(1,)).at(w)
    euclidean = qs.AdaptiveQuotient("euclidean", point_ndims=(1,)).at(w)
    assert type(adaptive) is AdaptivePoint and not adaptive.unit
    assert type(euclidean) is AdaptiveEuclideanPoint and euclidean.unit
    # 1 / c^2, and c = 0 contributes 0 (the fused norm rounds: not compared bit for bit)
    assert float(adaptive.squared_norm(u)) == pytest.approx(4.0 + 0.25, rel=1e-14)
    assert float(euclidean.squared_norm(u)) == pytest.approx(3.0, rel=1e-14)


@pytest.mark.parametrize("quotient, name", [
    (qs.AdaptiveQuotient("euclidean", point_ndims=(1,)), "euclidean"),
    (qs.GLQuotient("mix"), "mix"),
    (qs.DiagonalQuotient("inv"), "inv")])
def test_a_metric_never_equals_a_string(quotient, name):
    """0.1 kept ``AdaptiveQuotient.metric`` as the name; 0.2 compared a metric with its name
    and warned; 0.3 answers unequal, without a warning (the test run makes warnings errors):
    compare ``metric.name``."""
    assert quotient.metric != name
    assert not quotient.metric == name
    assert quotient.metric.name == name


def _diagonal_point(zero: bool):
    u = torch.tensor([[1.0, 0.0 if zero else 0.5]], dtype=torch.float64)
    v = torch.tensor([[2.0, 3.0]], dtype=torch.float64)
    return (u, v), (torch.ones_like(u), torch.ones_like(v))


@pytest.mark.parametrize("t, error", [(math.nan, ValueError), (math.inf, ValueError),
                                      ("1", TypeError), (True, TypeError), (None, TypeError)])
def test_geodesic_time_is_validated(t, error):
    gl = qs.GLQuotient("mix")
    generator = torch.Generator().manual_seed(0)
    x = gl.random_point((2,), shapes=((5, 2), (4, 2)), generator=generator,
                        dtype=torch.float64)
    u = gl.random_tangent(x, generator=generator)
    diagonal = qs.DiagonalQuotient("inv")
    y, w = _diagonal_point(zero=False)
    for call in (lambda: gl.geodesic(x, u, t=t), lambda: gl.geodesic(x, u, t=t, order="exact"),
                 lambda: gl.geodesic_exact(x, u, t=t), lambda: diagonal.geodesic(y, w, t=t)):
        with pytest.raises(error, match="^t must be"):
            call()
    assert torch.allclose(gl.geodesic(x, u, t=0.5, order=1)[0], x[0] + 0.5 * u[0])


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_integer_tensors_never_reach_a_normal_draw():
    quotient = qs.GLQuotient(metric="inv")
    with pytest.raises(TypeError, match="random_point: dtype must be a floating dtype"):
        quotient.random_point(shapes=[(5, 2), (4, 2)], dtype=torch.int64)
    x = quotient.random_point(shapes=[(5, 2), (4, 2)], dtype=torch.float64)
    with pytest.raises(TypeError, match=r"random_tangent: x\[0\] has dtype torch.int64"):
        quotient.random_tangent(tuple(t.long() for t in x))


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_one_tensor_for_a_tuple_is_named():
    quotient = qs.GLQuotient(metric="inv")
    x = quotient.random_point(shapes=[(5, 2), (4, 2)], dtype=torch.float64)
    with pytest.raises(TypeError, match="u must be a tuple of 2 tensors.*got Tensor"):
        quotient.horizontal_projection(x, x[0])
    with pytest.raises(TypeError, match="x must be a tuple of 2 tensors.*got Tensor"):
        quotient.inner(x[0], x, x)
    with pytest.raises(TypeError, match="batches must be an iterable of batches, got Tensor"):
        _measure(_mlp(), _batches()[0][0])
