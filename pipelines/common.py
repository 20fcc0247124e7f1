"""Small helpers shared by the pipelines: usage errors and safe file writes."""

import json
import os
import tempfile


class UsageError(ValueError):
    """Bad flags or config values; the command line reports it and exits 2."""


def write_json_atomic(path, data):
    """Writes `data` as JSON to `path` via a temporary file and a rename.

    A crash mid-write leaves the previous file (or none), never half of one.
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp_path = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.replace(tmp_path, path)
    except BaseException:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
        raise


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
