"""Claim 3: per trained d_k the scaled minus unscaled final accuracy (on
text, bits per character) paired by seed, the gradient ratios at init, and
what the control arms say."""

import numpy as np

from pipelines.common import markdown_table
from pipelines.compare.measure import has_pair
from pipelines.compare.measure import init_points
from pipelines.compare.measure import run_values
from pipelines.compare.measure import sliced
from pipelines.engine.presets import PAIR
from pipelines.reports.numbers import fmt
from pipelines.reports.numbers import fmt_mean_sd
from pipelines.reports.numbers import fmt_steps
from pipelines.reports.numbers import mean_sd
from pipelines.reports.numbers import over_seeds
from pipelines.reports.numbers import ratio
from pipelines.reports.plotting import finish_panel
from pipelines.reports.plotting import log2_axis
from pipelines.reports.plotting import new_figure
from pipelines.reports.plotting import series_panel

NUMBER = "3"
STATEMENT = "In saturation gradients vanish and learning stalls"
SCALAR_RUNS = ("claims",)
# A training gap: the scaled model's final accuracy ahead by this much
# (claims 4 and 5 measure their gaps and fades by it too).
GAP = 0.1
# On text the gap is in held-out bits per character: next-character accuracy
# (top-1 of ~100 symbols) moves little while the loss still falls. This many
# bits (about 2% of the stdlib corpus's 4.56-bit unigram baseline) is a gap.
BITS_GAP = 0.1
# The gradient norms at init compared (dL/dscores, dL/dW_Q, dL/dW_K).
_GRADIENTS = ("scores", "query", "key")
# The control arms, in the order the verdict discusses them.
_CONTROL_ARMS = ("saturated_init", "compensated_init", "learned", "qk_norm")
# The controls that explain a gap: what each starts from, and what it means
# when it learned (reached the target on a seed) or failed.
_INIT_CONTROLS = {
    "saturated_init": (
        "the scale but starts from the unscaled model's saturated scores",
        "it still learned, so the scale helps beyond the starting point.",
        "it failed too, so what stalls learning is the saturated start, not "
        "the missing divisor as such.",
    ),
    "compensated_init": (
        "no scale but starts from unsaturated scores",
        "it learned, so an unsaturated start recovers much of what the scale "
        "gives.",
        "it failed as well, so an unsaturated start alone did not rescue the "
        "unscaled model here.",
    ),
}


def applies(plan):
    return True


def _paired_runs(results, key_dim):
    """`[(seed, scaled, unscaled)]` records where both have a final
    accuracy at `key_dim`."""
    by_seed = {}
    for record in results["runs"]:
        if record["key_dim"] == key_dim and record["arm"] in PAIR:
            by_seed.setdefault(record["seed"], {})[record["arm"]] = record
    return [
        (seed, *(pair[arm] for arm in PAIR))
        for seed, pair in sorted(by_seed.items())
        if all(arm in pair and pair[arm]["final_accuracy"] is not None
               for arm in PAIR)
    ]


def _init_ratio(paired, key):
    """Unscaled over scaled mean of the init statistic `key`, or None."""
    scaled = mean_sd([s["init"][key] for _, s, _ in paired if s["init"]])[0]
    unscaled = mean_sd([u["init"][key] for _, _, u in paired if u["init"]])[0]
    return ratio(unscaled, scaled)


def _training_gap(results, key_dim):
    paired = _paired_runs(results, key_dim)
    differences = [s["final_accuracy"] - u["final_accuracy"]
                   for _, s, u in paired]
    bits = [u["final_bits"] - s["final_bits"] for _, s, u in paired
            if s.get("final_bits") is not None
            and u.get("final_bits") is not None]
    if bits and len(bits) == len(paired):
        # Text: the verdict is on bits per character (see BITS_GAP).
        every, average = (all(b >= BITS_GAP for b in bits),
                          float(np.mean(bits)) >= BITS_GAP)
    else:
        bits = None
        every = bool(differences) and all(d >= GAP for d in differences)
        average = bool(differences) and float(np.mean(differences)) >= GAP
    return {
        "key_dim": key_dim,
        "seeds": [seed for seed, _, _ in paired],
        "accuracy_difference": differences,
        "bits_difference": bits,
        "scaled_reached": sum(s["steps_to_target"] is not None
                              for _, s, _ in paired),
        "unscaled_reached": sum(u["steps_to_target"] is not None
                                for _, _, u in paired),
        **{f"grad_{name}_ratio": _init_ratio(paired, f"grad_norm_{name}")
           for name in _GRADIENTS},
        "gap_every_seed": every,
        "gap_on_average": average,
    }


def _arm_at(records):
    return {"seeds": len(records),
            "reached": sum(r["steps_to_target"] is not None
                           for r in records),
            "final_accuracy": mean_sd(
                [r["final_accuracy"] for r in records])[0]}


def learning_claim(plan, results):
    """Claim 3 from the slice's results."""
    key_dims = plan.trained_axis("key_dim")
    gaps = ([_training_gap(results, key_dim) for key_dim in key_dims]
            if has_pair(plan) else [])
    largest = gaps[-1] if gaps else None
    return {
        "arms_at_largest_key_dim": {
            arm: _arm_at(run_values(results, arm, key_dims[-1]))
            for arm in plan.arms} if key_dims else {},
        "holds": (
            None if largest is None or not largest["seeds"]
            else largest["gap_every_seed"]
            and (largest["grad_scores_ratio"] or 1.0) < 1.0
        ),
        "by_key_dim": gaps,
    }


def measure(plan, results, log=print):
    return learning_claim(plan, sliced(plan, results))


def headline(plan, claim):
    gap = claim["by_key_dim"][-1]
    n = len(gap["seeds"])
    mean = sum(gap["accuracy_difference"]) / max(n, 1)
    return (f"at d_k {gap['key_dim']}, scaled minus unscaled final "
            f"accuracy {mean:+.2f}; target {plan.base.target_accuracy:g} "
            f"reached on {gap['scaled_reached']}/{n} scaled, "
            f"{gap['unscaled_reached']}/{n} unscaled seeds")


def _gap_line(gap, target_accuracy):
    n = len(gap["seeds"])
    differences = ", ".join(f"{d:+.2f}" for d in gap["accuracy_difference"])
    text = (f"d_k {gap['key_dim']}: scaled minus unscaled final accuracy "
            f"per seed {differences}; target {target_accuracy:g} "
            f"reached by {gap['scaled_reached']}/{n} scaled and "
            f"{gap['unscaled_reached']}/{n} unscaled runs. ")
    if gap.get("bits_difference") is not None:
        bits = ", ".join(f"{d:+.3f}" for d in gap["bits_difference"])
        text += (f"Held-out bits per character, unscaled minus scaled, per "
                 f"seed {bits} (a gap: at least {BITS_GAP:g} bits; the "
                 "verdict on text is on bits, not accuracy). ")
    if gap["gap_every_seed"]:
        return text + "A training gap on every seed."
    if gap["gap_on_average"]:
        return text + "A gap on average, but not on every seed."
    return text + "No training gap at this d_k."


def _gradient_line(largest):
    scores = largest["grad_scores_ratio"]
    return (
        f"Gradients at init, d_k {largest['key_dim']}, unscaled/scaled: "
        f"|dL/dscores| {scores:.2f}×, |dL/dW_Q| "
        f"{largest['grad_query_ratio']:.2f}×, |dL/dW_K| "
        f"{largest['grad_key_ratio']:.2f}×. The gradient that vanishes "
        "is the one at the softmax input: a saturated softmax passes "
        "almost nothing back to its scores"
        + (" (here it is smaller unscaled)." if scores < 1 else
           " — but here it is NOT smaller unscaled.")
        + " The projection gradients carry an extra factor √d_k in the"
        " unscaled model (∂score/∂q = k rather than k/√d_k), so"
        " |dL/dW_Q| and |dL/dW_K| can be larger unscaled even while the"
        " softmax passes back less; a larger projection gradient is not"
        " by itself a sign of learning, and the training curves are"
        " what show whether the model learns.")


def learning_verdict(claim, target_accuracy):
    """`(lines, holds)`: claim 3 in words."""
    if claim["holds"] is None:
        return ["Needs trained scaled and unscaled runs."], None
    lines = [_gap_line(gap, target_accuracy) for gap in claim["by_key_dim"]]
    largest = claim["by_key_dim"][-1]
    lines += control_lines(claim["arms_at_largest_key_dim"],
                           largest["key_dim"], largest["gap_on_average"])
    if largest["grad_scores_ratio"] is not None:
        lines.append(_gradient_line(largest))
    if claim["holds"] and largest.get("bits_difference") is not None:
        # On text the unscaled model still learns: say how, not "stalls".
        lines.append(
            f"Claim 3 holds on text, as slower learning: at d_k "
            f"{largest['key_dim']} the unscaled model ends at least "
            f"{BITS_GAP:g} bits per character behind the scaled one on "
            "every seed, though it does not stall.")
        return lines, True
    lines.append(
        "Claim 3 holds: the scaled model learns and the unscaled one stalls "
        f"on every seed at d_k {largest['key_dim']}."
        if claim["holds"] else
        f"Claim 3 is NOT supported by these runs at d_k "
        f"{largest['key_dim']}: see the numbers above.")
    return lines, claim["holds"]


def control_lines(arms, key_dim, gap):
    """What the control arms that ran say: they explain a gap between
    scaled and unscaled; without one they are only reported."""
    def outcome(name):
        arm = arms[name]
        return (f"`{name}` reached the target in {arm['reached']}/"
                f"{arm['seeds']} seeds (mean final accuracy "
                f"{fmt(arm['final_accuracy'])})")

    lines = []
    for name in _CONTROL_ARMS:
        if not (name in arms and arms[name]["seeds"]):
            continue
        if gap and name in _INIT_CONTROLS:
            start, learned, failed = _INIT_CONTROLS[name]
            lines.append(
                f"Control at d_k {key_dim}: {outcome(name)}. It has {start}; "
                + (learned if arms[name]["reached"] > 0 else failed))
        else:
            lines.append(f"At d_k {key_dim}, {outcome(name)}.")
    return lines


def verdict(plan, claim, results):
    return learning_verdict(claim, plan.base.target_accuracy)


def section(plan, claim, results):
    results = sliced(plan, results)
    rows = []
    for g in claim["by_key_dim"]:
        records = {arm: run_values(results, arm, g["key_dim"])
                   for arm in PAIR}
        rows.append(
            [str(g["key_dim"])]
            + [fmt_mean_sd([r["final_accuracy"] for r in records[arm]])
               for arm in PAIR]
            + [fmt_steps(records[arm]) for arm in PAIR]
            + [fmt(g[f"grad_{name}_ratio"]) for name in _GRADIENTS])
    if not rows:
        return []
    return ["## Training and gradients, unscaled vs scaled", "",
            "Gradient ratios are unscaled / scaled at init (probe batch).",
            "", *markdown_table(
                ["d_k", "final accuracy scaled", "unscaled",
                 "steps to target scaled", "unscaled",
                 "\\|dL/dscores\\| ratio", "\\|dL/dW_Q\\| ratio",
                 "\\|dL/dW_K\\| ratio"], rows), ""]


def _accuracy_figure(document):
    """Held-out accuracy against the step, a panel per trained d_k."""
    curves = document.get("curves") or []
    key_dims = sorted({c["key_dim"] for c in curves})
    if not key_dims:
        return None
    figure, axes = new_figure(5.6 * len(key_dims), 3.8, 1, len(key_dims))
    for ax, key_dim in zip(axes[0], key_dims):
        series_panel(ax, [
            (f"{curve['arm']} ({len(curve['seeds'])} seeds)", curve["arm"],
             series["steps"], series["mean"],
             ([m - s for m, s in zip(series["mean"], series["sd"])],
              [m + s for m, s in zip(series["mean"], series["sd"])]))
            for curve in curves
            for series in (curve["metrics"]["accuracy"],)
            if curve["key_dim"] == key_dim and series["steps"]],
            spread="band", marker=".")
        target = document.get("target_accuracy")
        if target:
            ax.axhline(target, color="grey", linestyle=":", linewidth=1,
                       label=f"target {target:g}")
        ax.set_xlabel("training step")
        finish_panel(ax, "held-out accuracy",
                     f"d_k = {key_dim}: mean ± sd over seeds", unit=True)
    return figure


def _gradient_ratio_figure(document):
    data = document["figures"]["gradient_ratios"]
    if not any(series["key_dims"] for series in data.values()):
        return None
    figure, axes = new_figure()
    ax = axes[0][0]
    names = {"grad_norm_scores": "|dL/dscores|",
             "grad_norm_query": "|dL/dW_Q|"}
    for key, series in data.items():
        ax.plot(series["key_dims"], series["ratio"], marker="o",
                label=f"{names[key]} {PAIR[1]}/{PAIR[0]}")
    key_dims = sorted({k for s in data.values() for k in s["key_dims"]})
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1, label="1")
    log2_axis(ax, key_dims)
    ax.set_yscale("log", base=2)
    finish_panel(ax, f"{PAIR[1]} / {PAIR[0]} at init",
                 "Gradient norms at init, unscaled over scaled")
    return figure


FIGURES = (
    ("accuracy", "(a) Held-out accuracy against the training step: mean "
     "(line) ± sd (band) over seeds, per arm.", _accuracy_figure),
    ("gradient_ratio", "(d) Unscaled over scaled gradient norms at "
     "initialization (probe batch): |dL/dscores| and |dL/dW_Q| against "
     "d_k.", _gradient_ratio_figure),
)


def scalars(plan, claim, results):
    results = sliced(plan, results)
    points = init_points(results, ("grad_norm_scores",))
    final = over_seeds(results["runs"], ("arm", "key_dim"),
                       lambda record: record["final_accuracy"])
    points += [(f"final/accuracy/{arm}", stats["mean"], key_dim)
               for arm in plan.arms
               for (of, key_dim), stats in sorted(final.items())
               if of == arm and stats["mean"] is not None]
    return {"claims": points}
