"""Tests of `keras_attention.TransformerBlock`: its forward pass against
numpy, its config and `.keras` round trips, and the initial weights that
blocks differing only in the scale share."""

import math

import keras
import numpy as np
import pytest

from keras_attention import TransformerBlock
from keras_attention import attention_layers
from keras_attention.transformer_block import ATTENTION_OPTIONS

_numpy = keras.ops.convert_to_numpy
_erf = np.vectorize(math.erf)

WIDTH, KEY_DIM, HEADS, VALUE_DIM, HIDDEN, LENGTH = 12, 4, 2, 3, 20, 6


# ------------------------------------------------------------- numpy model
def _layer_norm(x, norm):
    mean = x.mean(-1, keepdims=True)
    normed = (x - mean) / np.sqrt(x.var(-1, keepdims=True) + norm.epsilon)
    return normed * _numpy(norm.gamma) + _numpy(norm.beta)


def _attention(x, valid, causal, layer):
    q, k, v = (
        np.einsum("btd,dhk->bthk", x, _numpy(kernel))
        for kernel in (layer.query_kernel, layer.key_kernel,
                       layer.value_kernel)
    )
    scores = np.einsum("bthk,bshk->bhts", q, k) / math.sqrt(KEY_DIM)
    allowed = valid[:, None, :, None] & valid[:, None, None, :]
    if causal:
        allowed = allowed & np.tri(x.shape[1], dtype=bool)
    scores = np.where(allowed, scores, -np.inf)
    top = np.max(scores, -1, keepdims=True)
    exp = np.where(allowed, np.exp(scores - np.where(np.isfinite(top), top,
                                                     0.0)), 0.0)
    total = exp.sum(-1, keepdims=True)
    weights = np.divide(exp, total, out=np.zeros_like(exp), where=total > 0)
    heads = np.einsum("bhts,bshv->bthv", weights, v)
    return np.einsum("bthv,hvd->btd", heads, _numpy(layer.output_kernel))


def _feed_forward(x, block):
    hidden = x @ _numpy(block.ff_hidden.kernel) + _numpy(block.ff_hidden.bias)
    hidden = 0.5 * hidden * (1.0 + _erf(hidden / math.sqrt(2.0)))  # exact gelu
    return hidden @ _numpy(block.ff_output.kernel) + _numpy(
        block.ff_output.bias
    )


def _reference(block, x, valid, causal):
    if block.norm == "pre":  # x + Attn(LN(x)), then x + FF(LN(x))
        x = x + _attention(_layer_norm(x, block.attention_norm), valid,
                           causal, block.attention)
        return x + _feed_forward(_layer_norm(x, block.ff_norm), block)
    # LN(x + Attn(x)), then LN(x + FF(x))
    x = _layer_norm(x + _attention(x, valid, causal, block.attention),
                    block.attention_norm)
    return _layer_norm(x + _feed_forward(x, block), block.ff_norm)


def _randomize(block, seed):
    """Every weight random, so that the norms' gains and offsets and the
    biases all take part."""
    rng = np.random.default_rng(seed)
    for weight in block.weights:
        values = rng.normal(0.0, 0.4, size=weight.shape)
        if weight.path.endswith("gamma"):
            values = 1.0 + values
        weight.assign(values.astype("float32"))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_forward_pass_matches_numpy_with_a_padding_mask(norm, causal):
    block = TransformerBlock(key_dim=KEY_DIM, num_heads=HEADS,
                             value_dim=VALUE_DIM, intermediate_dim=HIDDEN,
                             norm=norm)
    block.build((None, LENGTH, WIDTH))
    _randomize(block, seed=1)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, LENGTH, WIDTH)).astype("float32")
    valid = np.ones((3, LENGTH), bool)
    valid[0, 4:] = False
    valid[2, 1:] = False
    got = _numpy(block(x, mask=valid, use_causal_mask=causal))
    np.testing.assert_allclose(got, _reference(block, x, valid, causal),
                               rtol=1e-5, atol=1e-5)
    # The mask matters: without it the padded keys take weight and the
    # padded queries attend.
    unmasked = _numpy(block(x, use_causal_mask=causal))
    assert not np.allclose(unmasked[0], got[0], atol=1e-3)


def test_without_a_feed_forward_network_the_block_is_attention_only():
    block = TransformerBlock(key_dim=KEY_DIM, num_heads=HEADS,
                             intermediate_dim=0, norm="post")
    block.build((None, LENGTH, WIDTH))
    assert block.ff_hidden is None and block.ff_norm is None
    _randomize(block, seed=3)
    x = np.random.default_rng(4).normal(size=(2, LENGTH, WIDTH))
    x = x.astype("float32")
    valid = np.ones((2, LENGTH), bool)
    expected = _layer_norm(
        x + _attention(x, valid, False, block.attention), block.attention_norm
    )
    np.testing.assert_allclose(_numpy(block(x)), expected, rtol=1e-5,
                               atol=1e-5)
    assert TransformerBlock(key_dim=4).compute_output_shape((2, 5, 8)) == (
        2, 5, 8
    )


# ----------------------------------------------------------------- config
OPTIONS = dict(key_dim=KEY_DIM, num_heads=HEADS, value_dim=VALUE_DIM,
               intermediate_dim=HIDDEN,
               attention_options=dict(scale="learned", qk_norm=True,
                                      implementation="explicit"),
               norm="post", dropout=0.1, activation="relu",
               layer_norm_epsilon=1e-5, query_key_initializer="he_normal",
               query_key_gain=2.0)


def test_get_config_round_trip():
    block = TransformerBlock(**OPTIONS, name="b", attention_name="att")
    config = block.get_config()
    clone = TransformerBlock.from_config(config)
    assert clone.get_config() == config
    for name, value in OPTIONS.items():
        if not name.endswith(("initializer", "activation")):
            assert config[name] == value, name
    assert config["activation"] == "relu"
    assert config["attention_name"] == "att"


def test_stacked_blocks_save_and_load_with_identical_outputs(tmp_path):
    keras.utils.set_random_seed(5)
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(10, WIDTH, mask_zero=True)(tokens)
    for index in range(2):
        x = TransformerBlock(**OPTIONS, name=f"block_{index}")(
            x, use_causal_mask=True
        )
    model = keras.Model(tokens, keras.layers.Dense(10)(x))
    # Each block names its attention layer after itself.
    assert [layer.name for layer in attention_layers(model)] == [
        "block_0_attention", "block_1_attention"
    ]
    batch = np.array([[3, 1, 4, 1, 5, 0], [9, 2, 6, 5, 3, 5]], "int32")
    expected = _numpy(model(batch))
    model.save(tmp_path / "model.keras")
    restored = keras.saving.load_model(tmp_path / "model.keras")
    assert isinstance(restored.get_layer("block_1"), TransformerBlock)
    assert restored.get_layer("block_1").get_config() == (
        model.get_layer("block_1").get_config()
    )
    np.testing.assert_array_equal(_numpy(restored(batch)), expected)


@pytest.mark.parametrize("argument, value", [
    ("intermediate_dim", -1), ("attention_options", {"dropout": 0.1}),
    ("attention_options", ["scale"]), ("norm", "sandwich"),
    ("dropout", 1.0), ("activation", "swishy"), ("layer_norm_epsilon", 0.0),
    ("query_key_gain", float("nan")), ("attention_name", ""),
])
def test_bad_arguments_raise_value_error_naming_them(argument, value):
    with pytest.raises(ValueError, match=f"`{argument}`"):
        TransformerBlock(key_dim=4, **{argument: value})


@pytest.mark.parametrize("argument, value", [
    ("key_dim", 0), ("num_heads", 1.5), ("value_dim", 0), ("scale", "cosine"),
    ("scale", -2.0), ("implementation", "flash"), ("qk_norm", "yes"),
])
def test_bad_attention_options_are_refused_by_the_layer_when_built(
    argument, value
):
    block = (TransformerBlock(key_dim=4, attention_options={argument: value})
             if argument in ATTENTION_OPTIONS
             else TransformerBlock(**{"key_dim": 4, argument: value}))
    with pytest.raises(ValueError, match=f"`{argument}`"):
        block.build((None, LENGTH, WIDTH))


# ------------------------------------------------------- initial weights
def _initial_weights(seed, **options):
    keras.utils.set_random_seed(seed)
    block = TransformerBlock(key_dim=KEY_DIM, num_heads=HEADS,
                             query_key_initializer="random_normal",
                             name="block", **options)
    block.build((None, LENGTH, WIDTH))
    return {weight.path: _numpy(weight) for weight in block.weights}


def test_blocks_differing_only_by_scale_share_their_initial_weights():
    reference = _initial_weights(7)
    for variant in (dict(scale="none"), dict(scale="inverse"),
                    dict(scale="learned"), dict(scale=0.05),
                    dict(qk_norm=True)):
        weights = _initial_weights(7, attention_options=variant)
        assert set(reference) <= set(weights), variant
        for path, value in reference.items():
            np.testing.assert_array_equal(value, weights[path],
                                          err_msg=f"{variant} {path}")
    # Not vacuous: another seed draws other weights.
    other = _initial_weights(8)
    assert not np.allclose(other["block/ff_hidden/kernel"],
                           reference["block/ff_hidden/kernel"])


def test_query_key_gain_scales_only_the_query_and_key_kernels():
    plain = _initial_weights(9)
    scaled = _initial_weights(9, query_key_gain=3.0)
    for path, value in plain.items():
        if path.endswith(("query_kernel", "key_kernel")):
            np.testing.assert_allclose(scaled[path], value * np.float32(3.0),
                                       rtol=1e-7)
        else:
            np.testing.assert_array_equal(scaled[path], value, err_msg=path)
