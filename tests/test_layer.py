"""Tests of ScaledDotProductAttention and its functional core.

Backend-agnostic: the module runs under KERAS_BACKEND=tensorflow (default),
jax and torch (child runs started by test_backends.py). Every numeric
check compares with the numpy reference written below.
"""

import itertools
import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from keras import ops

import keras_attention
from _backends import gradients_of
from _backends import layer_gradients
from _backends import skip_without_float64
from keras_attention import ScaledDotProductAttention
from keras_attention import attention_entropy
from keras_attention import scaled_dot_product_attention
from keras_attention.ops import SCALE_MODES
from keras_attention.ops import resolve_scale

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(1234)


# ----------------------------------------------------------------- reference
def np_layer_norm(x, gamma, beta, eps=1e-6):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def np_masked_softmax(scores, mask):
    if mask is None:
        mask = np.ones(scores.shape, bool)
    mask = np.broadcast_to(mask, scores.shape)
    filled = np.where(mask, scores, -np.inf)
    row_max = filled.max(-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    exps = np.where(mask, np.exp(filled - row_max), 0.0)
    total = exps.sum(-1, keepdims=True)
    return np.where(total > 0, exps / np.where(total > 0, total, 1.0), 0.0)


def np_combined_mask(
    batch, heads, t, s, query_mask, value_mask, key_mask, attention_mask, causal
):
    mask = np.ones((batch, heads, t, s), bool)
    if query_mask is not None:
        mask &= np.asarray(query_mask, bool)[:, None, :, None]
    for m in (value_mask, key_mask):
        if m is not None:
            mask &= np.asarray(m, bool)[:, None, None, :]
    if attention_mask is not None:
        am = np.asarray(attention_mask).astype(bool)
        if am.ndim == 2:
            am = am[None, None]
        elif am.ndim == 3:
            am = am[:, None]
        mask &= am
    if causal:
        mask &= np.tril(np.ones((t, s), bool))[None, None]
    return mask


def reference(
    layer,
    query,
    value=None,
    key=None,
    query_mask=None,
    value_mask=None,
    key_mask=None,
    attention_mask=None,
    causal=False,
):
    """The layer's math in float64 numpy, from the layer's own weights."""
    query = np.asarray(query, np.float64)
    if value is None:
        value = query
        if value_mask is None:
            value_mask = query_mask
    if key is None:
        key = value
        if key_mask is None:
            key_mask = value_mask
    value = np.asarray(value, np.float64)
    key = np.asarray(key, np.float64)
    w = lambda var: np.asarray(ops.convert_to_numpy(var), np.float64)  # noqa: E731
    q = np.einsum("btd,dhk->bthk", query, w(layer.query_kernel))
    k = np.einsum("bsd,dhk->bshk", key, w(layer.key_kernel))
    v = np.einsum("bsd,dhk->bshk", value, w(layer.value_kernel))
    if layer.use_bias:
        q = q + w(layer.query_bias)
        k = k + w(layer.key_bias)
        v = v + w(layer.value_bias)
    if layer.qk_norm:
        q = np_layer_norm(q, w(layer.query_norm.gamma), w(layer.query_norm.beta))
        k = np_layer_norm(k, w(layer.key_norm.gamma), w(layer.key_norm.beta))
    if layer.scale == "learned":
        scale = float(w(layer.learned_scale))
    elif layer.scale == "sqrt":
        scale = 1.0 / np.sqrt(layer.key_dim)
    elif layer.scale == "none":
        scale = 1.0
    elif layer.scale == "inverse":
        scale = 1.0 / layer.key_dim
    else:
        scale = float(layer.scale)
    scores = np.einsum("bthk,bshk->bhts", q, k) * scale
    b, t, s = query.shape[0], query.shape[1], key.shape[1]
    mask = np_combined_mask(
        b, layer.num_heads, t, s, query_mask, value_mask, key_mask,
        attention_mask, causal,
    )
    weights = np_masked_softmax(scores, mask)
    attended = np.einsum("bhts,bshd->bthd", weights, v)
    if layer.output_dim is not None:
        out = np.einsum("bthd,hdo->bto", attended, w(layer.output_kernel))
        if layer.use_bias:
            out = out + w(layer.output_bias)
    else:
        out = attended.reshape(b, t, -1)
    return out, weights


def to_np(x):
    return np.asarray(ops.convert_to_numpy(x))


def randn(*shape):
    return RNG.standard_normal(shape).astype("float32")


def random_bool(*shape, p=0.7):
    return RNG.random(shape) < p


# ---------------------------------------------------- values vs. reference
@pytest.mark.parametrize(
    "num_heads,scale,use_bias,output_dim,cross",
    list(
        itertools.product(
            [1, 4], ["sqrt", "none", 0.3, "learned"], [False, True],
            [None, 12], [False, True],
        )
    ),
)
@pytest.mark.backends("jax", "torch", cases=["4-learned-True-12-True"])
def test_matches_reference(num_heads, scale, use_bias, output_dim, cross):
    layer = ScaledDotProductAttention(
        key_dim=8, num_heads=num_heads, value_dim=6, output_dim=output_dim,
        scale=scale, use_bias=use_bias,
        bias_initializer="random_normal",
    )
    query = randn(3, 5, 10)
    value = randn(3, 7, 9) if cross else None
    key = randn(3, 7, 11) if cross else None
    out, weights = layer(query, value, key, return_attention_scores=True)
    ref_out, ref_weights = reference(layer, query, value, key)
    np.testing.assert_allclose(to_np(out), ref_out, atol=1e-5)
    np.testing.assert_allclose(to_np(weights), ref_weights, atol=1e-5)
    fast = layer(query, value, key)
    np.testing.assert_allclose(to_np(fast), ref_out, atol=1e-5)
    width = output_dim if output_dim else num_heads * 6
    assert tuple(out.shape) == (3, 5, width)
    assert tuple(weights.shape) == (3, num_heads, 5, 7 if cross else 5)


@pytest.mark.backends("jax", "torch")
def test_qk_norm_matches_reference():
    layer = ScaledDotProductAttention(key_dim=8, num_heads=2, qk_norm=True)
    query = randn(2, 6, 10) * 3.0
    layer(query)  # build
    # Non-trivial gamma and beta so the test sees them used.
    for norm in (layer.query_norm, layer.key_norm):
        norm.gamma.assign(randn(8) + 1.0)
        norm.beta.assign(randn(8))
    out, weights = layer(query, return_attention_scores=True)
    ref_out, ref_weights = reference(layer, query)
    np.testing.assert_allclose(to_np(out), ref_out, atol=1e-5)
    np.testing.assert_allclose(to_np(weights), ref_weights, atol=1e-5)


MASK_KINDS = [
    "query_mask", "value_mask", "key_mask", "attention_2d", "attention_3d",
    "attention_4d", "attention_4d_heads_1", "attention_int", "causal", "all",
]


def _mask_kwargs(kind, b, h, t, s):
    kw = {}
    if kind in ("query_mask", "all"):
        kw["query_mask"] = random_bool(b, t)
    if kind in ("value_mask", "all"):
        kw["value_mask"] = random_bool(b, s)
    if kind in ("key_mask", "all"):
        kw["key_mask"] = random_bool(b, s)
    if kind == "attention_2d":
        kw["attention_mask"] = random_bool(t, s)
    if kind in ("attention_3d", "all"):
        kw["attention_mask"] = random_bool(b, t, s)
    if kind == "attention_4d":
        kw["attention_mask"] = random_bool(b, h, t, s)
    if kind == "attention_4d_heads_1":
        kw["attention_mask"] = random_bool(b, 1, t, s)
    if kind == "attention_int":
        kw["attention_mask"] = random_bool(b, t, s).astype("int32")
    if kind in ("causal", "all"):
        kw["use_causal_mask"] = True
    return kw


@pytest.mark.parametrize("implementation", ["explicit", "fused", "memory_efficient"])
@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.backends("jax", cases=["False-all-memory_efficient"])
@pytest.mark.backends("torch", cases=[
    "False-all-explicit", "False-all-fused", "False-all-memory_efficient"])
def test_masks_match_reference_on_every_path(kind, cross, implementation):
    if implementation == "memory_efficient":
        pytest.importorskip("keras_attention.memory_efficient")
    b, h, t = 3, 2, 6
    s = 8 if cross else t
    layer = ScaledDotProductAttention(
        key_dim=4, num_heads=h, output_dim=5, implementation=implementation
    )
    query = randn(b, t, 7)
    value = randn(b, s, 7) if cross else None
    kw = _mask_kwargs(kind, b, h, t, s)
    out = layer(query, value, **kw)
    ref_out, ref_weights = reference(
        layer, query, value,
        query_mask=kw.get("query_mask"), value_mask=kw.get("value_mask"),
        key_mask=kw.get("key_mask"), attention_mask=kw.get("attention_mask"),
        causal=kw.get("use_causal_mask", False),
    )
    np.testing.assert_allclose(to_np(out), ref_out, atol=1e-5)
    if implementation == "explicit":
        _, weights = layer(query, value, return_attention_scores=True, **kw)
        np.testing.assert_allclose(to_np(weights), ref_weights, atol=1e-5)


@pytest.mark.parametrize("implementation", ["explicit", "fused", "memory_efficient"])
@pytest.mark.backends("torch")
@pytest.mark.backends("jax", cases=["explicit"])
def test_fully_masked_rows_give_zeros(implementation):
    if implementation == "memory_efficient":
        pytest.importorskip("keras_attention.memory_efficient")
    layer = ScaledDotProductAttention(
        key_dim=4, num_heads=2, implementation=implementation, use_bias=True,
        bias_initializer="ones",
    )
    query = randn(2, 4, 6)
    attention_mask = np.ones((2, 4, 4), bool)
    attention_mask[0, 1, :] = False  # query row 1 of example 0 sees no key
    value_mask = np.array([[1, 1, 1, 1], [0, 0, 0, 0]], bool)  # example 1: none
    out = to_np(layer(query, value_mask=value_mask, attention_mask=attention_mask))
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[0, 1], 0.0)
    np.testing.assert_array_equal(out[1], 0.0)
    assert np.abs(out[0, 0]).max() > 0
    if implementation == "explicit":
        _, weights = layer(
            query, value_mask=value_mask, attention_mask=attention_mask,
            return_attention_scores=True,
        )
        weights = to_np(weights)
        np.testing.assert_array_equal(weights[0, :, 1], 0.0)
        np.testing.assert_array_equal(weights[1], 0.0)
        np.testing.assert_allclose(weights[0, :, 0].sum(-1), 1.0, atol=1e-6)


@pytest.mark.backends("torch")
def test_keras_mask_propagates_from_embedding():
    tokens = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(20, 8, mask_zero=True)(tokens)
    attention = ScaledDotProductAttention(key_dim=4, num_heads=2, name="attn")
    out, weights = attention(embedded, return_attention_scores=True)
    model = keras.Model(tokens, [out, weights])
    batch = np.array([[3, 4, 5, 0, 0], [6, 7, 0, 0, 0]], "int32")
    _, got = model(batch)
    got = to_np(got)
    lengths = [3, 2]
    for i, n in enumerate(lengths):
        np.testing.assert_array_equal(got[i, :, :, n:], 0.0)  # padded keys
        np.testing.assert_array_equal(got[i, :, n:, :], 0.0)  # padded queries
        np.testing.assert_allclose(got[i, :, :n].sum(-1), 1.0, atol=1e-6)
    # The output keeps the query's mask for downstream layers.
    emb_layer = model.layers[1]
    eager_embedded = emb_layer(batch)
    eager_out = attention(eager_embedded)
    mask = getattr(eager_out, "_keras_mask", None)
    if mask is None:
        from keras.src.backend.common.masking import get_keras_mask

        mask = get_keras_mask(eager_out)
    np.testing.assert_array_equal(to_np(mask), batch != 0)


# -------------------------------------------------------- property tests
@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 3), t=st.integers(1, 7), s=st.integers(1, 7),
    h=st.integers(1, 3), dk=st.integers(1, 6),
    scale=st.one_of(
        st.sampled_from(["sqrt", "none"]),
        st.floats(0.01, 5.0, allow_nan=False, allow_infinity=False),
    ),
    causal=st.booleans(), use_mask=st.booleans(), seed=st.integers(0, 2**16),
)
def test_property_random_shapes_masks_scales(
    b, t, s, h, dk, scale, causal, use_mask, seed
):
    rng = np.random.default_rng(seed)
    layer = ScaledDotProductAttention(key_dim=dk, num_heads=h, scale=scale)
    query = rng.standard_normal((b, t, 5)).astype("float32")
    value = rng.standard_normal((b, s, 4)).astype("float32")
    attention_mask = (rng.random((b, t, s)) < 0.6) if use_mask else None
    out, weights = layer(
        query, value, attention_mask=attention_mask, use_causal_mask=causal,
        return_attention_scores=True,
    )
    fast = layer(query, value, attention_mask=attention_mask, use_causal_mask=causal)
    ref_out, ref_weights = reference(
        layer, query, value, attention_mask=attention_mask, causal=causal
    )
    np.testing.assert_allclose(to_np(out), ref_out, atol=1e-5)
    np.testing.assert_allclose(to_np(fast), ref_out, atol=1e-5)
    np.testing.assert_allclose(to_np(weights), ref_weights, atol=1e-5)
    sums = to_np(weights).sum(-1)
    has_key = ref_weights.sum(-1) > 0.5
    np.testing.assert_allclose(sums[has_key], 1.0, atol=1e-5)
    np.testing.assert_array_equal(sums[~has_key], 0.0)


# ------------------------------------------------ the lesson, on the core
@pytest.mark.parametrize("key_dim", [16, 64, 256])
def test_dot_product_variance_is_key_dim_and_one_after_scaling(key_dim):
    rng = np.random.default_rng(key_dim)
    n = 40000
    q = rng.standard_normal((1, n, 1, key_dim)).astype("float32")
    k = rng.standard_normal((1, n, 1, key_dim)).astype("float32")
    # One query per key: the diagonal of the score matrix is n independent
    # dot products. Computed with the core's own score function, in chunks.
    from keras_attention.ops import attention_scores

    def diagonal(scale):
        diag = []
        for start in range(0, n, 2000):
            sl = slice(start, start + 2000)
            scores = to_np(attention_scores(q[:, sl], k[:, sl], scale))
            diag.append(np.diagonal(scores[0, 0]))
        return np.concatenate(diag)

    unscaled = diagonal(1.0)
    scaled = diagonal(1.0 / np.sqrt(key_dim))
    np.testing.assert_allclose(unscaled, np.sum(q[0, :, 0] * k[0, :, 0], -1), rtol=1e-4, atol=1e-3)
    assert abs(unscaled.var() / key_dim - 1.0) < 0.05
    assert abs(scaled.var() - 1.0) < 0.05


def test_unscaled_scores_saturate_softmax_at_large_key_dim():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((4, 16, 1, 1024)).astype("float32")
    k = rng.standard_normal((4, 16, 1, 1024)).astype("float32")
    _, scaled = scaled_dot_product_attention(q, k, k, scale="sqrt", return_weights=True)
    _, unscaled = scaled_dot_product_attention(q, k, k, scale="none", return_weights=True)
    h_scaled = to_np(attention_entropy(scaled, normalize=True)).mean()
    h_unscaled = to_np(attention_entropy(unscaled, normalize=True)).mean()
    assert to_np(unscaled).max(-1).mean() > 0.95
    assert h_unscaled < 0.1 < 0.5 < h_scaled


def test_attention_entropy_hand_cases():
    weights = np.array(
        [[[[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]]]],
        "float32",
    )
    mask = np.array([[[[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]]]], bool)
    got = to_np(attention_entropy(weights))
    np.testing.assert_allclose(got[0, 0], [np.log(4), 0.0, np.log(2)], atol=1e-6)
    got = to_np(attention_entropy(weights, mask=mask, normalize=True))
    np.testing.assert_allclose(got[0, 0], [1.0, 0.0, 1.0], atol=1e-6)
    one_key = np.array([[[[1.0, 0.0]]]], "float32")
    got = to_np(attention_entropy(one_key, mask=np.array([[[[1, 0]]]], bool), normalize=True))
    np.testing.assert_array_equal(got, 0.0)


def test_core_function_matches_reference_with_mask():
    q, k, v = randn(2, 5, 3, 4), randn(2, 6, 3, 4), randn(2, 6, 3, 2)
    mask = random_bool(2, 1, 5, 6)
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask, scale=0.7, return_weights=True)
    scores = np.einsum("bthd,bshd->bhts", q.astype(np.float64), k) * 0.7
    ref_w = np_masked_softmax(scores, mask)
    np.testing.assert_allclose(to_np(weights), ref_w, atol=1e-6)
    np.testing.assert_allclose(to_np(out), np.einsum("bhts,bshd->bthd", ref_w, v), atol=1e-6)


# ------------------------------------------------------------- gradients
def np_attention_gradients(q, k, v, mask, scale, d_out):
    """Gradients of sum(attention(q, k, v) * d_out) in float64 numpy.

    The textbook softmax backward, dS = P * (dP - rowsum(P * dP)).
    Returns d_q, d_k, d_v and d_scale.
    """
    q, k, v, d_out = (np.asarray(a, np.float64) for a in (q, k, v, d_out))
    raw = np.einsum("bthd,bshd->bhts", q, k)
    p = np_masked_softmax(raw * scale, mask)
    d_v = np.einsum("bhts,bthd->bshd", p, d_out)
    d_p = np.einsum("bthd,bshd->bhts", d_out, v)
    d_s = p * (d_p - (p * d_p).sum(-1, keepdims=True))
    d_q = np.einsum("bhts,bshd->bthd", d_s, k) * scale
    d_k = np.einsum("bhts,bthd->bshd", d_s, q) * scale
    return d_q, d_k, d_v, float((d_s * raw).sum())


_gradients_of = gradients_of


@pytest.mark.parametrize("mask_kind", ["none", "random_with_empty_row", "causal"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.backends("torch", cases=[
    "float32-none", "float32-random_with_empty_row", "float32-causal"])
@pytest.mark.backends("jax", cases=["float32-causal"])
def test_output_only_gradients_match_reference(mask_kind, dtype):
    # Without weights or dropout the core takes `attend_output`, whose backward
    # pass is written by hand; check it against the numpy textbook backward and
    # against automatic differentiation of the path that returns weights.
    if dtype == "float64":
        skip_without_float64()
    b, t, s, h, dk, dv = 2, 5, 6, 3, 4, 3
    q, k, v = randn(b, t, h, dk), randn(b, s, h, dk), randn(b, s, h, dv)
    q, k, v = q.astype(dtype), k.astype(dtype), v.astype(dtype)
    d_out = randn(b, t, h, dv).astype(dtype)
    if mask_kind == "none":
        mask = None
    elif mask_kind == "causal":
        mask = np.tril(np.ones((t, s), bool))[None, None]
    else:
        mask = random_bool(b, 1, t, s)
        mask[0, 0, 2] = False  # a query with nothing to attend
    scale = np.asarray(0.6, dtype)
    tolerance = 1e-10 if dtype == "float64" else 2e-5

    def loss(return_weights):
        def fn(q, k, v, scale):
            out = scaled_dot_product_attention(
                q, k, v, mask=mask, scale=scale, return_weights=return_weights
            )
            out = out[0] if return_weights else out
            return ops.sum(out * ops.convert_to_tensor(d_out))

        return fn

    hand = _gradients_of(loss(False), [q, k, v, scale])
    autodiff = _gradients_of(loss(True), [q, k, v, scale])
    expected = np_attention_gradients(q, k, v, mask, 0.6, d_out)
    for name, got, other, ref in zip(("q", "k", "v", "scale"), hand, autodiff, expected):
        assert np.all(np.isfinite(got)), name
        np.testing.assert_allclose(got, ref, rtol=tolerance, atol=tolerance, err_msg=name)
        np.testing.assert_allclose(got, other, rtol=tolerance, atol=tolerance, err_msg=name)
    if mask_kind == "random_with_empty_row":
        # The empty row's query gets no gradient at all.
        np.testing.assert_array_equal(hand[0][0, 2], 0.0)


_value_and_grads = layer_gradients


@pytest.mark.backends("torch")
def test_gradients_flow_to_projections():
    layer = ScaledDotProductAttention(key_dim=8, num_heads=2, output_dim=6)
    x = randn(2, 5, 6)
    layer(x)
    _, grads = _value_and_grads(layer, [x], lambda y: ops.sum(y * y))
    by_name = {v.path.split("/")[-1]: g for v, g in zip(layer.trainable_weights, grads)}
    for name in ("query_kernel", "key_kernel", "value_kernel", "output_kernel"):
        g = by_name[name]
        assert np.all(np.isfinite(g)), name
        assert np.abs(g).max() > 0, name


def test_gradient_matches_finite_differences():
    skip_without_float64()
    layer = ScaledDotProductAttention(
        key_dim=3, num_heads=2, output_dim=4, scale="learned", use_bias=True,
        bias_initializer="random_normal", dtype="float64",
    )
    x = RNG.standard_normal((2, 4, 5))
    mask = np.tril(np.ones((4, 4), bool))
    weight_vector = RNG.standard_normal((2, 4, 4))

    def loss_fn(y):
        return ops.sum(y * ops.convert_to_tensor(weight_vector, "float64"))

    layer(x)
    _, grads = _value_and_grads(layer, [x], loss_fn, attention_mask=mask)
    eps = 1e-6
    for variable, grad in zip(layer.trainable_weights, grads):
        original = to_np(variable).copy()
        flat = original.reshape(-1)
        for index in RNG.choice(flat.size, size=min(4, flat.size), replace=False):
            bumped = flat.copy()
            bumped[index] += eps
            variable.assign(bumped.reshape(original.shape))
            plus = to_np(loss_fn(layer(x, attention_mask=mask)))
            bumped[index] -= 2 * eps
            variable.assign(bumped.reshape(original.shape))
            minus = to_np(loss_fn(layer(x, attention_mask=mask)))
            variable.assign(original)
            numeric = (plus - minus) / (2 * eps)
            np.testing.assert_allclose(
                grad.reshape(-1)[index], numeric, rtol=1e-5, atol=1e-7,
                err_msg=variable.path,
            )


# -------------------------------------------------------- mixed precision
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("implementation", ["explicit", "fused", "memory_efficient"])
@pytest.mark.backends("torch")
@pytest.mark.backends("jax", cases=["memory_efficient-mixed_bfloat16"])
def test_mixed_precision_unscaled_large_key_dim_stays_finite(policy, implementation):
    if implementation == "memory_efficient":
        pytest.importorskip("keras_attention.memory_efficient")
    layer = ScaledDotProductAttention(
        key_dim=1024, num_heads=1, scale="none", output_dim=16, dtype=policy,
        implementation=implementation,
        kernel_initializer=keras.initializers.RandomNormal(stddev=0.25),
    )
    x = randn(2, 8, 16)
    mask = np.ones((2, 8), bool)
    mask[1, 5:] = False
    out, grads = _value_and_grads(
        layer, [x], lambda y: ops.sum(ops.cast(y, "float32")), value_mask=mask
    )
    y = layer(x, value_mask=mask)
    expected = "float16" if policy == "mixed_float16" else "bfloat16"
    assert keras.backend.standardize_dtype(y.dtype) == expected
    assert np.all(np.isfinite(to_np(ops.cast(y, "float32"))))
    for g in grads:
        assert np.all(np.isfinite(g))
    if implementation == "explicit":
        _, weights = layer(x, value_mask=mask, return_attention_scores=True)
        assert keras.backend.standardize_dtype(weights.dtype) == "float32"
        # Unscaled at d_k=1024 with unit-scale inputs: rows are nearly one-hot.
        assert to_np(weights).max(-1).mean() > 0.9


# ------------------------------------------------ shapes and serialization
def test_symbolic_call_and_compute_output_shape():
    query = keras.Input((7, 10))
    value = keras.Input((9, 6))
    layer = ScaledDotProductAttention(key_dim=4, num_heads=3, value_dim=5)
    out, weights = layer(query, value, return_attention_scores=True)
    assert tuple(out.shape) == (None, 7, 15)
    assert tuple(weights.shape) == (None, 3, 7, 9)
    assert layer.compute_output_shape((None, 7, 10), (None, 9, 6)) == (None, 7, 15)
    out_only = layer(query, value)
    assert tuple(out_only.shape) == (None, 7, 15)
    projected = ScaledDotProductAttention(key_dim=4, output_dim=11)
    assert projected.compute_output_shape((2, 3, 5)) == (2, 3, 11)


@pytest.mark.parametrize(
    "initializer", ["glorot_uniform", keras.initializers.RandomNormal(stddev=0.1)]
)
def test_projection_kernels_are_independent_draws(initializer):
    layer = ScaledDotProductAttention(
        key_dim=4, num_heads=2, kernel_initializer=initializer, use_bias=True,
        bias_initializer="random_normal",
    )
    layer(randn(1, 3, 8))
    q, k, v = (to_np(w) for w in (layer.query_kernel, layer.key_kernel, layer.value_kernel))
    assert np.abs(q - k).max() > 1e-3 and np.abs(q - v).max() > 1e-3
    assert np.abs(to_np(layer.query_bias) - to_np(layer.key_bias)).max() > 1e-3


def test_weight_shapes_and_state_made_in_build():
    layer = ScaledDotProductAttention(
        key_dim=4, num_heads=3, value_dim=5, output_dim=7, use_bias=True,
        scale="learned", qk_norm=True,
    )
    assert not layer.weights
    layer(randn(2, 3, 6), randn(2, 4, 8), randn(2, 4, 9))
    assert tuple(layer.query_kernel.shape) == (6, 3, 4)
    assert tuple(layer.key_kernel.shape) == (9, 3, 4)
    assert tuple(layer.value_kernel.shape) == (8, 3, 5)
    assert tuple(layer.output_kernel.shape) == (3, 5, 7)
    assert tuple(layer.query_bias.shape) == (3, 4)
    assert tuple(layer.output_bias.shape) == (7,)
    np.testing.assert_allclose(to_np(layer.learned_scale), 0.5)


def test_get_config_round_trip():
    layer = ScaledDotProductAttention(
        key_dim=4, num_heads=2, value_dim=3, output_dim=5, scale=0.25,
        qk_norm=True, use_bias=True, dropout=0.1, seed=7,
        kernel_regularizer="l2", kernel_constraint="non_neg",
        kernel_initializer="he_normal", name="my_attention",
    )
    config = layer.get_config()
    json.dumps(config)
    clone = ScaledDotProductAttention.from_config(config)
    assert clone.get_config() == config
    for key in ("key_dim", "num_heads", "value_dim", "output_dim", "scale",
                "qk_norm", "use_bias", "dropout", "seed", "implementation"):
        assert getattr(clone, key) == getattr(layer, key)


SAVE_SCRIPT = textwrap.dedent(
    """
    import sys, numpy as np, keras
    import keras_attention
    model = keras.saving.load_model(sys.argv[1])
    x = np.load(sys.argv[2])
    np.save(sys.argv[3], np.asarray(keras.ops.convert_to_numpy(model(x))))
    """
)


def test_keras_file_round_trip_in_fresh_process(tmp_path):
    inputs = keras.Input((6, 8))
    x = ScaledDotProductAttention(
        key_dim=4, num_heads=2, output_dim=8, scale="learned", qk_norm=True,
        use_bias=True,
    )(inputs, use_causal_mask=True)
    x = ScaledDotProductAttention(key_dim=5, scale="none", name="second")(x)
    model = keras.Model(inputs, x)
    data = randn(3, 6, 8)
    expected = to_np(model(data))
    path = str(tmp_path / "model.keras")
    model.save(path)
    np.save(tmp_path / "x.npy", data)
    script = tmp_path / "load.py"
    script.write_text(SAVE_SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), path, str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
        capture_output=True, text=True, env={**os.environ}, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), expected)


@pytest.mark.backends("jax", "torch")
def test_dropout_only_in_training():
    layer = ScaledDotProductAttention(key_dim=4, num_heads=2, dropout=0.5, seed=3)
    x = randn(2, 6, 8)
    inference = to_np(layer(x, training=False))
    ref, _ = reference(layer, x)
    np.testing.assert_allclose(inference, ref, atol=1e-5)
    trained = to_np(layer(x, training=True))
    assert np.abs(trained - inference).max() > 1e-3
    _, weights = layer(x, training=True, return_attention_scores=True)
    np.testing.assert_allclose(to_np(weights).sum(-1), 1.0, atol=1e-5)  # before dropout


# --------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs,argument",
    [
        ({"key_dim": 0}, "key_dim"),
        ({"key_dim": -3}, "key_dim"),
        ({"key_dim": 2.5}, "key_dim"),
        ({"key_dim": True}, "key_dim"),
        ({"key_dim": 4, "num_heads": 0}, "num_heads"),
        ({"key_dim": 4, "num_heads": 1.0}, "num_heads"),
        ({"key_dim": 4, "value_dim": -1}, "value_dim"),
        ({"key_dim": 4, "output_dim": 0}, "output_dim"),
        ({"key_dim": 4, "scale": "cube"}, "scale"),
        ({"key_dim": 4, "scale": 0.0}, "scale"),
        ({"key_dim": 4, "scale": -1.0}, "scale"),
        ({"key_dim": 4, "scale": float("nan")}, "scale"),
        ({"key_dim": 4, "scale": float("inf")}, "scale"),
        ({"key_dim": 4, "dropout": 1.0}, "dropout"),
        ({"key_dim": 4, "dropout": -0.1}, "dropout"),
        ({"key_dim": 4, "implementation": "magic"}, "implementation"),
    ],
)
@pytest.mark.backends("jax", "torch")
def test_bad_arguments_raise(kwargs, argument):
    with pytest.raises(ValueError, match=f"`{argument}`"):
        ScaledDotProductAttention(**kwargs)


@pytest.mark.parametrize(
    "call,argument",
    [
        (lambda l: l(randn(2, 3)), "query"),
        (lambda l: l(randn(2, 3, 4), randn(2, 3)), "value"),
        (lambda l: l(randn(2, 3, 4), randn(2, 5, 4), randn(2, 6, 4)), "key"),
        (lambda l: l(randn(2, 3, 4), randn(3, 5, 4)), "batch size"),
        (lambda l: l(randn(2, 3, 4), attention_mask=np.ones((3, 4), bool)), "attention_mask"),
        (lambda l: l(randn(2, 3, 4), attention_mask=np.ones((5, 3, 3), bool)), "attention_mask"),
        (lambda l: l(randn(2, 3, 4), attention_mask=np.ones((2, 2, 3, 3), bool)), "attention_mask"),
        (lambda l: l(randn(2, 3, 4), attention_mask=np.ones((3,), bool)), "attention_mask"),
    ],
)
def test_bad_inputs_raise(call, argument):
    layer = ScaledDotProductAttention(key_dim=4, num_heads=3)
    with pytest.raises(ValueError, match=argument):
        call(layer)


def test_attention_mask_error_shows_shapes():
    layer = ScaledDotProductAttention(key_dim=4, num_heads=3)
    with pytest.raises(ValueError) as info:
        layer(randn(2, 3, 4), attention_mask=np.ones((2, 5, 3), bool))
    message = str(info.value)
    assert "(2, 1, 5, 3)" in message and "(2, 3, 3, 3)" in message


# ---------------------------------------------------- the 1/d_k scale (muP)
def np_inverse_attention(q, k, v, mask=None):
    """softmax(q·k / d_k) v on per-head `(B, T, H, d)` arrays, float64."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scores = np.einsum("bthd,bshd->bhts", q, k) / q.shape[-1]
    weights = np_masked_softmax(scores, mask)
    return np.einsum("bhts,bshd->bthd", weights, v), weights


def test_inverse_scale_resolves_to_one_over_key_dim():
    assert "inverse" in SCALE_MODES
    for key_dim in (1, 16, 1024):
        assert resolve_scale("inverse", key_dim) == 1.0 / key_dim
    # Not confused with the other modes: at d_k 64 the three fixed scales differ.
    scales = {mode: resolve_scale(mode, 64) for mode in ("sqrt", "none", "inverse")}
    assert scales == {"sqrt": 0.125, "none": 1.0, "inverse": 1.0 / 64}


def test_inverse_scale_in_the_functional_core_matches_numpy():
    q, k, v = randn(2, 5, 3, 16), randn(2, 7, 3, 16), randn(2, 7, 3, 4)
    mask = random_bool(2, 1, 5, 7)
    mask[0, 0, 2] = False  # a row with no key
    out, weights = scaled_dot_product_attention(
        q, k, v, mask=mask, scale="inverse", return_weights=True
    )
    ref_out, ref_weights = np_inverse_attention(q, k, v, mask)
    np.testing.assert_allclose(to_np(weights), ref_weights, atol=1e-6)
    np.testing.assert_allclose(to_np(out), ref_out, atol=1e-5)
    fast = scaled_dot_product_attention(q, k, v, mask=mask, scale="inverse")
    np.testing.assert_allclose(to_np(fast), ref_out, atol=1e-5)


@pytest.mark.parametrize("implementation", ["explicit", "fused", "memory_efficient"])
@pytest.mark.parametrize("kind", ["none", "value_mask", "attention_3d", "causal", "all"])
def test_inverse_scale_layer_matches_numpy_on_every_path(implementation, kind):
    b, h, t, s, key_dim = 3, 2, 6, 8, 16
    layer = ScaledDotProductAttention(
        key_dim=key_dim, num_heads=h, scale="inverse", output_dim=5,
        implementation=implementation,
        kernel_initializer=keras.initializers.RandomNormal(stddev=1.0),
    )
    query, value = randn(b, t, 7), randn(b, s, 7)
    kw = {} if kind == "none" else _mask_kwargs(kind, b, h, t, s)
    out = to_np(layer(query, value, **kw))
    # The reference: numpy softmax(q·k / d_k) from the layer's own kernels.
    w = lambda var: np.asarray(to_np(var), np.float64)  # noqa: E731
    q = np.einsum("btd,dhk->bthk", query, w(layer.query_kernel))
    k = np.einsum("bsd,dhk->bshk", value, w(layer.key_kernel))
    v = np.einsum("bsd,dhk->bshk", value, w(layer.value_kernel))
    mask = np_combined_mask(
        b, h, t, s, kw.get("query_mask"), kw.get("value_mask"),
        kw.get("key_mask"), kw.get("attention_mask"),
        kw.get("use_causal_mask", False),
    )
    attended, ref_weights = np_inverse_attention(q, k, v, mask)
    ref_out = np.einsum("bthd,hdo->bto", attended, w(layer.output_kernel))
    np.testing.assert_allclose(out, ref_out, atol=1e-4, rtol=1e-5)
    if implementation == "explicit":
        _, weights = layer(query, value, return_attention_scores=True, **kw)
        np.testing.assert_allclose(to_np(weights), ref_weights, atol=1e-5)


def test_inverse_scale_serializes(tmp_path):
    layer = ScaledDotProductAttention(key_dim=8, num_heads=2, scale="inverse")
    config = layer.get_config()
    assert config["scale"] == "inverse"
    json.dumps(config)
    clone = ScaledDotProductAttention.from_config(config)
    assert clone.get_config() == config
    inputs = keras.Input((5, 6))
    model = keras.Model(inputs, layer(inputs))
    data = randn(2, 5, 6)
    path = str(tmp_path / "inverse.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.layers[-1].scale == "inverse"
    np.testing.assert_allclose(to_np(loaded(data)), to_np(model(data)), atol=1e-6)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("implementation", ["explicit", "fused", "memory_efficient"])
@pytest.mark.backends("torch")
@pytest.mark.backends("jax", cases=["memory_efficient-mixed_bfloat16"])
def test_inverse_scale_mixed_precision_matches_float32(policy, implementation):
    kwargs = dict(key_dim=256, num_heads=2, scale="inverse", output_dim=8,
                  implementation=implementation)
    reference_layer = ScaledDotProductAttention(**kwargs)
    x = randn(2, 6, 16)
    mask = np.ones((2, 6), bool)
    mask[1, 4:] = False
    expected = to_np(reference_layer(x, value_mask=mask))
    layer = ScaledDotProductAttention(dtype=policy, **kwargs)
    layer.build((None, 6, 16))
    layer.set_weights(reference_layer.get_weights())
    out, grads = _value_and_grads(
        layer, [x], lambda y: ops.sum(ops.cast(y, "float32")), value_mask=mask
    )
    y = to_np(ops.cast(layer(x, value_mask=mask), "float32"))
    assert np.all(np.isfinite(y))
    for g in grads:
        assert np.all(np.isfinite(g))
    # float16 keeps ~3 decimal digits, bfloat16 ~2: compare at that precision.
    tolerance = 2e-2 if policy == "mixed_float16" else 1e-1
    np.testing.assert_allclose(y, expected, atol=tolerance * np.abs(expected).max())
