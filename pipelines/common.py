"""What every pipeline shares: usage and environment errors, safe writes,
JSON, flag parsing.

Nothing here imports another pipeline module; every pipeline may import it.
"""

import argparse
import json
import os
import re
import sys

import numpy as np

from keras_attention.files import atomic_path


class UsageError(ValueError):
    """Bad flags or config values; the command line reports it and exits 2."""


def usage_error(error, flags):
    """A library `ValueError` as the command line says it: a one-line `UsageError` whose
    argument names are flags. `flags` maps names to flags: `` `key_dim` `` -> `--key-dim`;
    `overwrite=True` -> `--overwrite` and `format="onnx"` -> `--format onnx` too. A
    `UsageError` is returned as it is."""
    if isinstance(error, UsageError):
        return error

    def named(match):
        name, value = match[1] or match[2], match[3]
        if name not in flags:
            return match[0]
        return flags[name] + ("" if value in (None, "True") else " " + value.strip('"'))

    message = re.sub(r'`(\w+)`|\b(\w+)=(True|"\w*")', named, " ".join(str(error).split()))
    return UsageError(message.rstrip("."))


class EnvironmentFailure(Exception):
    """The machine, not the input, stopped the command (a full disk, an
    unwritable file); the command line reports it on one line and exits 1."""


class WriteFailure(EnvironmentFailure):
    """A file or directory could not be written.

    Args:
        what: what could not be written (a path, or words naming it).
        reason: why, as the system said it (`"No space left on device"`).
    """

    def __init__(self, what, reason):
        super().__init__(f"cannot write {what}: {reason}")
        self.what, self.reason = what, reason


def one_line(error, limit=200):
    """An exception's message on one line of at most `limit` characters (its
    type's name when it has none)."""
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


# ------------------------------------------------------------------ JSON
def to_jsonable(value):
    """numpy scalars and arrays (also inside dicts, lists and tuples) as
    plain Python values that `json.dump` accepts. A 0-d array or numpy
    number becomes a Python scalar; dict keys become strings."""
    if isinstance(value, dict):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(item) for item in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


# ---------------------------------------------------------------- writes
def write_text_atomic(path, text):
    """Writes `text` to `path` through `atomic_path`; `WriteFailure` when
    the system refuses (the previous file, if any, is left as it was)."""
    write_bytes_atomic(path, text.encode())


def write_bytes_atomic(path, data):
    """Writes `data` (bytes) to `path` through `atomic_path`; `WriteFailure`
    when the system refuses (the previous file, if any, is left as it was)."""
    try:
        with atomic_path(path) as temporary:
            with open(temporary, "wb") as handle:
                handle.write(data)
    except OSError as error:
        raise WriteFailure(path, error.strerror or str(error)) from None


def write_json_atomic(path, data):
    """Writes `data` as indented, key-sorted JSON to `path`; numpy values are
    converted by `to_jsonable`. A crash mid-write leaves the previous file
    (or none), never half of one."""
    text = json.dumps(to_jsonable(data), indent=2, sort_keys=True)
    write_text_atomic(path, text + "\n")


def check_writable_directory(path, argument="--logdir"):
    """Raises `UsageError` unless `path` is, or can be created as, a writable
    directory. Creates nothing: the check walks up to the nearest existing
    ancestor."""
    path = os.path.abspath(path)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise UsageError(f"{argument} {path} exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"{argument} {path} is not writable")
        return
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{argument} {path} cannot be created: {parent} is not writable")


# Files that say a directory is something other than a run, which `train` must not write into
# (`compare.COMPARISON_JSON`, `sweep.SWEEP_JSON`, `engine.identity.GRID_FILE`, a SavedModel's
# graph; test_config checks the names agree).
NOT_A_RUN = {"grid.json": "a grid's root", "comparison.json": "a comparison's root",
             "sweep.json": "a sweep's root", "saved_model.pb": "an exported SavedModel"}


def check_run_outputs(logdir, export):
    """Raises `UsageError` unless `logdir` can be a run's directory (writable, not a grid's or
    an export's) and `export` (or `None`) a path outside it: checked before a run starts, as
    the export would otherwise fail, or replace the run's own files, once training is done."""
    if not isinstance(logdir, str) or not logdir:
        raise UsageError(f"--logdir must be a directory; got {logdir!r}")
    check_writable_directory(logdir, "--logdir")
    for marker, what in NOT_A_RUN.items():
        if os.path.exists(os.path.join(logdir, marker)):
            raise UsageError(f"--logdir {logdir} is {what} ({marker}); train into a directory "
                             "of its own")
    if export is None:
        return
    if not isinstance(export, str) or not export:
        raise UsageError(f"--export must be a path; got {export!r}")
    run_dir = os.path.abspath(logdir)
    if os.path.commonpath([run_dir, os.path.abspath(export)]) == run_dir:
        raise UsageError(f"--export {export} is inside the run directory --logdir {logdir}; "
                         "export to a path outside it")


# --------------------------------------------------------------- parsing
def parse_int_list(text, flag):
    """`"16,64,256"` -> `[16, 64, 256]`; `UsageError` naming `flag` if not
    a comma-separated list of distinct positive integers."""
    try:
        values = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        values = None
    if not values or any(value < 1 for value in values) or len(
        set(values)
    ) != len(values):
        raise UsageError(
            f"{flag} must be a comma-separated list of distinct positive "
            f"integers; got {text!r}"
        )
    return values


def parse_count(text, flag, minimum):
    """`text` as an integer of at least `minimum`, or `UsageError` naming
    `flag`."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = minimum - 1
    if value < minimum:
        raise UsageError(f"{flag} must be an integer >= {minimum}; got {text!r}")
    return value


# --------------------------------------------------------------- reports
def markdown_table(header, rows, left_columns=0):
    """A Markdown table as a list of lines.

    Args:
        header: the column titles.
        rows: lists of already formatted cells, one per column.
        left_columns: how many leading columns are left-aligned; the rest
            are right-aligned (numbers).
    """
    align = ["---"] * left_columns + ["---:"] * (len(header) - left_columns)
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(align) + "|",
        *("| " + " | ".join(cells) + " |" for cells in rows),
    ]
