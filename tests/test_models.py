"""Tests of `keras_attention.models`."""

import math

import keras
import numpy as np
import pytest

from keras_attention.layer import ScaledDotProductAttention
from keras_attention.embeddings import FactoredEmbedding
from keras_attention.models import build_sequence_model
from keras_attention.transformer_block import ATTENTION_OPTIONS
from keras_attention.recording import attention_layers
from keras_attention.recording import record_attention

_numpy = keras.ops.convert_to_numpy

SMALL = dict(d_model=16, key_dim=8, num_heads=2, ff_dim=32)


def _build(seed=0, **kwargs):
    keras.utils.set_random_seed(seed)
    options = dict(vocab_size=12, seq_len=7)
    options.update(SMALL)
    options.update(kwargs)
    return build_sequence_model(**options)


def _attention(model, index=0):
    return attention_layers(model)[index]


def _weights_by_path(model):
    return {w.path: np.array(w.numpy()) for w in model.weights}


def _random_tokens(rng, batch, seq_len, vocab_size, low=1):
    return rng.integers(low, vocab_size, size=(batch, seq_len)).astype("int32")


def test_output_shape_dtype_name_and_layer_names():
    model = _build(num_layers=2, num_classes=5)
    assert model.input.dtype == "int32"
    assert model.input.name == "tokens"
    assert model.output_names == ["logits"]
    tokens = _random_tokens(np.random.default_rng(0), 3, 7, 12)
    logits = model(tokens)
    assert tuple(logits.shape) == (3, 7, 5)
    assert logits.dtype == "float32"
    layers = attention_layers(model)
    assert [layer.name for layer in layers] == ["attention_0", "attention_1"]
    assert all(isinstance(layer, ScaledDotProductAttention) for layer in layers)
    # num_classes defaults to vocab_size.
    assert _build().output.shape[-1] == 12


def test_variable_length_needs_max_len_and_accepts_shorter_inputs():
    with pytest.raises(ValueError, match="max_len"):
        _build(seq_len=None)
    model = _build(seq_len=None, max_len=10)
    rng = np.random.default_rng(1)
    for length in (3, 10):
        out = model(_random_tokens(rng, 2, length, 12))
        assert tuple(out.shape) == (2, length, 12)


def test_padded_keys_get_zero_attention_weight():
    model = _build(num_layers=2)
    tokens = np.array(
        [[3, 5, 7, 2, 0, 0, 0], [4, 4, 1, 9, 11, 6, 0]], dtype="int32"
    )
    with record_attention(model) as records:
        model(tokens)
    valid = tokens != 0
    for name in ("attention_0", "attention_1"):
        weights = _numpy(records[name]["weights"])  # (B, H, T, S)
        assert weights.shape == (2, 2, 7, 7)
        padded_keys = np.broadcast_to(~valid[:, None, None, :], weights.shape)
        assert np.all(weights[padded_keys] == 0.0)
        # Valid query rows still form a distribution over the valid keys.
        row_sums = weights.sum(-1).transpose(0, 2, 1)  # (B, T, H)
        np.testing.assert_allclose(row_sums[valid], 1.0, rtol=1e-5)
    # Without padding masks the same positions do receive weight, so the
    # check above is not vacuous.
    unmasked = _build(num_layers=2, mask_padding=False)
    with record_attention(unmasked) as records:
        unmasked(tokens)
    weights = _numpy(records["attention_0"]["weights"])
    assert weights[0, :, :4, 4:].min() > 0.0


def test_padding_does_not_change_logits_of_real_tokens():
    # Two batches that differ only in which id sits at padded positions
    # cannot exist (padding is id 0), so instead vary the *length* of the
    # padding region with the model's variable-length input.
    model = _build(seq_len=None, max_len=10)
    content = np.array([[3, 5, 7, 2]], dtype="int32")
    short = _numpy(model(np.pad(content, ((0, 0), (0, 1)))))
    long = _numpy(model(np.pad(content, ((0, 0), (0, 6)))))
    np.testing.assert_allclose(short[:, :4], long[:, :4], atol=1e-5)


def test_causal_logits_ignore_later_tokens():
    rng = np.random.default_rng(2)
    tokens = _random_tokens(rng, 4, 7, 12)
    changed = tokens.copy()
    cut = 3
    changed[:, cut + 1 :] = (changed[:, cut + 1 :] % 11) + 1  # new non-pad ids
    assert np.all(changed[:, cut + 1 :] != tokens[:, cut + 1 :])

    causal = _build(num_layers=2, causal=True)
    before, after = _numpy(causal(tokens)), _numpy(causal(changed))
    np.testing.assert_allclose(
        before[:, : cut + 1], after[:, : cut + 1], atol=1e-6
    )
    assert not np.allclose(before[:, cut + 1 :], after[:, cut + 1 :])

    # A bidirectional model does see the change at early positions.
    full = _build(num_layers=2, causal=False)
    assert not np.allclose(
        _numpy(full(tokens))[:, : cut + 1],
        _numpy(full(changed))[:, : cut + 1],
    )


def test_factored_embedding_is_sum_of_factor_rows():
    factors = (4, 3, 5)
    keras.utils.set_random_seed(3)
    layer = FactoredEmbedding(factors, output_dim=6)
    tokens = np.array([[0, 1, 2, 60, 17, 0], [33, 5, 16, 59, 0, 44]], "int32")
    out = _numpy(layer(tokens))
    tables = [_numpy(t.numpy()) for t in layer.tables]
    assert [t.shape for t in tables] == [(4, 6), (3, 6), (5, 6)]

    expected = np.zeros(tokens.shape + (6,), "float32")
    for index in np.ndindex(tokens.shape):
        token = int(tokens[index])
        if token == 0:
            continue
        # Mixed radix, most significant digit first: t-1 = (d1*3 + d2)*5 + d3.
        rest, d3 = divmod(token - 1, 5)
        d1, d2 = divmod(rest, 3)
        expected[index] = tables[0][d1] + tables[1][d2] + tables[2][d3]
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(
        _numpy(layer.compute_mask(tokens)), tokens != 0
    )
    # Distinct tables get distinct draws.
    assert not np.allclose(tables[0][:3], tables[1][:3])

    config = layer.get_config()
    clone = FactoredEmbedding.from_config(config)
    assert clone.factors == factors and clone.output_dim == 6


def test_model_with_token_factors_uses_the_factored_embedding():
    model = _build(vocab_size=1 + 4 * 3, token_factors=(4, 3), num_classes=3)
    embedding = model.get_layer("token_embedding")
    assert isinstance(embedding, FactoredEmbedding)
    assert embedding.factors == (4, 3)
    # Tokens sharing the first factor share that table's row: id 1 = (0, 0),
    # id 2 = (0, 1), id 4 = (1, 0).
    rows = _numpy(embedding(np.array([[1, 2, 4]], "int32")))[0]
    t0, t1 = [_numpy(t.numpy()) for t in embedding.tables]
    np.testing.assert_allclose(rows[1] - rows[0], t1[1] - t1[0], atol=1e-6)
    np.testing.assert_allclose(rows[2] - rows[0], t0[1] - t0[0], atol=1e-6)


def test_query_key_components_have_unit_variance_at_init():
    d_model, key_dim, num_heads = 64, 32, 2
    keras.utils.set_random_seed(4)
    model = build_sequence_model(
        vocab_size=50,
        seq_len=32,
        d_model=d_model,
        key_dim=key_dim,
        num_heads=num_heads,
        qk_init_std="unit",
    )
    tokens = _random_tokens(np.random.default_rng(4), 16, 32, 50)

    # Recompute the first attention input in numpy from the model's weights.
    table = model.get_layer("token_embedding").embeddings.numpy()
    positions = model.get_layer("position_embedding").embeddings.numpy()
    x = table[tokens] + positions[None, :32]
    norm = model.get_layer("block_0").attention_norm
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    normed = (x - mean) / np.sqrt(var + norm.epsilon)
    normed = normed * norm.gamma.numpy() + norm.beta.numpy()

    attention = _attention(model)
    q = np.einsum("btd,dhk->bthk", normed, attention.query_kernel.numpy())
    k = np.einsum("btd,dhk->bthk", normed, attention.key_kernel.numpy())
    assert abs(q.var() - 1.0) < 0.15, q.var()
    assert abs(k.var() - 1.0) < 0.15, k.var()
    # Hence the sqrt-scaled scores have about unit variance too.
    scores = np.einsum("bthk,bshk->bhts", q, k) / math.sqrt(key_dim)
    assert 0.7 < scores.var() < 1.3, scores.var()
    # The input embedding sum itself is also about unit-variance.
    assert 0.8 < x.var() < 1.2, x.var()


def test_query_and_key_kernels_are_independent_draws():
    attention = _attention(_build(key_dim=16, d_model=16))
    q = attention.query_kernel.numpy()
    k = attention.key_kernel.numpy()
    v = attention.value_kernel.numpy()
    assert q.shape == k.shape == v.shape
    assert not np.allclose(q, k)
    assert not np.allclose(q, v)
    assert abs(np.corrcoef(q.ravel(), k.ravel())[0, 1]) < 0.1


@pytest.mark.parametrize(
    "qk_init_std, expected_std",
    [("unit", 1.0 / 4.0), (0.3, 0.3), ("glorot", None)],
)
def test_qk_init_std(qk_init_std, expected_std):
    model = _build(d_model=16, key_dim=32, num_heads=2, qk_init_std=qk_init_std)
    attention = _attention(model)
    q = attention.query_kernel.numpy()  # (16, 2, 32)
    if expected_std is None:
        # Keras' Glorot-uniform for this kernel shape: fan_in = 16 * 2,
        # fan_out = 16 * 32, uniform on [-limit, limit].
        limit = math.sqrt(6.0 / (16 * 2 + 16 * 32))
        assert np.abs(q).max() <= limit
        expected_std = limit / math.sqrt(3.0)
    assert abs(q.std() / expected_std - 1.0) < 0.08
    assert abs(attention.key_kernel.numpy().std() / expected_std - 1.0) < 0.08


def test_same_seed_gives_identical_weights():
    first = _weights_by_path(_build(seed=7, num_layers=2, dropout=0.1))
    second = _weights_by_path(_build(seed=7, num_layers=2, dropout=0.1))
    assert first.keys() == second.keys()
    for path in first:
        np.testing.assert_array_equal(first[path], second[path], err_msg=path)
    other = _weights_by_path(_build(seed=8, num_layers=2, dropout=0.1))
    assert not np.allclose(
        first["block_0/attention_0/query_kernel"],
        other["block_0/attention_0/query_kernel"],
    )


def test_scale_variants_share_identical_initial_weights():
    variants = [
        dict(scale="sqrt"),
        dict(scale="none"),
        dict(scale="learned"),
        dict(scale=0.05),
        dict(scale="sqrt", qk_norm=True),
    ]
    built = [
        _weights_by_path(_build(seed=11, num_layers=2,
                                attention_options=variant))
        for variant in variants
    ]
    reference = built[0]
    for variant, weights in zip(variants[1:], built[1:]):
        # Every weight of the plain model exists in the variant ...
        assert set(reference) <= set(weights), variant
        for path, value in reference.items():
            np.testing.assert_array_equal(
                value, weights[path], err_msg=f"{variant} {path}"
            )
    assert "block_0/attention_0/learned_scale" in built[2]
    assert built[2]["block_0/attention_0/learned_scale"] == pytest.approx(
        1.0 / math.sqrt(SMALL["key_dim"])
    )


def test_qk_init_gain_multiplies_query_and_key_kernels_exactly():
    gain = 8.0**0.25
    plain = _weights_by_path(_build(seed=5))
    scaled = _weights_by_path(_build(seed=5, qk_init_gain=gain))
    for path in plain:
        if path.endswith(("query_kernel", "key_kernel")):
            np.testing.assert_allclose(
                scaled[path], plain[path] * np.float32(gain), rtol=1e-7
            )
            assert not np.allclose(scaled[path], plain[path])
        else:
            np.testing.assert_array_equal(
                scaled[path], plain[path], err_msg=path
            )


def _layer_norm(x, epsilon):
    # gamma = 1, beta = 0 at initialization.
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(-1, keepdims=True) + epsilon)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_the_model_is_embeddings_blocks_final_norm_and_logits(norm):
    # The block's own maths is checked against numpy in
    # test_transformer_block.py; here, how the model wires it.
    model = _build(norm=norm, num_layers=2)
    assert ("final_norm" in [layer.name for layer in model.layers]) == (
        norm == "pre"
    )
    tokens = _random_tokens(np.random.default_rng(3), 2, 7, 12, low=0)
    tokens[:, -2:] = 0
    embedded = keras.Model(
        model.input, model.get_layer("position_embedding").output
    )(tokens)
    x = embedded
    for index in range(2):
        block = model.get_layer(f"block_{index}")
        assert block.norm == norm and block.attention.name == (
            f"attention_{index}"
        )
        x = block(x, mask=tokens != 0)
    x = _numpy(x)
    if norm == "pre":
        x = _layer_norm(x, model.get_layer("final_norm").epsilon)
    logits = model.get_layer("logits")
    expected = x @ _numpy(logits.kernel) + _numpy(logits.bias)
    np.testing.assert_allclose(_numpy(model(tokens)), expected, atol=1e-5)


def test_no_feed_forward_when_ff_dim_is_zero():
    model = _build(ff_dim=0, num_layers=2)
    for index in range(2):
        block = model.get_layer(f"block_{index}")
        assert block.ff_hidden is None and block.ff_norm is None
    assert not any("ff_" in w.path for w in model.weights)
    block = _build(ff_dim=None, d_model=16).get_layer("block_0")
    assert block.ff_hidden.units == 64


def test_ff_activation_relu_changes_the_activation_and_no_weight():
    gelu = _build(seed=6)
    relu = _build(seed=6, ff_activation="relu")
    assert _weights_by_path(relu).keys() == _weights_by_path(gelu).keys()
    for path, value in _weights_by_path(gelu).items():
        np.testing.assert_array_equal(_weights_by_path(relu)[path], value)
    hidden = relu.get_layer("block_0").ff_hidden
    x = np.random.default_rng(6).normal(size=(2, 7, SMALL["d_model"]))
    x = x.astype("float32")
    pre_activation = x @ _numpy(hidden.kernel) + _numpy(hidden.bias)
    np.testing.assert_allclose(_numpy(hidden(x)),
                               np.maximum(pre_activation, 0.0), atol=1e-6)
    tokens = _random_tokens(np.random.default_rng(7), 2, 7, 12)
    assert not np.allclose(_numpy(gelu(tokens)), _numpy(relu(tokens)))


def test_keras_round_trip_gives_identical_logits(tmp_path):
    model = _build(
        vocab_size=1 + 4 * 3,
        token_factors=(4, 3),
        num_classes=3,
        num_layers=2,
        attention_options=dict(scale="learned", qk_norm=True),
        causal=True,
        norm="post",
        dropout=0.1,
        qk_init_gain=2.0,
    )
    tokens = np.array([[1, 5, 12, 3, 0, 0, 0], [2, 2, 7, 9, 11, 4, 6]], "int32")
    expected = _numpy(model(tokens))
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    assert [layer.name for layer in attention_layers(restored)] == [
        "attention_0",
        "attention_1",
    ]
    np.testing.assert_array_equal(_numpy(restored(tokens)), expected)


def test_mixed_precision_gives_float32_logits():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = _build(attention_options=dict(scale="none"), key_dim=64,
                       num_layers=2)
        tokens = _random_tokens(np.random.default_rng(6), 3, 7, 12, low=0)
        tokens[:, -2:] = 0
        logits = model(tokens)
    finally:
        keras.config.set_dtype_policy(previous)
    assert _attention(model).compute_dtype == "float16"
    assert logits.dtype == "float32"
    assert np.all(np.isfinite(_numpy(logits)))


@pytest.mark.parametrize(
    "argument, value",
    [
        ("vocab_size", 0),
        ("vocab_size", 1),
        ("seq_len", 0),
        ("num_classes", -1),
        ("d_model", 0),
        ("num_layers", 0),
        ("key_dim", 2.5),
        ("num_heads", 0),
        ("value_dim", 0),
        ("scale", "cosine"),
        ("scale", -1.0),
        ("qk_norm", "yes"),
        ("causal", 1),
        ("norm", "sandwich"),
        ("ff_dim", -1),
        ("ff_activation", "tanh"),
        ("dropout", 1.0),
        ("token_factors", (3, 0)),
        ("token_factors", "34"),
        ("token_factors", (4, 4)),  # 1 + 16 != vocab_size 12
        ("qk_init_std", "he"),
        ("qk_init_std", 0.0),
        ("qk_init_gain", 0.0),
        ("qk_init_gain", float("nan")),
        ("mask_padding", None),
        ("implementation", "flash"),
        ("max_len", 3),  # shorter than seq_len 7
        ("attention_options", {"key_dim": 4}),  # the block's own argument
    ],
)
def test_bad_arguments_raise_value_error_naming_them(argument, value):
    options = dict(vocab_size=12, seq_len=7)
    if argument in ATTENTION_OPTIONS:  # Forwarded whole to every layer.
        options["attention_options"] = {argument: value}
    else:
        options[argument] = value
    with pytest.raises(ValueError, match=f"`{argument}`"):
        build_sequence_model(**options)


def test_short_fit_reduces_loss_on_identity_task():
    # Target = input token at each position. No feed-forward network and
    # plain SGD keep the graph, and so its tracing time, small.
    options = dict(vocab_size=10, seq_len=8, d_model=32, key_dim=16, ff_dim=0)
    keras.utils.set_random_seed(9)
    model = build_sequence_model(**options)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss)
    tokens = _random_tokens(np.random.default_rng(9), 30 * 16, 8, 10)
    probe = tokens[:64]
    initial_loss = float(loss(probe, model(probe)))
    model.fit(tokens, tokens, batch_size=16, epochs=1, shuffle=False, verbose=0)
    final_loss = float(loss(probe, model(probe)))
    assert initial_loss > 1.5  # no better than chance-level at init
    assert final_loss < 0.25 * initial_loss, (initial_loss, final_loss)


@pytest.mark.backends("jax", "torch")
def test_the_toy_model_trains_with_fit():
    # A compiled fit traces the position embedding: under JAX it once failed
    # there (a Keras variable handed straight to lax.dynamic_slice). Runs
    # here and in the JAX and torch child runs (tests/test_backends.py).
    keras.utils.set_random_seed(0)
    model = build_sequence_model(vocab_size=8, seq_len=6, num_classes=8,
                                 d_model=16, key_dim=8, num_heads=2)
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True))
    tokens = np.random.default_rng(0).integers(1, 8, size=(32, 6)).astype(
        "int32")
    before = model.evaluate(tokens, tokens[:, ::-1], verbose=0)
    model.fit(tokens, tokens[:, ::-1], batch_size=8, epochs=3, verbose=0)
    after = model.evaluate(tokens, tokens[:, ::-1], verbose=0)
    assert np.isfinite(after) and after < before, (before, after)
