"""`python -m pipelines.engine WORKLIST.json`: one worker of a grid,
training the listed runs one after another in one process (see
`runner`)."""

import sys

from pipelines.engine.runner import worker_main

if __name__ == "__main__":
    sys.exit(worker_main(sys.argv))
