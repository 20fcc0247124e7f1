"""What every pipeline shares: usage and environment errors, refused
writes, safe writes, JSON, flag parsing. It imports no other pipeline."""

import argparse
import contextlib
import errno
import json
import os
import re
import sys

import numpy as np

from keras_attention.files import atomic_path


class UsageError(ValueError):
    """Bad flags or config values; the command line reports it and exits 2."""


def usage_error(error, flags):
    """A library `ValueError` as a one-line `UsageError` naming `flags`:
    `` `key_dim` `` -> `--key-dim`; `overwrite=True` -> `--overwrite`,
    `format="onnx"` -> `--format onnx`. A `UsageError` is returned as is."""
    if isinstance(error, UsageError):
        return error

    def named(match):
        name, value = match[1] or match[2], match[3]
        if name not in flags:
            return match[0]
        if value in (None, "True"):
            return flags[name]
        return flags[name] + " " + value.strip('"')

    message = re.sub(r'`(\w+)`|\b(\w+)=(True|"\w*")', named,
                     " ".join(str(error).split()))
    return UsageError(message.rstrip("."))


class EnvironmentFailure(Exception):
    """The machine, not the input, stopped the command (a full disk, an
    unwritable file); the command line reports it on one line and exits 1."""


class WriteFailure(EnvironmentFailure):
    """`what` (a path, or words naming it) could not be written, for
    `reason` as the system said it (`"No space left on device"`)."""

    def __init__(self, what, reason):
        super().__init__(f"cannot write {what}: {reason}")
        self.what, self.reason = what, reason


# The errnos of a write the machine refused. Every file a run writes goes
# through Python's file objects, so a refused write is an `OSError` with one
# of these (found by running the pipelines out of space on a tmpfs and past
# `RLIMIT_FSIZE`).
WRITE_ERRNOS = (
    errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EACCES, errno.EPERM,
    errno.EROFS, errno.EIO,
)


@contextlib.contextmanager
def writing(what=None):
    """Raises a refused write inside the block as a `WriteFailure` naming
    `what` (a path, or words), or else the file in the error. Other errors,
    and `EnvironmentFailure`s, pass through unchanged."""
    try:
        yield
    except EnvironmentFailure:
        raise
    except OSError as error:
        if error.errno not in WRITE_ERRNOS:
            raise
        reason = error.strerror or errno.errorcode.get(error.errno, "refused")
        raise WriteFailure(what or error.filename or "a file",
                           reason) from None


def one_line(error, limit=200):
    """An exception's message (or type) on one line of at most `limit`."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def warn(message):
    """Prints a warning of the command line on one line of stderr."""
    print(f"keras-attention: warning: {message}", file=sys.stderr, flush=True)


class OneLineErrorParser(argparse.ArgumentParser):
    """Reports a bad flag as one line on stderr (exit 2), not usage + line;
    `--help` still shows the full usage."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def to_jsonable(value):
    """numpy scalars and arrays, also inside dicts, lists and tuples, as
    plain Python values for `json.dump`; dict keys become strings."""
    if isinstance(value, dict):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(item) for item in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def write_text_atomic(path, text):
    """`write_bytes_atomic` of `text`, encoded."""
    write_bytes_atomic(path, text.encode())


def write_bytes_atomic(path, data):
    """Writes `data` to `path` through `atomic_path`; `WriteFailure` when
    the system refuses (the previous file, if any, is left as it was)."""
    try:
        with atomic_path(path) as temporary:
            with open(temporary, "wb") as handle:
                handle.write(data)
    except OSError as error:
        raise WriteFailure(path, error.strerror or str(error)) from None


def write_json_atomic(path, data):
    """`write_text_atomic` of `data` (`to_jsonable`) as sorted JSON."""
    text = json.dumps(to_jsonable(data), indent=2, sort_keys=True)
    write_text_atomic(path, text + "\n")


def check_writable_directory(path, argument="--logdir"):
    """`UsageError` unless `path` is, or could be made, a writable folder."""
    path = os.path.abspath(path)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise UsageError(
                f"{argument} {path} exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"{argument} {path} is not writable")
        return
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{argument} {path} cannot be created: {parent} is "
                         "not writable")


# Files that say a directory is something other than a run, which `train`
# must not write into (`compare.COMPARISON_JSON`, `sweep.SWEEP_JSON`,
# `engine.identity.GRID_FILE`, a SavedModel's graph; test_config checks the
# names agree).
NOT_A_RUN = {"grid.json": "a grid's root",
             "comparison.json": "a comparison's root",
             "sweep.json": "a sweep's root",
             "saved_model.pb": "an exported SavedModel"}


def check_run_outputs(logdir, export):
    """Raises `UsageError` unless `logdir` can be a run's directory
    (writable, not a grid's or an export's) and `export` (or `None`) a path
    outside it: checked before a run starts, as the export would otherwise
    fail, or replace the run's own files, once training is done."""
    if not isinstance(logdir, str) or not logdir:
        raise UsageError(f"--logdir must be a directory; got {logdir!r}")
    check_writable_directory(logdir, "--logdir")
    for marker, what in NOT_A_RUN.items():
        if os.path.exists(os.path.join(logdir, marker)):
            raise UsageError(f"--logdir {logdir} is {what} ({marker}); "
                             "train into a directory of its own")
    if export is None:
        return
    if not isinstance(export, str) or not export:
        raise UsageError(f"--export must be a path; got {export!r}")
    run_dir = os.path.abspath(logdir)
    if os.path.commonpath([run_dir, os.path.abspath(export)]) == run_dir:
        raise UsageError(f"--export {export} is inside the run directory "
                         f"--logdir {logdir}; export to a path outside it")


def parse_int_list(text, flag):
    """`"16,64,256"` -> `[16, 64, 256]`; `UsageError` naming `flag` if not
    a comma-separated list of distinct positive integers."""
    try:
        values = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        values = None
    if (not values or any(value < 1 for value in values)
            or len(set(values)) != len(values)):
        raise UsageError(
            f"{flag} must be a comma-separated list of distinct positive "
            f"integers; got {text!r}"
        )
    return values


def parse_count(text, flag, minimum):
    """`text` as an integer >= `minimum`, or `UsageError` naming `flag`."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = minimum - 1
    if value < minimum:
        raise UsageError(
            f"{flag} must be an integer >= {minimum}; got {text!r}")
    return value


def markdown_table(header, rows, left_columns=0):
    """A Markdown table as a list of lines: `rows` of formatted cells, the
    first `left_columns` columns left-aligned, the rest right-aligned."""
    align = ["---"] * left_columns + ["---:"] * (len(header) - left_columns)
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(align) + "|",
        *("| " + " | ".join(cells) + " |" for cells in rows),
    ]
