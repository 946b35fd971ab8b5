"""``--symmetry MODULE:FUNCTION``: a user's symmetry for ``quotientsharp measure`` and ``study``.

``FUNCTION(model)`` returns a :class:`~quotientsharp.models.QuotientBinding` or a list of them;
``MODULE`` is imported from the working directory or ``sys.path``. The bindings are passed to
geodesic sharpness as ``symmetries=[...]``, exactly as in the API (they replace discovery, and
every other parameter gets the adaptive geometry). A study manifest row may name its own in a
``symmetry`` field. Every bad input is an :class:`~.options.InputError` naming the flag (or the
manifest field): a module that cannot be imported, a missing name, a function that returns no
binding, a parameter the model lacks.
"""

from __future__ import annotations

from typing import Any

from quotientsharp.workflows.options import InputError
from quotientsharp.workflows.user_objects import import_object


def load_symmetry(spec: str, model: Any, flag: str = "--symmetry") -> list[Any]:
    """The bindings ``FUNCTION(model)`` returns, checked against ``model``.

    Parameters
    ----------
    spec
        ``"MODULE:FUNCTION"`` (``MODULE`` dotted, importable from the working directory or
        ``sys.path``).
    model
        The loaded ``nn.Module``.
    flag
        How errors name the source (``--symmetry``, or a manifest row's field).

    Raises
    ------
    InputError
        One line naming ``flag``.
    """
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
