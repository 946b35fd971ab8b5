"""Counts that would make a check vacuous are refused, naming the argument (issue 40, item 4).

Before, ``verify --seeds 0`` passed any quotient (no check ran, exit 0), and
``check_symmetry(..., samples=0)`` declared a false binding valid; ``--study-seeds S`` built
every seed's data before the first model.
"""

from __future__ import annotations

import pytest
import torch

import quotientsharp as qs
from quotientsharp.cli import main
from quotientsharp.core.checks import check_contract
from quotientsharp.core.validation import check_count
from tests.test_binding_contract import ReLUNeuron, _batches, _binding, _mlp
from tests.test_cli_symmetry import _call


@pytest.mark.parametrize("value", [0, -1])
def test_verify_refuses_zero_seeds(value):
    code, _, stderr = _call("verify", "--seeds", value)
    assert code == 2
    assert f"--seeds must be an integer >= 1, got {value}" in stderr


@pytest.mark.parametrize("value", [0, -2, True, 2.0])
def test_a_symmetry_check_refuses_a_vacuous_sample_count(value):
    with pytest.raises(ValueError, match=f"samples must be an integer >= 1, got {value!r}"):
        qs.models.check_symmetry(_mlp(), _binding(ReLUNeuron()), _batches()[0], samples=value)


@pytest.mark.parametrize("name, options", [
    ("seed", {"seed": True}), ("seed", {"seed": -1}), ("seed", {"seed": 1.5}),
    ("batch_shape entries", {"batch_shape": (0,)}),
])
def test_check_all_refuses_bad_seeds_and_empty_batches(name, options):
    with pytest.raises(ValueError, match=f"{name} must be an integer"):
        qs.checks.check_all(qs.GLQuotient("inv"), **options)


def test_the_contract_and_the_symmetry_seed_refuse_a_bool():
    x = (torch.ones(2, 3, dtype=torch.float64), torch.ones(2, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="seed must be an integer >= 0, got True"):
        check_contract(ReLUNeuron(), x, seed=True)
    with pytest.raises(ValueError, match="seed must be an integer >= 0, got True"):
        qs.models.check_symmetry(_mlp(), _binding(ReLUNeuron()), _batches()[0], seed=True)


def test_check_count_names_the_argument():
    assert check_count("models", 3) == 3
    with pytest.raises(ValueError, match="models must be an integer >= 1, got 0"):
        check_count("models", 0)


class _Stop(Exception):
    pass


def test_study_seeds_build_their_data_lazily(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from quotientsharp.reproduce.families import run as family_run

    pools: list[int] = []
    original = family_run.shuffled_pool

    def counted(data, seed):
        pools.append(seed)
        if len(pools) > 2:
            raise _Stop(f"{len(pools)} pools built before the first model")
        return original(data, seed)

    def first_model(*args, **kwargs):
        raise _Stop(f"first model after {len(pools)} pool(s)")

    monkeypatch.setattr(family_run, "shuffled_pool", counted)
    monkeypatch.setattr(family_run, "_model_record", first_model)
    with pytest.raises(_Stop, match=r"first model after 1 pool\(s\)"):
        main(["reproduce", "bert", "--quick", "--study-seeds", "100000", "--models", "2",
              "--out", str(tmp_path / "bert"), "--no-progress", "--no-plots"])
