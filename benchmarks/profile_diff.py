"""Per-iteration cost of each operator from two profiler tables of ``bert_base.py --profile``.

Each measure's file holds a table at ``n_iter = 1`` and one at ``n_iter = 1 + k``: the
difference of an operator's self CPU time over ``k`` is its cost per iteration, set beside
the plain forward+backward's (``forward_backward.txt``, ``k`` calls).

Run: ``python benchmarks/profile_diff.py benchmarks/profiles/bert_base_before``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def tables(text: str) -> list[tuple[str, dict[str, float]]]:
    """``(title, {operator: self CPU seconds})`` per table of a file."""
    found = []
    for block in text.split("=== ")[1:]:
        title = block.split(" ===")[0]
        times = {}
        for line in block.splitlines():
            cells = re.split(r"\s{2,}", line.strip())
            if len(cells) >= 7 and (match := re.fullmatch(r"([\d.]+)(s|ms|us|ns)", cells[2])):
                times[cells[0]] = float(match[1]) * UNITS[match[2]]
        found.append((title, times))
    return found


def per_iteration(path: Path) -> tuple[int, dict[str, float]]:
    (_, low), (title, high) = tables(path.read_text())
    steps = int(re.search(r"n_iter=(\d+)", title)[1]) - 1
    return steps, {op: (high.get(op, 0.0) - low.get(op, 0.0)) / steps
                   for op in set(low) | set(high)}


def main(argv: list[str]) -> int:
    folder = Path(argv[0])
    (title, plain), = tables((folder / "forward_backward.txt").read_text())
    calls = int(title.rsplit("x", 1)[1].split(":")[0])
    plain = {op: t / calls for op, t in plain.items()}
    print(f"per iteration, seconds of self CPU time (forward+backward: {sum(plain.values()):.2f}"
          " s in its listed operators)")
    for name in ("adaptive", "geodesic_mix", "geodesic_inv"):
        steps, ops = per_iteration(folder / f"{name}.txt")
        listed = sum(ops.values())
        print(f"\n{name} (difference of n_iter=1 and {1 + steps}, over {steps}): "
              f"{listed:.2f} s per iteration in the listed operators")
        for op, seconds in sorted(ops.items(), key=lambda kv: -kv[1])[:12]:
            print(f"  {op:<40s} {seconds:7.3f} s   (forward+backward: "
                  f"{plain.get(op, 0.0):.3f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
