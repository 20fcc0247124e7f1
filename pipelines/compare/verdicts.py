"""The verdict on each claim, in words: the lines under "## Verdicts".

Each function takes a claim's dict from `claims.py` and returns
`(lines, holds)`.
"""

from pipelines.compare.claims import BITS_GAP
from pipelines.compare.claims import RATIO_TOLERANCE
from pipelines.reports.numbers import fmt

# The scaled model's score std at init counts as "close to 1" in this range
# (the lesson assumes unit-variance q and k components).
_UNIT_STD_RANGE = (0.75, 1.25)
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


# Each claim in one line: the verdicts' headings, and what the command prints.
STATEMENTS = {
    "1": "Var(q·k) = d_k for unit-variance q, k; 1/√d_k brings it to 1",
    "2": "Unscaled scores saturate the softmax, more so as d_k grows",
    "3": "In saturation gradients vanish and learning stalls",
    "4": "The scale is what lets deeper attention stacks train",
    "5": "With the 1/√d_k scale attention fades as n grows",
}


def deciding_figure(number, claim, target_accuracy):
    """The figure that decides claim `number`, in a few words, or None when
    the claim was not measured."""
    if claim.get("holds") is None:
        return None
    if number == "1" and claim["score_std_ratios"]:
        r = claim["score_std_ratios"][-1]
        return (f"unscaled/scaled score std at init {r['ratio']:.2f} at d_k "
                f"{r['key_dim']} (√d_k = {r['sqrt_key_dim']:.2f})")
    if number == "2":
        r = claim["entropy"][-1]
        return (f"normalized entropy at init at d_k {r['key_dim']}: scaled "
                f"{r['scaled_entropy_normalized']:.2f}, unscaled "
                f"{r['unscaled_entropy_normalized']:.2f}")
    if number == "3":
        gap = claim["by_key_dim"][-1]
        n = len(gap["seeds"])
        mean = sum(gap["accuracy_difference"]) / max(n, 1)
        return (f"at d_k {gap['key_dim']}, scaled minus unscaled final "
                f"accuracy {mean:+.2f}; target {target_accuracy:g} reached "
                f"on {gap['scaled_reached']}/{n} scaled, "
                f"{gap['unscaled_reached']}/{n} unscaled seeds")
    if number == "4":
        first, last = claim["by_depth"][0], claim["by_depth"][-1]
        return (f"scaled minus unscaled final accuracy "
                f"{first['gap']['mean']:+.2f} at {first['num_layers']} "
                f"layer(s), {last['gap']['mean']:+.2f} at "
                f"{last['num_layers']}")
    if number == "5":
        curves = claim["init"]["curves"]
        sqrt, n = curves["modes"]["sqrt"], curves["modes"]["sqrt"]["num_keys"]
        return (f"the relevant key's weight at init "
                f"{sqrt['relevant_weight'][0]:.2f} at n {n[0]}, "
                f"{sqrt['relevant_weight'][-1]:.2f} at n {n[-1]}")
    return None


def verdict_line(number, claim, target_accuracy):
    """`Claim N (statement): holds — the deciding figure`."""
    line = (f"Claim {number} ({STATEMENTS[number]}): "
            f"{status_word(claim.get('holds'))}")
    figure = deciding_figure(number, claim, target_accuracy)
    return line if figure is None else f"{line}: {figure}"


def status_word(holds):
    """`holds`, `not supported` or `not measured`."""
    return {True: "holds", False: "not supported", None: "not measured"}[holds]


def variance_verdict(claim, variance_rows):
    """Claim 1: Var(q·k) = d_k for unit-variance q, k, and the scale brings
    it back to 1."""
    lines = []
    if variance_rows:
        worst = max(
            abs(r["var_unscaled"] / r["theory_unscaled"] - 1)
            for r in variance_rows
        )
        ok = all(claim["variance_within_tolerance"])
        lines.append(
            f"Random unit-variance q, k: Var(q·k) matches d_k and the scaled "
            f"variance matches 1 at every d_k within sampling error "
            f"(largest relative deviation {worst:.1%})."
            if ok else
            "Random unit-variance q, k: the measured variance is further "
            "from theory than sampling error allows at some d_k (see the "
            "table): the derivation is NOT confirmed by these samples."
        )
    ratios = claim["score_std_ratios"]
    if ratios:
        within = all(abs(r["relative_error"]) <= RATIO_TOLERANCE
                     for r in ratios)
        scaled = [r["scaled_score_std"] for r in ratios]
        low, high = _UNIT_STD_RANGE
        lines.append(
            "In the model at init, the unscaled/scaled score std ratio is "
            + ", ".join(
                f"{r['ratio']:.2f} at d_k {r['key_dim']} (√d_k = "
                f"{r['sqrt_key_dim']:.2f})" for r in ratios
            )
            + (" — within 5% of √d_k everywhere."
               if within else " — NOT within 5% of √d_k everywhere.")
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


def saturation_verdict(claim):
    """Claim 2: unscaled scores saturate the softmax, more so as d_k
    grows."""
    if claim["holds"] is None:
        return ["Needs the scaled and unscaled arms."], None
    rows = claim["entropy"]
    text = (
        "Normalized entropy at init (1 = uniform, 0 = one-hot), scaled vs "
        "unscaled: "
        + ", ".join(
            f"d_k {r['key_dim']}: {r['scaled_entropy_normalized']:.2f} vs "
            f"{r['unscaled_entropy_normalized']:.2f}" for r in rows
        )
        + ". "
    )
    if claim["unscaled_lower"]:
        text += "Unscaled attention is more peaked at every d_k"
    else:
        text += "Unscaled attention is NOT more peaked at every d_k"
    if claim["unscaled_falling_with_key_dim"]:
        text += (
            ", and its entropy falls as d_k grows (saturated rows at the "
            f"largest d_k: {rows[-1]['unscaled_saturated_fraction']:.0%} "
            f"unscaled, {rows[-1]['scaled_saturated_fraction']:.0%} scaled)."
        )
    else:
        text += ", but its entropy does NOT fall steadily as d_k grows."
    return [text], claim["holds"]


def _gap_line(gap, target_accuracy):
    n = len(gap["seeds"])
    differences = ", ".join(f"{d:+.2f}" for d in gap["accuracy_difference"])
    text = (
        f"d_k {gap['key_dim']}: scaled minus unscaled final accuracy per "
        f"seed {differences}; target {target_accuracy:g} "
        f"reached by {gap['scaled_reached']}/{n} scaled and "
        f"{gap['unscaled_reached']}/{n} unscaled runs. "
    )
    if gap.get("bits_difference") is not None:
        bits = ", ".join(f"{d:+.3f}" for d in gap["bits_difference"])
        text += (
            f"Held-out bits per character, unscaled minus scaled, per seed "
            f"{bits} (a gap: at least {BITS_GAP:g} bits; the verdict on "
            "text is on bits, not accuracy). "
        )
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
        " what show whether the model learns."
    )


def learning_verdict(claim, target_accuracy):
    """Claim 3: in saturation gradients vanish and learning stalls."""
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
        f"{largest['key_dim']}: see the numbers above."
    )
    return lines, claim["holds"]


def control_lines(arms, key_dim, gap):
    """What the control arms say, when they ran. They explain a gap between
    scaled and unscaled; without one they are only reported."""
    def outcome(name):
        arm = arms[name]
        return (
            f"`{name}` reached the target in {arm['reached']}/"
            f"{arm['seeds']} seeds (mean final accuracy "
            f"{fmt(arm['final_accuracy'])})"
        )

    def ran(name):
        return name in arms and arms[name]["seeds"]

    if not gap:
        return [f"At d_k {key_dim}, {outcome(name)}."
                for name in _CONTROL_ARMS if ran(name)]
    lines = []
    for name, (start, learned, failed) in _INIT_CONTROLS.items():
        if ran(name):
            lines.append(
                f"Control at d_k {key_dim}: {outcome(name)}. It has {start}; "
                + (learned if arms[name]["reached"] > 0 else failed)
            )
    lines += [f"At d_k {key_dim}, {outcome(name)}."
              for name in ("learned", "qk_norm") if ran(name)]
    return lines
