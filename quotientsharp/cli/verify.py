"""``quotientsharp verify``: every geometry check on every built-in quotient, or on the user's
(``--quotient MODULE:NAME``). Exit status 0 when every check passes, 1 on any failure (a check
that raised included), 2 on bad input."""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quotientsharp.cli.output_errors import check_output_file
from quotientsharp.workflows.files import write_text_atomic
from quotientsharp.workflows.locks import OutputLock
from quotientsharp.workflows.options import InputError
from quotientsharp.workflows.user_objects import UserInputError, import_object

if TYPE_CHECKING:
    import torch

    from quotientsharp.core.checks import CheckResult
    from quotientsharp.core.quotient import SymmetryQuotient


def builtin_quotients() -> list[SymmetryQuotient]:
    """One instance of every built-in quotient and metric (the engine's factors)."""
    from quotientsharp.core.adaptive import AdaptiveQuotient
    from quotientsharp.core.diagonal import DiagonalQuotient
    from quotientsharp.core.gl import GLQuotient, RotaryQuotient
    from quotientsharp.core.product import ProductQuotient

    quotients: list[SymmetryQuotient] = [DiagonalQuotient(metric, d=4)
                                         for metric in ("inv", "mix", "euclidean")]
    quotients += [GLQuotient(metric) for metric in ("inv", "mix", "euclidean")]
    quotients += [GLQuotient(metric, eps=0.1) for metric in ("inv", "mix")]
    quotients += [RotaryQuotient(metric, head_dim=4) for metric in ("inv", "mix")]
    quotients += [RotaryQuotient("mix", head_dim=6, rotary_dims=4, layout="interleaved")]
    quotients += [AdaptiveQuotient(metric, shapes=[(3, 4), (5,)])
                  for metric in ("adaptive", "euclidean")]
    # products, as the sharpness engine runs them: heads folded into the point
    network = ProductQuotient([GLQuotient("inv"), DiagonalQuotient("inv"),
                               AdaptiveQuotient(shapes=[(3, 2), (4,)])], folded=[1, 0, 0],
                              names=["gl", "diagonal", "other"])
    network.point_shapes = ((2, 5, 3), (2, 4, 3), (6,), (6,), (3, 2), (4,))
    quotients += [network, ProductQuotient([RotaryQuotient("mix", head_dim=4),
                                            DiagonalQuotient("mix", d=3)])]
    return quotients


def user_quotient(spec: str) -> Any:
    """The quotient that ``--quotient MODULE:NAME`` names, built if ``NAME`` is a class or
    function; a :class:`UserInputError` if there is none, building it failed, or it has no
    ``point_shapes`` (which the checks need to draw a random point)."""
    from quotientsharp.core.quotient import SymmetryQuotient

    flag = "--quotient"
    value = import_object(spec, flag)
    what = "instance"
    if isinstance(value, type) or (callable(value) and not isinstance(value, SymmetryQuotient)):
        what = "class" if isinstance(value, type) else "function"
        if isinstance(value, type) and not issubclass(value, SymmetryQuotient):
            raise UserInputError(f"{flag} {spec!r}: class {value.__name__} is not a "
                                 f"SymmetryQuotient subclass")
        if inspect.isabstract(value):
            raise UserInputError(f"{flag} {spec!r}: class {value.__name__} is abstract "
                                 f"(it does not define every required method)")
        try:
            value = value()
        except Exception as err:
            message = " ".join(str(err).split())
            raise UserInputError(
                f"{flag} {spec!r}: calling {what} {spec.partition(':')[2]}() with no arguments "
                f"failed ({type(err).__name__}: {message}); name an instance, or a function "
                f"of no arguments that returns one") from err
    if not isinstance(value, SymmetryQuotient):
        got = (f"it is of type {type(value).__name__}" if what == "instance"
               else f"the {what} returned a value of type {type(value).__name__}")
        raise UserInputError(f"{flag} {spec!r}: expected a SymmetryQuotient instance, a "
                             f"subclass or a function returning one; {got}")
    if value.point_shapes is None and getattr(value, "check_shapes", None) is None:
        raise UserInputError(f"{flag} {spec!r}: {type(value).__name__} has no point_shapes, "
                             f"so the checks cannot draw a point; name an instance built with "
                             f"point_shapes=[...] (or a function returning one)")
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("verify", help="check every built-in quotient's closed forms "
                              "against autograd references, Taylor slopes and invariances "
                              "(or your own quotient's, with --quotient)")
    p.add_argument("--quotient", action="append", default=None, metavar="MODULE:NAME",
                   help="check this quotient instead of the built-in ones: NAME in MODULE "
                        "(imported from the working directory or sys.path) is an instance, a "
                        "class constructible without arguments, or a function returning one; "
                        "repeat to check several")
    p.add_argument("--seeds", type=int, default=2, help="number of random seeds (default 2)")
    p.add_argument("--dtype", choices=["float64", "float32", "both"], default="both",
                   help="dtype of the random points (default both)")
    # a string, not a Path: Path("") is ".", and an empty --json must be refused as such
    p.add_argument("--json", default=None, help="also write the results as JSON")


def _check_and_print(quotient: SymmetryQuotient, dtype: torch.dtype, seed: int
                     ) -> list[CheckResult] | None:
    """Run and print :func:`check_all` at one dtype and seed; ``None`` (reported) if it raised."""
    from quotientsharp.core.checks import check_all, format_results

    settings = quotient.extra_repr()
    name = f"{quotient.name} ({settings})" if settings else quotient.name
    title = f"{name}  dtype={str(dtype).removeprefix('torch.')}  seed={seed}"
    try:
        results = check_all(quotient, seed=seed, dtype=dtype)
    except Exception as err:
        # a user's class that raises is a failure to report, not a traceback
        message = " ".join(str(err).split())
        print(f"{title}\n  FAIL: check_all raised {type(err).__name__}: {message}")
        return None
    print(format_results(results, title))
    return results


def _summary(rows: list[dict[str, Any]], failures: int, crashed: int) -> str:
    """The closing line: passed, failed, unchecked (no override) and crashed counts."""
    unchecked = sum(r["status"] == "no override" for r in rows)
    passed = len(rows) - failures - unchecked
    summary = f"\n{passed} passed, {failures} failed"
    if unchecked:
        summary += (f", {unchecked} no override (the class keeps the generic default, "
                    f"compared with itself)")
    if crashed:
        summary += f", {crashed} runs raised"
    return summary


def run(args: argparse.Namespace) -> int:
    import torch

    dtypes = {"float64": [torch.float64], "float32": [torch.float32],
              "both": [torch.float64, torch.float32]}[args.dtype]
    if args.seeds < 1:
        # zero seeds would run no check and pass any quotient
        raise InputError(f"--seeds must be an integer >= 1, got {args.seeds}")
    quotients = ([user_quotient(spec) for spec in args.quotient] if args.quotient
                 else builtin_quotients())
    # the output before the checks run: not a folder, a FIFO or a path through a file
    json_path = check_output_file(args.json, "--json")
    # one writer per --json file: a second verify (or measure) to it fails here, at once,
    # naming the holder (the lock is held until this process ends or releases it)
    json_lock = None if json_path is None else OutputLock(json_path, "--json").acquire()
    failures, rows, crashed = 0, [], 0
    for quotient, dtype, seed in itertools.product(quotients, dtypes, range(args.seeds)):
        results = _check_and_print(quotient, dtype, seed)
        if results is None:
            crashed += 1
            continue
        failures += sum(not r.passed for r in results)
        rows += [dict(quotient=quotient.name, dtype=str(dtype), seed=seed,
                      name=r.name, error=r.error, tolerance=r.tolerance,
                      passed=r.passed, status=r.status) for r in results]
    print(_summary(rows, failures, crashed))
    if json_lock is not None:
        # atomic: a reader, or a kill mid-write, sees the old document or the new one
        write_text_atomic(Path(args.json), json.dumps(rows, indent=1))
        json_lock.release()
    return 1 if failures + crashed else 0
