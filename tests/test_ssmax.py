"""`scale="ssmax"` (Scalable-Softmax) against numpy, on every path.

Scores are `s_h · log(n) · q·k / sqrt(d_k)`, n the keys a query may attend
to after every mask. The references here are float64 numpy written out in
the tests (the counts, the forward pass and a hand-derived gradient of the
loss with respect to `s_h`, itself checked by finite differences). The cases
run on TensorFlow here and on JAX and torch in the child runs of
test_backends.py.
"""

import keras
import numpy as np
import pytest
from keras import ops

from _backends import layer_gradients
from _backends import to_np
from keras_attention import ScaledDotProductAttention
from keras_attention import _layer_utils as utils
from keras_attention import scales
from keras_attention.diagnostics import probe_diagnostics

# Every case here passes on torch too (tests/test_backends.py runs them).
pytestmark = pytest.mark.backends("torch")

B, T, D, H, DK = 3, 6, 5, 2, 4
PATHS = ["explicit", "fused", "memory_efficient"]
S_VALUES = np.array([0.9, 0.35])  # per head, away from the initial value

# Padding: example 1 has 4 valid keys, example 2 one (n = 1 for all its
# queries); query 2 of example 0 is masked (n = 0: zero output).
KEY_MASK = np.array([[True] * T, [True] * 4 + [False] * 2,
                     [False, False, True, False, False, False]])
QUERY_MASK = np.ones((B, T), bool)
QUERY_MASK[0, 2] = False


# Every test draws from generators made afresh for it (the autouse fixture
# below), so what a test sees does not depend on which tests ran before it.
RNG = None
_MASK_RNG = None


@pytest.fixture(autouse=True)
def _seeded():
    global RNG, _MASK_RNG
    keras.utils.set_random_seed(19)
    RNG = np.random.default_rng(19)
    _MASK_RNG = np.random.default_rng(5)


def randn(*shape):
    return RNG.standard_normal(shape).astype("float32")


def np_valid(causal, key_mask=KEY_MASK, query_mask=QUERY_MASK, t=T, s=T):
    valid = np.ones((len(key_mask), 1, t, s), bool)
    valid &= key_mask[:, None, None, :]
    valid &= query_mask[:, None, :, None]
    if causal:
        valid &= np.tril(np.ones((t, s), bool))
    return valid


def np_ssmax(q, k, v, valid, s):
    """Float64 ssmax attention on `(B, T, H, d)` heads: the output, the
    weights, the raw products q·k and log(n)/sqrt(d) per query."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    raw = np.einsum("bthd,bshd->bhts", q, k)
    valid = np.broadcast_to(valid, raw.shape)
    n = valid.sum(-1, keepdims=True)
    log_factor = np.log(np.maximum(n, 1)) / np.sqrt(q.shape[-1])
    scores = np.where(valid, s[None, :, None, None] * log_factor * raw,
                      -np.inf)
    top = np.max(scores, -1, keepdims=True)
    exps = np.where(valid, np.exp(scores - np.where(np.isfinite(top), top,
                                                    0.0)), 0.0)
    total = exps.sum(-1, keepdims=True)
    weights = exps / np.where(total > 0, total, 1.0)
    out = np.einsum("bhts,bshd->bthd", weights, v)
    return out, weights, raw, log_factor


def np_grad_s(q, k, v, valid, s, upstream):
    """d(sum(out * upstream))/d s_h, derived by hand: the softmax backward
    dz = P (dP - sum(P dP)), and z = s_h log(n)/sqrt(d) q·k."""
    _, weights, raw, log_factor = np_ssmax(q, k, v, valid, s)
    d_weights = np.einsum("bthd,bshd->bhts", upstream, np.asarray(v, float))
    d_scores = weights * (d_weights - np.sum(weights * d_weights, -1,
                                             keepdims=True))
    return np.sum(d_scores * log_factor * raw, axis=(0, 2, 3))


def heads_of(layer, x):
    """The layer's Q, K, V heads `(B, T, H, d)` of `x`, in numpy."""
    return [np.einsum("btd,dhk->bthk", x.astype(np.float64),
                      to_np(kernel).astype(np.float64))
            for kernel in (layer.query_kernel, layer.key_kernel,
                           layer.value_kernel)]


# ------------------------------------------------------ the key counts
COUNT_CASES = {
    "none": {},
    "key": {"key": True},
    "query_key_causal": {"key": True, "query": True, "causal": True},
    "attention_b1ts_causal": {"attention": (B, 1, "T", "S"), "causal": True},
    "attention_1ht1_key": {"attention": (1, H, "T", 1), "key": True},
    "attention_bh1s_all": {"attention": (B, H, 1, "S"), "key": True,
                           "query": True, "causal": True},
}


@pytest.mark.parametrize("t,s", [(6, 4), (3, 7)])
@pytest.mark.parametrize("case", sorted(COUNT_CASES))
def test_visible_keys_match_numpy(case, t, s):
    spec = COUNT_CASES[case]
    key = _MASK_RNG.random((B, s)) > 0.4 if spec.get("key") else None
    query = _MASK_RNG.random((B, t)) > 0.3 if spec.get("query") else None
    attention = None
    if "attention" in spec:
        shape = [{"T": t, "S": s}.get(d, d) for d in spec["attention"]]
        attention = _MASK_RNG.random(shape) > 0.3
    causal = spec.get("causal", False)
    masks = utils.Masks(query, key, attention, causal)
    counts = to_np(masks.visible_keys(t, s))
    valid = np.ones((B, H, t, s), bool)
    for part in (None if key is None else key[:, None, None, :],
                 None if query is None else query[:, None, :, None],
                 attention,
                 np.tril(np.ones((t, s), bool)) if causal else None):
        if part is not None:
            valid &= part
    np.testing.assert_array_equal(
        np.broadcast_to(counts, (B, H, t)), valid.sum(-1))


# ------------------------------------------------- the layer, each path
def built_layer(path, causal):
    """An ssmax layer on `path` built on random inputs, with `S_VALUES`:
    `(layer, inputs, call keyword arguments)`. Its kernels are drawn from
    the test's own generator, not by Keras's initializers, so they are the
    same numbers on every backend and in every order of tests."""
    x = randn(B, T, D)
    layer = ScaledDotProductAttention(key_dim=DK, num_heads=H, scale="ssmax",
                                      implementation=path)
    kwargs = dict(query_mask=QUERY_MASK, value_mask=KEY_MASK,
                  use_causal_mask=causal)
    layer(x, **kwargs)
    for kernel in (layer.query_kernel, layer.key_kernel, layer.value_kernel):
        kernel.assign(randn(*kernel.shape) * 0.6)
    layer.ssmax_scale.assign(S_VALUES)
    return layer, x, kwargs


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "padding"])
@pytest.mark.parametrize("path", PATHS)
def test_layer_matches_numpy(path, causal):
    layer, x, kwargs = built_layer(path, causal)
    valid = np_valid(causal)
    expected, weights, _, _ = np_ssmax(*heads_of(layer, x), valid, S_VALUES)
    output = to_np(layer(x, **kwargs))
    assert np.all(np.isfinite(output))
    np.testing.assert_allclose(output, expected.reshape(B, T, -1), atol=1e-5)
    np.testing.assert_array_equal(output[0, 2], 0.0)  # n = 0
    # Example 2 sees one key (n = 1, factor 0): all weight on it.
    np.testing.assert_allclose(output[2, 2:], np.broadcast_to(
        expected[2, 2].reshape(-1), (T - 2, H * DK)), atol=1e-6)
    if path == "explicit":
        _, found = layer(x, return_attention_scores=True, **kwargs)
        np.testing.assert_allclose(to_np(found), weights, atol=1e-6)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.backends("jax", cases=["memory_efficient"])
def test_gradient_of_s_matches_the_hand_derived_one(path):
    layer, x, kwargs = built_layer(path, causal=True)
    upstream = randn(B, T, H * DK)
    _, grads = layer_gradients(
        layer, [x], lambda y: ops.sum(y * ops.convert_to_tensor(upstream)),
        **kwargs)
    assert layer.trainable_weights[-1] is layer.ssmax_scale
    heads, valid = heads_of(layer, x), np_valid(True)
    per_head = upstream.reshape(B, T, H, DK).astype(np.float64)
    expected = np_grad_s(*heads, valid, S_VALUES, per_head)
    # The hand-derived gradient against central differences of numpy's loss.
    for h in range(H):
        step = np.zeros(H)
        step[h] = 1e-6
        loss = [np.sum(np_ssmax(*heads, valid, S_VALUES + sign * step)[0]
                       * per_head) for sign in (1, -1)]
        assert (loss[0] - loss[1]) / 2e-6 == pytest.approx(expected[h],
                                                           rel=1e-5)
    # The case is fixed (seeded inputs and kernels), and at it every head's
    # gradient is well away from 0, so the comparison below is relative.
    assert np.all(np.abs(expected) > 1e-2)
    np.testing.assert_allclose(grads[-1], expected, rtol=1e-4, atol=1e-5)
    for grad in grads:
        assert np.all(np.isfinite(grad))


# -------------------------------------------------- initial value, dtype
def test_initial_value_gives_the_sqrt_scale_at_the_built_length():
    x, y = randn(2, T, D), randn(2, 5, D)
    self_attention = ScaledDotProductAttention(key_dim=DK, num_heads=H,
                                               scale="ssmax")
    out = self_attention(x)
    np.testing.assert_allclose(to_np(self_attention.ssmax_scale),
                               [1 / np.log(T)] * H, rtol=1e-6)
    cross = ScaledDotProductAttention(key_dim=DK, num_heads=H, scale="ssmax")
    cross(x, y)  # keys: 5
    np.testing.assert_allclose(to_np(cross.ssmax_scale), 1 / np.log(5),
                               rtol=1e-6)
    # At n = T (no mask), the ssmax layer is the sqrt layer.
    sqrt = ScaledDotProductAttention(key_dim=DK, num_heads=H)
    sqrt(x)
    sqrt.set_weights(self_attention.get_weights()[:3])
    np.testing.assert_allclose(to_np(out), to_np(sqrt(x)), atol=1e-6)
    # Unknown or single-key lengths: the reference length.
    inputs = keras.Input((None, D))
    variable = ScaledDotProductAttention(key_dim=DK, scale="ssmax")
    variable(inputs)
    single = ScaledDotProductAttention(key_dim=DK, scale="ssmax")
    one = single(x[:, :1])  # n = 1: the value, and no NaN
    for layer in (variable, single):
        np.testing.assert_allclose(to_np(layer.ssmax_scale),
                                   [1 / np.log(scales.SSMAX_REFERENCE_LENGTH)],
                                   rtol=1e-6)
    np.testing.assert_allclose(
        to_np(one), heads_of(single, x[:, :1])[2].reshape(2, 1, -1),
        atol=1e-5)


def test_mixed_precision_stays_close_and_finite():
    x = randn(B, T, D)
    kwargs = dict(value_mask=KEY_MASK, use_causal_mask=True)
    reference = ScaledDotProductAttention(key_dim=DK, num_heads=H,
                                          scale="ssmax")
    expected = to_np(reference(x, **kwargs))
    for path in PATHS:
        layer = ScaledDotProductAttention(
            key_dim=DK, num_heads=H, scale="ssmax", implementation=path,
            dtype="mixed_bfloat16")
        layer(x, **kwargs)
        layer.set_weights(reference.get_weights())
        assert layer.ssmax_scale.dtype == "float32"
        found = to_np(ops.cast(layer(x, **kwargs), "float32"))
        assert np.all(np.isfinite(found)), path
        np.testing.assert_allclose(found, expected, atol=0.05, err_msg=path)


# ------------------------------------------------------- serialization
def _ssmax_model():
    tokens = keras.Input((T,), dtype="int32")
    hidden = keras.layers.Embedding(11, D, mask_zero=True)(tokens)
    hidden = ScaledDotProductAttention(
        key_dim=DK, num_heads=H, scale="ssmax", name="attention_0",
    )(hidden, use_causal_mask=True)
    return keras.Model(tokens, keras.layers.Dense(11)(hidden))


def _tokens():
    tokens = RNG.integers(1, 11, size=(B, T)).astype("int32")
    tokens[1, 4:] = 0
    tokens[2, 1:] = 0
    return tokens


def test_config_and_keras_file_round_trip(tmp_path):
    layer = ScaledDotProductAttention(key_dim=DK, num_heads=H, scale="ssmax")
    assert layer.get_config()["scale"] == "ssmax"
    copy = ScaledDotProductAttention.from_config(layer.get_config())
    assert copy.scale == "ssmax"
    model = _ssmax_model()
    model.get_layer("attention_0").ssmax_scale.assign(S_VALUES)
    tokens = _tokens()
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    np.testing.assert_allclose(
        to_np(loaded.get_layer("attention_0").ssmax_scale), S_VALUES,
        rtol=1e-6)
    np.testing.assert_allclose(to_np(loaded(tokens)), to_np(model(tokens)),
                               atol=1e-6)


def test_bad_scale_is_refused_by_name():
    with pytest.raises(ValueError, match="`scale`"):
        ScaledDotProductAttention(key_dim=4, scale="ssmax2")
    with pytest.raises(ValueError, match="trainable"):
        scales.resolve_scale("ssmax", 4)


# --------------------------------------------------- dashboard statistics
def test_probe_statistics_use_the_ssmax_scores():
    model = _ssmax_model()
    rng = np.random.default_rng(2)
    # Weights of order 1 (scores neither uniform nor one-hot), the same on
    # every backend.
    model.set_weights([(rng.standard_normal(w.shape) * 0.7).astype("float32")
                       for w in model.get_weights()])
    model.get_layer("attention_0").ssmax_scale.assign(S_VALUES)
    tokens = _tokens()
    targets = RNG.integers(0, 11, size=(B, T)).astype("int32")
    weight = (tokens != 0).astype("float32")
    stats = probe_diagnostics(model, tokens, targets, weight)["layers"][
        "attention_0"]
    layer = model.get_layer("attention_0")
    embedded = to_np(model.layers[1].embeddings)[tokens]
    valid_tokens = tokens != 0
    valid = np_valid(True, valid_tokens, valid_tokens)
    _, weights, raw, log_factor = np_ssmax(
        *heads_of(layer, embedded), valid, S_VALUES)
    scores = S_VALUES[None, :, None, None] * log_factor * raw
    full = np.broadcast_to(valid, scores.shape)
    np.testing.assert_allclose(stats["scores"][full], scores[full],
                               rtol=1e-5, atol=1e-5)
    assert stats["score_std"] == pytest.approx(np.std(scores[full]),
                                               rel=1e-4)
    rows = full.any(-1)
    n = full.sum(-1)
    plogp = np.where(weights > 0, weights * np.log(np.where(
        weights > 0, weights, 1.0)), 0.0)
    entropy = np.where(n > 1, -plogp.sum(-1) / np.log(np.maximum(n, 2)), 0.0)
    np.testing.assert_allclose(
        stats["entropy_normalized"],
        [entropy[:, h][rows[:, h]].mean() for h in range(H)], atol=1e-5)
