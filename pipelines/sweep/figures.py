"""The sweep's figures, each drawn from the data in `sweep.json`
(`lr_figure` is Wortsman et al. 2023, figure 1)."""

from pipelines.reports.plotting import colour
from pipelines.reports.plotting import draw_figures
from pipelines.reports.plotting import finish_panel
from pipelines.reports.plotting import new_figure
from pipelines.reports.plotting import series_panel


def _panels(items):
    return sorted({(item["optimizer"], item["key_dim"]) for item in items})


def _curve_rows(curve_list, rows, title):
    """Rows of (metric, label, log y) by columns of (optimizer, d_k)."""
    panels = _panels(curve_list)
    figure, axes = new_figure(4.2 * len(panels), 3.2 * len(rows), len(rows),
                              len(panels))
    for column, (optimizer, key_dim) in enumerate(panels):
        for row, (metric, label, log_y) in enumerate(rows):
            ax = axes[row][column]
            for curve in curve_list:
                if ((curve["optimizer"], curve["key_dim"])
                        != (optimizer, key_dim)):
                    continue
                stats = curve[metric]
                points = [(x, m, lo, hi) for x, m, lo, hi in zip(
                    curve["learning_rates"], stats["mean"], stats["min"],
                    stats["max"]) if m is not None]
                if not points:
                    continue
                xs, means, lows, highs = zip(*points)
                series_panel(ax, [(curve["arm"], curve["arm"], xs, means,
                                   (lows, highs))], spread="band")
            ax.set_xscale("log")
            if log_y:
                ax.set_yscale("log")
            ax.set_xlabel("learning rate")
            finish_panel(ax, label, f"{optimizer}, d_k {key_dim}")
    figure.suptitle(title)
    return figure


def lr_figure(curve_list):
    """Final loss and accuracy against the learning rate."""
    return _curve_rows(curve_list, [
        ("loss", "final held-out loss (capped at init)", False),
        ("accuracy", "final held-out accuracy", False),
    ], "Final loss and accuracy against the learning rate "
       "(mean over seeds; band: min-max)")


def diagnostics_figure(curve_list):
    """Final max attention logit and normalized entropy against the rate."""
    return _curve_rows(curve_list, [
        ("max_abs_score", "final max |q·k·scale|", True),
        ("entropy_normalized", "final entropy / log(keys)", False),
    ], "Attention at the end of training against the learning rate")


def sensitivity_figure(sensitivity_list):
    """Bars per arm (mean ± sd over seeds), one group per optimizer, d_k."""
    panels = _panels(sensitivity_list)
    arms = sorted({s["arm"] for s in sensitivity_list})
    figure, axes = new_figure(max(5, 1.6 * len(panels) * len(arms)), 3.6)
    ax = axes[0][0]
    width = 0.8 / max(len(arms), 1)
    for index, arm in enumerate(arms):
        bars = [(position + (index - (len(arms) - 1) / 2) * width, s)
                for position, panel in enumerate(panels)
                for s in sensitivity_list
                if (s["optimizer"], s["key_dim"], s["arm"]) == (*panel, arm)]
        ax.bar([x for x, _ in bars], [s["mean"] for _, s in bars], width,
               yerr=[s["sd"] for _, s in bars], capsize=3, label=arm,
               color=colour(arm))
    ax.set_xticks(range(len(panels)))
    ax.set_xticklabels([f"{o}, d_k {d}" for o, d in panels])
    ax.set_ylabel("LR sensitivity (lower: more robust)")
    ax.set_title("Learning-rate sensitivity: mean over rates of "
                 "min(loss, init loss) − best loss")
    ax.legend(fontsize=8)
    return figure


def init_figure(rows):
    """Score std and normalized entropy at init against d_k, per mode."""
    figure, axes = new_figure(10, 3.8, 1, 2)
    modes = list(dict.fromkeys(row["mode"] for row in rows))
    for ax, (metric, label, log_y) in zip(axes[0], (
            ("score_std", "score std at init", True),
            ("entropy_normalized", "entropy / log(keys) at init", False))):
        series_panel(ax, [
            (mode, mode, [r["key_dim"] for r in mine],
             [r[metric]["mean"] for r in mine],
             [r[metric]["sd"] for r in mine])
            for mode in modes
            for mine in (sorted((r for r in rows if r["mode"] == mode),
                                key=lambda r: r["key_dim"]),)])
        ax.set_xscale("log", base=2)
        if log_y:
            ax.set_yscale("log")
        ax.set_xlabel("d_k")
        finish_panel(ax, label, "")
    figure.suptitle("At initialisation, per scale mode (± sd over seeds)")
    return figure


# (name, caption, figure of the sweep.json document).
FIGURES = (
    ("lr_loss_accuracy", "Final loss and accuracy against the learning rate "
     "(the Wortsman figure)", lambda document: lr_figure(document["curves"])),
    ("lr_sensitivity", "Learning-rate sensitivity per arm",
     lambda document: sensitivity_figure(document["sensitivity"])),
    ("lr_max_logit_entropy", "Final max attention logit and entropy against "
     "the learning rate",
     lambda document: diagnostics_figure(document["curves"])),
    ("init_by_key_dim", "Score std and entropy at init against d_k per "
     "scale mode", lambda document: init_figure(document["init_by_key_dim"])
     if document["init_by_key_dim"] else None),
)


def make_figures(document):
    """`[(name, caption, Figure)]` of the figures with data."""
    return draw_figures(FIGURES, document)
