"""Stand-ins for a worker's task, for tests/test_engine.py (not a test
module): importable by the spawned worker processes, which get this
process's sys.path."""

import os
import signal

from pipelines.engine import runner


def die_or_report(config):
    """Dies of SIGKILL on the run named "dies", raises on "raises", else
    reports step 1 and returns a finished run's record, with the worker's
    thread-pool variables under "threads"."""
    if config.logdir == "dies":
        os.kill(os.getpid(), signal.SIGKILL)
    if config.logdir == "raises":
        raise ZeroDivisionError("a fault in the worker")
    runner._report_step(config.logdir, 1)
    return {"logdir": config.logdir, "seconds": 0.0, "error": None,
            "kind": None, "outcome": "trained", "reused": False,
            "threads": {name: os.environ.get(name) for name in THREAD_VARIABLES}}


# What sizes a backend's CPU thread pools.
THREAD_VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS",
                    "OMP_NUM_THREADS", "XLA_FLAGS")
