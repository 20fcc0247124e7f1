"""`python -m pipelines.sweep WORKLIST.json`: one worker of a sweep, training
the listed runs one after another in one process (see `runner`)."""

import sys

from pipelines.sweep.runner import worker_main

if __name__ == "__main__":
    sys.exit(worker_main(sys.argv))
