"""The published LoRA optimisers on the library's geometry, against PEFT's own implementations.

``RiemannianAdamW`` (Zhang & Pilanci: AdamW on ``dL/dB (A A^T + delta I)^{-1}`` and
``(B^T B + delta I)^{-1} dL/dA``) must take the steps of PEFT's ``create_riemannian_optimizer``
with ``torch.optim.AdamW``, and ``loraplus_adamw`` those of ``create_loraplus_optimizer``, to
rounding in float64 over several steps, from random adapters and from PEFT's ``B = 0``; the
parameters outside the pairs step exactly as ``torch.optim.AdamW``; attention heads are raised
like adapters.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from quotientsharp.core.gl import GLQuotient
from quotientsharp.models import ParameterLayout, QuotientBinding, find_symmetries
from quotientsharp.models.lora_optimizers import (
    RiemannianAdamW,
    loraplus_adamw,
    loraplus_param_groups,
)
from tests.tiny_models import Factored, lora_mlp, tiny_bert_classifier

peft = pytest.importorskip("peft")
from peft.optimizers import create_loraplus_optimizer, create_riemannian_optimizer  # noqa: E402

# transformers warns about a renamed attribute whenever PEFT wraps one of its models
pytestmark = pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")


def adapted_mlp(seed: int, r: int, random: bool, dtype=torch.float64) -> nn.Module:
    """An MLP with LoRA on its hidden layers and a trainable head without bias (PEFT's LoRA+
    puts every 1-D parameter at the B rate, which the library does not)."""
    return lora_mlp(seed, r, random, dtype, head_bias=False)


def adapted_bert(seed: int) -> nn.Module:
    """The tiny BERT classifier with LoRA (rank 2) on query and value, PEFT's initialisation,
    in eval mode (no dropout: two runs see the same gradients)."""
    base = tiny_bert_classifier()
    torch.manual_seed(seed)
    return peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["query", "value"],
                                                     modules_to_save=["classifier"])).eval()


def mlp_data(seed: int, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed + 1000)
    return (torch.randn(32, 6, generator=generator, dtype=dtype),
            torch.randint(0, 3, (32,), generator=generator))


def bert_data(seed: int):
    generator = torch.Generator().manual_seed(seed + 1000)
    return (torch.randint(0, 30, (8, 6), generator=generator),
            torch.randint(0, 3, (8,), generator=generator))


def trajectory(model: nn.Module, make, x, y, steps: int) -> list[dict[str, torch.Tensor]]:
    """The trainable parameters after every step of ``make(model)`` on cross-entropy."""
    optimizer = make(model)
    states = []
    for _ in range(steps):
        optimizer.zero_grad()
        output = model(x)
        logits = output.logits if hasattr(output, "logits") else output
        nn.functional.cross_entropy(logits, y).backward()
        optimizer.step()
        states.append({n: t.detach().clone() for n, t in model.named_parameters()
                       if t.requires_grad})
    return states


def assert_same_trajectories(first, second):
    assert len(first) == len(second)
    for step, (a, b) in enumerate(zip(first, second, strict=True)):
        assert a.keys() == b.keys()
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=1e-10, atol=1e-12,
                                       msg=lambda m, s=step, n=name: f"step {s}, {n}: {m}")


# ------------------------------------------------------------------ against PEFT
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("r", [1, 3])
@pytest.mark.parametrize("random", [True, False])
def test_riemannian_adamw_takes_the_steps_of_peft(seed, r, random):
    reg = [1e-2, 1e-3, 0.3][seed]
    options = {"weight_decay": [0.0, 0.1, 0.01][seed], "betas": [(0.9, 0.999), (0.8, 0.99),
                                                                  (0.5, 0.9)][seed]}
    model = adapted_mlp(seed, r, random)
    x, y = mlp_data(seed)
    theirs = trajectory(copy.deepcopy(model), lambda m: create_riemannian_optimizer(
        m, torch.optim.AdamW, lr=0.02, reg=reg, **options), x, y, 8)
    ours = trajectory(model, lambda m: RiemannianAdamW(m, 0.02, eps=reg, **options), x, y, 8)
    assert_same_trajectories(ours, theirs)
    # the adapters moved (B = 0 included): the comparison is not of two standing models
    assert not torch.equal(ours[-1]["base_model.model.0.lora_B.default.weight"],
                           ours[0]["base_model.model.0.lora_B.default.weight"])


def test_riemannian_adamw_without_damping_on_full_rank_adapters_is_peft_at_reg_zero():
    model = adapted_mlp(4, 2, random=True)
    x, y = mlp_data(4)
    theirs = trajectory(copy.deepcopy(model), lambda m: create_riemannian_optimizer(
        m, torch.optim.AdamW, lr=0.01, reg=0.0, weight_decay=0.0), x, y, 6)
    ours = trajectory(model, lambda m: RiemannianAdamW(m, 0.01, eps=0.0), x, y, 6)
    assert_same_trajectories(ours, theirs)


@pytest.mark.parametrize("seed", [0, 1])
def test_riemannian_adamw_on_a_peft_bert_takes_the_steps_of_peft(seed):
    model = adapted_bert(seed)
    x, y = bert_data(seed)
    theirs = trajectory(copy.deepcopy(model), lambda m: create_riemannian_optimizer(
        m, torch.optim.AdamW, lr=0.01, reg=1e-3, weight_decay=0.05), x, y, 5)
    ours = trajectory(model, lambda m: RiemannianAdamW(m, 0.01, eps=1e-3, weight_decay=0.05),
                      x, y, 5)
    assert_same_trajectories(ours, theirs)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("random", [True, False])
def test_loraplus_takes_the_steps_of_peft(seed, random):
    ratio, decay = [16.0, 4.0, 1.0][seed], [0.0, 0.1, 0.01][seed]
    model = adapted_mlp(seed, 2, random)
    x, y = mlp_data(seed)
    theirs = trajectory(copy.deepcopy(model), lambda m: create_loraplus_optimizer(
        m, torch.optim.AdamW, lr=0.01, loraplus_lr_ratio=ratio, loraplus_weight_decay=decay),
        x, y, 6)
    ours = trajectory(model, lambda m: loraplus_adamw(m, 0.01, ratio=ratio, weight_decay=decay),
                      x, y, 6)
    assert_same_trajectories(ours, theirs)


def test_loraplus_groups_put_b_at_ratio_times_the_rate_of_a():
    model = adapted_bert(0)
    groups = loraplus_param_groups(model, 1e-3, ratio=8.0)
    names = {id(t): n for n, t in model.named_parameters()}
    by_kind = {g["kind"]: (g["lr"], [names[id(p)] for p in g["params"]]) for g in groups}
    assert set(by_kind) == {"lora_b", "lora_a", "other"}
    assert by_kind["lora_b"][0] == pytest.approx(8e-3) and by_kind["lora_a"][0] == 1e-3
    assert all(".lora_B." in n for n in by_kind["lora_b"][1]) and len(by_kind["lora_b"][1]) == 2
    assert all(".lora_A." in n for n in by_kind["lora_a"][1]) and len(by_kind["lora_a"][1]) == 2
    assert all("classifier" in n for n in by_kind["other"][1])


# ------------------------------------------------------------------ the rest is AdamW
@pytest.mark.parametrize("make", [
    lambda m: RiemannianAdamW(m, 0.03, eps=1e-2, weight_decay=0.1, betas=(0.7, 0.95)),
    lambda m: loraplus_adamw(m, 0.03, ratio=16.0, weight_decay=0.1, betas=(0.7, 0.95)),
], ids=["riemannian", "loraplus"])
def test_parameters_outside_the_pairs_step_exactly_like_adamw(make):
    model = adapted_bert(3)
    for name, tensor in model.named_parameters():      # a trainable body beside the adapters
        if "LayerNorm" in name or "pooler" in name:
            tensor.requires_grad_(True)
    reference = copy.deepcopy(model)
    ours = make(model)
    outside = [n for n, t in model.named_parameters() if t.requires_grad and "lora_" not in n]
    reference_params = dict(reference.named_parameters())
    theirs = torch.optim.AdamW([reference_params[n] for n in outside], lr=0.03,
                               weight_decay=0.1, betas=(0.7, 0.95))
    generator = torch.Generator().manual_seed(5)
    named = dict(model.named_parameters())
    for _ in range(5):
        for name, tensor in named.items():
            if tensor.requires_grad:
                tensor.grad = torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype)
                if name in outside:
                    reference_params[name].grad = tensor.grad.clone()
        ours.step()
        theirs.step()
        for name in outside:
            assert torch.equal(named[name], reference_params[name]), name


def test_the_gradients_are_given_back_unchanged_after_a_step():
    model = adapted_mlp(0, 2, random=True)
    x, y = mlp_data(0)
    optimizer = RiemannianAdamW(model, 0.01)
    nn.functional.cross_entropy(model(x), y).backward()
    before = {n: t.grad.clone() for n, t in model.named_parameters() if t.grad is not None}
    optimizer.step()
    assert all(torch.equal(t.grad, before[n]) for n, t in model.named_parameters()
               if n in before)


# ------------------------------------------------------------------ any bound pair
def test_attention_heads_are_raised_like_adapters():
    model = tiny_bert_classifier().eval()
    model.bert.embeddings.requires_grad_(False)
    report = find_symmetries(model)
    assert report.groups, "the tiny BERT must have attention pairs"
    x, y = bert_data(1)
    delta, lr = 0.05, 0.01
    layout = ParameterLayout(report, dict(model.named_parameters()))
    values = {n: t.detach().clone() for n, t in model.named_parameters() if n in layout.names}
    optimizer = RiemannianAdamW(model, lr, eps=delta, symmetries=report, betas=(0.0, 0.5))
    nn.functional.cross_entropy(model(x).logits, y).backward()
    grads = dict(values)
    grads.update({n: t.grad.clone() for n, t in model.named_parameters() if n in layout.names})
    # the scaled gradient written here: dL/dG (H^T H + delta I)^{-1}, dL/dH (G^T G + delta I)^-1
    coords, egrads = layout.to_coordinates(values), layout.to_coordinates(grads)
    scaled = []
    for (G, H), (dG, dH) in zip(coords.gl, egrads.gl, strict=True):
        eye = torch.eye(G.shape[-1], dtype=G.dtype)
        scaled.append((torch.linalg.solve(H.mT @ H + delta * eye, dG, left=False),
                       torch.linalg.solve(G.mT @ G + delta * eye, dH, left=False)))
    expected_grads = layout.to_parameters(coords.replace(gl=scaled))
    pair_params = [t for n, t in model.named_parameters()
                   if n in layout.names and n not in report.other]
    expected = copy.deepcopy(model)
    expected_named = dict(expected.named_parameters())
    names = {id(t): n for n, t in model.named_parameters()}
    reference = torch.optim.AdamW([expected_named[names[id(p)]] for p in pair_params], lr=lr,
                                  weight_decay=0.0, betas=(0.0, 0.5))
    for p in pair_params:
        expected_named[names[id(p)]].grad = expected_grads[names[id(p)]].clone()
    optimizer.step()
    reference.step()
    for p in pair_params:
        torch.testing.assert_close(p.detach(), expected_named[names[id(p)]].detach(),
                                   rtol=1e-10, atol=1e-12)
    assert optimizer.param_groups[0]["kind"] == "pairs"


def test_a_binding_is_raised_by_its_own_quotient():
    binding = QuotientBinding(GLQuotient("mix", 0.1), ["left", "right"],
                              to_point=lambda p: (p["left"], p["right"].T),
                              from_point=lambda point: {"left": point[0], "right": point[1].T},
                              name="product")
    model = Factored()
    x = torch.randn(16, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    left, right = model.left.detach().clone(), model.right.detach().clone()
    optimizer = RiemannianAdamW(model, 0.1, symmetries=binding, betas=(0.0, 0.0),
                                adam_eps=1e-300)
    (model(x)).square().mean().backward()
    grad_left, grad_right = model.left.grad.clone(), model.right.grad.clone()
    optimizer.step()
    # betas (0, 0): the AdamW step is lr * g / |g| entrywise, with g the raised gradient
    eye = torch.eye(2, dtype=torch.float64)
    raised_left = torch.linalg.solve(right @ right.T + 0.1 * eye, grad_left, left=False)
    raised_right = torch.linalg.solve(left.T @ left + 0.1 * eye, grad_right)
    torch.testing.assert_close(model.left.detach(), left - 0.1 * raised_left.sign())
    torch.testing.assert_close(model.right.detach(), right - 0.1 * raised_right.sign())
    # the sign of the raised gradient is not that of the plain one (else this checks nothing)
    assert not torch.equal(raised_left.sign(), grad_left.sign()) or not torch.equal(
        raised_right.sign(), grad_right.sign())


# ------------------------------------------------------------------ start, dtype, resume
def test_a_fresh_adapter_needs_damping():
    model = adapted_mlp(0, 2, random=False)
    x, y = mlp_data(0)
    optimizer = RiemannianAdamW(model, 0.01, eps=0.0)
    nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(ValueError, match="eps > 0"):
        optimizer.step()


def test_float32_trains_and_state_dict_resumes_identically():
    model = adapted_mlp(2, 2, random=False, dtype=torch.float32)
    x, y = mlp_data(2, torch.float32)
    optimizer = RiemannianAdamW(model, 0.01)
    losses = []
    for step in range(30):
        if step == 10:
            saved_model, saved_state = copy.deepcopy(model), copy.deepcopy(optimizer.state_dict())
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
    assert all(t.dtype == torch.float32 for t in model.parameters())
    resumed = RiemannianAdamW(saved_model, 0.01)
    resumed.load_state_dict(saved_state)
    for _ in range(20):
        resumed.zero_grad()
        nn.functional.cross_entropy(saved_model(x), y).backward()
        resumed.step()
    for a, b in zip(model.parameters(), saved_model.parameters(), strict=True):
        assert torch.equal(a, b)


# ------------------------------------------------------------------ bad arguments
@pytest.mark.parametrize("options, message", [
    ({"lr": 0.0}, "lr"), ({"lr": -1.0}, "lr"), ({"lr": float("nan")}, "lr"),
    ({"lr": True}, "lr"), ({"lr": 0.1, "eps": -1e-3}, "eps"),
    ({"lr": 0.1, "eps": float("inf")}, "eps"), ({"lr": 0.1, "weight_decay": -0.1},
                                                 "weight_decay"),
    ({"lr": 0.1, "betas": (1.0, 0.9)}, r"betas\[0\]"),
    ({"lr": 0.1, "betas": (0.9, -0.1)}, r"betas\[1\]"), ({"lr": 0.1, "betas": (0.9,)}, "betas"),
    ({"lr": 0.1, "adam_eps": 0.0}, "adam_eps"), ({"lr": 0.1, "symmetries": "none"}, "symmetries"),
])
def test_riemannian_adamw_names_a_bad_argument(options, message):
    with pytest.raises(ValueError, match=message):
        RiemannianAdamW(adapted_mlp(0, 2, random=False), **options)


@pytest.mark.parametrize("options, message", [
    ({"lr": 0.0}, "lr"), ({"lr": float("nan")}, "lr"), ({"lr": 0.1, "ratio": 0.0}, "ratio"),
    ({"lr": 0.1, "ratio": float("inf")}, "ratio"), ({"lr": 0.1, "weight_decay": -1.0},
                                                    "weight_decay"),
    ({"lr": 0.1, "kinds": "lora"}, "kinds"), ({"lr": 0.1, "betas": (0.9, 1.0)}, r"betas\[1\]"),
    ({"lr": 0.1, "adam_eps": -1.0}, "adam_eps"), ({"lr": 0.1, "symmetries": "x"}, "symmetries"),
])
def test_loraplus_names_a_bad_argument(options, message):
    with pytest.raises(ValueError, match=message):
        loraplus_adamw(adapted_mlp(0, 2, random=False), **options)


@pytest.mark.parametrize("random", [True, False])
def test_riemannian_adamw_in_float16_needs_an_adam_eps_that_float16_holds(random):
    # torch's AdamW with eps=1e-8 (zero in float16) divides by zero where v underflows
    model = adapted_mlp(3, 2, random=random).half()
    with pytest.raises(ValueError, match="^adam_eps.*float16"):
        RiemannianAdamW(model, 0.02)
    with pytest.raises(ValueError, match="^adam_eps.*float16"):
        loraplus_adamw(model, 0.02)
    x, y = mlp_data(3, dtype=torch.float16)
    optimizer = RiemannianAdamW(model, 0.02, adam_eps=1e-4)
    losses = []
    for _ in range(10):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(bool(torch.isfinite(t).all()) for t in model.parameters())
    assert losses[-1] < losses[0]


def test_a_model_that_is_no_module_is_refused():
    with pytest.raises(TypeError, match="model"):
        RiemannianAdamW([torch.zeros(2)], 0.1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="model"):
        loraplus_param_groups([torch.zeros(2)], 0.1)  # type: ignore[arg-type]


def test_a_riemannian_step_on_nan_is_refused_and_changes_nothing():
    model = adapted_mlp(0, 2, random=True)
    x, y = mlp_data(0)
    optimizer = RiemannianAdamW(model, 0.01)
    trajectory(model, lambda m: optimizer, x, y, 2)
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    name = "base_model.model.0.lora_B.default.weight"
    dict(model.named_parameters())[name].grad[0, 0] = float("inf")
    values = {n: t.detach().clone() for n, t in model.named_parameters()}
    steps = [float(s["step"]) for s in optimizer.state.values()]
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        optimizer.step()
    assert all(torch.equal(t, values[n]) for n, t in model.named_parameters())
    assert [float(s["step"]) for s in optimizer.state.values()] == steps


@pytest.mark.parametrize("kinds", [("loar",), ("lora", "qq"), ()])
def test_loraplus_refuses_kinds_that_select_no_known_pair(kinds):
    with pytest.raises(ValueError, match="kinds"):
        loraplus_param_groups(adapted_mlp(0, 2, random=False), 0.1, kinds=kinds)


def test_loraplus_on_a_model_without_adapters_is_refused():
    model = tiny_bert_classifier()              # attention heads, no LoRA adapter
    with pytest.raises(ValueError, match=r"kinds.*\['qk', 'vo'\]"):
        loraplus_adamw(model, 0.1)
    groups = loraplus_param_groups(model, 0.1, kinds=("qk",))      # the heads by name
    assert [g["kind"] for g in groups] == ["lora_b", "lora_a", "other"]


@pytest.mark.parametrize("eps", [0.0, 1e-2])
def test_riemannian_adamw_is_not_invariant_even_under_orthogonal_elements(eps):
    # per-entry moments see a rotation: two starts one orthogonal M apart drift apart
    model = adapted_mlp(0, 3, random=True)
    moved = copy.deepcopy(model)
    layout = ParameterLayout(find_symmetries(moved, degenerate="pair"),
                             dict(moved.named_parameters()))
    coords = layout.to_coordinates({n: t.detach() for n, t in moved.named_parameters()})
    quotient, generator = GLQuotient("mix"), torch.Generator().manual_seed(5)
    rotated = [quotient.act(point, quotient.random_group_element(point, condition=1.0,
                                                                 generator=generator))
               for point in coords.gl]
    with torch.no_grad():
        for name, tensor in layout.to_parameters(coords.replace(gl=rotated)).items():
            dict(moved.named_parameters())[name].copy_(tensor)
    x, y = mlp_data(0)
    products = []
    for net in (model, moved):
        trajectory(net, lambda m: RiemannianAdamW(m, 0.02, eps=eps), x, y, 20)
        trained = layout.to_coordinates({n: t.detach() for n, t in net.named_parameters()})
        products.append([g @ h.mT for g, h in trained.gl])
    gap = max(float((p - q).norm() / p.norm()) for p, q in zip(*products, strict=True))
    assert gap > 1e-2
