"""What a comparison adds to TensorBoard: each run's HParams metrics (in
its `validation/`), the claims' scalars (`claims/`, `depth/`, `length*/`,
a tag per arm) and `curves/` (mean ± sd over seeds, a tag per arm and d_k).
`claims/` and `curves/` have a custom-scalars layout with every arm in one
chart (a run per arm made TensorBoard list 30 runs for a comparison of 6).
"""

import os

from tensorboard.plugins.custom_scalar import layout_pb2

from pipelines.compare.series import CURVE_METRICS
from pipelines.tensorboard import multiline_layout
from pipelines.tensorboard import write_end_metrics
from pipelines.tensorboard import write_points

CLAIMS_DIR = "claims"
CURVES_DIR = "curves"
CURVES_CATEGORY = "arms: mean ± sd over seeds"
CLAIMS_CATEGORY = "claims: each arm over d_k"
# Ends the name of the event file of a run's comparison metrics, which a
# rerun replaces.
METRICS_SUFFIX = ".comparison"

# The init statistics kept as HParams metrics.
_INIT_METRICS = ("entropy", "entropy_normalized", "score_std",
                 "grad_norm_scores")


def write_run_hparams_metrics(run_dir, record):
    """Writes one run's HParams metrics to `run_dir/validation/` at its last
    step, in an event file of their own that a rerun replaces (never
    duplicates); `steps_to_target` the run logged there itself."""
    values = {"final_accuracy": record["final_accuracy"]}
    for key in _INIT_METRICS:
        if record["init"] and record["init"].get(key) is not None:
            values[f"init_{key}"] = record["init"][key]
    write_end_metrics(run_dir, values, record["steps"] or 0, METRICS_SUFFIX)


# The comparison's HParams metrics, in each run's `validation/`: (tag,
# group, display name).
EXPERIMENT_METRICS = (
    ("final_accuracy", None, "final held-out accuracy"),
    ("steps_to_target", None, "steps to target"),
    ("init_entropy_normalized", None, "initial entropy (normalized)"),
    ("init_entropy", None, "initial entropy (nats)"),
    ("init_score_std", None, "initial score std"),
    ("init_grad_norm_scores", None, "initial |dL/dscores|"),
    ("accuracy", None, "held-out accuracy"),
)


def write_claim_scalars(logdir, points):
    """Rewrites each run of `{run: [(tag, value, step)]}` under `logdir`
    (an empty list removes it); `claims/` gets a chart per statistic."""
    for run, run_points in points.items():
        layout = None
        if run == CLAIMS_DIR:
            # `init/score_std/scaled` -> the chart `init/score_std`.
            charts = dict.fromkeys(tag.rsplit("/", 1)[0]
                                   for tag, _, _ in run_points)
            layout = multiline_layout(CLAIMS_CATEGORY, [
                (chart, chart + "/") for chart in charts])
        write_points(os.path.join(logdir, run), run_points, layout)


def curve_tag(curve, metric):
    """The tag prefix of one (arm, key_dim) curve of `metric`."""
    return f"{metric}/{curve['arm']}-dk{curve['key_dim']}"


def curves_layout(curves):
    """A margin chart per `CURVE_METRICS` entry, a series per curve (its
    `mean` between `lower` and `upper`)."""
    Series = layout_pb2.MarginChartContent.Series
    charts = [
        layout_pb2.Chart(
            title=title,
            margin=layout_pb2.MarginChartContent(series=[Series(
                value=f"{curve_tag(curve, name)}/mean",
                lower=f"{curve_tag(curve, name)}/lower",
                upper=f"{curve_tag(curve, name)}/upper")
                for curve in curves]),
        )
        for name, _, title in CURVE_METRICS
    ]
    return layout_pb2.Layout(category=[
        layout_pb2.Category(title=CURVES_CATEGORY, chart=charts)
    ])


def write_curve_scalars(logdir, curves):
    """Writes the curves to `logdir/curves/`: `<tag>/{mean,lower,upper}`
    (mean, mean - sd, mean + sd over seeds) per step, and their layout."""
    curves = [curve for curve in curves if curve["seeds"]]
    write_points(os.path.join(logdir, CURVES_DIR), [
        (f"{curve_tag(curve, name)}/{suffix}", value, step)
        for curve in curves
        for name, series in curve["metrics"].items()
        for step, mean, sd in zip(series["steps"], series["mean"],
                                  series["sd"])
        for suffix, value in (("mean", mean), ("lower", mean - sd),
                              ("upper", mean + sd))],
        curves_layout(curves))
