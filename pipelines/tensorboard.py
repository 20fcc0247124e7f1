"""TensorBoard: a run's event files (written once per step, cut back to
a checkpoint on resuming), reading events back, HParams.

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
from tensorboard.plugins.custom_scalar import (
    metadata as custom_scalar_metadata)
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
    for path in _event_files(directory):
        for event in read_events(path):
            for value in event.summary.value:
                values.setdefault(value.tag, {})[int(event.step)] = (
                    _scalar(value))
    return values


def _event_files(directory, suffix=""):
    """The event files in `directory` (not below) whose names end in
    `suffix`, sorted."""
    # Escaped: a run directory's name may hold glob characters ("[").
    return sorted(glob.glob(os.path.join(
        glob.escape(directory), "events.out.tfevents.*" + suffix)))


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
    """A summary writer of `directory` for the steps from `first_step` on
    (a resumed run's steps up to its checkpoint are on disk already). Only
    the chief writes: `writer` is a `SummaryWriter`, else a
    `DiscardingWriter`; write to it inside `writing()`, which says a
    refused write in one line."""

    def __init__(self, directory, is_chief, first_step=0):
        self.directory, self.first_step = directory, first_step
        with self.writing():
            self.writer = (SummaryWriter(directory) if is_chief
                           else DiscardingWriter())

    def wants(self, step):
        """Whether `step` is this run's to log (not the resumed run's)."""
        return step >= self.first_step

    def scalars(self, values, step):
        """Logs `{tag: value}` at `step`."""
        with self.writing():
            for tag, value in values.items():
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

    def extent(self):
        """`{directory name: {event file name: size}}` of the run's event
        files now: what a checkpoint records for `open_run_logs`."""
        return {os.path.basename(logs.directory): {
                    os.path.basename(path): os.path.getsize(path)
                    for path in _event_files(logs.directory)}
                for logs in self}


def open_run_logs(logdir, is_chief, start_step=0, extent=None):
    """The `RunLogs` of a run starting at `start_step` (0: from scratch),
    logging its steps after that (from 0 on a start).

    The chief first cuts the event files back to `extent`, what
    `RunLogs.extent()` returned when the checkpoint of `start_step` was
    saved (`None`: to nothing). The resumed run computes every step after
    its checkpoint again from `(seed, step)` and logs it: what a killed run
    logged past that checkpoint would be a second record of those steps,
    and skipping them instead (as before, by the largest step logged under
    any tag) lost the step-0 diagnostics of a run killed after writing its
    step-0 config. Cut back, each step is on disk once, logged by the run
    that goes on; the records cut are written again, with the same values
    on a deterministic run."""
    directories = [os.path.join(logdir, name) for name in (TRAIN_LOGS,
                                                            EVAL_LOGS)]
    if is_chief:
        for directory in directories:
            kept = (extent or {}).get(os.path.basename(directory), {})
            _cut_back(directory, kept)
    first_step = start_step + 1 if start_step else 0
    return RunLogs(*(LogWriter(directory, is_chief, first_step)
                     for directory in directories))


def _cut_back(directory, kept):
    """Truncates each event file of `directory` to its size in `kept`,
    `{file name: size}`, and removes those not in it."""
    with writing(f"the event files in {directory}"):
        for path in _event_files(directory):
            size = kept.get(os.path.basename(path))
            if size is None:
                os.remove(path)
            elif os.path.getsize(path) > size:
                os.truncate(path, size)


def write_end_metrics(run_dir, values, step, suffix):
    """Writes a grid's `{tag: value}` end metrics of one run at `step` in
    the run's `validation/` (beside its HParams session), in an event file
    ending in `suffix` that replaces an earlier report's: a rerun never
    duplicates them. A refused write raises `OSError`."""
    directory = os.path.join(run_dir, EVAL_LOGS)
    for path in _event_files(directory, suffix):
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
