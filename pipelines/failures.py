"""Telling a failed write (full disk, unwritable file) from other errors.

A full disk reaches the pipelines in several shapes, found by running them
out of space (a tmpfs) and past `RLIMIT_FSIZE`: Python's writers raise
`OSError` with the errno; TensorFlow's checkpoint writer (`SaveV2`) and
event writer (`WriteSummary`, `FlushSummaryWriter`) raise
`tf.errors.OutOfRangeError` or `UnknownError` whose message ends in
`"PATH; <the system's words>"`, e.g. `"...ckpt-10_temp/part-...; File too
large"`. An `OutOfRangeError` is also the normal end of a dataset, so the
type alone says nothing: `write_failure_reason` reads the errno or those
words. `writing(what)` turns such an error into a `WriteFailure` (one line
on the command line, exit 1), naming `what`, or the path in the message.
"""

import contextlib
import errno
import os
import re

import tensorflow as tf

from pipelines.common import EnvironmentFailure
from pipelines.common import WriteFailure

# The errnos of a write the machine refused; their `os.strerror` texts are
# the words TensorFlow's file system layer puts into its messages.
WRITE_ERRNOS = (
    errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EACCES, errno.EPERM,
    errno.EROFS, errno.EIO,
)
_REASONS = tuple(os.strerror(code) for code in WRITE_ERRNOS)


def write_failure_reason(error):
    """The system's reason when `error` is a refused write, else `None`.

    Args:
        error: any exception.

    Returns:
        A string such as `"No space left on device"`, or `None`.
    """
    if isinstance(error, OSError):
        if error.errno in WRITE_ERRNOS:
            return error.strerror or os.strerror(error.errno)
        return None
    if isinstance(error, tf.errors.OpError):
        message = error.message or ""
        return next((reason for reason in _REASONS if reason in message),
                    None)
    return None


def _path_in(error, reason):
    """The path a refused write names, or `None`."""
    if isinstance(error, OSError):
        return error.filename
    match = re.search(r"(\S+); " + re.escape(reason), error.message or "")
    return match.group(1) if match else None


@contextlib.contextmanager
def writing(what=None):
    """Reports a refused write inside the block as a `WriteFailure`.

    Args:
        what: what the block writes (a path, or words naming it); `None`
            names the path in the error.

    Raises:
        WriteFailure: instead of an `OSError` or `tf.errors.OpError` that
            `write_failure_reason` recognises. Other errors, and
            `EnvironmentFailure`s raised inside, pass through unchanged.
    """
    try:
        yield
    except EnvironmentFailure:
        raise
    except (OSError, tf.errors.OpError) as error:
        reason = write_failure_reason(error)
        if reason is None:
            raise
        named = what or _path_in(error, reason) or "a file"
        raise WriteFailure(named, reason) from None
