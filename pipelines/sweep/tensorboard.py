"""Each sweep run's end metrics in its `validation/` run, the metrics of
the grid's HParams experiment."""

import math

from pipelines.tensorboard import write_end_metrics

# Ends the name of the event file of a run's sweep metrics.
METRICS_SUFFIX = ".sweep"

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
    """The record's finite end metrics as scalars in
    `run_dir/validation/`."""
    values = {}
    for tag, (_, value_of) in END_METRICS.items():
        value = value_of(record)
        # steps_to_target: the run logged it there itself.
        if (tag != "steps_to_target" and value is not None
                and math.isfinite(float(value))):
            values[tag] = value
    write_end_metrics(run_dir, values, record["steps"] or 0, METRICS_SUFFIX)


# The sweep's HParams metrics: (tag, group, display name).
EXPERIMENT_METRICS = tuple((tag, None, display)
                           for tag, (display, _) in END_METRICS.items())
