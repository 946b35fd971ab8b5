"""Objects a user names on the command line as ``MODULE:NAME``.

``MODULE`` is imported like any Python module, from the working directory first and then from
``sys.path``; ``NAME`` is an attribute of it (dotted names reach into classes and submodules).
Every failure is a :class:`UserInputError` (an :class:`~.options.InputError`) whose message is
one line naming the flag, so a command can print it as ``quotientsharp COMMAND: error:
MESSAGE`` and exit with status 2. ``verify --quotient`` and ``--symmetry`` both use it.

Nothing here imports torch: the command line's parser stays instant.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from quotientsharp.workflows.options import InputError


class UserInputError(InputError):
    """A ``MODULE:NAME`` argument that names nothing usable; the message is one line."""


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def import_object(spec: str, flag: str) -> Any:
    """The object that ``spec = "MODULE:NAME"`` names.

    Parameters
    ----------
    spec
        ``MODULE:NAME``, e.g. ``my_quotients:ReLUNeuronQuotient`` for the class
        ``ReLUNeuronQuotient`` in ``./my_quotients.py``.
    flag
        The command-line flag that gave ``spec`` (``"--quotient"``), named in every error.

    Returns
    -------
    object
        The attribute ``NAME`` of the imported module.

    Raises
    ------
    UserInputError
        ``spec`` is not ``MODULE:NAME``, the module cannot be imported (or raises while it is
        imported), or it has no attribute ``NAME``.
    """
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
            shown = ", ".join(public[:12]) + (", ..." if len(public) > 12 else "")
            raise UserInputError(f"{flag} {spec!r}: module {module_name!r} has no attribute "
                                 f"{name!r} (it defines: {shown or 'nothing public'})")
        value = getattr(value, part)
    return value
