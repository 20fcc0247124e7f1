"""The comparison's figures, drawn from comparison.json alone.

Each figure is a function of the comparison.json document (read back from
the file, so the pictures and the numbers have one source):

    accuracy        (a) held-out accuracy over the steps, mean ± sd per arm
                        (`"curves"`)
    init_entropy    (b) normalized entropy at init over d_k per arm
                        (`"figures"."init_entropy"`)
    score_std       (c) score std at init over d_k, with the √d_k and 1
                        lines (`"figures"."score_std"`, `"sqrt_key_dim"`)
    gradient_ratio  (d) unscaled/scaled |dL/dscores| and |dL/dW_Q| at init
                        over d_k (`"figures"."gradient_ratios"`)
    attention_init, attention_final
                    (e) the probe example's labelled attention, scaled and
                        unscaled and their difference (`"heatmaps"`)

and, when the comparison measured claims 4 and 5, (f) to (j) of
`axis_figures`. `pipelines.plotting.write_figures` saves them as PNG under
`figures/` and returns them as SVG text too, for comparison.html. Every
line carries its series' name as its label (the arm, or the ratio), so the
drawn data can be read back.
"""

from keras_attention.viz import plot_attention_pair
from pipelines.compare.axis_figures import AXIS_FIGURES
from pipelines.compare.series import PAIR
from pipelines.reports.plotting import draw_figures
from pipelines.reports.plotting import finish_panel
from pipelines.reports.plotting import log2_axis
from pipelines.reports.plotting import new_figure
from pipelines.reports.plotting import series_panel

def accuracy_figure(document):
    """(a) Held-out accuracy against the step, one panel per trained d_k."""
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


def _per_arm_figure(document, data, ylabel, title, log_y=False):
    figure, axes = new_figure()
    ax = axes[0][0]
    key_dims = sorted({k for series in data.values()
                       for k in series["key_dims"]})
    series_panel(ax, [(arm, arm, series["key_dims"], series["mean"],
                       series["sd"]) for arm, series in data.items()])
    log2_axis(ax, key_dims)
    if log_y:
        ax.set_yscale("log", base=2)
    finish_panel(ax, ylabel, title, legend=False)
    return figure, ax


def init_entropy_figure(document):
    """(b) Normalized entropy at init against d_k, per arm."""
    data = document["figures"]["init_entropy"]
    if not data:
        return None
    figure, ax = _per_arm_figure(
        document, data, "entropy / log(#keys) at init",
        "Softmax entropy at init (1 = uniform, 0 = one-hot)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    return figure


def score_std_figure(document):
    """(c) Score std at init against d_k, with the √d_k line (unscaled
    theory) and the 1 line (scaled theory)."""
    data = document["figures"]["score_std"]
    if not data:
        return None
    figure, ax = _per_arm_figure(document, data, "std of the scores at init",
                                 "Score std at init, mean ± sd over seeds",
                                 log_y=True)
    reference = document["figures"]["sqrt_key_dim"]
    ax.plot(reference["key_dims"], reference["value"], color="black",
            linestyle="--", linewidth=1, label="√d_k")
    ax.plot(reference["key_dims"], [1.0] * len(reference["key_dims"]),
            color="grey", linestyle=":", linewidth=1, label="1")
    ax.legend(fontsize=8)
    return figure


def gradient_ratio_figure(document):
    """(d) Unscaled over scaled gradient norms at init against d_k."""
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
    ax.set_ylabel(f"{PAIR[1]} / {PAIR[0]} at init")
    ax.set_title("Gradient norms at init, unscaled over scaled")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return figure


def attention_entries(document, stage):
    """The `"heatmaps"` entries figure (e) draws at `stage`: the pair's (or
    the first two arms') entries with weights, in that order."""
    entries = {item["arm"]: item for item in document.get("heatmaps") or []
               if item["stage"] == stage and "weights" in item}
    arms = list(PAIR) if all(a in entries for a in PAIR) else [
        arm for arm in document["arms"] if arm in entries][:2]
    return [entries[arm] for arm in arms] if len(arms) == 2 else []


def attention_figure(document, stage):
    """(e) The probe example's attention, two arms and their difference."""
    entries = attention_entries(document, stage)
    if not entries:
        return None
    first, second = entries
    when = "at init" if stage == "init" else "at the end of training"
    return plot_attention_pair(
        first["weights"], second["weights"], first["labels"],
        titles=(first["arm"], second["arm"]),
        title=f"Probe example 0 {when} (d_k {first['key_dim']}, seed "
              f"{first['seed']})",
    )


# (name, caption, figure function).
FIGURES = (
    ("accuracy", "(a) Held-out accuracy against the training step: mean "
     "(line) ± sd (band) over seeds, per arm.", accuracy_figure),
    ("init_entropy", "(b) Normalized softmax entropy at initialization "
     "against d_k (log-2 axis), mean ± sd over seeds.", init_entropy_figure),
    ("score_std", "(c) Standard deviation of the attention scores at "
     "initialization against d_k, with the √d_k line (unscaled theory) and "
     "1 (scaled theory).", score_std_figure),
    ("gradient_ratio", "(d) Unscaled over scaled gradient norms at "
     "initialization (probe batch): |dL/dscores| and |dL/dW_Q| against "
     "d_k.", gradient_ratio_figure),
    ("attention_init", "(e) Attention of one probe example at "
     "initialization: both arms and their difference (queries down, keys "
     "across).", lambda document: attention_figure(document, "init")),
    ("attention_final", "(e) The same probe example at the end of "
     "training.", lambda document: attention_figure(document, "final")),
    # Claims 4 and 5, only when the comparison measured them.
    *AXIS_FIGURES,
)


def make_figures(document):
    """`[(name, caption, Figure)]` of the figures the document has data
    for."""
    return draw_figures(FIGURES, document)
