"""Memory-efficient (chunked, online-softmax) scaled dot-product attention.

On the TensorFlow backend Keras has no fused attention kernel:
`keras.layers.MultiHeadAttention` and `keras.ops.dot_product_attention`
materialize the full `(B, H, T, S)` score matrix in the forward pass and keep
it (plus the softmax output) for the backward pass. This module computes the
same result block by block:

- Forward: loop over query chunks; for each, stream over key chunks keeping a
  running row maximum, a running softmax denominator and a running weighted
  sum of values (the "online softmax"), all in float32. Only one
  `(B, H, query_chunk, key_chunk)` block of scores exists at a time.
- Backward: only the output and the per-row log-sum-exp are kept from the
  forward pass. Every block of probabilities is recomputed from them, and the
  gradients w.r.t. query, key, value (and the scale) are accumulated block by
  block (the FlashAttention backward).

On a GPU the layer's `implementation="auto"` never takes this path where a
fused kernel serves the call (`keras_attention.paths`): its blocks are
loops of small matmuls that XLA runs one after another, 7.6x cuDNN's fused
kernel at T 4096 and 12.3x at T 16384 on one H200 (bf16, 16 heads of 64).
It is the CPU's way to long sequences, and any device's way to a long
soft-capped one.

This is the one backend-specific part of the package. The block arithmetic
and mask handling are written with `keras.ops` and shared (`_blocks`); the
loops and the custom gradient are written per backend:

- `_tensorflow` (main target): `tf.while_loop` with `tf.TensorArray` outputs
  and `tf.custom_gradient`. Works eagerly, inside `tf.function` and with
  `jit_compile=True`.
- `_jax`: `jax.lax` loops with `jax.custom_vjp`, running the same blocks.
- `_torch`: Python loops over the same blocks inside a
  `torch.autograd.Function` (PyTorch runs eagerly, so plain loops are its
  loops).

The backend is chosen with `keras.backend.backend()`. This package is on
floor 0 (core), beside `keras_attention.ops`: it may import keras, numpy and
`keras_attention.{ops, validation}`, never the layer or anything above it.
"""

import math

import keras

from keras_attention.memory_efficient import _jax
from keras_attention.memory_efficient import _tensorflow
from keras_attention.memory_efficient import _torch
from keras_attention.validation import FLOAT32_MAX
from keras_attention.validation import check_int
from keras_attention.validation import check_real

# The modules that run the blocks, by Keras backend.
_BACKENDS = {"tensorflow": _tensorflow, "jax": _jax, "torch": _torch}


def memory_efficient_attention(
    query,
    key,
    value,
    scale,
    key_mask=None,
    query_mask=None,
    attention_mask=None,
    causal=False,
    query_chunk_size=512,
    key_chunk_size=512,
    logit_soft_cap=None,
):
    """Scaled dot-product attention without materializing the score matrix.

    Computes `softmax(query @ key^T * scale) @ value` per batch and head with
    memory `O(B * H * query_chunk_size * key_chunk_size)` for the scores
    instead of `O(B * H * T * S)`, in the forward and in the backward pass.
    Softmax statistics and accumulation are float32 whatever the input dtype;
    float16/bfloat16 inputs are cast to float32 inside and the output is cast
    back to the input dtype.

    All masks use True = attend and are combined with AND. A query row with
    no key it may attend gets a zero output (and zero gradients), never NaN
    and never a uniform average.

    Args:
        query: Tensor of shape `(B, T, H, dk)`.
        key: Tensor of shape `(B, S, H, dk)`.
        value: Tensor of shape `(B, S, H, dv)`.
        scale: Python float or scalar tensor multiplying the scores. A tensor
            (e.g. a learned scale) receives a gradient.
        key_mask: Optional boolean tensor `(B, S)`.
        query_mask: Optional boolean tensor `(B, T)`. Masked query rows
            attend to nothing and get a zero output.
        attention_mask: Optional boolean rank-4 tensor broadcastable to
            `(B, H, T, S)`; every dimension is either full size or 1. It is
            sliced per chunk, never broadcast to full size.
        causal: If True, query `i` may only attend keys `j <= i`
            (lower-triangular mask aligned top-left). Key chunks lying
            entirely above the diagonal are skipped.
        query_chunk_size: Positive int, query rows per block.
        key_chunk_size: Positive int, keys per block. `T` and `S` need not be
            multiples of the chunk sizes.
        logit_soft_cap: `None`, or a positive float `c`: each block's
            scaled scores become `c * tanh(s / c)` before the masks (Gemma
            2's soft cap), with the cap's derivative in the backward pass.

    Returns:
        Tensor of shape `(B, T, H, dv)` in the dtype of `query`.

    Example:

    >>> q = np.random.normal(size=(2, 100, 4, 16)).astype("float32")
    >>> k = np.random.normal(size=(2, 80, 4, 16)).astype("float32")
    >>> v = np.random.normal(size=(2, 80, 4, 8)).astype("float32")
    >>> out = memory_efficient_attention(
    ...     q, k, v, scale=16**-0.5, causal=True,
    ...     query_chunk_size=32, key_chunk_size=32)
    >>> tuple(out.shape)
    (2, 100, 4, 8)
    """

    backend = keras.backend.backend()
    if backend not in _BACKENDS:
        raise ValueError(
            "memory_efficient_attention supports the "
            f"{', '.join(repr(name) for name in _BACKENDS)} backends. "
            f"Received: backend={backend!r}"
        )
    runner = _BACKENDS[backend]
    query, key, value = (runner.to_tensor(x) for x in (query, key, value))
    masks = tuple(
        None if mask is None else runner.to_tensor(mask)
        for mask in (key_mask, query_mask, attention_mask)
    )
    query_chunk_size = check_int(query_chunk_size, "query_chunk_size")
    key_chunk_size = check_int(key_chunk_size, "key_chunk_size")
    _validate(query, key, value, scale, masks)
    return runner.attention(
        query,
        key,
        value,
        scale,
        masks + (bool(causal),),
        query_chunk_size,
        key_chunk_size,
        check_real(logit_soft_cap, "logit_soft_cap", low=0.0,
                   high=FLOAT32_MAX, low_open=True, allow_none=True),
    )


def _validate(query, key, value, scale, masks):
    key_mask, query_mask, attention_mask = masks
    if isinstance(scale, (int, float)) and not math.isfinite(scale):
        raise ValueError(f"`scale` must be finite. Received: scale={scale}")
    shapes = {}
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        shape = tuple(tensor.shape)
        if len(shape) != 4:
            raise ValueError(
                f"`{name}` must have rank 4 (batch, length, heads, dim). "
                f"Received: {name}.shape={shape}"
            )
        if not _is_floating(tensor.dtype):
            raise ValueError(
                f"`{name}` must be a floating-point tensor. "
                f"Received: {name}.dtype={tensor.dtype}"
            )
        shapes[name] = shape
    q_shape, k_shape, v_shape = shapes["query"], shapes["key"], shapes["value"]

    def check_equal(what, pairs):
        known = [(name, dim) for name, dim in pairs if dim is not None]
        if len({dim for _, dim in known}) > 1:
            described = ", ".join(f"{name}={dim}" for name, dim in known)
            raise ValueError(f"Mismatched {what}: {described}.")

    check_equal(
        "batch sizes",
        [("query", q_shape[0]), ("key", k_shape[0]), ("value", v_shape[0])],
    )
    check_equal(
        "numbers of heads",
        [("query", q_shape[2]), ("key", k_shape[2]), ("value", v_shape[2])],
    )
    check_equal(
        "key dims (last axis)", [("query", q_shape[3]), ("key", k_shape[3])]
    )
    check_equal(
        "key/value lengths (axis 1)",
        [("key", k_shape[1]), ("value", v_shape[1])],
    )

    batch, length, heads, keys = q_shape[0], q_shape[1], q_shape[2], k_shape[1]
    for name, mask, axis, expected in (
        ("key_mask", key_mask, "S", (batch, keys)),
        ("query_mask", query_mask, "T", (batch, length)),
    ):
        if mask is None:
            continue
        shape = tuple(mask.shape)
        if len(shape) != 2 or any(
            got is not None and want is not None and got != want
            for got, want in zip(shape, expected)
        ):
            raise ValueError(
                f"`{name}` must have shape (B, {axis}) = {expected}. "
                f"Received: {name}.shape={shape}"
            )
    if attention_mask is not None:
        shape = tuple(attention_mask.shape)
        full = (batch, heads, length, keys)
        if len(shape) != 4 or any(
            got is not None and want is not None and got not in (1, want)
            for got, want in zip(shape, full)
        ):
            raise ValueError(
                "`attention_mask` must be rank 4 and broadcastable to "
                f"(B, H, T, S) = {full}, each dim full size or 1. "
                f"Received: attention_mask.shape={shape}"
            )


def _is_floating(dtype):
    return "float" in keras.backend.standardize_dtype(dtype)
