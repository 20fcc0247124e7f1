"""`python -m pipelines.compare CONFIG.json`: one run of a comparison, in
its own process; `compare --jobs N` starts N of these at once (see
`runner._train_in_subprocesses`)."""

import json
import sys

from pipelines.common import EnvironmentFailure
from pipelines.common import UsageError
from pipelines.compare.runner import train_one
from pipelines.config import TrainConfig


def main(argv):
    """Trains the run; a usage error (2) or an environment failure (1) ends
    it with one line on stderr, which the comparison quotes."""
    with open(argv[1]) as handle:
        config = TrainConfig.from_dict(json.load(handle), source=argv[1])
    try:
        train_one(config)
    except (UsageError, EnvironmentFailure) as error:
        print(error, file=sys.stderr)
        return 2 if isinstance(error, UsageError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
