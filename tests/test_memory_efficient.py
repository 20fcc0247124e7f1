"""Tests for `keras_attention.memory_efficient`.

Values are checked against a float64 numpy reference written here, gradients
against TensorFlow autodiff of an explicit full-matrix attention written
here. Sizes and chunk sizes are chosen so that chunks do not divide T or S.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_attention.memory_efficient import memory_efficient_attention  # noqa: E402
from keras_attention.ops import resolve_scale  # noqa: E402

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="these tests drive the TensorFlow path; JAX runs in a subprocess",
)

B, T, S, H, DK, DV = 2, 37, 29, 3, 8, 5
SCALE = 0.3


def _inputs(seed=0, batch=B, length=T, keys=S):
    rng = np.random.default_rng(seed)
    query = rng.normal(size=(batch, length, H, DK)).astype("float32")
    key = rng.normal(size=(batch, keys, H, DK)).astype("float32")
    value = rng.normal(size=(batch, keys, H, DV)).astype("float32")
    return query, key, value


def _masks(seed=1):
    rng = np.random.default_rng(seed)
    return {
        "key_mask": rng.random((B, S)) > 0.3,
        "query_mask": rng.random((B, T)) > 0.2,
        "mask_1_1_t_s": rng.random((1, 1, T, S)) > 0.3,
        "mask_b_1_t_s": rng.random((B, 1, T, S)) > 0.3,
        "mask_b_h_t_s": rng.random((B, H, T, S)) > 0.3,
        "mask_b_1_1_s": rng.random((B, 1, 1, S)) > 0.3,
        "mask_1_h_t_1": rng.random((1, H, T, 1)) > 0.2,
    }


MASKS = _masks()

# name -> keyword arguments of memory_efficient_attention
MASK_CASES = {
    "none": {},
    "key_mask": {"key_mask": MASKS["key_mask"]},
    "query_mask": {"query_mask": MASKS["query_mask"]},
    "attention_1_1_t_s": {"attention_mask": MASKS["mask_1_1_t_s"]},
    "attention_b_1_t_s": {"attention_mask": MASKS["mask_b_1_t_s"]},
    "attention_b_h_t_s": {"attention_mask": MASKS["mask_b_h_t_s"]},
    "attention_b_1_1_s": {"attention_mask": MASKS["mask_b_1_1_s"]},
    "attention_1_h_t_1": {"attention_mask": MASKS["mask_1_h_t_1"]},
    "causal": {"causal": True},
    "all_combined": {
        "key_mask": MASKS["key_mask"],
        "query_mask": MASKS["query_mask"],
        "attention_mask": MASKS["mask_b_h_t_s"],
        "causal": True,
    },
}


def _valid_numpy(
    shape, key_mask=None, query_mask=None, attention_mask=None, causal=False
):
    batch, heads, length, keys = shape
    valid = np.ones(shape, dtype=bool)
    if key_mask is not None:
        valid &= np.asarray(key_mask)[:, None, None, :]
    if query_mask is not None:
        valid &= np.asarray(query_mask)[:, None, :, None]
    if attention_mask is not None:
        valid &= np.asarray(attention_mask)
    if causal:
        valid &= np.tril(np.ones((length, keys), dtype=bool))
    return valid


def numpy_attention(query, key, value, scale, **masks):
    """softmax(q k^T * scale) v in float64; rows with no valid key -> 0."""
    query, key, value = (np.asarray(x, dtype="float64") for x in (query, key, value))
    scores = np.einsum("bthd,bshd->bhts", query, key) * scale
    valid = _valid_numpy(scores.shape, **masks)
    row_max = np.max(np.where(valid, scores, -np.inf), axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    weights = np.where(valid, np.exp(scores - row_max), 0.0)
    total = weights.sum(axis=-1, keepdims=True)
    weights = weights / np.where(total > 0, total, 1.0)
    return np.einsum("bhts,bshd->bthd", weights, value)


def explicit_tf_attention(query, key, value, scale, **masks):
    """Full score matrix + softmax in TF; masked weights zeroed after softmax."""
    scores = tf.einsum("bthd,bshd->bhts", query, key) * scale
    valid = tf.constant(_valid_numpy(tuple(scores.shape), **masks))
    weights = tf.nn.softmax(tf.where(valid, scores, -1e9), axis=-1)
    weights = weights * tf.cast(valid, weights.dtype)
    return tf.einsum("bhts,bshd->bthd", weights, value)


def _gradients(fn, query, key, value, scale, upstream):
    query, key, value, scale = (
        tf.constant(x) for x in (query, key, value, np.float32(scale))
    )
    with tf.GradientTape() as tape:
        tape.watch([query, key, value, scale])
        output = fn(query, key, value, scale)
        loss = tf.reduce_sum(output * upstream)
    return output, tape.gradient(loss, [query, key, value, scale])


def _assert_qkv_gradients_match_explicit(grads, query, key, value, upstream,
                                         scale=SCALE, **masks):
    """dq, dk, dv in `grads` equal the explicit path's under the same masks
    and scale."""
    _, ref_grads = _gradients(
        lambda q, k, v, s: explicit_tf_attention(q, k, v, s, **masks),
        query,
        key,
        value,
        scale,
        upstream,
    )
    for grad, ref_grad in zip(grads[:3], ref_grads[:3]):
        np.testing.assert_allclose(grad.numpy(), ref_grad.numpy(), atol=1e-5)


VALUE_CASES = [(case, (8, 16)) for case in sorted(MASK_CASES)] + [
    (case, (16, 8)) for case in ("none", "attention_b_h_t_s", "all_combined")
]


@pytest.mark.parametrize("case,chunks", VALUE_CASES)
def test_values_match_numpy_reference(case, chunks):
    query, key, value = _inputs()
    masks = MASK_CASES[case]
    output = memory_efficient_attention(
        query,
        key,
        value,
        SCALE,
        query_chunk_size=chunks[0],
        key_chunk_size=chunks[1],
        **masks,
    )
    assert output.shape == (B, T, H, DV)
    assert output.dtype == tf.float32
    expected = numpy_attention(query, key, value, SCALE, **masks)
    np.testing.assert_allclose(output.numpy(), expected, atol=1e-5, rtol=1e-5)


def test_chunks_larger_than_sequence_or_tiny():
    query, key, value = _inputs()
    expected = numpy_attention(query, key, value, SCALE, causal=True)
    for chunks in [(512, 512), (T, S), (5, 3)]:
        output = memory_efficient_attention(
            query,
            key,
            value,
            SCALE,
            causal=True,
            query_chunk_size=chunks[0],
            key_chunk_size=chunks[1],
        )
        np.testing.assert_allclose(output.numpy(), expected, atol=1e-5)


@pytest.mark.parametrize("length,keys", [(0, 7), (7, 0)])
def test_empty_sequences_give_empty_or_zero_output(length, keys):
    query, key, value = _inputs(length=length, keys=keys)
    output = memory_efficient_attention(query, key, value, SCALE)
    assert tuple(output.shape) == (B, length, H, DV)
    assert np.all(output.numpy() == 0.0)


@pytest.mark.parametrize("length,keys", [(13, 40), (40, 13)])
def test_causal_with_different_lengths(length, keys):
    query, key, value = _inputs(seed=3, length=length, keys=keys)
    output = memory_efficient_attention(
        query, key, value, SCALE, causal=True, query_chunk_size=6, key_chunk_size=7
    )
    expected = numpy_attention(query, key, value, SCALE, causal=True)
    np.testing.assert_allclose(output.numpy(), expected, atol=1e-5)


@pytest.mark.parametrize("case", sorted(MASK_CASES))
def test_gradients_match_explicit_attention(case):
    query, key, value = _inputs(seed=4)
    masks = MASK_CASES[case]
    upstream = np.random.default_rng(5).normal(size=(B, T, H, DV)).astype("float32")

    def efficient(q, k, v, scale):
        return memory_efficient_attention(
            q, k, v, scale, query_chunk_size=8, key_chunk_size=16, **masks
        )

    def explicit(q, k, v, scale):
        return explicit_tf_attention(q, k, v, scale, **masks)

    output, grads = _gradients(efficient, query, key, value, SCALE, upstream)
    ref_output, ref_grads = _gradients(explicit, query, key, value, SCALE, upstream)
    np.testing.assert_allclose(output.numpy(), ref_output.numpy(), atol=1e-5)
    for name, grad, ref_grad in zip(("query", "key", "value"), grads, ref_grads):
        np.testing.assert_allclose(
            grad.numpy(), ref_grad.numpy(), atol=1e-5, rtol=1e-5, err_msg=name
        )
    # The scale gradient sums over every score, so compare relatively.
    np.testing.assert_allclose(grads[3].numpy(), ref_grads[3].numpy(), rtol=1e-4)


def test_fully_masked_rows_give_zero_output_and_finite_gradients():
    query, key, value = _inputs(seed=6)
    key_mask = np.ones((B, S), dtype=bool)
    key_mask[1] = False  # batch 1 has no attendable key at all
    query_mask = np.ones((B, T), dtype=bool)
    query_mask[0, [0, 17, 36]] = False
    masks = {"key_mask": key_mask, "query_mask": query_mask, "causal": True}
    upstream = np.ones((B, T, H, DV), dtype="float32")

    def efficient(q, k, v, scale):
        return memory_efficient_attention(
            q, k, v, scale, query_chunk_size=8, key_chunk_size=16, **masks
        )

    output, grads = _gradients(efficient, query, key, value, SCALE, upstream)
    output = output.numpy()
    assert np.all(output[1] == 0.0)
    assert np.all(output[0, [0, 17, 36]] == 0.0)
    assert np.abs(output[0, 1:17]).sum() > 0
    for grad in grads:
        assert np.all(np.isfinite(grad.numpy()))
    d_query, d_key, d_value = (g.numpy() for g in grads[:3])
    assert np.all(d_query[1] == 0.0) and np.all(d_query[0, [0, 17, 36]] == 0.0)
    assert np.all(d_key[1] == 0.0) and np.all(d_value[1] == 0.0)
    _assert_qkv_gradients_match_explicit(
        grads, query, key, value, upstream, **masks
    )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_large_unscaled_scores_stay_finite(dtype):
    rng = np.random.default_rng(7)
    dk = 1024
    query = rng.normal(size=(1, 20, 2, dk))
    key = rng.normal(size=(1, 24, 2, dk))
    value = rng.normal(size=(1, 24, 2, 4))
    inputs = [tf.constant(x, dtype=dtype) for x in (query, key, value)]
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        output = memory_efficient_attention(
            *inputs, scale=1.0, causal=True, query_chunk_size=8, key_chunk_size=16
        )
        loss = tf.reduce_sum(tf.cast(output, tf.float32))
    assert output.dtype == tf.as_dtype(dtype)
    for grad in tape.gradient(loss, inputs):
        assert grad.dtype == tf.as_dtype(dtype)
        assert np.all(np.isfinite(tf.cast(grad, tf.float32).numpy()))
    output = tf.cast(output, tf.float32).numpy()
    assert np.all(np.isfinite(output))
    # Scores have std ~32, so softmax in the input dtype would overflow;
    # the float32 statistics must match a float64 softmax of the same inputs.
    rounded = [tf.cast(x, tf.float64).numpy() for x in inputs]
    expected = numpy_attention(*rounded, 1.0, causal=True)
    np.testing.assert_allclose(output, expected, atol=0.02)


def test_runs_inside_xla_compiled_function():
    query, key, value = _inputs(seed=8)
    masks = {
        "key_mask": MASKS["key_mask"],
        "attention_mask": MASKS["mask_b_1_t_s"],
        "causal": True,
    }
    upstream = np.random.default_rng(9).normal(size=(B, T, H, DV)).astype("float32")

    @tf.function(jit_compile=True)
    def step(q, k, v, scale):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v, scale])
            output = memory_efficient_attention(
                q, k, v, scale, query_chunk_size=8, key_chunk_size=16, **masks
            )
            loss = tf.reduce_sum(output * upstream)
        return output, tape.gradient(loss, [q, k, v, scale])

    inputs = [tf.constant(x) for x in (query, key, value, np.float32(SCALE))]
    output, grads = step(*inputs)
    expected = numpy_attention(query, key, value, SCALE, **masks)
    np.testing.assert_allclose(output.numpy(), expected, atol=1e-5)
    _assert_qkv_gradients_match_explicit(
        grads, query, key, value, upstream, **masks
    )


@pytest.mark.parametrize(
    "dynamic,chunks", [("batch", (8, 16)), ("batch", (64, 64)), ("all", (8, 16))]
)
def test_dynamic_shapes_in_tf_function(dynamic, chunks):
    if dynamic == "batch":
        # Static lengths, unknown batch: what a Keras model traces.
        sizes = [(T, S)]
        signature = [
            tf.TensorSpec([None, T, H, DK], tf.float32),
            tf.TensorSpec([None, S, H, DK], tf.float32),
            tf.TensorSpec([None, S, H, DV], tf.float32),
            tf.TensorSpec([None, T, H, DV], tf.float32),
            tf.TensorSpec([None, S], tf.bool),
        ]
    else:
        sizes = [(T, S), (20, 33)]
        spec = tf.TensorSpec([None, None, H, None], tf.float32)
        signature = [spec] * 4 + [tf.TensorSpec([None, None], tf.bool)]

    @tf.function(input_signature=signature)
    def attend(q, k, v, upstream, key_mask):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            output = memory_efficient_attention(
                q,
                k,
                v,
                SCALE,
                key_mask=key_mask,
                causal=True,
                query_chunk_size=chunks[0],
                key_chunk_size=chunks[1],
            )
            loss = tf.reduce_sum(output * upstream)
        return output, tape.gradient(loss, [q, k, v])

    for seed, (length, keys) in enumerate(sizes):
        query, key, value = _inputs(seed=10 + seed, length=length, keys=keys)
        rng = np.random.default_rng(seed)
        key_mask = rng.random((B, keys)) > 0.3
        upstream = rng.normal(size=(B, length, H, DV)).astype("float32")
        output, grads = attend(query, key, value, upstream, key_mask)
        expected = numpy_attention(
            query, key, value, SCALE, key_mask=key_mask, causal=True
        )
        np.testing.assert_allclose(output.numpy(), expected, atol=1e-5)
        _assert_qkv_gradients_match_explicit(
            grads, query, key, value, upstream, key_mask=key_mask, causal=True
        )


def test_learned_scale_variable_gets_gradient():
    query, key, value = _inputs(seed=12)
    scale = tf.Variable(SCALE)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(
            memory_efficient_attention(
                query, key, value, scale, query_chunk_size=8, key_chunk_size=16
            )
        )
    d_scale = tape.gradient(loss, scale)
    with tf.GradientTape() as tape:
        ref_loss = tf.reduce_sum(explicit_tf_attention(query, key, value, scale))
    ref_d_scale = tape.gradient(ref_loss, scale)
    np.testing.assert_allclose(d_scale.numpy(), ref_d_scale.numpy(), rtol=1e-4)


@pytest.mark.parametrize(
    "kwargs,argument",
    [
        ({"query_chunk_size": 0}, "query_chunk_size"),
        ({"key_chunk_size": -4}, "key_chunk_size"),
        ({"query_chunk_size": 2.5}, "query_chunk_size"),
        ({"key_chunk_size": True}, "key_chunk_size"),
        ({"query": np.zeros((B, T, DK), "float32")}, "query"),
        ({"key": np.zeros((B, S, H, DK, 1), "float32")}, "key"),
        ({"value": np.zeros((B + 1, S, H, DV), "float32")}, "batch"),
        ({"key": np.zeros((B, S, H + 1, DK), "float32")}, "heads"),
        ({"key": np.zeros((B, S, H, DK + 1), "float32")}, "key dims"),
        ({"value": np.zeros((B, S + 1, H, DV), "float32")}, "lengths"),
        ({"key_mask": np.ones((B, T), bool)}, "key_mask"),
        ({"query_mask": np.ones((B, T, 1), bool)}, "query_mask"),
        ({"attention_mask": np.ones((B, H, T), bool)}, "attention_mask"),
        ({"attention_mask": np.ones((B, H, T, 2), bool)}, "attention_mask"),
        ({"scale": float("nan")}, "scale"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, argument):
    query, key, value = _inputs()
    arguments = {"query": query, "key": key, "value": value, "scale": SCALE}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=argument):
        memory_efficient_attention(**arguments)


_JAX_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import keras
    import jax, jax.numpy as jnp
    from keras_attention.memory_efficient import memory_efficient_attention
    assert keras.backend.backend() == "jax"
    data = np.load(sys.argv[1])
    q, k, v = (jnp.asarray(data[n]) for n in ("query", "key", "value"))
    masks = dict(key_mask=data["key_mask"], query_mask=data["query_mask"],
                 attention_mask=data["attention_mask"], causal=True)
    valid = jnp.asarray(data["valid"])

    def efficient(q, k, v, scale):
        return memory_efficient_attention(
            q, k, v, scale, query_chunk_size=8, key_chunk_size=16, **masks)

    def explicit(q, k, v, scale):
        scores = jnp.einsum("bthd,bshd->bhts", q, k) * scale
        weights = jax.nn.softmax(jnp.where(valid, scores, -1e9), axis=-1) * valid
        return jnp.einsum("bhts,bshd->bthd", weights, v)

    scale = jnp.float32(data["scale"])
    upstream = jnp.asarray(data["upstream"])

    @jax.jit
    def value_and_grads(q, k, v, scale):
        out, vjp = jax.vjp(efficient, q, k, v, scale)
        return out, vjp(upstream)

    out, grads = value_and_grads(q, k, v, scale)
    _, ref_vjp = jax.vjp(explicit, q, k, v, scale)
    ref = ref_vjp(upstream)
    np.save(sys.argv[2], np.asarray(out))
    print(json.dumps({
        "grad_errors": [
            float(jnp.max(jnp.abs(g - r))) for g, r in zip(grads[:3], ref[:3])
        ],
        "scale_grad": [float(grads[3]), float(ref[3])],
    }))
    """
)


def test_jax_backend_values_and_gradients(tmp_path):
    pytest.importorskip("jax")
    query, key, value = _inputs(seed=13)
    masks = {
        "key_mask": MASKS["key_mask"],
        "query_mask": MASKS["query_mask"],
        "attention_mask": MASKS["mask_b_1_t_s"],
        "causal": True,
    }
    upstream = np.random.default_rng(14).normal(size=(B, T, H, DV)).astype("float32")
    data_path, out_path = tmp_path / "inputs.npz", tmp_path / "output.npy"
    np.savez(
        data_path,
        query=query,
        key=key,
        value=value,
        upstream=upstream,
        scale=np.float32(SCALE),
        valid=_valid_numpy((B, H, T, S), **masks),
        **{name: masks[name] for name in ("key_mask", "query_mask", "attention_mask")},
    )
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [repo_root, env.get("PYTHONPATH")])
    )
    result = subprocess.run(
        [sys.executable, "-c", _JAX_SCRIPT, str(data_path), str(out_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    expected = numpy_attention(query, key, value, SCALE, **masks)
    np.testing.assert_allclose(np.load(out_path), expected, atol=1e-5)
    assert max(report["grad_errors"]) < 1e-5, report
    np.testing.assert_allclose(*report["scale_grad"], rtol=1e-4)


# ---------------------------------------------------- the 1/d_k scale (muP)
@pytest.mark.parametrize("case", ["none", "all_combined"])
def test_inverse_scale_values_and_gradients(case):
    """The layer's `scale="inverse"` resolves to 1/d_k, and the chunked path
    at that scale matches numpy softmax(q·k/d_k) and the explicit path's
    gradients (chunks that do not divide T or S)."""
    scale = resolve_scale("inverse", DK)
    assert scale == 1.0 / DK
    query, key, value = _inputs(seed=11)
    masks = MASK_CASES[case]
    upstream = np.random.default_rng(12).normal(size=(B, T, H, DV)).astype("float32")

    def efficient(q, k, v, s):
        return memory_efficient_attention(
            q, k, v, s, query_chunk_size=8, key_chunk_size=16, **masks
        )

    output, grads = _gradients(efficient, query, key, value, scale, upstream)
    # The reference's scale is written out: 1/d_k, not resolve_scale's.
    expected = numpy_attention(query, key, value, 1.0 / DK, **masks)
    np.testing.assert_allclose(output.numpy(), expected, atol=1e-5)
    _assert_qkv_gradients_match_explicit(grads, query, key, value, upstream,
                                         scale=scale, **masks)
