"""The training pipeline's tests on JAX and torch, as child runs.

`tests/test_train.py` runs in this (TensorFlow) process; its cases run again
under `KERAS_BACKEND=jax` and `torch` in child pytest runs (see
`_backends.run_pytest_under`): one case per behaviour by default (a run's
directory, events and metrics; a finished run left untouched; divergence
reported), the whole module under `-m slow`. The reliability promises
(SIGKILL resume, refused writes) are tested on JAX in
`tests/test_reliability.py`, the TensorFlow-free JAX run in
`tests/test_no_tensorflow.py`.
"""

import pytest

from _backends import from_outer_run
from _backends import run_pytest_under

ONE_CASE_PER_BEHAVIOUR = (
    "test_run_directory_events_and_metrics or test_rerun_of_a_finished_run "
    "or test_divergence_stops"
)
# The hand-computed SGD step differentiates with tf.GradientTape.
TENSORFLOW_ONLY = "not test_first_step_is_the_hand_computed_sgd_update"


@from_outer_run
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_pipeline_cases_pass_under(backend):
    run_pytest_under(backend, ["test_train.py"], ONE_CASE_PER_BEHAVIOUR)


@pytest.mark.slow
@from_outer_run
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_all_pipeline_cases_pass_under(backend):
    run_pytest_under(backend, ["test_train.py"], TENSORFLOW_ONLY)
