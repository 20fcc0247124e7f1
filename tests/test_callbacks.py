"""`AttentionMonitor` in `model.fit`: what it writes, read back with
TensorBoard's own event reader, against numpy and the model's own recorded
attention; the weights of a fit without it; bad input; divergence.

The fit cases run here on TensorFlow; those that differ by backend, marked
`backends(...)`, run again in tests/test_backends.py's child runs: the
distributed fit on JAX (with two host devices, so it is data parallel) and
the eager fit on torch (each JAX fit compiles its train step and the probe:
about 10 s on 2 shared cores).
"""

import contextlib
import logging
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from _backends import BACKEND
from _backends import REPO_ROOT
from _backends import from_outer_run
from keras_attention import AttentionMonitor
from keras_attention import build_sequence_model
from keras_attention import record_attention
from keras_attention.viz import decode_summary

SEQ_LEN, VOCAB, BATCH = 8, 10, 8
# 64 examples in batches of 8, two epochs: 16 steps.
STEPS = 16


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    # Ids from 1: no padding, so every key is attendable.
    x = rng.integers(1, VOCAB, (64, SEQ_LEN))
    y = rng.integers(0, VOCAB, (64, SEQ_LEN))
    return x, y


def _model(jit_compile="auto", loss=None, num_layers=2):
    keras.utils.set_random_seed(1)
    model = build_sequence_model(
        vocab_size=VOCAB, seq_len=SEQ_LEN, num_classes=VOCAB, d_model=16,
        key_dim=8, num_heads=2, num_layers=num_layers, dropout=0.1,
    )
    model.compile(
        optimizer="adam",
        loss=loss or keras.losses.SparseCategoricalCrossentropy(
            from_logits=True),
        metrics=["accuracy"], jit_compile=jit_compile,
    )
    return model


def _fit(model, data, callbacks, **kwargs):
    x, y = data
    return model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0,
                     shuffle=False, callbacks=callbacks, **kwargs)


def _read(directory):
    """`{tag: {step: ndarray}}` of a run, by TensorBoard's reader."""
    accumulator = event_accumulator.EventAccumulator(
        str(directory), size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    return {
        tag: {event.step: tensor_util.make_ndarray(event.tensor_proto)
              for event in accumulator.Tensors(tag)}
        for tag in accumulator.Tags()["tensors"]
    }


def _same(first, second):
    return all(np.array_equal(a, b) for a, b in zip(first, second))


def _check_logged(model, log_dir, examples):
    """Steps counted like Keras's TensorBoard callback; the last step's maps
    are the trained model's own recorded attention (an eager call), and the
    entropy scalars numpy's entropy of them."""
    tags = _read(log_dir / "train")
    with record_attention(model) as records:
        model(examples, training=False)
    for name in ("attention_0", "attention_1"):
        steps = tags[f"attention/{name}/maps"]
        assert sorted(steps) == [0, 3, 6, 9, 12, 15, STEPS]
        meta, maps = decode_summary(steps[STEPS])
        weights = keras.ops.convert_to_numpy(records[name]["weights"])
        np.testing.assert_allclose(maps, weights, atol=1e-3)  # float16
        assert meta["query_labels"][0] == [str(i) for i in range(SEQ_LEN)]
        entropy = -np.sum(weights * np.log(weights), axis=-1) / np.log(
            SEQ_LEN)
        for head in range(2):
            logged = tags[f"attention/{name}/entropy_normalized/head{head}"]
            np.testing.assert_allclose(logged[STEPS],
                                       entropy[:, head].mean(), rtol=1e-4)
    assert {float(value) for value in tags["attention/diverged"].values()
            } == {0.0}
    # No targets: no gradient statistics.
    assert not any(tag.startswith("gradients/") for tag in tags)


@pytest.mark.parametrize("jit_compile", [
    # XLA on TensorFlow's CPU compiles the two fits in about 24 s (2 shared
    # cores); JAX's run (always compiled) covers a compiled train step.
    pytest.param(True, marks=pytest.mark.slow) if BACKEND == "tensorflow"
    else True,
    False,
])
@pytest.mark.backends("torch", cases=["False"])
def test_fit_weights_and_maps(data, tmp_path, jit_compile):
    """The weights of a fit with the monitor are those of a fit without it
    (bit for bit; same seed, same data, dropout on)."""
    x, y = data
    monitored = _model(jit_compile)
    _fit(monitored, data, [AttentionMonitor(tmp_path, x[:4],
                                            update_freq=3)])
    plain = _model(jit_compile)
    _fit(plain, data, [])
    assert _same(monitored.get_weights(), plain.get_weights())
    _check_logged(monitored, tmp_path, x[:4])


@pytest.mark.backends("jax")
def test_fit_distributed_weights_and_maps(data, tmp_path):
    x, y = data
    if BACKEND == "jax":
        import jax

        previous = keras.distribution.distribution()
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(devices=jax.devices()))
        scope = contextlib.nullcontext
    elif BACKEND == "tensorflow":
        import tensorflow as tf

        scope = tf.distribute.MirroredStrategy(["/cpu:0"]).scope
    else:
        pytest.skip("fit has no distribution on torch")
    try:
        models = []
        for callbacks in ([AttentionMonitor(tmp_path, x[:4],
                                            update_freq=3)], []):
            with scope():
                model = _model()
            _fit(model, data, callbacks)
            models.append(model)
    finally:
        if BACKEND == "jax":
            keras.distribution.set_distribution(previous)
    assert _same(models[0].get_weights(), models[1].get_weights())
    _check_logged(models[0], tmp_path, x[:4])


def test_fit_gradients_of_the_compiled_loss(data, tmp_path):
    """With `(x, y)`, |dL/dscores| is that of the model's compiled loss (an
    MSE on one-hot targets here), as the eager probe gives it."""
    from keras_attention.diagnostics import probe_diagnostics

    x, y = data
    one_hot = np.eye(VOCAB, dtype="float32")[y]
    model = _model(loss="mse")
    x_fit, y_fit = x, one_hot
    # Beside Keras's own TensorBoard callback in the same log_dir, where
    # TensorFlow runs it.
    keras_board = ([keras.callbacks.TensorBoard(tmp_path)]
                   if BACKEND == "tensorflow" else [])
    model.fit(x_fit, y_fit, batch_size=BATCH, epochs=1, verbose=0,
              callbacks=[AttentionMonitor(tmp_path, (x[:4], one_hot[:4]),
                                          update_freq=100), *keras_board])
    tags = _read(tmp_path / "train")
    if keras_board:
        assert 0 in tags["epoch_loss"]  # Keras's, read with ours.
    end = 8

    def mse(targets, outputs, weights):
        return keras.ops.mean((targets - outputs) ** 2)

    eager = probe_diagnostics(model, x[:4], one_hot[:4], None, loss_fn=mse)
    for name, stats in eager["layers"].items():
        np.testing.assert_allclose(
            tags[f"gradients/{name}/scores"][end], stats["grad_norm_scores"],
            rtol=1e-4)
        assert stats["grad_norm_scores"] > 0


def test_fit_labels_and_metrics(data, tmp_path):
    x, y = data
    model = _model()
    history = _fit(
        model, data,
        [AttentionMonitor(tmp_path, x[:4], labels=lambda ids: [
            [f"t{token}" for token in row] for row in ids],
            log_metrics=True)],
        validation_data=(x[:16], y[:16]))
    meta, _ = decode_summary(
        _read(tmp_path / "train")["attention/attention_0/maps"][0])
    assert meta["key_labels"][1] == [f"t{token}" for token in x[1]]
    for run, prefix in (("train", ""), ("validation", "val_")):
        logged = _read(tmp_path / run)["epoch_loss"]
        np.testing.assert_allclose(
            [logged[epoch] for epoch in (0, 1)],
            history.history[f"{prefix}loss"], rtol=1e-6)


def test_fit_keras_multi_head_attention(data, tmp_path):
    """A user's own model of `keras.layers.MultiHeadAttention`: the maps
    logged at the end are the layer's own `return_attention_scores=True`
    output, and (with targets) |dL/dscores| is logged for it."""
    x, y = data
    keras.utils.set_random_seed(2)
    tokens = keras.Input((SEQ_LEN,), dtype="int32")
    hidden = keras.layers.Embedding(VOCAB, 8, name="embed")(tokens)
    attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4,
                                                name="mha")
    outputs = keras.layers.Dense(VOCAB)(attention(hidden, hidden))
    model = keras.Model(tokens, outputs)
    model.compile(optimizer="adam", loss=keras.losses.
                  SparseCategoricalCrossentropy(from_logits=True))
    _fit(model, data, [AttentionMonitor(tmp_path, (x[:4], y[:4]),
                                        update_freq=5)])
    tags = _read(tmp_path / "train")
    steps = tags["attention/mha/maps"]
    assert sorted(steps) == [0, 5, 10, 15, STEPS]
    _, maps = decode_summary(steps[STEPS])
    embedded = model.get_layer("embed")(x[:4])
    _, scores = attention(embedded, embedded, return_attention_scores=True)
    np.testing.assert_allclose(maps, keras.ops.convert_to_numpy(scores),
                               atol=1e-3)  # float16
    assert tags["gradients/mha/scores"][STEPS] > 0


class _Poison(keras.callbacks.Callback):
    """Makes a kernel non-finite after batch `at` (the training diverges)."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.at:
            kernel = self.model.get_layer("logits").kernel
            kernel.assign(np.full(kernel.shape, np.nan, "float32"))


def test_fit_diverged_model_is_marked(data, tmp_path, caplog):
    x, y = data
    model = _model()
    with caplog.at_level(logging.WARNING, logger="keras_attention"):
        # No targets: the attention before the poisoned classifier stays
        # finite; the weights tell.
        _fit(model, data, [_Poison(at=4),
                           AttentionMonitor(tmp_path, x[:4], update_freq=3)])
    diverged = _read(tmp_path / "train")["attention/diverged"]
    assert {step: float(value) for step, value in diverged.items()} == {
        0: 0.0, 3: 0.0, 6: 1.0, 9: 1.0, 12: 1.0, 15: 1.0, STEPS: 1.0}
    assert sorted(_read(tmp_path / "train")["attention/attention_0/maps"]
                  ) == [0, 3]
    warnings = [r for r in caplog.records if r.name == "keras_attention"]
    assert len(warnings) == 1 and "step 6" in warnings[0].getMessage()


# ------------------------------------------------------------- bad input
@pytest.mark.parametrize("update_freq", [0, -1, 1.5, True, "batch"])
def test_bad_update_freq(tmp_path, update_freq):
    with pytest.raises(ValueError, match="`update_freq`"):
        AttentionMonitor(tmp_path, np.ones((2, SEQ_LEN)),
                         update_freq=update_freq)


def test_log_dir_that_is_a_file(tmp_path):
    path = tmp_path / "file"
    path.write_text("taken")
    with pytest.raises(ValueError, match="`log_dir`"):
        AttentionMonitor(path, np.ones((2, SEQ_LEN)))
    assert path.read_text() == "taken"


def test_examples_the_model_cannot_take(data, tmp_path):
    x, y = data
    model = _model()
    before = model.get_weights()
    with pytest.raises(ValueError, match="`examples`"):
        _fit(model, data, [AttentionMonitor(tmp_path / "run",
                                            x[:4, :SEQ_LEN - 3])])
    assert not (tmp_path / "run").exists()
    assert _same(model.get_weights(), before)  # Refused before a batch.


def test_model_without_attention(data, tmp_path):
    x, y = data
    model = keras.Sequential([keras.Input((SEQ_LEN,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="`model`"):
        model.fit(x[:8], np.zeros((8, 2)), verbose=0,
                  callbacks=[AttentionMonitor(tmp_path / "run", x[:2])])
    assert not (tmp_path / "run").exists()


def test_labels_that_do_not_fit(data, tmp_path):
    x, y = data
    with pytest.raises(ValueError, match="`labels`"):
        AttentionMonitor(tmp_path, x[:4], labels=3)
    with pytest.raises(ValueError, match="`labels`"):
        _fit(_model(), data, [AttentionMonitor(
            tmp_path / "run", x[:4], labels=[["a"] * SEQ_LEN] * 2)])
    assert not (tmp_path / "run").exists()


_WITHOUT_TENSORFLOW = """
import sys

# As if TensorFlow were not installed: `import tensorflow` raises
# ModuleNotFoundError and `importlib.util.find_spec` finds nothing.
sys.modules["tensorflow"] = None
import keras, numpy as np
from keras_attention import AttentionMonitor, build_sequence_model

x = np.arange(1, 17).reshape(2, 8) % 9 + 1
model = build_sequence_model(vocab_size=10, seq_len=8, num_classes=10,
                             d_model=8, key_dim=4)
model.compile(optimizer="sgd", loss=keras.losses.
              SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(x, x, epochs=2, verbose=0,
                    callbacks=[AttentionMonitor(sys.argv[1], x)])
print(history.history["loss"])
assert sys.modules["tensorflow"] is None
"""


@from_outer_run
def test_fit_without_tensorflow_logs_the_loss(tmp_path):
    """Where TensorFlow cannot be imported (torch here), the monitor also
    writes fit's loss, as Keras's TensorBoard callback would."""
    pytest.importorskip("torch")
    env = {**os.environ, "KERAS_BACKEND": "torch",
           "PYTHONPATH": os.pathsep.join(filter(None, [
               REPO_ROOT,
               os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TENSORFLOW, str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [float(value) for value in
              result.stdout.strip().splitlines()[-1].strip("[]").split(",")]
    logged = _read(tmp_path / "train")
    np.testing.assert_allclose([logged["epoch_loss"][epoch]
                                for epoch in (0, 1)], losses, rtol=1e-6)
    assert sorted(logged["attention/attention_0/maps"]) == [0, 2]
