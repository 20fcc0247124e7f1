"""Subprocess entry point for tests/test_reliability.py (not a test module).

    python tests/_write_limit_worker.py in-save LIMIT_BYTES FROM_SAVE ARG...
    python tests/_write_limit_worker.py after-save LIMIT_BYTES SAVE ARG...

Runs `keras-attention ARG...` (on the backend its `--backend` names) and
fills its "disk" at a chosen point: files may not grow past LIMIT_BYTES
(`RLIMIT_FSIZE`, with SIGXFSZ ignored, so a write past the limit fails with
EFBIG as on a full disk; no root needed). Writes before that point are not
limited, so the failure lands where it is meant to whatever the sizes of
the files written before.

    in-save     from checkpoint save number FROM_SAVE on (0: the first),
                while `pipelines.checkpoints.Checkpoints.save` runs. The
                event files the save flushes first are flushed before the
                limit is set (an event file may already be larger than the
                limit), so the failure lands in the checkpoint file.
    after-save  from the end of checkpoint save number SAVE (1: the first)
                to the end of the run: the next write that grows a file
                fails, which is the event file of the next logged step.

Exits with the command's status.
"""

import os
import resource
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _save_hooks import after_save  # noqa: E402  (beside this file)


def _limit(limit):
    """Limits file sizes to `limit` bytes; returns the previous limits."""
    unlimited = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, unlimited[1]))
    return unlimited


def limit_checkpoint_writes(limit, from_save):
    """Wraps `Checkpoints.save`: saves number `from_save` and later run
    with files limited to `limit` bytes."""
    from pipelines.checkpoints import Checkpoints

    save = Checkpoints.save
    count = []

    def limited_save(self, step, writers):
        count.append(step)
        if len(count) <= from_save:
            return save(self, step, writers)
        for writer in writers:
            writer.flush()
        unlimited = _limit(limit)
        try:
            return save(self, step, writers)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, unlimited)

    Checkpoints.save = limited_save


def limit_writes_after(limit, save_number):
    """Once save number `save_number` is done, files are limited to `limit`
    bytes for the rest of the run."""
    after_save(save_number, lambda step: _limit(limit))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    # Imported first: the command line sets KERAS_BACKEND from the
    # `--backend` in sys.argv before Keras loads.
    from pipelines.cli import main

    modes = {"in-save": limit_checkpoint_writes,
             "after-save": limit_writes_after}
    modes[sys.argv[1]](int(sys.argv[2]), int(sys.argv[3]))
    sys.exit(main(sys.argv[4:]))
