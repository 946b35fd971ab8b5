"""Numbers as the user may give them: Python's, NumPy's, never a bool.

Torch-free, so that the command line's and the studies' configurations (which must not import
torch for ``--help``) check numbers exactly as the engine does.
"""

from __future__ import annotations

import numbers


def as_integer(value: object) -> int | None:
    """``value`` as an ``int`` if it is an integer (a NumPy one included), else ``None``.

    A bool (Python's or NumPy's) is no integer here: ``n_iter=True`` is a mistake.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None          # NumPy's bool is not an Integral, so it ends here too
    return int(value)


def as_real(value: object) -> float | None:
    """``value`` if it is a real number, else ``None``; no bool.

    A Python ``int`` or ``float`` is returned as it is (a recorded setting keeps the form it
    was given in), any other real number (a NumPy one) as a ``float``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    if isinstance(value, numbers.Integral) and abs(int(value)) > 2 ** 1023:
        return None          # beyond float64: float() would raise an error naming no option
    return value if type(value) in (int, float) else float(value)  # type: ignore[return-value]
