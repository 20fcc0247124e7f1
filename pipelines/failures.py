"""Telling a failed write (full disk, unwritable file) from other errors.

Every file a run writes (event files, checkpoints, the model, the JSON
records) is written by Python's own file objects, so a refused write is an
`OSError` whose errno says why (found by running the pipelines out of space
on a tmpfs and past `RLIMIT_FSIZE`). `writing(what)` turns such an error
into a `WriteFailure` (one line on the command line, exit 1) naming `what`,
or the file in the error.
"""

import contextlib
import errno

from pipelines.common import EnvironmentFailure
from pipelines.common import WriteFailure

# The errnos of a write the machine refused.
WRITE_ERRNOS = (
    errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EACCES, errno.EPERM,
    errno.EROFS, errno.EIO,
)


def write_failure_reason(error):
    """The system's reason (`"No space left on device"`) when `error` is a
    refused write, else `None`."""
    if isinstance(error, OSError) and error.errno in WRITE_ERRNOS:
        return error.strerror or errno.errorcode.get(error.errno, "refused")
    return None


@contextlib.contextmanager
def writing(what=None):
    """Reports a refused write inside the block as a `WriteFailure`.

    Args:
        what: what the block writes (a path, or words naming it); `None`
            names the file in the error.

    Raises:
        WriteFailure: instead of an `OSError` that `write_failure_reason`
            recognises. Other errors, and `EnvironmentFailure`s raised
            inside, pass through unchanged.
    """
    try:
        yield
    except EnvironmentFailure:
        raise
    except OSError as error:
        reason = write_failure_reason(error)
        if reason is None:
            raise
        raise WriteFailure(what or error.filename or "a file", reason) from None
