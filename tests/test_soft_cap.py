"""`logit_soft_cap` (Gemma 2's attention logit soft-capping) against numpy:
the scaled scores become `c * tanh(s / c)` before the mask and the softmax,
on the layer's explicit and memory-efficient paths; the fused path refuses
it, and so does the command line, in one line naming the flag.
"""

import json

import keras
import numpy as np
import pytest
from keras import ops

from _backends import layer_gradients
from keras_attention import ScaledDotProductAttention
from tests.conftest import train_tiny

KEY_DIM, HEADS, T, WIDTH = 16, 2, 6, 8


def _numpy(x):
    return np.asarray(ops.convert_to_numpy(x), np.float64)


def _reference(kernels, x, cap, mask):
    """The layer's output and weights by hand, in float64: unscaled scores,
    capped, masked, softmax, values, output projection."""
    q, k, v = (np.einsum("btd,dhk->bthk", x, kernels[name])
               for name in ("query", "key", "value"))
    scores = np.einsum("bthk,bshk->bhts", q, k)  # scale="none"
    if cap is not None:
        scores = cap * np.tanh(scores / cap)
    scores = np.where(mask, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    attended = np.einsum("bhts,bshd->bthd", weights, v)
    return np.einsum("bthd,hdo->bto", attended, kernels["output"]), weights


def _kernels(layer):
    return {name: _numpy(getattr(layer, f"{name}_kernel"))
            for name in ("query", "key", "value", "output")}


@pytest.mark.parametrize("implementation",
                         ["auto", "explicit", "memory_efficient"])
@pytest.mark.backends("jax", "torch")
def test_capped_scores_match_numpy(implementation):
    rng = np.random.default_rng(7)
    # Unscaled scores at d_k 16 with inputs of sd 3 reach far past the cap.
    x = (3.0 * rng.standard_normal((2, T, WIDTH))).astype("float32")
    causal = np.tril(np.ones((T, T), bool))
    outputs = {}
    for cap in (None, 2.0):
        keras.utils.set_random_seed(3)
        layer = ScaledDotProductAttention(
            KEY_DIM, HEADS, output_dim=WIDTH, scale="none",
            implementation=implementation, logit_soft_cap=cap)
        output = layer(x, use_causal_mask=True)
        expected, expected_weights = _reference(
            _kernels(layer), x.astype(np.float64), cap, causal)
        np.testing.assert_allclose(_numpy(output), expected, rtol=1e-4,
                                   atol=1e-4)
        if implementation != "memory_efficient":  # it returns no weights
            _, weights = layer(x, use_causal_mask=True,
                               return_attention_scores=True)
            np.testing.assert_allclose(_numpy(weights), expected_weights,
                                       atol=1e-5)
        outputs[cap] = _numpy(output)
    # Not vacuous: the cap changes the output.
    assert np.abs(outputs[2.0] - outputs[None]).max() > 1e-2


@pytest.mark.parametrize("implementation", ["auto", "memory_efficient"])
@pytest.mark.backends("jax", "torch")
def test_capped_gradients_match_finite_differences_of_numpy(implementation):
    rng = np.random.default_rng(8)
    # Scores of a few units: the cap of 2 bends them without saturating.
    x = rng.standard_normal((2, T, WIDTH)).astype("float32")
    upstream = rng.standard_normal((2, T, WIDTH))
    keras.utils.set_random_seed(4)
    layer = ScaledDotProductAttention(KEY_DIM, HEADS, output_dim=WIDTH,
                                      scale="none", logit_soft_cap=2.0,
                                      implementation=implementation)
    _, grads = layer_gradients(layer, [x], lambda y: ops.sum(
        y * ops.convert_to_tensor(upstream, y.dtype)))
    kernels, no_mask = _kernels(layer), np.ones((T, T), bool)
    assert layer.trainable_weights[0] is layer.query_kernel
    for index in [(0, 0, 0), (3, 1, 5), (7, 0, 15)]:
        ends = []
        for step in (1e-6, -1e-6):
            bumped = {**kernels, "query": kernels["query"].copy()}
            bumped["query"][index] += step
            output, _ = _reference(bumped, x.astype(np.float64), 2.0, no_mask)
            ends.append(np.sum(output * upstream))
        np.testing.assert_allclose(_numpy(grads[0])[index],
                                   (ends[0] - ends[1]) / 2e-6, rtol=1e-3,
                                   atol=1e-4)
    # Not vacuous: the same layer uncapped has another gradient.
    uncapped = ScaledDotProductAttention(KEY_DIM, HEADS, output_dim=WIDTH,
                                         scale="none")
    uncapped.build(x.shape)
    uncapped.set_weights(layer.get_weights())
    _, plain = layer_gradients(uncapped, [x], lambda y: ops.sum(
        y * ops.convert_to_tensor(upstream, y.dtype)))
    assert np.abs(_numpy(grads[0]) - _numpy(plain[0])).max() > 1e-2


@pytest.mark.parametrize("kwargs", [
    dict(logit_soft_cap=0.0), dict(logit_soft_cap=-1.0),
    dict(logit_soft_cap=float("inf")), dict(logit_soft_cap=float("nan")),
    dict(logit_soft_cap=True), dict(logit_soft_cap="30"),
    dict(logit_soft_cap=30.0, implementation="fused"),
])
@pytest.mark.backends("jax", "torch")
def test_bad_caps_and_paths_that_cannot_cap_are_refused(kwargs):
    with pytest.raises(ValueError, match="`logit_soft_cap`"):
        ScaledDotProductAttention(KEY_DIM, **kwargs)


def test_the_cap_serializes():
    layer = ScaledDotProductAttention(KEY_DIM, logit_soft_cap=30.0)
    config = json.loads(json.dumps(layer.get_config()))
    assert config["logit_soft_cap"] == 30.0
    assert ScaledDotProductAttention.from_config(config).logit_soft_cap == 30.0


def test_train_takes_the_cap_to_every_layer(tmp_path):
    assert train_tiny(tmp_path, logit_soft_cap=30.0) == (0, [])
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["logit_soft_cap"] == 30.0
    model = keras.saving.load_model(tmp_path / "run" / "model.keras")
    caps = [layer.logit_soft_cap for layer in model._flatten_layers()
            if isinstance(layer, ScaledDotProductAttention)]
    assert caps and set(caps) == {30.0}


# 0 and below, and the largest float32, are test_setting_extremes' cases.
@pytest.mark.parametrize("settings", [
    dict(logit_soft_cap=float("inf")), dict(logit_soft_cap=float("nan")),
    dict(logit_soft_cap=30.0, implementation="fused"),
])
def test_train_refuses_a_bad_cap_in_one_line(tmp_path, settings):
    status, err = train_tiny(tmp_path, **settings)
    assert status == 2
    assert len(err) == 1 and "--logit-soft-cap" in err[0], err
    assert not (tmp_path / "run").exists()
