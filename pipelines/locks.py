"""One process per run directory: an exclusive OS lock while it writes there.

`run_directory_lock(directory)` holds `fcntl.flock` on `directory/.lock` for
as long as the block runs. The kernel drops the lock when the process ends in
any way (SIGKILL included), so a dead run never blocks the next start; the
file itself stays and only says which process held it last. A second process
asking for a held lock stops at once with `RunDirectoryBusy` (a
`UsageError`: the command line exits 2 with one line) and writes nothing:
the lock file is opened, never truncated, until the lock is taken.
"""

import contextlib
import fcntl
import os
import time

from pipelines.common import UsageError
from pipelines.common import WriteFailure
from pipelines.failures import writing

LOCK_FILE = ".lock"

# How long a process that finds the lock taken waits for the holder to write
# its pid (the holder takes the lock, then writes): the window is a few
# microseconds, so 0.2 s is ample and still an immediate answer.
_PID_WAIT_S = 0.2


class RunDirectoryBusy(UsageError):
    """Another process holds the run directory's lock."""


@contextlib.contextmanager
def run_directory_lock(directory, flag="--logdir"):
    """Holds the exclusive lock of the run directory `directory`.

    Creates `directory` when it does not exist. Locks of different
    directories are independent, also within one process; taking the lock of
    a directory this process already holds through another block fails like
    any other holder's.

    Args:
        directory: the run directory.
        flag: the flag that named `directory`, for the message.

    Yields:
        The path of the lock file, which holds this process's pid.

    Raises:
        RunDirectoryBusy: when another process (or block) holds the lock;
            the message names `directory` and the holder's pid.
    """
    path = os.path.join(directory, LOCK_FILE)
    try:
        os.makedirs(directory, exist_ok=True)
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise WriteFailure(path, error.strerror or str(error)) from None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirectoryBusy(
                f"{flag} {directory} is in use by {_holder(descriptor)} "
                f"(lock {path}); wait for it to end or use another {flag}"
            ) from None
        try:
            os.ftruncate(descriptor, 0)
            os.write(descriptor, f"{os.getpid()}\n".encode())
        except OSError as error:
            raise WriteFailure(path, error.strerror or str(error)) from None
        yield path
    finally:
        # Closing the descriptor releases the lock.
        os.close(descriptor)


@contextlib.contextmanager
def owning_logdir(logdir):
    """The block of a pipeline that writes many runs under `logdir`
    (`compare`, `sweep`): one such process per logdir at a time (each run
    also locks its own directory), and a refused write as one line.

    Raises:
        RunDirectoryBusy: when another process holds `logdir`.
        EnvironmentFailure: when a write is refused (`failures.writing`).
    """
    with run_directory_lock(logdir), writing():
        yield


def _holder(descriptor):
    """`"process PID"` of the lock's holder, as its lock file says."""
    deadline = time.monotonic() + _PID_WAIT_S
    while True:
        text = os.pread(descriptor, 64, 0).decode(errors="replace").strip()
        if text.isdigit():
            return f"process {text}"
        if time.monotonic() > deadline:
            return "another process"
        time.sleep(0.01)
