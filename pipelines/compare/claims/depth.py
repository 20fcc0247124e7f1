"""Claim 4, from the runs of a `--num-layers` axis at the largest trained
d_k: per depth and arm the final accuracy, steps to target, entropy per
layer and |dL/dscores| of the bottom layer over the top one.

The gap is scaled minus unscaled final accuracy, paired by seed. Depth
*widens* it when its mean grows by at least `learning.GAP` from the
shallowest stack to the deepest, *closes* it when it shrinks by that much,
else *leaves* it. The claim holds when at the deepest stack the scaled
model reaches the target and leads by `GAP` on every seed, and depth does
not close the gap; the depths between are reported, not judged.
"""

import numpy as np

from pipelines.common import markdown_table
from pipelines.compare.claims.learning import GAP
from pipelines.compare.measure import document_arms
from pipelines.compare.measure import has_pair
from pipelines.compare.series import arms_panel
from pipelines.engine.presets import PAIR
from pipelines.reports.numbers import MISSING
from pipelines.reports.numbers import fmt
from pipelines.reports.numbers import fmt_mean_sd
from pipelines.reports.numbers import fmt_steps
from pipelines.reports.numbers import mean_sd
from pipelines.reports.plotting import colour
from pipelines.reports.plotting import finish_panel
from pipelines.reports.plotting import new_figure

NUMBER = "4"
STATEMENT = "The scale is what lets deeper attention stacks train"
SCALAR_RUNS = ("depth",)
# First-over-last |dL/dscores| ratios within this fraction of each other
# count as the same.
RATIO_MARGIN = 0.1


def _records(plan, results, key_dim, depth, arm):
    return [r for r in results["runs"]
            if r["arm"] == arm and r["key_dim"] == key_dim
            and r.get("num_layers") == depth
            and plan.in_slice(r, free="num_layers")]


def _profiles(records, stage):
    return [r["layers"][stage] for r in records
            if (r.get("layers") or {}).get(stage)]


def _per_layer(records, stage, key):
    """`{"mean", "sd"}` of `key` per layer (bottom first), or None."""
    profiles = _profiles(records, stage)
    if not profiles:
        return None
    pairs = [mean_sd([profile[i].get(key) for profile in profiles])
             for i in range(len(profiles[0]))]
    return {"mean": [m for m, _ in pairs], "sd": [s for _, s in pairs]}


def _gradient(records):
    """|dL/dscores| at init of the first and last layer and their ratio
    (per seed, then the mean)."""
    profiles = _profiles(records, "init")
    firsts = [profile[0].get("grad_norm_scores") for profile in profiles]
    lasts = [profile[-1].get("grad_norm_scores") for profile in profiles]
    ratios = [first / last if first is not None and last else None
              for first, last in zip(firsts, lasts)]
    return {"first": mean_sd(firsts)[0], "last": mean_sd(lasts)[0],
            "first_over_last": mean_sd(ratios)[0]}


def _arm_row(records):
    accuracies = [r["final_accuracy"] for r in records]
    mean, sd = mean_sd(accuracies)
    return {
        "seeds": [r["seed"] for r in records],
        "final_accuracy": accuracies,
        "accuracy_mean": mean,
        "accuracy_sd": sd,
        "reached": sum(r["steps_to_target"] is not None for r in records),
        "steps_to_target": [r["steps_to_target"] for r in records],
        "entropy_init": _per_layer(records, "init", "entropy_normalized"),
        "entropy_final": _per_layer(records, "final", "entropy_normalized"),
        "gradient": _gradient(records),
    }


def _gap(arms):
    """Scaled minus unscaled final accuracy, paired by seed."""
    scaled, unscaled = (dict(zip(arms[arm]["seeds"],
                                 arms[arm]["final_accuracy"]))
                        for arm in PAIR)
    seeds = sorted(seed for seed in scaled if seed in unscaled
                   and scaled[seed] is not None
                   and unscaled[seed] is not None)
    differences = [scaled[s] - unscaled[s] for s in seeds]
    return {"seeds": seeds, "difference": differences,
            "mean": mean_sd(differences)[0],
            "every_seed": bool(differences)
            and all(d >= GAP for d in differences)}


def depth_claim(plan, results):
    """Claim 4 from the collected results.

    Returns:
        `{"holds", "key_dim", "depths", "by_depth": [{"num_layers", "arms",
        "gap"}], "trend", ...}`; `holds` and `trend` are None without both
        arms at two trained depths.
    """
    key_dim = (plan.trained_axis("key_dim") or [None])[-1]
    depths = plan.trained_axis("num_layers")
    pair = has_pair(plan)
    rows = []
    for depth in depths:
        arms = {arm: _arm_row(_records(plan, results, key_dim, depth, arm))
                for arm in plan.arms}
        rows.append({"num_layers": depth, "arms": arms,
                     "gap": _gap(arms) if pair else None})
    claim = {"holds": None, "key_dim": key_dim, "depths": depths,
             "by_depth": rows, "trend": None, "gap_change": None,
             "ceiling": None, "bottom_vanishes_faster_unscaled": None,
             "bottom_ratio_relative": None}
    gaps = [row["gap"] for row in rows if row["gap"] and row["gap"]["seeds"]]
    if not pair or len(gaps) < 2:
        return claim
    change = gaps[-1]["mean"] - gaps[0]["mean"]
    claim["gap_change"] = change
    claim["trend"] = ("widens" if change >= GAP else
                      "closes" if change <= -GAP else "leaves")
    # The gap cannot widen where the shallow unscaled model never trained
    # and the scaled one did on every seed.
    scaled, unscaled = (rows[0]["arms"][arm] for arm in PAIR)
    claim["ceiling"] = (unscaled["reached"] == 0
                        and scaled["reached"] == len(scaled["seeds"]) > 0)
    scaled_ratio, unscaled_ratio = (
        rows[-1]["arms"][arm]["gradient"]["first_over_last"] for arm in PAIR)
    if scaled_ratio and unscaled_ratio is not None:
        relative = unscaled_ratio / scaled_ratio - 1
        claim["bottom_vanishes_faster_unscaled"] = (
            True if relative < -RATIO_MARGIN else
            False if relative > RATIO_MARGIN else None)
        claim["bottom_ratio_relative"] = relative
    deepest = rows[-1]
    scaled = deepest["arms"][PAIR[0]]
    claim["holds"] = (deepest["gap"]["every_seed"]
                      and scaled["reached"] == len(scaled["seeds"]) > 0
                      and claim["trend"] != "closes")
    return claim


# ---------------------------------------------------------------- words
def _depth_line(row, target):
    scaled, unscaled = (row["arms"][arm] for arm in PAIR)
    n = len(scaled["seeds"])
    return (
        f"{row['num_layers']} layer(s): final accuracy scaled "
        f"{fmt(scaled['accuracy_mean'], 2)}, unscaled "
        f"{fmt(unscaled['accuracy_mean'], 2)}; target {target:g} reached by "
        f"{scaled['reached']}/{n} scaled and {unscaled['reached']}/"
        f"{len(unscaled['seeds'])} unscaled; scaled minus unscaled per seed "
        + ", ".join(f"{d:+.2f}" for d in row["gap"]["difference"]) + ".")


def depth_verdict(claim, target):
    """`(lines, holds)`: the verdict on claim 4 in words."""
    if claim["trend"] is None:
        return ["Needs trained scaled and unscaled runs at two depths or "
                "more (`--num-layers 1,2,4`)."], None
    rows = claim["by_depth"]
    lines = [f"At d_k {claim['key_dim']}, " + _depth_line(rows[0], target)]
    lines += [_depth_line(row, target) for row in rows[1:]]
    first, last = rows[0], rows[-1]
    words = {"widens": "Depth WIDENS the gap", "leaves": "Depth LEAVES the "
             "gap as it is", "closes": "Depth CLOSES the gap"}
    text = (f"{words[claim['trend']]}: mean scaled minus unscaled "
            f"{first['gap']['mean']:+.2f} at {first['num_layers']} layer(s), "
            f"{last['gap']['mean']:+.2f} at {last['num_layers']} "
            f"(change {claim['gap_change']:+.2f}; ±{GAP:g} counts as "
            "unchanged).")
    if claim["ceiling"]:
        text += (" The shallowest unscaled stack already never reached the "
                 "target while the scaled one always did, so the gap had "
                 "little room to widen.")
    lines.append(text)
    scaled, unscaled = (last["arms"][arm]["gradient"] for arm in PAIR)
    faster = claim["bottom_vanishes_faster_unscaled"]
    if claim["bottom_ratio_relative"] is not None:
        lines.append(
            f"|dL/dscores| at init, first over last layer at "
            f"{last['num_layers']} layers: scaled "
            f"{fmt(scaled['first_over_last'], 2)}, unscaled "
            f"{fmt(unscaled['first_over_last'], 2)}: the gradient reaching "
            "the bottom of the stack, relative to the top, is "
            + ("smaller without the scale." if faster else
               "larger without the scale." if faster is False else
               f"about the same with and without the scale (within "
               f"{RATIO_MARGIN:.0%}): it does not vanish faster toward the "
               "bottom of the unscaled stack.")
            + _absolute_words(scaled, unscaled))
    depth = last["num_layers"]
    lines.append(
        f"Claim 4 holds: at {depth} layers the scaled model reaches the "
        "target on every seed and the unscaled one is behind on every seed."
        if claim["holds"] else
        f"Claim 4 is NOT supported here: at {depth} layers the scaled model "
        "does not reach the target on every seed, or the unscaled one is "
        "not behind by the gap on every seed, or depth closes the gap.")
    return lines, claim["holds"]


def _absolute_words(scaled, unscaled):
    if not (scaled["first"] and scaled["last"]) or None in (
            unscaled["first"], unscaled["last"]):
        return ""
    return (f" Unscaled over scaled |dL/dscores|: "
            f"{unscaled['first'] / scaled['first']:.2f}× in the first "
            f"layer, {unscaled['last'] / scaled['last']:.2f}× in the last.")


# -------------------------------------------------------------- section
def section(plan, claim, results):
    if not claim["by_depth"]:
        return []
    arms = list(plan.arms)
    accuracy = [
        [str(row["num_layers"])]
        + [fmt_mean_sd(row["arms"][arm]["final_accuracy"]) for arm in arms]
        + [fmt_steps([{"steps_to_target": steps} for steps
                      in row["arms"][arm]["steps_to_target"]])
           for arm in arms]
        + ([fmt(row["gap"]["mean"])] if row["gap"] else [])
        for row in claim["by_depth"]]
    gap = ["scaled − unscaled"] if claim["by_depth"][0]["gap"] else []
    lines = [f"## Claim 4: depth (d_k {claim['key_dim']}, mean ± sd over "
             "seeds)", "",
             *markdown_table(
                 ["layers", *(f"accuracy {a}" for a in arms),
                  *(f"steps to target {a}" for a in arms), *gap], accuracy),
             "", "Normalized entropy per layer (1 = uniform), at init and "
             "at the end; layer 1 is the bottom of the stack.", ""]
    entropy = [[str(row["num_layers"]), str(index + 1)] + [
        fmt(series["mean"][index]) if series and index < len(series["mean"])
        else MISSING for arm in arms for series in (
            row["arms"][arm][f"entropy_{s}"] for s in ("init", "final"))]
        for row in claim["by_depth"] for index in range(row["num_layers"])]
    lines += markdown_table(
        ["layers", "layer", *(f"{a} {stage}" for a in arms
                              for stage in ("init", "end"))], entropy)
    gradient = [[str(row["num_layers"])] + [
        fmt(row["arms"][arm]["gradient"][key], digits)
        for arm in arms for key, digits in (("first", 5), ("last", 5),
                                            ("first_over_last", 3))]
        for row in claim["by_depth"]]
    lines += ["", "\\|dL/dscores\\| at init (probe batch): first (bottom) "
              "and last (top) layer, and their ratio.", "",
              *markdown_table(["layers", *(f"{a} {what}" for a in arms
                                           for what in ("first", "last",
                                                        "first/last"))],
                              gradient), ""]
    return lines


# ------------------------------------------------------------ interface
def applies(plan):
    return "num_layers" in plan.axes


def measure(plan, results, log=print):
    return depth_claim(plan, results)


def headline(plan, claim):
    first, last = claim["by_depth"][0], claim["by_depth"][-1]
    return (f"scaled minus unscaled final accuracy "
            f"{first['gap']['mean']:+.2f} at {first['num_layers']} "
            f"layer(s), {last['gap']['mean']:+.2f} at {last['num_layers']}")


def verdict(plan, claim, results):
    return depth_verdict(claim, plan.base.target_accuracy)


def _accuracy_figure(document):
    claim = (document.get("claims") or {}).get(NUMBER)
    if not claim or not claim["by_depth"]:
        return None
    figure, axes = new_figure()
    arms_panel(axes[0][0], document, claim["by_depth"], "num_layers",
               "accuracy_mean", "attention layers", "final held-out accuracy",
               f"Accuracy against depth, d_k {claim['key_dim']} (mean ± sd)",
               sd="accuracy_sd")
    return figure


def _entropy_figure(document):
    claim = (document.get("claims") or {}).get(NUMBER)
    rows = [row for row in (claim or {}).get("by_depth", ())
            if any(arm["entropy_init"] for arm in row["arms"].values())]
    if not rows:
        return None
    figure, axes = new_figure(4.2 * len(rows), 3.6, 1, len(rows))
    for ax, row in zip(axes[0], rows):
        for arm in document_arms(document, row["arms"]):
            for stage, style, when in (("entropy_init", "-", "init"),
                                       ("entropy_final", "--", "end")):
                mean = (row["arms"][arm][stage] or {}).get("mean")
                if mean:
                    ax.plot(list(range(1, len(mean) + 1)), mean,
                            color=colour(arm), linestyle=style, marker="o",
                            label=f"{arm} {when}")
        ax.set_xticks(list(range(1, row["num_layers"] + 1)))
        ax.set_xlabel("layer (1 = bottom)")
        finish_panel(ax, "entropy / log(#keys)",
                     f"{row['num_layers']} layer(s)", unit=True)
    return figure


FIGURES = (
    ("depth_accuracy", "(f) Final held-out accuracy against the number of "
     "attention layers, mean ± sd over seeds, per arm.",
     _accuracy_figure),
    ("depth_entropy", "(g) Normalized entropy per layer at initialization "
     "(solid) and at the end of training (dashed), one panel per depth.",
     _entropy_figure),
)


def scalars(plan, claim, results):
    """Over depth (step = layers), a tag per arm."""
    rows = claim["by_depth"]
    return {"depth": [(f"{tag}/{arm}", value, step)
                      for arm in (rows[0]["arms"] if rows else ())
                      for row in rows
                      for tag, value, step in _depth_points(row, arm)]}


def _depth_points(row, arm):
    values = row["arms"][arm]
    reached = [s for s in values["steps_to_target"] if s is not None]
    entropy = (values["entropy_init"] or {}).get("mean") or [None]
    depth = row["num_layers"]
    return [
        ("final/accuracy", values["accuracy_mean"], depth),
        ("final/steps_to_target",
         float(np.mean(reached)) if reached else None, depth),
        ("init/entropy_normalized",
         float(np.mean(entropy)) if entropy[0] is not None else None, depth),
        ("init/entropy_normalized_first", entropy[0], depth),
        ("init/entropy_normalized_last", entropy[-1], depth),
        ("init/grad_scores_first_over_last",
         values["gradient"]["first_over_last"], depth),
    ]

