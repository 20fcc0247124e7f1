"""Fixtures shared by the test modules."""

import os

# As the command line does before it imports Keras: importing Keras imports
# JAX when it is installed, which sets TF_CPP_MIN_LOG_LEVEL=1 when unset, and
# the commands these tests start inherit it (TensorFlow's C++ warnings would
# then reach stderr beside the commands' own lines).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

from pipelines.config import Layer  # noqa: E402
from pipelines.config import resolve_config  # noqa: E402

# Task settings that make a run take seconds on a 2-core CPU.
TINY_TASKS = {
    "recall": dict(num_pairs=4, num_keys=8, num_values=4, d_model=16,
                   key_dim=16),
    "reverse": dict(seq_len=6, vocab_size=8, d_model=16, key_dim=8),
}
TINY_LOOP = dict(batch_size=16, heldout_size=64, probe_size=8, verbose=0,
                 strategy="default")


def make_tiny_config(task="recall", **settings):
    """A resolved `TrainConfig` of a tiny, fast run of `task` ("recall" or
    "reverse"); `settings` are given on top (as a `tests` layer)."""
    values = {"task": task, **TINY_TASKS[task], **TINY_LOOP, **settings}
    return resolve_config([Layer("tests", values)])


@pytest.fixture(scope="session")
def tiny_config():
    """`tiny_config(task="recall", **settings)`: a resolved config of a tiny
    run (see `make_tiny_config`)."""
    return make_tiny_config
