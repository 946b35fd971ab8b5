"""The outputs of every command: checked before it computes (:func:`check_output_file`), and
a locked, read-only or full one, from whichever command and stage, reported by the console
script in one line, ``quotientsharp COMMAND: error: MESSAGE`` (:func:`error_message`)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from quotientsharp.workflows.files import writes_over
from quotientsharp.workflows.locks import OutputLock, OutputLockedError
from quotientsharp.workflows.options import InputError

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


def error_message(err: BaseException) -> str:
    """One line for an error a command reports: for an ``OSError`` the path, the system's
    reason and what to do; for a ``KeyError`` its key's message; else the error's text."""
    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    if isinstance(err, OSError):
        reason = _ADVICE.get(err.errno or 0) or err.strerror or type(err).__name__
        paths = [os.fspath(p) for p in (err.filename, err.filename2) if p is not None]
        where = f"{' -> '.join(map(str, paths))}: " if paths else ""
        code = errno.errorcode.get(err.errno) if err.errno is not None else None
        if paths or err.errno:
            text = f"{where}{reason}{f' ({code})' if code else ''}"
    return " ".join(text.split())


def check_output_folder(folder: Path | None) -> None:
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
    lock = OutputLock(folder, "--out")
    if lock.lock_path.exists():
        lock.acquire()          # raises naming the holder
        lock.release()


def _special_kind(path: Path) -> str | None:
    """What ``path`` is if it exists and is neither a regular file nor a folder (its target's
    kind, for a link); ``None`` otherwise. Nothing is opened: opening a FIFO would block."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None             # absent, or behind a file: the folder check says which
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kinds = {stat.S_IFIFO: "FIFO", stat.S_IFCHR: "character device",
             stat.S_IFBLK: "block device", stat.S_IFSOCK: "socket"}
    return kinds.get(stat.S_IFMT(mode), "special file")


def _check_folder(output: Path, shown: str) -> None:
    """Refuse ``output`` unless its nearest existing ancestor (the missing folders are made on
    writing) is a folder in which a file can be made."""
    folder = output.parent
    existing = next(part for part in [folder, *folder.parents]
                    if part.exists() or part.is_symlink())
    if not existing.is_dir():
        raise InputError(f"{shown}: {existing} is a file, not a folder: choose another path")
    try:
        # a file made and removed again: os.access says yes to root on a read-only or
        # virtual file system (/proc)
        handle, probe = tempfile.mkstemp(prefix=".quotientsharp-probe-", dir=existing)
    except OSError as err:
        code = errno.errorcode.get(err.errno or 0, "")
        raise InputError(f"{shown}: no file can be written in folder {existing} "
                         f"({err.strerror or err}{f', {code}' if code else ''}): choose "
                         f"another path") from None
    os.close(handle)
    with contextlib.suppress(OSError):
        os.unlink(probe)


def check_output_file(path: str | os.PathLike[str] | None, flag: str,
                      inputs: Sequence[tuple[str, str | os.PathLike[str] | None]] = ()
                      ) -> Path | None:
    """The output file of ``flag`` (``--json OUT``), checked before a command computes, so
    that it fails at once in one line naming ``flag`` and the path; ``None`` where ``path`` is.
    Refused (:class:`InputError`): an empty path, a folder, an existing file that is not
    regular (a FIFO: writing replaces it), one of the ``inputs`` (``("MODEL", path)``, ...) or
    a path inside one, a path through a file or in a folder where no file can be made."""
    if path is None:
        return None
    text = os.fspath(path)
    if not text.strip():
        raise InputError(f"{flag} needs a file path, got {text!r}")
    output, shown = Path(text), f"{flag} {text}"
    if output.is_dir():
        raise InputError(f"{shown} is a folder: give a file path, such as "
                         f"{output / 'out.json'}")
    kind = _special_kind(output)
    if kind is not None:
        raise InputError(f"{shown} exists and is a {kind}, not a regular file: writing would "
                         f"replace it by a file; give a new or regular file's path")
    for role, source in inputs:
        if source is not None and writes_over(output, Path(source)):
            where = "inside" if Path(source).resolve().is_dir() else "the same file as"
            raise InputError(f"{shown} is {where} {role} {os.fspath(source)}: writing would "
                             f"overwrite an input; choose another path")
    _check_folder(output, shown)
    return output
