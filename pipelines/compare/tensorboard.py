"""What a comparison adds to TensorBoard: each run's HParams metrics (the
experiment at the root is the grid's, `pipelines.engine`), the claim
scalars over d_k, and
the arms' curves (mean and ± sd over seeds) with a custom-scalars layout of
margin charts, one chart per metric, every arm in it.
"""

import os
import shutil

import numpy as np
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import metadata as custom_scalar_metadata

from keras_attention.events import SummaryWriter
from pipelines.compare.claims import group_final_accuracy
from pipelines.compare.claims import group_init
from pipelines.compare.series import CURVE_METRICS

CLAIMS_DIR = "claims"
CURVES_DIR = "curves"
CURVES_CATEGORY = "arms: mean ± sd over seeds"
HPARAMS_GROUP = "compare"

# The init statistics plotted over d_k, and those kept as HParams metrics.
_CLAIM_SCALARS = ("score_std", "entropy_normalized", "saturated_fraction",
                  "grad_norm_scores")
_INIT_METRICS = ("entropy", "entropy_normalized", "score_std",
                 "grad_norm_scores")


def _write_scalars(directory, values, step):
    with SummaryWriter(directory) as writer:
        for tag, value in values.items():
            writer.scalar(tag, float(value), int(step))


def write_run_hparams_metrics(run_dir, record, steps):
    """Writes the HParams metrics of one run to `run_dir/compare/`.

    Tags: `final_accuracy`, `steps_to_target` (when reached),
    `init_entropy`, `init_entropy_normalized`, `init_score_std`,
    `init_grad_norm_scores`, all at step `steps`. The directory is rewritten
    from scratch, so rerunning a comparison never duplicates them.
    """
    directory = os.path.join(run_dir, HPARAMS_GROUP)
    shutil.rmtree(directory, ignore_errors=True)
    values = {"final_accuracy": record["final_accuracy"]}
    if record["steps_to_target"] is not None:
        values["steps_to_target"] = record["steps_to_target"]
    for key in _INIT_METRICS:
        if record["init"] and record["init"].get(key) is not None:
            values[f"init_{key}"] = record["init"][key]
    _write_scalars(directory, values, steps)


# The comparison's HParams metrics: (tag, group, display name).
EXPERIMENT_METRICS = (
    ("final_accuracy", HPARAMS_GROUP, "final held-out accuracy"),
    ("steps_to_target", HPARAMS_GROUP, "steps to target"),
    ("init_entropy_normalized", HPARAMS_GROUP,
     "initial entropy (normalized)"),
    ("init_entropy", HPARAMS_GROUP, "initial entropy (nats)"),
    ("init_score_std", HPARAMS_GROUP, "initial score std"),
    ("init_grad_norm_scores", HPARAMS_GROUP, "initial |dL/dscores|"),
    ("accuracy", "eval", "held-out accuracy"),
)


def write_claim_scalars(logdir, results):
    """Per-arm scalars over d_k in `logdir/claims/<arm>/` (step = d_k)."""
    root = os.path.join(logdir, CLAIMS_DIR)
    shutil.rmtree(root, ignore_errors=True)
    for arm, by_key_dim in group_init(results).items():
        with SummaryWriter(os.path.join(root, arm)) as writer:
            for key_dim, summaries in sorted(by_key_dim.items()):
                for key in _CLAIM_SCALARS:
                    writer.scalar(
                        f"init/{key}",
                        float(np.mean([s[key] for s in summaries])),
                        key_dim,
                    )
            for key_dim, accuracies in sorted(
                group_final_accuracy(results, arm).items()
            ):
                writer.scalar("final/accuracy", float(np.mean(accuracies)),
                              key_dim)


def curves_layout():
    """The custom-scalars layout: one margin chart per `CURVE_METRICS`
    entry, its series `<metric>/mean` between `<metric>/lower` and
    `<metric>/upper` (every arm's run draws one line with its band)."""
    Series = layout_pb2.MarginChartContent.Series
    charts = [
        layout_pb2.Chart(
            title=title,
            margin=layout_pb2.MarginChartContent(series=[Series(
                value=f"{name}/mean", lower=f"{name}/lower",
                upper=f"{name}/upper")]),
        )
        for name, _, title in CURVE_METRICS
    ]
    return layout_pb2.Layout(category=[
        layout_pb2.Category(title=CURVES_CATEGORY, chart=charts)
    ])


def curves_run_name(curve):
    """The TensorBoard run of one (arm, key_dim) curve, under the logdir."""
    return f"{CURVES_DIR}/{curve['arm']}-dk{curve['key_dim']}"


def write_curve_scalars(logdir, curves):
    """Writes each arm's curves to `logdir/curves/<arm>-dk<key_dim>/`:
    `<metric>/{mean,lower,upper}` (mean, mean - sd, mean + sd over seeds)
    at each step, and the custom-scalars layout (in every such run; the
    plugin merges identical charts). Rewritten from scratch each time."""
    shutil.rmtree(os.path.join(logdir, CURVES_DIR), ignore_errors=True)
    # What the plugin's `summary.pb` builds (it imports TensorFlow): the
    # serialized layout as a string scalar under the plugin's config tag.
    layout = curves_layout().SerializeToString()
    for curve in curves:
        if not curve["seeds"]:
            continue
        with SummaryWriter(os.path.join(logdir,
                                        curves_run_name(curve))) as writer:
            writer.tensor(custom_scalar_metadata.CONFIG_SUMMARY_TAG, layout,
                          0, custom_scalar_metadata.create_summary_metadata())
            for name, series in curve["metrics"].items():
                for step, mean, sd in zip(series["steps"], series["mean"],
                                          series["sd"]):
                    for suffix, value in (("mean", mean),
                                          ("lower", mean - sd),
                                          ("upper", mean + sd)):
                        writer.scalar(f"{name}/{suffix}", value, step)
