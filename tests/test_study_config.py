"""The settings of ``quotientsharp study`` check themselves when made (from Python): every
field's bad value (a wrong type, a bool for a number, a number out of range) raises
``InputError`` naming the field; good values normalise as before; the command line names its
options instead."""

from __future__ import annotations

import argparse
import dataclasses
import math
import re

import pytest

from quotientsharp.workflows import (
    BatchSettings,
    BootstrapSettings,
    InputError,
    SolverSettings,
    StudyConfig,
    run_study,
)

# (field, a value the field refuses); each of the settings' classes on its own
INTEGERS = {
    BatchSettings: {"batch_size": 1, "max_batches": 1, "max_length": 1},
    SolverSettings: {"n_iter": 1, "reference_n_iter": 1, "reference_restarts": 0},
    BootstrapSettings: {"resamples": 0, "seed": 0},
}
FLAGS = {SolverSettings: ("blockwise", "compile_steps")}


def _study(**fields):
    return StudyConfig(**{"data": "data.pt", "rho": 0.1, **fields})


@pytest.mark.parametrize("kind, name, minimum", [
    (kind, name, minimum) for kind, names in INTEGERS.items()
    for name, minimum in names.items()])
@pytest.mark.parametrize("bad", ["3", 2.5, True, "minimum - 1"])
def test_every_integer_of_the_parts_refuses_a_bad_value(kind, name, minimum, bad):
    value = minimum - 1 if bad == "minimum - 1" else bad
    field = f"{kind.__name__}.{name}"
    with pytest.raises(InputError, match=f"^{re.escape(field)} must be an integer >= {minimum}, "
                       f"got {re.escape(repr(value))}$"):
        kind(**{name: value})
    assert getattr(kind(**{name: minimum}), name) == minimum


@pytest.mark.parametrize("name, minimum", [("samples", 1), ("seed", 0), ("threads", 1)])
@pytest.mark.parametrize("bad", ["1", 1.5, True, None, "minimum - 1"])
def test_every_integer_of_the_config_refuses_a_bad_value(name, minimum, bad):
    if bad is None and name == "threads":
        assert _study(threads=None).threads is None            # torch's default
        return
    if bad is None and name == "samples":
        assert _study(samples=None).samples == 1                # not given: the default
        return
    value = minimum - 1 if bad == "minimum - 1" else bad
    bounds = "in [0, 2**64)" if name == "seed" else f">= {minimum}"     # the engine's seeds
    with pytest.raises(InputError, match=f"^{name} must be an integer {re.escape(bounds)}, got "
                       f"{re.escape(repr(value))}$"):
        _study(**{name: value})


@pytest.mark.parametrize("name", ["resume", "plots", "progress"])
@pytest.mark.parametrize("bad", ["no", 0, 1, "False"])
def test_every_flag_is_a_bool(name, bad):
    with pytest.raises(InputError, match=f"^{name} must be True or False"):
        _study(**{name: bad})
    assert getattr(_study(**{name: False}), name) is False


@pytest.mark.parametrize("kind, name", [(k, n) for k, names in FLAGS.items() for n in names])
def test_every_flag_of_the_solver_is_a_bool(kind, name):
    with pytest.raises(InputError, match=f"^SolverSettings.{name} must be True or False"):
        kind(**{name: "yes"})


@pytest.mark.parametrize("fields, message", [
    ({"measures": []}, "measures must not be empty"),
    ({"measures": [object()]}, "measures must be measure names"),
    ({"measures": "sam"}, "measures: unknown measure 'sam'"),
    ({"metrics": []}, "metrics must not be empty"),
    ({"metrics": "mix,riemann"}, "metrics must be inv, mix or euclidean"),
    ({"metrics": [1]}, "metrics must be inv, mix or euclidean"),
    ({"orders": []}, "orders must not be empty"),
    ({"orders": [True]}, "orders must be 1, 2 or 'exact'"),
    ({"orders": "1,3"}, "orders must be 1, 2 or 'exact'"),
    ({"rho": []}, "rho is required for geodesic"),
    ({"rho": [True]}, "rho must be a number"),
    ({"rho": "0.1,x"}, "rho must be a number or a comma list of numbers, got 'x'"),
    ({"rho": [0.1, math.inf]}, "rho must be a finite number > 0, got inf"),
    ({"rho": 0}, "rho must be a finite number > 0, got 0"),
    ({"rho": {"a": 1}}, "rho must be a value, a comma list or a list"),
    ({"eps": "x"}, "eps must be a finite number >= 0, got 'x'"),
    ({"eps": True}, "eps must be a finite number >= 0, got True"),
    ({"eps": -1e-3}, "eps must be a finite number >= 0"),
    ({"p": 3}, "p must be 2 or 'inf'"),
    ({"p": True}, "p must be 2 or 'inf'"),
    ({"dtype": "float16"}, "dtype must be float32 or float64"),
    ({"device": None}, "device must be a string"),
    ({"symmetry": 3}, "symmetry must be a string"),
    ({"layer": 3}, "layer must be a string"),
    ({"color": 3}, "color must be a string"),
    ({"data": 3}, "data must be a string or a path"),
    ({"out": 3}, "out must be a string or a path"),
    ({"gap_from": "accuracy"}, "gap_from must be error or loss"),
    ({"gap_from": "error", "batches": BatchSettings(loss="mse")},
     "gap_from error needs class labels"),
    ({"batches": {"batch_size": 8}}, "batches must be a BatchSettings, got dict"),
    ({"solver": {"n_iter": 3}}, "solver must be a SolverSettings, got dict"),
    ({"bootstrap": {"resamples": 0}}, "bootstrap must be a BootstrapSettings, got dict"),
    ({"measures": "average", "solver": SolverSettings(blockwise=True)},
     "SolverSettings.blockwise needs an ascent measure"),
    # no measure would take them: each was ignored without a word
    ({"measures": "average,relative_flatness", "solver": SolverSettings(n_iter=5)},
     "SolverSettings.n_iter needs an ascent measure"),
    ({"measures": "relative_flatness", "rho": 0.2},
     "rho applies to every measure but relative_flatness"),
    ({"symmetry": "mine:bind", "metrics": "inv,mix"}, "metrics inv,mix: with symmetry"),
    # one column key for two radii: the second's values overwrote the first's
    ({"rho": [0.1, 0.1000001]},
     "rho gives 0.1 and 0.1000001, which the outputs both name rho0.1"),
    ({"rho": "1e-7,1.0000001e-7"}, "rho gives 1e-07 and 1.0000001e-07, which the outputs"),
])
def test_a_bad_field_is_named_when_the_config_is_made(fields, message):
    with pytest.raises(InputError, match=f"^{re.escape(message)}"):
        _study(**fields)


@pytest.mark.parametrize("fields, message", [
    ({"loss": "hinge"}, "BatchSettings.loss must be cross_entropy or mse"),
    ({"tokenizer": 3}, "BatchSettings.tokenizer must be a string or a path"),
])
def test_the_batch_settings_name_their_fields(fields, message):
    with pytest.raises(InputError, match=f"^{re.escape(message)}"):
        BatchSettings(**fields)


@pytest.mark.parametrize("confidence", [0, 1, 1.5, True, "0.9", None])
def test_the_bootstrap_confidence_is_a_number_in_the_open_unit_interval(confidence):
    with pytest.raises(InputError, match=r"^BootstrapSettings.confidence must be a number in "
                       r"\(0, 1\)"):
        BootstrapSettings(confidence=confidence)
    assert BootstrapSettings(confidence=0.9).confidence == 0.9


def test_good_values_normalise_as_before():
    config = _study(measures="worst-case, geodesic,worst_case", rho=[1, 0.5, 1.0], p=math.inf,
                    orders=["1", 2, "exact", 1], eps=0, metrics="mix, inv", resume=True,
                    threads=2, progress=None)
    assert config.measures == ("worst_case", "geodesic")
    assert config.rho == config.radii == (1.0, 0.5)
    assert all(type(rho) is float for rho in config.radii)
    assert config.p == "inf" and config.orders == (1, 2, "exact")
    assert config.eps == 0.0 and type(config.eps) is float
    assert config.metrics == ("mix", "inv") and config.resume is True and config.threads == 2
    # a comma list of radii reads as a list of numbers, and measures and orders alike
    assert _study(rho="0.05, 0.1").radii == (0.05, 0.1)
    assert _study(measures=["adaptive,geodesic"]).measures == ("adaptive", "geodesic")
    assert _study(orders="2,1").orders == (2, 1)
    assert _study(orders=1).orders == (1,) and _study(metrics="mix").metrics == ("mix",)
    # the defaults
    default = _study()
    assert default.measures == ("geodesic",) and default.metrics == ("inv",)
    assert default.orders == (2,) and default.p == "2" and default.gap_kind == "error"
    assert _study(measures=None).measures == ("geodesic",)
    assert StudyConfig(data="data.pt", measures="relative_flatness").radii == ()
    assert BatchSettings(tokenizer=None).tokenizer is None
    solver = SolverSettings(reference_n_iter=None, reference_restarts=0)
    assert solver.reference_restarts == 0 and solver.options()["reference_solve"] == {
        "restarts": 0}


def test_run_study_refuses_what_is_not_a_study_config():
    namespace = argparse.Namespace(data="data.pt", rho="0.1")
    with pytest.raises(TypeError, match="^run_study takes a StudyConfig, got Namespace$"):
        run_study("models.csv", namespace)


def test_the_command_line_names_the_options_not_the_fields():
    from quotientsharp.cli.study import add_arguments, study_config

    parser = argparse.ArgumentParser()
    add_arguments(parser)

    def error(*arguments: str) -> str:
        args = parser.parse_args(["models.csv", "--data", "data.pt", *arguments])
        with pytest.raises(InputError) as info:
            study_config(args)
        return str(info.value)

    assert error("--bootstrap-seed", "-1") == "--bootstrap-seed must be an integer >= 0, got -1"
    assert error("--rho", "0.1", "--batch-size", "0").startswith("--batch-size must be")
    assert error("--rho", "-1") == "--rho must be a finite number > 0, got -1.0"
    assert error("--rho", "0.1,x").startswith("--rho must be a number or a comma list")
    assert error("--rho", "0.05,0.0500000001").startswith("--rho gives 0.05 and 0.0500000001")
    assert error().startswith("--rho is required for geodesic")
    assert error("--rho", "0.1", "--metric", "mix,riemann").startswith("--metric must be")
    assert error("--rho", "0.1", "--gap-from", "error", "--loss", "mse") == (
        "--gap-from error needs class labels (--loss cross_entropy); with --loss mse use "
        "--gap-from loss")
    # and outside the command line, the fields again
    with pytest.raises(InputError, match="^BootstrapSettings.seed must be"):
        BootstrapSettings(seed=-1)


@pytest.mark.parametrize("fields", [dict(rho=10 ** 400), dict(rho=0.1, eps=10 ** 400),
                                    dict(rho=[0.1, 10 ** 400])])
def test_an_integer_beyond_float64_is_refused_by_name(fields):
    # float() of such an integer raises an OverflowError that names no field
    name = "eps" if "eps" in fields else "rho"
    with pytest.raises(InputError, match=f"^{name} must be"):
        StudyConfig(data="data.pt", **fields)


@pytest.mark.parametrize("fields, message", [
    ({"measures": "adaptive", "metrics": "mix"}, "metrics applies to geodesic only"),
    ({"measures": "adaptive", "orders": "exact"}, "orders applies to geodesic only"),
    ({"measures": "worst_case", "eps": 0.1}, "eps applies to geodesic only"),
    ({"measures": "adaptive", "symmetry": "mine:bind"}, "symmetry applies to geodesic only"),
    ({"measures": "geodesic", "p": math.inf}, "p applies to worst_case and adaptive only"),
    ({"measures": "geodesic,adaptive", "samples": 3}, "samples applies to average only"),
    ({"measures": "average", "layer": "head"}, "layer applies to relative_flatness only"),
    # relative flatness perturbs nothing: there is no NaN or inf perturbed loss to skip
    ({"measures": "relative_flatness", "rho": None, "nonfinite": "skip"},
     "nonfinite applies to average, worst_case, adaptive and geodesic only"),
])
def test_an_option_of_measures_not_measured_is_refused(fields, message):
    with pytest.raises(InputError, match=f"^{re.escape(message)}, and measures gives "):
        _study(**fields)


def test_from_python_a_default_value_is_not_an_option_given():
    # so that dataclasses.replace of a checked configuration, which passes every field on,
    # checks again instead of refusing the defaults the first check filled in
    config = _study(measures="adaptive", metrics="inv", orders=2, eps=0, samples=1, p="2")
    assert (config.metrics, config.orders, config.eps, config.samples) == (("inv",), (2,), 0.0, 1)
    geodesic = _study()
    assert dataclasses.replace(geodesic, rho=0.2).radii == (0.2,)
    assert dataclasses.replace(_study(measures="worst_case", p="inf"), rho=0.2).p == "inf"
    with pytest.raises(InputError, match="^p applies to worst_case and adaptive only"):
        dataclasses.replace(geodesic, p="inf")


def test_the_command_line_refuses_an_option_given_for_no_measure_measured(capsys):
    from quotientsharp.cli import main
    from quotientsharp.cli.study import add_arguments, study_config

    parser = argparse.ArgumentParser()
    add_arguments(parser)

    def error(*arguments: str) -> str:
        args = parser.parse_args(["models.csv", "--data", "data.pt", "--rho", "0.1", *arguments])
        with pytest.raises(InputError) as info:
            study_config(args)
        return str(info.value)

    assert error("--measure", "adaptive", "--metric", "mix") == (
        "--metric applies to geodesic only, and --measure gives adaptive: add geodesic to "
        "--measure, or leave --metric out")
    # on the command line an option given is given, even at its default
    assert error("--p", "2").startswith("--p applies to worst_case and adaptive only")
    assert error("--measure", "average", "--order", "2").startswith("--order applies to")
    # --nonfinite skip with relative flatness alone was accepted and changed nothing
    args = parser.parse_args(["models.csv", "--data", "data.pt", "--measure",
                              "relative_flatness", "--nonfinite", "skip"])
    with pytest.raises(InputError, match="^--nonfinite applies to average, worst_case, "
                                         "adaptive and geodesic only, and --measure gives "
                                         "relative_flatness: add average, worst_case, adaptive "
                                         "or geodesic to --measure"):
        study_config(args)
    # the whole command: one line, exit status 2, before any file is read
    assert main(["study", "absent.csv", "--data", "absent.pt", "--rho", "0.1", "--measure",
                 "adaptive", "--samples", "4"]) == 2
    captured = capsys.readouterr()
    assert captured.err == ("quotientsharp study: error: --samples applies to average only, "
                            "and --measure gives adaptive: add average to --measure, or leave "
                            "--samples out\n")


def test_nonfinite_is_raise_or_skip_and_reaches_every_measure():
    from quotientsharp.workflows.options import measure_runs, options_for

    with pytest.raises(InputError, match="^nonfinite must be raise or skip, got 'ignore'$"):
        _study(nonfinite="ignore")
    config = _study(measures="average,adaptive,geodesic,relative_flatness", nonfinite="skip")
    assert {options_for(run, config)["nonfinite"] for run in measure_runs(config)} == {"skip"}
    assert _study().nonfinite == "raise"


def test_the_measures_checked_without_torch_are_the_engines():
    from quotientsharp.engine import MEASURES
    from quotientsharp.workflows.labels import MEASURE_NAMES
    from quotientsharp.workflows.options import measure_names

    assert list(MEASURE_NAMES) == list(MEASURES)
    for name in MEASURES:
        assert measure_names(name) == [name]


def test_an_empty_out_and_too_many_threads_are_refused(monkeypatch):
    # --out '' wrote the results into the working directory; --threads 100000 crashed torch
    with pytest.raises(InputError, match="^out needs a folder path, got ''"):
        _study(out="")
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert _study(threads=8).threads == 8
    with pytest.raises(InputError, match=r"^threads must be at most 8 \(4 per CPU"):
        _study(threads=9)


@pytest.mark.parametrize("value", ["0", "-5", "inf", "nan", "soon"])
def test_the_command_line_refuses_a_dist_timeout_of_no_time(value, capsys):
    # --dist-timeout 0 was accepted (and, under torchrun, a collective could not wait at all)
    from quotientsharp.cli import main

    with pytest.raises(SystemExit) as info:
        main(["study", "models.csv", "--data", "data.pt", "--rho", "0.1",
              f"--dist-timeout={value}"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1
    assert (f"error: argument --dist-timeout: must be a finite number of seconds > 0 (at "
            f"least a microsecond, at most 999999999 days), got {value!r}") in err
