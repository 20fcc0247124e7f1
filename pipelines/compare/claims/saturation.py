"""Claim 2: the normalized entropy, max weight and saturated rows at init
per d_k, and the probe example's attention drawn for both arms."""

from keras_attention.viz import plot_attention_pair
from pipelines.common import markdown_table
from pipelines.compare.measure import document_arms
from pipelines.compare.measure import has_pair
from pipelines.compare.measure import init_points
from pipelines.compare.measure import init_values
from pipelines.compare.measure import sliced
from pipelines.compare.series import arms_over_key_dim
from pipelines.engine.presets import PAIR
from pipelines.reports.numbers import fmt
from pipelines.reports.numbers import mean_sd
from pipelines.reports.numbers import ratio

NUMBER = "2"
STATEMENT = "Unscaled scores saturate the softmax, more so as d_k grows"
SCALAR_RUNS = ("claims",)
_STATISTICS = ("entropy_normalized", "max_weight", "saturated_fraction")


def applies(plan):
    return True


def saturation_claim(plan, results):
    """Claim 2 from the slice's results: unscaled attention is more peaked
    (lower entropy) at init, and more so as d_k grows."""
    if not has_pair(plan):
        return {"holds": None, "unscaled_lower": None,
                "unscaled_falling_with_key_dim": None, "entropy": []}
    entropy = [{"key_dim": key_dim, **{
        f"{arm}_{key}": mean_sd(init_values(results, arm, key_dim, key))[0]
        for arm in PAIR for key in _STATISTICS}}
        for key_dim in plan.axis("key_dim")]
    lower = all(r["unscaled_entropy_normalized"]
                < r["scaled_entropy_normalized"] for r in entropy)
    unscaled = [r["unscaled_entropy_normalized"] for r in entropy]
    falling = all(later < earlier
                  for earlier, later in zip(unscaled, unscaled[1:]))
    return {"holds": lower and falling, "unscaled_lower": lower,
            "unscaled_falling_with_key_dim": falling, "entropy": entropy}


def measure(plan, results, log=print):
    return saturation_claim(plan, sliced(plan, results))


def headline(plan, claim):
    r = claim["entropy"][-1]
    return (f"normalized entropy at init at d_k {r['key_dim']}: scaled "
            f"{r['scaled_entropy_normalized']:.2f}, unscaled "
            f"{r['unscaled_entropy_normalized']:.2f}")


def saturation_verdict(claim):
    """`(lines, holds)`: claim 2 in words."""
    if claim["holds"] is None:
        return ["Needs the scaled and unscaled arms."], None
    rows = claim["entropy"]
    text = ("Normalized entropy at init (1 = uniform, 0 = one-hot), scaled "
            "vs unscaled: " + ", ".join(
                f"d_k {r['key_dim']}: {r['scaled_entropy_normalized']:.2f} "
                f"vs {r['unscaled_entropy_normalized']:.2f}" for r in rows)
            + ". ")
    text += ("Unscaled attention is more peaked at every d_k"
             if claim["unscaled_lower"] else
             "Unscaled attention is NOT more peaked at every d_k")
    if claim["unscaled_falling_with_key_dim"]:
        text += (
            ", and its entropy falls as d_k grows (saturated rows at the "
            f"largest d_k: {rows[-1]['unscaled_saturated_fraction']:.0%} "
            f"unscaled, {rows[-1]['scaled_saturated_fraction']:.0%} scaled)."
        )
    else:
        text += ", but its entropy does NOT fall steadily as d_k grows."
    return [text], claim["holds"]


def verdict(plan, claim, results):
    return saturation_verdict(claim)


def section(plan, claim, results):
    if not claim["entropy"]:
        return []
    return ["## Softmax at init, scaled vs unscaled", "", *markdown_table(
        ["d_k", "entropy/log(keys) scaled", "unscaled", "unscaled/scaled",
         "max weight scaled", "unscaled", "saturated rows scaled",
         "unscaled"],
        [[str(r["key_dim"]), fmt(r["scaled_entropy_normalized"]),
          fmt(r["unscaled_entropy_normalized"]),
          fmt(ratio(r["unscaled_entropy_normalized"],
                    r["scaled_entropy_normalized"])),
          fmt(r["scaled_max_weight"]), fmt(r["unscaled_max_weight"]),
          fmt(r["scaled_saturated_fraction"]),
          fmt(r["unscaled_saturated_fraction"])]
         for r in claim["entropy"]]), ""]


def _init_entropy_figure(document):
    return arms_over_key_dim(
        document["figures"]["init_entropy"], "entropy / log(#keys) at init",
        "Softmax entropy at init (1 = uniform, 0 = one-hot)", unit=True)


def _attention_figure(document, stage):
    """The probe example's attention at `stage`: the pair (else the first
    two arms with weights) and their difference."""
    entries = {item["arm"]: item for item in document.get("heatmaps") or []
               if item["stage"] == stage and "weights" in item}
    arms = list(PAIR) if all(a in entries for a in PAIR) else (
        document_arms(document, entries)[:2])
    if len(arms) != 2:
        return None
    first, second = (entries[arm] for arm in arms)
    when = "at init" if stage == "init" else "at the end of training"
    return plot_attention_pair(
        first["weights"], second["weights"], first["labels"],
        titles=(first["arm"], second["arm"]),
        title=f"Probe example 0 {when} (d_k {first['key_dim']}, seed "
              f"{first['seed']})")


FIGURES = (
    ("init_entropy", "(b) Normalized softmax entropy at initialization "
     "against d_k (log-2 axis), mean ± sd over seeds.", _init_entropy_figure),
    ("attention_init", "(e) Attention of one probe example at "
     "initialization: both arms and their difference (queries down, keys "
     "across).", lambda document: _attention_figure(document, "init")),
    ("attention_final", "(e) The same probe example at the end of "
     "training.", lambda document: _attention_figure(document, "final")),
)


def scalars(plan, claim, results):
    return {"claims": init_points(sliced(plan, results),
                                  ("entropy_normalized",
                                   "saturated_fraction"))}
