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
