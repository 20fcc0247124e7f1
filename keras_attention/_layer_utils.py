"""The pieces of `ScaledDotProductAttention` that need no layer state.

Projections as plain 2-D matmuls, the input checks, the one place the
layer's masks are built (and the keys they leave each query, for the
ssmax scale), the factored scores of wide keys and the fused path's
zeroing of rows without keys.
Floor 1 (layer), beside `keras_attention.layer`: imports keras and
`keras_attention.{ops, scales}` only.
"""

import collections

import keras
from keras import ops

from keras_attention import ops as attention_ops
from keras_attention import scales

try:  # Where Keras keeps a tensor's propagated mask (all backends).
    from keras.src.backend.common.masking import get_keras_mask as keras_mask
except ImportError:  # pragma: no cover - older or newer Keras layouts

    def keras_mask(tensor):
        return getattr(tensor, "_keras_mask", None)


# ------------------------------------------------------------- projections
def flat_matmul(inputs, kernel):
    """`inputs (B, T, K)` times `kernel (K, N)` -> `(B, T, N)`, one 2-D matmul.

    Flattening B and T first matters: a rank-3 by rank-2 matmul is a
    broadcast batched matmul on TensorFlow, whose kernel gradient is B
    per-example products summed afterwards (and under XLA the forward pass
    too is B small products).
    """
    shape = ops.shape(inputs)
    flat = ops.reshape(inputs, (-1, kernel.shape[0]))
    return ops.reshape(
        ops.matmul(flat, kernel), (shape[0], shape[1], kernel.shape[1])
    )


def heads_flat(kernel):
    """A `(D, H, d)` projection kernel as the `(D, H * d)` matrix."""
    features, heads, size = kernel.shape
    return ops.reshape(kernel, (features, heads * size))


def split_heads(x, heads, size):
    """`(B, T, H * d)` -> `(B, T, H, d)`."""
    shape = ops.shape(x)
    return ops.reshape(x, (shape[0], shape[1], heads, size))


def merge_heads(x):
    """`(B, T, H, d)` -> `(B, T, H * d)`."""
    shape = ops.shape(x)
    return ops.reshape(x, (shape[0], shape[1], x.shape[2] * x.shape[3]))


def project(inputs, kernel):
    """`inputs (B, T, D)` times `kernel (D, H, d)` -> `(B, T, H, d)`.

    One plain matmul over the flattened heads: on TensorFlow,
    keras.ops.einsum lowers this pattern to custom ops that are about 3x
    slower under XLA.
    """
    _, heads, size = kernel.shape
    return split_heads(flat_matmul(inputs, heads_flat(kernel)), heads, size)


def project_together(inputs, query_kernel, key_kernel, value_kernel):
    """Self-attention's Q, K and V from one matmul with the kernels side
    by side: one pass over the inputs, and one matmul (instead of three
    plus two sums) for the inputs' gradient. Measured up to 15% faster
    for a whole layer step under XLA by scripts/bench_layer.py."""
    kernels = (query_kernel, key_kernel, value_kernel)
    kernel = ops.concatenate([heads_flat(k) for k in kernels], axis=-1)
    widths = [k.shape[1] * k.shape[2] for k in kernels]
    projected = ops.split(flat_matmul(inputs, kernel),
                          [widths[0], widths[0] + widths[1]], axis=-1)
    return tuple(
        split_heads(x, k.shape[1], k.shape[2])
        for x, k in zip(projected, kernels)
    )


def factored_query_key(query, key, query_kernel, key_kernel,
                       query_bias=None, key_bias=None):
    """Stand-ins `q'`, `k'` for Q and K with `q'_h · k'_h = q_h · k_h` for
    every head, from `M_h = W̃_Q,h W̃_K,hᵀ`: `q' = X̃_q M_h`, `k' = X̃_k`
    (`X̃` the inputs with a column of ones when there are biases, `W̃` the
    kernel with the bias as its last row).

    The scores `Q Kᵀ = X̃_q W̃_Q W̃_Kᵀ X̃_kᵀ` have rank at most the input
    width, so when `d_k` is well above the widths the product costs a
    fraction of the projections: the comparison's model (width 64, d_k
    1024, 33 tokens) trains about 4x faster a step (`factor_query_key`).

    Returns:
        `q'` `(B, T, H, D_k')` and `k'` `(B, S, H, D_k')`, `D_k'` the key
        input's width (plus one with biases), in the inputs' dtype.
    """
    heads = query_kernel.shape[1]
    if query_bias is not None:
        query = _with_ones(query)
        key = _with_ones(key)
        query_kernel = ops.concatenate([query_kernel, query_bias[None]], 0)
        key_kernel = ops.concatenate([key_kernel, key_bias[None]], 0)
    width = key.shape[-1]
    # (H, D_q', d_k) @ (H, d_k, D_k') -> (H, D_q', D_k'), then (D_q', H D_k')
    product = ops.matmul(ops.transpose(query_kernel, (1, 0, 2)),
                         ops.transpose(key_kernel, (1, 2, 0)))
    product = ops.reshape(ops.transpose(product, (1, 0, 2)),
                          (query.shape[-1], heads * width))
    factored_query = split_heads(flat_matmul(query, product), heads, width)
    shape = ops.shape(key)
    factored_key = ops.broadcast_to(ops.expand_dims(key, 2),
                                    (shape[0], shape[1], heads, width))
    return factored_query, factored_key


def _with_ones(inputs):
    """`(B, T, D)` -> `(B, T, D + 1)`, the last column ones."""
    shape = ops.shape(inputs)
    return ops.concatenate(
        [inputs, ops.ones((shape[0], shape[1], 1), inputs.dtype)], -1)


def factor_query_key(query_shape, key_shape, key_dim, use_bias):
    """Whether `factored_query_key` is the cheaper way to the scores: every
    input width (plus one with biases) at most half of `d_k`, and enough
    query rows (`B T`, when known) to pay for the `M_h` products.

    Per head and query row the projections cost `2 d_k (D_q + D_k S/T)` and
    the scores `2 d_k S` multiply-adds, against `2 D_q' D_k'` and
    `2 D_k' S` factored, plus `2 D_q' D_k' d_k` per head per call for
    `M_h`, which the `B T >= D_k'` rows amortise.
    """
    extra = 1 if use_bias else 0
    widths = (query_shape[-1] + extra, key_shape[-1] + extra)
    if None in widths or 2 * max(widths) > key_dim:
        return False
    rows = query_shape[0], query_shape[1]
    return None in rows or rows[0] * rows[1] >= widths[1]


# ------------------------------------------------------------------ checks
def check_inputs(query, value, key):
    """Raises `ValueError` unless query, value and key are rank 3 with
    matching batch sizes and key/value lengths."""
    tensors = ((query, "query"), (value, "value"), (key, "key"))
    for tensor, name in tensors:
        if len(tensor.shape) != 3:
            raise ValueError(
                f"`{name}` must be rank 3 (batch, length, features); "
                f"received shape {tuple(tensor.shape)}."
            )
    if (
        key.shape[1] is not None
        and value.shape[1] is not None
        and key.shape[1] != value.shape[1]
    ):
        raise ValueError(
            "`key` and `value` must have the same length; received "
            f"key shape {tuple(key.shape)} and value shape "
            f"{tuple(value.shape)}."
        )
    batches = {
        name: tensor.shape[0]
        for tensor, name in tensors
        if tensor.shape[0] is not None
    }
    if len(set(batches.values())) > 1:
        raise ValueError(
            "`query`, `value` and `key` must have the same batch size; "
            f"received {batches}."
        )


# ------------------------------------------------------------------- masks
class Masks(collections.namedtuple("Masks", "query key attention causal")):
    """The masks of one call, each boolean or `None`.

    `query` is `(B, T)`, `key` `(B, S)` (the value and key masks combined),
    `attention` `(B or 1, H or 1, T or 1, S or 1)`, `causal` a bool. The
    memory-efficient path takes them apart; `combined` gives the other
    paths the one mask broadcastable to `(B, H, T, S)`.
    """

    def combined(self, query_length, key_length):
        masks = []
        if self.query is not None:
            masks.append(ops.expand_dims(self.query, (1, 3)))
        if self.key is not None:
            masks.append(ops.expand_dims(self.key, (1, 2)))
        if self.attention is not None:
            masks.append(self.attention)
        if self.causal:
            causal = attention_ops.causal_mask(query_length, key_length)
            masks.append(causal[None, None, :, :])
        return attention_ops.combine_masks(*masks)

    def visible_keys(self, query_length, key_length):
        """How many keys each query may attend to after every mask.

        Returns:
            A float32 tensor broadcastable to `(B, H, T)`. It is built
            without a `(T, S)` tensor unless the attention mask is one
            already (then it is that mask's size), so the memory-efficient
            path stays linear in the sequence length.
        """
        keys = (ops.ones((1, key_length)) if self.key is None
                else ops.cast(self.key, "float32"))  # (B or 1, S)
        if self.attention is not None:
            allowed = self.attention
            if self.causal:
                causal = attention_ops.causal_mask(query_length, key_length)
                allowed = ops.logical_and(allowed, causal[None, None])
            counts = _count_allowed(ops.cast(allowed, "float32"), keys)
        elif self.causal:  # query i sees the valid keys among j <= i
            last = ops.minimum(ops.arange(query_length), key_length - 1)
            counts = ops.take(ops.cumsum(keys, axis=-1), last, axis=1)[:, None]
        else:
            counts = ops.sum(keys, axis=-1)[:, None, None]
        if self.query is not None:
            counts = counts * ops.cast(self.query, "float32")[:, None, :]
        return counts


def _count_allowed(allowed, keys):
    """`sum_s allowed[b, h, t, s] * keys[b, s]` -> `(B or 1, H', T')`, for
    `allowed` `(B or 1, H', T', S or 1)` and `keys` `(B or 1, S)`.

    As matmuls without broadcast batch dimensions: TensorFlow 2.21's CPU
    matmul returned garbage (values of 1e20 to 1e35) for a `(3, 1, 6, 4)` by
    `(1, 1, 4, 1)` product, while 2-D and equal-batch products were exact.
    """
    if allowed.shape[-1] == 1:  # one column for every key
        return allowed[..., 0] * ops.sum(keys, -1)[:, None, None]
    shape = ops.shape(allowed)
    if allowed.shape[0] == 1:
        flat = ops.reshape(allowed, (-1, shape[-1]))  # (H' T', S)
        counts = ops.matmul(flat, ops.transpose(keys))  # (H' T', B or 1)
        counts = ops.reshape(counts, (shape[1], shape[2], -1))
        return ops.transpose(counts, (2, 0, 1))
    keys = ops.broadcast_to(keys, (shape[0], shape[-1]))
    flat = ops.reshape(allowed, (shape[0], -1, shape[-1]))  # (B, H' T', S)
    counts = ops.matmul(flat, keys[:, :, None])
    return ops.reshape(counts, (shape[0], shape[1], shape[2]))


def ssmax_queries(query, key, masks, head_scale):
    """The queries `(B, T, H, d_k)` times the ssmax factor
    `s_h · log(n) / sqrt(d_k)` of each query (n: its visible keys), so that
    any path with scale 1 gives the ssmax scores."""
    counts = masks.visible_keys(ops.shape(query)[1], ops.shape(key)[1])
    factor = scales.ssmax_query_factor(counts, head_scale, query.shape[-1])
    return query * ops.cast(factor, query.dtype)


def build_masks(query, key, num_heads, query_mask, value_mask, key_mask,
                attention_mask, use_causal_mask):
    """The call's `Masks`, with the attention mask checked and expanded."""
    if attention_mask is not None:
        attention_mask = expand_attention_mask(
            attention_mask, query, key, num_heads
        )
    return Masks(
        query=attention_ops.combine_masks(query_mask),
        key=attention_ops.combine_masks(value_mask, key_mask),
        attention=attention_mask,
        causal=bool(use_causal_mask),
    )


def expand_attention_mask(attention_mask, query, key, num_heads):
    """A `(T, S)`, `(B, T, S)` or `(B, H, T, S)` mask as a rank-4 bool one."""
    attention_mask = ops.convert_to_tensor(attention_mask)
    expected = (query.shape[0], num_heads, query.shape[1], key.shape[1])
    rank = len(attention_mask.shape)
    if rank == 2:
        attention_mask = attention_mask[None, None, :, :]
    elif rank == 3:
        attention_mask = attention_mask[:, None, :, :]
    elif rank != 4:
        raise ValueError(
            "`attention_mask` must have shape (T, S), (B, T, S) or "
            f"(B, num_heads, T, S) broadcastable to {expected}; received "
            f"shape {tuple(attention_mask.shape)}."
        )
    for got, want in zip(attention_mask.shape, expected):
        if got is not None and want is not None and got not in (1, want):
            raise ValueError(
                f"`attention_mask` of shape "
                f"{tuple(attention_mask.shape)} does not broadcast to "
                f"(B, num_heads, T, S) = {expected}."
            )
    return ops.cast(attention_mask, "bool")


# -------------------------------------------------------------- fused path
def fused_attention(q, k, v, mask, scale, causal=False):
    """`keras.ops.dot_product_attention`, with the layer's zero output for
    rows that may attend to no key.

    `causal` (with `mask` `None`) is the op's own causal mode, which a GPU
    kernel runs without a `(T, S)` mask; every query then sees key 0, so
    no row is zeroed. On torch a tensor (learned) scale multiplies the
    queries and the op gets scale 1: torch's `scaled_dot_product_attention`
    takes only a Python float there, and the product carries the scale's
    gradient. The other backends take the tensor, in float32.
    """
    if isinstance(scale, float):
        pass
    elif keras.backend.backend() == "torch":
        q = q * ops.cast(scale, q.dtype)
        scale = 1.0
    else:
        scale = ops.cast(scale, attention_ops.softmax_dtype(q.dtype))
    attended = ops.dot_product_attention(q, k, v, mask=mask, scale=scale,
                                         is_causal=causal)
    if mask is None:
        return attended
    # The fused op averages over all keys when a row has none left; the
    # layer's contract is a zero output. `any` over the keys before the
    # mask is broadcast: at most (B, H, T), never a (B, H, T, S) tensor.
    row_has_key = ops.broadcast_to(
        ops.any(mask, axis=-1),
        (ops.shape(q)[0], ops.shape(q)[2], ops.shape(q)[1]))  # (B, H, T)
    row_has_key = ops.expand_dims(ops.transpose(row_has_key, (0, 2, 1)), -1)
    return ops.where(row_has_key, attended, ops.zeros_like(attended))
