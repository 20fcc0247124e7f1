"""What a sweep adds to TensorBoard: each run's end metrics in
`<run>/sweep/`, the metrics of the HParams experiment that the grid declares
at its root (`pipelines.engine`). The runs' own logs are those `train`
writes."""

import math
import os
import shutil

from keras_attention.events import SummaryWriter

HPARAMS_GROUP = "sweep"

# Tag -> (display name, the record's value).
END_METRICS = {
    "final_loss": ("final held-out loss", lambda r: r["final_loss"]),
    "final_accuracy": ("final held-out accuracy",
                       lambda r: r["final_accuracy"]),
    "steps_to_target": ("steps to target", lambda r: r["steps_to_target"]),
    "final_entropy_normalized": ("final entropy (normalized)",
                                 lambda r: r["final"]["entropy_normalized"]),
    "final_saturated_fraction": ("final saturated rows",
                                 lambda r: r["final"]["saturated_fraction"]),
    "final_max_abs_score": ("final max |q·k·scale|",
                            lambda r: r["final"]["max_abs_score"]),
    "diverged_at_step": ("diverged at step", lambda r: r["diverged_at_step"]),
}


def write_run_metrics(run_dir, record):
    """The record's end metrics as scalars in `run_dir/sweep/` (rewritten
    from scratch, so a rerun never duplicates them); non-finite or missing
    values are left out."""
    directory = os.path.join(run_dir, HPARAMS_GROUP)
    shutil.rmtree(directory, ignore_errors=True)
    with SummaryWriter(directory) as writer:
        for tag, (_, value_of) in END_METRICS.items():
            value = value_of(record)
            if value is not None and math.isfinite(float(value)):
                writer.scalar(tag, float(value), record["steps"] or 0)


# The sweep's HParams metrics: (tag, group, display name).
EXPERIMENT_METRICS = tuple((tag, HPARAMS_GROUP, display)
                           for tag, (display, _) in END_METRICS.items())
