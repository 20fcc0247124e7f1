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

`write_figures` saves them as PNG under `figures/` and returns them as SVG
text too, for comparison.html. Every line carries its series' name as its
label (the arm, or the ratio), so the drawn data can be read back.
"""

import io
import os

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
import matplotlib

from keras_attention.viz import plot_attention_pair
from pipelines.common import write_bytes_atomic
from pipelines.compare.series import PAIR

FIGURE_DIR = "figures"
_PNG_DPI = 120


def _figure(width=6.4, height=4.0):
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _colours(arms):
    palette = matplotlib.colormaps["tab10"].colors
    return {arm: palette[index % len(palette)]
            for index, arm in enumerate(arms)}


def _log2_axis(ax, key_dims):
    ax.set_xscale("log", base=2)
    ax.set_xticks(key_dims, [str(k) for k in key_dims])
    ax.minorticks_off()
    ax.set_xlabel("d_k (key dimension)")


def accuracy_figure(document):
    """(a) Held-out accuracy against the step, one panel per trained d_k."""
    curves = document.get("curves") or []
    key_dims = sorted({c["key_dim"] for c in curves})
    if not key_dims:
        return None
    colours = _colours(document["arms"])
    figure = _figure(5.6 * len(key_dims), 3.8)
    axes = figure.subplots(1, len(key_dims), squeeze=False)[0]
    for ax, key_dim in zip(axes, key_dims):
        for curve in curves:
            series = curve["metrics"]["accuracy"]
            if curve["key_dim"] != key_dim or not series["steps"]:
                continue
            steps, mean, sd = series["steps"], series["mean"], series["sd"]
            colour = colours[curve["arm"]]
            ax.fill_between(steps, [m - s for m, s in zip(mean, sd)],
                            [m + s for m, s in zip(mean, sd)], color=colour,
                            alpha=0.2, linewidth=0)
            ax.plot(steps, mean, color=colour, marker=".",
                    label=f"{curve['arm']} ({len(curve['seeds'])} seeds)")
        target = document.get("target_accuracy")
        if target:
            ax.axhline(target, color="grey", linestyle=":", linewidth=1,
                       label=f"target {target:g}")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("training step")
        ax.set_ylabel("held-out accuracy")
        ax.set_title(f"d_k = {key_dim}: mean ± sd over seeds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return figure


def _per_arm_figure(document, data, ylabel, title, log_y=False):
    colours = _colours(document["arms"])
    figure = _figure()
    ax = figure.add_subplot()
    key_dims = sorted({k for series in data.values()
                       for k in series["key_dims"]})
    for arm, series in data.items():
        ax.errorbar(series["key_dims"], series["mean"], yerr=series["sd"],
                    color=colours[arm], marker="o", capsize=3, label=arm)
    _log2_axis(ax, key_dims)
    if log_y:
        ax.set_yscale("log", base=2)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
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
    figure = _figure()
    ax = figure.add_subplot()
    names = {"grad_norm_scores": "|dL/dscores|",
             "grad_norm_query": "|dL/dW_Q|"}
    for key, series in data.items():
        ax.plot(series["key_dims"], series["ratio"], marker="o",
                label=f"{names[key]} {PAIR[1]}/{PAIR[0]}")
    key_dims = sorted({k for s in data.values() for k in s["key_dims"]})
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1, label="1")
    _log2_axis(ax, key_dims)
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
)


def make_figures(document):
    """`[(name, caption, Figure)]` of the figures the document has data
    for."""
    made = []
    for name, caption, draw in FIGURES:
        figure = draw(document)
        if figure is not None:
            made.append((name, caption, figure))
    return made


def figure_svg(figure):
    """The figure as SVG markup for inlining in HTML: text kept as text, no
    XML prologue, DOCTYPE or metadata (whose namespace addresses would be
    the page's only http references)."""
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none",
                                "svg.hashsalt": "comparison"}):
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    start, end = text.find("<metadata>"), text.find("</metadata>")
    if start != -1:
        text = text[:start] + text[end + len("</metadata>"):]
    for attribute in (' xmlns:xlink="http://www.w3.org/1999/xlink"',
                      ' xmlns="http://www.w3.org/2000/svg"'):
        text = text.replace(attribute, "")
    return text


def write_figures(logdir, document):
    """Saves every figure as `figures/<name>.png` under `logdir`.

    Returns:
        `[{"name", "caption", "path", "svg"}]`; `path` is relative to
        `logdir`.
    """
    os.makedirs(os.path.join(logdir, FIGURE_DIR), exist_ok=True)
    written = []
    for name, caption, figure in make_figures(document):
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=_PNG_DPI)
        path = f"{FIGURE_DIR}/{name}.png"
        write_bytes_atomic(os.path.join(logdir, path), buffer.getvalue())
        written.append({"name": name, "caption": caption, "path": path,
                        "svg": figure_svg(figure)})
    return written
