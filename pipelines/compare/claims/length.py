"""Claim 5, "with the 1/√d_k scale attention fades as n grows", from three
measurements (`length_measures`): the init curves over n per scale mode
beside the i.i.d. theory, which fade when the sqrt scale's relevant weight
falls by at least `GAP` from the shortest to the longest n; the runs
trained at each length of the grid's length axis (the query's weight on
its pair on recall, else the accuracy), which fade when the scaled arm's
falls by `GAP` and ssmax's, when it ran, by `GAP` less (a fall every arm
shares is the task getting harder); and recall trained at one length, read
at multiples of it, which fades when that weight falls by `GAP`. The claim
holds when the init curves fade and every trained measurement that ran
does too.
"""

from pipelines.builders import build_task
from pipelines.common import markdown_table
from pipelines.compare.claims.length_measures import INIT_ARMS
from pipelines.compare.claims.length_measures import INIT_STATISTICS
from pipelines.compare.claims.length_measures import evaluated_runs
from pipelines.compare.claims.length_measures import extrapolation
from pipelines.compare.claims.length_measures import half_point
from pipelines.compare.claims.length_measures import init_curves
from pipelines.compare.claims.length_measures import length_axis
from pipelines.compare.claims.length_measures import length_eval_figure
from pipelines.compare.claims.length_measures import multiple_rows
from pipelines.compare.claims.length_measures import pair_weights
from pipelines.compare.claims.length_measures import points
from pipelines.compare.claims.length_measures import table
from pipelines.compare.claims.length_measures import theory_half
from pipelines.compare.claims.learning import GAP
from pipelines.compare.measure import document_arms
from pipelines.engine.presets import ARMS
from pipelines.engine.presets import PAIR
from pipelines.reports.numbers import fmt
from pipelines.reports.numbers import fmt_mean_sd
from pipelines.reports.numbers import fmt_steps
from pipelines.reports.numbers import mean_sd
from pipelines.reports.plotting import colour
from pipelines.reports.plotting import finish_panel
from pipelines.reports.plotting import log2_axis
from pipelines.reports.plotting import new_figure
from pipelines.reports.plotting import series_panel

NUMBER = "5"
STATEMENT = "With the 1/√d_k scale attention fades as n grows"
SCALAR_RUNS = ("length_init", "length", "length_eval")
# The arm that is aware of the length (its log n factor).
LENGTH_AWARE = "ssmax"
REFERENCE = PAIR[0]
# Their scale modes, the keys of the init curves.
_REFERENCE_MODE, _AWARE_MODE = ARMS[REFERENCE].mode, ARMS[LENGTH_AWARE].mode


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
                       and plan.in_slice(r, free=axis)]
            weight = pair_weights(evaluated, arm, length, 1)[0]
            arms[arm] = {"final_accuracy": [r["final_accuracy"]
                                            for r in records],
                         "mean": mean_sd([r["final_accuracy"]
                                          for r in records])[0],
                         "steps": [r["steps_to_target"] for r in records],
                         "relevant_weight": weight,
                         "relevant_weight_mean": mean_sd(weight)[0]}
        rows.append({axis: length, "arms": arms})
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
    sqrt = curves["modes"][_REFERENCE_MODE]
    init_fall = sqrt["relevant_weight"][0] - sqrt["relevant_weight"][-1]
    init = {"fades": init_fall >= GAP, "relevant_weight_fall": init_fall,
            "half_weight_n": half_point(sqrt),
            "half_weight_n_ssmax": half_point(curves["modes"][_AWARE_MODE]),
            "theory_half_weight_n": theory_half(curves["key_dim"]),
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
    rows = multiple_rows(plan, evaluated)
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


def length_verdict(claim):
    """`(lines, holds)`: the verdict on claim 5 in words."""
    curves = claim["init"]["curves"]
    init, sqrt = claim["init"], curves["modes"][_REFERENCE_MODE]
    n = sqrt["num_keys"]
    ssmax = curves["modes"][_AWARE_MODE]["relevant_weight"]
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
def section(plan, claim, results):
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
    lines += table(plan, claim["extrapolation"]["rows"])
    return lines


# ------------------------------------------------------------ interface
def applies(plan):
    """With a length axis (`num_pairs`, `seq_len`) or `length_multiples`."""
    return bool(length_axis(plan) or plan.options.get("length_multiples"))


def measure(plan, results, log=print):
    """Claim 5: the init curves at the largest d_k (ssmax's s_h from the
    shortest trained length), the trained lengths and the recall runs read
    at multiples of theirs."""
    axis = length_axis(plan)
    key_dims = plan.trained_axis("key_dim") or plan.axis("key_dim")
    shortest = plan.base if axis is None else plan.base.replace(
        **{axis: plan.trained_axis(axis)[0]})
    curves = init_curves(key_dims[-1], build_task(shortest).seq_len)
    log(f"length: init curves at d_k {key_dims[-1]} for "
        f"{', '.join(curves['modes'])}")
    records = extrapolation(plan, evaluated_runs(plan), log)
    return length_claim(plan, results, curves, records, axis)


def headline(plan, claim):
    sqrt = claim["init"]["curves"]["modes"][_REFERENCE_MODE]
    n = sqrt["num_keys"]
    return (f"the relevant key's weight at init "
            f"{sqrt['relevant_weight'][0]:.2f} at n {n[0]}, "
            f"{sqrt['relevant_weight'][-1]:.2f} at n {n[-1]}")


def verdict(plan, claim, results):
    return length_verdict(claim)


_INIT_PANELS = (("relevant_weight", "relevant key's weight"),
                ("entropy_normalized", "normalized entropy"),
                ("max_weight", "max weight"))


def length_init_figure(document):
    """The init curves against n, per mode, with the theory."""
    claim = (document.get("claims") or {}).get(NUMBER)
    if not claim:
        return None
    curves = claim["init"]["curves"]
    figure, axes = new_figure(15, 4.0, 1, len(_INIT_PANELS))
    for ax, (name, title) in zip(axes[0], _INIT_PANELS):
        for mode in map(lambda arm: ARMS[arm].mode, INIT_ARMS):
            curve = curves["modes"][mode]
            n = curve["num_keys"]
            ax.errorbar(n, curve[name], yerr=curve[f"{name}_sem"],
                        color=colour(mode), marker="o", capsize=2,
                        linestyle="none", label=f"{mode} measured")
            ax.plot(n, curve["theory"][name], color=colour(mode),
                    linestyle="--", linewidth=1, label=f"{mode} theory")
        log2_axis(ax, curves["modes"][_REFERENCE_MODE]["num_keys"],
                  "n (keys)")
        finish_panel(ax, title, f"{title} at init, d_k {curves['key_dim']}",
                     unit=True)
    return figure


def length_trained_figure(document):
    """Final accuracy against the trained length, per arm."""
    claim = (document.get("claims") or {}).get(NUMBER)
    trained = (claim or {}).get("trained") or {}
    if not trained.get("rows"):
        return None
    axis = trained["axis"]
    figure, axes = new_figure()
    ax = axes[0][0]
    lengths = [row[axis] for row in trained["rows"]]
    series_panel(ax, [
        (arm, arm, lengths, [row["arms"][arm]["mean"]
                             for row in trained["rows"]], None)
        for arm in document_arms(document, trained["rows"][0]["arms"])],
        spread="none")
    log2_axis(ax, lengths, axis)
    finish_panel(ax, "final held-out accuracy", f"Trained at each {axis}",
                 unit=True)
    return figure


FIGURES = (
    ("length_init", "(h) At initialization, one relevant key among n: its "
     "weight, the normalized entropy and the max weight against n per scale "
     "mode, measured (± standard error) and the i.i.d. theory (dashed).",
     length_init_figure),
    ("length_trained", "(i) Final held-out accuracy against the trained "
     "length, per arm.", length_trained_figure),
    ("length_eval", "(j) Trained at the shortest length, evaluated at "
     "multiples of it: accuracy and the query's weight on its pair.",
     length_eval_figure),
)


def scalars(plan, claim, results):
    """Over n keys at init (`init/` and `theory/` per mode), over the
    trained length (final/accuracy) and over the evaluated pairs."""
    trained = claim["trained"]
    return {
        "length_init": [
            (f"{kind}/{name}/{mode}", values[i], n)
            for mode, curve in claim["init"]["curves"]["modes"].items()
            for name in INIT_STATISTICS
            for kind, values in (("init", curve[name]),
                                 ("theory", curve["theory"][name]))
            for i, n in enumerate(curve["num_keys"])],
        "length": [(f"final/accuracy/{arm}", values["mean"],
                    row[trained["axis"]])
                   for row in trained["rows"]
                   for arm, values in row["arms"].items()],
        "length_eval": points(claim["extrapolation"]["rows"]),
    }
