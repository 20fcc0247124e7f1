"""`python -m pipelines.compare CONFIG.json`: one run of a comparison, in
its own process; `compare --jobs N` starts N of these at once (see
`runner._train_in_subprocesses`)."""

import json
import sys

from pipelines.compare.runner import train_one
from pipelines.config import TrainConfig


def main(argv):
    with open(argv[1]) as handle:
        config = TrainConfig.from_dict(json.load(handle), source=argv[1])
    train_one(config)


if __name__ == "__main__":
    main(sys.argv)
