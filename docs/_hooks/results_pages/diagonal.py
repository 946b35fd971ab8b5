"""The diagonal page, ``docs/results/diagonal.md``, from the study's page data.

:func:`section` renders the page data of ``quotientsharp reproduce diagonal``
(:func:`quotientsharp.reproduce.diagonal.report.page_data`): :func:`tau_table` is the main
table, :func:`run_sections` the tables of one run (taus with intervals beside the maxima, the
check of the theory at interpolation, the population loss, the confounds, the diagnostics, the
paper's numbers), and :func:`full_lines` the tables of ``--full`` (data seeds, the rho sweep, a
training set per net, the ball), from the statistics the study computed
(:func:`quotientsharp.reproduce.diagonal.full.full_statistics`). Nothing is computed here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quotientsharp.reproduce.diagonal.measures import MEASURES

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


def run_sections(setup: Mapping[str, Any], analysis: Mapping[str, Any]) -> list[str]:
    """The markdown lines of one run's result tables (after the main table); ``setup``: the
    page data's settings in words."""
    interpolation = analysis["interpolation"]
    population = analysis["population"]
    theory, exact, apgd = (interpolation[k] for k in ("theory", "exact", "auto_pgd"))
    strong_mix = analysis["strong_over_exact_mix"]
    lines = [
        f"The maximum is exact for mix exact (the trust-region subproblem of the quadratic "
        f"batch loss over the ball ||Δβ|| ≤ √2 ρ, and over the scaled ball "
        f"||Δβ / (2 |β|)|| ≤ ρ/√2 for the rate ball) and, for the others, the best of a strong "
        f"Auto-PGD: {setup['reference_runs']} runs of "
        f"{setup['reference_iterations']} steps, from ξ = 0, from the maximiser of the "
        "quadratic model of the batch loss along the first-order path (a trust-region "
        "subproblem in the rates) and from its negative (the model is nearly even in the "
        "rates, the exact path is not), the rest from random points of the ball. The same "
        "ascent on mix exact, with random starts in place of the model's, reaches "
        f"{100 * strong_mix['min']:.4f} to {100 * strong_mix['max']:.4f} % of its exact "
        f"maximum. Intervals: percentile bootstrap over the nets, {setup['bootstrap']} "
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
FULL_INTRO = [
    "### Over seeds, the rho sweep and a training set per net (`--full`)",
    "",
    "Each seed below draws its own hyperparameters (init scale, learning rate, batch "
    "size), its own data (β\\*, training and test inputs) and its own schedules: the seeds "
    "are independent replicates of the design. 'Pooled over seeds' is the mean of the "
    "per-seed τ-b, its interval a two-stage cluster bootstrap (the seeds resampled, then "
    "the nets within each drawn seed: `quotientsharp.workflows.taus`), so it "
    "accounts for the variation between seeds. The maximum rows are the exact (mix exact, "
    "both balls) or strong (the others) maxima; the population rows measure the "
    "population loss ||β − β\\*||²; the confound rows rank the test loss against a "
    "hyperparameter.",
    "",
]


def sweep_lines(title: str, table: Mapping[str, Any]) -> list[str]:
    """One setting's table: tau-b per seed with its interval, and pooled over the seeds.

    Parameters
    ----------
    title
        The setting.
    table
        :func:`quotientsharp.reproduce.diagonal.full.seed_table`.
    """
    lines = [f"#### {title}", "", f"Kendall τ-b [95 % CI] per seed, N = "
             f"{', '.join(str(count) for count in table['counts'])} nets:", ""]
    lines += [f"| measure | {' | '.join(table['labels'])} | pooled over seeds |",
              "|---|" + "---|" * (len(table["labels"]) + 1)]
    for row in table["rows"]:
        cells = [interval_text(cell) for cell in row["runs"]]
        lines.append(f"| {row['label']} | {' | '.join(cells)} | "
                     f"{interval_text(row['pooled'])} |")
    lines.append("")
    return lines


def rho_lines(table: Mapping[str, Any]) -> list[str]:
    """One table with a column per rho: tau-b pooled over the seeds with its cluster bootstrap
    interval, and Auto-PGD as a percentage of the maximum
    (:func:`quotientsharp.reproduce.diagonal.full.rho_sweep`)."""
    lines = ["| measure | " + " | ".join(f"ρ = {rho:g}" for rho in table["rhos"]) + " |",
             "|---|" + "---|" * len(table["rhos"])]
    for row in table["rows"]:
        lines.append(f"| {row['label']} | {' | '.join(interval_text(c) for c in row['cells'])} |")
    for row in table["percent"]:
        lines.append(f"| Auto-PGD, % of the maximum: {row['name']} | "
                     f"{' | '.join(_percent(c) for c in row['cells'])} |")
    return lines


def ball_lines(pooled: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The ball as a studied option: the metric's own ball against the rate ball
    ``||b|| <= rho / sqrt(2)``, for inv and mix, pooled over the seeds (shared training set);
    which ball the paper's protocol most likely used; where the paper's adaptive value lies.

    Parameters
    ----------
    pooled
        Sweep row label -> pooled tau-b (``tau_b``, ``b_low``, ``b_high``).
    """
    def cell(label: str) -> str:
        return interval_text(pooled[label])

    own = pooled["geodesic_mix_exact (exact maximum)"]
    rate = pooled["geodesic_mix_exact_rateball (exact maximum)"]
    adaptive = pooled["adaptive (Auto-PGD)"]
    inside = adaptive["b_low"] <= -0.68 <= adaptive["b_high"]
    rate_sign = ("excludes 0 on the paper's side" if rate["b_high"] < 0 else
                 "does not exclude 0 on the paper's side")
    return [
        "#### The ball: the metric's own ball against the rate ball", "",
        "A horizontal perturbation is a rate vector b (ξ = (b u, b v)). The inv metric's norm "
        "of it is √2 ||b||, so inv's own ball *is* the rate ball ||b|| ≤ ρ/√2: one set, one "
        "measure, the same taus. The mix metric's norm is √2 ||β b||: its own ball allows "
        "rates up to ρ/(√2 |β_i|) on small coordinates. The rate ball for mix keeps the mix "
        "geodesic β (1 + 2b) and bounds the rates as inv does; its exact maximum is the "
        "trust-region subproblem in D = 2 β b over ||D / (2 |β|)|| ≤ ρ/√2. Kendall τ-b pooled "
        "over the seeds (the training set shared by the nets), with cluster bootstrap "
        "intervals:", "",
        "| measure | ball | Auto-PGD | maximum | paper |", "|---|---|---|---|---|",
        f"| geodesic inv, exact path | own = rate ball (the same set) | "
        f"{cell('geodesic_inv_exact (Auto-PGD)')} | "
        f"{cell('geodesic_inv_exact (strong maximum)')} (strong) | -0.83 |",
        f"| geodesic mix, exact path | own ball √2 ||β b|| ≤ ρ | "
        f"{cell('geodesic_mix_exact (Auto-PGD)')} | {interval_text(own)} (exact) | -0.86 |",
        f"| geodesic mix, exact path | rate ball ||b|| ≤ ρ/√2 | "
        f"{cell('geodesic_mix_exact_rateball (Auto-PGD)')} | {interval_text(rate)} (exact) "
        f"| -0.86 |",
        "",
        "**Which ball the paper's protocol most likely used: the rate ball** (a bound on the "
        "rates, or on a perturbation normalised by the parameters, as adaptive sharpness "
        "does). With the mix metric's own ball the exact-path measure is the constant "
        "2 ρ² λ_max(A_B) at interpolation, so no ranking of the nets by it can reach the "
        f"paper's -0.86 (ours: {interval_text(own)}, which ranks the leftover residual). With "
        f"the rate ball it is {interval_text(rate)}, an interval that {rate_sign}; the rate "
        "ball is also the only one of the two that the paper's two metrics share, so a "
        "protocol that scales one perturbation to radius ρ for both metrics gets it. The "
        "paper does not state its ball, so this is an inference from the numbers, not a "
        "reading of its code. How far the default ascent gets under each ball, against ρ, is "
        "on the solver-reach page (`quotientsharp reproduce reach`, docs/results/reach.md): "
        "compare measures where each reaches close to its maximum.",
        "",
        f"The paper's adaptive -0.68 lies {'inside' if inside else 'outside'} our pooled "
        f"interval for adaptive (Auto-PGD) {interval_text(adaptive)}"
        + ("." if inside else ": only the sign agrees. Our nets differ in one factor, the "
           "initialisation scale, that ranks the test loss almost perfectly; the paper does "
           "not say what varies across its nets."),
        "",
    ]


def full_lines(full: Mapping[str, Any]) -> list[str]:
    """The ``--full`` part of the page
    (:func:`quotientsharp.reproduce.diagonal.full.full_statistics`)."""
    lines = list(FULL_INTRO)
    for group in full["groups"]:
        lines += sweep_lines(group["title"], group)
    lines += ball_lines(full["ball"])
    lines += ["#### The rho sweep", "",
              "Kendall τ-b pooled over the seeds [95 % cluster bootstrap CI], and Auto-PGD as "
              "a percentage of the maximum (min / median / max over the nets of every seed):", ""]
    lines += rho_lines(full["rho"])
    lines.append("")
    return lines


# ---------------------------------------------------------------------------- the page
def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _header_lines(page: Mapping[str, Any]) -> list[str]:
    """The heading, the command, the run and the setup."""
    setup, runs, full = page["setup"], page["runs"], page["full"] is not None
    world_size = page["world_size"]
    return [
        "## Diagonal networks (paper Sec. 5.1)",
        "",
        f"Reproduce: `{page['command']}` (outputs in `{page['folder']}/`; add "
        "`--docs docs` to rewrite this section and regenerate this page"
        + ("" if full else "; `--full` adds the data seeds, the ρ sweep and the variants")
        + f"). This run: {page['nets']} nets, {page['counted']} counted"
        + (f" (and {runs - 1} more runs of {page['nets']} nets below)" if runs > 1 else "")
        + f", wall time {_duration(page['wall_seconds'])}{' in all' if runs > 1 else ''} "
        f"({page['threads']} torch thread(s)"
        + (f" per rank, {world_size} ranks under torchrun: training on rank 0, the measures "
           "dealt over the ranks" if world_size > 1 else "")
        + f"{', resumed' if page['resumed'] else ''}).",
        "",
        f"Setup (ours; the paper does not state n, rho or what varies): d = {setup['d']}, "
        f"n = {setup['n_train']} Gaussian training inputs "
        f"({'one set per net' if setup['training_sets'] == 'per_net' else 'shared by the nets'}"
        f"), {setup['n_test']} test inputs, "
        f"beta* with {setup['support']} nonzero N(0, 1) entries rescaled to unit norm, "
        f"noiseless targets; u0 = a 1, v0 = 0; per net a ~ logU{setup['init_scale']}, "
        f"learning rate ~ logU{setup['learning_rate']}, batch size ~ "
        f"U{setup['batch_sizes']}; minibatch gradient descent to training loss "
        f"< {setup['target_loss']:g} (at most {setup['max_steps']} steps). Sharpness on the "
        f"training set in {setup['n_train'] // setup['sharpness_batch_size']} batches of "
        f"{setup['sharpness_batch_size']} (per batch, then averaged), rho = {setup['rho']:g} "
        f"for every measure, Auto-PGD with N = {setup['n_iter']}, "
        f"checkpoints {setup['checkpoints']}. Generalisation: test loss. "
        f"Seed {setup['seed']}, data seed {setup['problem_seed']}.",
        "",
        "Kendall tau between test loss and sharpness (negative: sharper nets generalise "
        "better), with 95 % bootstrap intervals; the paper's values are in a separate table "
        "below:",
        "",
    ]


def section(page: Mapping[str, Any]) -> str:
    """The markdown section ``docs/results/diagonal.md`` of the study's page data."""
    analysis = page["analysis"]
    lines = _header_lines(page)
    lines += [tau_table(analysis) if analysis is not None
              else f"(only {page['counted']} net(s) counted: no rank correlation)", ""]
    if analysis is not None:
        lines += run_sections(page["setup"], analysis)
    lines += [""] + ([] if page["full"] is None else full_lines(page["full"]))
    lines += [
        "### Spread of each measure",
        "",
        "| measure | path | min | median | max |",
        "|---|---|---|---|---|",
    ]
    for row in page["spread"]:
        lines.append(f"| {row['label']} | {row['path']} | {row['min']:.3g} | "
                     f"{row['median']:.3g} | {row['max']:.3g} |")
    lines += [
        "",
        "From `xi = 0`, the adaptive ascent on `(u, v)` never leaves the horizontal space "
        "(its raised gradient `dL/dbeta' (1 + b) beta (u, v)` is horizontal at every iterate), "
        "so it coincides with the order-1 inv geodesic ascent: those two rows agree up to "
        "rounding (order 1 under the GL(1) inv metric is exactly adaptive sharpness).",
    ]
    test = page["test_loss"]
    if test is not None:
        lines += ["", f"Test loss over the counted nets: min {test['min']:.3g}, median "
                  f"{test['median']:.3g}, max {test['max']:.3g}."]
    unconverged, diverged = page["unconverged"], page["diverged"]
    if unconverged or diverged:
        missed = []
        if unconverged:
            missed.append(f"net(s) {unconverged} still above the target loss after "
                          f"{page['setup']['max_steps']} steps")
        if diverged:
            missed.append(f"net(s) {diverged} diverged")
        lines += ["", f"Not counted in the correlations: {'; '.join(missed)}."]
    else:
        lines += ["", "Every net reached the target training loss."]
    return "\n".join(lines) + "\n"
