"""The two training loops under measurement, for `bench_train.py`: the
pipeline's trainer (`pipelines.train.train`) and Keras's `Model.fit` on the
same model, batches, optimizer and weighted loss, each timed over its steps
after a warm-up by the wall and CPU clocks, without a per-step host sync;
and the instrument that times the trainer's diagnostics calls.

Apart from `_bench.py` because it needs the training pipeline, which
`bench_layer.py` and `bench_memory.py` do not.
"""

import contextlib
import tempfile
import time
from typing import NamedTuple

import _bench  # noqa: F401  (first: backend, log level, sys.path)
from _bench import keras

from keras_attention import scan_train_steps
from pipelines import train as train_module
from pipelines.builders import build_model
from pipelines.builders import build_optimizer
from pipelines.builders import build_task
from pipelines.builders import seed_run
from pipelines.common import UsageError
from pipelines.settings import Layer
from pipelines.settings import resolve_config


class Timing(NamedTuple):
    """One timed run: `steps` steps in `wall_s` seconds of elapsed time and
    `cpu_s` seconds of this process's CPU time (all its threads), after
    `start_s` wall seconds of building, compiling and warming up."""

    start_s: float
    wall_s: float
    cpu_s: float
    steps: int


def read_clocks():
    """`(wall, cpu)`: `time.perf_counter()` and `time.process_time()`."""
    return time.perf_counter(), time.process_time()


def _timing(start, first, last, steps):
    return Timing(first[0] - start[0], last[0] - first[0],
                  last[1] - first[1], steps)


def quiet_run_settings(steps):
    """Settings that leave a timed run of `steps` steps to its steps: the
    diagnostics interval past the end (only the calls at step 0 and at the
    last step), one evaluation and one checkpoint at the end, a small
    held-out set and no progress bar."""
    return dict(
        diagnostics_every=10 * steps,
        eval_every=steps,
        checkpoint_every=steps,
        heldout_size=256,
        verbose=0,
    )


def resolved_config(prog, settings):
    """The validated `TrainConfig` of `settings` (given as one layer over the
    defaults) and its task; a bad setting exits 2 with one line."""
    try:
        config = resolve_config([Layer(prog, settings)])
        config.validate()
    except UsageError as error:
        _bench.fail(prog, error, status=2)
    return config, build_task(config)


def _stream(config, task, start_step=0):
    """The trainer's training stream from `start_step` (one process)."""
    return task.batches(config.batch_size, config.seed,
                        start_step=start_step, train_size=config.train_size)


# ------------------------------------------------------------ the trainer
def time_trainer(config, warmup, contexts=()):
    """Runs `pipelines.train.train(config)` on a temporary logdir inside
    `contexts` and times its steps after step `warmup`.

    The clocks are read at the trainer's log intervals (its `progress`
    argument), which come right after it has read the window's metrics to
    the host: from the log at step `warmup` (a multiple of
    `config.log_every`) to the log at the last step. What the loop does in
    between is timed with the steps (logging; diagnostics when due);
    evaluation, the checkpoint and the diagnostics at the end come after.

    Returns:
        `(Timing, model)`: the timing and the trained model.
    """
    marks = {}
    start = read_clocks()
    with tempfile.TemporaryDirectory(prefix="bench-train-") as logdir:
        with contextlib.ExitStack() as stack:
            for context in contexts:
                stack.enter_context(context)
            _, model = train_module.train(
                config.replace(logdir=logdir), return_model=True,
                progress=lambda step: marks.setdefault(step, read_clocks()))
    steps = config.steps - warmup
    return _timing(start, marks[warmup], marks[config.steps], steps), model


# ------------------------------------------------------------ Model.fit
class _EpochClock(keras.callbacks.Callback):
    """Reads the clocks when an epoch begins and when it ends.

    No batch hook: overriding `on_train_batch_end` would turn off Keras's
    asynchronous batch-end dispatch on JAX and torch. By `on_epoch_end` the
    logs are host values; reading one weight to the host also waits for
    the epoch's last step on any backend.
    """

    def __init__(self):
        super().__init__()
        self.marks = []

    def on_epoch_begin(self, epoch, logs=None):
        self.marks.append(read_clocks())

    def on_epoch_end(self, epoch, logs=None):
        keras.ops.convert_to_numpy(self.model.trainable_variables[-1])
        self.marks.append(read_clocks())


def time_fit(config, task, warmup, steps_per_execution, scan=False):
    """`Model.fit` as a user would write it for the trainer's run of
    `config`: the same model (`build_model`, weights drawn after
    `seed_run(config.seed)` as the trainer draws them), optimizer and
    schedule (`build_optimizer`), the task's weighted cross-entropy (the
    weighted mean over positions, `reduction="mean_with_sample_weight"`)
    and weighted accuracy, the trainer's `jit_compile`, and the trainer's
    stream of `(tokens, targets, weights)` batches as a Python generator.

    A first `fit` of `warmup` steps compiles and warms up; a second, of the
    remaining `config.steps - warmup` batches of the stream, is timed from
    the start of its epoch to its end (`_EpochClock`). With `scan`, the
    model's train function is `keras_attention.scan_train_steps`' (one
    compiled `lax.scan` a call on JAX).

    Returns:
        `(Timing, model)`: the timing and the trained model.
    """
    start = read_clocks()
    seed_run(config.seed)
    model = build_model(config, task)
    optimizer, _ = build_optimizer(config)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="mean_with_sample_weight"),
        weighted_metrics=["sparse_categorical_accuracy"],
        jit_compile=config.jit_compile == "on",
        steps_per_execution=steps_per_execution,
    )
    if scan:
        scan_train_steps(model)
    model.fit(_stream(config, task), steps_per_epoch=warmup, verbose=0,
              shuffle=False)
    clock = _EpochClock()
    steps = config.steps - warmup
    model.fit(_stream(config, task, warmup), steps_per_epoch=steps,
              verbose=0, shuffle=False, callbacks=[clock])
    first, last = clock.marks
    return _timing(start, first, last, steps), model


def time_data(config, task, warmup):
    """The stream alone: its batches `warmup .. config.steps - 1` drawn
    and dropped, as a `Timing` (`start_s` 0)."""
    stream = _stream(config, task, warmup)
    first = read_clocks()
    for _ in range(config.steps - warmup):
        next(stream)
    return _timing(first, first, read_clocks(), config.steps - warmup)


# ------------------------------------------------------------ diagnostics
@contextlib.contextmanager
def timed_diagnostics(durations):
    """Appends the seconds of each diagnostics call of the trainer (the
    whole call its loop makes: state sync, probe, summaries and record) to
    `durations`."""
    make_diagnose = train_module.make_diagnose

    def timed_make_diagnose(*args, **kwargs):
        diagnose = make_diagnose(*args, **kwargs)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return diagnose(*args, **kwargs)
            finally:
                durations.append(time.perf_counter() - start)

        return timed

    train_module.make_diagnose = timed_make_diagnose
    try:
        yield
    finally:
        train_module.make_diagnose = make_diagnose
