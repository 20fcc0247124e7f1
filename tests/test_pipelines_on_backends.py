"""The training pipeline's tests on JAX and torch, all of them.

`tests/test_train.py` runs in this (TensorFlow) process; its cases marked
`backends("jax", "torch")` (one per behaviour: a run's directory, events and
metrics; a finished run left untouched; divergence reported) run again in
tests/test_backends.py's child runs by default, and the whole module here
under `-m slow` (see `_backends.run_pytest_under`). The reliability promises
(SIGKILL resume, refused writes) are tested on JAX in
`tests/test_reliability.py`, the TensorFlow-free JAX run in
`tests/test_no_tensorflow.py`.
"""

import pytest

from _backends import from_outer_run
from _backends import run_pytest_under


@pytest.mark.slow
@from_outer_run
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_all_pipeline_cases_pass_under(backend):
    run_pytest_under(backend, ["test_train.py"])
