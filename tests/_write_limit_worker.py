"""Subprocess entry point for tests/test_reliability.py (not a test module).

    python tests/_write_limit_worker.py LIMIT_BYTES FROM_SAVE ARG...

Runs `keras-attention ARG...` and fills its "disk" in the middle of a
checkpoint: from the FROM_SAVE-th checkpoint save on (0: the first), files
may not grow past LIMIT_BYTES while TensorFlow writes the checkpoint
(`RLIMIT_FSIZE`, with SIGXFSZ ignored, so a write past the limit fails with
EFBIG as on a full disk; no root needed). Other writes are not limited, so
the failure lands in the checkpoint whatever the event files' sizes. Exits
with the command's status.
"""

import os
import resource
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def limit_checkpoint_writes(limit, from_save):
    """Wraps `CheckpointManager.save`: saves number `from_save` and later
    run with files limited to `limit` bytes."""
    import tensorflow as tf

    save = tf.train.CheckpointManager.save
    count = []

    def limited_save(self, *args, **kwargs):
        count.append(None)
        if len(count) <= from_save:
            return save(self, *args, **kwargs)
        unlimited = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, unlimited[1]))
        try:
            return save(self, *args, **kwargs)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, unlimited)

    tf.train.CheckpointManager.save = limited_save


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    from pipelines.cli import main

    limit_checkpoint_writes(int(sys.argv[1]), int(sys.argv[2]))
    sys.exit(main(sys.argv[3:]))
