"""A checkpoint directory's files: which checkpoints are whole, and what a
failed save left behind.

`tf.train.CheckpointManager` records a checkpoint in the `checkpoint` state
file only once its files are complete, so the recorded checkpoints are the
candidates to resume from. A recorded checkpoint can still be unreadable (a
truncated or damaged data file): `complete_checkpoint` reads each candidate
whole, newest first, says in one line which ones it skips, and refuses
(`DamagedCheckpoints`, a `UsageError`: exit 2) when none is whole. A save
that fails (a full disk) or is killed leaves TensorFlow's staging files:
`ckpt-N_temp/` folders,
`checkpoint.tmp*` state files and, when the merge of the staged shards
failed, the files of a `ckpt-N` newer than the last recorded one;
`remove_partial_checkpoints` deletes them, and `forget_checkpoints_after`
drops damaged checkpoints from the record once a run resumes before them.
"""

import glob
import os
import re
import shutil

import tensorflow as tf
from google.protobuf import text_format

from pipelines.common import UsageError
from pipelines.common import one_line
from pipelines.common import warn
from pipelines.common import write_text_atomic

# TensorFlow's record of a directory's checkpoints.
STATE_FILE = "checkpoint"

class DamagedCheckpoints(UsageError):
    """Checkpoints are recorded but none reads whole.

    Attributes:
        file: the newest damaged file.
        reason: what reading it said.
    """

    def __init__(self, directory, file, reason):
        super().__init__(
            f"checkpoint file {file} is corrupt ({reason}) and no earlier "
            f"checkpoint is whole; move {directory} aside to train from the "
            "start"
        )
        self.file, self.reason = file, reason


_STEP = re.compile(r"-(\d+)$")
_FILE_STEP = re.compile(r"^ckpt-(\d+)(?:\.index|\.data-.*|_temp)$")


def checkpoint_step(prefix):
    """The step in a checkpoint prefix `.../ckpt-N` (its save number)."""
    match = _STEP.search(prefix)
    return int(match.group(1)) if match else 0


def recorded_checkpoints(directory):
    """The prefixes of the checkpoints recorded in `directory`'s state file,
    oldest first (none when there is no state file)."""
    try:
        state = tf.train.get_checkpoint_state(directory)
    except ValueError as error:  # A state file that names no checkpoint.
        raise UsageError(
            f"{os.path.join(directory, STATE_FILE)} is corrupt "
            f"({one_line(error)}); move {directory} aside to train from the "
            "start"
        ) from None
    if state is None or not state.model_checkpoint_path:
        return []
    prefixes = list(state.all_model_checkpoint_paths)
    if state.model_checkpoint_path not in prefixes:
        prefixes.append(state.model_checkpoint_path)
    return prefixes  # TensorFlow has joined them to `directory`.


def last_checkpointed_step(directory):
    """The step of the newest recorded checkpoint in `directory`, or `None`
    when none is recorded."""
    prefixes = recorded_checkpoints(directory)
    return checkpoint_step(prefixes[-1]) if prefixes else None


def damage(prefix):
    """`(file, reason)` when the checkpoint at `prefix` cannot be read whole,
    else `None`. Reads every tensor: the reader checks each one's length and
    checksum."""
    try:
        reader = tf.train.load_checkpoint(prefix)
    except Exception as error:  # Corrupt files fail in many ways.
        return prefix + ".index", one_line(error)
    try:
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except Exception as error:  # IndexError, DataLossError, OpError, ...
        data_files = sorted(glob.glob(glob.escape(prefix) + ".data-*"))
        named = data_files[0] if len(data_files) == 1 else prefix + ".data-*"
        return named, one_line(error)
    return None


def complete_checkpoint(directory, then="resuming from"):
    """The newest recorded checkpoint of `directory` that reads whole.

    Skipping damaged ones is said in one line on stderr.

    Args:
        directory: a checkpoint directory (it need not exist).
        then: what the caller does with the one found, for the warning.

    Returns:
        Its prefix, or `None` when no checkpoint is recorded.

    Raises:
        DamagedCheckpoints: when checkpoints are recorded but none reads
            whole; the message names the newest damaged file.
    """
    damaged = []
    for prefix in reversed(recorded_checkpoints(directory)):
        problem = damage(prefix)
        if problem is None:
            if damaged:
                file, reason = damaged[0]
                others = (f" (and {len(damaged) - 1} older checkpoint(s))"
                          if len(damaged) > 1 else "")
                warn(f"checkpoint file {file} is corrupt ({reason}){others}; "
                     f"{then} {os.path.basename(prefix)}, step "
                     f"{checkpoint_step(prefix)}")
            return prefix
        damaged.append(problem)
    if damaged:
        raise DamagedCheckpoints(directory, *damaged[0])
    return None


def forget_checkpoints_after(directory, prefix):
    """Makes `prefix` the newest checkpoint recorded in `directory`.

    After `complete_checkpoint` skipped damaged checkpoints, the run resumes
    from `prefix`; the state file must not go on naming the damaged ones as
    the last safe step. Rewrites the state file (atomically, with the kept
    checkpoints' timestamps, which `CheckpointManager` needs to delete old
    checkpoints later) and removes the damaged files. Does nothing when
    `prefix` is already the newest.
    """
    recorded = recorded_checkpoints(directory)
    if not recorded or recorded[-1] == prefix:
        return
    state = tf.train.get_checkpoint_state(directory)
    step = checkpoint_step(prefix)
    kept = [index for index, path in enumerate(state.all_model_checkpoint_paths)
            if checkpoint_step(path) <= step]
    paths = [os.path.basename(state.all_model_checkpoint_paths[index])
             for index in kept]
    timestamps = list(state.all_model_checkpoint_timestamps)
    timestamps = ([timestamps[index] for index in kept]
                  if len(timestamps) == len(state.all_model_checkpoint_paths)
                  else [])
    state.model_checkpoint_path = os.path.basename(prefix)
    del state.all_model_checkpoint_paths[:]
    state.all_model_checkpoint_paths.extend(paths)
    del state.all_model_checkpoint_timestamps[:]
    state.all_model_checkpoint_timestamps.extend(timestamps)
    write_text_atomic(os.path.join(directory, STATE_FILE),
                      text_format.MessageToString(state))
    remove_partial_checkpoints(directory)


def remove_partial_checkpoints(directory):
    """Deletes what failed or killed saves left in `directory`: staging
    folders, temporary state files and the files of checkpoints newer than
    the last recorded one. Returns the names removed."""
    if not os.path.isdir(directory):
        return []
    last = last_checkpointed_step(directory) or 0
    removed = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        match = _FILE_STEP.match(name)
        partial = name.startswith(STATE_FILE + ".tmp") or (
            match is not None
            and (name.endswith("_temp") or int(match.group(1)) > last)
        )
        if partial:
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.remove(path)
            removed.append(name)
    return removed


