"""Subprocess entry point for tests/test_reliability.py (not a test module).

    python tests/_write_limit_worker.py LIMIT_BYTES AFTER_SAVES ARG...

Runs `keras-attention ARG...` in a process whose files may not grow past
LIMIT_BYTES (`RLIMIT_FSIZE`; SIGXFSZ ignored, so a write past the limit
fails with EFBIG as on a full disk, and needs no root). The limit applies
once AFTER_SAVES checkpoints are saved (0: from the start), so a run can
checkpoint a few times before its disk "fills up". Exits with the command's
status.
"""

import os
import resource
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def limit_writes(limit):
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))


def limit_after_saves(limit, saves):
    """Applies the limit after `saves` calls of `CheckpointManager.save`."""
    import tensorflow as tf

    save = tf.train.CheckpointManager.save
    done = []

    def counting_save(self, *args, **kwargs):
        path = save(self, *args, **kwargs)
        done.append(path)
        if len(done) == saves:
            limit_writes(limit)
        return path

    tf.train.CheckpointManager.save = counting_save


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit, saves = int(sys.argv[1]), int(sys.argv[2])
    if saves == 0:
        limit_writes(limit)
    from pipelines.cli import main

    if saves > 0:
        limit_after_saves(limit, saves)
    sys.exit(main(sys.argv[3:]))
