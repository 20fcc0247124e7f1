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

This is the one backend-specific module of the package. The block arithmetic
and mask handling are written with `keras.ops` and shared; the loops and the
custom gradient are written per backend:

- TensorFlow (main target): `tf.while_loop` with `tf.TensorArray` outputs
  and `tf.custom_gradient`. Works eagerly, inside `tf.function` and with
  `jit_compile=True`.
- JAX: `jax.lax` loops with `jax.custom_vjp`, running the same blocks.

The backend is chosen with `keras.backend.backend()`.
"""

import math

import keras
import numpy as np
from keras import ops

_NEG_INF = float("-inf")


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
    if backend == "tensorflow":
        import tensorflow as tf

        convert = tf.convert_to_tensor
    elif backend == "jax":
        import jax.numpy as jnp

        convert = jnp.asarray
    else:
        raise NotImplementedError(
            "memory_efficient_attention supports the 'tensorflow' and 'jax' "
            f"backends. Received: backend={backend!r}"
        )
    query, key, value = convert(query), convert(key), convert(value)
    key_mask = None if key_mask is None else convert(key_mask)
    query_mask = None if query_mask is None else convert(query_mask)
    if attention_mask is not None:
        attention_mask = convert(attention_mask)
    _validate(
        query,
        key,
        value,
        scale,
        key_mask,
        query_mask,
        attention_mask,
        query_chunk_size,
        key_chunk_size,
    )
    masks = (key_mask, query_mask, attention_mask, bool(causal))
    if backend == "tensorflow":
        return _tf_attention(
            query, key, value, scale, masks, query_chunk_size, key_chunk_size
        )
    return _jax_attention(
        query, key, value, scale, masks, query_chunk_size, key_chunk_size
    )


def _validate(
    query,
    key,
    value,
    scale,
    key_mask,
    query_mask,
    attention_mask,
    query_chunk_size,
    key_chunk_size,
):
    for name, size in (
        ("query_chunk_size", query_chunk_size),
        ("key_chunk_size", key_chunk_size),
    ):
        if (
            isinstance(size, bool)
            or not isinstance(size, (int, np.integer))
            or size <= 0
        ):
            raise ValueError(
                f"`{name}` must be a positive integer. Received: {name}={size}"
            )
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
        "key/value lengths (axis 1)", [("key", k_shape[1]), ("value", v_shape[1])]
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


# Shared block arithmetic (keras.ops; runs on the active backend).


def _num_chunks(length, chunk_size):
    return (length + chunk_size - 1) // chunk_size


def _split_chunks(x, chunk_size, pad_value=0):
    """`(B, L, ...)` -> `(num_chunks, B, chunk_size, ...)`, padding L."""
    shape = ops.shape(x)
    num_chunks = _num_chunks(shape[1], chunk_size)
    padding = num_chunks * chunk_size - shape[1]
    if not (isinstance(padding, int) and padding == 0):
        pad_width = [[0, 0], [0, padding]] + [[0, 0]] * (len(shape) - 2)
        x = ops.pad(x, pad_width, constant_values=pad_value)
    x = ops.reshape(x, (shape[0], num_chunks, chunk_size) + tuple(shape[2:]))
    return ops.swapaxes(x, 0, 1)


def _split_heads_chunks(x, chunk_size):
    """`(B, L, H, d)` -> `(num_chunks, B, H, chunk_size, d)`."""
    return ops.swapaxes(_split_chunks(x, chunk_size), 2, 3)


def _merge_heads_chunks(x, length):
    """`(num_chunks, B, H, chunk_size, d)` -> `(B, length, H, d)`."""
    num_chunks, batch, heads, chunk_size, dim = ops.shape(x)
    x = ops.transpose(x, (1, 0, 3, 2, 4))
    x = ops.reshape(x, (batch, num_chunks * chunk_size, heads, dim))
    return x[:, :length]


def _causal_key_chunks(query_chunk_index, query_chunk, key_chunk, num_key_chunks):
    """Number of leading key chunks query chunk `i` can see when causal."""
    last_row_end = (query_chunk_index + 1) * query_chunk
    return ops.minimum(num_key_chunks, (last_row_end + key_chunk - 1) // key_chunk)


class _ChunkMasks:
    """Builds the combined boolean mask of one `(query, key)` block.

    Masks are padded (padded keys are hidden) and laid out so that a block
    needs only a slice, never a full-size broadcast. Calling the instance
    with chunk indices `(i, j)` returns a bool tensor broadcastable to
    `(B, H, query_chunk, key_chunk)`, or None when nothing is masked.
    """

    def __init__(
        self,
        key_mask,
        query_mask,
        attention_mask,
        causal,
        length,
        num_keys,
        query_chunk,
        key_chunk,
    ):
        self.query_chunk = query_chunk
        self.key_chunk = key_chunk
        self.causal = causal
        num_key_chunks = _num_chunks(num_keys, key_chunk)
        keys_padded = not (
            isinstance(num_keys, int) and num_keys % key_chunk == 0
        )
        self.key_valid = None
        if key_mask is not None:
            # (B, S) -> (nk, B, 1, 1, kc); padding with False hides padded keys.
            chunks = _split_chunks(ops.cast(key_mask, "bool"), key_chunk, False)
            self.key_valid = chunks[:, :, None, None, :]
        elif keys_padded:
            positions = ops.arange(num_key_chunks * key_chunk)
            valid = ops.less(positions, num_keys)
            self.key_valid = ops.reshape(valid, (-1, 1, 1, 1, key_chunk))
        self.query_valid = None
        if query_mask is not None:
            chunks = _split_chunks(ops.cast(query_mask, "bool"), query_chunk, False)
            self.query_valid = chunks[:, :, None, :, None]
        self.attention_mask = None
        if attention_mask is not None:
            attention_mask = ops.cast(attention_mask, "bool")
            mask_shape = attention_mask.shape
            # Static size-1 dims broadcast; anything else is full size.
            self.mask_full_rows = mask_shape[2] != 1
            self.mask_full_cols = mask_shape[3] != 1
            pad_rows = pad_cols = 0
            if self.mask_full_rows:
                pad_rows = _num_chunks(length, query_chunk) * query_chunk - length
            if self.mask_full_cols:
                pad_cols = num_key_chunks * key_chunk - num_keys
            if not (
                isinstance(pad_rows, int)
                and isinstance(pad_cols, int)
                and pad_rows == pad_cols == 0
            ):
                attention_mask = ops.pad(
                    attention_mask,
                    [[0, 0], [0, 0], [0, pad_rows], [0, pad_cols]],
                    constant_values=False,
                )
            self.attention_mask = attention_mask

    def __call__(self, i, j):
        parts = []
        if self.key_valid is not None:
            parts.append(self.key_valid[j])
        if self.query_valid is not None:
            parts.append(self.query_valid[i])
        if self.attention_mask is not None:
            start = [
                0,
                0,
                i * self.query_chunk if self.mask_full_rows else 0,
                j * self.key_chunk if self.mask_full_cols else 0,
            ]
            size = [
                -1,
                -1,
                self.query_chunk if self.mask_full_rows else 1,
                self.key_chunk if self.mask_full_cols else 1,
            ]
            parts.append(ops.slice(self.attention_mask, start, size))
        if self.causal:
            rows = i * self.query_chunk + ops.arange(self.query_chunk)
            cols = j * self.key_chunk + ops.arange(self.key_chunk)
            parts.append(ops.greater_equal(rows[:, None], cols[None, :]))
        if not parts:
            return None
        valid = parts[0]
        for part in parts[1:]:
            valid = ops.logical_and(valid, part)
        return valid


def _block_scores(query_chunk, key_chunk, valid):
    """Scores of one block, `-inf` where masked. Query is pre-scaled."""
    scores = ops.einsum("bhqd,bhkd->bhqk", query_chunk, key_chunk)
    if valid is not None:
        scores = ops.where(valid, scores, _NEG_INF)
    return scores


def _online_softmax_step(query_chunk, key_chunk, value_chunk, valid, state):
    """Folds one key block into the running `(max, sum, weighted values)`."""
    running_max, running_sum, accumulator = state
    scores = _block_scores(query_chunk, key_chunk, valid)
    new_max = ops.maximum(running_max, ops.max(scores, axis=-1))
    # Rows that have seen no attendable key yet keep max = -inf; shift them
    # by 0 so every exp() below is exp(-inf) = 0 rather than NaN.
    shift = ops.where(ops.isfinite(new_max), new_max, 0.0)
    probs = ops.exp(scores - shift[..., None])
    correction = ops.exp(running_max - shift)
    running_sum = running_sum * correction + ops.sum(probs, axis=-1)
    accumulator = accumulator * correction[..., None] + ops.matmul(
        probs, value_chunk
    )
    return new_max, running_sum, accumulator


def _initial_state(query_chunk, value_dim):
    rows = ops.shape(query_chunk)[:-1]
    return (
        ops.full(rows, _NEG_INF, "float32"),
        ops.zeros(rows, "float32"),
        ops.zeros(tuple(rows) + (value_dim,), "float32"),
    )


def _finish_rows(state):
    """Output and log-sum-exp of a query block; empty rows give 0 and 0."""
    running_max, running_sum, accumulator = state
    has_key = running_sum > 0
    safe_sum = ops.where(has_key, running_sum, 1.0)
    output = accumulator / safe_sum[..., None]
    logsumexp = ops.where(has_key, running_max + ops.log(safe_sum), 0.0)
    return output, logsumexp


def _backward_block(
    query_chunk, key_chunk, value_chunk, d_output, logsumexp, delta, valid
):
    """Gradient contributions of one block, recomputing its probabilities.

    Returns `(d_query_chunk, d_key_chunk, d_value_chunk)`, where `d_query` is
    w.r.t. the pre-scaled query.
    """
    scores = _block_scores(query_chunk, key_chunk, valid)
    probs = ops.exp(scores - logsumexp[..., None])
    # einsum lets the backend fold the transposes into the matmuls.
    d_value = ops.einsum("bhqk,bhqd->bhkd", probs, d_output)
    d_probs = ops.einsum("bhqd,bhkd->bhqk", d_output, value_chunk)
    d_scores = probs * (d_probs - delta[..., None])
    d_query = ops.einsum("bhqk,bhkd->bhqd", d_scores, key_chunk)
    d_key = ops.einsum("bhqk,bhqd->bhkd", d_scores, query_chunk)
    return d_query, d_key, d_value


class _Problem:
    """Chunk geometry of one call and its block mask builder."""

    def __init__(self, length, num_keys, masks, query_chunk_size, key_chunk_size):
        key_mask, query_mask, attention_mask, causal = masks
        self.length = length
        self.num_keys = num_keys
        # Never pad short sequences up to a large chunk.
        self.query_chunk = _clamp_chunk(query_chunk_size, length)
        self.key_chunk = _clamp_chunk(key_chunk_size, num_keys)
        self.num_query_chunks = _num_chunks(length, self.query_chunk)
        self.num_key_chunks = _num_chunks(num_keys, self.key_chunk)
        self.causal = causal
        self.masks = _ChunkMasks(
            key_mask,
            query_mask,
            attention_mask,
            causal,
            length,
            num_keys,
            self.query_chunk,
            self.key_chunk,
        )

    def split_queries(self, x):
        return _split_heads_chunks(x, self.query_chunk)

    def split_keys(self, x):
        return _split_heads_chunks(x, self.key_chunk)

    def visible_key_chunks(self, i):
        if not self.causal:
            return self.num_key_chunks
        return _causal_key_chunks(
            i, self.query_chunk, self.key_chunk, self.num_key_chunks
        )


def _clamp_chunk(chunk_size, length):
    if isinstance(length, int):
        return max(1, min(int(chunk_size), length))
    return int(chunk_size)


# TensorFlow: tf.while_loop loops with tf.custom_gradient.


def _tf_attention(query, key, value, scale, masks, query_chunk_size, key_chunk_size):
    import tensorflow as tf

    input_dtype = query.dtype
    query, key, value = (tf.cast(x, tf.float32) for x in (query, key, value))
    # Reading a variable here turns it into a tensor the tape can follow.
    scale = tf.cast(tf.convert_to_tensor(scale), tf.float32)
    problem = _Problem(
        ops.shape(query)[1],
        ops.shape(key)[1],
        masks,
        query_chunk_size,
        key_chunk_size,
    )

    @tf.custom_gradient
    def attend(query, key, value, scale):
        query_chunks = problem.split_queries(query * scale)
        key_chunks = problem.split_keys(key)
        value_chunks = problem.split_keys(value)
        output_chunks, logsumexp = _tf_forward(
            problem, query_chunks, key_chunks, value_chunks
        )
        output = _merge_heads_chunks(output_chunks, problem.length)

        def grad(d_output):
            d_query_chunks, d_key_chunks, d_value_chunks = _tf_backward(
                problem,
                query_chunks,
                key_chunks,
                value_chunks,
                output_chunks,
                logsumexp,
                problem.split_queries(d_output),
            )
            # Gradient w.r.t. the pre-scaled query `query * scale`.
            d_scaled_query = _merge_heads_chunks(d_query_chunks, problem.length)
            d_key = _merge_heads_chunks(d_key_chunks, problem.num_keys)
            d_value = _merge_heads_chunks(d_value_chunks, problem.num_keys)
            d_scale = tf.reduce_sum(d_scaled_query * query)
            return d_scaled_query * scale, d_key, d_value, d_scale

        return output, grad

    return tf.cast(attend(query, key, value, scale), input_dtype)


def _tf_forward(problem, query_chunks, key_chunks, value_chunks):
    import tensorflow as tf

    def one_query_chunk(i):
        query_chunk = query_chunks[i]

        def body(j, *state):
            state = _online_softmax_step(
                query_chunk,
                key_chunks[j],
                value_chunks[j],
                problem.masks(i, j),
                state,
            )
            return (j + 1,) + tuple(state)

        num_visible = problem.visible_key_chunks(i)
        initial = _initial_state(query_chunk, ops.shape(value_chunks)[-1])
        # parallel_iterations=1: blocks run one after another, so only one
        # block of scores is alive at a time.
        _, *state = tf.while_loop(
            lambda j, *_: j < num_visible,
            body,
            (tf.constant(0),) + initial,
            parallel_iterations=1,
        )
        return _finish_rows(state)

    def outer(i, output_array, logsumexp_array):
        output, logsumexp = one_query_chunk(i)
        return i + 1, output_array.write(i, output), logsumexp_array.write(i, logsumexp)

    _, output_array, logsumexp_array = tf.while_loop(
        lambda i, *_: i < problem.num_query_chunks,
        outer,
        (
            tf.constant(0),
            _tf_chunk_array(query_chunks, value_chunks.shape[-1:]),
            _tf_chunk_array(query_chunks, ()),
        ),
        parallel_iterations=1,
    )
    return output_array.stack(), logsumexp_array.stack()


def _tf_backward(
    problem,
    query_chunks,
    key_chunks,
    value_chunks,
    output_chunks,
    logsumexp,
    d_output_chunks,
):
    import tensorflow as tf

    num_key_chunks = problem.num_key_chunks

    # Outer loop over query chunks: a chunk's d_query is complete after its
    # inner loop over key chunks; d_key / d_value are summed once per query
    # chunk, so no full-size tensor is updated per block.
    def outer(i, d_key_sum, d_value_sum, d_query_array):
        query_chunk = query_chunks[i]
        d_output = d_output_chunks[i]
        row_logsumexp = logsumexp[i]
        delta = tf.reduce_sum(d_output * output_chunks[i], axis=-1)
        num_visible = problem.visible_key_chunks(i)

        def inner(j, d_query, d_key_array, d_value_array):
            def block():
                d_q, d_k, d_v = _backward_block(
                    query_chunk,
                    key_chunks[j],
                    value_chunks[j],
                    d_output,
                    row_logsumexp,
                    delta,
                    problem.masks(i, j),
                )
                return d_query + d_q, d_k, d_v

            def skip():
                zeros_key = tf.zeros_like(key_chunks[j])
                return d_query, zeros_key, tf.zeros_like(value_chunks[j])

            if problem.causal:
                # Blocks above the diagonal contribute nothing.
                d_query, d_k, d_v = tf.cond(j < num_visible, block, skip)
            else:
                d_query, d_k, d_v = block()
            return (
                j + 1,
                d_query,
                d_key_array.write(j, d_k),
                d_value_array.write(j, d_v),
            )

        _, d_query, d_key_array, d_value_array = tf.while_loop(
            lambda j, *_: j < num_key_chunks,
            inner,
            (
                tf.constant(0),
                tf.zeros_like(query_chunk),
                _tf_chunk_array(key_chunks),
                _tf_chunk_array(value_chunks),
            ),
            parallel_iterations=1,
        )
        return (
            i + 1,
            d_key_sum + d_key_array.stack(),
            d_value_sum + d_value_array.stack(),
            d_query_array.write(i, d_query),
        )

    _, d_key_chunks, d_value_chunks, d_query_array = tf.while_loop(
        lambda i, *_: i < problem.num_query_chunks,
        outer,
        (
            tf.constant(0),
            tf.zeros_like(key_chunks),
            tf.zeros_like(value_chunks),
            _tf_chunk_array(query_chunks),
        ),
        parallel_iterations=1,
    )
    return d_query_array.stack(), d_key_chunks, d_value_chunks


def _tf_chunk_array(chunks, last_dims=None):
    """An empty TensorArray with one slot per chunk of `chunks`.

    Elements have the shape of one chunk, with its last dim replaced by
    `last_dims` when given.
    """
    import tensorflow as tf

    element_shape = chunks.shape[1:]
    if last_dims is not None:
        element_shape = element_shape[:-1].concatenate(last_dims)
    # A static size keeps the stacked result's shape static, as the loop
    # carries that it is added to require.
    size = chunks.shape[0]
    if size is None:
        size = tf.shape(chunks)[0]
    return tf.TensorArray(tf.float32, size=size, element_shape=element_shape)


# JAX: jax.lax loops with jax.custom_vjp, running the same blocks.


def _jax_attention(query, key, value, scale, masks, query_chunk_size, key_chunk_size):
    import jax
    import jax.numpy as jnp

    input_dtype = query.dtype
    query, key, value = (x.astype(jnp.float32) for x in (query, key, value))
    scale = jnp.asarray(scale, jnp.float32)
    length, num_keys = query.shape[1], key.shape[1]
    if length == 0 or num_keys == 0:
        # No keys behaves like fully masked rows; lax loops cannot index
        # empty chunk arrays.
        return jnp.zeros(query.shape[:3] + value.shape[3:], input_dtype)
    causal = masks[3]

    def make_problem(mask_arrays):
        return _Problem(
            length,
            num_keys,
            tuple(mask_arrays) + (causal,),
            query_chunk_size,
            key_chunk_size,
        )

    def forward(query, key, value, scale, mask_arrays):
        problem = make_problem(mask_arrays)
        query_chunks = problem.split_queries(query * scale)
        key_chunks = problem.split_keys(key)
        value_chunks = problem.split_keys(value)

        def one_query_chunk(i):
            query_chunk = query_chunks[i]

            def body(j, state):
                return _online_softmax_step(
                    query_chunk,
                    key_chunks[j],
                    value_chunks[j],
                    problem.masks(i, j),
                    state,
                )

            state = jax.lax.fori_loop(
                0,
                problem.visible_key_chunks(i),
                body,
                _initial_state(query_chunk, ops.shape(value_chunks)[-1]),
            )
            return _finish_rows(state)

        output_chunks, logsumexp = jax.lax.map(
            one_query_chunk, jnp.arange(problem.num_query_chunks)
        )
        return _merge_heads_chunks(output_chunks, length), (
            output_chunks,
            logsumexp,
        )

    # The masks travel as an argument (not a closure) so that custom_vjp
    # never closes over traced values; they get no cotangent.
    @jax.custom_vjp
    def attend(query, key, value, scale, mask_arrays):
        return forward(query, key, value, scale, mask_arrays)[0]

    def attend_forward(query, key, value, scale, mask_arrays):
        output, saved = forward(query, key, value, scale, mask_arrays)
        return output, (query, key, value, scale, mask_arrays) + saved

    def attend_backward(residuals, d_output):
        query, key, value, scale, mask_arrays, output_chunks, logsumexp = residuals
        problem = make_problem(mask_arrays)
        query_chunks = problem.split_queries(query * scale)
        key_chunks = problem.split_keys(key)
        value_chunks = problem.split_keys(value)
        d_output_chunks = problem.split_queries(d_output)

        def outer(sums, i):
            query_chunk = query_chunks[i]
            d_output = d_output_chunks[i]
            delta = jnp.sum(d_output * output_chunks[i], axis=-1)
            num_visible = problem.visible_key_chunks(i)

            def inner(d_query, j):
                def block(d_query):
                    d_q, d_k, d_v = _backward_block(
                        query_chunk,
                        key_chunks[j],
                        value_chunks[j],
                        d_output,
                        logsumexp[i],
                        delta,
                        problem.masks(i, j),
                    )
                    return d_query + d_q, (d_k, d_v)

                def skip(d_query):
                    zeros_key = jnp.zeros_like(key_chunks[j])
                    return d_query, (zeros_key, jnp.zeros_like(value_chunks[j]))

                # Blocks above the causal diagonal contribute nothing.
                return jax.lax.cond(j < num_visible, block, skip, d_query)

            d_query, (d_keys, d_values) = jax.lax.scan(
                inner,
                jnp.zeros_like(query_chunk),
                jnp.arange(problem.num_key_chunks),
            )
            return (sums[0] + d_keys, sums[1] + d_values), d_query

        (d_key_chunks, d_value_chunks), d_query_chunks = jax.lax.scan(
            outer,
            (jnp.zeros_like(key_chunks), jnp.zeros_like(value_chunks)),
            jnp.arange(problem.num_query_chunks),
        )
        d_scaled_query = _merge_heads_chunks(d_query_chunks, length)
        d_key = _merge_heads_chunks(d_key_chunks, num_keys)
        d_value = _merge_heads_chunks(d_value_chunks, num_keys)
        d_scale = jnp.sum(d_scaled_query * query)
        return d_scaled_query * scale, d_key, d_value, d_scale, None

    attend.defvjp(attend_forward, attend_backward)
    output = attend(query, key, value, scale, masks[:3])
    return output.astype(input_dtype)
