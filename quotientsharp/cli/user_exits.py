"""``SystemExit`` and ``KeyboardInterrupt`` raised by a user's code, reported as such.

A command runs its user's code (a pickled model's ``forward``, a ``--symmetry`` or
``--quotient`` module). A ``sys.exit(0)`` there would end the command as if it had finished,
with status 0 and no output; :func:`quotientsharp.cli.main` prints instead one line naming the
user's module (:func:`user_exit_message`) and exits non-zero. User code is a frame outside this
package, the standard library and the installed packages.
"""

from __future__ import annotations

import os
import site
import sysconfig
from types import TracebackType

_PACKAGE = "quotientsharp"


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    try:
        roots.update(site.getsitepackages())
    except AttributeError:  # pragma: no cover - virtualenvs without getsitepackages
        pass
    user_site = site.getusersitepackages() if hasattr(site, "getusersitepackages") else None
    if isinstance(user_site, str):
        roots.add(user_site)
    return tuple(os.path.realpath(root) + os.sep for root in roots)


def _is_user_frame(module: str, filename: str, roots: tuple[str, ...]) -> bool:
    if module == _PACKAGE or module.startswith(_PACKAGE + "."):
        return False
    if filename.startswith("<"):      # <frozen importlib._bootstrap>, <string>
        return False
    return not os.path.realpath(filename).startswith(roots)


def user_frame(traceback: TracebackType | None) -> tuple[str, str, int, str] | None:
    """``(module, file, line, function)`` of the innermost frame of user code in
    ``traceback``, or ``None`` when the exception passed through none."""
    roots = _library_roots()
    found = None
    while traceback is not None:
        frame = traceback.tb_frame
        module = str(frame.f_globals.get("__name__", "?"))
        filename = frame.f_code.co_filename
        if _is_user_frame(module, filename, roots):
            found = (module, filename, traceback.tb_lineno, frame.f_code.co_name)
        traceback = traceback.tb_next
    return found


def user_exit_message(error: BaseException) -> str | None:
    """One line for a ``SystemExit`` or ``KeyboardInterrupt`` raised in (or through) user
    code, naming the module; ``None`` for one raised by this package itself."""
    if not isinstance(error, (SystemExit, KeyboardInterrupt)):
        return None
    frame = user_frame(error.__traceback__)
    if frame is None:
        return None
    module, filename, line, function = frame
    if isinstance(error, SystemExit):
        what = f"SystemExit({error.code!r}) (sys.exit)"
    else:
        what = "KeyboardInterrupt"
    return (f"user code raised {what} in module {module!r} ({filename}:{line}, in "
            f"{function}); the command stopped there and did not finish")


def exit_status(error: BaseException) -> int:
    """The exit status after ``error`` from user code: 130 for ``KeyboardInterrupt`` (as after
    Ctrl-C), 1 for ``SystemExit`` whatever its code (no success of the command)."""
    return 130 if isinstance(error, KeyboardInterrupt) else 1
