"""Claim 5, from three measurements (`length_measures`), each fading when
the scaled arm's number falls by at least `GAP` from the shortest length
to the longest: the relevant key's weight in the init curves per scale
mode (beside the i.i.d. theory); the runs trained at each length of the
grid's length axis (the query's weight on its pair on recall, else the
accuracy), where ssmax's, when it ran, must fall by `GAP` less (a fall
every arm shares is the task getting harder); and recall read at multiples
of its trained length. It holds when every part that ran fades.
"""

from pipelines.builders import build_task
from pipelines.common import markdown_table
from pipelines.compare.claims import length_measures
from pipelines.compare.claims.learning import GAP
from pipelines.compare.series import arms_panel
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

NUMBER = "5"
STATEMENT = "With the 1/√d_k scale attention fades as n grows"
SCALAR_RUNS = ("length_init", "length", "length_eval")
# The arm that is aware of the length (its log n factor).
LENGTH_AWARE = "ssmax"
REFERENCE = PAIR[0]
# Their scale modes, the keys of the init curves.
_REFERENCE_MODE, _AWARE_MODE = ARMS[REFERENCE].mode, ARMS[LENGTH_AWARE].mode
_INIT_PANELS = (("relevant_weight", "relevant key's weight"),
                ("entropy_normalized", "normalized entropy"),
                ("max_weight", "max weight"))


def _trained_rows(plan, results, axis, evaluated):
    """Per trained length, per arm: the final accuracies and, on recall,
    the query's weight on its pair."""
    key_dim = plan.trained_axis("key_dim")[-1]
    rows = []
    for length in plan.trained_axis(axis):
        arms = {}
        for arm in plan.arms:
            records = [r for r in results["runs"] if r["arm"] == arm
                       and r["key_dim"] == key_dim and r.get(axis) == length
                       and plan.in_slice(r, free=axis)]
            accuracy = [r["final_accuracy"] for r in records]
            weight = length_measures.pair_weights(evaluated, arm, length,
                                                  1)[0]
            arms[arm] = {"final_accuracy": accuracy,
                         "mean": mean_sd(accuracy)[0],
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
    None) and the records of `length_measures.extrapolation`: `{"holds",
    "key_dim", "init", "trained", "extrapolation"}`, each part with
    `"fades"` (None where it did not run). The trained part is decided on
    the query's weight on its pair where every length has it (recall),
    else on the final accuracy (`"basis"`)."""
    sqrt = curves["modes"][_REFERENCE_MODE]
    init_fall = sqrt["relevant_weight"][0] - sqrt["relevant_weight"][-1]
    init = {"fades": init_fall >= GAP, "relevant_weight_fall": init_fall,
            "half_weight_n": length_measures.half_point(sqrt),
            "half_weight_n_ssmax": length_measures.half_point(
                curves["modes"][_AWARE_MODE]),
            "theory_half_weight_n": length_measures.theory_half(
                curves["key_dim"]),
            "curves": curves}
    trained_rows = (_trained_rows(plan, results, axis, evaluated) if axis
                    else [])
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
    rows = length_measures.multiple_rows(plan, evaluated)
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


def _series(rows, key):
    """`arm a → b; arm ...`: `key` of each arm over the rows."""
    return "; ".join(
        f"{arm} " + " → ".join(fmt(row["arms"][arm][key], 2) for row in rows)
        for arm in rows[0]["arms"])


def length_verdict(claim):
    """`(lines, holds)`: claim 5 in words."""
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
        rows, axis = trained["rows"], trained["axis"]
        weights = trained["basis"] == "relevant_weight"
        lines.append(
            f"Trained at {axis} " + ", ".join(str(row[axis]) for row in rows)
            + ": final accuracy " + _series(rows, "mean")
            + (". The query's weight on its pair at the trained length: "
               + _series(rows, "relevant_weight_mean") if weights else "")
            + ". " + _fade_words(trained["fades"], trained["scaled_fall"],
                                 trained["ssmax_fall"],
                                 "relevant weight" if weights else "accuracy",
                                 f"{rows[0][axis]} to {rows[-1][axis]}"))
    extrapolation = claim["extrapolation"]
    if extrapolation["rows"]:
        rows = extrapolation["rows"]
        lines.append(
            "Trained at one length, evaluated at "
            + ", ".join(f"{row['multiple']}×" for row in rows)
            + ": the query's weight on its pair "
            + _series(rows, "relevant_weight_mean")
            + "; accuracy " + _series(rows, "accuracy_mean")
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


def section(plan, claim, results):
    curves, arms = claim["init"]["curves"], list(plan.arms)
    by_mode = curves["modes"]
    modes = list(by_mode)
    lines = [f"## Claim 5: sequence length (init at d_k {curves['key_dim']}, "
             f"{curves['trials']} queries per n; ssmax's s_h at 1/log "
             f"{curves['reference_length']}; measured (theory))", ""]
    for statistic, title in _INIT_PANELS:
        rows = [[str(n)] + [
            f"{by_mode[m][statistic][i]:.3f} "
            f"({by_mode[m]['theory'][statistic][i]:.3f})" for m in modes]
            for i, n in enumerate(by_mode[modes[0]]["num_keys"])]
        lines += [f"At init, {title}:", "",
                  *markdown_table(["n", *modes], rows), ""]
    trained = claim["trained"]
    if trained["rows"]:
        axis = trained["axis"]
        weights = trained["basis"] == "relevant_weight"
        rows = [
            [str(row[axis])]
            + [fmt_mean_sd(row["arms"][arm]["final_accuracy"])
               for arm in arms]
            + [fmt_steps([{"steps_to_target": steps} for steps
                          in row["arms"][arm]["steps"]]) for arm in arms]
            + ([fmt_mean_sd(row["arms"][arm]["relevant_weight"])
                for arm in arms] if weights else [])
            for row in trained["rows"]]
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
        cells = [[f"{row['eval_pairs']} ({row['multiple']}×)"] + [
            fmt_mean_sd(row["arms"][arm]["accuracy"]) for arm in arms] + [
            fmt_mean_sd(row["arms"][arm]["relevant_weight"]) for arm in arms]
            for row in rows]
        lines += ["Trained at the shortest length, evaluated held-out at "
                  "longer ones (position table tiled; accuracy, then the "
                  "query's weight on its pair):", "",
                  *markdown_table(["pairs", *(f"accuracy {a}" for a in arms),
                                   *(f"weight {a}" for a in arms)], cells),
                  ""]
    return lines


def applies(plan):
    return bool(length_measures.length_axis(plan)
                or plan.options.get("length_multiples"))


def measure(plan, results, log=print):
    """Claim 5 with the init curves at the largest d_k, ssmax's s_h set
    for the shortest trained length."""
    axis = length_measures.length_axis(plan)
    key_dims = plan.trained_axis("key_dim") or plan.axis("key_dim")
    shortest = plan.base if axis is None else plan.base.replace(
        **{axis: plan.trained_axis(axis)[0]})
    curves = length_measures.init_curves(key_dims[-1],
                                         build_task(shortest).seq_len)
    log(f"length: init curves at d_k {key_dims[-1]} for "
        f"{', '.join(curves['modes'])}")
    records = length_measures.extrapolation(
        plan, length_measures.evaluated_runs(plan), log)
    return length_claim(plan, results, curves, records, axis)


def headline(plan, claim):
    sqrt = claim["init"]["curves"]["modes"][_REFERENCE_MODE]
    n = sqrt["num_keys"]
    return (f"the relevant key's weight at init "
            f"{sqrt['relevant_weight'][0]:.2f} at n {n[0]}, "
            f"{sqrt['relevant_weight'][-1]:.2f} at n {n[-1]}")


def verdict(plan, claim, results):
    return length_verdict(claim)


def _claim(document):
    return (document.get("claims") or {}).get(NUMBER) or {}


def _init_figure(document):
    claim = _claim(document)
    if not claim:
        return None
    curves = claim["init"]["curves"]
    figure, axes = new_figure(15, 4.0, 1, len(_INIT_PANELS))
    for ax, (name, title) in zip(axes[0], _INIT_PANELS):
        for mode in (ARMS[arm].mode for arm in length_measures.INIT_ARMS):
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


def _trained_figure(document):
    trained = _claim(document).get("trained") or {}
    if not trained.get("rows"):
        return None
    figure, axes = new_figure()
    axis = trained["axis"]
    arms_panel(axes[0][0], document, trained["rows"], axis, "mean", axis,
               "final held-out accuracy", f"Trained at each {axis}")
    return figure


def _eval_figure(document):
    rows = (_claim(document).get("extrapolation") or {}).get("rows")
    if not rows:
        return None
    figure, axes = new_figure(11, 4.0, 1, 2)
    for ax, key, title in zip(axes[0], ("accuracy", "relevant_weight"),
                              ("held-out accuracy", "query's weight on "
                               "its pair")):
        arms_panel(ax, document, rows, "eval_pairs", f"{key}_mean",
                   "evaluated pairs", title,
                   f"Trained at {rows[0]['eval_pairs']} pairs")
    return figure


FIGURES = (
    ("length_init", "(h) At initialization, one relevant key among n: its "
     "weight, the normalized entropy and the max weight against n per scale "
     "mode, measured (± standard error) and the i.i.d. theory (dashed).",
     _init_figure),
    ("length_trained", "(i) Final held-out accuracy against the trained "
     "length, per arm.", _trained_figure),
    ("length_eval", "(j) Trained at the shortest length, evaluated at "
     "multiples of it: accuracy and the query's weight on its pair.",
     _eval_figure),
)


def scalars(plan, claim, results):
    trained = claim["trained"]
    return {
        "length_init": [
            (f"{kind}/{name}/{mode}", values[i], n)
            for mode, curve in claim["init"]["curves"]["modes"].items()
            for name in length_measures.INIT_STATISTICS
            for kind, values in (("init", curve[name]),
                                 ("theory", curve["theory"][name]))
            for i, n in enumerate(curve["num_keys"])],
        "length": [(f"final/accuracy/{arm}", values["mean"],
                    row[trained["axis"]])
                   for row in trained["rows"]
                   for arm, values in row["arms"].items()],
        "length_eval": [
            point for row in claim["extrapolation"]["rows"]
            for arm, values in row["arms"].items()
            for point in ((f"accuracy/{arm}", values["accuracy_mean"],
                           row["eval_pairs"]),
                          (f"relevant_weight/{arm}",
                           values["relevant_weight_mean"],
                           row["eval_pairs"]))],
    }
