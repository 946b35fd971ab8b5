"""The first autograd Christoffel call of a user's quotient raises no warning from torch.

Forward-mode AD (``torch.func.jvp``) makes torch script its jvp decompositions on its first
call in a process, a ``DeprecationWarning`` of ``torch.jit.script`` that reached the user (and
failed ``pytest -W error``). The generic geometry computes Jacobian-vector products in reverse
mode instead; a fresh interpreter shows it, since the warning comes once per process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import warnings
import torch
warnings.simplefilter("error")
from quotientsharp.core import reference
from tests.bottleneck_symmetry import BottleneckGL

q = BottleneckGL()
x = (torch.randn(3, 6, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64))
u = (torch.randn(3, 6, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64))
gamma = reference.christoffel(q, x, u)
out, pushed = reference.jvp_pair(lambda y: tuple(2.0 * c * c for c in y), (x,), (u,))
assert all(torch.allclose(p, 4.0 * c * t) for p, c, t in zip(pushed, x, u))
print("ok", gamma[0].shape)
"""


def test_first_christoffel_of_a_custom_quotient_is_silent():
    done = subprocess.run([sys.executable, "-W", "error", "-c", SCRIPT], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ok") and done.stderr == ""
