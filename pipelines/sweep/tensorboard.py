"""What a sweep adds to TensorBoard: each run's end metrics in
`<run>/sweep/`, and the HParams experiment (arm, optimizer, learning rate,
d_k, seed) at the sweep's root, so the parallel-coordinates view shows the
whole grid. The runs' own logs are those `train` writes."""

import glob
import math
import os
import shutil

from keras_attention.events import SummaryWriter
from pipelines import tensorboard as pipeline_tensorboard

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


def write_sweep_experiment(logdir, plan):
    """Declares the sweep's HParams experiment at `logdir`, replacing the
    one an earlier invocation wrote."""
    for path in glob.glob(os.path.join(logdir, "events.out.tfevents.*")):
        os.remove(path)
    hparams = {
        "arm": plan.arms,
        "optimizer": plan.optimizers,
        "learning_rate": [float(rate) for rate in plan.learning_rates],
        "key_dim": plan.key_dims,
        "seed": plan.seeds,
        **dict.fromkeys(("scale", "qk_norm", "task", "d_model")),
    }
    metrics = [(tag, HPARAMS_GROUP, display)
               for tag, (display, _) in END_METRICS.items()]
    with SummaryWriter(logdir) as writer:
        pipeline_tensorboard.write_experiment(writer, hparams, metrics)
