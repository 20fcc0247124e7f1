"""The numbers behind the comparison's pictures, kept in comparison.json.

`collect_curves` reads every trained run's held-out curves from its event
files (`<run>/eval/`) and averages them over seeds, per (key_dim, arm) and
step: the `"curves"` of comparison.json, drawn by the custom-scalars layout
and by figure (a). `figure_data` gathers the init statistics over d_k per
arm: the `"figures"` of comparison.json, drawn by figures (b) to (d).
Figure (e) draws the `"heatmaps"` entries (probe weights and labels).
"""

import math
import os

from pipelines.compare.measure import group_init
from pipelines.engine.presets import PAIR
from pipelines.reports.numbers import mean_sd
from pipelines.reports.plotting import log2_axis
from pipelines.reports.plotting import new_figure
from pipelines.reports.plotting import series_panel
from pipelines.run_dir import EVAL_LOGS
from pipelines.tensorboard import read_event_scalars

# (name, tag in <run>/eval/, what the chart calls it).
CURVE_METRICS = (
    ("accuracy", "accuracy", "held-out accuracy"),
    ("loss", "loss", "held-out loss"),
    ("entropy_normalized", "attention/mean/entropy_normalized",
     "normalized entropy (probe)"),
    ("saturated_fraction", "attention/mean/saturated_fraction",
     "saturated fraction (probe)"),
    ("grad_norm_scores", "attention/mean/grad_norm_scores",
     "|dL/dscores| (probe)"),
)


def _series(by_seed):
    """Mean, sd and count per step of `[{step: value}]` (one per seed);
    values that are not finite (a diverged run's loss) are left out."""
    steps = sorted({step for values in by_seed for step in values})
    curve = {"steps": [], "mean": [], "sd": [], "count": []}
    for step in steps:
        values = [values[step] for values in by_seed
                  if values.get(step) is not None
                  and math.isfinite(values[step])]
        if not values:
            continue
        mean, sd = mean_sd(values)
        curve["steps"].append(step)
        curve["mean"].append(mean)
        curve["sd"].append(sd)
        curve["count"].append(len(values))
    return curve


def collect_curves(plan):
    """Per trained (key_dim, arm): each metric of `CURVE_METRICS` over the
    steps, mean ± sd over the seeds (sample sd, 0 for one seed); with other
    axes, of the runs in the grid's slice (`Grid.in_slice`).

    Returns:
        A list of `{"key_dim", "arm", "seeds", "metrics": {name: {"steps",
        "mean", "sd", "count"}}}`, in the plan's order.
    """
    runs = {}
    for spec in plan.runs():
        if spec.trained and plan.in_slice(spec.values):
            runs.setdefault((spec.values["key_dim"], spec.arm),
                            []).append(spec)
    curves = []
    for key_dim in plan.trained_axis("key_dim"):
        for arm in plan.arms:
            specs = runs.get((key_dim, arm), [])
            events = [read_event_scalars(os.path.join(spec.config.logdir,
                                                      EVAL_LOGS))
                      for spec in specs]
            curves.append({
                "key_dim": key_dim,
                "arm": arm,
                "seeds": [spec.values["seed"] for spec in specs],
                "metrics": {
                    name: _series([tags.get(tag, {}) for tags in events])
                    for name, tag, _ in CURVE_METRICS
                },
            })
    return curves


def _over_key_dims(grouped, key):
    """`{"key_dims", "mean", "sd"}` of the init statistic `key` of one arm."""
    key_dims = sorted(grouped)
    pairs = [mean_sd([summary[key] for summary in grouped[k]])
             for k in key_dims]
    return {"key_dims": key_dims, "mean": [m for m, _ in pairs],
            "sd": [s for _, s in pairs]}


def _ratios(grouped, key):
    """Unscaled over scaled mean of the init statistic `key` per key_dim
    both arms measured."""
    scaled, unscaled = grouped.get(PAIR[0], {}), grouped.get(PAIR[1], {})
    key_dims = sorted(set(scaled) & set(unscaled))
    values = []
    for key_dim in key_dims:
        numerator = mean_sd([s[key] for s in unscaled[key_dim]])[0]
        denominator = mean_sd([s[key] for s in scaled[key_dim]])[0]
        values.append(numerator / denominator if denominator else None)
    return {"key_dims": key_dims, "ratio": values}


def figure_data(plan, results):
    """The data of figures (b) to (d), from the init statistics of every
    run (trained and init-only).

    Returns:
        `{"init_entropy": {arm: {"key_dims", "mean", "sd"}}, "score_std":
        {arm: ...}, "sqrt_key_dim": {"key_dims", "value"}, "gradient_ratios":
        {"grad_norm_scores": {"key_dims", "ratio"}, "grad_norm_query":
        ...}}`; the ratios are unscaled/scaled means at init (empty without
        both arms).
    """
    grouped = group_init(results)
    arms = [arm for arm in plan.arms if arm in grouped]
    key_dims = sorted({k for arm in arms for k in grouped[arm]})
    return {
        "init_entropy": {arm: _over_key_dims(grouped[arm],
                                             "entropy_normalized")
                         for arm in arms},
        "score_std": {arm: _over_key_dims(grouped[arm], "score_std")
                      for arm in arms},
        "sqrt_key_dim": {"key_dims": key_dims,
                         "value": [math.sqrt(k) for k in key_dims]},
        "gradient_ratios": {key: _ratios(grouped, key)
                            for key in ("grad_norm_scores",
                                        "grad_norm_query")},
    }


def arms_over_key_dim(data):
    """`(figure, ax)`: one line ± sd per arm against d_k (log-2 axis) of
    `{arm: {"key_dims", "mean", "sd"}}` (`figure_data`), or None without
    data."""
    if not data:
        return None
    figure, axes = new_figure()
    ax = axes[0][0]
    series_panel(ax, [(arm, arm, s["key_dims"], s["mean"], s["sd"])
                      for arm, s in data.items()])
    log2_axis(ax, sorted({k for s in data.values() for k in s["key_dims"]}))
    return figure, ax
