"""``quotientsharp verify --quotient MODULE:NAME`` on a user's quotient, and the "no override"
rows of the check table.

The user's module is written to a temporary working directory, as a user would keep it next to
their script; every bad input gets one line on stderr that names the flag, and exit status 2.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from quotientsharp.cli import main

ROOT = Path(__file__).resolve().parents[1]

# the tutorial's ReLU-neuron quotient, with point shapes so that it builds without arguments,
# and two closed forms: a right one and a Christoffel contraction with one sign flipped
USER_MODULE = textwrap.dedent('''
    import quotientsharp as qs
    from quotientsharp.core import reference


    class Neuron(qs.SymmetryQuotient):
        name = "relu-neuron"
        point_ndims = (1, 1)

        def __init__(self, point_shapes=((4,), (3,))):
            super().__init__(point_shapes)

        def inner(self, x, u, v):
            return ((u[0] * v[0]).sum(-1) / x[0].square().sum(-1)
                    + (u[1] * v[1]).sum(-1) / x[1].square().sum(-1))

        def vertical(self, x, a):
            return a * x[0], -a * x[1]

        def act(self, x, g):
            return g * x[0], x[1] / g

        def algebra_shape(self, x):
            return (1,)


    class RightProjection(Neuron):
        def horizontal_projection(self, x, u):
            w_in, w_out = x
            a = ((u[0] * w_in).sum(-1) / w_in.square().sum(-1)
                 - (u[1] * w_out).sum(-1) / w_out.square().sum(-1)) / 2
            a = a.unsqueeze(-1)
            return u[0] - a * w_in, u[1] + a * w_out


    class WrongChristoffel(Neuron):
        def christoffel(self, x, u, v=None):
            gamma = reference.christoffel(self, x, u, v)
            return gamma[0], -gamma[1]          # the sign of the w_out term flipped


    instance = Neuron()
    no_shapes = Neuron(point_shapes=None)


    def make_wrong():
        return WrongChristoffel()


    def make_number():
        return 3


    class NeedsArguments(Neuron):
        def __init__(self, width):
            super().__init__(((width,), (3,)))


    class NotAQuotient:
        pass
''')

_names = itertools.count()


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A fresh module name in a temporary working directory (sys.path restored afterwards)."""
    name = f"user_quotients_{next(_names)}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield name
    sys.modules.pop(name, None)


def verify(*argv: str) -> int:
    return main(["verify", "--seeds", "1", "--dtype", "float64", *argv])


def table_rows(text: str) -> dict[str, str]:
    """``{check name: status}`` from a printed check table."""
    rows = {}
    for line in text.splitlines():
        if "(tol/expected" in line:
            rows[line.split()[0]] = line.rsplit(")", 1)[1].strip()
    return rows


@pytest.mark.parametrize("attribute", ["Neuron", "instance", "RightProjection"])
def test_a_correct_user_quotient_passes(user_module, capsys, attribute) -> None:
    assert verify("--quotient", f"{user_module}:{attribute}") == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert rows and "FAIL" not in rows.values()
    assert " 0 failed" in out


def test_defaults_compared_with_themselves_say_no_override(user_module, capsys) -> None:
    assert verify("--quotient", f"{user_module}:Neuron") == 0
    rows = table_rows(capsys.readouterr().out)
    for check in ("horizontal_projection_vs_reference", "christoffel_vs_reference",
                  "christoffel_quadratic_vs_reference", "gradient_vs_reference"):
        assert rows[check] == "no override", (check, rows[check])
    assert rows["metric_invariance"] == "pass"
    # an override is compared, and then passes as a check
    assert verify("--quotient", f"{user_module}:RightProjection") == 0
    rows = table_rows(capsys.readouterr().out)
    assert rows["horizontal_projection_vs_reference"] == "pass"
    assert rows["christoffel_vs_reference"] == "no override"


def test_a_wrong_christoffel_override_fails_with_a_nonzero_status(user_module, capsys) -> None:
    assert verify("--quotient", f"{user_module}:make_wrong") == 1
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert rows["christoffel_vs_reference"] == "FAIL"
    assert rows["christoffel_quadratic_vs_reference"] == "FAIL"
    assert rows["metric_invariance"] == "pass"           # only what is wrong fails
    assert " 0 failed" not in out


def test_several_quotients_and_json(user_module, tmp_path, capsys) -> None:
    out = tmp_path / "rows.json"
    code = verify("--quotient", f"{user_module}:Neuron", "--quotient",
                  f"{user_module}:WrongChristoffel", "--json", str(out))
    assert code == 1
    rows = json.loads(out.read_text())
    statuses = {(r["quotient"], r["name"]): r["status"] for r in rows}
    assert statuses[("relu-neuron", "christoffel_vs_reference")] in ("no override", "FAIL")
    assert sorted(set(statuses.values())) == ["FAIL", "no override", "pass"]


def test_json_replaces_the_file_whole_and_leaves_no_temporary_file(user_module, tmp_path,
                                                                   capsys) -> None:
    (tmp_path / "results").mkdir()
    out = tmp_path / "results" / "rows.json"
    out.write_text("an earlier document")
    (tmp_path / "results" / ".rows.json.123.tmp").write_text("left by a killed writer")
    assert verify("--quotient", f"{user_module}:Neuron", "--json", str(out)) == 0
    rows = json.loads(out.read_text())
    assert {r["quotient"] for r in rows} == {"relu-neuron"} and rows
    left = sorted(p.name for p in out.parent.iterdir())
    assert "rows.json" in left and not [n for n in left if n.endswith((".tmp", ".holder.json"))]
    capsys.readouterr()


@pytest.mark.parametrize("spec, expected", [
    ("no_such_module_here:Q", "no module named 'no_such_module_here'"),
    ("{m}:Missing", "has no attribute 'Missing'"),
    ("{m}", "expected MODULE:NAME"),
    ("{m}:make_number", "the function returned a value of type int"),
    ("{m}:NeedsArguments", "with no arguments failed"),
    ("{m}:NotAQuotient", "is not a SymmetryQuotient subclass"),
    ("{m}:no_shapes", "has no point_shapes"),
])
def test_bad_input_is_one_line_naming_the_flag(user_module, capsys, spec, expected) -> None:
    assert verify("--quotient", spec.format(m=user_module)) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("quotientsharp verify: error: --quotient ")
    assert expected in captured.err, captured.err
    assert captured.err.count("\n") == 1
    assert captured.out == ""


def test_a_module_that_raises_on_import_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "broken_user_module.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert verify("--quotient", "broken_user_module:Q") == 2
    err = capsys.readouterr().err
    assert "importing module 'broken_user_module' failed" in err
    assert "no_such_dependency_xyz" in err and err.count("\n") == 1
    sys.modules.pop("broken_user_module", None)


def test_a_class_that_raises_inside_a_check_is_a_failure(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "raising_user_module.py").write_text(USER_MODULE + textwrap.dedent('''
        class Raising(Neuron):
            def christoffel(self, x, u, v=None):
                raise RuntimeError("not written yet")
    '''))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert verify("--quotient", "raising_user_module:Raising") == 1
    out = capsys.readouterr().out
    # the method is named: the checks of its outputs call it first
    assert ("FAIL: check_all raised QuotientMethodError: Raising.christoffel raised "
            "RuntimeError: not written yet") in out
    sys.modules.pop("raising_user_module", None)


def test_console_script_imports_from_the_working_directory(tmp_path) -> None:
    """A console script's sys.path[0] is its own folder: the working directory must be added."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "my_quotients.py").write_text(USER_MODULE)
    runner = tmp_path / "bin" / "quotientsharp_runner.py"
    runner.parent.mkdir()
    runner.write_text("import sys\nfrom quotientsharp.cli import main\nsys.exit(main())\n")
    done = subprocess.run([sys.executable, str(runner), "verify", "--quotient",
                           "my_quotients:make_wrong", "--seeds", "1", "--dtype", "float64"],
                          capture_output=True, text=True, cwd=work, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1, done.stderr[-2000:]
    assert "christoffel_vs_reference" in done.stdout and "FAIL" in done.stdout


def test_check_results_of_closed_forms_are_never_no_override() -> None:
    import quotientsharp as qs
    from quotientsharp.core.checks import check_all, format_results

    results = check_all(qs.DiagonalQuotient("mix", d=3), seed=0)
    assert not any(r.no_override for r in results)
    assert {r.status for r in results} == {"pass"}
    assert "no override" not in format_results(results)
