"""The figures of claims 4 and 5, drawn from comparison.json's
`"claims"."4"` and `"claims"."5"` alone (each returns None without them):

    depth_accuracy     final held-out accuracy against depth, per arm
    depth_entropy      normalized entropy per layer at init (solid) and at
                       the end (dashed), one panel per depth
    length_init        at init against n keys (log-2 axis): relevant key's
                       weight, normalized entropy, max weight per scale
                       mode, measured (markers, ± standard error) and the
                       i.i.d. theory (dashed)
    length_trained     final accuracy against the trained length, per arm
    length_eval        accuracy and the query's weight on its pair against
                       the evaluated length, trained at the shortest
"""

from pipelines.reports.plotting import colour
from pipelines.reports.plotting import finish_panel
from pipelines.reports.plotting import log2_axis
from pipelines.reports.plotting import new_figure
from pipelines.reports.plotting import series_panel


def _claim(document, number):
    return (document.get("claims") or {}).get(number)


def _arms(document, by_arm):
    """The arms of `by_arm` in the comparison's order (the JSON file keeps
    its keys sorted)."""
    return [arm for arm in document["arms"] if arm in by_arm]


def _finish(ax, ylabel, title, unit=True):
    finish_panel(ax, ylabel, title, unit=unit)


def depth_accuracy_figure(document):
    """Final held-out accuracy against the number of layers, per arm."""
    claim = _claim(document, "4")
    if not claim or not claim["by_depth"]:
        return None
    figure, axes = new_figure()
    ax = axes[0][0]
    depths = [row["num_layers"] for row in claim["by_depth"]]
    series_panel(ax, [
        (arm, arm, depths, [r["accuracy_mean"] for r in rows],
         [r["accuracy_sd"] or 0.0 for r in rows])
        for arm in _arms(document, claim["by_depth"][0]["arms"])
        for rows in ([row["arms"][arm] for row in claim["by_depth"]],)])
    log2_axis(ax, depths, "attention layers")
    _finish(ax, "final held-out accuracy",
            f"Accuracy against depth, d_k {claim['key_dim']} (mean ± sd)")
    return figure


def depth_entropy_figure(document):
    """Normalized entropy per layer, at init and at the end, per depth."""
    claim = _claim(document, "4")
    rows = [row for row in (claim or {}).get("by_depth", ())
            if any(arm["entropy_init"] for arm in row["arms"].values())]
    if not rows:
        return None
    figure, axes = new_figure(4.2 * len(rows), 3.6, 1, len(rows))
    for ax, row in zip(axes[0], rows):
        for arm in _arms(document, row["arms"]):
            values = row["arms"][arm]
            for stage, style, when in (("entropy_init", "-", "init"),
                                       ("entropy_final", "--", "end")):
                series = values[stage]
                if not series:
                    continue
                layers = list(range(1, len(series["mean"]) + 1))
                ax.plot(layers, series["mean"], color=colour(arm),
                        linestyle=style, marker="o", label=f"{arm} {when}")
        ax.set_xticks(list(range(1, row["num_layers"] + 1)))
        ax.set_xlabel("layer (1 = bottom)")
        _finish(ax, "entropy / log(#keys)", f"{row['num_layers']} layer(s)")
    return figure


_INIT_PANELS = (("relevant_weight", "relevant key's weight"),
                ("entropy_normalized", "normalized entropy"),
                ("max_weight", "max weight"))


def length_init_figure(document):
    """The init curves against n, per mode, with the theory."""
    claim = _claim(document, "5")
    if not claim:
        return None
    curves = claim["init"]["curves"]
    figure, axes = new_figure(15, 4.0, 1, len(_INIT_PANELS))
    for ax, (name, title) in zip(axes[0], _INIT_PANELS):
        for mode in ("sqrt", "none", "qk_norm", "ssmax"):
            curve = curves["modes"][mode]
            n = curve["num_keys"]
            ax.errorbar(n, curve[name], yerr=curve[f"{name}_sem"],
                        color=colour(mode), marker="o", capsize=2,
                        linestyle="none", label=f"{mode} measured")
            ax.plot(n, curve["theory"][name], color=colour(mode),
                    linestyle="--", linewidth=1, label=f"{mode} theory")
        log2_axis(ax, curves["modes"]["sqrt"]["num_keys"], "n (keys)")
        _finish(ax, title, f"{title} at init, d_k {curves['key_dim']}")
    return figure


def length_trained_figure(document):
    """Final accuracy against the trained length, per arm."""
    claim = _claim(document, "5")
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
        for arm in _arms(document, trained["rows"][0]["arms"])],
        spread="none")
    log2_axis(ax, lengths, axis)
    _finish(ax, "final held-out accuracy", f"Trained at each {axis}")
    return figure


def length_eval_figure(document):
    """Accuracy and relevant weight against the evaluated length."""
    claim = _claim(document, "5")
    rows = ((claim or {}).get("extrapolation") or {}).get("rows")
    if not rows:
        return None
    figure, axes = new_figure(11, 4.0, 1, 2)
    pairs = [row["eval_pairs"] for row in rows]
    for ax, key, title in zip(axes[0], ("accuracy", "relevant_weight"),
                              ("held-out accuracy", "query's weight on "
                               "its pair")):
        series_panel(ax, [
            (arm, arm, pairs, [row["arms"][arm][f"{key}_mean"]
                               for row in rows], None)
            for arm in _arms(document, rows[0]["arms"])], spread="none")
        log2_axis(ax, pairs, "evaluated pairs")
        _finish(ax, title, f"Trained at {pairs[0]} pairs")
    return figure


# (name, caption, figure function), after the d_k figures.
AXIS_FIGURES = (
    ("depth_accuracy", "(f) Final held-out accuracy against the number of "
     "attention layers, mean ± sd over seeds, per arm.",
     depth_accuracy_figure),
    ("depth_entropy", "(g) Normalized entropy per layer at initialization "
     "(solid) and at the end of training (dashed), one panel per depth.",
     depth_entropy_figure),
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
