"""`AttentionMonitor`: attention in TensorBoard from any `model.fit`.

Floor 2: a `keras.callbacks.Callback` driving `keras_attention.dashboard`'s
`AttentionLogger` (the probe and the summaries the training pipeline writes
too) and writing with `keras_attention.events.SummaryWriter`, so it runs
without TensorFlow, on every Keras backend.

What a log costs the training thread: the compiled probe's dispatch (its
statistics reduced on the device, `keras_attention.diagnostics.reductions`);
the one transfer of its small outputs to the host, the host's arithmetic,
the event encoding and the writes run on one writer thread, in order, and
an error there is raised at the next hook or at the end of `fit`.

Overhead at `update_freq=100`, measured by `scripts/bench_callback.py`
(one run per backend) on its default model, the recall task's
`build_sequence_model` at the training pipeline's defaults (1 layer, 1
head, d_model 64, batch 64), `(x, y)` examples of 16, 1000 steps a fit
(500 for the second TensorFlow row), median of 3 (5) interleaved fits, on
2 idle CPU cores on 2026-12-04, the statistics on the device and the
writes on the writer thread:

| backend    | fit with / without, wall | CPU time | in its hooks |
|------------|--------------------------|----------|--------------|
| tensorflow | 1.127 (1.084)            | 0.934 (0.992) | 0.5% (0.6%) |
| jax        | 0.938                    | 0.931    | 0.5%         |
| torch      | 1.017                    | 1.018    | 0.8%         |

On TensorFlow the wall-clock cost is not in the hooks and not in the CPU
time; with the writes made synchronous again the same fits measured 1.301
wall, 1.046 CPU: the writer thread removed most of it, what is left was
not found. A first `fit` also compiles the probe (TensorFlow about 1 s,
JAX about 3.7 s), kept for later fits of the same model.
"""

import collections
import concurrent.futures
import logging
import os

import keras
import numpy as np

from keras_attention.dashboard import DASHBOARD_EXAMPLES
from keras_attention.dashboard import AttentionLogger
from keras_attention.dashboard import is_finite
from keras_attention.diagnostics import diagnostics_probe
from keras_attention.events import SummaryWriter
from keras_attention.recording import attention_layers
from keras_attention.validation import check_int

_LOG = logging.getLogger("keras_attention")


class AttentionMonitor(keras.callbacks.Callback):
    """Logs a model's attention to TensorBoard while `model.fit` trains it.

    At step 0 (before the first batch), every `update_freq` batches and
    after the last batch it probes every attention layer of the model on
    `examples` (a forward pass with `training=False`, and a backward pass
    of the model's compiled loss when the examples have targets) and
    writes, to `log_dir/train` as `keras.callbacks.TensorBoard` does:

    * `attention/<layer>/maps`: each head's map of the first
      `dashboard_examples` examples, for TensorBoard's ATTENTION tab;
    * per layer and head, the normalized entropy, max weight, saturated
      fraction (`attention/<layer>/<statistic>/head<h>`) and the score std
      before the softmax (`attention/<layer>/score_std`), the layers' means
      (`attention/mean/...`) and, with targets, the norms of the loss's
      gradient at the scores and W_Q, W_K, W_V (`gradients/<layer>/...`);
    * `attention/diverged`: 0, or 1 at a step whose trained weights or
      statistics were not finite (nothing else is written at that step;
      one warning line is logged the first time);
    * with `log_metrics`, fit's loss and metrics at each epoch's end, as
      Keras's `TensorBoard` callback writes them: no need for that
      callback beside this one (it overrides `on_train_batch_end`, which
      makes `fit` wait for every batch on JAX and torch).

    Steps count the batches since `fit` began, whatever the model's
    `steps_per_execution`: with several batches a call, a log falls at the
    first call that starts at or after each multiple of `update_freq`
    (exactly on it when `update_freq` is a multiple of
    `steps_per_execution`) and is written at the batch count of that
    call's start. Training is not changed: the probe reads the weights (on
    JAX, after the state sync Keras's own callbacks use), draws no random
    numbers and updates no variable, metric or optimizer state.

    A log costs the training loop one dispatch of the compiled probe; the
    statistics are reduced on the device and fetched, encoded and written
    on a writer thread, in order. An error there (a refused write) is
    raised at the next batch's hook or at the end of `fit`.

    Args:
        log_dir: the run's directory (as for `keras.callbacks.TensorBoard`).
        examples: a batch the model takes: its inputs `x` (an array, a list
            or a dict), or `(x, y)` / `(x, y, sample_weight)` for the
            gradient statistics, unpacked as `fit` unpacks a tuple
            (`keras.utils.unpack_x_y_sample_weight`: give several inputs
            as a list or a dict).
        update_freq: log every this many batches (a positive integer).
        labels: token labels of the examples for the maps' axes: one list
            of strings per example, or a function from `x` to such lists;
            `None` labels positions.
        loss: optional `loss(y_true, y_pred, sample_weight)` for the
            gradient statistics; by default the loss the model was compiled
            with (one loss for its one output).
        dashboard_examples: examples shown in the ATTENTION tab.
        max_images: examples drawn per head as labelled heat maps in the
            Images tab at every logging step (0, the default: drawing costs
            about 30 ms a map).
        log_metrics: also write `fit`'s loss and metrics at each epoch's end
            (`epoch_<name>` in `log_dir/train` and `log_dir/validation`, as
            `keras.callbacks.TensorBoard` writes them); `False` where
            Keras's callback writes them to the same `log_dir`.

    Raises:
        ValueError: naming the argument: a bad `update_freq`,
            `dashboard_examples`, `max_images` or `labels`, `log_dir` that
            is a file, or empty `examples` (here); `examples` the model
            cannot take, a model without attention layers, or targets
            without a loss (when `fit` starts, before the first batch and
            before anything is written).

    Example:

    ```python
    monitor = AttentionMonitor("logs", examples=(x_val[:8], y_val[:8]))
    model.fit(x, y, epochs=3, callbacks=[monitor])
    # tensorboard --logdir logs
    ```
    """

    def __init__(self, log_dir, examples, update_freq=100, labels=None,
                 loss=None, dashboard_examples=DASHBOARD_EXAMPLES,
                 max_images=0, log_metrics=True):
        super().__init__()
        self.log_dir = _check_log_dir(log_dir)
        self.update_freq = check_int(update_freq, "update_freq")
        self._dashboard_examples = check_int(dashboard_examples,
                                             "dashboard_examples")
        self._max_images = check_int(max_images, "max_images", minimum=0,
                                     expected="a non-negative integer")
        self._x, self._y, self._sample_weight = _unpack(examples)
        if labels is not None and not callable(labels) and not isinstance(
            labels, (list, tuple, np.ndarray)
        ):
            raise ValueError(
                "`labels` must be a list of token labels per example, a "
                f"function from the inputs to them, or None; received "
                f"{type(labels).__name__}."
            )
        self._labels = labels
        self._loss = loss
        self.log_metrics = bool(log_metrics)
        self._writers = {}
        self._logger = None
        self._probe = None
        self._queue = _WriteQueue()
        self._epoch_start = self._step = 0
        self._logged = None
        self._warned = False

    # ------------------------------------------------------------ fit hooks
    def on_train_begin(self, logs=None):
        """Checks the model against the examples, then logs step 0."""
        self._close()
        self._epoch_start = self._step = 0
        self._logged, self._warned = None, False
        self._logger = None  # Set once the checks pass: nothing before.
        logger = self._make_logger(self.model)
        diagnostics = _first_probe(logger)
        try:
            self._writers["train"] = SummaryWriter(
                os.path.join(self.log_dir, "train"))
        except OSError as error:
            raise ValueError(
                f"`log_dir` {self.log_dir!r} cannot hold event files: "
                f"{error}") from error
        self._logger = logger
        self._logged = 0
        self._write(diagnostics, 0)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self._step

    def on_train_batch_begin(self, batch, logs=None):
        # Step `k` is logged here, before the call that starts at batch
        # `k` (its weights are those after `k` batches), not in
        # `on_train_batch_end`: a callback that overrides that hook makes
        # `fit` wait for every batch's logs on JAX and torch (Keras then
        # dispatches the batch hooks synchronously).
        self._queue.raise_failure()
        self._step = self._epoch_start + batch
        if (self._logger is not None
                and self._step // self.update_freq
                > self._logged // self.update_freq):
            self._log(self._step)

    def on_epoch_end(self, epoch, logs=None):
        # The batches of the epoch: Keras's count where it knows it, else
        # one call's worth after the last call's start.
        steps = (self.params or {}).get("steps")
        self._step = self._epoch_start + (
            steps if steps else self._step - self._epoch_start
            + _steps_per_call(self.model))
        if self._logger is None or not self.log_metrics or not logs:
            return
        # Read to the host on the writer thread, not here.
        self._queue.submit(self._write_metrics, dict(logs), epoch)

    def on_train_end(self, logs=None):
        try:
            if self._logger is not None and self._logged != self._step:
                self._log(self._step)
            self._queue.wait()
        finally:
            self._close()

    # ------------------------------------------------------------- helpers
    def _make_logger(self, model):
        if not attention_layers(model):
            raise ValueError(
                f"`model` {model.name!r} has no attention layer for "
                "AttentionMonitor to log.")
        loss = None
        if self._y is not None:
            loss = self._loss or _compiled_loss(model)
        labels = self._labels
        if callable(labels):
            labels = labels(self._x)
        key = (model, self._loss if self._loss is not None
               else getattr(model, "loss", None))
        if self._probe is None or any(
            a is not b for a, b in zip(self._probe[0], key)
        ):
            # Compiled once per model and loss, kept for its next `fit`: a
            # `tf.function` on TensorFlow, a `jax.jit` on JAX (the eager
            # probe cost about 3x more per call; compiling the JAX one took
            # about 3 s). Only the maps written leave the device.
            self._probe = (key, diagnostics_probe(
                model, loss,
                maps=max(self._dashboard_examples, self._max_images)))
        return AttentionLogger(
            self._probe[1],
            self._x, self._y, self._sample_weight, labels=labels,
            dashboard_examples=self._dashboard_examples,
            max_images=self._max_images,
        )

    def _log(self, step):
        # Reading `self.model` syncs JAX's training state into the
        # variables, as Keras's own callbacks do before reading weights.
        self.model  # noqa: B018
        self._logged = step
        logger = self._logger
        pending = logger.dispatch()
        self._queue.submit(
            lambda: self._write(logger.collect(pending), step))

    def _write(self, diagnostics, step):
        writer = self._writer("train")
        if not is_finite(diagnostics):
            if not self._warned:
                _LOG.warning(
                    "AttentionMonitor: the model diverged (non-finite "
                    "weights or attention statistics) at step %d; marked "
                    "in attention/diverged, maps not logged.", step)
                self._warned = True
            writer.scalar("attention/diverged", 1.0, step)
            return
        self._logger.write(diagnostics, step, writer)
        writer.scalar("attention/diverged", 0.0, step)

    def _write_metrics(self, values, epoch):
        for name, value in values.items():
            run = "validation" if name.startswith("val_") else "train"
            self._writer(run).scalar(
                f"epoch_{name[4:] if run == 'validation' else name}",
                float(value), epoch)

    def _writer(self, run):
        if run not in self._writers:
            self._writers[run] = SummaryWriter(os.path.join(self.log_dir,
                                                            run))
        return self._writers[run]

    def _close(self):
        self._queue.wait(raise_failure=False)
        for writer in self._writers.values():
            writer.close()
        self._writers = {}


class _WriteQueue:
    """One writer thread running the submitted writes in order; the first
    failure is raised by the next `raise_failure` or `wait`."""

    def __init__(self):
        self._executor = None
        self._pending = collections.deque()

    def submit(self, function, *args):
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="AttentionMonitor")
        self._pending.append(self._executor.submit(function, *args))

    def raise_failure(self):
        """Raises the first failure among the writes done."""
        while self._pending and self._pending[0].done():
            self._pending.popleft().result()

    def wait(self, raise_failure=True):
        """Waits for every submitted write; raises the first failure."""
        failure = None
        while self._pending:
            error = self._pending.popleft().exception()
            failure = failure or error
        if failure is not None and raise_failure:
            raise failure


def _steps_per_call(model):
    """The batches one call of `model`'s train function runs."""
    steps = getattr(model, "steps_per_execution", 1)
    return int(steps) if isinstance(steps, (int, np.integer)) else 1


def _check_log_dir(log_dir):
    try:
        log_dir = os.fspath(log_dir)
    except TypeError:
        raise ValueError(f"`log_dir` must be a path; received "
                         f"{type(log_dir).__name__}.") from None
    for path in (log_dir, os.path.join(log_dir, "train")):
        if os.path.exists(path) and not os.path.isdir(path):
            raise ValueError(f"`log_dir` must be a directory; {path!r} is a "
                             "file.")
    return log_dir


def _first_probe(logger):
    """The diagnostics at step 0; `ValueError` naming `examples` where the
    model cannot take them, or `labels` where they do not fit the maps."""
    try:
        diagnostics = logger.probe()
    except Exception as error:
        raise ValueError(
            f"`examples` could not be probed: the model cannot take them "
            f"({type(error).__name__}: {error})") from error
    if is_finite(diagnostics):
        try:
            logger.check(diagnostics)
        except ValueError as error:
            raise ValueError(f"`labels` do not fit the attention maps: "
                             f"{error}") from error
    return diagnostics


def _unpack(examples):
    """`(x, y, sample_weight)` of `examples`, as host arrays."""
    if examples is None:
        raise ValueError("`examples` must be a batch of model inputs; "
                         "received None.")
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(examples)
    to_host = keras.tree.map_structure(
        lambda value: None if value is None else np.asarray(value),
        (x, y, sample_weight),
    )
    leaves = keras.tree.flatten(to_host[0])
    if not leaves or any(np.ndim(leaf) == 0 or len(leaf) == 0
                         for leaf in leaves):
        raise ValueError("`examples` must hold a batch of at least one "
                         "example for every model input.")
    return to_host


def _compiled_loss(model):
    """`loss(y_true, y_pred, sample_weight)` of the model's compiled loss
    (without `compute_loss`'s per-output loss metrics, which would count
    the probe in `fit`'s logs)."""
    loss = getattr(model, "loss", None)
    if loss is None or keras.tree.is_nested(loss):
        raise ValueError(
            "`examples` holds targets, but the model was compiled without "
            "a single loss to differentiate; compile it with one, pass "
            "`loss=`, or give `examples` without targets.")
    loss = keras.losses.get(loss)
    if not isinstance(loss, keras.losses.Loss):
        loss = _FunctionLoss(loss)

    def compiled_loss(y_true, y_pred, sample_weight):
        return loss(y_true, y_pred, sample_weight=sample_weight)

    return compiled_loss


class _FunctionLoss(keras.losses.Loss):
    """A loss function `fn(y_true, y_pred)` with `Loss`'s weighting and
    reduction, as `compile` wraps one."""

    def __init__(self, fn):
        super().__init__(name=getattr(fn, "__name__", "loss"))
        self.fn = fn

    def call(self, y_true, y_pred):
        return self.fn(y_true, y_pred)
