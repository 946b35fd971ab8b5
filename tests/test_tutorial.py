"""The tutorial's code blocks run, in order, and a broken override is caught by the checks."""

import re
from pathlib import Path

import torch

import quotientsharp as qs

DOC = Path(__file__).resolve().parents[1] / "docs" / "tutorial-custom-symmetry.md"


def run_tutorial() -> dict:
    namespace: dict = {}
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 4
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)  # noqa: S102 - our own docs
    return namespace


def test_tutorial_runs():
    ns = run_tutorial()
    assert all(r.passed for r in ns["results"])


def test_wrong_closed_form_is_caught():
    ns = run_tutorial()

    class Broken(ns["ReLUNeuronQuotient"]):
        def horizontal_projection(self, x, u):
            w_in, w_out = x
            a = ((u[0] * w_in).sum(-1) / w_in.square().sum(-1)
                 - (u[1] * w_out).sum(-1) / w_out.square().sum(-1)) / 2
            a = a.unsqueeze(-1)
            return u[0] + a * w_in, u[1] - a * w_out  # sign flipped

    results = {r.name: r for r in qs.checks.check_all(Broken(point_shapes=[(4,), (3,)]))}
    assert not results["horizontal_projection_vs_reference"].passed
    assert not results["projection_horizontal"].passed


def test_generic_defaults_on_user_quotient_in_float32():
    ns = run_tutorial()
    q = ns["ReLUNeuronQuotient"](point_shapes=[(5,), (2,)])
    for seed in range(3):
        results = qs.checks.check_all(q, seed=seed, dtype=torch.float32)
        assert all(r.passed for r in results), [r for r in results if not r.passed]


def test_user_quotient_sharpness_is_invariant_under_ill_conditioned_rescalings():
    """The tutorial's quotient, attached to an MLP, measured before and after random unit-wise
    rescalings spanning six orders of magnitude: same value to 1e-8 (float64)."""
    ns = run_tutorial()
    nn = torch.nn
    for seed in range(3):
        torch.manual_seed(seed)
        d, h, o = 4, 5, 3
        mlp = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, o)).double()
        scales = torch.exp(torch.empty(h, dtype=torch.float64).uniform_(-7.0, 7.0))
        rescaled = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, o)).double()
        with torch.no_grad():
            rescaled[0].weight.copy_(mlp[0].weight * scales[:, None])
            rescaled[0].bias.copy_(mlp[0].bias * scales)
            rescaled[2].weight.copy_(mlp[2].weight / scales)
            rescaled[2].bias.copy_(mlp[2].bias)
        batches = [(torch.randn(12, d, dtype=torch.float64), torch.randint(0, o, (12,)))]
        for order in (1, 2):
            values = [qs.sharpness(net, batches, measure="geodesic", rho=0.1, order=order,
                                   n_iter=6, symmetries=ns["binding"], progress=False).value
                      for net in (mlp, rescaled)]
            assert values[0] > 0
            assert abs(values[1] - values[0]) <= 1e-8 * abs(values[0]), (seed, order, values)
