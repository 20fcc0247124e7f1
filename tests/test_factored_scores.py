"""The factored scores of `ScaledDotProductAttention` (`implementation=
"auto"` when d_k is well above the input widths): `Q Kᵀ` computed as
`X̃_q (W̃_Q W̃_Kᵀ) X̃_kᵀ` gives the explicit layer's outputs and gradients.

The reference is test_layer.py's float64 numpy layer and an explicit layer
holding the same weights. Runs under TensorFlow, and the marked cases
under JAX and torch (tests/test_backends.py).
"""

import keras
import numpy as np
import pytest
from keras import ops

from _backends import layer_gradients
from keras_attention import ScaledDotProductAttention
from keras_attention import _layer_utils
from keras_attention import paths
from test_layer import reference
from test_layer import to_np

WIDTHS = {"query": 6, "key": 5, "value": 7}


@pytest.fixture
def factored_calls(spy):
    """The calls of `factored_query_key`."""
    return spy(_layer_utils, "factored_query_key")


def _inputs(rng, cross, batch=3, length=5, keys=6):
    query = rng.standard_normal((batch, length, WIDTHS["query"]))
    if not cross:
        return query.astype("float32"), None, None
    value = rng.standard_normal((batch, keys, WIDTHS["value"]))
    key = rng.standard_normal((batch, keys, WIDTHS["key"]))
    return tuple(x.astype("float32") for x in (query, value, key))


def _masks(rng, kind, batch, length, keys):
    if kind == "causal":
        return {"use_causal_mask": True}
    if kind == "padding":
        query_mask = rng.random((batch, length)) < 0.8
        key_mask = rng.random((batch, keys)) < 0.7
        key_mask[:, 0] = True
        return {"query_mask": query_mask, "key_mask": key_mask,
                "attention_mask": rng.random((batch, length, keys)) < 0.8}
    return {}


def _reference_masks(masks):
    options = dict(masks)
    options["causal"] = options.pop("use_causal_mask", False)
    return options


@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("mask", ["none", "causal", "padding"])
@pytest.mark.parametrize("scale", ["sqrt", "none", "learned"])
@pytest.mark.backends("jax", "torch", cases=[
    "learned-padding-True-True", "sqrt-causal-False-False"])
def test_factored_layer_matches_reference(use_bias, cross, mask, scale,
                                          factored_calls):
    rng = np.random.default_rng(7)
    layer = ScaledDotProductAttention(
        key_dim=32, num_heads=2, value_dim=4, output_dim=3, scale=scale,
        use_bias=use_bias, bias_initializer="random_normal")
    query, value, key = _inputs(rng, cross)
    masks = _masks(rng, mask, 3, 5, 6 if cross else 5)
    if not cross and "key_mask" in masks:
        masks["key_mask"] = masks["key_mask"][:, :5]
        masks["attention_mask"] = masks["attention_mask"][:, :, :5]
    output = layer(query, value, key, **masks)
    assert factored_calls, "the layer did not take the factored scores"
    expected, _ = reference(layer, query, value, key,
                            **_reference_masks(masks))
    np.testing.assert_allclose(to_np(output), expected, atol=2e-5)


def _twin(layer, query, value, key, **options):
    """An explicit layer with `layer`'s configuration and weights."""
    twin = ScaledDotProductAttention.from_config(
        {**layer.get_config(), "implementation": "explicit"})
    twin(query, value, key, **options)
    twin.set_weights(layer.get_weights())
    return twin


@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize("soft_cap", [None, 3.0])
@pytest.mark.backends("jax", "torch", cases=["None-True"])
def test_factored_gradients_match_explicit(use_bias, soft_cap,
                                           factored_calls):
    keras.utils.set_random_seed(3)
    rng = np.random.default_rng(3)
    layer = ScaledDotProductAttention(
        key_dim=40, num_heads=3, value_dim=5, output_dim=4, scale="learned",
        use_bias=use_bias, bias_initializer="random_normal",
        logit_soft_cap=soft_cap)
    query, value, key = _inputs(rng, cross=True)
    target = ops.convert_to_tensor(
        rng.standard_normal((3, 5, 4)).astype("float32"))

    def loss(output):
        return ops.sum((output - target) ** 2)

    options = {"use_causal_mask": True}
    value_f, grads_f = layer_gradients(layer, [query, value, key], loss,
                                       **options)
    assert factored_calls
    twin = _twin(layer, query, value, key, **options)
    value_e, grads_e = layer_gradients(twin, [query, value, key], loss,
                                       **options)
    np.testing.assert_allclose(value_f, value_e, rtol=1e-5)
    for variable, got, want in zip(layer.trainable_weights, grads_f, grads_e):
        scale = np.abs(want).max()
        np.testing.assert_allclose(got, want, atol=2e-5 * max(scale, 1.0),
                                   err_msg=variable.path)


@pytest.mark.backends("jax", "torch")
def test_factored_memory_efficient_path_matches_reference(monkeypatch,
                                                          factored_calls):
    # Long sequences: "auto" chunks the factored queries and keys.
    monkeypatch.setattr(paths, "MEMORY_EFFICIENT_THRESHOLD", 16)
    rng = np.random.default_rng(11)
    layer = ScaledDotProductAttention(key_dim=32, num_heads=2, value_dim=4,
                                      use_bias=True,
                                      bias_initializer="random_normal")
    query, value, key = _inputs(rng, cross=True, length=9, keys=11)
    key_mask = rng.random((3, 11)) < 0.7
    output = layer(query, value, key, key_mask=key_mask)
    assert factored_calls
    expected, _ = reference(layer, query, value, key, key_mask=key_mask)
    np.testing.assert_allclose(to_np(output), expected, atol=2e-5)


@pytest.mark.parametrize("options", [
    {"return_attention_scores": True},
    {"layer": {"qk_norm": True}},
    {"layer": {"scale": "ssmax"}},
    {"layer": {"implementation": "explicit"}},
    {"layer": {"dtype": "mixed_float16"}},
    {"layer": {"dropout": 0.5}, "training": True},
])
def test_factored_only_where_nothing_needs_q_and_k(options, factored_calls):
    options = dict(options)
    layer = ScaledDotProductAttention(key_dim=32, num_heads=2,
                                      **options.pop("layer", {}))
    query, _, _ = _inputs(np.random.default_rng(0), cross=False)
    layer(query, **options)
    assert not factored_calls


@pytest.mark.parametrize("query_shape,key_shape,key_dim,use_bias,factors", [
    ((64, 17, 64), (64, 17, 64), 1024, False, True),  # the comparison's
    ((64, 17, 64), (64, 17, 64), 128, False, True),  # 2 x 64 <= 128
    ((64, 17, 64), (64, 17, 64), 128, True, False),  # 2 x 65 > 128
    ((2, 8, 512), (2, 8, 512), 64, False, False),  # the usual d_k < D
    ((None, None, 16), (None, None, 16), 64, True, True),  # symbolic
    ((1, 4, 16), (1, 4, 16), 64, False, False),  # 4 rows, M costs more
    ((1, 4, 16), (1, 9, 64), 256, False, False),  # 4 rows < 64 key inputs
])
def test_factor_rule(query_shape, key_shape, key_dim, use_bias, factors):
    assert _layer_utils.factor_query_key(
        query_shape, key_shape, key_dim, use_bias) is factors
