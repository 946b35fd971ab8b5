"""The configurations of the paper's studies check themselves when made.

Every field of every class of :mod:`quotientsharp.reproduce.config`: a wrong type (a bool for
an integer included) raises ``TypeError``, a value out of range ``ValueError``, each naming the
field; lists come from a sequence or a comma-separated string alike; each study's ``run``
refuses another configuration class.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quotientsharp.reproduce.config import (
    DiagonalConfig,
    FamilyConfig,
    InvarianceConfig,
    ReachConfig,
    ReproduceConfig,
    SummaryConfig,
)

CLASSES = [ReproduceConfig, DiagonalConfig, FamilyConfig, InvarianceConfig, ReachConfig,
           SummaryConfig]
#: Integer fields -> their minimum, per class (the base's fields in every class).
BASE_INTEGERS = {"threads": 1, "seed": 0}
INTEGERS = {
    ReproduceConfig: BASE_INTEGERS,
    DiagonalConfig: {**BASE_INTEGERS, "nets": 2, "per_net_seeds": 0},
    FamilyConfig: {**BASE_INTEGERS, "models": 2, "study_seeds": 1, "n_iter": 1,
                   "sharpness_points": 1, "sharpness_batch_size": 1},
    InvarianceConfig: BASE_INTEGERS,
    ReachConfig: BASE_INTEGERS,
}
BASE_FLAGS = ("resume", "plots", "quick", "progress")
FLAGS = {ReproduceConfig: BASE_FLAGS, DiagonalConfig: (*BASE_FLAGS, "full"),
         FamilyConfig: BASE_FLAGS, InvarianceConfig: BASE_FLAGS,
         ReachConfig: ("resume", "quick")}
PATHS = {cls: ("out", "docs") for cls in (ReproduceConfig, DiagonalConfig, FamilyConfig,
                                          InvarianceConfig, ReachConfig)}
PATHS[SummaryConfig] = ("docs",)

INTEGER_CASES = [(cls, name, low) for cls, fields in INTEGERS.items()
                 for name, low in fields.items()]
FLAG_CASES = [(cls, name) for cls, names in FLAGS.items() for name in names]
PATH_CASES = [(cls, name) for cls, names in PATHS.items() for name in names]
MEASURE_KEYS = ["adaptive", "worst_case", "geodesic_inv_o1", "geodesic_inv_o2",
                "geodesic_mix_o1", "geodesic_mix_o2"]
DTYPE_NAMES = ["float64", "float32", "bfloat16"]


@pytest.mark.parametrize("cls", CLASSES)
def test_defaults_are_accepted(cls):
    config = cls()
    assert config == cls(**{field.name: getattr(config, field.name)
                            for field in dataclasses.fields(cls)})


@pytest.mark.parametrize(("cls", "name", "low"), INTEGER_CASES)
@given(value=st.integers(min_value=-10**6, max_value=10**6))
def test_integer_fields_need_an_integer_at_least_their_minimum(cls, name, low, value):
    from quotientsharp.core.scalars import thread_limit

    if name == "threads" and value > thread_limit():
        # more than 4 per CPU only oversubscribe the cores (and far more crash torch)
        with pytest.raises(ValueError, match=f"^threads must be at most {thread_limit()}"):
            cls(**{name: value})
    elif value >= low:
        assert getattr(cls(**{name: value}), name) == value
    else:
        with pytest.raises(ValueError, match=f"^{name} must be an integer >= {low}"):
            cls(**{name: value})


@pytest.mark.parametrize(("cls", "name", "low"), INTEGER_CASES)
@pytest.mark.parametrize("bad", [True, False, 1.0, "1", [1]])
def test_integer_fields_refuse_other_types(cls, name, low, bad):
    with pytest.raises(TypeError, match=f"^{name} must be an integer >= {low}"):
        cls(**{name: bad})


@pytest.mark.parametrize(("cls", "name"), FLAG_CASES)
@pytest.mark.parametrize("bad", ["no", "", 0, 1, 1.0])
def test_flags_need_a_bool(cls, name, bad):
    with pytest.raises(TypeError, match=f"^{name} must be True or False"):
        cls(**{name: bad})


def test_progress_may_be_none_the_other_flags_not():
    assert ReproduceConfig(progress=None).progress is None
    with pytest.raises(TypeError, match="^quick"):
        ReproduceConfig(quick=None)


@pytest.mark.parametrize(("cls", "name"), PATH_CASES)
def test_paths_are_stored_as_paths(cls, name):
    assert getattr(cls(**{name: "a/b"}), name) == Path("a/b")
    assert getattr(cls(**{name: Path("a/b")}), name) == Path("a/b")
    with pytest.raises(TypeError, match=f"^{name} must be a path"):
        cls(**{name: 3})


@pytest.mark.parametrize(("bad", "error"), [(None, TypeError), (3, TypeError), ("", ValueError)])
def test_device_must_be_a_name(bad, error):
    with pytest.raises(error, match="^device"):
        FamilyConfig(device=bad)


def _spellings(entries: list[str]) -> list[object]:
    """The same list as a list, a tuple and comma strings with spaces and a trailing comma."""
    return [entries, tuple(entries), ",".join(entries), " , ".join(entries) + ","]


@given(st.lists(st.sampled_from(MEASURE_KEYS), min_size=1, unique=True))
def test_measures_from_a_list_or_a_comma_string_alike(keys):
    for spelling in _spellings(keys):
        assert InvarianceConfig(measures=spelling).measures == tuple(keys)


@given(st.lists(st.sampled_from(DTYPE_NAMES), min_size=1, unique=True))
def test_dtypes_from_a_list_or_a_comma_string_alike(names):
    for spelling in _spellings(names):
        assert InvarianceConfig(dtypes=spelling).dtypes == tuple(names)


@given(st.lists(st.floats(min_value=1e-6, max_value=1e3), min_size=1))
def test_rhos_from_a_list_or_a_comma_string_alike(radii):
    for spelling in _spellings([repr(r) for r in radii]) + [radii]:
        assert DiagonalConfig(rhos=spelling).rhos == tuple(radii)


@pytest.mark.parametrize(("name", "bad", "error"), [
    ("measures", "adaptive,sharpest", ValueError), ("measures", ",", ValueError),
    ("measures", [1], TypeError), ("dtypes", "float16", ValueError),
    ("dtypes", "float64,float64", ValueError), ("dtypes", "", ValueError),
    ("dtypes", 64, TypeError)])
def test_bad_names_are_refused_naming_the_field(name, bad, error):
    with pytest.raises(error, match=f"^{name}"):
        InvarianceConfig(**{name: bad})


@pytest.mark.parametrize(("bad", "error"), [
    ("0.1,x", ValueError), ([0.1, 0.0], ValueError), ([-1.0], ValueError),
    ([float("inf")], ValueError), ([float("nan")], ValueError), ([], ValueError),
    ([True], TypeError), (0.1, TypeError)])
def test_bad_rhos_are_refused_naming_the_field(bad, error):
    with pytest.raises(error, match="^rhos"):
        DiagonalConfig(rhos=bad)


@pytest.mark.parametrize(("cls", "name", "value"), [
    (ReachConfig, "plots", False), (ReachConfig, "progress", True),
    (ReachConfig, "device", "cuda"), (SummaryConfig, "out", Path("x")),
    (SummaryConfig, "threads", 2), (SummaryConfig, "quick", True)])
def test_fields_a_study_does_not_use_are_refused(cls, name, value):
    with pytest.raises(ValueError, match=f"^{name}: {cls.__name__} does not use it"):
        cls(**{name: value})


@pytest.mark.parametrize(("study", "expected"), [
    ("diagonal", "DiagonalConfig"), ("vit", "FamilyConfig"), ("bert", "FamilyConfig"),
    ("minilm", "FamilyConfig"), ("vit-finetune", "FamilyConfig"), ("lora", "FamilyConfig"),
    ("invariance", "InvarianceConfig"), ("reach", "ReachConfig"),
    ("summary", "SummaryConfig")])
def test_run_refuses_another_configuration_class(study, expected):
    from quotientsharp.reproduce import load_study

    other = DiagonalConfig() if expected != "DiagonalConfig" else FamilyConfig()
    with pytest.raises(TypeError, match=f"run takes a {expected}, got {type(other).__name__}"):
        load_study(study).run(other)


def test_the_command_line_names_the_option():
    from quotientsharp.cli.reproduce_options import study_config

    with pytest.raises(ValueError, match="^n-iter must be an integer >= 1, got 0"):
        study_config(argparse.Namespace(study="vit", n_iter=0))
    with pytest.raises(ValueError, match="^per-net-seeds must be an integer >= 0, got -1"):
        study_config(argparse.Namespace(study="diagonal", per_net_seeds=-1))


@pytest.mark.parametrize("option, value", [("rhos", "0.1,0.5"), ("per_net_seeds", 2)])
def test_the_options_of_full_without_full_are_refused(option, value):
    # the run went on without the rho sweep or the training set per net, exit status 0
    from quotientsharp.cli.reproduce_options import study_config

    flag = "--" + option.replace("_", "-")
    with pytest.raises(ValueError, match=f"^{flag} applies with --full only"):
        study_config(argparse.Namespace(study="diagonal", **{option: value}))
    config = study_config(argparse.Namespace(study="diagonal", full=True, **{option: value}))
    assert config.full and getattr(config, option) is not None


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("name", ["out", "docs"])
def test_an_empty_path_is_refused(cls, name):
    # Path("") is the working directory: --out '' wrote the results there, exit status 0
    if name in cls.IGNORED:
        return
    with pytest.raises(ValueError, match=f"^{name} needs a folder path, got ''"):
        cls(**{name: ""})


def test_more_threads_than_4_per_cpu_are_refused(monkeypatch):
    # --threads 100000 crashed the run with a segmentation fault, no message
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert ReproduceConfig(threads=8).threads == 8
    with pytest.raises(ValueError, match=r"^threads must be at most 8 \(4 per CPU; this "
                                         r"machine has 2\), got 9"):
        ReproduceConfig(threads=9)


@pytest.mark.parametrize("arguments, message", [
    (["--out", ""], "out needs a folder path, got ''"),
    (["--dist-timeout=-5"], "argument --dist-timeout: must be a finite number of seconds > 0 "
                            "(at least a microsecond, at most 999999999 days), got '-5'"),
    (["--dist-timeout", "0"], "argument --dist-timeout: must be a finite number of seconds > 0"),
    # torch waits for a timedelta: 1e-300 s is zero there, 1e300 s overflows it (a traceback
    # under torchrun)
    (["--dist-timeout", "1e-300"], "argument --dist-timeout: must be a finite number of "
                                   "seconds > 0 (at least a microsecond"),
    (["--dist-timeout", "1e300"], "argument --dist-timeout: must be a finite number of "
                                  "seconds > 0 (at least a microsecond"),
])
def test_the_command_line_refuses_an_empty_out_and_a_timeout_of_no_time(arguments, message,
                                                                         tmp_path, capsys,
                                                                         monkeypatch):
    # both were accepted: the results went to the working directory, the timeout was ignored
    from quotientsharp.cli import main

    monkeypatch.chdir(tmp_path)
    try:
        code = main(["reproduce", "diagonal", "--quick", *arguments])
    except SystemExit as err:         # argparse's refusal
        code = err.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []
