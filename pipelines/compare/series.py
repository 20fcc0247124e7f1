"""The numbers behind the comparison's figures, kept in comparison.json:
the held-out curves over steps (`collect_curves`, its `"curves"`) and the
init statistics over d_k (`figure_data`, its `"figures"`)."""

import math
import os
from operator import itemgetter

from pipelines.compare.measure import document_arms
from pipelines.compare.measure import init_stats
from pipelines.engine.presets import PAIR
from pipelines.reports.numbers import over_seeds
from pipelines.reports.numbers import ratio
from pipelines.reports.plotting import finish_panel
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
    """Mean, sd and count per step of `[{step: value}]`, finite values."""
    points = [{"step": step, "value": value} for values in by_seed
              for step, value in values.items()
              if value is not None and math.isfinite(value)]
    stats = sorted(over_seeds(points, ("step",), itemgetter("value")).items())
    return {"steps": [step for (step,), _ in stats],
            "mean": [s["mean"] for _, s in stats],
            "sd": [s["sd"] for _, s in stats],
            "count": [len(s["values"]) for _, s in stats]}


def collect_curves(plan):
    """Per trained (key_dim, arm) in the grid's slice: `{"key_dim", "arm",
    "seeds", "metrics": {name: {"steps", "mean", "sd", "count"}}}`, each
    metric of `CURVE_METRICS` over the steps, mean ± sd over the seeds."""
    curves = []
    for key_dim in plan.trained_axis("key_dim"):
        for arm in plan.arms:
            specs = [spec for spec in plan.trained_runs() if spec.arm == arm
                     and spec.values["key_dim"] == key_dim
                     and plan.in_slice(spec.values)]
            events = [read_event_scalars(os.path.join(spec.config.logdir,
                                                      EVAL_LOGS))
                      for spec in specs]
            curves.append({
                "key_dim": key_dim, "arm": arm,
                "seeds": [spec.values["seed"] for spec in specs],
                "metrics": {
                    name: _series([tags.get(tag, {}) for tags in events])
                    for name, tag, _ in CURVE_METRICS
                },
            })
    return curves


def _key_dims(stats, arm):
    return sorted(key_dim for name, key_dim in stats if name == arm)


def _over_key_dims(stats, arm):
    """`{"key_dims", "mean", "sd"}` of one arm's `init_stats`."""
    key_dims = _key_dims(stats, arm)
    return {"key_dims": key_dims,
            "mean": [stats[arm, k]["mean"] for k in key_dims],
            "sd": [stats[arm, k]["sd"] for k in key_dims]}


def _ratios(stats):
    """Unscaled over scaled mean per key_dim both arms measured."""
    scaled, unscaled = PAIR
    key_dims = sorted(set(_key_dims(stats, scaled))
                      & set(_key_dims(stats, unscaled)))
    return {"key_dims": key_dims,
            "ratio": [ratio(stats[unscaled, k]["mean"],
                            stats[scaled, k]["mean"]) for k in key_dims]}


def figure_data(plan, results):
    """The init statistics over d_k of every run (trained and init-only):
    `{"init_entropy": {arm: {"key_dims", "mean", "sd"}}, "score_std": ...,
    "sqrt_key_dim": {"key_dims", "value"}, "gradient_ratios":
    {"grad_norm_scores": {"key_dims", "ratio"}, "grad_norm_query": ...}}`,
    the ratios unscaled over scaled means (empty without both arms)."""
    stats = {key: init_stats(results, key) for key in (
        "entropy_normalized", "score_std", "grad_norm_scores",
        "grad_norm_query")}
    measured = {arm for arm, _ in stats["score_std"]}
    arms = [arm for arm in plan.arms if arm in measured]
    key_dims = sorted({k for arm, k in stats["score_std"] if arm in arms})
    return {
        "init_entropy": {arm: _over_key_dims(stats["entropy_normalized"],
                                             arm) for arm in arms},
        "score_std": {arm: _over_key_dims(stats["score_std"], arm)
                      for arm in arms},
        "sqrt_key_dim": {"key_dims": key_dims,
                         "value": [math.sqrt(k) for k in key_dims]},
        "gradient_ratios": {key: _ratios(stats[key]) for key in (
            "grad_norm_scores", "grad_norm_query")},
    }


def arms_over_key_dim(data, ylabel, title, unit=False, draw=None):
    """A figure of a line ± sd per arm against d_k (log-2 axis) of `{arm:
    {"key_dims", "mean", "sd"}}` and what `draw(ax)` adds, or None without
    data."""
    if not data:
        return None
    figure, axes = new_figure()
    ax = axes[0][0]
    series_panel(ax, [(arm, arm, s["key_dims"], s["mean"], s["sd"])
                      for arm, s in data.items()])
    log2_axis(ax, sorted({k for s in data.values() for k in s["key_dims"]}))
    if draw is not None:
        draw(ax)
    finish_panel(ax, ylabel, title, unit=unit)
    return figure


def arms_panel(ax, document, rows, x, key, xlabel, ylabel, title, sd=None):
    """A panel of a line per arm of `key` in [0, 1] against `x` (log-2 axis)
    over `rows` of `{x: value, "arms": {arm: {key: ...}}}`, ± the arm's
    `sd` (a key) when given."""
    xs = [row[x] for row in rows]
    series_panel(ax, [
        (arm, arm, xs, [row["arms"][arm][key] for row in rows],
         sd and [row["arms"][arm][sd] or 0.0 for row in rows])
        for arm in document_arms(document, rows[0]["arms"])],
        spread="errorbar" if sd else "none")
    log2_axis(ax, xs, xlabel)
    finish_panel(ax, ylabel, title, unit=True)
