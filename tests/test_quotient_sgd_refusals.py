"""A failed step of a quotient optimiser changes nothing, and a state that does not fit is
refused by name.

``QuotientSGD``, ``RiemannianAdamW`` and ``QuotientAdamW``: an update that is not finite (an
overflowing direction at huge weights, a LoRA factor too ill-conditioned for its metric, a NaN
learning rate) or a refusal in a later bucket raises a ``ValueError`` naming the optimiser, and
the model and the optimiser's ``state_dict`` are exactly as before the step; loading the state
of another optimiser class or of a model of another rank is a ``ValueError`` naming the
parameter.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from quotientsharp.models import QuotientSGD
from quotientsharp.models.lora_optimizers import RiemannianAdamW
from quotientsharp.models.quotient_adamw import QuotientAdamW
from tests.test_binding_contract import ReLUNeuron, _binding, _mlp
from tests.tiny_models import lora_mlp

pytest.importorskip("peft")

OPTIMISERS = {"QuotientSGD": lambda m: QuotientSGD(m, 1e-2, momentum=0.9),
              "RiemannianAdamW": lambda m: RiemannianAdamW(m, 1e-2, eps=0.0),
              "QuotientAdamW": lambda m: QuotientAdamW(m, 1e-2)}


def _data(seed: int, features: int = 6):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(16, features, generator=generator, dtype=torch.float64),
            torch.randint(0, 3, (16,), generator=generator))


def _backward(model: nn.Module, seed: int, features: int = 6) -> None:
    x, y = _data(seed, features)
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()


def _same(first, second) -> bool:
    """Exact equality of nested state dicts (tensors bit for bit)."""
    if isinstance(first, torch.Tensor):
        return (isinstance(second, torch.Tensor) and first.dtype == second.dtype
                and torch.equal(first, second))
    if isinstance(first, dict):
        return first.keys() == second.keys() and all(_same(first[k], second[k]) for k in first)
    if isinstance(first, (list, tuple)):
        return len(first) == len(second) and all(map(_same, first, second))
    if isinstance(first, float) and first != first:   # a NaN learning rate is kept as set
        return isinstance(second, float) and second != second
    return first == second


def _refused_and_unchanged(model: nn.Module, optimiser, owner: str, *words: str) -> None:
    model_before = copy.deepcopy(model.state_dict())
    state_before = copy.deepcopy(optimiser.state_dict())
    with pytest.raises(ValueError, match=owner) as info:
        optimiser.step()
    for word in words:
        assert word in str(info.value)
    assert _same(model_before, model.state_dict())
    assert _same(state_before, optimiser.state_dict())


def _trained(owner: str, seed: int, r: int = 3):
    model = lora_mlp(seed, r)
    optimiser = OPTIMISERS[owner](model)
    for step in range(2):                      # a state with moments to keep intact
        _backward(model, seed + step)
        optimiser.step()
    return model, optimiser


def _factor(model: nn.Module, layer: str, side: str) -> torch.Tensor:
    return dict(model.named_parameters())[f"base_model.model.{layer}.lora_{side}.default.weight"]


@pytest.mark.parametrize("owner", OPTIMISERS)
@pytest.mark.parametrize("seed", [0, 1])
def test_a_nan_learning_rate_is_refused_and_nothing_changes(owner, seed):
    model, optimiser = _trained(owner, seed)
    for group in optimiser.param_groups:
        group["lr"] = float("nan")
    _backward(model, seed + 7)
    _refused_and_unchanged(model, optimiser, owner, "lr=nan")


@pytest.mark.parametrize("owner", OPTIMISERS)
@pytest.mark.parametrize("scale", [1e-170, 1e-200])
def test_a_factor_too_ill_conditioned_for_its_metric_is_refused(owner, scale):
    # full rank and finite, but its Gram matrix S_B underflows to singular: every metric's
    # point is refused (QuotientAdamW reads its frames from the factors' QR factors, which
    # hold down to a factor of about 1e-155 where S_B^{-1} would overflow)
    model, optimiser = _trained(owner, 0)
    with torch.no_grad():
        _factor(model, "0", "B").mul_(scale)
    _backward(model, 9)
    _refused_and_unchanged(model, optimiser, owner)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_refusal_in_a_later_bucket_leaves_the_earlier_buckets_moments(seed):
    model, optimiser = _trained("QuotientAdamW", seed)
    with torch.no_grad():
        second = _factor(model, "2", "B")
        second[:, 1] = second[:, 0]            # a rank-deficient pair in the second bucket
    _backward(model, seed + 5)
    _refused_and_unchanged(model, optimiser, "QuotientAdamW", "bucket 1")


@pytest.mark.parametrize("scale", [1e150, 1e160])
def test_an_overflowing_update_of_a_user_quotient_is_refused(scale):
    model = _mlp()
    # built first: its contract check, on every unit, refuses a point that overflows already
    optimiser = QuotientSGD(model, 0.01, symmetries=_binding(ReLUNeuron()))
    with torch.no_grad():
        model[0].weight[4] *= scale
        model[0].bias[4] *= scale
    _backward(model, 3, features=5)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    _refused_and_unchanged(model, optimiser, "QuotientSGD", "nothing changed")


@pytest.mark.parametrize("owner", OPTIMISERS)
@pytest.mark.parametrize("other", OPTIMISERS)
def test_the_state_of_another_optimiser_is_refused_by_name(owner, other):
    _, source = _trained(other, 0)
    model, optimiser = _trained(owner, 1)
    if owner == other:
        optimiser.load_state_dict(source.state_dict())
        return
    before = copy.deepcopy(optimiser.state_dict())
    with pytest.raises(ValueError, match=f"{owner}: .*another optimiser"):
        optimiser.load_state_dict(source.state_dict())
    assert _same(before, optimiser.state_dict())


@pytest.mark.parametrize("owner", ["QuotientSGD", "RiemannianAdamW"])
@pytest.mark.parametrize("rank", [2, 4])
def test_the_state_of_another_rank_is_refused_by_name(owner, rank):
    _, source = _trained(owner, 0, r=rank)
    model, optimiser = _trained(owner, 1, r=3)
    before = copy.deepcopy(optimiser.state_dict())
    with pytest.raises(ValueError, match=f"{owner}: the loaded .* of base_model.*lora.*shape"):
        optimiser.load_state_dict(source.state_dict())
    assert _same(before, optimiser.state_dict())


def _sharpness_refusal(model: nn.Module, symmetries) -> str:
    import quotientsharp as qs

    x, y = _data(0, features=5)
    with pytest.raises((ValueError, TypeError)) as info:
        qs.sharpness(model, [(x, y)], rho=0.05, symmetries=symmetries)
    return str(info.value)


def test_a_binding_whose_point_does_not_broadcast_is_refused_as_by_sharpness():
    from quotientsharp.models import QuotientBinding

    model = _mlp()
    binding = QuotientBinding(ReLUNeuron(), ["0.weight", "2.weight"], folded=1)
    expected = _sharpness_refusal(model, binding)
    with pytest.raises(ValueError, match="do not broadcast") as info:
        QuotientSGD(model, 0.01, symmetries=binding)
    assert expected.split(": ", 1)[1] in str(info.value)   # the same check, the same words


@pytest.mark.parametrize("empty", [[], ()])
def test_an_empty_list_of_symmetries_is_refused_as_by_sharpness(empty):
    model = _mlp()
    expected = _sharpness_refusal(model, empty)
    for make in (lambda: QuotientSGD(model, 0.01, symmetries=empty),
                 lambda: RiemannianAdamW(model, 0.01, symmetries=empty)):
        with pytest.raises(TypeError) as info:
            make()
        assert str(info.value) == expected


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_half_precision_model_steps_a_user_quotient_in_float32(dtype, seed):
    wide = _mlp()
    with torch.no_grad():
        for param in wide.parameters():
            param.add_(0.1 * torch.randn(param.shape, dtype=param.dtype,
                                         generator=torch.Generator().manual_seed(seed)))
    narrow = copy.deepcopy(wide).to(dtype)
    wide = copy.deepcopy(narrow).float()      # the same values, held in float32
    x, y = _data(seed, features=5)
    narrow.zero_grad()
    nn.functional.cross_entropy(narrow(x.to(dtype)).float(), y).backward()
    for small, big in zip(narrow.parameters(), wide.parameters(), strict=True):
        big.grad = small.grad.float()
    QuotientSGD(narrow, 0.05, symmetries=_binding(ReLUNeuron())).step()
    QuotientSGD(wide, 0.05, symmetries=_binding(ReLUNeuron())).step()
    resolution = torch.finfo(dtype).eps
    for small, big in zip(narrow.parameters(), wide.parameters(), strict=True):
        assert small.dtype == dtype and torch.isfinite(small).all()
        # the half step is the float32 step rounded (once for the direction, once for the sum)
        torch.testing.assert_close(small.float(), big, rtol=4 * resolution,
                                   atol=4 * resolution * big.abs().max().item())


PLAIN = {"QuotientSGD": lambda params: torch.optim.SGD(params, 1e-2, momentum=0.9),
         "RiemannianAdamW": lambda params: torch.optim.AdamW(params, 1e-2, weight_decay=0.0),
         "QuotientAdamW": lambda params: torch.optim.AdamW(params, 1e-2, weight_decay=0.0)}


@pytest.mark.parametrize("owner", list(OPTIMISERS))
def test_an_added_param_group_steps_as_the_plain_optimiser_and_resumes(owner):
    # a group added after construction (a learned temperature, say) has no "kind": it steps
    # as torch's own optimiser would step it, and its state_dict loads again
    model = lora_mlp(7, 3)
    optimiser = OPTIMISERS[owner](model)
    extra = nn.Parameter(torch.linspace(-1.0, 1.0, 5, dtype=torch.float64))
    optimiser.add_param_group({"params": [extra]})
    twin = nn.Parameter(extra.detach().clone())
    plain = PLAIN[owner]([twin])
    generator = torch.Generator().manual_seed(3)
    for step in range(3):
        _backward(model, step)
        extra.grad = torch.randn(5, generator=generator, dtype=torch.float64)
        twin.grad = extra.grad.clone()
        optimiser.step()
        plain.step()
    assert torch.equal(extra.detach(), twin.detach())
    assert [group["kind"] for group in optimiser.param_groups][-1] == "other"
    resumed = OPTIMISERS[owner](copy.deepcopy(model))
    resumed.add_param_group({"params": [nn.Parameter(extra.detach().clone())]})
    resumed.load_state_dict(optimiser.state_dict())
    assert _same(resumed.state_dict(), optimiser.state_dict())
    with pytest.raises(ValueError, match=f"{owner}.*kind 'other'"):
        optimiser.add_param_group({"params": [nn.Parameter(torch.ones(2))], "kind": "pairs"})


GEOMETRIES = [
    ("QuotientSGD", {"eps": 1e-2, "metric": "mix"}, {"eps": 1e-2, "metric": "inv"}, "metric"),
    ("QuotientSGD", {"eps": 1e-2}, {"eps": 1e-3}, "eps"),
    ("RiemannianAdamW", {"eps": 1e-2}, {"eps": 0.0}, "damping"),
    ("QuotientAdamW", {"metric": "mix"}, {"metric": "inv", "eps": 1e-2}, "metric"),
    ("QuotientAdamW", {"eps": 0.0}, {"eps": 1e-2}, "eps"),
    ("QuotientAdamW", {"balance": 0.3}, {}, "balance"),
]
MAKERS = {"QuotientSGD": QuotientSGD, "RiemannianAdamW": RiemannianAdamW,
          "QuotientAdamW": QuotientAdamW}


@pytest.mark.parametrize("owner, saved_with, loaded_with, option", GEOMETRIES)
def test_a_state_saved_in_another_geometry_is_refused_by_name(owner, saved_with, loaded_with,
                                                               option):
    # the pairs' moments mean something only in the geometry they were taken in: a state of
    # another metric, damping or balance would continue another training, or fail later
    model = lora_mlp(8, 3)
    source = MAKERS[owner](model, 1e-2, **saved_with)
    for step in range(2):
        _backward(model, step)
        source.step()
    target = MAKERS[owner](copy.deepcopy(model), 1e-2, **loaded_with)
    before = copy.deepcopy(target.state_dict())
    with pytest.raises(ValueError, match=f"{owner}: .*saved with {option}="):
        target.load_state_dict(source.state_dict())
    assert _same(before, target.state_dict())
    MAKERS[owner](copy.deepcopy(model), 1e-2, **saved_with).load_state_dict(source.state_dict())
