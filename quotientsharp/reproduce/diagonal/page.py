"""``reproduce diagonal``: the markdown of the results page ``docs/results/diagonal.md``.

:func:`tau_table` is the main table (also printed on the console), :func:`run_sections` the
tables of one run (taus with intervals beside the maxima, the check of the theory at
interpolation, the population loss, the confounds, the diagnostics, the paper's numbers), and
:func:`sweep_sections` the tables of ``--full`` (data seeds, the rho sweep, a training set per
net), with the numbers pooled over data seeds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quotientsharp.reproduce.diagonal.analysis import MAXIMUM_OF, spread
from quotientsharp.reproduce.diagonal.measures import MEASURES
from quotientsharp.reproduce.diagonal.settings import DiagonalSettings
from quotientsharp.workflows.taus import cluster_bootstrap_tau, tau_interval

Record = Mapping[str, Any]

#: What each measure is at interpolation, in our words (the results section of the page).
THEORY = r"""### What each measure is at interpolation

Write $\beta = u \odot v$ and, for a sharpness batch $B$ of $m$ inputs,
$A_B = X_B^\top X_B / m$. The study's loss is $L_B(\beta) = \lVert X_B \beta - y_B \rVert^2 / m$,
so a net that interpolates the batch ($X_B \beta = y_B$) has

$$
L_B(\beta + \Delta) - L_B(\beta) = \Delta^\top A_B \Delta .
$$

A horizontal perturbation is a rate vector $b \in \mathbb{R}^d$ ($\xi = (b \odot u, b \odot v)$),
and every path moves $\beta$ coordinate by coordinate.

- **Geodesic mix, exact path.** The path is $\beta \odot (1 + 2 b)$, so
    $\Delta = 2 \beta \odot b$, and the mix ball $\sqrt{2}\, \lVert \beta \odot b \rVert \le \rho$
    is exactly the Euclidean ball $\lVert \Delta \rVert \le \sqrt{2}\, \rho$: every direction of
    $\beta$-space, whatever the net. The maximum of $\Delta^\top A_B \Delta$ over that ball is

    $$
    S_{\mathrm{mix}} = 2 \rho^2 \lambda_{\max}(A_B),
    $$

    a property of the data alone: **the same number for every interpolating net**. Differences
    between nets come only from their leftover training residual (and, for Auto-PGD, from how
    close the ascent gets to the maximum). Its rank correlation with the test loss therefore
    measures noise, and its sign can flip between data draws. (Away from interpolation a gradient
    term $2 r^\top X_B \Delta / m$ adds to it; the exact maximum of the quadratic over the ball
    is the trust-region subproblem, which the study solves exactly.)

- **Geodesic inv, exact path, and adaptive sharpness.** The inv path is
    $\beta \odot e^{2 b}$, so $\Delta \approx 2 \beta \odot b$ with
    $\lVert b \rVert \le \rho / \sqrt{2}$: to leading order

    $$
    S_{\mathrm{inv}} \approx 2 \rho^2 \lambda_{\max}(D_\beta A_B D_\beta),
    \qquad D_\beta = \operatorname{diag}(\beta),
    $$

    the top eigenvalue of the curvature seen through the net's own coefficients. It grows with
    $\lvert \beta \rvert$ where the data are curved: a dense interpolant (large initialisation)
    spreads weight over many coordinates, a sparse one concentrates it on the support of
    $\beta^\star$. Adaptive sharpness on $(u, v)$ has the same first-order ball (an ascent from
    $\xi = 0$ stays horizontal), so the two agree to leading order.

- **Geodesic mix, first- and second-order paths.** The mix ball allows rates up to
    $\lvert b_i \rvert \le \rho / (\sqrt{2}\, \lvert \beta_i \rvert)$. On a coordinate with a
    tiny $\lvert \beta_i \rvert$ (most of the $d$ coordinates of a sparse interpolant) that is
    $\lvert b_i \rvert \gg 1$, where the truncated paths $\beta (1 + b)^2$ and
    $\beta (1 + b - b^2/2)^2$ are no longer close to the geodesic $\beta (1 + 2b)$: they reach
    $\beta_i b_i^2 \sim \rho^2 / \lvert \beta_i \rvert$, so the values blow up as
    $1 / \min_i \lvert \beta_i \rvert$ (and its square for order 2). They rank
    $\min_i \lvert \beta_i \rvert$, not sharpness. We keep them as **diagnostics outside the
    validity of the expansion**, not as measures.

- **Population loss.** For $x \sim \mathcal{N}(0, I)$ the population loss is
    $L(\beta) = \lVert \beta - \beta^\star \rVert^2$ ($A = I$, no leftover residual), and mix exact
    sharpness has the closed form

    $$
    S_{\mathrm{mix}}^{\mathrm{pop}} = 2 \sqrt{2}\, \rho\, \lVert \beta - \beta^\star \rVert
    + 2 \rho^2 ,
    $$

    increasing in the population loss: its Kendall tau with the (population) test loss is
    $+1$, the opposite sign of the paper's $-0.86$. The study evaluates every measure on the
    population loss by one batch $X = \sqrt{d}\, I_d$, $y = X \beta^\star$, whose mean squared error
    is exactly $\lVert \beta - \beta^\star \rVert^2$.
"""


def _signed(value: float | None) -> str:
    return "—" if value is None else f"{value:+.2f}"


def interval_text(tau: Mapping[str, Any], which: str = "b") -> str:
    """``+0.49 [+0.31, +0.62]`` for tau-``which`` of a
    :class:`~quotientsharp.workflows.taus.TauInterval` dict."""
    low, high = tau.get(f"{which}_low"), tau.get(f"{which}_high")
    text = _signed(tau[f"tau_{which}"])
    return text if low is None or high is None else f"{text} [{low:+.2f}, {high:+.2f}]"


def _percent(spread: Mapping[str, float]) -> str:
    return f"{spread['min']:.1f} / {spread['median']:.1f} / {spread['max']:.1f}"


def tau_table(analysis: Mapping[str, Any]) -> str:
    """The main table: per measure the taus of the Auto-PGD values and of the maxima, with
    95 % bootstrap intervals, and Auto-PGD as a percentage of the maximum."""
    lines = ["| measure | τ-a [95 % CI] | τ-b [95 % CI] | τ-b of the maximum [95 % CI] "
             "| Auto-PGD, % of the maximum (min / median / max) | note |",
             "|---|---|---|---|---|---|"]
    for spec in MEASURES:
        if spec.diagnostic:
            continue
        tau = analysis["taus"][spec.name]
        maximum = analysis["maximum_taus"].get(spec.name)
        percent = analysis["percent_of_maximum"].get(spec.name)
        lines.append(
            f"| {spec.name} | {interval_text(tau, 'a')} | {interval_text(tau, 'b')} | "
            f"{'—' if maximum is None else interval_text(maximum, 'b')} | "
            f"{'—' if percent is None else _percent(percent)} | {spec.note} |")
    return "\n".join(lines)


def _sign_agreement(tau: Mapping[str, Any], paper: float) -> str:
    """Whether the interval of tau-b excludes 0 on the paper's side, the other, or neither."""
    low, high = tau.get("b_low"), tau.get("b_high")
    if low is None or high is None:
        return "sign undetermined"
    if (high < 0) == (paper < 0) and (low > 0 or high < 0):
        return "reachable in sign (the interval excludes 0 on the paper's side)"
    if low > 0 or high < 0:
        return "**opposite sign** to the paper's (the interval excludes 0)"
    return "sign not resolved (the interval contains 0)"


def paper_comparison(analysis: Mapping[str, Any]) -> str:
    """The paper's taus beside ours, and which of them our setting cannot reach, and why."""
    taus, maxima = analysis["taus"], analysis["maximum_taus"]
    population = analysis["population_taus"]
    scale = interval_text(analysis["confounds"]["init_scale"])
    rows = [
        ("adaptive", -0.68, f"Auto-PGD {interval_text(taus['adaptive'])}; maximum "
         f"{interval_text(maxima['adaptive'])}; population loss "
         f"{interval_text(population['adaptive'])}",
         f"{_sign_agreement(taus['adaptive'], -0.68)}; the init scale alone ranks the test "
         f"loss with τ-b {scale}"),
        ("geodesic inv", -0.83, f"exact path, Auto-PGD "
         f"{interval_text(taus['geodesic_inv_exact'])}; maximum "
         f"{interval_text(maxima['geodesic_inv_exact'])}; population loss "
         f"{interval_text(population['geodesic_inv_exact'])}",
         _sign_agreement(taus["geodesic_inv_exact"], -0.83)),
        ("geodesic mix", -0.86, f"exact path: Auto-PGD "
         f"{interval_text(taus['geodesic_mix_exact'])}, exact maximum "
         f"{interval_text(maxima['geodesic_mix_exact'])}; population loss, exact maximum "
         f"{interval_text(population['geodesic_mix_exact_max'])}",
         "**not reachable**: with exact geodesics the measure is the same number "
         "2 ρ² λ_max(A_B) for every interpolating net, so the training-set values rank only "
         "the leftover residual and the solver's error; on the population loss it increases "
         "with the test loss (τ = +1). The first- and second-order paths (the paper's Alg. 1) "
         "leave the validity of the expansion and rank min_i abs(β_i) instead (diagnostics above)"),
    ]
    lines = ["| measure | paper τ | ours (τ-b [95 % CI]) | reachable? |", "|---|---|---|---|"]
    lines += [f"| {a} | {b:+.2f} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def run_sections(settings: DiagonalSettings, analysis: Mapping[str, Any]) -> list[str]:
    """The markdown lines of one run's result tables (after the main table)."""
    interpolation = analysis["interpolation"]
    population = analysis["population"]
    theory, exact, apgd = (interpolation[k] for k in ("theory", "exact", "auto_pgd"))
    strong_mix = analysis["strong_over_exact_mix"]
    lines = [
        f"The maximum is exact for mix exact (the trust-region subproblem of the quadratic "
        f"batch loss over the ball ||Δβ|| ≤ √2 ρ, and over the scaled ball "
        f"||Δβ / (2 |β|)|| ≤ ρ/√2 for the rate ball) and, for the others, the best of a strong "
        f"Auto-PGD: {settings.reference_ascent.runs} runs of "
        f"{settings.reference_iterations} steps, from ξ = 0, from the maximiser of the "
        "quadratic model of the batch loss along the first-order path (a trust-region "
        "subproblem in the rates) and from its negative (the model is nearly even in the "
        "rates, the exact path is not), the rest from random points of the ball. The same "
        "ascent on mix exact, with random starts in place of the model's, reaches "
        f"{100 * strong_mix['min']:.4f} to {100 * strong_mix['max']:.4f} % of its exact "
        f"maximum. Intervals: percentile bootstrap over the nets, {settings.bootstrap} "
        "resamples.",
        "",
        THEORY,
        "Measured in this run (per net, the mean over the sharpness batches):",
        "",
        "| quantity | min | median | max |",
        "|---|---|---|---|",
        f"| theory 2 ρ² λ_max(A_B) | {theory['min']:.6g} | {theory['median']:.6g} | "
        f"{theory['max']:.6g} |",
        f"| mix exact, exact maximum | {exact['min']:.6g} | {exact['median']:.6g} | "
        f"{exact['max']:.6g} |",
        f"| mix exact, Auto-PGD | {apgd['min']:.6g} | {apgd['median']:.6g} | "
        f"{apgd['max']:.6g} |",
        "",
        f"The exact maximum lies within {100 * interpolation['largest_relative_deviation']:.2g} "
        "% of the theory for every net (the nets stop at a training loss up to "
        f"{interpolation['largest_train_loss']:.2g}, not exactly at interpolation); the spread "
        "of the Auto-PGD values is the ascent's shortfall, not a property of the nets.",
        "",
        "### Sharpness of the population loss",
        "",
        "The same nets, each measure on the population loss ||β − β\\*||² instead of the "
        "training batches (Auto-PGD as in the study; mix exact also exactly). Kendall τ against "
        "the test loss:",
        "",
        "| measure | τ-a [95 % CI] | τ-b [95 % CI] |",
        "|---|---|---|",
    ]
    names = {"geodesic_mix_exact_max": "geodesic_mix_exact (exact maximum)"}
    for name, tau in analysis["population_taus"].items():
        lines.append(f"| {names.get(name, name + ' (Auto-PGD)')} | {interval_text(tau, 'a')} | "
                     f"{interval_text(tau, 'b')} |")
    lines += [
        "",
        f"Against the population loss itself the exact mix value has τ-b "
        f"{interval_text(population['tau_population_loss'])}, and it matches the closed form "
        f"2√2 ρ ||β − β\\*|| + 2ρ² within "
        f"{population['closed_form_largest_relative_deviation']:.1g} (relative) for every "
        "net. (The test loss is a sample of 5000 inputs, so its ranking differs slightly "
        "from the population loss's.)",
        "",
        "### Confounds",
        "",
        "Kendall τ of the test loss against each hyperparameter drawn per net (batch size has "
        "ties: τ-b is the one to read):",
        "",
        "| hyperparameter | τ-a [95 % CI] | τ-b [95 % CI] |",
        "|---|---|---|",
    ]
    for name, tau in analysis["confounds"].items():
        lines.append(f"| {name} | {interval_text(tau, 'a')} | {interval_text(tau, 'b')} |")
    lines += [
        "",
        "### Diagnostics outside the expansion's validity",
        "",
        "Geodesic mix with first- and second-order paths: not measures here (see above), so "
        "they are not correlated with the test loss. What they rank is min_i |β_i|:",
        "",
        "| path | min | median | max | τ-b against min_i abs(β_i) [95 % CI] |",
        "|---|---|---|---|---|",
    ]
    for name, diag in analysis["diagnostics"].items():
        lines.append(f"| {name} | {diag['min']:.3g} | {diag['median']:.3g} | "
                     f"{diag['max']:.3g} | {interval_text(diag['tau_min_abs_beta'])} |")
    lines += [
        "",
        "### The paper's numbers",
        "",
        "The paper (Sec. 5.1) reports one τ per measure; it does not state n, ρ or what varies "
        "across its nets, so only signs and orderings can be compared.",
        "",
        paper_comparison(analysis),
    ]
    return lines


# ---------------------------------------------------------------------------- --full
@dataclass(frozen=True)
class Row:
    """One row of the sweep tables: a label and the per-record value it ranks."""

    label: str
    value: Callable[[Record], float]


def _sharpness(key: str) -> Callable[[Record], float]:
    return lambda record: float(record["sharpness"][key])


def _field(key: str) -> Callable[[Record], float]:
    return lambda record: float(record[key])


#: The rows of the sweep tables: the measures, their maxima, the population loss, the
#: confounds.
SWEEP_ROWS: tuple[Row, ...] = (
    *(Row(f"{spec.name} (Auto-PGD)", _sharpness(spec.name)) for spec in MEASURES
      if not spec.diagnostic),
    *(Row(f"{name} ({'exact' if key.startswith('exact') else 'strong'} maximum)",
          _sharpness(key)) for name, key in MAXIMUM_OF.items()),
    Row("population: adaptive (Auto-PGD)", _sharpness("population:adaptive")),
    Row("population: geodesic_inv_exact (Auto-PGD)",
        _sharpness("population:geodesic_inv_exact")),
    Row("population: geodesic_mix_exact (exact maximum)",
        _sharpness("population_exact:geodesic_mix_exact")),
    Row("population: geodesic_mix_exact_rateball (exact maximum)",
        _sharpness("population_exact:geodesic_mix_exact_rateball")),
    Row("confound: init_scale", _field("init_scale")),
    Row("confound: learning_rate", _field("learning_rate")),
    Row("confound: batch_size", _field("batch_size")),
)


@dataclass(frozen=True)
class SweepRun:
    """One run of ``--full``: its label, settings and the counted records."""

    label: str
    settings: DiagonalSettings
    records: Sequence[Record]


def _pairs(run: SweepRun, row: Row) -> tuple[list[float], list[float]]:
    return [r["test_loss"] for r in run.records], [row.value(r) for r in run.records]


def _single(run: SweepRun, row: Row, samples: int, seed: int) -> dict[str, Any]:
    return tau_interval(*_pairs(run, row), samples, seed).as_dict()


def pooled_over_seeds(runs: Sequence[SweepRun], row: Row, samples: int, seed: int
                      ) -> dict[str, Any]:
    """The mean over the runs (seeds) of their tau-b, with its two-stage cluster bootstrap
    interval (:func:`~quotientsharp.workflows.taus.cluster_bootstrap_tau`), as a
    dict :func:`interval_text` reads (``tau_b``, ``b_low``, ``b_high``)."""
    xs, ys, clusters = [], [], []
    for index, run in enumerate(runs):
        x, y = _pairs(run, row)
        xs += x
        ys += y
        clusters += [index] * len(x)
    tau, low, high = cluster_bootstrap_tau(xs, ys, clusters, samples, seed)
    return {"tau_b": tau, "b_low": low, "b_high": high}


def _seed_table(runs: Sequence[SweepRun], samples: int, seed: int) -> list[str]:
    header = " | ".join(run.label for run in runs)
    lines = [f"| measure | {header} | pooled over seeds |",
             "|---|" + "---|" * (len(runs) + 1)]
    for row in SWEEP_ROWS:
        cells = [interval_text(_single(run, row, samples, seed)) for run in runs]
        pooled = interval_text(pooled_over_seeds(runs, row, samples, seed))
        lines.append(f"| {row.label} | {' | '.join(cells)} | {pooled} |")
    return lines


def sweep_sections(groups: Mapping[str, Sequence[SweepRun]], samples: int, seed: int
                   ) -> list[str]:
    """The tables of ``--full``: one per group of runs (seeds of one setting), tau-b per seed
    with its interval and pooled over the seeds with a cluster bootstrap interval.

    Parameters
    ----------
    groups
        Title -> the runs of that setting, one per seed.
    samples, seed
        Bootstrap resamples and seed.
    """
    lines: list[str] = []
    for title, runs in groups.items():
        lines += [f"#### {title}", "", f"Kendall τ-b [95 % CI] per seed, N = "
                  f"{', '.join(str(len(r.records)) for r in runs)} nets:", ""]
        lines += _seed_table(runs, samples, seed)
        lines.append("")
    return lines


def rho_table(groups: Mapping[float, Sequence[SweepRun]], samples: int, seed: int) -> list[str]:
    """One table with a column per rho: tau-b pooled over the seeds, with its cluster
    bootstrap interval."""
    rhos = sorted(groups)
    lines = ["| measure | " + " | ".join(f"ρ = {rho:g}" for rho in rhos) + " |",
             "|---|" + "---|" * len(rhos)]
    for row in SWEEP_ROWS:
        cells = [interval_text(pooled_over_seeds(groups[rho], row, samples, seed))
                 for rho in rhos]
        lines.append(f"| {row.label} | {' | '.join(cells)} |")
    for name, key in MAXIMUM_OF.items():
        cells = []
        for rho in rhos:
            stats = spread([100.0 * r["sharpness"][name] / r["sharpness"][key]
                            for run in groups[rho] for r in run.records])
            cells.append(_percent(stats))
        lines.append(f"| Auto-PGD, % of the maximum: {name} | {' | '.join(cells)} |")
    return lines
