"""What `keras-attention train` does between the steps of Keras's `fit`:
`RunLoop`, the one callback that logs the train scalars of each window,
evaluates on the held-out set, runs the diagnostics, checkpoints, shows
the progress and stops a diverged run, at the steps each is due; and
`Progress`, the loop's state each checkpoint holds.

Nothing here waits for a step: the hooks run between `fit`'s compiled
calls (`on_train_batch_begin`, as `AttentionMonitor` does, so Keras keeps
its asynchronous dispatch on JAX and torch), read nothing unless something
is due, and a log window's loss and accuracy come from `fit`'s own
metrics, accumulated on the device: one small transfer a log.
"""

import dataclasses
import math
import time
from typing import Optional

import keras
import numpy as np


def due(step, every, last):
    """Whether a thing done every `every` steps (and at the last) is due."""
    return step % every == 0 or step == last


@dataclasses.dataclass
class Progress:
    """What the loop has measured so far: saved in each checkpoint
    (`state`), read back by the run that resumes from it (`restored`)."""

    history: list = dataclasses.field(default_factory=list)
    diagnostics_init: Optional[dict] = None
    diagnostics_final: Optional[dict] = None
    heldout_loss: Optional[float] = None
    heldout_accuracy: Optional[float] = None
    task: dict = dataclasses.field(default_factory=dict)  # heldout_scalars
    # The sums and counts of `fit`'s metrics since the last train log (its
    # metric variables'): a checkpoint between two logs keeps the next
    # log's mean whole.
    window: Optional[list] = None
    # `RunLogs.extent()` at the checkpoint, to cut the event files back to.
    logs: Optional[dict] = None
    diverged_at: Optional[int] = None  # Not saved: no save follows it.

    @classmethod
    def restored(cls, state):
        """The progress `state()` saved, or a new one for `None`."""
        if state is None:
            return cls()
        return cls(**{field.name: state[field.name]
                      for field in dataclasses.fields(cls)
                      if field.name != "diverged_at"})

    def state(self, logs):
        """The JSON-able progress, the event files' extent from `logs`."""
        state = {field.name: getattr(self, field.name)
                 for field in dataclasses.fields(self)
                 if field.name != "diverged_at"}
        state["logs"] = logs.extent()
        return state

    def evaluated(self, step, results, task, writer):
        """Records and logs `evaluate`'s `results` at `step`, with the
        `task`'s `heldout_scalars`."""
        loss, accuracy = float(results["loss"]), float(results["accuracy"])
        self.heldout_loss, self.heldout_accuracy = loss, accuracy
        self.task = task.heldout_scalars(loss, accuracy)
        self.history.append((step, accuracy))
        writer.scalars({"loss": loss, "accuracy": accuracy, **self.task},
                       step)


class RunLoop(keras.callbacks.Callback):
    """The run's work between `fit`'s steps (see the module docstring).

    Args:
        config: the resolved `TrainConfig`.
        start_step: the step `fit` starts from (the checkpoint's).
        progress: the run's `Progress`.
        logs: the run's `RunLogs`.
        evaluate: `evaluate()`, `evaluate`'s results on the held-out set.
        task: the run's task (its `heldout_scalars`).
        diagnose: `diagnose(step, images)`, the diagnostics record.
        checkpoints: the run's `Checkpoints`.
        schedule: the learning-rate schedule, logged with the window.
        display: the `StepDisplay`.
        on_log: `on_log(step)`, called at each log.
        chief: whether this process diagnoses.
    """

    def __init__(self, config, start_step, progress, logs, evaluate, task,
                 diagnose, checkpoints, schedule, display, on_log, chief):
        super().__init__()
        self.config, self.start_step = config, start_step
        self.progress, self.logs = progress, logs
        self.evaluate, self.task, self.diagnose = evaluate, task, diagnose
        self.checkpoints, self.schedule = checkpoints, schedule
        self.display, self.on_log, self.chief = display, on_log, chief
        self.step = self.window_step = start_step
        # The step whose metrics were last moved to `progress.window`.
        self.kept_at = None
        now = time.time()
        self.start = self.window_start = now
        self.paused = self.window_paused = 0.0
        # Seconds to the end of `fit`'s first call (tracing, compiling) and
        # the steps it ran.
        self.first_step, self.first_steps = None, 0

    # ------------------------------------------------------------ fit hooks
    def on_train_batch_begin(self, batch, logs=None):
        if batch == 0:
            return
        if self.first_step is None:
            # The first call has been traced, compiled and dispatched.
            self.first_step, self.first_steps = time.time() - self.start, batch
        self._at(self.start_step + batch)

    def on_train_end(self, logs=None):
        if self.progress.diverged_at is None:
            self._at(self.config.steps)

    # ------------------------------------------------------------- the work
    def _at(self, step):
        """Does what is due at `step` (all of `step`'s batches done)."""
        config, progress, steps = self.config, self.progress, \
            self.config.steps
        self.step = step
        if not any(due(step, every, steps) for every in (
                config.log_every, config.eval_every,
                config.diagnostics_every, config.checkpoint_every)):
            return
        model = self.model  # On JAX, the training state into the variables.
        if due(step, config.log_every, steps):
            if not math.isfinite(self._log_window(model, step)):
                return self._diverged(step)
        pause_start = time.time()
        if due(step, config.eval_every, steps):
            # `evaluate` resets `fit`'s metrics: the window so far is kept.
            self._keep_window(model, step)
            results = self.evaluate()
            model.reset_metrics()
            progress.evaluated(step, results, self.task, self.logs.eval)
            if not math.isfinite(progress.heldout_loss):
                return self._diverged(step)
            self.display.update(step, values=[
                ("heldout_accuracy", round(progress.heldout_accuracy, 4))])
        if self.chief and due(step, config.diagnostics_every, steps):
            progress.diagnostics_final = self.diagnose(
                step, images=due(step, config.heatmap_every, steps))
        if due(step, config.checkpoint_every, steps):
            self._keep_window(model, step)
            # Non-finite weights are not saved (the last good checkpoints
            # stay); the loss stops the loop at its next log or evaluation.
            self.checkpoints.save(step, self.logs)
        seconds = time.time() - pause_start
        self.paused += seconds
        self.window_paused += seconds

    def _log_window(self, model, step):
        """Logs the window's mean loss and accuracy (`fit`'s metrics, then
        reset), the learning rate and the throughput; returns the loss."""
        # The sums and counts of the loss tracker and the accuracy, and the
        # learning rate, in the log's one transfer.
        (loss_sum, loss_count, correct, weight), (learning_rate,) = \
            self._keep_window(model, step, [self.schedule(step - 1)])
        loss = loss_sum / max(loss_count, 1e-12)
        accuracy = correct / max(weight, 1e-12)
        self.progress.window = None
        now = time.time()
        seconds = max(now - self.window_start - self.window_paused, 1e-9)
        steps_per_second = (step - self.window_step) / seconds
        self.window_step, self.window_start = step, now
        self.window_paused = 0.0
        self.logs.train.scalars({
            "loss": loss,
            "accuracy": accuracy,
            "learning_rate": learning_rate,
            "steps_per_second": steps_per_second,
            "examples_per_second": steps_per_second * self.config.batch_size,
        }, step)
        self.display.update(step, values=[
            ("loss", round(loss, 4)), ("accuracy", round(accuracy, 4)),
            ("steps/s", round(steps_per_second, 1))])
        self.on_log(step)
        return loss

    def _keep_window(self, model, step, extra=()):
        """Adds `fit`'s metric sums to `progress.window` and resets them,
        once a step (they are zero after); returns the window and the
        values of the `extra` scalars, fetched in the same transfer."""
        if self.kept_at == step and not extra:
            return self.progress.window, []
        values = keras.ops.convert_to_numpy(keras.ops.stack([
            keras.ops.cast(value, "float32") for value in
            [*model.metrics_variables, *extra]])).astype(np.float64)
        count = len(values) - len(extra)
        window = values[:count]
        if self.progress.window is not None:
            window = window + np.asarray(self.progress.window)
        self.progress.window = window.tolist()
        model.reset_metrics()
        self.kept_at = step
        return self.progress.window, values[count:].tolist()

    def _diverged(self, step):
        self.progress.diverged_at = step
        self.model.stop_training = True

    def steps_per_second(self):
        """`(steps/s, training seconds)` of the loop. Throughput leaves out
        the first call, which traces and compiles."""
        steps_run = self.step - self.start_step
        train_time = max(time.time() - self.start - self.paused, 1e-9)
        if self.first_step is not None and steps_run > self.first_steps \
                and train_time > self.first_step:
            return ((steps_run - self.first_steps)
                    / (train_time - self.first_step), train_time)
        return steps_run / train_time, train_time
