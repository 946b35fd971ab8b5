"""The determinism check sees model-owned generators and draws on later batches (issue 40).

Before, only the global generators were compared, and only around batch 0's clean evaluation:
a ``torch.Generator`` or a NumPy ``default_rng`` kept on a module, or a forward that draws only
from its second call on, gave a value that changed from call to call without an error.
"""

from __future__ import annotations

import random
import re
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import quotientsharp as qs
from quotientsharp.engine.determinism import (
    NondeterministicForwardError,
    global_states,
    owned_generators,
)
from tests.test_functional import _batches as _mlp_batches
from tests.test_functional import _measure as _measure_mlp
from tests.test_functional import _mlp


class OwnedTorchNoise(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)
        self.noise = torch.Generator().manual_seed(0)

    def forward(self, x):
        return self.layer(x) * (1 + 0.01 * torch.rand((), generator=self.noise))


class OwnedNumpyNoise(nn.Module):
    def __init__(self, legacy: bool = False) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 3)
        self.inner.rng = np.random.RandomState(0) if legacy else np.random.default_rng(0)

    def forward(self, x):
        return self.inner(x) * float(1 + 0.01 * self.inner.rng.random())


class LaterNoise(nn.Module):
    """Deterministic on its first calls (batch 0's clean evaluation), then draws."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        out = self.layer(x)
        return out * (1 + 0.01 * torch.rand(())) if self.calls > 3 else out


def _batches(n=2):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 4, generator=generator), torch.randint(0, 3, (8,),
                                                                   generator=generator))
            for _ in range(n)]


def _measure(model, n_iter=3):
    return qs.sharpness(model, _batches(), measure="worst_case", rho=0.1, n_iter=n_iter,
                        progress=False)


@pytest.mark.parametrize("model, where", [
    (OwnedTorchNoise, "noise (torch.Generator)"),
    (lambda: OwnedNumpyNoise(), "inner.rng (numpy.random.Generator)"),
    (lambda: OwnedNumpyNoise(legacy=True), "inner.rng (numpy.random.RandomState)"),
])
def test_a_generator_the_model_owns_is_found_and_left_as_it_was(model, where):
    net = model()
    generator = owned_generators(net)[0][1]
    state = (generator.get_state() if isinstance(generator, torch.Generator)
             else generator.bit_generator.state if hasattr(generator, "bit_generator")
             else generator.get_state()[1].copy())
    with pytest.raises(NondeterministicForwardError,
                       match="not deterministic.*the generator the model owns at "
                             + re.escape(where)):
        _measure(net)
    after = (generator.get_state() if isinstance(generator, torch.Generator)
             else generator.bit_generator.state if hasattr(generator, "bit_generator")
             else generator.get_state()[1])
    if isinstance(state, torch.Tensor):
        assert torch.equal(state, after)
    elif isinstance(state, dict):
        assert state["state"] == after["state"]
    else:
        assert (state == after).all()


def test_a_forward_that_draws_only_later_is_refused_on_that_batch():
    with pytest.raises(NondeterministicForwardError,
                       match="its ascent on batch 0 drew random numbers from torch's global"):
        _measure(LaterNoise())


def test_a_deterministic_model_with_an_unused_generator_measures():
    net = OwnedTorchNoise()
    net.forward = net.layer.forward    # owns a generator, never draws
    value = _measure(net).value
    assert value == _measure(net).value


def test_reading_the_states_is_cheap_for_a_large_module_tree():
    # about BERT-base's module count (~230 modules)
    tree = nn.Sequential(*[nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2), nn.Dropout(0.1))
                           for _ in range(80)])
    global_states(tree)
    start = time.perf_counter()
    for _ in range(20):
        global_states(tree)
    assert (time.perf_counter() - start) / 20 < 0.02


def _global_states():
    return (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())  # noqa: NPY002


def _same_states(a, b) -> bool:
    return torch.equal(a[0], b[0]) and a[1] == b[1] and bool((a[2] == b[2]).all())


class ForcedDropout(nn.Module):
    """Dropout forced on in the forward, whatever the module's mode."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.last = nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(F.dropout(torch.tanh(self.first(x)), 0.5, training=True))


class NumpyNoise(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x) * float(1 + 0.01 * np.random.rand())  # noqa: NPY002


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
@pytest.mark.parametrize("measure", ["worst_case", "geodesic", "average"])
def test_forced_dropout_raises_and_leaves_the_global_random_state(measure):
    torch.manual_seed(3)
    model = ForcedDropout()
    before = _global_states()
    with pytest.raises(ValueError, match="forward is not deterministic.*torch's global "
                                         "generator.*F.dropout"):
        _measure_mlp(model, _mlp_batches(), measure)
    assert _same_states(before, _global_states())


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_numpy_draws_in_the_forward_are_found_too():
    with pytest.raises(ValueError, match="not deterministic.*NumPy"):
        _measure_mlp(NumpyNoise(), _mlp_batches())


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_a_successful_call_leaves_the_global_random_state():
    model = _mlp()
    before = _global_states()
    _measure_mlp(model, _mlp_batches(), "average", samples=2)
    _measure_mlp(model, _mlp_batches(), "worst_case", random_init=True)
    assert _same_states(before, _global_states())


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_the_draws_of_the_callers_batches_stay_the_callers():
    # a shuffling DataLoader draws its permutation from torch's global generator while the
    # measurement iterates it: rewound with the rest, the caller's next epoch repeated it
    from torch.utils.data import DataLoader, TensorDataset

    generator = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(12, 4, generator=generator),
                         torch.randint(0, 3, (12,), generator=generator))
    loader = DataLoader(data, batch_size=4, shuffle=True)

    def epoch():
        return torch.cat([y for _, y in loader]).tolist()

    model = _mlp()                         # (it seeds torch's generator: before the epochs)
    torch.manual_seed(0)
    first, second = epoch(), epoch()
    after_two = torch.get_rng_state()
    torch.manual_seed(0)
    qs.sharpness(model, loader, measure="adaptive", rho=0.1, n_iter=2, progress=False)
    assert epoch() == second
    assert torch.equal(torch.get_rng_state(), after_two)
    assert first != second                 # the check can fail: the epochs differ
