"""Train a toy attention model on a synthetic task, with attention diagnostics.

    keras-attention train --task recall --key-dim 64 --scale sqrt --steps 1000

A run writes under `--logdir DIR` (see `pipelines.run_dir`):

    DIR/config.json        the resolved config (flags, file and task defaults)
    DIR/vocab.json         the text task's characters and their labels
    DIR/checkpoints/       weights, optimizer and loop state; a rerun
                           resumes from the newest
    DIR/model.keras        the trained model
    DIR/metrics.json       held-out loss/accuracy, steps, wall time,
                           examples/s, steps to target, diagnostics at step
                           0 and end
    DIR/train/events.*     loss, accuracy, learning_rate, steps/s, examples/s
    DIR/validation/events.*  config (text), HParams, steps_to_target,
                           held-out loss and accuracy (text: bits per
                           character and the unigram baseline), the attention
                           diagnostics: attention/<layer>/... (heat maps,
                           entropy, max weight, saturation, score std) and
                           gradients/<layer>/... (norms of dL/dW_Q, W_K, W_V
                           and of dL/dscores)

The loop is Keras's `fit`, as a user trains, on every backend; what the
run does between its steps (logs, evaluation, diagnostics on the trained
model, checkpoints, divergence) is one callback, `pipelines.loop.RunLoop`.
The diagnostics run on the chief only.

A run killed at any point, or stopped by a full disk, and started again
with the same command resumes from its last whole checkpoint: the data are
a pure function of `(seed, step)`, so it sees the batches the killed one
would have. The checkpoint holds the loop's state (`_Progress`: the
evaluation history, the diagnostics records, how far each event file had
got), which the resume reads back; the event files are cut back to that
point, so each step is logged once (`tensorboard.open_run_logs`). One
process writes a run directory.
"""

import os
import sys
import time

import keras
import numpy as np

from pipelines.backends import backend_module
from pipelines.builders import build_probe_batch
from pipelines.builders import build_task
from pipelines.checkpoints import CHECKPOINT_DIR
from pipelines.checkpoints import Checkpoints
from pipelines.checkpoints import last_checkpointed_step
from pipelines.common import UsageError
from pipelines.common import write_json_atomic
from pipelines.devices import check_memory
from pipelines.devices import open_run_devices
from pipelines.export import check_out_path
from pipelines.export import export_run
from pipelines.flags import add_train_arguments
from pipelines.flags import config_from_args
from pipelines.run_dir import METRICS_FILE
from pipelines.run_dir import MODEL_FILE
from pipelines.run_dir import check_resumable
from pipelines.run_dir import completed_metrics
from pipelines.run_dir import restore_model
from pipelines.run_dir import save_model
from pipelines.run_dir import write_run_config
from pipelines.run_dir import writing_run
from pipelines.settings import flag
from pipelines.loop import Progress
from pipelines.loop import RunLoop
from pipelines.step_display import StepDisplay
from pipelines.steps import build_parts
from pipelines.steps import heldout_feed
from pipelines.steps import make_diagnose
from pipelines.steps import train_feed
from pipelines.tensorboard import open_run_logs
from pipelines.tensorboard import write_run_header


# ---------------------------------------------------------- command line
add_arguments = add_train_arguments


def run(args):
    """Runs `keras-attention train` for parsed `args`; returns the exit
    status."""
    config = config_from_args(args)
    config.validate()  # Bad flags are refused even on a finished run.
    complete = completed_metrics(config)
    if complete is not None:
        done = "nothing to do"
        if config.export is not None:
            check_out_path(config.export, flag="--export")  # train's words
            written, _ = export_run(config.logdir, config.export)
            done = f"exported it to {written}"
        print(f"keras-attention train: the run in {config.logdir} is "
              f"complete ({complete['steps']} steps); {done}")
        return 0
    metrics = train(config)
    if metrics.get("diverged_at_step") is not None:
        print("keras-attention train: error: "
              + diverged_line(config, metrics["diverged_at_step"]),
              file=sys.stderr)
        return 1
    bits = metrics.get("heldout_bits_per_character")
    print(
        f"held-out accuracy {metrics['heldout_accuracy']:.4f}, loss "
        f"{metrics['heldout_loss']:.4f}"
        + ("" if bits is None else f", {bits:.3f} bits per character "
           f"(unigram {metrics['heldout_unigram_bits_per_character']:.3f})")
        + f" after {metrics['steps']} steps "
        f"({metrics['wall_time_s']:.1f} s, "
        f"{metrics['examples_per_s']:.0f} examples/s); run in "
        f"{metrics['logdir']}"
    )
    return 0


# ------------------------------------------------ numbers not finite
# The settings that shape the initial scores (`--scale`, `--qk-init-std`,
# `--qk-init-gain`) are each fine alone; what overflows is their product
# with the model's sizes and dtype (`--qk-init-gain 1e30` and `--scale
# 3.4e38` made the softmax NaN and ended in a traceback from the dashboard
# writer). No bound on one flag says when: the initial model's forward pass
# does.
INIT_SETTINGS = ("scale", "qk_init_std", "qk_init_gain")


def check_finite_start(config, model, tokens):
    """Raises `UsageError`, one line naming the init settings given (else
    all of them), when the initial `model`'s outputs on `tokens` are not
    finite."""
    outputs = keras.ops.convert_to_numpy(model(tokens, training=False))
    if np.all(np.isfinite(outputs)):
        return
    given = [name for name in INIT_SETTINGS
             if config.sources.get(name, "default") != "default"]
    named = ", ".join(f"{flag(name)} {getattr(config, name)}"
                      for name in given or INIT_SETTINGS)
    raise UsageError(
        f"{named}: the model's outputs at initialisation are not finite "
        f"(the attention scores overflow {config.precision}); lower "
        f"{' or '.join(flag(name) for name in given or INIT_SETTINGS)}"
    )


def diverged_line(config, step):
    """The one line of a run that stopped at `step` on a non-finite loss:
    what to lower, and the last good checkpoint kept."""
    kept = last_checkpointed_step(os.path.join(config.logdir, CHECKPOINT_DIR))
    return (
        f"the loss became non-finite at step {step}; lower --learning-rate"
        + (" or --weight-decay" if config.weight_decay else "")
        + " or set --clip-norm"
        + ("" if kept is None else f" (last good checkpoint: step {kept})")
    )


# ------------------------------------------------------------- train
def train(config, return_model=False, hparams_experiment=True, reuse=None,
          progress=None):
    """Trains the config's model on its task and writes the run directory,
    resuming from the last checkpoint in `config.logdir` when there is one.

    Args:
        config: a resolved `TrainConfig`.
        return_model: also return the trained model (a host copy).
        hparams_experiment: declare this run's HParams experiment; a grid
            of runs under one logdir declares one at its root instead
            (TensorBoard reads one experiment per logdir).
        reuse: optional `reuse(config, devices, task)` returning the
            `pipelines.steps.Parts` to train with, in place of
            `build_parts` (a grid keeps its compiled model across runs).
        progress: optional `progress(step)`, called at each log interval.

    Returns:
        The metrics written to `metrics.json`, and with `return_model=True`
        the tuple `(metrics, model)`.

    Raises:
        UsageError: before anything is written, on bad settings, a logdir
            holding another run or locked, a taken `--export` path or
            damaged checkpoints.
        EnvironmentFailure: a refused write.

    Example:

    ```python
    config = resolve_config([Layer("demo", {"task": "reverse", "steps": 500})])
    metrics = train(config)
    ```
    """
    start_time = time.time()
    # -------- settings: everything is checked before anything is written.
    config.validate()
    if config.verbose:
        # A text task scans its corpus (about 20 s), and the first step
        # waits for tracing and compiling.
        print(f"preparing the {config.task} task and compiling the model "
              "(the first step waits for it)", flush=True)
    config, devices = open_run_devices(config)
    task = build_task(config)
    check_memory(config, task)
    check_resumable(config)
    finished = completed_metrics(config)  # Rerun: no byte of it changes.
    if finished is not None:
        return (finished, restore_model(config.logdir)) if return_model \
            else finished
    if config.export is not None:
        # Now, not after training: a taken or unwritable path would
        # otherwise fail only once the run is done.
        check_out_path(config.export, flag="--export")
    # Process-wide switches (TensorFlow's op determinism stays on after).
    backend_module(config.backend).prepare(config)
    previous_policy = keras.config.dtype_policy()
    try:
        keras.config.set_dtype_policy(config.precision)
        with writing_run(config.logdir, devices.chief):
            metrics, model = _train(
                config, devices, task, start_time, hparams_experiment, reuse,
                on_log=progress or (lambda step: None))
    finally:
        keras.config.set_dtype_policy(previous_policy)
    return (metrics, model) if return_model else metrics


def _train(config, devices, task, start_time, hparams_experiment, reuse,
           on_log):
    logdir, steps, chief = config.logdir, config.steps, devices.chief

    # -------- the model, compiled for `fit` and identical on every replica
    # and worker; or that of an earlier run of the same shapes, reset to
    # this run's initial weights (a grid's `reuse`).
    parts = (build_parts if reuse is None else reuse)(config, devices, task)
    model = parts.model

    # -------- checkpoint: resume where the last run of this command stopped,
    # with the loop's state saved beside the weights.
    checkpoints = Checkpoints(logdir, model, parts.optimizer, chief)
    start_step = checkpoints.start_step
    progress = Progress.restored(checkpoints.restored)

    probe = build_probe_batch(config, task)
    if start_step == 0:  # Before anything is written.
        check_finite_start(config, parts.synced_host_model(), probe[0])

    # -------- run directory and event files, cut back to the checkpoint.
    if chief:
        write_run_config(logdir, config, task)
    logs = open_run_logs(logdir, chief, start_step, progress.logs)
    checkpoints.state = lambda: progress.state(logs)
    write_run_header(logs.eval, config, hparams_experiment)

    # -------- data: every step's global batch is a function of (seed, step);
    # this process feeds its rows of it.
    heldout, heldout_batches = heldout_feed(task, config, devices)

    def evaluate():
        return model.evaluate(heldout(), steps=heldout_batches, verbose=0,
                              return_dict=True)

    diagnose = make_diagnose(parts, probe, logs.eval, task)

    # -------- the loop: Keras's `fit`, the run's work between its calls.
    display = StepDisplay(steps, config.verbose if chief else 0,
                          config.log_every)
    display.update(min(start_step, steps))
    if start_step == 0:
        progress.evaluated(0, evaluate(), task, logs.eval)
        if chief:
            progress.diagnostics_init = diagnose(0)
    loop = RunLoop(config, start_step, progress, logs, evaluate, task,
                   diagnose, checkpoints, parts.schedule, display, on_log,
                   chief)
    if start_step < steps:
        model.fit(train_feed(task, config, devices, start_step),
                  steps_per_epoch=steps - start_step, callbacks=[loop],
                  shuffle=False,
                  verbose=0)
    step = loop.step
    steps_per_second, train_time = loop.steps_per_second()

    # -------- the end. The last step was evaluated and diagnosed in the
    # loop, or before the final checkpoint this run resumed from.
    if progress.diverged_at is None:
        parts.synced_host_model()
        if chief:
            save_model(parts.host_model, os.path.join(logdir, MODEL_FILE))
    steps_to_target = next((s for s, accuracy in progress.history
                            if accuracy >= config.target_accuracy), None)
    if steps_to_target is not None and chief:
        logs.eval.scalars({"steps_to_target": float(steps_to_target)}, step)
    for writer in logs:
        writer.close()

    metrics = {
        "task": config.task,
        "arm": config.arm,
        "logdir": logdir,
        "heldout_loss": progress.heldout_loss,
        "heldout_accuracy": progress.heldout_accuracy,
        **{f"heldout_{name}": value for name, value in progress.task.items()},
        "steps": step,
        "resumed_from_step": start_step,
        "wall_time_s": time.time() - start_time,
        "train_time_s": train_time,
        "first_step_time_s": loop.first_step,
        "steps_per_s": steps_per_second,
        "examples_per_s": steps_per_second * config.batch_size,
        "steps_to_target": steps_to_target,
        "target_accuracy": config.target_accuracy,
        "eval_history": [[s, accuracy] for s, accuracy in progress.history],
        "diagnostics": {"init": progress.diagnostics_init,
                        "final": progress.diagnostics_final},
        "backend": config.backend,
        "num_replicas": devices.num_replicas,
        "device_count": devices.device_count,
        "accelerator": devices.accelerator,
        "strategy": devices.strategy,
        "precision": config.precision,
        "jit_compile": config.jit_compile == "on",
        "diverged_at_step": progress.diverged_at,
    }
    if chief:
        write_json_atomic(os.path.join(logdir, METRICS_FILE), metrics)
        if config.export is not None and progress.diverged_at is None:
            export_run(logdir, config.export)
    return metrics, parts.host_model
