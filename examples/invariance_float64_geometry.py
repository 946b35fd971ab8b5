"""Is the float32 failure of the invariance study's ill-conditioned orbit point the geometry's?

Run: ``python examples/invariance_float64_geometry.py`` (under a minute on one core).

``quotientsharp reproduce invariance`` measures, in a float32 MiniLM, geodesic mix sharpness
(order 2, rho 0.1, 8 steps) at the orbit point ``a = 10^-0.5`` of seed 0, where the largest
condition number of the ``A``'s is about 4.9e5, far below its value on the original model. This
script measures the same float32 model, the same float32 forward, with the engine's geometry
(tangent vectors, gradients, ascent iterate) in float64 instead of float32
(``geometry_dtype=torch.float64``). Prints the sharpness of the original and the moved model and
the relative change.
"""

from __future__ import annotations

import sys

import torch

import quotientsharp as qs
from quotientsharp.models import find_symmetries
from quotientsharp.reproduce.invariance.study import (
    _cast,
    _moved_model,
    generate_sentences,
    load_minilm,
)


def main() -> int:
    torch.set_num_threads(1)
    model, tokenizer = load_minilm(0)
    sentences, labels = generate_sentences(8, 0)
    batch = {**dict(tokenizer(sentences, padding=True, return_tensors="pt")),
             "labels": torch.tensor(labels)}
    # grid point 3 of the full study: a = 10^-0.5, generator seed 1000 * 0 + 3
    moved, condition = _moved_model(model, find_symmetries(model), 10 ** -0.5,
                                    torch.Generator().manual_seed(3))
    print(f"largest condition number of A: {condition:.2e}")
    values = {}
    for name, subject in (("original", model), ("moved", moved)):
        float32 = _cast(subject, "float32")
        result = qs.sharpness(float32, [batch], measure="geodesic", metric="mix", order=2,
                              rho=0.1, n_iter=8, seed=0, progress=False,
                              geometry_dtype=torch.float64)
        values[name] = result.value
        print(f"{name}: geometry {result.settings['geometry_dtype']}, sharpness "
              f"{result.value:.7g}")
    print(f"relative change: {values['moved'] / values['original'] - 1:+.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
