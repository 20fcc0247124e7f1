"""Functional core of scaled dot-product attention, written with `keras.ops`.

These functions work on already-projected, per-head tensors laid out like
`keras.ops.dot_product_attention`: query `(B, T, H, d_k)`, key
`(B, S, H, d_k)`, value `(B, S, H, d_v)`. Masks are booleans broadcastable
to `(B, H, T, S)`, `True` meaning "this query may attend to this key".

Two rules hold on every path:

* the softmax runs in float32 whatever the compute dtype, so mixed precision
  never overflows the exponentials;
* a query row with no key it may attend to gets all-zero weights and a zero
  output (never NaN and never a uniform average over masked keys).

Floor 0 (core): imports keras and `keras_attention.scales` (the score
scales) only.
"""

import keras
from keras import ops

# The scales live in `scales`; their names are kept here, where callers of
# the core (and the command line's choices) have always found them.
from keras_attention.scales import SCALE_MODES  # noqa: F401
from keras_attention.scales import check_scale  # noqa: F401
from keras_attention.scales import resolve_scale

# A finite "minus infinity": exp() of it is exactly 0 in float32 and, unlike
# -inf, subtracting the row maximum from it can never produce NaN.
_MASKED_SCORE = -1e30


def _check_rank(tensor, rank, name):
    if len(tensor.shape) != rank:
        raise ValueError(
            f"`{name}` must be a rank-{rank} tensor; received shape "
            f"{tuple(tensor.shape)}."
        )


def combine_masks(*masks):
    """Logical AND of the boolean masks that are not `None` (or `None`)."""
    combined = None
    for mask in masks:
        if mask is None:
            continue
        mask = ops.cast(mask, "bool")
        combined = (mask if combined is None
                    else ops.logical_and(combined, mask))
    return combined


def causal_mask(query_length, key_length):
    """Lower-triangular `(T, S)` mask aligned top-left.

    Row i sees keys j <= i.
    """
    rows = ops.expand_dims(ops.arange(query_length, dtype="int32"), -1)
    cols = ops.expand_dims(ops.arange(key_length, dtype="int32"), 0)
    return ops.greater_equal(rows, cols)


def softmax_dtype(dtype):
    """float32, or float64 when the inputs are float64 (never narrower)."""
    if keras.backend.standardize_dtype(dtype) == "float64":
        return "float64"
    return "float32"


def _is_float16(tensor):
    return keras.backend.standardize_dtype(tensor.dtype) == "float16"


def _batched_matmul(a, b, transpose_a=False, transpose_b=False):
    """`a @ b` over the last two axes, either operand optionally transposed.

    TensorFlow's matmul reads a transposed operand in place. A separate
    transpose op is folded into the matmul by TensorFlow's graph optimizer,
    but under XLA it is a copy: in the attention backward pass, copies of
    (T, S) tensors that made a jit-compiled step up to 1.9x slower (measured
    at T = 512 and 2048). Other backends get the plain expression.
    """
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.linalg.matmul(
            a, b, transpose_a=transpose_a, transpose_b=transpose_b
        )
    if transpose_a:
        a = ops.swapaxes(a, -1, -2)
    if transpose_b:
        b = ops.swapaxes(b, -1, -2)
    return ops.matmul(a, b)


def _compiling_with_xla():
    """Whether TensorFlow is tracing a function for XLA (`jit_compile=True`).

    Reads TensorFlow's XLA control-flow context, as TensorFlow's own ops do;
    False on other backends or if that internal moves.
    """
    if keras.backend.backend() != "tensorflow":
        return False
    try:
        import tensorflow as tf
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - TensorFlow layout changed
        return False
    if tf.executing_eagerly():
        return False
    return control_flow_util.GraphOrParentsInXlaContext(
        tf.compat.v1.get_default_graph()
    )


def _scaled_heads_first(query, key, scale):
    """Query times scale and key, both `(B, H, length, d_k)`, float16
    promoted to float32.

    The scale multiplies the queries (T * d values) rather than the scores
    (T * S values), which is cheaper for any sequence longer than d; a
    tensor (learned) scale gets its gradient through this product. float16
    operands are promoted: unscaled scores at large d_k are exactly the case
    where a float16 dot product could overflow. Heads-first transposes and
    batched matmuls rather than einsum: on TensorFlow, keras.ops.einsum
    lowers these patterns to custom transposes that run about 3x slower
    under XLA (measured at d_k 1024).
    """
    if _is_float16(query) or _is_float16(key):
        query = ops.cast(query, "float32")
        key = ops.cast(key, "float32")
    query = query * ops.cast(scale, query.dtype)
    return ops.transpose(query, (0, 2, 1, 3)), ops.transpose(key, (0, 2, 1, 3))


def _left_transposed_product(a, b, via_small_transpose):
    """`aᵀ b` over the last two axes.

    With `via_small_transpose`, computed as `(bᵀ a)ᵀ`: under XLA a
    transposed operand is copied, and when `a` is a (T, S) tensor and `b` a
    (T, d) one that copy is the smaller one (about 15% faster attention
    backward at T = 512 and 2048). Without XLA the direct product is faster.
    """
    if via_small_transpose:
        return ops.swapaxes(_batched_matmul(b, a, transpose_a=True), -1, -2)
    return _batched_matmul(a, b, transpose_a=True)


def attention_scores(query, key, scale):
    """Scaled scores `q . k * scale` as float32, shape `(B, H, T, S)`."""
    query, key = ops.convert_to_tensor(query), ops.convert_to_tensor(key)
    query, key = _scaled_heads_first(query, key, scale)
    scores = _batched_matmul(query, key, transpose_b=True)
    return ops.cast(scores, softmax_dtype(query.dtype))


def weighted_values(weights, value):
    """`weights (B, H, T, S)` times `value (B, S, H, d)` -> `(B, T, H, d)`."""
    attended = ops.matmul(weights, ops.transpose(value, (0, 2, 1, 3)))
    return ops.transpose(attended, (0, 2, 1, 3))


def masked_softmax(scores, mask=None):
    """Float32 softmax over the last axis, zero weight on masked keys.

    Rows whose keys are all masked come out as all zeros.
    """
    scores = ops.cast(scores, softmax_dtype(scores.dtype))
    if mask is None:
        if scores.shape[-1] == 1:  # one key: it gets all the weight
            return ops.ones_like(scores)
        return ops.softmax(scores, axis=-1)
    mask = ops.cast(mask, "bool")
    # One select, then the backend's softmax kernel, which subtracts the row
    # maximum itself: masked keys get exp(-1e30 - max) == 0 exactly. Every
    # extra elementwise op here is a pass over (B, H, T, S), forward and back.
    weights = ops.softmax(ops.where(mask, scores, _MASKED_SCORE), axis=-1)
    # A row with no key comes out uniform; zero it. The reduction runs on the
    # mask before it is broadcast, so it is cheap for (T, S) or (B, 1, 1, S)
    # masks.
    row_has_key = ops.any(mask, axis=-1, keepdims=True)
    return ops.where(row_has_key, weights, 0.0)


def scaled_dot_product_attention(
    query,
    key,
    value,
    mask=None,
    scale=None,
    dropout_rate=0.0,
    training=False,
    seed_generator=None,
    return_weights=False,
):
    """softmax(Q Kᵀ · scale) V on projected, per-head tensors.

    Args:
        query: `(B, T, H, d_k)`.
        key: `(B, S, H, d_k)`.
        value: `(B, S, H, d_v)`.
        mask: optional boolean tensor broadcastable to `(B, H, T, S)`,
            `True` where a query may attend to a key.
        scale: `None` or `"sqrt"` (1/sqrt(d_k)), `"none"` (1.0),
            `"inverse"` (1/d_k), a positive number, or a tensor
            broadcastable to the query: a scalar (e.g. a learned scale) or
            one factor per query and head `(B, T, H, 1)` (e.g.
            `keras_attention.scales.ssmax_query_factor`).
        dropout_rate: dropout applied to the attention weights in training.
        training: whether dropout is active.
        seed_generator: a `keras.random.SeedGenerator` for the dropout.
        return_weights: also return the attention weights.

    Returns:
        The attention output `(B, T, H, d_v)` in the value's dtype, and with
        `return_weights=True` also the float32 weights `(B, H, T, S)` (before
        dropout; each row with an attendable key sums to 1).

    Example:

    >>> q = keras.random.normal((2, 5, 1, 8))
    >>> out, w = scaled_dot_product_attention(q, q, q, return_weights=True)
    >>> tuple(out.shape), tuple(w.shape)
    ((2, 5, 1, 8), (2, 1, 5, 5))
    """
    query = ops.convert_to_tensor(query)
    key = ops.convert_to_tensor(key)
    value = ops.convert_to_tensor(value)
    for tensor, name in ((query, "query"), (key, "key"), (value, "value")):
        _check_rank(tensor, 4, name)
    if not (0.0 <= dropout_rate < 1.0):
        raise ValueError(
            f"`dropout_rate` must be in [0, 1); received {dropout_rate!r}."
        )
    if not _is_tensor_like(scale):
        scale = resolve_scale(scale, query.shape[-1])
    if not return_weights and not (training and dropout_rate > 0.0):
        return attend_output(query, key, value, mask, scale)
    output, weights, _ = attend(
        query, key, value, mask, scale, dropout_rate, training, seed_generator
    )
    if return_weights:
        return output, weights
    return output


def attend(query, key, value, mask, scale, dropout_rate=0.0, training=False,
           seed_generator=None, score_offset=None, logit_soft_cap=None):
    """The explicit computation behind `scaled_dot_product_attention` and
    the layer, without argument checks; a `logit_soft_cap` c makes the
    scaled scores `c * tanh(scores / c)`, then `score_offset` (broadcast to
    the scores, cast to their dtype) is added before the softmax.

    Returns:
        `(output (B, T, H, d_v), weights (B, H, T, S), scores (B, H, T, S))`:
        weights before dropout, scores scaled (and capped), before masking
        and the offset.
    """
    scores = attention_scores(query, key, scale)
    if logit_soft_cap is not None:
        # A cap below float32's smallest normal (1.2e-38) would divide by 0
        # (NaN); the exact scores, within +-c of 0, are as uniform there.
        cap = ops.cast(max(logit_soft_cap, 1.1754944e-38), scores.dtype)
        scores = cap * ops.tanh(scores / cap)
    shifted = scores if score_offset is None else (
        scores + ops.cast(score_offset, scores.dtype))
    weights = masked_softmax(shifted, mask)
    used_weights = weights
    if training and dropout_rate > 0.0:
        used_weights = keras.random.dropout(
            weights, dropout_rate, seed=seed_generator
        )
    output = weighted_values(ops.cast(used_weights, value.dtype), value)
    return output, weights, scores


# Backends whose `keras.ops.custom_gradient` `attend_output` has been tested
# on.
_CUSTOM_GRADIENT_BACKENDS = ("tensorflow", "jax")


def attend_output(query, key, value, mask, scale):
    """The output of `attend` (no dropout), with a hand-written backward pass.

    The forward pass is the same as `attend`'s. The backward pass uses

        dS = P * (dP - rowsum(dO * O)),   dP = dO Vᵀ,

    where `rowsum(dO * O)` (a `(T, d_v)` product) equals the
    `rowsum(P * dP)` (a `(T, S)` product) that automatic differentiation of
    the softmax computes, and keeps only the weights P for the backward pass
    (not the scores). On TensorFlow without XLA that is three fewer
    elementwise passes over `(B, H, T, S)` per backward step (measured by
    scripts/bench_layer.py). Masked keys have P = 0, so they get zero
    gradient, as with the select in `masked_softmax`.

    Returns:
        The attention output `(B, T, H, d_v)` in the value's dtype.
    """
    if keras.backend.backend() not in _CUSTOM_GRADIENT_BACKENDS:
        return attend(query, key, value, mask, scale)[0]
    query, key = _scaled_heads_first(query, key, scale)
    dtype = softmax_dtype(query.dtype)
    small_transposes = _compiling_with_xla()

    @ops.custom_gradient
    def heads_first_attention(query, key, value):
        scores = _batched_matmul(query, key, transpose_b=True)
        weights = masked_softmax(ops.cast(scores, dtype), mask)
        used_weights = ops.cast(weights, value.dtype)
        output = ops.matmul(used_weights, value)

        def grad(*args, upstream=None):
            d_output = args[0] if upstream is None else upstream
            d_value = _left_transposed_product(
                used_weights, d_output, small_transposes
            )
            d_weights = ops.cast(
                _batched_matmul(d_output, value, transpose_b=True), dtype
            )
            row_dot = ops.sum(
                ops.cast(d_output, dtype) * ops.cast(output, dtype),
                axis=-1,
                keepdims=True,
            )
            d_scores = ops.cast(weights * (d_weights - row_dot), query.dtype)
            d_query = ops.matmul(d_scores, key)
            d_key = _left_transposed_product(d_scores, query, small_transposes)
            return d_query, d_key, d_value

        return output, grad

    output = heads_first_attention(
        query, key, ops.transpose(value, (0, 2, 1, 3))
    )
    return ops.transpose(output, (0, 2, 1, 3))


def _is_tensor_like(value):
    return value is not None and not isinstance(value, (str, int, float))


def attention_entropy(weights, mask=None, normalize=False):
    """Entropy of each query row of attention weights, in nats.

    Args:
        weights: attention probabilities `(..., T, S)`.
        mask: optional boolean tensor broadcastable to `weights`; only keys a
            row may attend count towards its normalisation.
        normalize: divide by `log(n)`, where n is the number of keys the row
            may attend to (1 = uniform, 0 = one-hot). Rows with at most one
            attendable key have entropy 0.

    Returns:
        Float32 tensor `(..., T)`.

    Example:

    >>> w = keras.ops.ones((1, 1, 2, 4)) / 4.0
    >>> float(attention_entropy(w, normalize=True)[0, 0, 0])
    1.0
    """
    weights = ops.convert_to_tensor(weights)
    weights = ops.cast(weights, softmax_dtype(weights.dtype))
    # 0 * log(0) is taken as 0; the clip keeps the log finite.
    plogp = ops.where(
        weights > 0.0, weights * ops.log(ops.maximum(weights, 1e-30)), 0.0
    )
    entropy = -ops.sum(plogp, axis=-1)
    if not normalize:
        return entropy
    if mask is None:
        num_keys = ops.full(ops.shape(entropy), float(weights.shape[-1]))
    else:
        mask = ops.broadcast_to(ops.cast(mask, "bool"), ops.shape(weights))
        num_keys = ops.sum(ops.cast(mask, weights.dtype), axis=-1)
    log_keys = ops.log(ops.maximum(num_keys, 1.0))
    return ops.where(
        num_keys > 1.0, entropy / ops.maximum(log_keys, 1e-30), 0.0
    )
