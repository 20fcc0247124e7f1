"""A run's checkpoints: `checkpoints/ckpt-<step>.npz`, the values of every
model and optimizer variable, the step and the training loop's state (its
`progress` member, JSON), on every backend.

Written atomically (a staging file renamed into place), so a kill or a full
disk leaves the previous checkpoints and at most a staging file, which the
next start removes. The variables are stored in the order the model and
the optimizer list them (their names carry process-wide counters,
`seed_generator_3`), with their paths beside them; shapes are checked on
restore. The members carry CRC-32s, so a damaged file fails on reading and
the newest one that reads whole is resumed from.

A resume reads the loop's state (the evaluation history, the diagnostics
records, the event files' extent) from the checkpoint, never from the
event files: rebuilt from the logs, a resumed run kept only the summary of
its initial diagnostics.
"""

import json
import os
import re
import zipfile

import keras
import numpy as np

from keras_attention.files import atomic_path
from pipelines.common import UsageError
from pipelines.common import one_line
from pipelines.common import to_jsonable
from pipelines.common import warn
from pipelines.common import writing

CHECKPOINT_DIR = "checkpoints"
# Checkpoints kept: the newest and two before it, for a damaged newest.
KEEP = 3

_NAME = re.compile(r"^ckpt-(\d+)\.npz$")
# The member holding the loop's state, `Checkpoints.state()` as UTF-8 JSON
# bytes (a numpy str array would take 4 bytes a character).
STATE = "progress"


class DamagedCheckpoints(UsageError):
    """Checkpoints exist but none reads whole."""

    def __init__(self, directory, file, reason):
        super().__init__(
            f"checkpoint file {file} is corrupt ({reason}) and no earlier "
            f"checkpoint is whole; move {directory} aside to train from the "
            "start"
        )
        self.file, self.reason = file, reason


def checkpoint_steps(directory):
    """The steps of the checkpoint files in `directory`, oldest first."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(match.group(1)) for match in
                  map(_NAME.match, os.listdir(directory)) if match)


def checkpoint_path(directory, step):
    """The file of the checkpoint of `step`."""
    return os.path.join(directory, f"ckpt-{step}.npz")


def last_checkpointed_step(directory):
    """The newest checkpoint's step, or `None` when there is none."""
    steps = checkpoint_steps(directory)
    return steps[-1] if steps else None


def remove_partial_checkpoints(directory):
    """Deletes the staging files of killed or refused saves; returns their
    names."""
    if not os.path.isdir(directory):
        return []
    removed = []
    for name in sorted(os.listdir(directory)):
        if not _NAME.match(name):
            os.remove(os.path.join(directory, name))
            removed.append(name)
    return removed


def read_checkpoint(path):
    """`{name: array}` of the checkpoint file at `path`, every member read
    (so its CRC checked); raises when the file is damaged."""
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def _variables(model, optimizer):
    groups = {"model": list(model.variables)}
    if optimizer is not None:
        groups["optimizer"] = list(optimizer.variables)
    return groups


def _matching_values(values, groups, path):
    """`(variable, stored array)` pairs of `groups`; raises `ValueError` or
    `KeyError` unless the checkpoint holds exactly these variables."""
    matched = []
    for group, variables in groups.items():
        stored = json.loads(str(values[f"{group}/paths"]))
        if len(stored) != len(variables):
            raise ValueError(
                f"{len(stored)} {group} variables stored, "
                f"{len(variables)} in the run"
            )
        for index, variable in enumerate(variables):
            value = values[f"{group}/{index:05d}"]
            if tuple(value.shape) != tuple(variable.shape):
                raise ValueError(
                    f"{stored[index]} has shape {value.shape} in {path}, "
                    f"{tuple(variable.shape)} in the run"
                )
            matched.append((variable, value))
    return matched


def load_newest(directory, model, optimizer=None, then="resuming from"):
    """Restores the newest checkpoint of `directory` that reads whole into
    `model` (and `optimizer` unless `None`); returns its step, `None` when
    there is none. A damaged newer one is named in one line on stderr,
    saying what the caller does `then`; `DamagedCheckpoints` when
    checkpoints exist and none reads whole."""
    return _restore_newest(directory, model, optimizer, then)[0]


def _restore_newest(directory, model, optimizer, then):
    """`load_newest`, returning `(step, {name: array}, path)` of the
    checkpoint restored, `(None, None, None)` when there is none."""
    damaged = []
    for number in reversed(checkpoint_steps(directory)):
        path = checkpoint_path(directory, number)
        try:
            # Everything is read and checked before any variable changes.
            values = read_checkpoint(path)
            matched = _matching_values(values, _variables(model, optimizer),
                                       path)
            step = int(values["step"])
        except (OSError, ValueError, KeyError, EOFError,
                zipfile.BadZipFile) as error:
            damaged.append((path, one_line(error)))
            continue
        for variable, value in matched:
            variable.assign(value)
        if damaged:
            file, reason = damaged[0]
            others = (f" (and {len(damaged) - 1} newer checkpoint(s))"
                      if len(damaged) > 1 else "")
            warn(f"checkpoint file {file} is corrupt ({reason}){others}; "
                 f"{then} {os.path.basename(path)}, step {step}")
        return step, values, path
    if damaged:
        raise DamagedCheckpoints(directory, *damaged[0])
    return None, None, None


class Checkpoints:
    """A run's checkpoints under `logdir`: restored into `model` and its
    built `optimizer` when the run starts, saved as it goes by the `chief`
    only.

    Attributes:
        start_step: the step restored, 0 for none.
        restored: the loop's state stored with that step (what `state()`
            returned when it was saved), `None` for none.
        state: `state()`, the JSON-able loop's state each save stores
            (set by the loop; called after the save flushed the writers).

    Raises:
        DamagedCheckpoints: checkpoints exist and none reads whole.
        UsageError: the newest whole checkpoint holds no loop's state.
    """

    def __init__(self, logdir, model, optimizer, chief):
        self.directory = os.path.join(logdir, CHECKPOINT_DIR)
        self.model, self.optimizer, self.chief = model, optimizer, chief
        self.state = dict
        if chief:
            remove_partial_checkpoints(self.directory)
        step, values, path = _restore_newest(self.directory, model,
                                             optimizer, "resuming from")
        if step is not None and STATE not in values:
            # Written before the state was stored: its evaluation history
            # and initial diagnostics could only be guessed from the event
            # files (which lost the per-layer records), so it is refused.
            raise UsageError(
                f"checkpoint file {path} holds no training progress (it "
                f"was written by an earlier version); move {self.directory} "
                "aside to train from the start")
        if step is not None and chief:
            # Damaged newer files must not stay as "the last step safely
            # checkpointed".
            for newer in checkpoint_steps(self.directory):
                if newer > step:
                    os.remove(checkpoint_path(self.directory, newer))
        self.start_step = step or 0
        self.restored = (None if step is None
                         else json.loads(values[STATE].tobytes()))

    def save(self, step, writers):
        """Saves the checkpoint of `step` and the loop's `state()` after
        flushing `writers` (once it exists, all logged up to it is on
        disk), then drops all but the newest `KEEP`. Returns whether it
        saved: non-finite weights are not, so the checkpoints kept are the
        last good ones."""
        if not self.chief:
            return True
        for writer in writers:
            writer.flush()
        values = {"step": np.asarray(step, np.int64),
                  STATE: np.frombuffer(json.dumps(to_jsonable(
                      self.state())).encode(), np.uint8)}
        for group, variables in _variables(self.model,
                                           self.optimizer).items():
            values[f"{group}/paths"] = np.asarray(
                json.dumps([variable.path for variable in variables])
            )
            for index, variable in enumerate(variables):
                values[f"{group}/{index:05d}"] = keras.ops.convert_to_numpy(
                    variable.value
                )
        if not all(np.all(np.isfinite(value)) for key, value in values.items()
                   if key.startswith("model/") and value.dtype.kind == "f"):
            return False
        path = checkpoint_path(self.directory, step)
        os.makedirs(self.directory, exist_ok=True)
        with writing(f"checkpoint {path}"), atomic_path(path) as staging:
            with open(staging, "wb") as handle:
                np.savez(handle, **values)
                handle.flush()
                os.fsync(handle.fileno())
        for old in checkpoint_steps(self.directory)[:-KEEP]:
            os.remove(checkpoint_path(self.directory, old))
        return True
