"""Subprocess entry point for tests/test_reliability.py (not a test module).

    python tests/_kill_worker.py in-save SAVE ARG...
    python tests/_kill_worker.py after-save SAVE ARG...

Runs `keras-attention ARG...` (on the backend its `--backend` names) and
stops it at checkpoint save number SAVE (1: the first), so that a kill
lands at the same point on every run, however fast the run is:

    in-save     kills the process with SIGKILL in the middle of the save,
                once the checkpoint's staging file is completely written
                and synced, just before it would be renamed into place: the
                checkpoint before it is the last one on disk, its staging
                file is left behind, and the steps since that checkpoint
                are already logged (a save flushes the event files first).
    after-save  once the save is complete, prints `saved STEP` on stdout
                and waits for a line on stdin (the test kills it there,
                holding its run directory), then goes on.

Nothing runs after a SIGKILL: no `finally`, no `atexit`, as when the
machine kills the process.
"""

import contextlib
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _save_hooks import after_save  # noqa: E402  (beside this file)


def kill_in_save(save_number):
    """Makes save number `save_number` end in SIGKILL after its staging
    file is written."""
    from pipelines import checkpoints

    atomic_path = checkpoints.atomic_path  # Used by `Checkpoints.save` only.
    count = []

    @contextlib.contextmanager
    def killing_atomic_path(path, *args, **kwargs):
        count.append(path)
        with atomic_path(path, *args, **kwargs) as staging:
            yield staging
            if len(count) == save_number:
                assert os.path.getsize(staging) > 0
                os.kill(os.getpid(), signal.SIGKILL)

    checkpoints.atomic_path = killing_atomic_path


def wait_after_save(save_number):
    """Makes the process wait for a line on stdin after save number
    `save_number` is complete."""

    def wait(step):
        print(f"saved {step}", flush=True)
        sys.stdin.readline()

    after_save(save_number, wait)


def kill_in_save_while(argv, env, meanwhile, save_number=2, timeout=300):
    """For the tests: runs `keras-attention ARGV` in a child process of this
    worker, killed with SIGKILL in checkpoint save `save_number`, and
    `meanwhile()` in the calling process while the child trains; asserts
    that the child died of the SIGKILL and returns what `meanwhile`
    returned."""
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "in-save",
         str(save_number), *argv],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True,
    )
    try:
        result = meanwhile()
        _, stderr = child.communicate(timeout=timeout)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == -signal.SIGKILL, stderr[-3000:]
    return result


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Imported first: the command line sets KERAS_BACKEND from the
    # `--backend` in sys.argv before Keras loads.
    from pipelines.cli import main

    modes = {"in-save": kill_in_save, "after-save": wait_after_save}
    modes[sys.argv[1]](int(sys.argv[2]))
    sys.exit(main(sys.argv[3:]))
