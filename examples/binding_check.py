"""A user's binding checked against the model: BatchNorm row scaling refused in eval mode, and
the GL(3) symmetry of a linear bottleneck measured invariantly while adaptive moves.

Run from the repository root: ``python examples/binding_check.py``. It reuses the test
fixtures of ``tests/test_symmetry_check.py`` and ``tests/bottleneck_symmetry.py`` (models
built in code, no download), so the numbers it prints are the ones the tests bound.
"""

import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]   # the tests' fixtures
warnings.filterwarnings("ignore", category=FutureWarning)

from bottleneck_symmetry import (  # noqa: E402
    bottleneck_batches,
    bottleneck_binding,
    bottleneck_model,
)
from test_symmetry_check import _batchnorm_model, _rows_binding  # noqa: E402

import quotientsharp as qs  # noqa: E402

for dtype in (torch.float64, torch.float32):
    model, batches = _batchnorm_model(dtype)
    model.eval()
    try:
        qs.sharpness(model, batches, rho=0.05, symmetries=_rows_binding(), n_iter=3,
                     progress=False)
    except qs.SymmetryCheckError as error:
        print(dtype, "refused:", str(error)[:190])

model, batches = bottleneck_model(), bottleneck_batches()
group = torch.linalg.matrix_exp(torch.randn(3, 3, dtype=torch.float64,
                                            generator=torch.Generator().manual_seed(5)))
moved = bottleneck_model()
with torch.no_grad():
    moved[0].weight.copy_(group @ model[0].weight)
    moved[1].weight.copy_(model[1].weight @ torch.linalg.inv(group))
options = {"rho": 0.1, "n_iter": 10, "progress": False}
geodesic = [qs.sharpness(m, batches, symmetries=bottleneck_binding(m), **options).value
            for m in (model, moved)]
adaptive = [qs.sharpness(m, batches, measure="adaptive", **options).value
            for m in (model, moved)]
print("cond(G)", float(torch.linalg.cond(group)), "geodesic", geodesic, "relative",
      abs(geodesic[1] - geodesic[0]) / geodesic[0], "adaptive", adaptive)
print(qs.models.check_symmetry(model, bottleneck_binding(model), batches[0]))
