"""TensorBoard: reading a run's events back, writing them once, HParams.

Events are read with `keras_attention.events.read_events`, which stops at
a record cut short by a crash: TensorBoard's `EventFileLoader` imports
TensorFlow whenever it is installed (through `tensorboard.compat`), which
put TensorFlow's start-up lines on the stderr of every resumed JAX or torch
run. `LogWriter` skips the steps an
earlier, killed run already logged, through the library's TensorFlow-free
`SummaryWriter`. The HParams helpers (`hparams_of`, `write_experiment`)
serve both `train` and `compare`; they build the HParams protos with the
plugin's `summary_v2` (its `api` module imports TensorFlow).
"""

import glob
import json
import os
import re
import shutil
from typing import NamedTuple

from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import metadata as custom_scalar_metadata
from tensorboard.plugins.hparams import summary_v2 as hp
from tensorboard.util.tensor_util import make_ndarray

from keras_attention.events import SummaryWriter
from keras_attention.events import read_events
from pipelines.failures import writing
from pipelines.settings import HPARAMS
from pipelines.settings import value_types
from pipelines.run_dir import EVAL_LOGS
from pipelines.run_dir import TRAIN_LOGS

# The HParams metrics of one training run, all in `validation/`, where its
# HParams session is: TensorBoard looks a metric up in the session's run
# and below (`<session>/<group>`), so the session cannot sit beside them.
RUN_METRICS = (
    ("accuracy", None, "heldout_accuracy"),
    ("loss", None, "heldout_loss"),
    ("steps_to_target", None, "steps_to_target"),
)


def read_event_scalars(directory):
    """Reads the summaries under `directory` (not recursive).

    Returns:
        `{tag: {step: value}}`, `value` a float for scalar summaries and
        `None` for the others. A record cut short by a crash ends the read of
        its file.
    """
    values = {}
    if not os.path.isdir(directory):
        return values
    # Escaped: a run directory's name may hold glob characters ("[").
    pattern = os.path.join(glob.escape(directory), "events.out.tfevents.*")
    for path in sorted(glob.glob(pattern)):
        for event in read_events(path):
            for value in event.summary.value:
                values.setdefault(value.tag, {})[int(event.step)] = (
                    _scalar(value)
                )
    return values


def _scalar(value):
    """A summary value as a float when it is a float scalar, else `None`."""
    if value.HasField("tensor"):
        array = make_ndarray(value.tensor)
        if array.shape == () and array.dtype.kind == "f":
            return float(array)
        return None
    if value.HasField("simple_value"):
        return float(value.simple_value)
    return None


def last_logged_step(tags):
    """The last step of any tag in `{tag: {step: value}}`, or -1."""
    steps = [step for by_step in tags.values() for step in by_step]
    return max(steps) if steps else -1


class LogWriter:
    """A summary writer that skips steps an earlier, killed run of the same
    command already logged, so a resumed run logs each step once.

    Args:
        directory: the event directory.
        is_chief: whether this process writes; other workers get a writer
            that writes nothing.

    Attributes:
        previous: `{tag: {step: value}}` logged here before.
        writer: the `keras_attention.events.SummaryWriter` (a
            `DiscardingWriter` on other workers). Its writes raise a refused
            write as `OSError` from the call that wrote: write inside
            `writing()`.

    Raises:
        WriteFailure: if the event file cannot be made.
    """

    def __init__(self, directory, is_chief):
        self.directory = directory
        self.previous = read_event_scalars(directory) if is_chief else {}
        self.last_logged = last_logged_step(self.previous)
        with self.writing():
            self.writer = (SummaryWriter(directory) if is_chief
                           else DiscardingWriter())

    def wants(self, step):
        """Whether `step` is past everything logged here before."""
        return step > self.last_logged

    def scalars(self, values, step):
        """Logs `{tag: value}` at `step`, each tag only past its last step
        logged before (a kill can land between two tags of one step)."""
        with self.writing():
            for tag, value in values.items():
                if step > max(self.previous.get(tag, {-1: None})):
                    self.writer.scalar(tag, value, step)

    def flush(self):
        with self.writing():
            self.writer.flush()

    def close(self):
        with self.writing():
            self.writer.close()

    def writing(self):
        """The guard of a write to `writer`: a refused write becomes a
        `WriteFailure` naming the event file's directory."""
        return writing(f"the event file in {self.directory}")


class DiscardingWriter:
    """What a non-chief worker logs to: `SummaryWriter`'s methods, each
    writing nothing (only the chief writes the run's events)."""

    closed = False

    def _discard(self, *args, **kwargs):
        return None

    scalar = histogram = image = text = tensor = write_summary = _discard
    flush = close = _discard


class RunLogs(NamedTuple):
    """A run's two event directories, TensorBoard's two runs of it, as
    Keras's `TensorBoard` callback names them: `train/` (the steps) and
    `validation/` (held-out evaluation, diagnostics, the config and
    HParams, steps_to_target). Nothing is written at the run's root, which
    TensorBoard would list as a third run."""

    train: LogWriter
    eval: LogWriter


def open_run_logs(logdir, is_chief):
    """The `RunLogs` of the run directory `logdir`."""
    return RunLogs(
        LogWriter(os.path.join(logdir, TRAIN_LOGS), is_chief),
        LogWriter(os.path.join(logdir, EVAL_LOGS), is_chief),
    )


def write_end_metrics(run_dir, values, step, suffix):
    """Writes a grid's `{tag: value}` end metrics of one run at `step`, in
    the run's `validation/` (beside its HParams session), in an event file
    of their own, ending in `suffix`, that replaces the one an earlier
    report wrote: a rerun never duplicates them.

    Raises:
        OSError: when a write is refused.
    """
    directory = os.path.join(run_dir, EVAL_LOGS)
    pattern = os.path.join(glob.escape(directory),
                           "events.out.tfevents.*" + suffix)
    for path in glob.glob(pattern):
        os.remove(path)
    with SummaryWriter(directory, filename_suffix=suffix) as writer:
        for tag, value in values.items():
            writer.scalar(tag, float(value), int(step))


def write_points(directory, points, layout=None):
    """Rewrites the TensorBoard run `directory` from scratch: scalars over
    an axis (d_k, depth, length, the step), each point `(tag, value,
    step)`; None values are left out, and without a point there is no run.
    `layout`: a custom-scalars `Layout` written with them."""
    shutil.rmtree(directory, ignore_errors=True)
    points = [(tag, value, step) for tag, value, step in points
              if value is not None]
    if not points:
        return
    with SummaryWriter(directory) as writer:
        if layout is not None:
            # What the plugin's `summary.pb` builds (it imports
            # TensorFlow): the serialized layout as a string scalar under
            # the plugin's config tag.
            writer.tensor(custom_scalar_metadata.CONFIG_SUMMARY_TAG,
                          layout.SerializeToString(), 0,
                          custom_scalar_metadata.create_summary_metadata())
        for tag, value, step in points:
            writer.scalar(tag, float(value), int(step))


def multiline_layout(category, charts):
    """A custom-scalars layout of multiline charts `(title, tag prefix)`,
    every tag under a prefix in its chart."""
    return layout_pb2.Layout(category=[layout_pb2.Category(
        title=category,
        chart=[layout_pb2.Chart(
            title=title,
            multiline=layout_pb2.MultilineChartContent(
                tag=["^" + re.escape(prefix)]))
            for title, prefix in charts])])


# ------------------------------------------------------------------ HParams
def hparams_of(config):
    """The config's HParams: the settings declared `hparam=True` that are
    set, as plain values of one type per name (text for a setting that
    takes text or a number, such as `scale`)."""
    values = {}
    for name in HPARAMS:
        value = getattr(config, name)
        if value is not None:
            kinds = value_types(name)
            values[name] = kinds[0](value) if len(kinds) == 1 else str(value)
    return values


def write_experiment(writer, hparams, metrics):
    """Declares an HParams experiment with a summary writer.

    TensorBoard reads one experiment per logdir: a pipeline that trains many
    runs under one logdir declares it once, at the root.

    Args:
        writer: a `SummaryWriter` at the experiment's root.
        hparams: `{name: values}`; `values` lists a discrete domain, or is
            `None` for any value.
        metrics: `(tag, group, display_name)` tuples; `group` is the
            subdirectory the tag is logged in, `None` for the root.
    """
    # Step 0, as `hp.hparams_config` writes it.
    writer.write_summary(hp.hparams_config_pb(
        hparams=[
            hp.HParam(name, None if values is None
                      else hp.Discrete(list(values)))
            for name, values in hparams.items()
        ],
        metrics=[
            hp.Metric(tag, group=group, display_name=display_name)
            for tag, group, display_name in metrics
        ],
    ), 0)


def write_run_header(writer, config, hparams_experiment=True):
    """The config as text and as HParams, at step 0 of a run's
    `validation/` `LogWriter` (once: a resumed run does not write it
    again)."""
    if not writer.wants(0):
        return
    hparams = hparams_of(config)
    text = json.dumps(config.to_dict(), indent=2, sort_keys=True)
    with writer.writing():
        if hparams_experiment:
            write_experiment(writer.writer, dict.fromkeys(hparams),
                             RUN_METRICS)
        # One session per run directory: runs that share a trial id are
        # merged into one row of the HParams dashboard.
        writer.writer.write_summary(hp.hparams_pb(
            hparams, trial_id=os.path.basename(
                os.path.abspath(config.logdir))), 0)
        writer.writer.text("config", "```\n" + text + "\n```", 0)
    writer.flush()


def summary_from_events(tags, step):
    """The `attention/mean/*` diagnostics summary logged at `step`, as
    `{"summary": {...}}`, or `None` when none was logged."""
    prefix = "attention/mean/"
    summary = {
        tag[len(prefix):]: by_step[step]
        for tag, by_step in tags.items()
        if tag.startswith(prefix) and by_step.get(step) is not None
    }
    return {"summary": summary} if summary else None
