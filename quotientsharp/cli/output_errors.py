"""One error path for the outputs of every command: a locked, read-only or full folder.

Another process holding the output's lock, a read-only file system, a full disk, a path through
a file: from whichever command and stage, it reaches the console script as one line,
``quotientsharp COMMAND: error: MESSAGE``, and exit status 2 (:func:`output_error_message`,
called by :func:`quotientsharp.cli.main`). Nothing here imports torch.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from quotientsharp.workflows.locks import OutputLock, OutputLockedError

#: What :func:`quotientsharp.cli.main` reports in one line (``BrokenPipeError`` aside).
OUTPUT_ERRORS = (OutputLockedError, OSError)

#: Errors of a folder that cannot be written, with what to do about them.
_ADVICE = {
    errno.ENOSPC: "the disk is full: free space or choose another output folder",
    errno.EDQUOT: "the disk quota is exhausted: free space or choose another output folder",
    errno.EROFS: "the file system is read-only: choose another output folder",
    errno.EACCES: "permission denied: choose an output folder you may write",
    errno.EPERM: "operation not permitted: choose an output folder you may write",
    errno.ENOTDIR: "a part of the path is a file, not a folder: choose another output path",
    errno.EISDIR: "the path is a folder where a file was expected",
}


def output_error_message(err: BaseException) -> str:
    """One line for an output error: the locked output and its holder, or the path, the
    system's reason and what to do."""
    if isinstance(err, OutputLockedError) or not isinstance(err, OSError):
        return " ".join(str(err).split())
    reason = _ADVICE.get(err.errno or 0) or err.strerror or type(err).__name__
    paths = [os.fspath(p) for p in (err.filename, err.filename2) if p is not None]
    where = f"{' -> '.join(map(str, paths))}: " if paths else ""
    code = errno.errorcode.get(err.errno) if err.errno is not None else None
    detail = f" ({code})" if code else ""
    text = f"{where}{reason}{detail}" if paths or err.errno else str(err)
    return " ".join(text.split())


def error_text(err: BaseException) -> str:
    """What a command prints after ``error:`` for an error it reports: an output error as
    :func:`output_error_message`, a ``KeyError`` by its key's message, else ``str(err)``."""
    if isinstance(err, OUTPUT_ERRORS):
        return output_error_message(err)
    if isinstance(err, KeyError) and err.args:
        return str(err.args[0])
    return str(err)


def check_output_folder(folder: Path | None, what: str = "--out") -> None:
    """Refuse at once (before a command computes for minutes and then opens it) an output
    folder that another process holds (``OutputLockedError``) or whose path runs through a file
    (``NotADirectoryError``); nothing is created."""
    if folder is None:
        return
    folder = Path(folder)
    for part in [folder, *folder.parents]:
        if part.exists():
            if not part.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(part))
            break
    if not folder.is_dir():
        return
    lock = OutputLock(folder, what)
    if lock.lock_path.exists():
        lock.acquire()          # raises naming the holder
        lock.release()
