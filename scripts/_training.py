"""The pipeline's trainer under measurement, for `bench_train.py`: the
resolved configuration, the run settings that keep
evaluation, diagnostics and checkpoints out of the way, the trainer's steady
throughput, and the instruments that time its diagnostics calls and take its
input pipeline out of the loop.

Apart from `_bench.py` because it needs the training pipeline, which
`bench_layer.py` and `bench_memory.py` do not.
"""

import contextlib
import itertools
import os
import statistics
import tempfile
import time

import _bench  # noqa: F401  (first: backend, log level, sys.path)

from keras_attention import dashboard as dashboard_module
from keras_attention.tasks import SequenceTask
from pipelines import steps as steps_module
from pipelines.builders import build_task
from pipelines.common import UsageError
from pipelines.settings import Layer
from pipelines.settings import resolve_config
from pipelines.tensorboard import read_event_scalars
from pipelines.train import train


def quiet_run_settings(steps):
    """Settings that leave a timed run of `steps` steps to its steps: the
    diagnostics interval past the end (only the calls at step 0 and at the
    last step), one evaluation and one checkpoint at the end, a small
    held-out set (evaluation is outside the timed windows; it only shortens
    the run) and no progress bar."""
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


def steady_steps_per_second(logdir, warmup):
    """Median of the trainer's logged `steps_per_second` windows that end
    after step `warmup` (all of them if none does)."""
    windows = read_event_scalars(os.path.join(logdir, "train")).get(
        "steps_per_second", {}
    )
    values = [value for step, value in sorted(windows.items())
              if step > warmup and value is not None]
    if not values:
        values = [value for value in windows.values() if value is not None]
    return statistics.median(values)


def train_and_time(config, warmup, prefix, contexts=()):
    """Runs `pipelines.train.train` on a temporary logdir inside `contexts`.

    Returns:
        `(steps_per_second, metrics)`: the steady throughput after `warmup`
        steps and the run's metrics.
    """
    with tempfile.TemporaryDirectory(prefix=prefix) as logdir:
        with contextlib.ExitStack() as stack:
            for context in contexts:
                stack.enter_context(context)
            metrics = train(config.replace(logdir=logdir))
        return steady_steps_per_second(logdir, warmup), metrics


@contextlib.contextmanager
def in_memory_data():
    """Replaces every task's training stream by its first batch, cached in
    memory and repeated (same sharding, shapes and dtypes)."""
    original = SequenceTask.batches

    def cached(self, *args, **kwargs):
        return itertools.repeat(next(original(self, *args, **kwargs)))

    SequenceTask.batches = cached
    try:
        yield
    finally:
        SequenceTask.batches = original


@contextlib.contextmanager
def timed_diagnostics(durations):
    """Appends the seconds of each diagnostics call of the trainer (probe and
    summary writing) to `durations`."""
    make_probe = steps_module.diagnostics_probe
    # The trainer writes through the library's `AttentionLogger`.
    write = dashboard_module.write_diagnostics
    pending = {}

    def timed_make_probe(model, *args, **kwargs):
        probe = make_probe(model, *args, **kwargs)
        # The trainer copies the weights into the probed model first; that
        # copy is part of the cost.
        set_weights = model.set_weights

        def timed_set_weights(*args, **kwargs):
            pending["start"] = time.perf_counter()
            return set_weights(*args, **kwargs)

        model.set_weights = timed_set_weights
        return probe

    def timed_write(*args, **kwargs):
        result = write(*args, **kwargs)
        durations.append(time.perf_counter() - pending.pop("start"))
        return result

    steps_module.diagnostics_probe = timed_make_probe
    dashboard_module.write_diagnostics = timed_write
    try:
        yield
    finally:
        steps_module.diagnostics_probe = make_probe
        dashboard_module.write_diagnostics = write
