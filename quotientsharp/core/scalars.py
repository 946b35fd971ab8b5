"""Options as the user may give them: numbers (Python's, NumPy's, never a bool), flags, seeds,
and the spellings of the choices ``order``, ``p`` and ``nonfinite``.

Torch-free, so that the command line's and the studies' configurations (which must not import
torch for ``--help``) check options exactly as the engine does: each check here is the one
check of its kind, and ``name`` is how its error names the option (``n_iter`` or ``--n-iter``).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Sequence

#: ``torch.Generator.manual_seed`` takes 64-bit seeds.
SEED_LIMIT = 2 ** 64
#: The geodesic orders: a second-order (or first-order) step, or the exact geodesic.
ORDERS = (1, 2, "exact")
#: What to do with a NaN or inf perturbed loss: ``"raise"`` (default) an error naming the batch,
#: or ``"skip"`` the evaluation (never the best; counted in ``result.nonfinite_evaluations``).
NONFINITE_POLICIES = ("raise", "skip")


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


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` as an int (a NumPy integer converted) if it is an integer >= ``minimum``,
    else a ``ValueError`` naming ``name``."""
    number = as_integer(value)
    if number is None or number < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return number


def thread_limit() -> int:
    """The most torch threads an option may ask for: 4 per CPU of this machine
    (``os.cpu_count()``). More only oversubscribe the cores, and tens of thousands make torch's
    thread pool crash the process (a segmentation fault, no message)."""
    return 4 * (os.cpu_count() or 1)


def check_thread_count(name: str, threads: int) -> int:
    """``threads``, an integer already checked to be >= 1, unless it exceeds
    :func:`thread_limit`: then a ``ValueError`` naming ``name``."""
    limit = thread_limit()
    if threads > limit:
        raise ValueError(f"{name} must be at most {limit} (4 per CPU; this machine has "
                         f"{os.cpu_count() or 1}), got {threads}: more threads only "
                         "oversubscribe the cores, and far more crash torch")
    return threads


def check_real(name: str, value: object, bounds: str, inside: Callable[[float], bool]) -> float:
    """``value`` as a float if it is a real number with ``inside(value)`` true, else a
    ``ValueError`` naming ``name`` and the ``bounds`` in words."""
    number = as_real(value)
    if number is None or not inside(number):
        raise ValueError(f"{name} must be {bounds}, got {value!r}")
    return number


def check_finite(name: str, value: object, *, positive: bool = True) -> float:
    """``value`` as a float if it is a finite real number > 0 (>= 0 unless ``positive``)."""
    return check_real(name, value, f"a finite number {'>' if positive else '>='} 0",
                      lambda v: math.isfinite(v) and (v > 0 if positive else v >= 0))


def check_flag(name: str, value: object, *, optional: bool = False) -> bool | None:
    """``value`` if it is ``True`` or ``False`` (or ``None`` where ``optional``), else a
    ``TypeError`` naming ``name``."""
    if not (isinstance(value, bool) or (optional and value is None)):
        raise TypeError(f"{name} must be True or False{' (or None)' if optional else ''}, "
                        f"got {value!r}")
    return value


def check_seed(seed: object, name: str = "seed") -> int:
    """``seed`` as an int (a NumPy integer converted) in ``[0, 2**64)``."""
    number = as_integer(seed)
    if number is None or not 0 <= number < SEED_LIMIT:
        raise (ValueError if number is not None else TypeError)(
            f"{name} must be an integer in [0, 2**64), got {seed!r}")
    return number


def check_order(order: object, name: str = "order") -> int | str:
    """A geodesic order: ``1``, ``2`` or ``"exact"`` (``1.0`` and ``2.0`` are taken as ``1`` and
    ``2``, as 0.1 took them)."""
    if isinstance(order, float) and order in (1.0, 2.0):
        order = int(order)
    elif isinstance(order, numbers.Integral) and not isinstance(order, bool):
        order = int(order)              # a NumPy integer, as every other number here
    if isinstance(order, bool) or not isinstance(order, (int, str)) or order not in ORDERS:
        raise ValueError(f"{name} must be 1, 2 or 'exact', got {order!r}")
    return order


def check_p(p: object, name: str = "p") -> int | str:
    """The norm of a plain ball in the form ``result.settings`` records: ``2`` (also ``2.0``,
    ``"2"``, ``"L2"``) or ``"inf"`` (also ``math.inf``, ``"Linf"``, ``"linf"``)."""
    if p in ("inf", "Linf", "linf") or (isinstance(p, float) and math.isinf(p) and p > 0):
        return "inf"
    if p in (2, 2.0, "2", "L2") and not isinstance(p, bool):
        return 2
    raise ValueError(f"{name} must be 2 or 'inf', got {p!r}")


def check_nonfinite(policy: object, name: str = "nonfinite") -> str:
    """A policy of :data:`NONFINITE_POLICIES`."""
    if policy not in NONFINITE_POLICIES:
        raise ValueError(f"{name} must be raise or skip, got {policy!r}")
    return str(policy)


def shortened(names: Sequence[str], limit: int) -> str:
    """``names`` joined by commas, the first ``limit`` of them and ``", ..."`` if there are more
    (the lists that error messages name)."""
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")
