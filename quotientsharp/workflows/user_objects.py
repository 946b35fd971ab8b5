"""Objects a user names on the command line as ``MODULE:NAME`` (``MODULE`` imported from the
working directory first, then ``sys.path``), and ``--symmetry``; every failure is an
:class:`~.options.InputError` of one line naming the flag."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from quotientsharp.core.scalars import shortened
from quotientsharp.workflows.options import InputError


class UserInputError(InputError):
    """A ``MODULE:NAME`` argument that names nothing usable; the message is one line."""


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def import_object(spec: str, flag: str) -> Any:
    """The object that ``spec = "MODULE:NAME"`` names (``mine:Quotient`` for that class in
    ``./mine.py``), or a :class:`UserInputError` naming ``flag`` (``"--quotient"``)."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise UserInputError(f"{flag} {spec!r}: expected MODULE:NAME, e.g. mine:thing for "
                             f"the name thing in ./mine.py")
    # a console script's sys.path[0] is the script's folder, not the working directory
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is not None and (module_name == err.name
                                     or module_name.startswith(err.name + ".")):
            raise UserInputError(f"{flag} {spec!r}: no module named {module_name!r} in the "
                                 f"working directory ({cwd}) or on sys.path") from err
        raise UserInputError(f"{flag} {spec!r}: importing module {module_name!r} failed: "
                             f"{_one_line(err)}") from err
    except Exception as err:  # the user's module raised while it was imported
        raise UserInputError(f"{flag} {spec!r}: importing module {module_name!r} failed: "
                             f"{_one_line(err)}") from err
    value: Any = module
    for part in name.split("."):
        if not hasattr(value, part):
            public = sorted(n for n in vars(module) if not n.startswith("_"))
            shown = shortened(public, 12)
            raise UserInputError(f"{flag} {spec!r}: module {module_name!r} has no attribute "
                                 f"{name!r} (it defines: {shown or 'nothing public'})")
        value = getattr(value, part)
    return value


def load_symmetry(spec: str, model: Any, flag: str = "--symmetry") -> list[Any]:
    """The bindings ``FUNCTION(model)`` returns for ``spec = "MODULE:FUNCTION"``, checked
    against ``model`` (``symmetries=`` of geodesic sharpness); an :class:`InputError` naming
    ``flag`` for bad input."""
    from quotientsharp.models import QuotientBinding

    function = import_object(spec, flag)
    function_name = spec.partition(":")[2]
    if not callable(function):
        raise InputError(f"{flag} {spec}: {function_name} is a {type(function).__name__}, not "
                         "a function of the model")
    try:
        returned = function(model)
    except Exception as err:
        raise InputError(f"{flag} {spec}: {function_name}(model) raised "
                         f"{type(err).__name__}: {err}") from err
    bindings = [returned] if isinstance(returned, QuotientBinding) else returned
    if (not isinstance(bindings, (list, tuple)) or not bindings
            or not all(isinstance(b, QuotientBinding) for b in bindings)):
        raise InputError(f"{flag} {spec}: {function_name}(model) must return a QuotientBinding "
                         f"or a non-empty list of them, got {type(returned).__name__}")
    names = {name for name, _ in model.named_parameters()}
    for binding in bindings:
        missing = [n for n in binding.parameters if n not in names]
        if missing:
            raise InputError(f"{flag} {spec}: binding {binding.name!r} names {missing}, which "
                             f"the model ({type(model).__name__}) has no parameter of")
    return list(bindings)
