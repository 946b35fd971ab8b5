"""QuotientSGD: gradient descent on the GL(r) quotient of LoRA adapters (and any GL pair).

The property: started from ``(A, B)`` and from ``(M A, B M^{-1})``, the mix-metric iterates keep
the same product ``B A`` at every step (float64, 1e-8), because the Riemannian gradient moves as
a tangent vector under the group. With a damping ``eps > 0`` only orthogonal ``M`` keep this,
which the tests check too (so that the property test can fail).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from quotientsharp.core.gl import GLQuotient
from quotientsharp.models import QuotientBinding, QuotientSGD, find_symmetries
from tests.tiny_models import Factored, lora_mlp

peft = pytest.importorskip("peft")


def adapted(seed=0, dtype=torch.float64, random=True, r=3):
    """A small MLP with LoRA adapters on its two hidden layers and a trainable head."""
    return lora_mlp(seed, r, random, dtype)


def data(seed=0, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed + 7)
    return (torch.randn(64, 6, generator=generator, dtype=dtype),
            torch.randn(64, 3, generator=generator, dtype=dtype))


def adapters(model):
    """``[(A, B)]`` of every adapter, found from the parameter names."""
    params = dict(model.named_parameters())
    return [(params[n], params[n.replace("lora_A", "lora_B")]) for n in params
            if ".lora_A." in n]


def act(model, seed, orthogonal=False, condition=30.0):
    """A copy with ``(A, B) -> (M A, B M^{-1})``: ``M`` of the given condition, or orthogonal."""
    moved = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for a, b in adapters(moved):
            r = a.shape[0]
            u, _ = torch.linalg.qr(torch.randn(r, r, generator=generator, dtype=torch.float64))
            v, _ = torch.linalg.qr(torch.randn(r, r, generator=generator, dtype=torch.float64))
            scale = torch.ones(r, dtype=torch.float64) if orthogonal else torch.logspace(
                -0.5, 0.5, r, base=condition, dtype=torch.float64)
            matrix = u @ torch.diag(scale) @ v.T
            a.copy_((matrix @ a.double()).to(a.dtype))
            b.copy_(torch.linalg.solve(matrix, b.double(), left=False).to(b.dtype))
    return moved


def train(model, optimizer, steps, x, y):
    """Plain training loop; returns the losses and the products ``B A`` after each step."""
    losses, products = [], []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = (model(x) - y).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        products.append([(b @ a).detach().clone() for a, b in adapters(model)])
    return losses, products


def largest_relative_gap(first, second):
    return max(float((p - q).norm() / p.norm()) for ps, qs in zip(first, second, strict=True)
               for p, q in zip(ps, qs, strict=True))


# ---------------------------------------------------------------------- equivariance
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("metric, momentum", [("mix", 0.0), ("mix", 0.9), ("inv", 0.0)])
def test_iterates_keep_the_same_product_from_any_point_of_the_orbit(seed, metric, momentum):
    model = adapted(seed)
    moved = act(model, seed + 10)
    x, y = data(seed)
    lr = 0.05 if metric == "mix" else 0.02
    runs = [train(m, QuotientSGD(m, lr=lr, metric=metric, momentum=momentum,
                                 weight_decay=1e-3), 15, x, y) for m in (model, moved)]
    assert largest_relative_gap(runs[0][1], runs[1][1]) < 1e-8
    # it trains: the loss went down
    assert runs[0][0][-1] < runs[0][0][0]


def test_with_damping_only_orthogonal_elements_commute():
    model = adapted(3)
    x, y = data(3)
    runs = {}
    for name, moved in (("base", model), ("orthogonal", act(model, 4, orthogonal=True)),
                        ("general", act(model, 4))):
        runs[name] = train(moved, QuotientSGD(moved, lr=0.05, eps=0.1), 10, x, y)[1]
    assert largest_relative_gap(runs["base"], runs["orthogonal"]) < 1e-8
    assert largest_relative_gap(runs["base"], runs["general"]) > 1e-6


def test_plain_gradient_descent_is_not_equivariant():
    """The property test can fail: torch's SGD on the same pairs drifts apart along the orbit."""
    model = adapted(5)
    moved = act(model, 6)
    x, y = data(5)
    runs = [train(m, torch.optim.SGD(m.parameters(), lr=0.05), 10, x, y)[1]
            for m in (model, moved)]
    assert largest_relative_gap(*runs) > 1e-4


# ---------------------------------------------------------------------- the step itself
def test_the_mix_step_is_the_scaled_gradient_step_and_the_rest_is_sgd():
    model = adapted(7)
    x, y = data(7)
    before = {n: t.detach().clone() for n, t in model.named_parameters()}
    optimizer = QuotientSGD(model, lr=0.1, metric="mix")
    loss = (model(x) - y).square().mean()
    loss.backward()
    grads = {n: t.grad.clone() for n, t in model.named_parameters() if t.grad is not None}
    optimizer.step()
    after = dict(model.named_parameters())
    for name in grads:
        if ".lora_A." in name:
            b_name = name.replace("lora_A", "lora_B")
            a, b = before[name], before[b_name]
            # grad_A = (B^T B)^{-1} dL/dA, grad_B = dL/dB (A A^T)^{-1}
            step_a = torch.linalg.solve(b.T @ b, grads[name])
            step_b = torch.linalg.solve(a @ a.T, grads[b_name], left=False)
            torch.testing.assert_close(after[name], a - 0.1 * step_a, rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(after[b_name], b - 0.1 * step_b, rtol=1e-10, atol=1e-12)
        elif "lora_" not in name:     # modules_to_save: plain SGD
            torch.testing.assert_close(after[name], before[name] - 0.1 * grads[name])
    assert [g["kind"] for g in optimizer.param_groups] == ["pairs", "other"]


def test_a_fresh_adapter_needs_damping_and_then_trains():
    model = adapted(8, random=False)          # PEFT's B = 0
    x, y = data(8)
    optimizer = QuotientSGD(model, lr=0.05)
    (model(x) - y).square().mean().backward()
    with pytest.raises(ValueError, match="eps > 0"):
        optimizer.step()
    model = adapted(8, random=False)
    losses, _ = train(model, QuotientSGD(model, lr=0.05, eps=1e-3, momentum=0.5), 40, x, y)
    assert all(math.isfinite(value) for value in losses) and losses[-1] < 0.9 * losses[0]


def test_float32_model_steps_and_state_dict_round_trips():
    model = adapted(9, dtype=torch.float32)
    x, y = data(9, torch.float32)
    optimizer = QuotientSGD(model, lr=0.05, momentum=0.9)
    train(model, optimizer, 3, x, y)
    state = optimizer.state_dict()
    clone = QuotientSGD(model, lr=0.05, momentum=0.9)
    clone.load_state_dict(state)
    buffers = [clone.state[p]["momentum_buffer"] for p in model.parameters() if p.requires_grad]
    assert buffers and all(b.dtype == torch.float32 for b in buffers)


def test_bindings_step_like_the_discovered_pairs():
    x = torch.randn(16, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = torch.randn(16, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    binding = QuotientBinding(GLQuotient("mix"), ["left", "right"],
                              to_point=lambda p: (p["left"], p["right"].T),
                              from_point=lambda point: {"left": point[0], "right": point[1].T},
                              name="product")
    model = Factored()
    optimizer = QuotientSGD(model, lr=0.1, symmetries=[binding])
    left, right = model.left.detach().clone(), model.right.detach().clone()
    (model(x) - y).square().mean().backward()
    grad_left, grad_right = model.left.grad.clone(), model.right.grad.clone()
    optimizer.step()
    torch.testing.assert_close(model.left.detach(),
                               left - 0.1 * torch.linalg.solve(right @ right.T, grad_left,
                                                               left=False))
    torch.testing.assert_close(model.right.detach(),
                               right - 0.1 * torch.linalg.solve(left.T @ left, grad_right))


@pytest.mark.parametrize("options, message", [
    ({"lr": 0.0}, "lr"), ({"lr": float("nan")}, "lr"), ({"lr": 0.1, "metric": "euclid"}, "metric"),
    ({"lr": 0.1, "eps": -1.0}, "eps"), ({"lr": 0.1, "momentum": 1.0}, "momentum"),
    ({"lr": 0.1, "weight_decay": -0.1}, "weight_decay"),
    ({"lr": 0.1, "symmetries": "none"}, "symmetries"),
])
def test_bad_options_name_the_argument(options, message):
    with pytest.raises(ValueError, match=message):
        QuotientSGD(adapted(0), **options)


def test_the_report_of_the_optimizer_keeps_degenerate_adapters_as_pairs():
    model = adapted(0, random=False)
    optimizer = QuotientSGD(model, lr=0.1, symmetries=find_symmetries(model, degenerate="pair"),
                            eps=1e-3)
    pair_names = {id(p) for p in optimizer.param_groups[0]["params"]}
    assert all(id(t) in pair_names for n, t in model.named_parameters() if "lora_" in n)


def test_the_benchmark_runs_with_tiny_sizes(tmp_path):
    pytest.importorskip("matplotlib")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "lora_optimizer.py"
    spec = importlib.util.spec_from_file_location("lora_optimizer_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    try:
        results = module.main(["--quick", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    assert (tmp_path / "lora_optimizer.png").stat().st_size > 0
    assert set(results["methods"]) == {"QuotientSGD mix", "QuotientAdamW mix",
                                       "QuotientAdamW mix eps 0.01", "AdamW"}
    for method in results["methods"].values():
        assert len(method["losses"]) == 30 and method["seconds_per_step"] > 0
        assert method["losses"][-1] < method["losses"][0]


@pytest.mark.parametrize("where", ["gradient", "value"])
def test_a_non_finite_step_is_refused_by_name_and_changes_nothing(where) -> None:
    model = adapted(3)
    optimizer = QuotientSGD(model, lr=0.1, metric="mix", eps=1e-3, momentum=0.9)
    x, y = data(3)
    torch.nn.functional.mse_loss(model(x), y).backward()
    name, tensor = next((n, t) for n, t in model.named_parameters() if "lora_B" in n)
    with torch.no_grad():
        if where == "gradient":
            tensor.grad[0, 0] = float("nan")
        else:
            tensor[0, 0] = float("inf")
    before = {n: t.detach().clone() for n, t in model.named_parameters()}
    with pytest.raises(ValueError, match=rf"QuotientSGD: NaN or inf in {name} \({where}\)"):
        optimizer.step()
    for n, t in model.named_parameters():
        assert torch.equal(t, before[n]) or not torch.isfinite(before[n]).all(), n
    assert not optimizer.state


@pytest.mark.parametrize("name", ["QuotientSGD", "QuotientAdamW", "RiemannianAdamW"])
def test_a_model_without_pairs_warns_at_the_callers_line(name) -> None:
    import quotientsharp as qs
    import quotientsharp.models as models

    optimiser = getattr(models, name)
    with pytest.warns(qs.NoSymmetryWarning, match=f"{name}: no symmetry pair") as caught:
        optimiser(torch.nn.Linear(3, 2), lr=0.1)
    assert caught[0].filename == __file__
