"""QuotientAdamW: AdamW-like moments on every GL pair that the pair's group does not change.

The property: started from ``(G, H)`` and from ``(G M^{-1}, H M^T)`` (``M`` of condition up to
100, drawn by the core's ``random_group_element``), the products ``G H^T`` of every pair agree
to rounding over 30 steps (float64), for LoRA adapters of ranks 1 to 8 and for attention heads,
with both metrics, and from PEFT's ``B = 0``. The controls show that the test can fail:
torch's AdamW drifts apart, and a damped step keeps the property for orthogonal ``M`` only.
"""

from __future__ import annotations

import copy
import importlib.util
import io
import math
from pathlib import Path

import pytest
import torch

from quotientsharp.core.gl import GLQuotient
from quotientsharp.models import QuotientBinding, find_symmetries
from quotientsharp.models.layout import ParameterLayout
from quotientsharp.models.quotient_adamw import QuotientAdamW
from tests.tiny_models import (
    Factored,
    lora_mlp,
    randomize_adapters,
    tiny_bert,
    tiny_bert_classifier,
)

peft = pytest.importorskip("peft")


def adapted(seed=0, dtype=torch.float64, random=True, r=3):
    """An MLP with LoRA adapters of rank ``r`` on its two hidden layers and a trainable head;
    ``random``: adapters drawn at scale 1/2, else PEFT's start (``B = 0``)."""
    return lora_mlp(seed, r, random, dtype, widths=(10, 12, 9, 3))


def data(seed=0, dtype=torch.float64, features=10):
    generator = torch.Generator().manual_seed(seed + 7)       # float64 draws, then rounded
    return (torch.randn(64, features, generator=generator, dtype=torch.float64).to(dtype),
            torch.randn(64, 3, generator=generator, dtype=torch.float64).to(dtype))


def layout_of(model):
    report = find_symmetries(model, degenerate="pair")
    return ParameterLayout(report, dict(model.named_parameters()))


def pair_products(model):
    """``G H^T`` of every bucket of pairs (all adapters or heads of one shape), detached."""
    coords = layout_of(model).to_coordinates({n: t.detach()
                                              for n, t in model.named_parameters()})
    return [(g @ h.mT).clone() for g, h in coords.gl]


def act(model, seed, condition, orthogonal=False):
    """A copy with every pair moved to ``(G M^{-1}, H M^T)``, one ``M`` of the given condition
    per pair (``orthogonal``: condition 1, an orthogonal ``M``)."""
    moved = copy.deepcopy(model)
    layout = layout_of(moved)
    params = {n: t.detach() for n, t in moved.named_parameters()}
    coords = layout.to_coordinates(params)
    generator = torch.Generator().manual_seed(seed)
    quotient = GLQuotient("mix")
    acted = []
    for point in coords.gl:
        element = quotient.random_group_element(point, condition=1.0 if orthogonal else condition,
                                                generator=generator)
        acted.append(quotient.act(point, element))
    new = layout.to_parameters(coords.replace(gl=acted))
    with torch.no_grad():
        for name, tensor in moved.named_parameters():
            if name in new:
                tensor.copy_(new[name])
    return moved


def mse_loss(model, x, y):
    return (model(x) - y).square().mean()


def train(model, optimizer, steps, loss_of):
    """Plain training loop; the losses and the pairs' products after each step."""
    losses, products = [], []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_of(model)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        products.append(pair_products(model))
    return losses, products


def largest_relative_gap(first, second):
    return max(float((p - q).norm() / p.norm()) for ps, qs in zip(first, second, strict=True)
               for p, q in zip(ps, qs, strict=True))


# ---------------------------------------------------------------------- invariance
CASES = [(0, 1, 1.0), (1, 2, 100.0), (2, 3, 30.0), (3, 4, 100.0), (4, 5, 3.0),
         (5, 6, 100.0), (6, 8, 10.0), (7, 8, 100.0)]


@pytest.mark.parametrize("seed, rank, condition", CASES)
@pytest.mark.parametrize("metric", ["mix", "inv"])
def test_lora_trajectories_stay_on_one_orbit(seed, rank, condition, metric):
    model = adapted(seed, r=rank)
    moved = act(model, seed + 50, condition)
    x, y = data(seed)
    runs = [train(m, QuotientAdamW(m, lr=0.02, metric=metric, weight_decay=0.01), 30,
                  lambda net: mse_loss(net, x, y)) for m in (model, moved)]
    assert largest_relative_gap(runs[0][1], runs[1][1]) < 1e-6
    assert runs[0][0][-1] < 0.9 * runs[0][0][0]          # and it trains


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_from_peft_zero_start_the_trajectories_stay_on_one_orbit(seed):
    model = adapted(seed, random=False, r=4)
    moved = act(model, seed + 60, 100.0)
    x, y = data(seed)
    runs = [train(m, QuotientAdamW(m, lr=0.02), 30, lambda net: mse_loss(net, x, y))
            for m in (model, moved)]
    assert largest_relative_gap(runs[0][1], runs[1][1]) < 1e-6


@pytest.mark.parametrize("metric", ["mix", "inv"])
def test_attention_heads_stay_on_one_orbit(metric):
    model = tiny_bert_classifier().eval()                 # no dropout: one loss per start
    moved = act(model, 70, 100.0)
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 30, (8, 6), generator=generator)
    labels = torch.randint(0, 3, (8,), generator=generator)

    def loss_of(net):
        return net(input_ids=ids, labels=labels).loss

    runs = [train(m, QuotientAdamW(m, lr=0.01, metric=metric), 30, loss_of)
            for m in (model, moved)]
    assert largest_relative_gap(runs[0][1], runs[1][1]) < 1e-6
    assert runs[0][0][-1] < runs[0][0][0]


def test_adamw_is_not_invariant():
    """The property test can fail: torch's AdamW on the same start drifts apart."""
    model = adapted(8)
    moved = act(model, 80, 10.0)
    x, y = data(8)
    runs = [train(m, torch.optim.AdamW(m.parameters(), lr=0.02), 10,
                  lambda net: mse_loss(net, x, y))[1] for m in (model, moved)]
    assert largest_relative_gap(*runs) > 1e-3


def test_with_damping_only_orthogonal_elements_keep_the_orbit():
    model = adapted(9)
    x, y = data(9)
    runs = {}
    for name, start in (("base", model), ("orthogonal", act(model, 90, 1.0, orthogonal=True)),
                        ("general", act(model, 90, 30.0))):
        runs[name] = train(start, QuotientAdamW(start, lr=0.02, eps=0.1), 10,
                           lambda net: mse_loss(net, x, y))[1]
    assert largest_relative_gap(runs["base"], runs["orthogonal"]) < 1e-6
    assert largest_relative_gap(runs["base"], runs["general"]) > 1e-4


# ---------------------------------------------------------------------- the other parameters
def test_parameters_outside_pairs_step_exactly_like_torch_adamw():
    model = adapted(10)
    head = [n for n, t in model.named_parameters() if t.requires_grad and "lora_" not in n]
    assert head                                            # modules_to_save: the head
    reference = {n: t.detach().clone().requires_grad_(True) for n, t in model.named_parameters()
                 if n in head}
    options = {"lr": 0.03, "weight_decay": 0.1, "betas": (0.8, 0.99)}
    ours = QuotientAdamW(model, adam_eps=1e-6, **options)
    theirs = torch.optim.AdamW(list(reference.values()), eps=1e-6, **options)
    params = dict(model.named_parameters())
    generator = torch.Generator().manual_seed(11)
    for _ in range(6):
        for name, tensor in params.items():
            if tensor.requires_grad:
                grad = torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype)
                tensor.grad = grad
                if name in reference:
                    reference[name].grad = grad.clone()
        ours.step()
        theirs.step()
    for name in head:
        assert torch.equal(params[name].detach(), reference[name].detach()), name


# ---------------------------------------------------------------------- arguments
@pytest.mark.parametrize("options, argument", [
    ({"lr": 0.0}, "lr"), ({"lr": -1.0}, "lr"), ({"lr": math.nan}, "lr"),
    ({"lr": math.inf}, "lr"), ({"lr": True}, "lr"),
    ({"betas": (1.0, 0.9)}, r"betas\[0\]"), ({"betas": (0.9, -0.1)}, r"betas\[1\]"),
    ({"betas": (math.nan, 0.9)}, r"betas\[0\]"), ({"betas": (0.9, math.inf)}, r"betas\[1\]"),
    ({"betas": (0.9,)}, "betas"), ({"betas": 0.9}, "betas"),
    ({"eps": -1e-3}, "eps"), ({"eps": math.nan}, "eps"),
    ({"weight_decay": -0.1}, "weight_decay"), ({"weight_decay": math.inf}, "weight_decay"),
    ({"adam_eps": 0.0}, "adam_eps"), ({"adam_eps": math.nan}, "adam_eps"),
    ({"metric": "euclidean"}, "metric"), ({"symmetries": "all"}, "symmetries"),
])
def test_bad_arguments_are_refused_by_name(options, argument):
    model = adapted(12)
    arguments = {"lr": 0.01, **options}
    with pytest.raises(ValueError, match=f"^{argument}"):
        QuotientAdamW(model, **arguments)


def test_bad_types_are_refused():
    with pytest.raises(TypeError, match="model"):
        QuotientAdamW(object(), lr=0.01)  # type: ignore[arg-type]
    model = Factored()
    binding = QuotientBinding(GLQuotient("mix"), ["left", "right"],
                              to_point=lambda p: (p["left"], p["right"].mT),
                              from_point=lambda x: {"left": x[0], "right": x[1].mT})
    with pytest.raises(TypeError, match="symmetries"):
        QuotientAdamW(model, lr=0.01, symmetries=[binding])


# ---------------------------------------------------------------------- degenerate pairs
def test_peft_zero_start_trains_with_the_defaults():
    model = adapted(13, random=False)
    x, y = data(13)
    losses, _ = train(model, QuotientAdamW(model, lr=0.02), 40, lambda net: mse_loss(net, x, y))
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.5 * losses[0]
    # both factors moved: B left zero, and A too (from its second step on)
    moved = [t for n, t in model.named_parameters() if "lora_B" in n]
    assert all(float(t.detach().abs().max()) > 0 for t in moved)


def test_inv_metric_from_zero_needs_damping():
    model = adapted(14, random=False)
    x, y = data(14)
    optimizer = QuotientAdamW(model, lr=0.02, metric="inv")
    loss = mse_loss(model, x, y)
    loss.backward()
    with pytest.raises(ValueError, match="eps > 0"):
        optimizer.step()
    damped = adapted(14, random=False)
    losses, _ = train(damped, QuotientAdamW(damped, lr=0.02, metric="inv", eps=1e-2), 40,
                      lambda net: mse_loss(net, x, y))
    assert losses[-1] < losses[0]


def test_a_rank_deficient_factor_is_refused_at_zero_damping():
    model = adapted(15)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "lora_B" in name:
                tensor[:, 1] = tensor[:, 0]              # two equal columns, not zero
    x, y = data(15)
    optimizer = QuotientAdamW(model, lr=0.02)
    mse_loss(model, x, y).backward()
    with pytest.raises(ValueError, match="QuotientAdamW.*degenerate.*eps > 0"):
        optimizer.step()


# ---------------------------------------------------------------------- state and dtypes
def test_state_dict_round_trip_resumes_identically():
    x, y = data(16)
    model = adapted(16, random=False)
    optimizer = QuotientAdamW(model, lr=0.02, weight_decay=0.01)
    train(model, optimizer, 5, lambda net: mse_loss(net, x, y))
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed = adapted(17, random=False)
    resumed.load_state_dict(saved["model"])
    resumed_optimizer = QuotientAdamW(resumed, lr=0.02, weight_decay=0.01)
    resumed_optimizer.load_state_dict(saved["optimizer"])
    ahead = train(model, optimizer, 5, lambda net: mse_loss(net, x, y))[1]
    again = train(resumed, resumed_optimizer, 5, lambda net: mse_loss(net, x, y))[1]
    for first, second in zip(ahead, again, strict=True):
        for p, q in zip(first, second, strict=True):
            assert torch.equal(p, q)
    for (name, p), q in zip(model.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_float32_trains_and_follows_float64():
    runs = {}
    start = adapted(18, random=False)
    for dtype in (torch.float32, torch.float64):
        model = copy.deepcopy(start).to(dtype)            # one start, rounded for float32
        x, y = data(18, dtype=dtype)
        runs[dtype] = train(model, QuotientAdamW(model, lr=0.02), 20,
                            lambda net, x=x, y=y: mse_loss(net, x, y))
        assert all(t.dtype == dtype for t in model.parameters())
    assert runs[torch.float32][0][-1] < 0.7 * runs[torch.float32][0][0]
    products32 = [[p.double() for p in ps] for ps in runs[torch.float32][1]]
    assert largest_relative_gap(runs[torch.float64][1], products32) < 1e-5


def test_a_zero_gradient_step_changes_nothing_but_weight_decay():
    model = adapted(19)
    lr, decay = 0.05, 0.1
    optimizer = QuotientAdamW(model, lr=lr, weight_decay=decay)
    before = {n: t.detach().clone() for n, t in model.named_parameters() if t.requires_grad}
    for tensor in model.parameters():
        if tensor.requires_grad:
            tensor.grad = torch.zeros_like(tensor)
    optimizer.step()
    for name, tensor in model.named_parameters():
        if name in before:
            assert torch.equal(tensor.detach(), before[name] * (1.0 - lr * decay)), name


def test_without_gradients_nothing_moves():
    model = adapted(20)
    optimizer = QuotientAdamW(model, lr=0.05, weight_decay=0.1)
    before = [t.detach().clone() for t in model.parameters()]
    optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_param_groups_and_lr_scheduling():
    model = adapted(21)
    optimizer = QuotientAdamW(model, lr=0.05)
    assert [g["kind"] for g in optimizer.param_groups] == ["pairs", "other"]
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    x, y = data(21)
    train(model, optimizer, 1, lambda net: mse_loss(net, x, y))
    scheduler.step()
    assert [g["lr"] for g in optimizer.param_groups] == [0.025, 0.025]


# ---------------------------------------------------------------------- numbers it refuses
def test_low_precision_frames_are_those_of_the_point_in_float64():
    # the raise operator of an ill-conditioned pair, rounded to bfloat16, is not positive
    # definite; the frames must be read in float64 (here from the same rounded factors)
    generator = torch.Generator().manual_seed(3)
    scales = torch.logspace(0, -2, 6, dtype=torch.float64)
    for metric in ("mix", "inv"):
        quotient = GLQuotient(metric)
        factors = tuple((torch.randn(4, 12, 6, generator=generator, dtype=torch.float64)
                         * scales).to(torch.bfloat16) for _ in range(2))
        frames = quotient.at(factors).raise_roots()
        exact = quotient.at(tuple(f.double() for f in factors)).raise_roots()
        for ours, reference in zip(frames, exact, strict=True):
            assert ours.dtype == torch.float64
            assert torch.allclose(ours, reference, rtol=1e-12, atol=0.0)


def test_a_bfloat16_bert_steps_its_heads():
    model = tiny_bert_classifier().to(torch.bfloat16)
    optimizer = QuotientAdamW(model, lr=1e-2)
    ids = torch.randint(1, 30, (8, 6), generator=torch.Generator().manual_seed(1))
    labels = torch.arange(8) % 3
    for _ in range(3):
        optimizer.zero_grad()
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
    assert all(bool(torch.isfinite(t).all()) for t in model.parameters())


@pytest.mark.parametrize("where", ["pair gradient", "other gradient", "pair value"])
def test_a_step_on_nan_is_refused_and_changes_nothing(where):
    model = adapted(0)
    x, y = data(0)
    optimizer = QuotientAdamW(model, lr=0.02)
    train(model, optimizer, 2, lambda net: mse_loss(net, x, y))
    optimizer.zero_grad()
    mse_loss(model, x, y).backward()
    name = {"pair gradient": "base_model.model.0.lora_A.default.weight",
            "other gradient": "base_model.model.4.modules_to_save.default.weight",
            "pair value": "base_model.model.2.lora_B.default.weight"}[where]
    tensor = dict(model.named_parameters())[name]
    with torch.no_grad():
        (tensor if where == "pair value" else tensor.grad)[0, 0] = float("nan")
    before = copy.deepcopy(optimizer.state_dict())
    values = {n: t.detach().clone() for n, t in model.named_parameters()}
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        optimizer.step()
    for n, t in model.named_parameters():
        assert torch.equal(t, values[n]) or n == name            # nan != nan
    after = optimizer.state_dict()
    assert after["state"].keys() == before["state"].keys()
    for key, state in before["state"].items():
        for field, value in state.items():
            if isinstance(value, dict):
                assert all(torch.equal(torch.as_tensor(v), torch.as_tensor(after["state"][key][
                    field][k])) for k, v in value.items())
            else:
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(after["state"][key][
                    field]))


def test_a_state_of_another_models_pairs_is_refused():
    x, y = data(0)
    source = adapted(0, r=3)
    optimizer = QuotientAdamW(source, lr=0.02)
    train(source, optimizer, 2, lambda net: mse_loss(net, x, y))
    target = adapted(0, r=2)                  # as many parameters, pairs of another rank
    other = QuotientAdamW(target, lr=0.02)
    other.load_state_dict(optimizer.state_dict())
    mse_loss(target, x, y).backward()
    with pytest.raises(ValueError, match="state_dict"):
        other.step()


@pytest.mark.parametrize("seed", [0, 1])
def test_mix_second_moment_is_the_row_mean_square_of_the_frame_gradient(seed):
    # reference written from the mix metric's closed form, P_G = (H^T H)^{-1} at eps = 0, and
    # its lower Cholesky factor: after one step the moment is (1 - beta2) |g_i|^2 / r per row
    model = adapted(seed + 40)
    x, y = data(seed + 40)
    optimizer = QuotientAdamW(model, lr=0.01, betas=(0.9, 0.99))
    mse_loss(model, x, y).backward()
    layout = layout_of(model)
    params = {n: t.detach() for n, t in model.named_parameters()}
    grads = {n: t.grad for n, t in model.named_parameters() if t.grad is not None}
    G, H = layout.to_coordinates(params).gl[0]              # bucket 0, shape=[P, n, r]
    dG, dH = layout.to_coordinates(grads).gl[0]
    optimizer.step()
    state = next(s for s in optimizer.state.values() if "bucket0" in s)["bucket0"]
    for grad, partner, name in ((dG, H, "g"), (dH, G, "h")):
        frame = torch.linalg.cholesky(torch.linalg.inv(partner.mT @ partner))
        expected = 0.01 * (grad @ frame).square().mean(-1)
        assert state[f"exp_avg_sq_{name}"].shape == expected.shape
        torch.testing.assert_close(state[f"exp_avg_sq_{name}"], expected, rtol=1e-10, atol=0)


def test_inv_keeps_a_matrix_second_moment():
    model = adapted(44)
    x, y = data(44)
    optimizer = QuotientAdamW(model, lr=0.01, metric="inv")
    mse_loss(model, x, y).backward()
    optimizer.step()
    state = next(s for s in optimizer.state.values() if "bucket0" in s)["bucket0"]
    r = state["exp_avg_g"].shape[-1]
    assert state["exp_avg_sq_g"].shape[-2:] == (r, r)


# ---------------------------------------------------------------------- the balanced scale
@pytest.mark.parametrize("seed, rank", [(0, 1), (1, 3), (2, 5), (3, 8)])
def test_balanced_scale_reads_the_products_singular_values(seed, rank):
    # reference from the SVD of G H^T, not from the frame: the scale's eigenvalues are
    # (1 + sigma_i / balance)^{1/2} on each side, sigma_i the product's singular values
    from quotientsharp.models.quotient_adamw import balanced_scale

    generator = torch.Generator().manual_seed(seed)
    G = torch.randn(3, 11, rank, generator=generator, dtype=torch.float64)
    H = torch.randn(3, 9, rank, generator=generator, dtype=torch.float64) * 2.5
    balance = 0.3
    frames = GLQuotient("mix").at((G, H)).raise_roots()
    singular = torch.linalg.svdvals(G @ H.mT)[..., :rank]
    expected = (1.0 + singular / balance).sqrt().sort(-1).values
    for factor, frame in zip((G, H), frames, strict=True):
        scale = balanced_scale(factor, frame, balance)
        torch.testing.assert_close(scale, scale.mT, rtol=0, atol=1e-12)
        torch.testing.assert_close(torch.linalg.eigvalsh(scale), expected, rtol=1e-10,
                                   atol=0)


@pytest.mark.parametrize("seed, rank, condition", [(0, 2, 100.0), (1, 4, 30.0), (2, 8, 100.0)])
@pytest.mark.parametrize("random", [True, False])
def test_a_strong_balance_keeps_the_orbit_and_changes_the_steps(seed, rank, condition, random):
    # balance 0.3, below the default: the scale is far from the identity here (products of
    # singular values about 1 to 8), so the orbit property is tested where the scale acts
    model = adapted(seed + 30, r=rank, random=random)
    moved = act(model, seed + 80, condition)
    x, y = data(seed + 30)
    runs = [train(m, QuotientAdamW(m, lr=0.02, balance=0.3), 30,
                  lambda net: mse_loss(net, x, y)) for m in (copy.deepcopy(model), moved)]
    assert largest_relative_gap(runs[0][1], runs[1][1]) < 1e-6
    unscaled = copy.deepcopy(model)
    plain = train(unscaled, QuotientAdamW(unscaled, lr=0.02, balance=0.0), 30,
                  lambda net: mse_loss(net, x, y))
    assert largest_relative_gap(runs[0][1], plain[1]) > 1e-2       # the scale did act


def test_from_a_zero_product_the_first_step_is_the_unscaled_one():
    model = adapted(31, random=False)
    x, y = data(31)
    products = []
    for balance in (0.3, 0.0):
        start = copy.deepcopy(model)
        products.append(train(start, QuotientAdamW(start, lr=0.02, balance=balance), 1,
                              lambda net: mse_loss(net, x, y))[1])
    assert largest_relative_gap(*products) < 1e-14


def test_balance_is_checked_and_resolved_by_metric():
    model = adapted(32)
    assert QuotientAdamW(model, lr=0.01).balance == 1.0
    assert QuotientAdamW(model, lr=0.01, metric="inv").balance == 0.0
    assert QuotientAdamW(model, lr=0.01, metric="inv", balance=0.0).balance == 0.0
    for bad in (-0.1, math.nan, math.inf, True, "1"):
        with pytest.raises(ValueError, match="^balance"):
            QuotientAdamW(model, lr=0.01, balance=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^balance.*inv"):
        QuotientAdamW(model, lr=0.01, metric="inv", balance=0.5)


def bert_adapters(seed, r=3):
    """A float64 one-layer BERT with random LoRA adapters of rank ``r`` on its query and value
    (one bucket of two pairs, query first)."""
    model = peft.get_peft_model(tiny_bert(seed, positions=8, dtype=torch.float64),
                                peft.LoraConfig(r=r, target_modules=["query", "value"]))
    return randomize_adapters(model, seed + 100)


def bert_loss(net):
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 30, (4, 6), generator=generator)
    return net(input_ids=ids, labels=torch.arange(4) % 3).loss


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize("metric, eps, spoil", [("mix", 0.0, "repeat"), ("inv", 0.0, "zero")])
def test_a_degenerate_pair_is_named_not_its_bucket_neighbours(metric, eps, spoil):
    # the value adapter is the degenerate one; the query adapter of the same bucket is fine
    model = bert_adapters(33)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "value.lora_B" in name:
                if spoil == "zero":
                    tensor.zero_()
                else:
                    tensor[:, 1] = tensor[:, 0]
    optimizer = QuotientAdamW(model, lr=0.01, metric=metric, eps=eps)
    bert_loss(model).backward()
    with pytest.raises(ValueError, match="degenerate") as refused:
        optimizer.step()
    message = str(refused.value)
    assert "self.value" in message
    assert "self.query" not in message


@pytest.mark.parametrize("random", [True, False])
def test_float16_needs_an_adam_eps_that_float16_holds(random):
    # the default adam_eps (1e-8) is zero in float16, so a row whose second moment underflows
    # (A's zero frame gradient from B = 0, any small gradient) divided by zero at every step
    model = adapted(45, random=random).half()
    with pytest.raises(ValueError, match="^adam_eps.*float16"):
        QuotientAdamW(model, lr=0.02)
    x, y = data(45, dtype=torch.float16)
    losses, _ = train(model, QuotientAdamW(model, lr=0.02, adam_eps=1e-4), 10,
                      lambda net: mse_loss(net, x, y))
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.9 * losses[0]


def test_from_zero_a_first_step_of_lower_rank_than_the_adapter_is_refused_next():
    # three samples: dL/dB = dL/dW A^T has rank <= 3 < r = 8, and so has B after the first
    # step (the row-wise Adam step keeps the gradient's rank); the docs say eps > 0 is needed
    model = adapted(46, random=False, r=8)
    x, y = data(46)
    optimizer = QuotientAdamW(model, lr=0.02)
    mse_loss(model, x[:3], y[:3]).backward()
    optimizer.step()
    factor = dict(model.named_parameters())["base_model.model.0.lora_B.default.weight"]
    assert int(torch.linalg.matrix_rank(factor.detach())) == 3
    optimizer.zero_grad()
    mse_loss(model, x[:3], y[:3]).backward()
    with pytest.raises(ValueError, match=r"model\.0\[default\].*rank-deficient.*eps > 0"):
        optimizer.step()
    damped = adapted(46, random=False, r=8)
    losses, _ = train(damped, QuotientAdamW(damped, lr=0.02, eps=1e-3), 5,
                      lambda net: mse_loss(net, x[:3], y[:3]))
    assert losses[-1] < losses[0]


def two_layer_bert_lora(seed, r):
    """The float64 two-layer BERT of ``benchmarks/orbit_drift.py`` (hidden 32, 2 heads) with
    PEFT's LoRA of rank ``r`` on the query, key, value and attention output, from ``B = 0``."""
    spec = importlib.util.spec_from_file_location(
        "orbit_drift", Path(__file__).resolve().parents[1] / "benchmarks" / "orbit_drift.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.adapted_bert(seed, r, random=False)


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize("lr", [0.001, 0.005])
def test_fresh_adapters_of_a_bert_stay_on_one_orbit(lr):
    # eight adapters of rank 8 from B = 0, each nearly rank-deficient after its first step:
    # frames from Cholesky factors of the formed inverse Gram matrices drifted 1e-5 and 3e-6
    # apart over 30 steps here (1.2e-5 and 2.9e-6); now 3.6e-9 and 7.1e-9 (orbit_drift.py's rows)
    model = two_layer_bert_lora(2, r=8)
    moved = act(model, 52, 100.0)
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 30, (8, 6), generator=generator)
    labels = torch.randint(0, 3, (8,), generator=generator)
    runs = [train(m, QuotientAdamW(m, lr=lr), 30,
                  lambda net: net(input_ids=ids, labels=labels).loss)
            for m in (copy.deepcopy(model), moved)]
    assert largest_relative_gap(runs[0][1], runs[1][1]) < 1e-6


@pytest.mark.parametrize("seed, scale", [(0, 1e-12), (1, 1e-8), (2, 1e-30)])
def test_a_product_far_smaller_than_the_step_takes_a_bounded_step(seed, scale):
    # B of size `scale`: the mix frame of A is about 1/scale, and the unguarded step moved the
    # products by lr^2 ||dB dA|| ~ lr / scale (1e8 at 1e-12); the step is shortened to where its
    # second-order change is at most its first-order one, and stays on one orbit
    model = adapted(seed)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "lora_B" in name:
                tensor.mul_(scale)
    moved = act(model, seed + 60, 100.0)
    x, y = data(seed)
    before = pair_products(model)
    runs = [train(m, QuotientAdamW(m, lr=0.01), 5, lambda net: mse_loss(net, x, y))
            for m in (model, moved)]
    first_step = runs[0][1][0]
    assert all(float((after - start).norm()) < 0.1 for after, start in
               zip(first_step, before, strict=True))
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert largest_relative_gap(runs[0][1], runs[1][1]) < 1e-8
