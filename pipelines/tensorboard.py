"""TensorBoard: reading a run's events back, writing them once, HParams.

Events are read by `keras_attention.events.read_events`, not TensorBoard's
`EventFileLoader`, which imports TensorFlow whenever it is installed and
put its start-up lines on the stderr of every resumed JAX or torch run.
HParams protos come from the plugin's `summary_v2` (its `api` imports
TensorFlow).
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
from pipelines.common import writing
from pipelines.run_dir import EVAL_LOGS
from pipelines.run_dir import TRAIN_LOGS
from pipelines.settings import HPARAMS
from pipelines.settings import value_types

# The HParams metrics of one training run, all in `validation/`, where its
# HParams session is: TensorBoard looks a metric up in the session's run
# and below (`<session>/<group>`), so the session cannot sit beside them.
RUN_METRICS = (
    ("accuracy", None, "heldout_accuracy"),
    ("loss", None, "heldout_loss"),
    ("steps_to_target", None, "steps_to_target"),
)


def read_event_scalars(directory):
    """The summaries in `directory` (not below) as `{tag: {step: value}}`,
    `value` a float for float scalars, else `None`. A record cut short by a
    crash ends the read of its file."""
    values = {}
    if not os.path.isdir(directory):
        return values
    # Escaped: a run directory's name may hold glob characters ("[").
    pattern = os.path.join(glob.escape(directory), "events.out.tfevents.*")
    for path in sorted(glob.glob(pattern)):
        for event in read_events(path):
            for value in event.summary.value:
                values.setdefault(value.tag, {})[int(event.step)] = (
                    _scalar(value))
    return values


def _scalar(value):
    if value.HasField("tensor"):
        array = make_ndarray(value.tensor)
        if array.shape == () and array.dtype.kind == "f":
            return float(array)
        return None
    if value.HasField("simple_value"):
        return float(value.simple_value)
    return None


class LogWriter:
    """A summary writer of `directory` that skips the steps an earlier,
    killed run of the same command logged (`previous`, `{tag: {step:
    value}}`), so a resumed run logs each step once. Only the chief writes:
    `writer` is a `SummaryWriter`, else a `DiscardingWriter`; write to it
    inside `writing()`, which says a refused write in one line."""

    def __init__(self, directory, is_chief):
        self.directory = directory
        self.previous = read_event_scalars(directory) if is_chief else {}
        self.last_logged = max(
            (step for by_step in self.previous.values() for step in by_step),
            default=-1)
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
        """`common.writing`, naming the event file."""
        return writing(f"the event file in {self.directory}")


class DiscardingWriter:
    """A non-chief worker's `SummaryWriter`: its methods write nothing."""

    closed = False

    def _discard(self, *args, **kwargs):
        return None

    scalar = histogram = image = text = tensor = write_summary = _discard
    flush = close = _discard


class RunLogs(NamedTuple):
    """A run's two event directories (`run_dir`'s map). Nothing is written
    at the run's root, which TensorBoard would list as a third run."""

    train: LogWriter
    eval: LogWriter


def open_run_logs(logdir, is_chief):
    return RunLogs(LogWriter(os.path.join(logdir, TRAIN_LOGS), is_chief),
                   LogWriter(os.path.join(logdir, EVAL_LOGS), is_chief))


def write_end_metrics(run_dir, values, step, suffix):
    """Writes a grid's `{tag: value}` end metrics of one run at `step` in
    the run's `validation/` (beside its HParams session), in an event file
    ending in `suffix` that replaces an earlier report's: a rerun never
    duplicates them. A refused write raises `OSError`."""
    directory = os.path.join(run_dir, EVAL_LOGS)
    pattern = os.path.join(glob.escape(directory),
                           "events.out.tfevents.*" + suffix)
    for path in glob.glob(pattern):
        os.remove(path)
    with SummaryWriter(directory, filename_suffix=suffix) as writer:
        for tag, value in values.items():
            writer.scalar(tag, float(value), int(step))


def write_points(directory, points, layout=None):
    """Rewrites the TensorBoard run `directory` from scratch: `(tag, value,
    step)` scalars over an axis (d_k, depth, length, the step), and a
    custom-scalars `layout`. None values are left out; no point, no run."""
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


def hparams_of(config):
    """The set settings declared `hparam=True`, as values of one type per
    name (text for a setting that takes text or a number: `scale`)."""
    values = {}
    for name in HPARAMS:
        value = getattr(config, name)
        if value is not None:
            kinds = value_types(name)
            values[name] = kinds[0](value) if len(kinds) == 1 else str(value)
    return values


def write_experiment(writer, hparams, metrics):
    """Declares an HParams experiment with `writer`, a `SummaryWriter` at
    its root (TensorBoard reads one per logdir).

    Args:
        hparams: `{name: values}`; `values` lists a discrete domain, or is
            `None` for any value.
        metrics: `(tag, group, display_name)` tuples; `group` is the
            subdirectory the tag is logged in, `None` for the root.
    """
    # Step 0, as `hp.hparams_config` writes it.
    writer.write_summary(hp.hparams_config_pb(
        hparams=[hp.HParam(name, None if values is None
                           else hp.Discrete(list(values)))
                 for name, values in hparams.items()],
        metrics=[hp.Metric(tag, group=group, display_name=display_name)
                 for tag, group, display_name in metrics]), 0)


def write_run_header(writer, config, hparams_experiment=True):
    """Writes the config as text and as HParams at step 0 of a run's
    `validation/` `LogWriter`, once (not again on resuming)."""
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
        trial_id = os.path.basename(os.path.abspath(config.logdir))
        writer.writer.write_summary(
            hp.hparams_pb(hparams, trial_id=trial_id), 0)
        writer.writer.text("config", "```\n" + text + "\n```", 0)
    writer.flush()


def summary_from_events(tags, step):
    """The `attention/mean/*` diagnostics logged at `step`, as
    `{"summary": {...}}`, or `None`."""
    prefix = "attention/mean/"
    summary = {tag[len(prefix):]: by_step[step]
               for tag, by_step in tags.items()
               if tag.startswith(prefix) and by_step.get(step) is not None}
    return {"summary": summary} if summary else None
