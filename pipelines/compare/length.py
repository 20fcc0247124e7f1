"""Claim 5, "with the 1/√d_k scale attention fades as n grows", decided
from three measurements, and its section of the report.

1. At init (`keras_attention.diagnostics.length_at_init`, one query among
   n = 16 .. 4096 keys, one of them relevant): normalized entropy, the
   relevant key's weight and the max weight per scale mode (sqrt, none,
   qk_norm, ssmax), beside the i.i.d. theory. The sqrt scale *fades* when
   its relevant weight falls by at least `claims.GAP` from the shortest to
   the longest n.
2. Trained at each length of the grid's length axis (`--num-pairs`, or
   `--seq-len` for the other tasks): final held-out accuracy per arm. The
   scaled model fades there when its accuracy falls by at least `GAP` from
   the shortest to the longest length and, when an ssmax arm ran, ssmax
   falls at least `GAP` less (a fall every arm shares is the task getting
   harder, not the scale).
3. Trained at the shortest recall length, evaluated at multiples of it
   (`extrapolate`): accuracy and the query's weight on its pair. The scaled
   model fades there when that weight falls by at least `GAP` from 1× to
   the largest multiple.

The claim holds when the init measurement fades and every trained
measurement that ran does too.
"""

import math

from keras_attention.diagnostics import length_at_init
from pipelines.common import markdown_table
from pipelines.compare.axes import in_slice
from pipelines.compare.claims import GAP
from pipelines.reports.numbers import mean_sd
from pipelines.reports.numbers import fmt
from pipelines.reports.numbers import fmt_mean_sd
from pipelines.reports.numbers import fmt_steps

# The init curves' modes: (name, scale, qk_norm).
INIT_MODES = (("sqrt", "sqrt", False), ("none", "none", False),
              ("qk_norm", "sqrt", True), ("ssmax", "ssmax", False))
INIT_STATISTICS = ("entropy_normalized", "relevant_weight", "max_weight")
# Queries per n of the init curves: standard errors of the mean weights
# about 0.01-0.03 (measured at d_k 64).
INIT_TRIALS = 256
REFERENCE = "scaled"
LENGTH_AWARE = "ssmax"


def init_curves(key_dim, reference_length, trials=INIT_TRIALS):
    """`{"key_dim", "reference_length", "trials", "modes": {mode:
    {"num_keys", "score_scale", <statistic>, <statistic>_sem, "theory":
    {<statistic>: [...]}}}}` at init, lists over n = 16 .. 4096; ssmax's
    s_h starts at 1/log(`reference_length`), the key count it is built
    for."""
    curves = {}
    for mode, scale, qk_norm in INIT_MODES:
        measured = length_at_init(
            scale, key_dim=key_dim, num_trials=trials, qk_norm=qk_norm,
            reference_length=reference_length if scale == "ssmax" else None)
        curves[mode] = {
            "num_keys": [int(n) for n in measured["num_keys"]],
            "score_scale": [float(c) for c in measured["score_scale"]],
            **{name: [float(v) for v in measured[name]]
               for name in INIT_STATISTICS},
            **{f"{name}_sem": [float(v) for v in measured[f"{name}_sem"]]
               for name in INIT_STATISTICS},
            "theory": {name: [float(v) for v in measured["theory"][name]]
                       for name in INIT_STATISTICS},
        }
    return {"key_dim": key_dim, "reference_length": reference_length,
            "trials": trials, "modes": curves}


def _half_point(curve):
    """The first n where the relevant weight is below 1/2, or None."""
    return next((n for n, w in zip(curve["num_keys"],
                                   curve["relevant_weight"]) if w < 0.5),
                None)


def _weights(records, arm, train_pairs, multiple):
    """The relevant weight (the largest of the layers' means) and the
    accuracy of each evaluated seed."""
    chosen = [r for r in records if r["arm"] == arm
              and r["train_pairs"] == train_pairs
              and r["multiple"] == multiple]
    return ([max(r["relevant_weight"]) for r in chosen],
            [r["accuracy"] for r in chosen])


def _trained_rows(plan, results, axis, evaluated):
    """Per value of the length axis: per arm the final accuracies and, for
    recall, the query's weight on its pair at the trained length."""
    key_dim = plan.trained_axis("key_dim")[-1]
    rows = []
    for length in plan.trained_axis(axis):
        arms = {}
        for arm in plan.arms:
            records = [r for r in results["runs"] if r["arm"] == arm
                       and r["key_dim"] == key_dim and r.get(axis) == length
                       and in_slice(plan, r, except_axis=axis)]
            weight = _weights(evaluated, arm, length, 1)[0]
            arms[arm] = {"final_accuracy": [r["final_accuracy"]
                                            for r in records],
                         "mean": mean_sd([r["final_accuracy"]
                                          for r in records])[0],
                         "steps": [r["steps_to_target"] for r in records],
                         "relevant_weight": weight,
                         "relevant_weight_mean": mean_sd(weight)[0]}
        rows.append({axis: length, "arms": arms})
    return rows


def _extrapolation_rows(plan, records):
    """Per multiple of the shortest evaluated length (when it was
    evaluated at more than 1x): per arm accuracy and relevant weight over
    seeds."""
    shortest = min((r["train_pairs"] for r in records), default=None)
    multiples = sorted({r["multiple"] for r in records
                        if r["train_pairs"] == shortest})
    if len(multiples) < 2:
        return []
    rows = []
    for multiple in multiples:
        arms = {}
        for arm in plan.arms:
            weight, accuracy = _weights(records, arm, shortest, multiple)
            arms[arm] = {"accuracy": accuracy,
                         "accuracy_mean": mean_sd(accuracy)[0],
                         "relevant_weight": weight,
                         "relevant_weight_mean": mean_sd(weight)[0]}
        rows.append({"multiple": multiple, "eval_pairs": multiple * shortest,
                     "arms": arms})
    return rows


def _fall(first, last):
    return None if first is None or last is None else first - last


def _fades(rows, get):
    """(scaled fall, ssmax fall, fades) from the first to the last row."""
    if len(rows) < 2 or REFERENCE not in rows[0]["arms"]:
        return None, None, None
    falls = {arm: _fall(get(rows[0]["arms"][arm]), get(rows[-1]["arms"][arm]))
             for arm in (REFERENCE, LENGTH_AWARE) if arm in rows[0]["arms"]}
    scaled, aware = falls.get(REFERENCE), falls.get(LENGTH_AWARE)
    if scaled is None:
        return None, aware, None
    return scaled, aware, scaled >= GAP and (aware is None
                                             or aware <= scaled - GAP)


def length_claim(plan, results, curves, evaluated, axis):
    """Claim 5 from the init curves, the trained runs along `axis` (or
    None) and the records of the recall runs evaluated at lengths
    (`extrapolate.extrapolation`).

    The trained part is decided on the query's weight on its pair where
    every length has it (recall), else on the final accuracy (`"basis"`).

    Returns:
        `{"holds", "key_dim", "init": {..., "curves"}, "trained": {...},
        "extrapolation": {..., "records"}}`, each part with its rows and
        `"fades"` (None where it did not run).
    """
    sqrt = curves["modes"]["sqrt"]
    init_fall = sqrt["relevant_weight"][0] - sqrt["relevant_weight"][-1]
    init = {"fades": init_fall >= GAP, "relevant_weight_fall": init_fall,
            "half_weight_n": _half_point(sqrt),
            "half_weight_n_ssmax": _half_point(curves["modes"]["ssmax"]),
            "theory_half_weight_n": _theory_half(curves["key_dim"]),
            "curves": curves}
    trained_rows = _trained_rows(plan, results, axis, evaluated) if axis \
        else []
    basis = ("relevant_weight" if trained_rows and all(
        row["arms"].get(REFERENCE, {}).get("relevant_weight")
        for row in trained_rows) else "accuracy")
    key = "relevant_weight_mean" if basis == "relevant_weight" else "mean"
    fall, aware, fades = _fades(trained_rows, lambda arm: arm[key])
    accuracy = _fades(trained_rows, lambda arm: arm["mean"])
    trained = {"axis": axis, "rows": trained_rows, "basis": basis,
               "scaled_fall": fall, "ssmax_fall": aware, "fades": fades,
               "scaled_accuracy_fall": accuracy[0],
               "ssmax_accuracy_fall": accuracy[1]}
    rows = _extrapolation_rows(plan, evaluated)
    fall, aware, fades = _fades(rows, lambda arm: arm["relevant_weight_mean"])
    accuracy = _fades(rows, lambda arm: arm["accuracy_mean"])
    extrapolation = {"rows": rows, "scaled_weight_fall": fall,
                     "ssmax_weight_fall": aware,
                     "scaled_accuracy_fall": accuracy[0],
                     "ssmax_accuracy_fall": accuracy[1],
                     "fades": (None if fall is None else fall >= GAP),
                     "records": list(evaluated)}
    evidence = [part["fades"] for part in (trained, extrapolation)
                if part["fades"] is not None]
    return {"holds": init["fades"] and all(evidence),
            "key_dim": curves["key_dim"], "init": init,
            "trained": trained, "extrapolation": extrapolation}


def _theory_half(key_dim):
    """The n where the i.i.d. theory's relevant weight under the sqrt
    scale is 1/2: e^{s*} = (n - 1) e^{σ²/2}, s* = √d_k, σ = 1."""
    return 1.0 + math.exp(math.sqrt(key_dim) - 0.5)


# ---------------------------------------------------------------- words
def length_verdict(claim):
    """`(lines, holds)`: the verdict on claim 5 in words."""
    curves = claim["init"]["curves"]
    init, sqrt = claim["init"], curves["modes"]["sqrt"]
    n = sqrt["num_keys"]
    ssmax = curves["modes"]["ssmax"]["relevant_weight"]
    half = init["half_weight_n"]
    lines = [
        f"At init (d_k {curves['key_dim']}, one relevant key among n): the "
        "relevant key's weight under 1/√d_k is "
        f"{sqrt['relevant_weight'][0]:.2f} at n {n[0]} and "
        f"{sqrt['relevant_weight'][-1]:.2f} at n {n[-1]} "
        f"(theory {sqrt['theory']['relevant_weight'][0]:.2f} and "
        f"{sqrt['theory']['relevant_weight'][-1]:.2f}); ssmax "
        f"{ssmax[0]:.2f} and {ssmax[-1]:.2f}. "
        + (f"It fades, below 1/2 from n {half}; theory: 1/2 at n ≈ "
           f"1 + e^(√d_k − 1/2) = {init['theory_half_weight_n']:.0f}, so at "
           "init the claim does not hold for n well below that."
           if init["fades"] and half else
           "It fades, but stays above 1/2 up to the longest n."
           if init["fades"] else
           f"It does NOT fade by {GAP:g} over these n: at this d_k the "
           f"relevant score √d_k outgrows log n (1/2 only at n ≈ "
           f"{init['theory_half_weight_n']:.3g})."),
    ]
    trained = claim["trained"]
    if trained["rows"]:
        first, last = trained["rows"][0], trained["rows"][-1]
        axis = trained["axis"]
        lines.append(
            f"Trained at {axis} "
            + ", ".join(str(row[axis]) for row in trained["rows"])
            + ": final accuracy " + "; ".join(
                f"{arm} " + " → ".join(fmt(row["arms"][arm]["mean"], 2)
                                       for row in trained["rows"])
                for arm in first["arms"])
            + (". The query's weight on its pair at the trained length: "
               + "; ".join(f"{arm} " + " → ".join(
                   fmt(row["arms"][arm]["relevant_weight_mean"], 2)
                   for row in trained["rows"]) for arm in first["arms"])
               if trained["basis"] == "relevant_weight" else "")
            + ". " + _fade_words(trained["fades"], trained["scaled_fall"],
                                 trained["ssmax_fall"],
                                 "relevant weight" if trained["basis"]
                                 == "relevant_weight" else "accuracy",
                                 f"{first[axis]} to {last[axis]}"))
    extrapolation = claim["extrapolation"]
    if extrapolation["rows"]:
        rows = extrapolation["rows"]
        lines.append(
            "Trained at one length, evaluated at "
            + ", ".join(f"{row['multiple']}×" for row in rows)
            + ": the query's weight on its pair " + "; ".join(
                f"{arm} " + " → ".join(
                    fmt(row["arms"][arm]["relevant_weight_mean"], 2)
                    for row in rows) for arm in rows[0]["arms"])
            + "; accuracy " + "; ".join(
                f"{arm} " + " → ".join(fmt(row["arms"][arm]["accuracy_mean"],
                                           2) for row in rows)
                for arm in rows[0]["arms"])
            + ". " + _fade_words(extrapolation["fades"],
                                 extrapolation["scaled_weight_fall"],
                                 extrapolation["ssmax_weight_fall"],
                                 "relevant weight",
                                 f"1× to {rows[-1]['multiple']}×"))
    parts = (("at init", init["fades"]),
             ("when trained at each length", trained["fades"]),
             ("when trained at one length and read at longer ones",
              extrapolation["fades"]))
    faded = [name for name, fades in parts if fades]
    held = [name for name, fades in parts if fades is False]
    lines.append(
        "Claim 5 holds: the scaled attention fades at init and in every "
        "trained measurement." if claim["holds"] else
        "Claim 5 is NOT supported as a whole: the scaled attention fades "
        + (" and ".join(faded) if faded else "in no measurement")
        + ", but not " + " or ".join(held) + ".")
    return lines, claim["holds"]


def _change(fall):
    """A fall as words: `falls by 0.11`, `rises by 0.02`."""
    return f"falls by {fall:.2f}" if fall >= 0 else f"rises by {-fall:.2f}"


def _fade_words(fades, scaled, aware, what, span):
    if fades is None:
        return "Not enough to decide."
    text = f"From {span} the scaled {what} {_change(scaled)}"
    if aware is not None:
        text += f", ssmax's {_change(aware)}"
    return text + (": the scaled attention fades here." if fades else
                   ": no fading specific to the 1/√d_k scale here.")


# -------------------------------------------------------------- section
def length_section(plan, claim):
    """The report's lines on claim 5: the init curves, the trained lengths
    and the extrapolation."""
    curves = claim["init"]["curves"]
    modes = list(curves["modes"])
    lines = [f"## Claim 5: sequence length (init at d_k {curves['key_dim']}, "
             f"{curves['trials']} queries per n; ssmax's s_h at 1/log "
             f"{curves['reference_length']}; measured (theory))", ""]
    for statistic, title in (("relevant_weight", "relevant key's weight"),
                             ("entropy_normalized", "normalized entropy"),
                             ("max_weight", "max weight")):
        by_mode = curves["modes"]
        rows = [[str(n)] + [
            f"{by_mode[m][statistic][i]:.3f} "
            f"({by_mode[m]['theory'][statistic][i]:.3f})" for m in modes]
            for i, n in enumerate(by_mode[modes[0]]["num_keys"])]
        lines += [f"At init, {title}:", "",
                  *markdown_table(["n", *modes], rows), ""]
    trained = claim["trained"]
    if trained["rows"]:
        axis, arms = trained["axis"], list(plan.arms)
        weights = trained["basis"] == "relevant_weight"
        rows = []
        for row in trained["rows"]:
            values = row["arms"]
            rows.append(
                [str(row[axis])]
                + [fmt_mean_sd(values[arm]["final_accuracy"]) for arm in arms]
                + [fmt_steps([{"steps_to_target": steps} for steps
                              in values[arm]["steps"]]) for arm in arms]
                + ([fmt_mean_sd(values[arm]["relevant_weight"])
                    for arm in arms] if weights else []))
        lines += [f"Trained at each {axis} (final held-out accuracy, mean ± "
                  "sd over seeds; steps to target"
                  + ("; the query's weight on its pair" if weights else "")
                  + "):", "",
                  *markdown_table(
                      [axis, *arms, *(f"steps {a}" for a in arms),
                       *((f"weight {a}" for a in arms) if weights else ())],
                      rows), ""]
    rows = claim["extrapolation"]["rows"]
    if rows:
        arms = list(plan.arms)
        table = [[f"{row['eval_pairs']} ({row['multiple']}×)"] + [
            fmt_mean_sd(row["arms"][arm]["accuracy"]) for arm in arms] + [
            fmt_mean_sd(row["arms"][arm]["relevant_weight"]) for arm in arms]
            for row in rows]
        lines += ["Trained at the shortest length, evaluated held-out at "
                  "longer ones (position table tiled; accuracy, then the "
                  "query's weight on its pair):", "",
                  *markdown_table(["pairs", *(f"accuracy {a}" for a in arms),
                                   *(f"weight {a}" for a in arms)], table),
                  ""]
    return lines
