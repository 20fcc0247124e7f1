"""A run directory: its file names, its stored config, metrics and model.

    DIR/config.json     the resolved config (`CONFIG_FILE`)
    DIR/vocab.json      the text task's vocabulary (`VOCAB_FILE`)
    DIR/metrics.json    the run's results (`METRICS_FILE`)
    DIR/model.keras     the trained model (`MODEL_FILE`)
    DIR/checkpoints/    the checkpoints (`pipelines.checkpoints`)
    DIR/train/          event files of the training steps (`TRAIN_LOGS`)
    DIR/validation/     event files of the held-out evaluation and the
                        diagnostics, the config and HParams (`EVAL_LOGS`)
    DIR/.lock           held by the one process writing the run (`locks`)
"""

import contextlib
import json
import os
import zipfile
from typing import NamedTuple

import keras

from keras_attention.files import atomic_path
from pipelines.builders import build_model
from pipelines.checkpoints import CHECKPOINT_DIR
from pipelines.checkpoints import checkpoint_path
from pipelines.checkpoints import last_checkpointed_step
from pipelines.checkpoints import load_newest
from pipelines.checkpoints import remove_partial_checkpoints
from pipelines.common import EnvironmentFailure
from pipelines.common import UsageError
from pipelines.common import one_line
from pipelines.common import write_json_atomic
from pipelines.common import WriteFailure
from pipelines.common import writing
from pipelines.locks import run_directory_lock
from pipelines.settings import RUNTIME_FIELDS
from pipelines.settings import TrainConfig

CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.json"
METRICS_FILE = "metrics.json"
MODEL_FILE = "model.keras"
# Keras's names (its TensorBoard callback's): TensorBoard lists each trained
# run as `<run>/train` and `<run>/validation`, nothing else.
TRAIN_LOGS = "train"
EVAL_LOGS = "validation"
# Where held-out events went before: a run written so is refused, not
# resumed or reported without its held-out curves.
EARLIER_EVAL_LOGS = "eval"

_DERIVED = "derived from "
# A setting missing from a stored config is newer than the run, which ran
# as the setting's default does.
_SETTING_DEFAULTS = TrainConfig().to_dict()


class Mismatch(NamedTuple):
    """How a stored config differs from the wanted one: `name`, the setting
    to name (one given or left at its default, or the one the differing
    derived settings follow), its `stored` and `wanted` values, `derived`,
    `(name, stored, wanted)` of the derived settings that differ with it,
    and `others`, the further differences (each a `Mismatch`)."""

    name: str
    stored: object
    wanted: object
    derived: tuple = ()
    others: tuple = ()

    def __str__(self):
        stored, wanted = _differences(self.stored, self.wanted)
        text = f"{self.name}: {stored!r} there, {wanted!r} now"
        for name, stored, wanted in self.derived:
            stored, wanted = _differences(stored, wanted)
            text += (f"; {name}, derived from {self.name}: {stored!r} "
                     f"there, {wanted!r} now")
        return "; ".join([text, *map(str, self.others)])


def _differences(stored, wanted):
    """Two dicts (the text task's corpus) as the keys where they differ."""
    if not (isinstance(stored, dict) and isinstance(wanted, dict)):
        return stored, wanted
    keys = [key for key in sorted(set(stored) | set(wanted))
            if stored.get(key) != wanted.get(key)]
    return ({key: stored.get(key) for key in keys},
            {key: wanted.get(key) for key in keys})


def config_mismatch(run_dir, config):
    """The `Mismatch` of `run_dir/config.json` (if any) and the wanted
    `TrainConfig`, or `None`: the one comparison of the two (train refuses
    to resume a different run, compare to reuse one). `RUNTIME_FIELDS` may
    differ, and `precision` when `config` asks for `"auto"` (the run stored
    what it resolved to); when only derived settings differ (`--steps`
    changes `warmup_steps`), it names the one they derive from.

    Raises:
        UsageError: when the stored config cannot be read, or the run was
            written by an earlier version (its held-out events in `eval/`).
    """
    path = os.path.join(run_dir, CONFIG_FILE)
    if not os.path.exists(path):
        return None
    if os.path.isdir(os.path.join(run_dir, EARLIER_EVAL_LOGS)):
        raise UsageError(
            f"--logdir {run_dir} holds a run of an earlier version (its "
            f"held-out events are in {EARLIER_EVAL_LOGS}/, not "
            f"{EVAL_LOGS}/); use a new --logdir")
    try:
        with open(path) as handle:
            stored = json.load(handle)
    except (OSError, ValueError, RecursionError) as error:
        # ValueError: not JSON, or not UTF-8 (UnicodeDecodeError).
        raise UsageError(
            f"--logdir {run_dir}: cannot read {CONFIG_FILE} "
            f"({type(error).__name__}: {one_line(error)})") from None
    if isinstance(stored, dict):
        stored = {**_SETTING_DEFAULTS, **stored}
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
    # Each setting to name: a given one, or the one derived ones follow;
    # or, when that one is the same (the text task's files, whose contents
    # changed), the derived one itself.
    named = []
    for name in changed:
        origin = (name if not origins[name].startswith(_DERIVED)
                  else origins[name][len(_DERIVED):])
        if stored.get(origin) == wanted.get(origin):
            origin = name
        if origin not in named:
            named.append(origin)
    # A setting the user gave comes first, as before the others.
    named.sort(key=lambda name: name not in changed or origins[name]
               .startswith(_DERIVED))
    differences = [
        Mismatch(origin, stored.get(origin), wanted.get(origin), tuple(
            (name, stored.get(name), wanted.get(name)) for name in changed
            if name != origin and origins[name] == _DERIVED + origin))
        for origin in named
    ]
    return differences[0]._replace(others=tuple(differences[1:]))


def write_run_config(logdir, config, task):
    """Makes `logdir` and writes its `config.json` (and `vocab.json`)."""
    os.makedirs(logdir, exist_ok=True)
    write_json_atomic(os.path.join(logdir, CONFIG_FILE), config.to_dict())
    vocabulary = task.vocabulary_file()
    if vocabulary is not None:
        write_json_atomic(os.path.join(logdir, VOCAB_FILE), vocabulary)


def check_resumable(config):
    """`UsageError` when `config.logdir` holds a run of another config."""
    mismatch = config_mismatch(config.logdir, config)
    if mismatch is not None:
        raise UsageError(
            f"--logdir {config.logdir} holds a run with a different config "
            f"({mismatch}); use a new --logdir")


def completed_metrics(config):
    """The stored metrics when `config.logdir` holds this config's run,
    finished (all its steps, or stopped on a non-finite loss), else `None`:
    a finished run is not trained again."""
    metrics = read_metrics(config.logdir)
    if metrics is None or config_mismatch(config.logdir, config) is not None:
        return None
    finished = (metrics.get("steps", 0) >= config.steps
                or metrics.get("diverged_at_step") is not None)
    return metrics if finished else None


def read_metrics(run_dir):
    """The run's `metrics.json`, or `None` when it has none readable."""
    try:
        with open(os.path.join(run_dir, METRICS_FILE)) as handle:
            return json.load(handle)
    except (OSError, ValueError, RecursionError):
        return None


def without_clocks(metrics):
    """A `metrics.json` record without its wall-clock figures (keys ending
    in `_s`) and its run directory: what two runs of one config on one
    machine must share."""
    if isinstance(metrics, dict):
        return {key: without_clocks(value) for key, value in metrics.items()
                if not key.endswith("_s") and key != "logdir"}
    if isinstance(metrics, list):
        return [without_clocks(value) for value in metrics]
    return metrics


def save_model(model, path):
    """`model.save(path)`, atomically: a crash leaves the previous file (or
    none), never half of one; `WriteFailure` when the system refuses."""
    with writing(path), atomic_path(path) as temporary:
        model.save(temporary, overwrite=True)


@contextlib.contextmanager
def writing_run(logdir, chief):
    """The frame of a training run that writes `logdir`: the chief holds
    its lock (`RunDirectoryBusy` when taken), and a refused write ends the
    block with an `EnvironmentFailure` naming the last step safely
    checkpointed, the failed save's partial files removed, so the same
    command resumes from there once there is space."""
    with contextlib.ExitStack() as stack:
        if chief:
            stack.enter_context(run_directory_lock(logdir))
        try:
            with writing():
                yield
        except WriteFailure as failure:
            directory = os.path.join(logdir, CHECKPOINT_DIR)
            if chief:
                remove_partial_checkpoints(directory)
            step = last_checkpointed_step(directory)
            where = (
                f"the last step safely checkpointed is {step} "
                f"({checkpoint_path(directory, step)}); free space "
                "and run the same command to resume from there"
                if step is not None else
                "no step is checkpointed yet; free space and run the same "
                "command to start again")
            raise EnvironmentFailure(f"{failure}; {where}") from None


def _check_whole_zip(path):
    """`UsageError` unless `path` is a whole zip archive (a `.keras` file):
    Keras reports a truncated one as "File not found"."""
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()  # Reads every member, checks CRCs.
    except (OSError, zipfile.BadZipFile, EOFError) as error:
        damaged = one_line(error)
    if damaged is not None:
        raise UsageError(
            f"cannot restore the run's model: {path} is damaged ({damaged}); "
            "it is not a whole .keras file")


def restore_model(run_dir):
    """The trained `keras.Model` of a run directory: its `model.keras`, or
    else the model of its `config.json` with the newest whole checkpoint's
    weights; `UsageError` when it holds neither."""
    model_path = os.path.join(run_dir, MODEL_FILE)
    if os.path.exists(model_path):
        _check_whole_zip(model_path)
        return keras.saving.load_model(model_path)
    config_path = os.path.join(run_dir, CONFIG_FILE)
    directory = os.path.join(run_dir, CHECKPOINT_DIR)
    if not os.path.exists(config_path) or last_checkpointed_step(
            directory) is None:
        raise UsageError(
            f"{run_dir} holds no trained run ({MODEL_FILE}, or {CONFIG_FILE} "
            f"with {CHECKPOINT_DIR}/)")
    with open(config_path) as handle:
        config = TrainConfig.from_dict(json.load(handle), source=config_path)
    model = build_model(config)
    load_newest(directory, model, then="exporting")
    return model
