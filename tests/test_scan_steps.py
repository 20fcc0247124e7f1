"""`scan_train_steps`: `fit` with `steps_per_execution` steps in one
compiled call on JAX, against Keras's own loop (one jitted call a step) on
the same model, weights and data: the weights, the history, the batch
indices the callbacks see, a short last chunk, one trace; on the other
backends, with one step per call or without XLA, Keras's loop stays.

The fits run in the JAX child run (tests/test_backends.py), with two host
devices there, so the distributed case is data parallel; each JAX model
compiles its step (about 2 s on 2 shared cores).
"""

import keras
import numpy as np
import pytest

from _backends import BACKEND
from keras_attention import build_sequence_model
from keras_attention import scan_train_steps
from keras_attention.scan_steps import ScanTrainFunction

SEQ_LEN, VOCAB, BATCH, PER_CALL = 8, 10, 8, 4

# With `backends("jax")`: the JAX child run's cases, skipped before their
# fixtures (the fits) elsewhere.
jax_only = pytest.mark.skipif(BACKEND != "jax", reason="scans on JAX only")


def _model(scan, steps_per_execution=PER_CALL, jit_compile=True):
    keras.utils.set_random_seed(1)
    model = build_sequence_model(
        vocab_size=VOCAB, seq_len=SEQ_LEN, num_classes=VOCAB, d_model=8,
        key_dim=4, num_heads=2, dropout=0.1,
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"], steps_per_execution=steps_per_execution,
        jit_compile=jit_compile,
    )
    return scan_train_steps(model) if scan else model


def _data(examples, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.integers(1, VOCAB, (examples, SEQ_LEN)),
            rng.integers(0, VOCAB, (examples, SEQ_LEN)))


class _Batches(keras.callbacks.Callback):
    """The batch indices `fit` gives the batch hooks, and the logs."""

    def __init__(self):
        super().__init__()
        self.begin, self.end, self.logs = [], [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.begin.append(batch)

    def on_train_batch_end(self, batch, logs=None):
        self.end.append(batch)
        self.logs.append({name: float(value)
                          for name, value in logs.items()})


def _fits(scan):
    """Two fits of one model: 16 batches (4 whole chunks), then 10 (two
    whole chunks and a short one of 2); what each left."""
    model = _model(scan)
    runs = []
    for examples in (16 * BATCH, 10 * BATCH):
        batches = _Batches()
        history = model.fit(*_data(examples), batch_size=BATCH, epochs=1,
                            shuffle=False, verbose=0, callbacks=[batches])
        runs.append(dict(
            weights=_weights(model), history=history.history,
            begin=batches.begin, end=batches.end, logs=batches.logs,
            iterations=int(model.optimizer.iterations.value),
        ))
    return model, runs


def _weights(model):
    return [np.asarray(variable.value) for variable in model.weights]


@pytest.fixture(scope="module")
def fits():
    """`{scan: (model, runs)}` for Keras's loop (False) and the scan."""
    return {scan: _fits(scan) for scan in (False, True)}


def _assert_same_weights(weights, reference):
    assert len(weights) == len(reference)
    for value, expected in zip(weights, reference):
        # Bit for bit on this CPU (Keras 3.15.1, JAX 0.10.2); XLA may fuse
        # the scanned step otherwise elsewhere: float32 rounding.
        np.testing.assert_allclose(value, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.backends("jax")
@jax_only
@pytest.mark.parametrize("fit", [0, 1], ids=["16 batches", "10 batches"])
def test_weights_and_history(fits, fit):
    """The weights and the history of Keras's loop; the 10-batch fit's
    short last chunk trains both its batches (26 optimizer steps)."""
    reference, scanned = fits[False][1][fit], fits[True][1][fit]
    _assert_same_weights(scanned["weights"], reference["weights"])
    assert scanned["history"].keys() == reference["history"].keys()
    for name, values in reference["history"].items():
        np.testing.assert_allclose(scanned["history"][name], values,
                                   rtol=1e-6)
    assert scanned["iterations"] == reference["iterations"] == (
        16 if fit == 0 else 26)


@pytest.mark.backends("jax")
@jax_only
def test_callback_batch_indices(fits):
    """The batch hooks see Keras's `begin_step`/`end_step` (one call per
    chunk, the short chunk's end as Keras reports it) and its logs (the
    last step's)."""
    for fit in (0, 1):
        reference, scanned = fits[False][1][fit], fits[True][1][fit]
        assert scanned["begin"] == reference["begin"]
        assert scanned["end"] == reference["end"]
        assert len(scanned["logs"]) == len(reference["logs"])
        for logs, expected in zip(scanned["logs"], reference["logs"]):
            assert logs.keys() == expected.keys()
            np.testing.assert_allclose(list(logs.values()),
                                       list(expected.values()), rtol=1e-6)
    assert fits[True][1][0]["begin"] == [0, 4, 8, 12]
    assert fits[True][1][0]["end"] == [3, 7, 11, 15]
    assert fits[True][1][1]["begin"] == [0, 4, 8]
    assert fits[True][1][1]["end"] == [3, 7, 11]


@pytest.mark.backends("jax")
@jax_only
def test_one_trace(fits):
    """The scanned call is traced once for the 6 whole chunks of both
    fits; Keras's own loop is left to the plain model."""
    scanned, plain = fits[True][0], fits[False][0]
    assert isinstance(scanned.train_function, ScanTrainFunction)
    assert scanned.train_function.traces == 1
    assert not isinstance(plain.train_function, ScanTrainFunction)


def _train_function(model):
    model.make_train_function(force=True)
    return model.train_function


@pytest.mark.backends("jax")
def test_keras_loop_where_nothing_to_scan(monkeypatch):
    """Keras's train function where a scan gains nothing or cannot run:
    on TensorFlow and torch (the model untouched), with one step per
    call, without XLA, and with a Keras that scans itself (PR #23527's
    `super_batch_iterator` present); a later `compile` is followed."""
    model = _model(True, steps_per_execution=1)
    if BACKEND != "jax":
        assert "make_train_function" not in model.__dict__
        return
    assert not isinstance(_train_function(model), ScanTrainFunction)
    model.compile(optimizer="adam", loss="mse", steps_per_execution=4,
                  jit_compile=False)
    assert not isinstance(_train_function(model), ScanTrainFunction)
    model.compile(optimizer="adam", loss="mse", steps_per_execution=4)
    assert isinstance(_train_function(model), ScanTrainFunction)
    # Twice: the same override.
    assert scan_train_steps(model).make_train_function is (
        model.make_train_function)

    from keras.src.trainers.data_adapters import data_adapter_utils

    monkeypatch.setattr(data_adapter_utils, "super_batch_iterator",
                        lambda *args, **kwargs: None, raising=False)
    assert not isinstance(_train_function(model), ScanTrainFunction)


def test_bad_model():
    with pytest.raises(ValueError, match="model must be a keras.Model"):
        scan_train_steps(keras.layers.Dense(2))


@pytest.mark.backends("jax")
@jax_only
def test_data_parallel():
    """Under `keras.distribution.DataParallel` over the host devices (two
    in the JAX child run): the weights of Keras's loop under the same
    distribution, short chunk included."""
    import jax

    if len(jax.devices()) < 2:
        pytest.skip("one device: no data parallelism")
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=jax.devices()))
    try:
        weights = []
        for scan in (False, True):
            model = _model(scan)
            model.fit(*_data(10 * BATCH), batch_size=BATCH, epochs=1,
                      shuffle=False, verbose=0)
            assert isinstance(model.train_function, ScanTrainFunction) == (
                scan)
            weights.append(_weights(model))
    finally:
        keras.distribution.set_distribution(previous)
    _assert_same_weights(weights[1], weights[0])
