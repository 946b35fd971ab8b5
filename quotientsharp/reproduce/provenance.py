"""Where a results page came from: the package version, the git commit (``None`` outside a
checkout or without git) and the command."""

from __future__ import annotations

import datetime
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Provenance:
    """What made a page: ``quotientsharp.__version__``, the full hash of ``HEAD`` of the
    checkout holding the package (``None`` outside one), whether tracked files outside
    ``docs/`` differed from it (``None`` with no commit), the command line as a user types it
    and the UTC date ``YYYY-MM-DD``."""

    version: str
    commit: str | None
    dirty: bool | None
    command: str
    date: str


def git_state(package_dir: Path) -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the git checkout whose top level holds ``package_dir``;
    ``(None, None)`` without git or outside such a checkout."""
    package_dir = Path(package_dir).resolve()

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(package_dir), *args], capture_output=True,
                                  text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != package_dir.parent:
        return None, None
    commit = git("rev-parse", "HEAD")
    if commit is None:
        return None, None
    # the pages and figures the studies write live under docs/: a regeneration of several
    # pages in turn must not count its own earlier outputs as changes to the code
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs")
    return commit, (None if status is None else bool(status))


def default_command(argv: Sequence[str] | None = None) -> str:
    """The command line of this process as a user types it: ``quotientsharp ...`` when it is
    the package's command-line interface (``quotientsharp`` or ``python -m quotientsharp``),
    ``python ARGV`` otherwise."""
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return "python"
    head = Path(argv[0])
    if head.name == "quotientsharp" or (head.name == "__main__.py"
                                         and head.parent.name == "quotientsharp"):
        return shlex.join(["quotientsharp", *argv[1:]])
    return shlex.join(["python", *argv])


def current_provenance(command: str | None = None) -> Provenance:
    """The provenance of a page written now by the imported package, made by ``command``
    (default :func:`default_command`)."""
    import quotientsharp

    commit, dirty = git_state(Path(quotientsharp.__file__).parent)
    if command is not None and not command.strip():
        raise ValueError("command must be a non-empty command line or None")
    return Provenance(version=quotientsharp.__version__, commit=commit, dirty=dirty,
                      command=command if command is not None else default_command(),
                      date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"))
