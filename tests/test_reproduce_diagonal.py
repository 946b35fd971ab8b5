"""``quotientsharp reproduce diagonal``: Kendall tau, batched Auto-PGD against the engine, the
study end to end (quick variant, once), ``--resume`` after interruptions, the docs page.

Independent references: scipy's ``kendalltau`` and hand-counted pairs; the engine's
``quotientsharp.sharpness`` on an equivalent ``nn.Module``; the exact trust-region maximum of a
quadratic over a Euclidean ball (for the exact mix path, a straight line in ``beta``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from results_pages import render_section
from results_pages.sections import DERIVED, write_section
from results_pages.summary import read_headlines
from scipy import stats as scipy_stats
from torch import nn

from quotientsharp import sharpness
from quotientsharp.cli import main
from quotientsharp.engine import AscentSettings
from quotientsharp.reproduce import STUDIES, load_study
from quotientsharp.reproduce.diagonal.batched_ascent import (
    AdaptiveGeometry,
    DiagonalHorizontalGeometry,
    batched_ascend,
    mse_objective,
)
from quotientsharp.reproduce.diagonal.data import make_problem
from quotientsharp.reproduce.diagonal.exact import (
    mix_exact_at_interpolation,
    mix_exact_maxima,
    population_batch,
    reference_maxima,
)
from quotientsharp.reproduce.diagonal.full import full_configurations, run_full
from quotientsharp.reproduce.diagonal.measures import MEASURES, sharpness_batches
from quotientsharp.reproduce.diagonal.settings import DiagonalSettings
from quotientsharp.reproduce.diagonal.study import diagonal_study
from quotientsharp.reproduce.diagonal.training import compute_test_losses
from quotientsharp.reproduce.provenance import current_provenance
from quotientsharp.reproduce.results_page import regenerate_results_page
from quotientsharp.workflows.files import read_jsonl
from quotientsharp.workflows.records import ResultsDirectory
from quotientsharp.workflows.taus import (
    kendall_tau_a,
    kendall_tau_b,
    tau_interval,
)
from tests.pages.docs_folder import docs_with_renderer


class DiagonalNet(nn.Module):
    """``y = x (u * v)``; ``diagonal = True`` lets find_symmetries find the GL(1)^d pair."""

    diagonal = True

    def __init__(self, u: torch.Tensor, v: torch.Tensor) -> None:
        super().__init__()
        self.u = nn.Parameter(u.clone())
        self.v = nn.Parameter(v.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ (self.u * self.v)


# ---------------------------------------------------------------------------- Kendall tau
def _hand_tau_a(x, y) -> float:
    pairs = list(itertools.combinations(range(len(x)), 2))
    concordant = sum((x[i] - x[j]) * (y[i] - y[j]) > 0 for i, j in pairs)
    discordant = sum((x[i] - x[j]) * (y[i] - y[j]) < 0 for i, j in pairs)
    return (concordant - discordant) / len(pairs)


def test_kendall_tau_on_hand_counted_examples() -> None:
    # one discordant pair out of six
    assert kendall_tau_a([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6, abs=1e-15)
    # ties: S = 4 over 6 pairs, one tie in each variable
    assert kendall_tau_a([1, 2, 2, 3], [1, 1, 2, 3]) == pytest.approx(4 / 6, abs=1e-15)
    assert kendall_tau_b([1, 2, 2, 3], [1, 1, 2, 3]) == pytest.approx(0.8, abs=1e-15)
    assert kendall_tau_a([1, 2, 3], [3, 2, 1]) == -1.0
    assert kendall_tau_b([1, 1, 1], [1, 2, 3]) is None
    assert kendall_tau_a([0, math.inf, 1], [0, 2, 1]) == 1.0   # inf is ranked, not rejected


@pytest.mark.parametrize("seed", range(4))
def test_kendall_taus_match_scipy_and_hand_count_with_ties(seed: int) -> None:
    stats = pytest.importorskip("scipy.stats")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 6, (23,), generator=gen).tolist()      # many ties
    y = torch.randint(0, 9, (23,), generator=gen).tolist()
    assert kendall_tau_a(x, y) == pytest.approx(_hand_tau_a(x, y), abs=1e-15)
    expected = float(stats.kendalltau(x, y).statistic)
    assert kendall_tau_b(x, y) == pytest.approx(expected, abs=1e-13)
    # without ties tau-a and tau-b agree, and both depend only on ranks
    distinct = torch.randn(17, generator=gen, dtype=torch.float64).tolist()
    other = torch.randn(17, generator=gen, dtype=torch.float64).tolist()
    assert kendall_tau_a(distinct, other) == pytest.approx(kendall_tau_b(distinct, other),
                                                           abs=1e-14)
    assert kendall_tau_a([math.exp(t) for t in distinct], other) == kendall_tau_a(distinct,
                                                                                  other)


def test_kendall_tau_rejects_bad_input_by_name() -> None:
    with pytest.raises(ValueError, match="y contains NaN"):
        kendall_tau_a([1, 2, 3], [1, math.nan, 3])
    with pytest.raises(ValueError, match="same length"):
        kendall_tau_b([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="at least 2"):
        kendall_tau_a([1], [1])


# ---------------------------------------------------------------------------- batched ascent
def _problem(seed: int, dtype: torch.dtype, nets: int = 3, batches: int = 2, size: int = 6,
             d: int = 5):
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(nets, d, generator=gen, dtype=dtype)
    v = torch.randn(nets, d, generator=gen, dtype=dtype)
    x = torch.randn(batches, size, d, generator=gen, dtype=dtype)
    y = torch.randn(batches, size, generator=gen, dtype=dtype)
    return u, v, x, y


CASES = [("adaptive", None), ("inv", 1), ("inv", 2), ("inv", "exact"), ("mix", 1), ("mix", 2),
         ("mix", "exact")]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("metric", "order"), CASES)
def test_batched_ascent_equals_engine_net_by_net(metric, order, seed: int, dtype) -> None:
    u, v, x, y = _problem(seed, dtype)
    nets, batches = u.shape[0], x.shape[0]
    rho, n_iter = 0.3, 20
    if (metric, order) == ("mix", "exact"):
        # the engine refuses radii whose exact mix path reaches u v = 0
        rho = 0.9 * float((u * v).abs().min()) / math.sqrt(2)
    if metric == "adaptive":
        geometry = AdaptiveGeometry(u[:, None], v[:, None], rho, (nets, batches))
    else:
        geometry = DiagonalHorizontalGeometry(u[:, None], v[:, None], metric, order, rho,
                                              (nets, batches))
    outcome = batched_ascend(geometry, mse_objective(geometry, x, y),
                             AscentSettings(n_iter=n_iter))
    assert outcome.sharpness.shape == (nets, batches)
    assert bool((outcome.sharpness >= 0).all())
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    for net in range(nets):
        # one ascent: the batched solver is Auto-PGD without the engine's reach search
        options = dict(rho=rho, loss="mse", n_iter=n_iter, seed=3, progress=False, reach=False)
        if metric == "adaptive":
            expected = sharpness(DiagonalNet(u[net], v[net]), list(zip(x, y, strict=True)),
                                 measure="adaptive", **options)
        else:
            expected = sharpness(DiagonalNet(u[net], v[net]), list(zip(x, y, strict=True)),
                                 measure="geodesic", metric=metric, order=order, **options)
        assert outcome.sharpness[net].tolist() == pytest.approx(expected.per_batch, rel=tol,
                                                                abs=tol)
        assert float(outcome.sharpness[net].mean()) == pytest.approx(expected.value, rel=tol)
        assert float(geometry.norm(outcome.xi)[net].max()) <= rho * (1 + 4 * tol)


def _trust_region_maximum(A: torch.Tensor, g: torch.Tensor, radius: float) -> float:
    """``max_{||d|| <= r} g^T d + d^T A d`` for symmetric PSD ``A``: stationarity
    ``g + 2 A d = 2 l d`` gives ``d = (l I - A)^{-1} g / 2`` with ``l > lambda_max`` fixed by
    ``||d|| = r`` (bisection on the secular equation; ``g`` is generic, no hard case)."""
    values, vectors = torch.linalg.eigh(A)
    c = vectors.T @ g
    top = float(values[-1])

    def length(lam: float) -> float:
        return float(((0.5 * c / (lam - values)).square().sum()).sqrt())

    low, high = top + 1e-15, top + 1.0
    while length(high) > radius:
        high = top + 2 * (high - top)
    for _ in range(200):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if length(middle) > radius else (low, middle)
    d = vectors @ (0.5 * c / (high - values))
    return float(g @ d + d @ A @ d)


@pytest.mark.parametrize("seed", range(3))
def test_exact_mix_path_crossing_zero_is_the_euclidean_ball_in_beta(seed: int) -> None:
    # tiny coordinates: the ball reaches beta_i = 0 (the engine would refuse this radius)
    u, v, x, y = _problem(seed, torch.float64, nets=1, batches=1, size=8, d=4)
    u = u * torch.tensor([1.0, 1e-3, 1.0, 1e-4], dtype=torch.float64)
    rho = 0.5
    assert rho > float((u * v).abs().min()) / math.sqrt(2)
    geometry = DiagonalHorizontalGeometry(u[:, None], v[:, None], "mix", "exact", rho, (1, 1))
    outcome = batched_ascend(geometry, mse_objective(geometry, x, y),
                             AscentSettings(n_iter=200))
    beta = (u * v)[0]
    X, target = x[0], y[0]
    A = X.T @ X / X.shape[0]
    g = 2 * X.T @ (X @ beta - target) / X.shape[0]
    expected = _trust_region_maximum(A, g, math.sqrt(2) * rho)   # ||d beta|| = sqrt(2) ||xi||
    value = float(outcome.sharpness[0, 0])
    assert value <= expected * (1 + 1e-12)
    assert value == pytest.approx(expected, rel=1e-6)


def test_batched_ascent_rejects_what_it_does_not_do() -> None:
    u, v, x, y = _problem(0, torch.float64)
    geometry = DiagonalHorizontalGeometry(u[:, None], v[:, None], "inv", 2, 0.1, (3, 2))
    with pytest.raises(ValueError, match="restarts"):
        batched_ascend(geometry, mse_objective(geometry, x, y), AscentSettings(restarts=1))
    with pytest.raises(ValueError, match="random_init"):
        batched_ascend(geometry, mse_objective(geometry, x, y),
                       AscentSettings(random_init=True))
    u[1, 2] = 0.0
    with pytest.raises(ValueError, match="zero entries"):
        DiagonalHorizontalGeometry(u[:, None], v[:, None], "mix", 1, 0.1, (3, 2))
    with pytest.raises(ValueError, match="metric"):
        DiagonalHorizontalGeometry(v[:, None], v[:, None], "euclid", 1, 0.1, (3, 2))


# ---------------------------------------------------------------------------- exact maxima
def _interpolating(seed: int, nets: int = 4, batches: int = 2, size: int = 6, d: int = 12):
    """Nets and batches with ``X_B beta = y_B`` exactly (``size < d``: many interpolants)."""
    u, v, x, _ = _problem(seed, torch.float64, nets, batches, size, d)
    y = torch.einsum("kbd,d->kb", x, (u * v)[0])
    # every net interpolates: add to beta a null-space component of both batches
    null = torch.linalg.svd(x.reshape(-1, d), full_matrices=True).Vh[batches * size:]
    gen = torch.Generator().manual_seed(seed + 100)
    beta = (u * v)[0] + torch.randn(nets, null.shape[0], generator=gen,
                                    dtype=torch.float64) @ null
    v = beta / u
    return u, v, x, y


@pytest.mark.parametrize("seed", range(3))
def test_mix_exact_at_interpolation_is_two_rho_squared_lambda_max(seed: int) -> None:
    u, v, x, y = _interpolating(seed)
    assert float((torch.einsum("kbd,md->mkb", x, u * v) - y).abs().max()) < 1e-12
    rho = 0.2
    exact = mix_exact_maxima(u, v, x, y, rho)
    # independent: numpy's eigh of X^T X / B, the ball ||d beta|| <= sqrt(2) rho
    X = x.numpy()
    top = np.array([np.linalg.eigh(b.T @ b / b.shape[0])[0][-1] for b in X])
    expected = 2 * rho ** 2 * top
    for net in range(u.shape[0]):
        np.testing.assert_allclose(exact[net].numpy(), expected, rtol=1e-10)
    np.testing.assert_allclose(mix_exact_at_interpolation(x, rho).numpy(), expected,
                               rtol=1e-12)
    # no point of the ball beats it: random directions at the full radius
    gen = torch.Generator().manual_seed(seed)
    beta = (u * v)[0]
    for k in range(x.shape[0]):
        d = torch.randn(500, x.shape[-1], generator=gen, dtype=torch.float64)
        d = math.sqrt(2) * rho * d / d.norm(dim=-1, keepdim=True)
        gain = ((beta + d) @ x[k].T - y[k]).square().mean(-1)
        assert float(gain.max()) <= expected[k] * (1 + 1e-12)
    # Auto-PGD never exceeds the exact maximum, and gets close to it
    geometry = DiagonalHorizontalGeometry(u[:, None], v[:, None], "mix", "exact", rho,
                                          (u.shape[0], x.shape[0]))
    apgd = batched_ascend(geometry, mse_objective(geometry, x, y), AscentSettings()).sharpness
    assert bool((apgd <= exact * (1 + 1e-12)).all())
    assert bool((apgd >= 0.5 * exact).all())


def test_reference_ascent_reaches_the_exact_mix_maximum_and_is_reproducible_per_net() -> None:
    u, v, x, y = _problem(4, torch.float64, nets=3, batches=2, size=6, d=5)
    rho = 0.5
    ascent = AscentSettings(n_iter=60, restarts=2)
    seeds = [11, 12, 13]
    strong = reference_maxima(u, v, x, y, rho, ascent, seeds)
    exact = mix_exact_maxima(u, v, x, y, rho)
    mix = strong["geodesic_mix_exact"]
    assert bool((mix <= exact * (1 + 1e-12)).all()) and bool((mix >= 0.999 * exact).all())
    # a net measured alone, with its own seed, gets the same values (as after --resume)
    alone = reference_maxima(u[1:2], v[1:2], x, y, rho, ascent, seeds[1:2])
    for name, value in alone.items():
        assert value[0].tolist() == strong[name][1].tolist()
    with pytest.raises(ValueError, match="one seed per net"):
        reference_maxima(u, v, x, y, rho, ascent, seeds[:2])


def test_population_batch_gives_the_population_loss_and_the_mix_closed_form() -> None:
    gen = torch.Generator().manual_seed(5)
    d, rho = 7, 0.1
    beta_star = torch.randn(d, generator=gen, dtype=torch.float64)
    u = torch.randn(4, d, generator=gen, dtype=torch.float64)
    v = torch.randn(4, d, generator=gen, dtype=torch.float64)
    x, y = population_batch(beta_star)
    errors = (u * v).numpy() - beta_star.numpy()
    population = (errors ** 2).sum(-1)
    mse = ((torch.einsum("kbd,md->mkb", x, u * v) - y) ** 2).mean(-1)[:, 0]
    np.testing.assert_allclose(mse.numpy(), population, rtol=1e-12)
    # a large Gaussian sample agrees (E[x x^T] = I)
    sample = torch.randn(200_000, d, generator=gen, dtype=torch.float64)
    sampled = ((sample @ ((u * v) - beta_star).T) ** 2).mean(0)
    np.testing.assert_allclose(sampled.numpy(), population, rtol=0.02)
    closed = 2 * np.sqrt(2) * rho * np.sqrt(population) + 2 * rho ** 2
    np.testing.assert_allclose(mix_exact_maxima(u, v, x, y, rho)[:, 0].numpy(), closed,
                               rtol=1e-10)


# ---------------------------------------------------------------------------- intervals
def test_tau_interval_contains_the_estimate_and_is_reproducible_by_seed() -> None:
    gen = np.random.default_rng(0)
    x = gen.normal(size=40)
    y = x + gen.normal(size=40)
    first = tau_interval(x, y, samples=500, seed=3)
    assert first == tau_interval(x, y, samples=500, seed=3)
    assert first != tau_interval(x, y, samples=500, seed=4)
    assert first.a_low <= first.tau_a <= first.a_high
    assert first.b_low <= first.tau_b <= first.b_high
    assert first.tau_b == pytest.approx(scipy_stats.kendalltau(x, y).statistic, abs=1e-12)
    # a column against itself, and a perfect inverse ranking: the whole interval is +-1
    same = tau_interval(x, x, samples=200, seed=0)
    assert (same.tau_a, same.tau_b, same.a_low, same.a_high, same.b_low, same.b_high) == (
        1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
    inverse = tau_interval(x, -x, samples=200, seed=0)
    assert inverse.a_high == -1.0 and inverse.b_low == -1.0
    # ties (a confound like the batch size): tau-b of a tied column against itself is 1
    sizes = [10, 20, 20, 50, 10, 100, 50, 20]
    tied = tau_interval(sizes, sizes, samples=200, seed=0)
    assert tied.tau_b == 1.0 and tied.b_low == 1.0 and tied.tau_a < 1.0
    with pytest.raises(ValueError, match="y contains NaN"):
        tau_interval([1.0, 2.0, 3.0], [1.0, math.nan, 2.0])
    with pytest.raises(ValueError, match="samples"):
        tau_interval(x, y, samples=-1)
    alone = tau_interval(x, y, samples=0)
    assert (alone.a_low, alone.b_high) == (None, None) and alone.tau_a == first.tau_a


# ---------------------------------------------------------------------------- the study
def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """The quick variant through the command line, once for the module."""
    root = tmp_path_factory.mktemp("diagonal")
    out, docs = root / "out", docs_with_renderer(root / "docs")
    code, stdout, stderr = _cli("reproduce", "diagonal", "--quick", "--out", str(out),
                                "--no-progress", "--docs", str(docs))
    assert code == 0, stderr
    return out, docs, stdout


@pytest.mark.study
def test_quick_run_writes_every_output(quick_run) -> None:
    out, docs, stdout = quick_run
    settings = DiagonalSettings.quick()
    run_info = json.loads((out / "run.json").read_text())
    assert run_info["status"] == "finished"
    assert run_info["settings"] == json.loads(json.dumps(settings.as_dict()))
    for package in ("python", "torch", "numpy", "quotientsharp"):
        assert run_info["environment"][package]
    # recorded, not timed: speed targets live in benchmarks/, never in a unit test
    assert run_info["wall_seconds"] > 0
    assert len(run_info["hyperparameters"]) == settings.nets
    records = read_jsonl(out / "models.jsonl")
    assert [r["model"] for r in records] == list(range(settings.nets))
    csv_lines = (out / "models.csv").read_text().splitlines()
    assert len(csv_lines) == settings.nets + 1
    assert csv_lines[0].split(",")[:2] == ["model", "init_scale"]
    assert {m.name for m in MEASURES} <= set(csv_lines[0].split(","))
    for record in records:
        h = run_info["hyperparameters"][record["model"]]
        assert settings.init_scale[0] <= h["init_scale"] <= settings.init_scale[1]
        assert settings.learning_rate[0] <= h["learning_rate"] <= settings.learning_rate[1]
        assert h["batch_size"] in settings.batch_sizes
        if record["converged"]:
            assert record["train_loss"] < settings.target_loss
    assert len({r["init_scale"] for r in records}) == settings.nets
    assert len({r["batch_size"] for r in records}) > 1
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pass
    else:
        for spec in MEASURES:
            assert (out / f"scatter_{spec.name}.png").read_bytes()[:4] == b"\x89PNG"
    page = (docs / "results.md").read_text()
    section = (docs / "results" / "diagonal.md").read_text()
    # the docs section is rendered from the study's page data, the copy in the results folder,
    # with the provenance stamp under its heading
    stamp = [line for line in section.splitlines() if line.startswith("*Made by `")]
    assert len(stamp) == 1
    document = json.loads((out / "page.json").read_text())
    assert document == json.loads((docs / "results" / "data" / "pages" /
                                   "diagonal.json").read_text())
    assert section.replace(stamp[0] + "\n\n", "", 1) == render_section(document)
    assert section in page and "Generated by" in page
    for paper in ("-0.68", "-0.83", "-0.86"):
        assert paper in section
    # the paper's numbers only in their comparison table, never beside a measure's own row
    main_rows = [line for line in section.splitlines() if line.startswith("| geodesic_mix_exact")]
    assert main_rows and not any("-0.86" in line for line in main_rows)
    comparison = section[section.index("### The paper's numbers"):]
    assert "-0.86" in comparison.split("### Spread")[0] and "not reachable" in comparison
    assert "### Diagnostics outside the expansion's validity" in section
    assert r"2 \rho^2 \lambda_{\max}(A_B)" in section
    analysis = run_info["analysis"]
    assert set(analysis["percent_of_maximum"]) == {"adaptive", "geodesic_inv_exact",
                                                   "geodesic_mix_exact",
                                                   "geodesic_mix_exact_rateball"}
    for spread in analysis["percent_of_maximum"].values():
        assert 0 < spread["min"] <= spread["median"] <= spread["max"]
    assert analysis["percent_of_maximum"]["geodesic_mix_exact"]["max"] <= 100 * (1 + 1e-12)
    assert set(analysis["confounds"]) == {"init_scale", "learning_rate", "batch_size"}
    # mix exact at these nearly interpolating nets: the theory's constant, up to the residual
    assert analysis["interpolation"]["largest_relative_deviation"] < 0.05
    assert analysis["population"]["closed_form_largest_relative_deviation"] < 1e-10
    assert "`quotientsharp reproduce diagonal --quick`" in section
    assert "adaptive: Kendall tau-b " in stdout


@pytest.mark.study
def test_quick_run_values_recompute_from_the_saved_nets(quick_run) -> None:
    out, _, _ = quick_run
    settings = DiagonalSettings.quick()
    problem = make_problem(settings)
    records = {r["model"]: r for r in read_jsonl(out / "models.jsonl")}
    trained = {r["model"]: r for r in read_jsonl(out / "trained.jsonl")}
    assert sorted(trained) == sorted(records)
    from quotientsharp.reproduce.diagonal.training import TrainedNet

    nets = [TrainedNet.from_record(trained[i]) for i in sorted(trained)]
    for net, test_loss in zip(nets, compute_test_losses(problem, nets), strict=True):
        record = records[net.model]
        assert record["test_loss"] == test_loss
        beta = torch.tensor(net.u, dtype=torch.float64) * torch.tensor(net.v,
                                                                        dtype=torch.float64)
        train = float((problem.x_train @ beta - problem.y_train).square().mean())
        assert train == pytest.approx(record["train_loss"], rel=1e-10)

    # one net through the engine, with the same rho, iterations and batches
    inputs, targets = sharpness_batches(problem, settings)
    batches = list(zip(inputs, targets, strict=True))
    net = nets[0]
    model = DiagonalNet(torch.tensor(net.u, dtype=torch.float64),
                        torch.tensor(net.v, dtype=torch.float64))
    options = dict(rho=settings.rho, n_iter=settings.n_iter, loss="mse", progress=False,
                   reach=False)
    engine = {
        "adaptive": sharpness(model, batches, measure="adaptive", **options),
        "geodesic_inv_exact": sharpness(model, batches, measure="geodesic", metric="inv",
                                        order="exact", **options),
        "geodesic_mix_order2": sharpness(model, batches, measure="geodesic", metric="mix",
                                         order=2, **options),
    }
    for name, result in engine.items():
        assert records[0]["sharpness_per_batch"][name] == pytest.approx(result.per_batch,
                                                                        rel=1e-10)

    # the taus of run.json are those of the records
    run_info = json.loads((out / "run.json").read_text())
    counted = [records[i] for i in run_info["counted"]]
    assert counted
    for spec in MEASURES:
        if spec.diagnostic:   # not a measure: no tau against the test loss
            assert spec.name not in run_info["taus"]
            continue
        xs = [r["test_loss"] for r in counted]
        ys = [r["sharpness"][spec.name] for r in counted]
        assert run_info["taus"][spec.name]["tau_a"] == kendall_tau_a(xs, ys)
        assert run_info["analysis"]["taus"][spec.name]["tau_a"] == kendall_tau_a(xs, ys)
        assert run_info["taus"][spec.name]["paper"] == spec.paper
    # the exact mix column recomputes from the saved nets, by the trust region in numpy terms
    u = torch.tensor([trained[i]["u"] for i in run_info["counted"]], dtype=torch.float64)
    v = torch.tensor([trained[i]["v"] for i in run_info["counted"]], dtype=torch.float64)
    exact = mix_exact_maxima(u, v, inputs, targets, settings.rho)
    for row, record in enumerate(counted):
        assert record["sharpness_per_batch"]["exact:geodesic_mix_exact"] == exact[row].tolist()
        assert record["sharpness"]["geodesic_mix_exact"] <= (
            record["sharpness"]["exact:geodesic_mix_exact"] * (1 + 1e-12))
    # the implicit bias: small initialisation, sparse interpolant, low test loss
    scales = [r["init_scale"] for r in counted]
    assert kendall_tau_a(scales, [r["test_loss"] for r in counted]) > 0.5


@pytest.mark.study
def test_quick_run_resume_recomputes_nothing(quick_run) -> None:
    out, _, _ = quick_run
    before = {name: (out / name).read_bytes() for name in ("models.jsonl", "trained.jsonl",
                                                            "models.csv")}
    code, stdout, stderr = _cli("reproduce", "diagonal", "--quick", "--out", str(out),
                                "--no-progress", "--no-plots", "--resume")
    assert code == 0, stderr
    assert "trained now: 0, measured now: 0" in stdout
    for name, content in before.items():
        assert (out / name).read_bytes() == content
    run_info = json.loads((out / "run.json").read_text())
    assert run_info["trained_now"] == [] and run_info["measured_now"] == []
    assert run_info["resumed"] == 1
    code, _, stderr = _cli("reproduce", "diagonal", "--quick", "--out", str(out),
                           "--no-progress", "--no-plots", "--resume", "--seed", "1")
    assert code == 2 and "settings differ" in stderr and "seed" in stderr


TINY = dict(nets=6, d=30, n_train=20, n_test=300, support=3, batch_sizes=(5, 10, 20),
            sharpness_batch_size=10, init_scale=(0.01, 1.0), learning_rate=(0.05, 0.2),
            max_steps=30_000, n_iter=6, reference_iterations=20, reference_restarts=1,
            bootstrap=100)


class _Stop(KeyboardInterrupt):
    pass


def _interrupt_after(kind: str, count: int):
    seen = []

    def hook(record_kind: str, index: int) -> None:
        if record_kind == kind:
            seen.append(index)
            if len(seen) == count:
                raise _Stop

    return hook, seen


@pytest.mark.study
@pytest.mark.parametrize("kind", ["trained", "model"])
def test_interrupted_run_resumes_to_the_uninterrupted_result(tmp_path, kind: str) -> None:
    settings = DiagonalSettings(**TINY)
    reference = diagonal_study(settings, tmp_path / "reference", progress=False, plots=False)
    assert len(reference.counted) >= 4
    folder = tmp_path / "interrupted"
    hook, seen = _interrupt_after(kind, 2)
    with pytest.raises(_Stop):
        diagonal_study(settings, folder, progress=False, plots=False, on_record=hook)
    assert json.loads((folder / "run.json").read_text())["status"] == "interrupted"
    kept_trained = (folder / "trained.jsonl").read_text()
    # a write torn by the interruption: resume must drop it
    with (folder / "models.jsonl").open("a") as stream:
        stream.write('{"model": 5, "test_lo')
    resumed = diagonal_study(settings, folder, resume=True, progress=False, plots=False)
    assert (folder / "trained.jsonl").read_text().startswith(kept_trained)
    if kind == "trained":
        assert sorted(set(resumed.trained_now) | set(seen)) == list(range(settings.nets))
        assert not set(resumed.trained_now) & set(seen)
        assert resumed.measured_now == list(range(settings.nets))
    else:
        assert resumed.trained_now == []
        assert sorted(set(resumed.measured_now) | set(seen)) == list(range(settings.nets))
        assert not set(resumed.measured_now) & set(seen)
    # bit for bit: frozen nets stay in the training batch, the measure reduces per row
    assert resumed.records == reference.records
    assert resumed.taus == reference.taus
    assert read_jsonl(folder / "models.jsonl") == reference.records
    assert (folder / "models.csv").read_text() == (tmp_path / "reference" /
                                                   "models.csv").read_text()


@pytest.mark.study
def test_full_run_pools_data_seeds_and_trains_a_set_per_net(tmp_path) -> None:
    settings = DiagonalSettings(**TINY)
    base, others = run_full(settings, tmp_path, progress=False, plots=False,
                            docs=docs_with_renderer(tmp_path), rhos=(settings.rho,),
                            data_seeds=2)
    assert set(others) == {f"full/rho{settings.rho:g}-seed1", "full/per_net-seed0",
                           "full/per_net-seed1"}
    page = (tmp_path / "results" / "diagonal.md").read_text()
    # the page is the run's section, stamped with what made it below its heading
    head, body = render_section(base.page).split("\n", 1)
    assert page.startswith(head + "\n\n*Made by") and page.endswith(body.lstrip())
    assert "`quotientsharp reproduce diagonal --full" in page
    assert "A training set per net" in page and "pooled over seeds" in page
    assert "#### The rho sweep" in page and "#### The ball" in page
    assert "Which ball the paper's protocol most likely used" in page
    # another seed draws its own hyperparameters and its own data (no pseudo-replication)
    seed1 = json.loads((tmp_path / f"full/rho{settings.rho:g}-seed1" / "run.json").read_text())
    seed0 = json.loads((tmp_path / "run.json").read_text())
    assert seed1["hyperparameters"] != seed0["hyperparameters"]
    assert seed1["beta_star_support"] != seed0["beta_star_support"]
    # the headline file: pooled rows of both balls
    rows = read_headlines(tmp_path)["diagonal"]
    measures = {row["measure"] for row in rows}
    assert {"adaptive", "geodesic_inv", "geodesic_mix", "geodesic_mix_rateball"} <= measures
    # a set per net: each net interpolates its own training inputs, not the shared ones
    per_net = replace(settings, training_sets="per_net")
    problem = make_problem(per_net)
    assert problem.x_train.shape == (settings.nets, settings.n_train, settings.d)
    shared = make_problem(settings).x_train
    trained = read_jsonl(tmp_path / "full/per_net-seed0" / "trained.jsonl")
    for net in trained:
        if not net["converged"]:
            continue
        beta = np.asarray(net["u"]) * np.asarray(net["v"])
        own = problem.x_train[net["model"]].numpy()
        target = own @ problem.beta_star.numpy()
        assert np.mean((own @ beta - target) ** 2) < settings.target_loss
        assert np.mean((shared.numpy() @ (beta - problem.beta_star.numpy())) ** 2) > (
            settings.target_loss)
    with pytest.raises(ValueError, match="rho"):
        full_configurations(settings, rhos=(0.5,))
    with pytest.raises(ValueError, match="training_sets"):
        DiagonalSettings(training_sets="each")


def test_fresh_run_replaces_old_results_and_settings_are_validated(tmp_path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "models.jsonl").write_text('{"model": 0}\n')
    (folder / "notes.txt").write_text("kept")
    directory = ResultsDirectory(folder, "diagonal", {"a": 1}, resume=False,
                                 owned=["models.jsonl"])
    assert not (folder / "models.jsonl").exists() and (folder / "notes.txt").exists()
    directory.append("models.jsonl", {"model": 0, "value": 0.1})
    with pytest.raises(ValueError, match="settings differ"):
        ResultsDirectory(folder, "diagonal", {"a": 2}, resume=True, owned=["models.jsonl"])
    with pytest.raises(ValueError, match="belongs to study"):
        ResultsDirectory(folder, "bert", {"a": 1}, resume=True, owned=["models.jsonl"])
    with pytest.raises(ValueError, match="batch_sizes"):
        DiagonalSettings(batch_sizes=(30,))
    with pytest.raises(ValueError, match="nets"):
        DiagonalSettings(nets=1)
    with pytest.raises(ValueError, match="init_scale"):
        DiagonalSettings(init_scale=(0.0, 1.0))


def _stamp() -> dict:
    return dataclasses.asdict(current_provenance())


@pytest.mark.pages
def test_results_page_is_regenerated_from_the_sections_present(tmp_path) -> None:
    docs_with_renderer(tmp_path)
    write_section(tmp_path, "zzz_extra", "## Extra\n\nlast", _stamp())
    write_section(tmp_path, "bert", "## BERT\n\nsecond", _stamp())
    write_section(tmp_path, "diagonal", "## Diagonal\n\nfirst", _stamp())
    page = regenerate_results_page(tmp_path).read_text()
    assert page.startswith("# Results")
    assert page.index("## Diagonal") < page.index("## BERT") < page.index("## Extra")
    # the page-wide dated notes survive every regeneration, above the first section
    assert "**History: 2026-12-03.**" in page
    assert page.index("**History: 2026-12-03.**") < page.index("## Diagonal")
    missing = [s for s in STUDIES if s not in ("bert", "diagonal", *DERIVED)]
    for study in missing:
        assert f"quotientsharp reproduce {study}" in page
    (tmp_path / "results" / "bert.md").unlink()
    assert "## BERT" not in regenerate_results_page(tmp_path).read_text()
    with pytest.raises(ValueError, match="plain name"):
        write_section(tmp_path, "../x", "no", _stamp())


@pytest.mark.pages
def test_a_rewritten_section_keeps_its_hand_written_part(tmp_path) -> None:
    marker = "<!-- written by hand below: kept when the study rewrites this section -->"
    docs_with_renderer(tmp_path)
    path = write_section(tmp_path, "bert", "## BERT\n\nrun 1", _stamp())
    path.write_text(path.read_text() + f"\n{marker}\n\n### Runs made\n\nby hand\n")
    write_section(tmp_path, "bert", "## BERT\n\nrun 2", _stamp())
    text = path.read_text()
    assert "run 1" not in text and text.index("run 2") < text.index(marker)
    assert text.endswith("### Runs made\n\nby hand\n") and text.count(marker) == 1
    # without the marker, the whole file is the study's
    plain = write_section(tmp_path, "vit", "## ViT\n\nold\n\nnotes", _stamp())
    write_section(tmp_path, "vit", "## ViT\n\nnew", _stamp())
    head, stamp, body = plain.read_text().split("\n\n")
    assert (head, body) == ("## ViT", "new\n") and stamp.startswith("*Made by")


def test_reproduce_registry_builds_the_subcommands() -> None:
    module = load_study("diagonal")
    assert callable(module.run)
    with pytest.raises(ValueError, match="unknown study"):
        load_study("nope")
    code, stdout, _ = _cli_help("reproduce", "--help")
    assert code == 0 and "diagonal" in stdout


def test_every_study_has_its_options_and_configuration() -> None:
    import argparse
    import dataclasses

    from quotientsharp.cli.reproduce_options import STUDY_OPTIONS, study_config
    from quotientsharp.reproduce.config import ReproduceConfig

    assert set(STUDY_OPTIONS) == set(STUDIES)
    for name, (add_options, config_class) in STUDY_OPTIONS.items():
        parser = argparse.ArgumentParser()
        add_options(parser)
        config = study_config(argparse.Namespace(study=name, **vars(parser.parse_args([]))))
        assert isinstance(config, config_class) and issubclass(config_class, ReproduceConfig)
        # every option lands in a field of the configuration, under its own name
        fields = {field.name for field in dataclasses.fields(config_class)}
        assert set(vars(parser.parse_args([]))) <= fields, name


def test_comma_separated_options_become_tuples() -> None:
    import argparse

    from quotientsharp.cli.reproduce_options import study_config
    from quotientsharp.workflows.options import InputError

    def parsed(study: str, **given: object) -> object:
        return study_config(argparse.Namespace(study=study, **given))

    assert parsed("diagonal", full=True, rhos="0.03, 0.1,").rhos == (0.03, 0.1)
    with pytest.raises(InputError, match="--rhos applies with --full only"):
        parsed("diagonal", full=False, rhos="0.1")       # read with --full only: refused
    with pytest.raises(ValueError, match="could not convert"):
        parsed("diagonal", full=True, rhos="0.1,x")
    assert parsed("invariance", measures="adaptive, worst_case").measures == (
        "adaptive", "worst_case")
    assert parsed("vit").models is None


def _cli_help(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
        except SystemExit as exit_:
            return int(exit_.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def test_plots_without_matplotlib_print_a_hint(tmp_path, monkeypatch, capsys) -> None:
    from quotientsharp.workflows.plots import PLOT_INSTALL_HINT, scatter_plots

    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(__import__("sys").modules, name, None)   # import raises
    assert scatter_plots([1.0, 2.0], {"m": [1.0, 3.0]}, tmp_path, x_label="x") is None
    assert PLOT_INSTALL_HINT in capsys.readouterr().err
    assert not list(tmp_path.glob("*.png"))


def test_resume_refuses_results_without_run_json(tmp_path) -> None:
    (tmp_path / "models.jsonl").write_text('{"model": 0}\n')
    with pytest.raises(ValueError, match="no run.json"):
        ResultsDirectory(tmp_path, "diagonal", {"a": 1}, resume=True, owned=["models.jsonl"])
    assert (tmp_path / "models.jsonl").exists()
