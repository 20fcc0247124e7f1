"""A run directory: its file names, its stored config, metrics and model.

    DIR/config.json     the resolved config (`CONFIG_FILE`)
    DIR/metrics.json    the run's results (`METRICS_FILE`)
    DIR/model.keras     the trained model (`MODEL_FILE`)
    DIR/checkpoints/    tf.train checkpoints (`CHECKPOINT_DIR`)
    DIR/train/, eval/   event files (`TRAIN_LOGS`, `EVAL_LOGS`)

`Checkpoints` saves and restores a run's checkpoints;
`config_mismatch(run_dir, config)` is the one comparison of a stored config
with a wanted one (train refuses to resume a different run, compare to reuse
one); `restore_model(run_dir)` gives the trained model back.
"""

import json
import os
import shutil
import tempfile
from typing import NamedTuple

import keras
import tensorflow as tf

from keras_attention.files import atomic_path
from pipelines.builders import build_model
from pipelines.common import UsageError
from pipelines.config import RUNTIME_FIELDS
from pipelines.config import TrainConfig

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.json"
MODEL_FILE = "model.keras"
CHECKPOINT_DIR = "checkpoints"
TRAIN_LOGS = "train"
EVAL_LOGS = "eval"

_DERIVED = "derived from "


class Mismatch(NamedTuple):
    """How a stored config differs from the wanted one.

    Attributes:
        name: the setting to name first: one the user gave or left at its
            default, or, when only derived settings differ, the setting they
            are derived from.
        stored: its value in the run directory.
        wanted: its value now.
        derived: `(name, stored, wanted)` of the derived settings that
            differ because `name` does.
    """

    name: str
    stored: object
    wanted: object
    derived: tuple = ()

    def __str__(self):
        text = f"{self.name}: {self.stored!r} there, {self.wanted!r} now"
        for name, stored, wanted in self.derived:
            text += (
                f"; {name}, derived from {self.name}: {stored!r} there, "
                f"{wanted!r} now"
            )
        return text


def config_mismatch(run_dir, config):
    """The first way `run_dir/config.json` differs from `config`, or `None`.

    `RUNTIME_FIELDS` may differ, and so may `precision` when `config` asks
    for `"auto"` (the run stored what it resolved to). When only settings
    derived from another one differ (changing `--steps` changes the derived
    `warmup_steps`; see `config.sources`), the mismatch names that one.

    Args:
        run_dir: a run directory (it need not exist).
        config: the wanted `TrainConfig`.

    Returns:
        A `Mismatch`, or `None` when there is no stored config or it agrees.

    Raises:
        UsageError: when the stored config cannot be read.
    """
    path = os.path.join(run_dir, CONFIG_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as handle:
            stored = json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise UsageError(
            f"--logdir {run_dir}: cannot read {CONFIG_FILE} ({error})"
        ) from None
    wanted = config.to_dict()
    changed = [
        name for name in sorted(set(stored) | set(wanted))
        if name not in RUNTIME_FIELDS
        and not (name == "precision" and wanted.get(name) == "auto")
        and stored.get(name) != wanted.get(name)
    ]
    if not changed:
        return None
    origins = {name: config.sources.get(name, "") for name in changed}
    given = [name for name in changed if not origins[name].startswith(_DERIVED)]
    if given:
        name = given[0]
        return Mismatch(name, stored.get(name), wanted.get(name))
    origin = origins[changed[0]][len(_DERIVED):]
    return Mismatch(
        origin, stored.get(origin), wanted.get(origin),
        tuple(
            (name, stored.get(name), wanted.get(name)) for name in changed
            if origins[name] == _DERIVED + origin
        ),
    )


def check_resumable(config):
    """Raises `UsageError` when `config.logdir` holds a run with a different
    config (other than the `RUNTIME_FIELDS`)."""
    mismatch = config_mismatch(config.logdir, config)
    if mismatch is not None:
        raise UsageError(
            f"--logdir {config.logdir} holds a run with a different config "
            f"({mismatch}); use a new --logdir"
        )


def read_metrics(run_dir):
    """The run's `metrics.json`, or `None` when it has none (or it cannot be
    read)."""
    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, json.JSONDecodeError):
        return None


def checkpoint_variables(model):
    """The model's variables keyed by path, for `tf.train.Checkpoint`.

    A Keras 3 functional model keeps its layers in Keras' own containers,
    which `tf.train.Checkpoint` does not traverse; naming every variable
    explicitly makes checkpoints hold all of them (non-trainable ones too).
    """
    variables = {variable.path: variable for variable in model.variables}
    if len(variables) != len(model.variables):
        raise ValueError(
            f"`model` {model.name!r} has variables with the same path; "
            "give its layers unique names."
        )
    return variables


class Checkpoints:
    """A run's checkpoints: restored when the run starts, saved as it goes.

    Args:
        logdir: the run directory (checkpoints go to `CHECKPOINT_DIR`).
        model: the model being trained.
        optimizer: its optimizer.
        chief: whether this process writes the run.

    Attributes:
        start_step: the step of the latest checkpoint (0 for none).

    Non-chief workers save too (saving may need every worker) but into a
    scratch directory, as TensorFlow's multi-worker convention has it.
    """

    def __init__(self, logdir, model, optimizer, chief):
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
        checkpoint = tf.train.Checkpoint(
            model=checkpoint_variables(model), optimizer=optimizer,
            step=self.step,
        )
        directory = os.path.join(logdir, CHECKPOINT_DIR)
        latest = tf.train.latest_checkpoint(directory)
        if latest is not None:
            checkpoint.restore(latest).assert_existing_objects_matched()
        self.start_step = int(self.step.numpy())
        self.scratch = None if chief else tempfile.mkdtemp(
            prefix="keras-attention-worker-"
        )
        self.manager = tf.train.CheckpointManager(
            checkpoint, self.scratch or directory, max_to_keep=3
        )

    def save(self, step, writers):
        """Saves the checkpoint of `step`, after flushing `writers`."""
        self.step.assign(step)
        # Events first: once the checkpoint exists, everything logged up to
        # its step is on disk.
        for writer in writers:
            writer.flush()
        self.manager.save(checkpoint_number=step)

    def close(self):
        """Removes a non-chief worker's scratch directory."""
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


def save_model(model, path):
    """`model.save(path)`, atomically: a crash leaves the previous file (or
    none), never half of one."""
    with atomic_path(path) as temporary:
        model.save(temporary, overwrite=True)


def restore_model(run_dir):
    """The trained model of a run directory.

    Loads `run_dir/model.keras` when the run finished, else rebuilds the
    model from `run_dir/config.json` and restores the latest checkpoint.

    Args:
        run_dir: a directory written by `train`.

    Returns:
        A `keras.Model`.

    Raises:
        UsageError: when `run_dir` holds neither a model nor a checkpoint.
    """
    model_path = os.path.join(run_dir, MODEL_FILE)
    if os.path.exists(model_path):
        return keras.saving.load_model(model_path)
    config_path = os.path.join(run_dir, CONFIG_FILE)
    latest = tf.train.latest_checkpoint(os.path.join(run_dir, CHECKPOINT_DIR))
    if not os.path.exists(config_path) or latest is None:
        raise UsageError(
            f"{run_dir} holds no trained run ({MODEL_FILE}, or {CONFIG_FILE} "
            f"with {CHECKPOINT_DIR}/)"
        )
    with open(config_path) as handle:
        config = TrainConfig.from_dict(json.load(handle), source=config_path)
    model = build_model(config)
    status = tf.train.Checkpoint(model=checkpoint_variables(model)).restore(
        latest
    )
    status.expect_partial().assert_existing_objects_matched()
    return model
