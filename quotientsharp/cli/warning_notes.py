"""The library's warnings, said by a command as ``note:`` lines: a ``UserWarning`` (a degenerate
LoRA adapter, skipped non-finite evaluations) would reach stderr as ``<frozen runpy>:88:
UserWarning: ...``, with a meaningless location."""

from __future__ import annotations

import warnings
from types import TracebackType


class WarningNotes:
    """A context in which every ``UserWarning`` is recorded, not shown; :meth:`notes` gives
    their messages. On exit the other warnings recorded are issued again, as they came.

    Examples
    --------
    >>> with WarningNotes() as caught:
    ...     warnings.warn("2 LoRA adapter(s) are degenerate", UserWarning)
    >>> caught.notes()
    ['2 LoRA adapter(s) are degenerate']
    """

    def __init__(self) -> None:
        self._context = warnings.catch_warnings(record=True)
        self._caught: list[warnings.WarningMessage] = []

    def __enter__(self) -> WarningNotes:
        caught = self._context.__enter__()      # a list with record=True, empty so far
        # "is not None", not "or []": the empty list the warnings will go to is false
        self._caught = caught if caught is not None else []
        # "always": a warning issued once per measure is one note (notes() drops repeats)
        warnings.simplefilter("always", UserWarning)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._context.__exit__(kind, error, traceback)
        for warning in self._caught:
            if not issubclass(warning.category, UserWarning):
                warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                       warning.lineno)

    def notes(self) -> list[str]:
        """The messages of the ``UserWarning``\\ s recorded so far, each on one line, in order,
        without repeats."""
        return list(dict.fromkeys(" ".join(str(warning.message).split())
                                  for warning in self._caught
                                  if issubclass(warning.category, UserWarning)))
