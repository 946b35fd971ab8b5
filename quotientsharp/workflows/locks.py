"""One writer per output: a file lock on each results folder and ``--json`` file, with which a
second writer fails at once, naming the holder. An OS lock (``filelock``) is released when its
process ends, however it ends; the holder's details go to a second file, since ``filelock``
truncates the lock file on every attempt."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

#: How often, and how long apart, a run that finds an output locked reads the holder's details
#: before it names the holder as one that has not written them yet.
HOLDER_POLLS = 20
HOLDER_POLL_SECONDS = 0.05


class OutputLockedError(RuntimeError):
    """Another process writes the same output folder or file."""


class OutputLock:
    """An exclusive, non-blocking lock on one output (a folder or a file).

    Parameters
    ----------
    output
        The folder (its lock is ``<folder>/.quotientsharp.lock``) or file (its lock is
        ``.<name>.lock`` beside it).
    what
        How the message names the output (``"--out"``, ``"--json"``).
    """

    def __init__(self, output: Path, what: str = "output") -> None:
        self.output = Path(output)
        self.what = what
        if self.output.is_dir():
            self.lock_path = self.output / ".quotientsharp.lock"
        else:
            self.lock_path = self.output.parent / f".{self.output.name}.lock"
        self.holder_path = self.lock_path.with_name(self.lock_path.name + ".holder.json")
        # one object per lock file in this process: re-entrant here, exclusive across processes
        self._lock = FileLock(str(self.lock_path), timeout=0, thread_local=False,
                              is_singleton=True)
        self._held = False

    def _holder(self) -> Any:
        """The holder's details as written (``None`` where there are none yet)."""
        try:
            return json.loads(self.holder_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def acquire(self) -> OutputLock:
        """Take the lock now, or raise :class:`OutputLockedError` naming the holder."""
        if self._held:
            return self
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        self._make_lock_file()
        first = not self._lock.is_locked
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            # the holder writes its details just after it takes the lock: a run that lost a
            # race by a few milliseconds waits up to a second for them, to name the holder
            holder = self._holder()
            for _ in range(HOLDER_POLLS):
                if isinstance(holder, dict):
                    break
                time.sleep(HOLDER_POLL_SECONDS)
                holder = self._holder()
            who = ("another process (it has not written its details yet)"
                   if not isinstance(holder, dict)
                   else f"process {holder.get('pid')} on host {holder.get('host')!r} since "
                        f"{holder.get('since')} ({holder.get('command') or 'no command'})")
            raise OutputLockedError(
                f"{self.what} {self.output} is being written by {who}; the lock is "
                f"{self.lock_path}. Wait for that run to finish, or choose another "
                f"{self.what}") from None
        self._held = True
        if first:
            self._remove_stale_temporaries()
            self._write_holder()
        return self

    def _make_lock_file(self) -> None:
        """Create the lock file, raising the system's ``OSError`` where that fails (a read-only
        folder, ``/proc``): ``filelock`` would time out and blame another process."""
        if self.lock_path.exists():
            return
        try:
            handle = os.open(self.lock_path, os.O_WRONLY | os.O_CREAT, 0o644)
        except OSError as err:
            raise OSError(err.errno, f"cannot create the lock file of {self.what} "
                          f"{self.output} ({err.strerror}): choose another {self.what}",
                          str(self.lock_path)) from None
        os.close(handle)

    def _remove_stale_temporaries(self) -> None:
        """Delete the temporary files (``.<name>.*.tmp``) of an earlier writer killed mid-write:
        only the lock's holder writes here."""
        if self.output.is_dir():
            stale = self.output.glob(".*.tmp")
        else:
            stale = self.output.parent.glob(f".{self.output.name}.*.tmp")
        for path in stale:
            with contextlib.suppress(OSError):
                path.unlink()

    def _write_holder(self) -> None:
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "command": " ".join(sys.argv) if sys.argv else ""}
        temporary = self.holder_path.with_name(f".{self.holder_path.name}.{os.getpid()}.tmp")
        try:
            temporary.write_text(json.dumps(info) + "\n", encoding="utf-8")
            os.replace(temporary, self.holder_path)
        except OSError:
            # the details are a courtesy for the message; the lock itself is held
            with contextlib.suppress(OSError):
                temporary.unlink()

    def release(self) -> None:
        """Release the lock (once per :meth:`acquire`); the holder file goes with the last."""
        if not self._held:
            return
        self._held = False
        if self._lock.lock_counter == 1:
            with contextlib.suppress(OSError):
                self.holder_path.unlink()
        self._lock.release()

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.release()
