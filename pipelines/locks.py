"""One process per run directory: an exclusive `fcntl.flock` on
`directory/.lock` while it writes there.

The kernel drops the lock when the process ends in any way (SIGKILL
included), so a dead run never blocks the next start; the file stays and
only says which process held it last.
"""

import contextlib
import fcntl
import os
import time

from pipelines.common import UsageError
from pipelines.common import WriteFailure
from pipelines.common import writing

LOCK_FILE = ".lock"

# How long a process that finds the lock taken waits for the holder to write
# its pid (the holder takes the lock, then writes): the window is a few
# microseconds, so 0.2 s is ample and still an immediate answer.
_PID_WAIT_S = 0.2


class RunDirectoryBusy(UsageError):
    """Another process holds the run directory's lock."""


@contextlib.contextmanager
def run_directory_lock(directory, flag="--logdir"):
    """Holds the exclusive lock of `directory` (made if missing) for the
    block; yields the lock file's path, which holds this pid. A second lock
    of it, also in this process, fails at once with `RunDirectoryBusy`
    naming `directory` (given by `flag`) and the holder's pid, and writes
    nothing: the file is truncated only once locked."""
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
    (`compare`, `sweep`): `logdir`'s lock, and a refused write as one
    line (`writing`)."""
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
