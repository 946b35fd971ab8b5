"""The typed measures (``quotientsharp.engine.registry``): each field's bad value fails when the
object is made, with the error the string form gives; an unknown option fails by the type; the
string form and the typed form measure the same, bit for bit."""

from __future__ import annotations

import dataclasses
import functools
import linecache
import math
import pickle
import warnings

import numpy as np
import pytest
import torch
from test_sharpness_reuse import AttentionWithDiagonal, _token_batches
from torch import nn

import quotientsharp as qs
from quotientsharp.engine import (
    MEASURES,
    AdaptiveSpec,
    AverageSpec,
    GeodesicSpec,
    MeasureSpec,
    RelativeFlatnessSpec,
    WorstCaseSpec,
    measure_from,
)

COMMON = {"loss": None, "seed": 0, "progress": None, "keep_perturbations": False,
          "geometry_dtype": None, "nonfinite": "raise"}
ASCENT = {"n_iter": 20, "eta0": None, "alpha": 0.75, "random_init": False, "restarts": 0,
          "reach": True, "reference_solve": None, "blockwise": False, "touched_rows": True,
          "compile_steps": False}


def test_the_defaults_of_every_measure() -> None:
    assert MEASURES == {
        "average": {**COMMON, "adaptive": False, "samples": 1},
        "worst_case": {**COMMON, **ASCENT, "p": 2, "adaptive": False},
        "adaptive": {**COMMON, **ASCENT, "p": 2},
        "geodesic": {**COMMON, **ASCENT, "metric": "inv", "order": 2, "eps": 0.0,
                     "symmetries": "auto", "diagonal": None, "other_metric": "adaptive",
                     "other_path": "line", "exact_steps": 16, "check_symmetry": True},
        "relative_flatness": {**COMMON, "layer": None, "hvp_chunk": 64}}


# (class, field, bad value, error, message)
COMMON_BAD = [
    ("rho", None, ValueError, "rho is required"),
    ("rho", "0.1", TypeError, "rho must be a number"),
    ("rho", 0.0, ValueError, "rho must be a finite number > 0"),
    ("rho", math.inf, ValueError, "rho must be a finite number > 0"),
    ("rho", 10 ** 400, ValueError, "fits in a float64"),
    ("loss", "hinge", ValueError, "loss must be one of"),
    ("loss", 3, TypeError, "loss must be a callable"),
    ("seed", 1.5, TypeError, "seed must be an integer"),
    ("seed", np.bool_(False), TypeError, "seed must be an integer"),
    ("rho", np.bool_(True), TypeError, "rho must be a number"),
    ("seed", -1, ValueError, r"seed must be an integer in \[0, 2\*\*64\)"),
    ("progress", "yes", TypeError, "progress must be True or False"),
    ("keep_perturbations", 1, TypeError, "keep_perturbations must be True or False"),
    ("geometry_dtype", torch.float16, ValueError, "geometry_dtype must be None"),
    ("nonfinite", "ignore", ValueError, "nonfinite must be raise or skip"),
]
ASCENT_BAD = [
    ("n_iter", 0, ValueError, "n_iter must be an integer >= 1"),
    ("eta0", -1.0, ValueError, "eta0 must be a finite number > 0"),
    ("alpha", 1.5, ValueError, r"alpha must be in \(0, 1\]"),
    ("random_init", 1, TypeError, "random_init must be a bool"),
    ("restarts", -1, ValueError, "restarts must be an integer >= 0"),
    ("reach", "yes", TypeError, "reach must be True, False or a dict"),
    ("reach", {"chain": 2}, ValueError, r"reach: unknown key\(s\) \['chain'\]"),
    # the user set min_chains only: the message names the default chains they never set
    ("reach", {"min_chains": 5}, ValueError,
     r"reach: min_chains=5 is more than chains=4 \(the default\); raise chains too"),
    ("reach", {"chains": 3, "min_chains": 4}, ValueError,
     r"reach: chains must be an integer >= min_chains=4, got 3"),
    ("n_iter", np.bool_(True), ValueError, "n_iter must be an integer >= 1"),
    ("alpha", np.bool_(True), ValueError, r"alpha must be in \(0, 1\]"),
    ("reference_solve", 3, TypeError, "reference_solve must be None, True or a dict"),
    ("reference_solve", {"steps": 3}, ValueError, r"reference_solve: unknown key\(s\)"),
    ("reference_solve", {"n_iter": 0}, ValueError, "reference_solve: n_iter must be"),
    ("blockwise", "no", TypeError, "blockwise must be True or False"),
    ("touched_rows", None, TypeError, "touched_rows must be True or False"),
    ("compile_steps", 0, TypeError, "compile_steps must be True or False"),
]
OWN_BAD = [
    (AverageSpec, "samples", 0, ValueError, "samples must be an integer >= 1"),
    (AverageSpec, "adaptive", "yes", TypeError, "adaptive must be True or False"),
    (WorstCaseSpec, "p", 3, ValueError, "p must be 2 or 'inf'"),
    (WorstCaseSpec, "adaptive", 1, TypeError, "adaptive must be True or False"),
    (AdaptiveSpec, "p", 1, ValueError, "p must be 2 or 'inf'"),
    (GeodesicSpec, "metric", "riemann", ValueError, "metric must be one of"),
    (GeodesicSpec, "order", 3, ValueError, "order"),
    (GeodesicSpec, "eps", -0.1, ValueError, "eps must be a finite number >= 0"),
    (GeodesicSpec, "eps", True, ValueError, "eps must be a finite number >= 0"),
    (GeodesicSpec, "other_metric", "inv", ValueError, "other_metric must be 'adaptive'"),
    (GeodesicSpec, "other_path", "curve", ValueError, "other_path must be one of"),
    (GeodesicSpec, "exact_steps", 0, ValueError, "exact_steps must be an integer >= 1"),
    (GeodesicSpec, "check_symmetry", "no", TypeError, "check_symmetry must be True or False"),
    # symmetries and diagonal: their structure, checked without the model, the value named
    (GeodesicSpec, "symmetries", "foo", ValueError, r"symmetries must be 'auto', 'none'.*'foo'"),
    (GeodesicSpec, "symmetries", None, TypeError, "symmetries must be .*got NoneType None"),
    (GeodesicSpec, "symmetries", 42, TypeError, "symmetries must be .*got int 42"),
    (GeodesicSpec, "symmetries", [], TypeError, r"symmetries: .*QuotientBinding.*got \[\]"),
    (GeodesicSpec, "symmetries", ["auto"], TypeError, r"symmetries: .*got \['auto'\]"),
    (GeodesicSpec, "diagonal", 3, TypeError, "diagonal must be None or a list of .* got 3"),
    (GeodesicSpec, "diagonal", "foo", TypeError, "diagonal must be None .* got 'foo'"),
    (GeodesicSpec, "diagonal", [("u",)], TypeError, r"diagonal must be .* got \[\('u',\)\]"),
    (GeodesicSpec, "diagonal", [("u", 1)], TypeError, r"diagonal must be .* got \[\('u', 1\)\]"),
    (RelativeFlatnessSpec, "rho", 0.1, ValueError, "relative_flatness has no radius"),
    (RelativeFlatnessSpec, "layer", 3, TypeError, "layer must be a module name"),
    (RelativeFlatnessSpec, "hvp_chunk", 0, ValueError, "hvp_chunk must be an integer >= 1"),
]
WITH_RHO = (AverageSpec, WorstCaseSpec, AdaptiveSpec, GeodesicSpec)
ASCENT_KINDS = (WorstCaseSpec, AdaptiveSpec, GeodesicSpec)
BAD = ([(kind, *case) for kind in WITH_RHO for case in COMMON_BAD]
       + [(RelativeFlatnessSpec, *case) for case in COMMON_BAD if case[0] != "rho"]
       + [(kind, *case) for kind in ASCENT_KINDS for case in ASCENT_BAD] + OWN_BAD)


@pytest.mark.parametrize(("kind", "field", "value", "error", "message"), BAD,
                         ids=[f"{k.name}-{f}-{v!r}"[:60] for k, f, v, _, _ in BAD])
def test_each_bad_value_fails_when_the_measure_is_made(kind, field, value, error, message
                                                       ) -> None:
    rho = None if kind is RelativeFlatnessSpec else 0.1
    given = {"rho": rho, field: value}
    with pytest.raises(error, match=message):
        kind(**given)
    # the string form says the same, through the same checks
    options = {k: v for k, v in given.items() if k != "rho"}
    with pytest.raises(error, match=message):
        measure_from(kind.name, given["rho"], options)


def test_the_discovery_only_check_of_other_path_needs_the_adaptive_metric() -> None:
    with pytest.raises(ValueError, match="needs other_metric='adaptive'"):
        GeodesicSpec(rho=0.1, other_path="geodesic", other_metric="euclidean")


def test_an_unknown_option_fails_by_the_type() -> None:
    with pytest.raises(TypeError, match="host_decisions"):
        GeodesicSpec(rho=0.1, host_decisions=False)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['p'\] for measure 'average'"):
        measure_from("average", 0.1, {"p": 2})
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['host_decisions'\]"):
        measure_from("geodesic", 0.1, {"host_decisions": False})
    with pytest.raises(ValueError, match="unknown measure 'sam'"):
        measure_from("sam", 0.1)


def test_a_measure_is_frozen_and_made_again_from_its_string_form() -> None:
    spec = GeodesicSpec(rho=torch.tensor(0.25), metric="mix", order="exact", n_iter=3,
                        reach={"chains": 3})
    assert spec.rho == 0.25 and type(spec.rho) is float          # a tensor stored as a float
    assert isinstance(spec, MeasureSpec) and spec.name == "geodesic"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.n_iter = 5  # type: ignore[misc]
    assert measure_from(spec.name, spec.rho, spec.options()) == spec
    assert measure_from("worst-case", 0.1) == WorstCaseSpec(rho=0.1)
    assert measure_from("relative-flatness") == RelativeFlatnessSpec()


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).double().eval()


def _batches():
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 4, generator=gen, dtype=torch.float64),
             torch.randint(0, 3, (8,), generator=gen)) for _ in range(2)]


def _attention() -> nn.Module:
    torch.manual_seed(0)
    return AttentionWithDiagonal().double().eval()


def _record(result) -> bytes:
    return pickle.dumps((result.value, result.per_batch, result.traces,
                         result.perturbation_norms, result.settings, list(result.settings)))


FORMS = [
    ("average", 0.1, {"samples": 2}, AverageSpec(rho=0.1, samples=2)),
    ("worst_case", 0.1, {"n_iter": 4, "p": "inf"}, WorstCaseSpec(rho=0.1, n_iter=4, p="inf")),
    ("adaptive", 0.1, {"n_iter": 4, "reference_solve": {"n_iter": 2}},
     AdaptiveSpec(rho=0.1, n_iter=4, reference_solve={"n_iter": 2})),
    ("geodesic", 0.1, {"n_iter": 4, "metric": "mix", "seed": 3},
     GeodesicSpec(rho=0.1, n_iter=4, metric="mix", seed=3)),
    ("geodesic", 0.1, {"n_iter": 4, "symmetries": "none", "blockwise": True},
     GeodesicSpec(rho=0.1, n_iter=4, symmetries="none", blockwise=True)),
    ("relative_flatness", None, {"hvp_chunk": 4}, RelativeFlatnessSpec(hvp_chunk=4)),
]


@pytest.mark.parametrize(("name", "rho", "options", "typed"), FORMS,
                         ids=[form[0] for form in FORMS])
def test_the_string_form_and_the_typed_form_measure_the_same(name, rho, options, typed
                                                             ) -> None:
    # an attention block, whose symmetries discovery finds, for the geodesic measure
    model, batches = ((_mlp, _batches) if name != "geodesic"
                      else (_attention, functools.partial(_token_batches, count=2)))
    by_name = qs.sharpness(model(), batches(), measure=name, rho=rho, progress=False,
                           **options)
    by_type = qs.sharpness(model(), batches(), dataclasses.replace(typed, progress=False))
    assert _record(by_name) == _record(by_type)
    assert by_type.measure == name and by_type.settings["rho"] == rho


def test_a_typed_measure_takes_no_further_rho_or_option() -> None:
    with pytest.raises(TypeError, match="holds rho and every option"):
        qs.sharpness(_mlp(), _batches(), AverageSpec(rho=0.1), rho=0.2)
    with pytest.raises(TypeError, match=r"options \['seed'\]"):
        qs.sharpness(_mlp(), _batches(), AverageSpec(rho=0.1), seed=1)


# (class, field, NumPy value, the Python value it is stored as)
NUMPY = [(kind, "rho", np.float32(0.1), float(np.float32(0.1))) for kind in WITH_RHO] + [
    (kind, "seed", np.uint64(2 ** 63), 2 ** 63) for kind in WITH_RHO] + [
    (kind, field, value, python) for kind in ASCENT_KINDS
    for field, value, python in (("n_iter", np.int64(3), 3), ("restarts", np.int8(1), 1),
                                 ("eta0", np.float64(0.2), 0.2), ("alpha", np.float32(0.5), 0.5))
] + [(AverageSpec, "samples", np.int32(2), 2), (GeodesicSpec, "eps", np.float16(0.5), 0.5),
     (GeodesicSpec, "exact_steps", np.int64(4), 4), (GeodesicSpec, "order", np.int64(2), 2),
     (RelativeFlatnessSpec, "hvp_chunk", np.uint8(8), 8)]


@pytest.mark.parametrize(("kind", "field", "value", "python"), NUMPY,
                         ids=[f"{k.name}-{f}-{v!r}" for k, f, v, _ in NUMPY])
def test_a_numpy_number_is_taken_and_stored_as_a_python_number(kind, field, value, python
                                                               ) -> None:
    rho = None if kind is RelativeFlatnessSpec else 0.1
    given = {"rho": rho, field: value}
    if field == "exact_steps":
        given["order"] = "exact"            # the only order it acts at
    spec = kind(**given)
    assert getattr(spec, field) == python and type(getattr(spec, field)) is type(python)
    assert spec == kind(**{**given, field: python})
    assert measure_from(kind.name, given.pop("rho"), given) == spec


@pytest.mark.parametrize("value", [0.1, 0.30000000000000004, 1e-300, 2 ** -1074, 7.0])
def test_a_python_float_is_kept_bit_for_bit(value: float) -> None:
    spec = GeodesicSpec(rho=value, eta0=value, eps=value, alpha=min(value, 1.0))
    for field in ("rho", "eta0", "eps"):
        assert getattr(spec, field).hex() == value.hex()
    assert type(GeodesicSpec(rho=0.1, eta0=2).eta0) is int      # recorded as given


def test_numpy_numbers_in_reach_and_reference_solve_are_python_numbers_in_the_settings(
        ) -> None:
    spec = AdaptiveSpec(rho=0.1, n_iter=np.int64(2), progress=False,
                        reach={"chains": np.int64(2), "target": np.float32(0.5)},
                        reference_solve={"n_iter": np.int64(3)})
    settings = qs.sharpness(_mlp(), _batches(), spec).settings
    assert settings["reach"]["chains"] == 2 and type(settings["reach"]["chains"]) is int
    assert type(settings["reach"]["target"]) is float
    assert type(settings["reference_solve"]["n_iter"]) is int and type(settings["n_iter"]) is int


SAME = [(AdaptiveSpec, {"p": 2}, {"p": "L2"}), (AdaptiveSpec, {"p": 2.0}, {"p": "2"}),
        (WorstCaseSpec, {"p": "inf"}, {"p": math.inf}), (WorstCaseSpec, {"p": "Linf"}, {}),
        (GeodesicSpec, {"geometry_dtype": "float64"}, {"geometry_dtype": torch.float64}),
        (GeodesicSpec, {"order": 2.0}, {"order": 2}),
        (AverageSpec, {"geometry_dtype": "float32"}, {"geometry_dtype": torch.float32})]


@pytest.mark.parametrize(("kind", "one", "other"), SAME, ids=[f"{k.name}-{o}" for k, o, _ in SAME])
def test_two_spellings_of_one_measure_compare_and_hash_equal(kind, one, other) -> None:
    if kind is WorstCaseSpec and not other:
        other = {"p": "inf"}
    first, second = kind(rho=0.1, **one), kind(rho=0.1, **other)
    assert first == second and hash(first) == hash(second)


def test_the_recorded_p_is_the_same_for_every_spelling() -> None:
    records = [_record(qs.sharpness(_mlp(), _batches(), AdaptiveSpec(
        rho=0.1, p=p, n_iter=2, reach=False, progress=False))) for p in (2, 2.0, "2", "L2")]
    assert records[1:] == records[:-1]


def test_replace_checks_again_and_a_dict_or_binding_field_is_not_hashable() -> None:
    spec = GeodesicSpec(rho=0.1)
    assert dataclasses.replace(spec, rho=0.2).rho == 0.2
    with pytest.raises(ValueError, match="rho must be a finite number > 0"):
        dataclasses.replace(spec, rho=-1.0)
    with pytest.raises(TypeError, match="diagonal must be None"):
        dataclasses.replace(spec, diagonal=3)
    hash(spec)
    with pytest.raises(TypeError, match="unhashable"):
        hash(dataclasses.replace(spec, reach={"chains": 3}))


def _warnings_of(call) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return list(caught)


def _no_symmetry() -> None:
    qs.sharpness(_mlp(), _batches(), GeodesicSpec(rho=0.1, n_iter=2, reach=False,
                                                  progress=False))


def _unconfirmed() -> None:
    from test_search_reach import DUMMY, TwoModes
    qs.sharpness(TwoModes(), DUMMY, measure="worst_case", rho=0.5, progress=False,
                 loss=lambda output, target: output, reach={"chains": 2, "continuations": 0})


def _skipped_nonfinite() -> None:
    from test_measures import _Exploding
    x, y = torch.ones(4, 2), torch.tensor([0, 1, 0, 1])
    qs.sharpness(_Exploding(0.5), [(x, y)], measure="average", rho=0.5, samples=40,
                 progress=False, nonfinite="skip")


WARNS = [(_no_symmetry, qs.NoSymmetryWarning, "equals adaptive"),
         (_unconfirmed, qs.ReachWarning, "reach estimate"),
         (_skipped_nonfinite, UserWarning, "perturbed evaluation")]


@pytest.mark.parametrize(("call", "category", "message"), WARNS,
                         ids=[c.__name__ for c, _, _ in WARNS])
def test_a_warning_of_sharpness_points_at_the_callers_line(call, category, message) -> None:
    found = [w for w in _warnings_of(call) if issubclass(w.category, category)
             and message in str(w.message)]
    assert found
    for w in found:
        # this file, at the line of the sharpness() call (not a line of the package)
        assert w.filename == __file__, (w.filename, w.lineno)
        assert "qs.sharpness(" in linecache.getline(__file__, w.lineno)


@pytest.mark.parametrize(("options", "pattern"), [
    ({"metric": "euclidean", "eps": 0.5}, r"eps=0\.5 relaxes the Gram matrices .* leave eps at 0"),
    ({"order": 2, "exact_steps": 4}, r"exact_steps=4 sets the RK4 steps of order='exact' only"),
    ({"order": 1, "exact_steps": 64}, r"at order=1 it changes nothing"),
    ({"order": 1, "other_path": "geodesic"},
     r"^other_path='geodesic' curves .* at order=1 every factor moves on its line .* leave "
     r"other_path at 'line'$"),
    ({"symmetries": "none", "metric": "mix"},
     r"^metric='mix' sets the quotients of the symmetries; symmetries='none' puts every "
     r"parameter in the adaptive factor, where it changes nothing: leave metric at 'inv'$"),
    ({"symmetries": "none", "eps": 0.5}, r"^eps=0\.5 sets .* leave eps at 0\.0$"),
    ({"symmetries": "none", "metric": "mix", "eps": 0.5, "diagonal": [("u", "v")]},
     r"^metric='mix', eps=0\.5, diagonal=\[\('u', 'v'\)\] set the quotients .* where they "
     r"change nothing: leave metric at 'inv', eps at 0\.0, diagonal at None$")])
def test_an_option_the_others_leave_without_effect_is_refused(options, pattern) -> None:
    # it was recorded in the settings and changed no value
    with pytest.raises(ValueError, match=pattern):
        GeodesicSpec(rho=0.1, **options)
    assert GeodesicSpec(rho=0.1, metric="euclidean").eps == 0
    assert GeodesicSpec(rho=0.1, order="exact", exact_steps=4).exact_steps == 4
    # the defaults, given, are no refusal; the curved path counts at order 2
    assert GeodesicSpec(rho=0.1, symmetries="none", metric="inv", eps=0).metric == "inv"
    assert GeodesicSpec(rho=0.1, order=2, other_path="geodesic").other_path == "geodesic"
