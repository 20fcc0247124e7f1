"""Claim 1: the variance of random q·k against theory (`pipelines.variance`)
and the model's unscaled/scaled score std at init against √d_k."""

import math

from pipelines.common import markdown_table
from pipelines.compare.measure import has_pair
from pipelines.compare.measure import init_points
from pipelines.compare.measure import init_values
from pipelines.compare.measure import sliced
from pipelines.compare.series import arms_over_key_dim
from pipelines.engine.presets import PAIR
from pipelines.reports.numbers import mean_sd
from pipelines.variance import variance_markdown

NUMBER = "1"
STATEMENT = "Var(q·k) = d_k for unit-variance q, k; 1/√d_k brings it to 1"
SCALAR_RUNS = ("claims",)
# The unscaled/scaled score std ratio within this of sqrt(d_k).
RATIO_TOLERANCE = 0.05
# Measured variances within this many standard errors of theory.
STANDARD_ERRORS = 4
# The scaled model's score std at init counts as "close to 1" in this range
# (the lesson assumes unit-variance q and k components).
_UNIT_STD_RANGE = (0.75, 1.25)


def applies(plan):
    return True


def variance_claim(plan, results, variance_rows):
    """Claim 1 from the slice's results and the variance rows."""
    variance_ok = [
        abs(row["var_unscaled"] / row["theory_unscaled"] - 1)
        <= STANDARD_ERRORS * row["relative_standard_error"]
        and abs(row["var_scaled"] - 1)
        <= STANDARD_ERRORS * row["relative_standard_error"]
        for row in variance_rows
    ]
    ratios = []
    if has_pair(plan):
        for key_dim in plan.axis("key_dim"):
            scaled, unscaled = (
                mean_sd(init_values(results, arm, key_dim, "score_std"))[0]
                for arm in PAIR)
            ratios.append({
                "key_dim": key_dim,
                "scaled_score_std": scaled,
                "unscaled_score_std": unscaled,
                "ratio": unscaled / scaled,
                "sqrt_key_dim": math.sqrt(key_dim),
                "relative_error": unscaled / scaled / math.sqrt(key_dim) - 1,
            })
    return {
        "holds": (
            None if not has_pair(plan) and not variance_rows
            else all(variance_ok) and _ratios_within(ratios)
        ),
        "variance_within_tolerance": variance_ok,
        "score_std_ratios": ratios,
    }


def _ratios_within(ratios):
    return all(abs(r["relative_error"]) <= RATIO_TOLERANCE for r in ratios)


def measure(plan, results, log=print):
    return variance_claim(plan, sliced(plan, results), results["variance"])


def headline(plan, claim):
    if not claim["score_std_ratios"]:
        return None
    r = claim["score_std_ratios"][-1]
    return (f"unscaled/scaled score std at init {r['ratio']:.2f} at d_k "
            f"{r['key_dim']} (√d_k = {r['sqrt_key_dim']:.2f})")


def variance_verdict(claim, variance_rows):
    """`(lines, holds)`: claim 1 in words."""
    lines = []
    if variance_rows:
        worst = max(abs(r["var_unscaled"] / r["theory_unscaled"] - 1)
                    for r in variance_rows)
        lines.append(
            f"Random unit-variance q, k: Var(q·k) matches d_k and the scaled "
            f"variance matches 1 at every d_k within sampling error "
            f"(largest relative deviation {worst:.1%})."
            if all(claim["variance_within_tolerance"]) else
            "Random unit-variance q, k: the measured variance is further "
            "from theory than sampling error allows at some d_k (see the "
            "table): the derivation is NOT confirmed by these samples.")
    ratios = claim["score_std_ratios"]
    if ratios:
        within = _ratios_within(ratios)
        scaled = [r["scaled_score_std"] for r in ratios]
        low, high = _UNIT_STD_RANGE
        lines.append(
            "In the model at init, the unscaled/scaled score std ratio is "
            + ", ".join(
                f"{r['ratio']:.2f} at d_k {r['key_dim']} (√d_k = "
                f"{r['sqrt_key_dim']:.2f})" for r in ratios
            )
            + (" — " if within else " — NOT ")
            + f"within {RATIO_TOLERANCE:.0%} of √d_k everywhere."
            + " Both arms start from the same weights, so this ratio is the"
            " scale itself; what tests the lesson's assumption is the scaled"
            f" score std, {min(scaled):.2f}–{max(scaled):.2f}: "
            + ("close to 1, so q and k do have roughly unit-variance "
               "components at init."
               if all(low <= s <= high for s in scaled) else
               "NOT close to 1, so the model's q and k do not have the "
               "unit-variance components the derivation assumes.")
        )
    return lines, claim["holds"]


def verdict(plan, claim, results):
    return variance_verdict(claim, results["variance"])


def section(plan, claim, results):
    lines = []
    if results["variance"]:
        lines += ["## Claim 1: Var(q·k) for random unit-variance q, k", "",
                  *variance_markdown(results["variance"]), ""]
    ratios = claim["score_std_ratios"]
    if ratios:
        lines += [
            "## Score std at init in the model, unscaled / scaled vs √d_k",
            "", *markdown_table(
                ["d_k", "scaled", "unscaled", "ratio", "√d_k",
                 "ratio/√d_k − 1"],
                [[str(r["key_dim"]), f"{r['scaled_score_std']:.3f}",
                  f"{r['unscaled_score_std']:.3f}", f"{r['ratio']:.3f}",
                  f"{r['sqrt_key_dim']:.3f}", f"{r['relative_error']:+.2%}"]
                 for r in ratios]), ""]
    return lines


def _score_std_figure(document):
    reference = document["figures"]["sqrt_key_dim"]

    def theory(ax):
        ax.set_yscale("log", base=2)
        ax.plot(reference["key_dims"], reference["value"], color="black",
                linestyle="--", linewidth=1, label="√d_k")
        ax.plot(reference["key_dims"], [1.0] * len(reference["key_dims"]),
                color="grey", linestyle=":", linewidth=1, label="1")

    return arms_over_key_dim(
        document["figures"]["score_std"], "std of the scores at init",
        "Score std at init, mean ± sd over seeds", draw=theory)


FIGURES = (
    ("score_std", "(c) Standard deviation of the attention scores at "
     "initialization against d_k, with the √d_k line (unscaled theory) and "
     "1 (scaled theory).", _score_std_figure),
)


def scalars(plan, claim, results):
    return {"claims": init_points(sliced(plan, results), ("score_std",))}

