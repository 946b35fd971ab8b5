"""A user's quotient whose methods are malformed, or a batch or point the symmetry check cannot
use, is refused with an error naming the cause (the method, the batch, the point)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import quotientsharp as qs
from quotientsharp.core.frozen import FrozenPoint
from quotientsharp.models import QuotientBinding, SymmetryCheckError, check_symmetry
from tests.tiny_models import ReLUNeuronQuotient

NAMES = ["0.weight", "0.bias", "2.weight"]


Neuron = ReLUNeuronQuotient


class NegDef(Neuron):
    def inner(self, x, u, v):
        return -super().inner(x, u, v)


class Indefinite(Neuron):
    def inner(self, x, u, v):
        return ((u[0] * v[0]).sum(-1) / x[0].square().sum(-1)
                - (u[1] * v[1]).sum(-1) / x[1].square().sum(-1))


class IndefiniteInOneCoordinate(Neuron):
    """Negative along the first incoming weight only: random vectors rarely see it."""

    def inner(self, x, u, v):
        scale = x[0].square().sum(-1)
        return super().inner(x, u, v) - 1.5 * u[0][..., 0] * v[0][..., 0] / scale


class NaNInner(Neuron):
    def inner(self, x, u, v):
        return super().inner(x, u, v) * float("nan")


class InnerRaises(Neuron):
    def inner(self, x, u, v):
        raise RuntimeError("boom in inner")


class InnerInt(Neuron):
    def inner(self, x, u, v):
        return super().inner(x, u, v).to(torch.int64)


class ProjOne(Neuron):
    def horizontal_projection(self, x, u):
        return (u[0],)


class ProjFloat32(Neuron):
    def horizontal_projection(self, x, u):
        return tuple(t.float() for t in super().horizontal_projection(x, u))


class TooLargeAlgebra(Neuron):
    """Declares two algebra coordinates, but the group (and ``vertical``) uses the first only."""

    def algebra_shape(self, x):
        return (2,)

    def vertical(self, x, a):
        return a[..., :1] * x[0], -a[..., :1] * x[1]

    def act(self, x, g):
        return g[..., :1] * x[0], x[1] / g[..., :1]


class ShiftAction(Neuron):
    """Scales both factors: not a symmetry of the MLP."""

    def vertical(self, x, a):
        return a * x[0], a * x[1]

    def act(self, x, g):
        return g * x[0], g * x[1]


class ActInPlace(Neuron):
    """Writes the scaled factor into the point (equal values under the identity element)."""

    def act(self, x, g):
        return x[0].mul_(g), x[1] / g


class IdentityElement(ShiftAction):
    def random_group_element(self, x, *, scale=1.0, generator=None):
        return torch.ones(x[0].shape[:-1] + (1,), dtype=x[0].dtype)


class _NaNIsotropic(FrozenPoint):
    def isotropic(self, generator=None):
        return tuple(torch.full_like(c, float("nan")) for c in self.x)


class _ZeroIsotropic(FrozenPoint):
    def isotropic(self, generator=None):
        return tuple(torch.zeros_like(c) for c in self.x)


class NaNIsotropic(Neuron):
    def frozen_point(self, x):
        return _NaNIsotropic(self, x)


class ZeroIsotropic(Neuron):
    def frozen_point(self, x):
        return _ZeroIsotropic(self, x)


def _to_point(p):
    return torch.cat([p["0.weight"], p["0.bias"][:, None]], dim=1), p["2.weight"].T


def _from_point(x):
    return {"0.weight": x[0][:, :-1], "0.bias": x[0][:, -1], "2.weight": x[1].T}


def _bind(quotient):
    return QuotientBinding(quotient, NAMES, _to_point, _from_point, folded=1, name="relu units")


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3)).double()


def _batch(seed=5):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(16, 5, dtype=torch.float64, generator=gen), torch.randint(0, 3, (16,),
                                                                                 generator=gen)


def _sharpness(model, quotient):
    return qs.sharpness(model, [_batch()], measure="geodesic", symmetries=_bind(quotient),
                        rho=0.05, n_iter=2, progress=False)


MALFORMED = [
    (NegDef, r"NegDef\.inner is not positive definite"),
    (Indefinite, r"Indefinite\.inner is not positive definite"),
    (IndefiniteInOneCoordinate, r"IndefiniteInOneCoordinate\.inner is not positive definite: "
                                r"its metric matrix at the point has the eigenvalue -"),
    (NaNInner, r"NaNInner\.inner returned non-finite"),
    (InnerRaises, r"InnerRaises\.inner raised RuntimeError: boom in inner"),
    (InnerInt, r"InnerInt\.inner returned dtype torch\.int64"),
    (ProjOne, r"ProjOne\.horizontal_projection returned 1 tensor\(s\), expected 2"),
    (ProjFloat32, r"ProjFloat32\.horizontal_projection returned component 0 of dtype "
                  r"torch\.float32"),
    (TooLargeAlgebra, r"TooLargeAlgebra\.vertical is not injective at the point: the vertical "
                      r"vectors of the 2 basis elements"),
    (ActInPlace, r"ActInPlace\.act changed its argument x in place"),
    (NaNIsotropic, r"NaNIsotropic\.frozen_point\(x\)\.isotropic returned non-finite"),
    (ZeroIsotropic, r"ZeroIsotropic\.frozen_point\(x\)\.isotropic returned zeros"),
]


@pytest.mark.parametrize(("cls", "pattern"), MALFORMED)
def test_check_symmetry_names_the_malformed_method(cls, pattern):
    with pytest.raises(SymmetryCheckError, match=r"binding 'relu units': " + pattern):
        check_symmetry(_mlp(), _bind(cls()), _batch())


@pytest.mark.parametrize(("cls", "pattern"), MALFORMED)
def test_sharpness_names_the_malformed_method_not_a_degenerate_orbit(cls, pattern):
    # the binding's failure, as the tutorial says: a SymmetryCheckError, wherever it is found
    with pytest.raises(SymmetryCheckError, match=pattern) as info:
        _sharpness(_mlp(), cls())
    assert "degenerate" not in str(info.value)


@pytest.mark.parametrize(("cls", "pattern"), MALFORMED[:10])
def test_check_all_names_the_malformed_method(cls, pattern):
    with pytest.raises(ValueError, match=pattern):
        qs.checks.check_all(cls(point_shapes=[(4,), (3,)]), seed=0)


def test_identity_group_element_is_refused():
    with pytest.raises(SymmetryCheckError, match="random_group_element returned an element that "
                                                 "does not move the point"):
        check_symmetry(_mlp(), _bind(IdentityElement()), _batch())
    with pytest.raises(ValueError, match="random_group_element"):
        qs.checks.check_all(IdentityElement(point_shapes=[(4,), (3,)]), seed=0)


def test_nan_in_batch_is_refused_not_reported_as_holding():
    inputs, target = _batch()
    inputs[0, 0] = float("nan")
    with pytest.raises(ValueError, match="not finite .* at theta"):
        check_symmetry(_mlp(), _bind(ShiftAction()), (inputs, target))


@pytest.mark.parametrize("as_mapping", [False, True])
def test_an_empty_batch_is_named_not_blamed_on_nan_inputs(as_mapping):
    inputs, target = _batch()
    batch = ({"input": inputs[:0], "labels": target[:0]} if as_mapping
             else (inputs[:0], target[:0]))
    with pytest.raises(ValueError, match=r"^batch is empty: its target has shape \(0,\)"):
        check_symmetry(_mlp(), _bind(Neuron()), batch)


@pytest.mark.parametrize("zero", ["all", "unit0"])
def test_degenerate_point_is_blamed_on_the_point_not_the_class(zero):
    model = _mlp()
    with torch.no_grad():
        if zero == "all":
            for p in model.parameters():
                p.zero_()
        else:
            model[0].weight[0].zero_()
            model[0].bias[0].zero_()
    with pytest.raises(SymmetryCheckError,
                       match="the point is degenerate for ReLUNeuronQuotient") as info:
        check_symmetry(model, _bind(Neuron()), _batch())
    assert "fails" not in str(info.value)


def test_correct_quotient_still_holds_and_a_wrong_action_still_fails():
    model = _mlp()
    (good,) = check_symmetry(model, _bind(Neuron()), _batch())
    (bad,) = check_symmetry(model, _bind(ShiftAction()), _batch())
    assert good.passed and not bad.passed


def test_to_point_returning_a_dict_is_refused_naming_the_binding():
    binding = QuotientBinding(Neuron(), NAMES, lambda p: p, _from_point, folded=1, name="units")
    with pytest.raises(TypeError, match="binding 'units': to_point must return a tuple of tensors"):
        check_symmetry(_mlp(), binding, _batch())


@pytest.mark.parametrize(("bindings", "batch", "error", "pattern"), [
    ("good", None, TypeError, "batch must be a pair"),
    ("good", "three", TypeError, "batch must be a pair .* of length 3"),
    ([], "good", ValueError, "bindings is empty"),
    (3, "good", TypeError, "bindings must be a QuotientBinding"),
    ("good", "wide", ValueError, "batch: the model's forward"),
])
def test_check_symmetry_names_a_bad_argument(bindings, batch, error, pattern):
    inputs, target = _batch()
    batches = {"good": (inputs, target), None: None, "three": (inputs, target, target),
               "wide": (torch.randn(16, 7, dtype=torch.float64), target)}
    with pytest.raises(error, match=pattern):
        check_symmetry(_mlp(), _bind(Neuron()) if bindings == "good" else bindings,
                       batches[batch])


@pytest.mark.parametrize(("shape", "error", "pattern"), [
    ((4.5,), TypeError, "point_shapes entries must be integers, got float 4.5"),
    ((True,), TypeError, "got the bool True"),
    ((-4,), ValueError, "point_shapes entries must be >= 0, got -4"),
])
def test_point_shapes_refuses_non_integers_bools_and_negatives(shape, error, pattern):
    with pytest.raises(error, match=pattern):
        Neuron(point_shapes=[shape, (3,)])


def test_point_shapes_keeps_integers():
    assert Neuron(point_shapes=[(torch.tensor(4),), (3,)]).point_shapes == ((4,), (3,))


class EuclideanNeuron(Neuron):
    invariant = False

    def inner(self, x, u, v):
        return (u[0] * v[0]).sum(-1) + (u[1] * v[1]).sum(-1)


def test_declared_non_invariant_metric_warns_once_and_an_undeclared_one_fails():
    from quotientsharp.models.symmetry_check import NonInvariantMetricWarning

    with pytest.warns(NonInvariantMetricWarning, match="EuclideanNeuron sets invariant = False"):
        check_symmetry(_mlp(), _bind(EuclideanNeuron()), _batch())
    # once per class: a second check is silent (filterwarnings=error would raise otherwise)
    check_symmetry(_mlp(), _bind(EuclideanNeuron()), _batch())

    class Undeclared(EuclideanNeuron):
        invariant = True

    with pytest.raises(SymmetryCheckError, match="metric_invariance"):
        check_symmetry(_mlp(), _bind(Undeclared()), _batch())
    # the result says which bindings' values depend on the group
    options = dict(measure="geodesic", rho=0.05, n_iter=2, progress=False, reach=False)
    opted = qs.sharpness(_mlp(), [_batch()], symmetries=_bind(EuclideanNeuron()), **options)
    kept = qs.sharpness(_mlp(), [_batch()], symmetries=_bind(Neuron()), **options)
    assert [b["invariant"] for b in opted.settings["bindings"]] == [False]
    assert [b["invariant"] for b in kept.settings["bindings"]] == [True]


@pytest.mark.parametrize(("value", "error"), [(-1.0, ValueError), (0, ValueError),
                                              (float("nan"), ValueError), ("a", TypeError),
                                              (True, TypeError)])
def test_pymanopt_typical_dist_is_validated(value, error):
    from quotientsharp.core.adapters import PymanoptQuotient

    with pytest.raises(error, match="typical_dist"):
        PymanoptQuotient(Neuron(), ((4,), (3,)), typical_dist=value)


def test_pymanopt_batch_shape_must_be_a_sequence():
    from quotientsharp.core.adapters import PymanoptQuotient

    with pytest.raises(TypeError, match="batch_shape must be a sequence"):
        PymanoptQuotient(Neuron(), ((4,), (3,)), batch_shape=6)


@pytest.mark.parametrize("adapter", ["PymanoptQuotient", "QuotientManifold"])
@pytest.mark.parametrize(("cls", "pattern"), [(NegDef, r"NegDef\.inner is not positive definite"),
                                              (ProjOne, r"ProjOne\.horizontal_projection "
                                                        r"returned 1 tensor")])
def test_adapters_check_a_user_quotient_at_construction(adapter, cls, pattern):
    from quotientsharp.core import adapters

    with pytest.raises(ValueError, match=adapter + ": " + pattern):
        getattr(adapters, adapter)(cls(), ((4,), (3,)))


def test_adapters_accept_a_correct_user_quotient():
    from quotientsharp.core.adapters import PymanoptQuotient, QuotientManifold

    assert PymanoptQuotient(Neuron(), ((4,), (3,)), typical_dist=2.0).typical_dist == 2.0
    QuotientManifold(Neuron(), ((4,), (3,)))


def test_study_refuses_a_row_symmetry_when_geodesic_is_not_measured(tmp_path):
    import contextlib
    import io

    from quotientsharp.cli import main

    torch.save(_mlp(), tmp_path / "net.pt")
    torch.save(_mlp(1), tmp_path / "net2.pt")
    torch.save(_batch(), tmp_path / "data.pt")
    (tmp_path / "rows.csv").write_text("name,model,gap,symmetry\na,net.pt,0.1,mod:bind\n"
                                       "b,net2.pt,0.2,\n")
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        code = main(["study", str(tmp_path / "rows.csv"), "--data", str(tmp_path / "data.pt"),
                     "--measure", "adaptive", "--rho", "0.1", "--no-progress", "--bootstrap",
                     "0", "--no-plots", "--out", str(tmp_path / "out")])
    assert code == 2
    message = stderr.getvalue()
    assert message.count("\n") == 1
    assert "line 2: symmetry mod:bind applies to geodesic only" in message
    assert "adaptive" in message


class ReducesOverDimOne(Neuron):
    """Reduces over dim=1, not -1: right for points of one batch dimension only."""

    def inner(self, x, u, v):
        return ((u[0] * v[0]).sum(1) / x[0].square().sum(1)
                + (u[1] * v[1]).sum(1) / x[1].square().sum(1))


class UnbatchedOnly(Neuron):
    """Matrix products of vectors: right for unbatched points only."""

    def inner(self, x, u, v):
        return (u[0] @ v[0]) / (x[0] @ x[0]) + (u[1] @ v[1]) / (x[1] @ x[1])


@pytest.mark.parametrize(("cls", "batch_shape", "where"), [
    (ReducesOverDimOne, (3,), r"\(\)"), (ReducesOverDimOne, (), r"\(\)"),
    (ReducesOverDimOne, (2, 3), r"\(2, 3\)"), (UnbatchedOnly, (3,), r"\(3,\)")])
def test_a_class_that_does_not_broadcast_is_named_not_the_point(cls, batch_shape, where):
    pattern = (rf"{cls.__name__}\.inner raised .*, at points of batch shape {where} but not at "
               r"points of batch shape .*must broadcast over any leading \(batch\) dimensions")
    with pytest.raises(ValueError, match=pattern) as info:
        qs.checks.check_all(cls(point_shapes=[(4,), (3,)]), seed=0, batch_shape=batch_shape)
    assert "degenerate" not in str(info.value)


class ScalesByTheBatchMean(Neuron):
    """Divides by the batch's mean size: mixes the points of a batch, right unbatched only."""

    def inner(self, x, u, v):
        return ((u[0] * v[0]).sum(-1) / x[0].square().sum(-1).mean()
                + (u[1] * v[1]).sum(-1) / x[1].square().sum(-1).mean())


@pytest.mark.parametrize("batch_shape", [(), (1,)])
def test_an_unbatched_check_still_checks_broadcasting(batch_shape):
    # at a point with no batch axis to loop over, the check stacks it with a point of its orbit:
    # the row is there, passes for a class that broadcasts and fails for one that mixes a batch
    rows = {r.name: r for r in qs.checks.check_all(Neuron(point_shapes=[(4,), (3,)]), seed=1,
                                                   batch_shape=batch_shape)}
    assert rows["broadcast_equals_loop"].passed and rows["broadcast_equals_loop"].error < 1e-12
    rows = {r.name: r for r in qs.checks.check_all(
        ScalesByTheBatchMean(point_shapes=[(4,), (3,)]), seed=1, batch_shape=batch_shape)}
    assert not rows["broadcast_equals_loop"].passed
    assert rows["broadcast_equals_loop"].error > 1e-3


def _from_third_unit(x):
    """``1`` on the first two units of a stack (the first contract check's) and ``-1`` after."""
    sign = torch.ones(x[0].shape[:-1] + (1,), dtype=x[0].dtype)
    if sign.dim() > 1:
        sign[2:] = -1.0
    return sign


class GradientWrongFromTheThirdUnit(Neuron):
    def euclidean_to_riemannian_gradient(self, x, egrad):
        return tuple(g * _from_third_unit(x)
                     for g in super().euclidean_to_riemannian_gradient(x, egrad))


class ChristoffelWrongFromTheThirdUnit(Neuron):
    def christoffel(self, x, u, v=None):
        return tuple(c * _from_third_unit(x) for c in super().christoffel(x, u, v))


@pytest.mark.parametrize(("cls", "check"), [
    (GradientWrongFromTheThirdUnit, "gradient_vs_reference"),
    (ChristoffelWrongFromTheThirdUnit, "christoffel_vs_reference")])
def test_a_formula_wrong_only_beyond_the_first_units_is_refused(cls, check):
    from quotientsharp.models import QuotientSGD

    # right on units 0 and 1: the first contract check passes, the one on every unit does not
    pattern = rf"binding 'relu units': {cls.__name__} fails {check} .* on its units \("
    with pytest.raises(SymmetryCheckError, match=pattern):
        _sharpness(_mlp(), cls())
    with pytest.raises(SymmetryCheckError, match=pattern):
        QuotientSGD(_mlp(), 0.1, symmetries=[_bind(cls())])
    with pytest.raises(SymmetryCheckError, match=pattern):
        check_symmetry(_mlp(), _bind(cls()), _batch())


class NegativeFromTheThirdUnit(Neuron):
    def inner(self, x, u, v):
        return super().inner(x, u, v) * _from_third_unit(x)[..., 0]


class ChristoffelNaNAtSomeValues(Neuron):
    """NaN where a unit's first incoming weight is negative: a branch on the values."""

    def christoffel(self, x, u, v=None):
        return tuple(torch.where(x[0][..., :1] < 0, torch.nan, c)
                     for c in super().christoffel(x, u, v))


@pytest.mark.parametrize(("cls", "pattern"), [
    (NegativeFromTheThirdUnit, r"NegativeFromTheThirdUnit\.inner is not positive definite"),
    (ChristoffelNaNAtSomeValues, r"ChristoffelNaNAtSomeValues\.christoffel returned non-finite "
                                 r"values \(NaN or inf\) in component 0$")])
def test_a_method_wrong_at_some_units_is_named_not_the_point_or_broadcasting(cls, pattern):
    model = _mlp()
    with torch.no_grad():
        model[0].weight[:, 0] = torch.tensor([0.3, 0.2, -0.4, 0.5, 0.1, 0.2],
                                             dtype=torch.float64)
    for run in (lambda: _sharpness(model, cls()), lambda: check_symmetry(model, _bind(cls()),
                                                                         _batch())):
        with pytest.raises(SymmetryCheckError, match=pattern) as info:
            run()
        assert "degenerate" not in str(info.value) and "broadcast" not in str(info.value)


class NaNProjectionAtSomeValues(Neuron):
    def horizontal_projection(self, x, u):
        return tuple(torch.where(x[0][..., :1] < 0, torch.nan, h)
                     for h in super().horizontal_projection(x, u))


def test_a_projection_returning_nan_is_named_as_such():
    model = _mlp()
    with torch.no_grad():
        model[0].weight[3, 0] = -0.5
    with pytest.raises(SymmetryCheckError, match=r"NaNProjectionAtSomeValues\.horizontal_"
                                                 r"projection returned non-finite values"):
        check_symmetry(model, _bind(NaNProjectionAtSomeValues()), _batch())


@pytest.mark.parametrize("value", [None, 0, 1, "no"])
def test_invariant_must_be_a_bool(value):
    cls = type("Flagged", (EuclideanNeuron,), {"invariant": value})
    pattern = rf"Flagged\.invariant must be True or False, got {value!r}"
    with pytest.raises(TypeError, match=pattern):
        check_symmetry(_mlp(), _bind(cls()), _batch())
    with pytest.raises(TypeError, match=pattern):
        _sharpness(_mlp(), cls())
    with pytest.raises(TypeError, match=pattern):
        qs.checks.check_all(cls(point_shapes=[(4,), (3,)]), seed=0)


def test_the_spread_point_holds_every_unit_or_a_budget_of_them_with_the_extremes(monkeypatch):
    from quotientsharp.models import symmetry_check

    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 5, 3, generator=gen), torch.randn(4, 5, 2, generator=gen))
    flat = symmetry_check.spread_point(x, folded=2)
    assert flat is not None and [t.shape for t in flat] == [(20, 3), (20, 2)]
    assert torch.equal(flat[0], x[0].reshape(20, 3))
    # two units or fewer: the first contract check holds them all
    assert symmetry_check.spread_point(tuple(t[:2, :1] for t in x), folded=2) is None
    assert symmetry_check.spread_point(tuple(t[0, 0] for t in x), folded=0) is None
    # over the budget: about the budget's units, among them the first, the last, the smallest
    # and the largest
    units = (torch.randn(50, 3, generator=gen), torch.randn(50, 2, generator=gen))
    units[0][17] *= 100.0
    units[0][33] *= 1e-3
    units[1][33] *= 1e-3
    monkeypatch.setattr(symmetry_check, "CONTRACT_ENTRIES", 50)
    subset = symmetry_check.spread_point(units, folded=1)
    assert subset is not None
    rows = {tuple(r.tolist()) for r in subset[0]}
    for unit in (0, 17, 33, 49):
        assert tuple(units[0][unit].tolist()) in rows
    assert 10 <= len(rows) <= 14


def test_a_binding_beside_a_lora_adapter_warns_that_the_adapter_is_not_on_its_quotient():
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 6), nn.ReLU(),
                         nn.Linear(6, 3)).double()
    model = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["4"],
                                                      modules_to_save=["0", "2"]))
    with torch.no_grad():       # PEFT's B = 0 is a degenerate adapter, not a GL(r) pair
        model.base_model.model[4].lora_B["default"].weight.normal_()
    first, second = (f"base_model.model.{i}.modules_to_save.default." for i in (0, 2))
    binding = QuotientBinding(
        Neuron(), [first + "weight", first + "bias", second + "weight"],
        lambda p: (torch.cat([p[first + "weight"], p[first + "bias"][:, None]], dim=1),
                   p[second + "weight"].T),
        lambda x: {first + "weight": x[0][:, :-1], first + "bias": x[0][:, -1],
                   second + "weight": x[1].T}, folded=1, name="relu units")
    with pytest.warns(qs.UnboundSymmetryWarning,
                      match=r"2 other parameter\(s\) \(\[.base_model\.model\.4\.lora_B"):
        qs.sharpness(model, [_batch()], measure="geodesic", rho=0.05, n_iter=2,
                     symmetries=binding, progress=False, reach=False)


# ------------------------------------------------------------ what only the adapters call
class SumsOverEveryDimension(Neuron):
    """Right at one point, one number for a stack of them."""

    def inner(self, x, u, v):
        return ((u[0] * v[0]).sum() / x[0].square().sum()
                + (u[1] * v[1]).sum() / x[1].square().sum())


def test_geoopt_checks_a_stack_of_points_as_its_parameters_hold():
    from quotientsharp.core.adapters import QuotientManifold

    with pytest.raises(ValueError, match=r"QuotientManifold: SumsOverEveryDimension\.inner "
                                         r"returned shape \(\).*must broadcast"):
        QuotientManifold(SumsOverEveryDimension(), ((4,), (3,)))


class SquaredNorm(Neuron):
    def norm(self, x, u):
        return self.inner(x, u, u)


class SignErrorGeodesic(Neuron):
    def geodesic(self, x, u, t=1.0, order=2, steps=64):
        if order != 2:
            return super().geodesic(x, u, t, order, steps)
        gamma = self.christoffel(x, u)
        return tuple(p + t * r + 0.5 * t * t * c for p, r, c in zip(x, u, gamma, strict=True))


class ZeroHorizontality(Neuron):
    def horizontality_error(self, x, u):
        return torch.zeros(x[0].shape[:-1], dtype=x[0].dtype)


class ZeroVerticalProjection(Neuron):
    def vertical_projection(self, x, u):
        return tuple(torch.zeros_like(c) for c in u)


WRAPPERS = [(SquaredNorm, "norm_vs_inner"), (SignErrorGeodesic, "geodesic_method_order_2"),
            (ZeroHorizontality, "horizontality_error_vs_reference"),
            (ZeroVerticalProjection, "vertical_projection_vs_reference")]


@pytest.mark.parametrize("adapter", ["PymanoptQuotient", "QuotientManifold"])
@pytest.mark.parametrize(("cls", "check"), WRAPPERS)
def test_adapters_refuse_a_wrong_override_of_what_they_call(adapter, cls, check):
    from quotientsharp.core import adapters

    with pytest.raises(ValueError, match=rf"{adapter}: {cls.__name__} fails {check} "):
        getattr(adapters, adapter)(cls(), ((4,), (3,)))


@pytest.mark.parametrize(("cls", "check"), WRAPPERS)
def test_the_contract_holds_each_override_to_its_definition(cls, check):
    # another seed than the check's own draws: the same one makes u the point, horizontal here
    point = tuple(c.double() for c in Neuron(point_shapes=[(4,), (3,)]).random_point(
        (3,), generator=torch.Generator().manual_seed(7)))
    failed = {r.name for r in qs.core.checks.check_contract(cls(), point) if not r.passed}
    assert failed == {check}
    assert not [r for r in qs.core.checks.check_contract(Neuron(), point) if not r.passed]


def test_check_all_holds_norm_to_the_metric():
    failed = {r.name for r in qs.checks.check_all(SquaredNorm(point_shapes=[(4,), (3,)]), seed=0)
              if not r.passed}
    assert "norm_vs_inner" in failed


# ------------------------------------------------------------ verify refuses what sharpness does
class InPlaceProjection(Neuron):
    def horizontal_projection(self, x, u):
        out = super().horizontal_projection(x, u)
        u[0].copy_(out[0])
        return out


class Float64Projection(Neuron):
    """The closed form, computed (and returned) in float64 whatever the point's dtype."""

    def horizontal_projection(self, x, u):
        (w_in, w_out), (u_in, u_out) = (tuple(c.double() for c in t) for t in (x, u))
        a = ((u_in * w_in).sum(-1) / w_in.square().sum(-1)
             - (u_out * w_out).sum(-1) / w_out.square().sum(-1)).unsqueeze(-1) / 2
        return u_in - a * w_in, u_out + a * w_out


@pytest.mark.parametrize(("cls", "dtype", "pattern"), [
    (InPlaceProjection, torch.float64, r"horizontal_projection changed its argument u in place"),
    (Float64Projection, torch.float32, r"horizontal_projection returned component 0 of dtype "
                                       r"torch\.float64, expected the point's torch\.float32")])
def test_check_all_refuses_what_every_user_of_the_quotient_refuses(cls, dtype, pattern):
    with pytest.raises(ValueError, match=pattern):
        qs.checks.check_all(cls(point_shapes=[(4,), (3,)]), seed=0, dtype=dtype)


class SummedAlgebra(Neuron):
    """Two algebra coordinates that ``vertical`` only ever uses as their sum."""

    def algebra_shape(self, x):
        return (2,)

    def vertical(self, x, a):
        s = a[..., :1] + a[..., 1:]
        return s * x[0], -s * x[1]

    def act(self, x, g):
        s = g[..., :1] * g[..., 1:]
        return s * x[0], x[1] / s


def test_a_vertical_map_of_dependent_directions_is_not_injective():
    with pytest.raises(ValueError, match=r"SummedAlgebra\.vertical is not injective"):
        qs.checks.check_all(SummedAlgebra(point_shapes=[(4,), (3,)]), seed=0)
    with pytest.raises(SymmetryCheckError, match=r"SummedAlgebra\.vertical is not injective"):
        check_symmetry(_mlp(), _bind(SummedAlgebra()), _batch())


def test_a_matrix_group_without_its_exponential_is_told_so():
    from tests.bottleneck_symmetry import BottleneckGL, bottleneck_batches, bottleneck_model

    class NoMatrixExp(BottleneckGL):
        group_exp = qs.SymmetryQuotient.group_exp

    pattern = r"group_exp\(0\) must be the group's identity: NoMatrixExp keeps the default"
    with pytest.raises(ValueError, match=pattern):
        qs.checks.check_all(NoMatrixExp(point_shapes=[(3, 6), (4, 3)]), seed=0)
    model = bottleneck_model()
    binding = qs.QuotientBinding(NoMatrixExp(), ["0.weight", "1.weight"], name="bottleneck")
    with pytest.raises(SymmetryCheckError, match="binding 'bottleneck': act.*" + pattern):
        qs.sharpness(model, bottleneck_batches(), measure="geodesic", symmetries=[binding],
                     rho=0.05, n_iter=2, progress=False)


def test_a_misspelt_parameter_in_to_point_names_the_binding_and_its_parameters():
    def misspelt(p):
        return _to_point({**p, "0.weight": p["0.wieght"]})

    binding = QuotientBinding(Neuron(), NAMES, misspelt, _from_point, folded=1,
                              name="relu units")
    with pytest.raises(ValueError, match=r"binding 'relu units': to_point looked up "
                                         r"'0\.wieght', which is not one of the binding's "
                                         r"parameters \['0\.weight'"):
        qs.sharpness(_mlp(), [_batch()], measure="geodesic", symmetries=[binding], rho=0.05,
                     n_iter=2, progress=False)


# ------------------------------------------------------------ a model that fits its targets
def test_a_symmetry_of_a_model_that_fits_its_targets_holds():
    model = _mlp()
    inputs, _ = _batch()
    with torch.no_grad():
        exact = model(inputs)
    mse = torch.nn.functional.mse_loss
    (fits,) = check_symmetry(model, _bind(Neuron()), (inputs, exact.clone()), loss=mse)
    assert fits.passed, fits.message()
    (broken,) = check_symmetry(model, _bind(ShiftAction()), (inputs, exact.clone()), loss=mse)
    assert not broken.passed


def test_the_optimisers_refuse_a_method_of_another_dtype_as_sharpness_does():
    model = _mlp().float()
    batch = tuple(t.float() if t.is_floating_point() else t for t in _batch())
    pattern = (r"binding 'relu units'.*Float64Projection\.horizontal_projection returned "
               r"component 0 of dtype torch\.float64")
    with pytest.raises(SymmetryCheckError, match=pattern):
        qs.models.QuotientSGD(model, 0.1, symmetries=[_bind(Float64Projection())])
    with pytest.raises(SymmetryCheckError, match=r"Float64Projection\.horizontal_projection "
                                                 r"returned component 0 of dtype"):
        qs.sharpness(model, [batch], measure="geodesic", symmetries=[_bind(Float64Projection())],
                     rho=0.05, n_iter=2, progress=False)


def _skew(a: torch.Tensor, h: int) -> torch.Tensor:
    """The skew-symmetric ``h x h`` matrix of the ``h (h - 1) / 2`` entries ``a``."""
    rows, cols = torch.triu_indices(h, h, 1)
    m = a.new_zeros(*a.shape[:-1], h, h)
    m[..., rows, cols] = a
    return m - m.mT


class RotatedPair(qs.SymmetryQuotient):
    """``O(h)`` on a pair ``(G, H)``, ``(G Q, H Q)``: a symmetry of ``G H^T``."""

    point_ndims = (2, 2)

    def inner(self, x, u, v):
        return (u[0] * v[0]).sum((-2, -1)) + (u[1] * v[1]).sum((-2, -1))

    def _generator(self, x, a):
        return _skew(a, x[0].shape[-1])

    def vertical(self, x, a):
        m = self._generator(x, a)
        return x[0] @ m, x[1] @ m

    def act(self, x, g):
        return x[0] @ g, x[1] @ g

    def algebra_shape(self, x):
        h = x[0].shape[-1]
        return (h * (h - 1) // 2,)

    def group_exp_at(self, x, a):
        return torch.linalg.matrix_exp(self._generator(x, a))

    def group_exp(self, a):
        h = round((1 + (1 + 8 * a.shape[-1]) ** 0.5) / 2)
        return torch.linalg.matrix_exp(_skew(a, h))


class OppositeOrders(RotatedPair):
    """``(G Q, H Q^T)``: each one-parameter subgroup acts, and ``vertical`` is its velocity, but
    the two factors compose the group's elements in opposite orders: not a group action."""

    def vertical(self, x, a):
        m = self._generator(x, a)
        return x[0] @ m, x[1] @ m.mT

    def act(self, x, g):
        return x[0] @ g, x[1] @ g.mT


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_an_action_composing_in_opposite_orders_is_refused_by_the_bracket(dtype):
    point = tuple(torch.randn(2, n, 3, generator=torch.Generator().manual_seed(n), dtype=dtype)
                  for n in (5, 4))
    good = {r.name: r for r in qs.checks.check_all(RotatedPair(), point=point)}
    bad = {r.name: r for r in qs.checks.check_all(OppositeOrders(), point=point)}
    assert good["vertical_is_involutive"].passed
    # the checks along one-parameter subgroups pass it; the bracket of two fields does not
    assert bad["act_is_action"].passed and bad["vertical_is_orbit_velocity"].passed
    assert bad["vertical_is_involutive"].error > 0.1
    contract = {r.name: r for r in qs.checks.check_contract(OppositeOrders(), point)}
    assert not contract["vertical_is_involutive"].passed
    assert all(r.passed for r in qs.checks.check_contract(RotatedPair(), point))


@pytest.mark.parametrize("adapter", ["PymanoptQuotient", "QuotientManifold"])
def test_the_adapters_refuse_a_vertical_map_that_is_not_an_action(adapter):
    # the adapters never call group_exp, but their horizontal projection reads vertical
    from quotientsharp.core import adapters

    getattr(adapters, adapter)(RotatedPair(), ((5, 3), (4, 3)))
    with pytest.raises(ValueError, match=adapter + ": OppositeOrders fails vertical_is_involutive"):
        getattr(adapters, adapter)(OppositeOrders(), ((5, 3), (4, 3)))


def test_the_bracket_check_of_an_abelian_group_and_of_a_trivial_one_is_zero():
    point = tuple(torch.randn(3, n, generator=torch.Generator().manual_seed(n),
                              dtype=torch.float64) for n in (4, 3))
    results = {r.name: r for r in qs.checks.check_all(Neuron(), point=point)}
    assert results["vertical_is_involutive"].error < 1e-15
    results = {r.name: r for r in qs.checks.check_all(
        qs.AdaptiveQuotient("adaptive", shapes=[(4, 3), (3,)]))}
    assert results["vertical_is_involutive"].error == 0.0


class UninvariantNeuron(Neuron):
    """The euclidean metric on a scaling symmetry: not invariant (and not declared so)."""

    def inner(self, x, u, v):
        return (u[0] * v[0]).sum(-1) + (u[1] * v[1]).sum(-1)


@pytest.mark.parametrize("adapter", ["PymanoptQuotient", "QuotientManifold"])
def test_the_adapters_refuse_a_metric_that_is_not_invariant(adapter):
    # they draw no group element (no group_exp), so metric_invariance did not run there:
    # Killing's equation reads inner and vertical alone
    from quotientsharp.core import adapters

    with pytest.raises(ValueError, match=adapter + ": UninvariantNeuron fails metric_is_killing"):
        getattr(adapters, adapter)(UninvariantNeuron(), ((4,), (3,)))
    results = {r.name: r for r in qs.checks.check_all(UninvariantNeuron(point_shapes=[(4,), (3,)]))}
    assert not results["metric_is_killing"].passed and not results["metric_invariance"].passed
    point = tuple(torch.randn(2, n, generator=torch.Generator().manual_seed(n),
                              dtype=torch.float64) for n in (4, 3))
    assert all(r.passed for r in qs.checks.check_contract(Neuron(), point))


class InnerInFloat64(Neuron):
    """Computes its metric in float64 whatever the point's dtype."""

    def inner(self, x, u, v):
        return super().inner(tuple(t.double() for t in x), tuple(t.double() for t in u),
                             tuple(t.double() for t in v))


def test_geoopt_checks_a_user_quotient_in_the_dtype_of_its_parameter():
    # the construction check runs in float64, where this class is right; a float32 parameter
    # failed at the first step in quotient.geodesic, naming neither the class nor inner
    pytest.importorskip("geoopt")
    from quotientsharp.core.adapters import QuotientManifold

    manifold = QuotientManifold(InnerInFloat64(), ((4,), (3,)))
    point = manifold.merge(tuple(torch.randn(2, n) for n in (4, 3)))
    with pytest.raises(ValueError, match=r"^QuotientManifold: InnerInFloat64\.inner returned "
                                         r"dtype torch\.float64, expected the point's "
                                         r"torch\.float32"):
        manifold.egrad2rgrad(point, torch.ones_like(point))
    float64 = point.double()
    assert torch.isfinite(manifold.egrad2rgrad(float64, torch.ones_like(float64))).all()


class GeneralLinearPair(qs.SymmetryQuotient):
    """``GL(h)`` on ``(G, H) -> (G g^{-1}, H g^T)`` with the invariant inv
    metric ``<u, v> = tr(u_G (G^T G)^{-1} v_G^T) + tr(u_H (H^T H)^{-1} v_H^T)``."""

    point_ndims = (2, 2)

    def inner(self, x, u, v):
        grams = [torch.linalg.inv(f.mT @ f) for f in x]
        return sum(((a @ p) * b).sum((-2, -1)) for a, b, p in zip(u, v, grams, strict=True))

    def vertical(self, x, a):
        return -x[0] @ a, x[1] @ a.mT

    def act(self, x, g):
        return torch.linalg.solve(g, x[0], left=False), x[1] @ g.mT

    def algebra_shape(self, x):
        return (x[0].shape[-1], x[0].shape[-1])

    def group_exp(self, a):
        return torch.linalg.matrix_exp(a)


def test_a_float32_point_is_not_called_singular_for_its_rounding():
    # whether vertical uses every direction is the class's property: at a float32 random point
    # of a 17 x 16 GL pair (Gram condition ~1e4), float32's threshold read the Gram as singular
    point = tuple(torch.randn(2, 17, 16, generator=torch.Generator().manual_seed(3))
                  for _ in range(2))
    from quotientsharp.core.method_checks import diagnose

    diagnose(GeneralLinearPair(), point)
    assert all(r.passed for r in qs.checks.check_contract(
        GeneralLinearPair(), tuple(p.double() for p in point)))


def test_killings_equation_is_not_failed_by_units_where_its_terms_vanish():
    # a correct metric in float32 over 3000 units: some units' three terms nearly cancel to
    # nothing, and relative to the largest of them their rounding read as errors of 1.5e-4
    from quotientsharp.core.checks import _killing_check

    quotient = Neuron()
    for seed in range(4):
        draw = torch.Generator().manual_seed(seed)
        x, u, w = (tuple(torch.randn(3000, n, generator=draw) for n in (4, 3)) for _ in range(3))
        a = torch.randn(3000, 1, generator=draw)
        name, error, _ = _killing_check(quotient, x, u, w, a)
        assert name == "metric_is_killing" and error < 1e-5, (seed, error)
