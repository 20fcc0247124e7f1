"""The block arithmetic shared by the backends (`keras.ops` only).

A call's inputs are split into chunks of queries and keys (`Problem`); a
block's mask is sliced from the padded masks (`_ChunkMasks`); the forward
pass folds key blocks into a running `(max, sum, weighted values)`
(`online_softmax_step`, `finish_rows`) and the backward pass recomputes a
block's probabilities from the saved log-sum-exp (`backward_block`). The
backend modules only loop over these blocks.
"""

from keras import ops

_NEG_INF = float("-inf")


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


def merge_heads_chunks(x, length):
    """`(num_chunks, B, H, chunk_size, d)` -> `(B, length, H, d)`."""
    num_chunks, batch, heads, chunk_size, dim = ops.shape(x)
    x = ops.transpose(x, (1, 0, 3, 2, 4))
    x = ops.reshape(x, (batch, num_chunks * chunk_size, heads, dim))
    return x[:, :length]


def _causal_key_chunks(query_chunk_index, query_chunk, key_chunk,
                       num_key_chunks):
    """Number of leading key chunks query chunk `i` can see when causal."""
    last_row_end = (query_chunk_index + 1) * query_chunk
    return ops.minimum(num_key_chunks,
                       (last_row_end + key_chunk - 1) // key_chunk)


class _ChunkMasks:
    """Builds the combined boolean mask of one `(query, key)` block.

    Masks are padded (padded keys are hidden) and laid out so that a block
    needs only a slice, never a full-size broadcast. Calling the instance
    with chunk indices `(i, j)` returns a bool tensor broadcastable to
    `(B, H, query_chunk, key_chunk)`, or None when nothing is masked.
    """

    def __init__(self, masks, length, num_keys, query_chunk, key_chunk):
        key_mask, query_mask, attention_mask, causal = masks
        self.query_chunk = query_chunk
        self.key_chunk = key_chunk
        self.causal = causal
        num_key_chunks = _num_chunks(num_keys, key_chunk)
        keys_padded = not (
            isinstance(num_keys, int) and num_keys % key_chunk == 0
        )
        self.key_valid = None
        if key_mask is not None:
            # (B, S) -> (nk, B, 1, 1, kc); padding with False hides padded
            # keys.
            chunks = _split_chunks(ops.cast(key_mask, "bool"), key_chunk,
                                   False)
            self.key_valid = chunks[:, :, None, None, :]
        elif keys_padded:
            positions = ops.arange(num_key_chunks * key_chunk)
            valid = ops.less(positions, num_keys)
            self.key_valid = ops.reshape(valid, (-1, 1, 1, 1, key_chunk))
        self.query_valid = None
        if query_mask is not None:
            chunks = _split_chunks(ops.cast(query_mask, "bool"), query_chunk,
                                   False)
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
                pad_rows = (_num_chunks(length, query_chunk) * query_chunk
                            - length)
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
            # Full sizes, not -1: torch's `ops.slice` takes no -1 sizes.
            self.mask_leading = tuple(ops.shape(attention_mask)[:2])

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
                *self.mask_leading,
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


def _block_scores(query_chunk, key_chunk, valid, cap=None):
    """Scores of one block, `-inf` where masked, and the soft cap's
    `tanh(s / cap)` (`None` without a cap). Query is pre-scaled."""
    scores = ops.einsum("bhqd,bhkd->bhqk", query_chunk, key_chunk)
    capped = None
    if cap is not None:
        capped = ops.tanh(scores / cap)
        scores = cap * capped
    if valid is not None:
        scores = ops.where(valid, scores, _NEG_INF)
    return scores, capped


def online_softmax_step(query_chunk, key_chunk, value_chunk, valid, state,
                        cap=None):
    """Folds one key block into the running `(max, sum, weighted values)`,
    its scores soft-capped at `cap` when given."""
    running_max, running_sum, accumulator = state
    scores, _ = _block_scores(query_chunk, key_chunk, valid, cap)
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


def initial_state(query_chunk, value_dim):
    rows = ops.shape(query_chunk)[:-1]
    return (
        ops.full(rows, _NEG_INF, "float32"),
        ops.zeros(rows, "float32"),
        ops.zeros(tuple(rows) + (value_dim,), "float32"),
    )


def finish_rows(state):
    """Output and log-sum-exp of a query block; empty rows give 0 and 0."""
    running_max, running_sum, accumulator = state
    has_key = running_sum > 0
    safe_sum = ops.where(has_key, running_sum, 1.0)
    output = accumulator / safe_sum[..., None]
    logsumexp = ops.where(has_key, running_max + ops.log(safe_sum), 0.0)
    return output, logsumexp


def backward_block(
    query_chunk, key_chunk, value_chunk, d_output, logsumexp, delta, valid,
    cap=None,
):
    """Gradient contributions of one block, recomputing its probabilities
    (and, with a soft cap, the cap's derivative `1 - tanh²`).

    Returns `(d_query_chunk, d_key_chunk, d_value_chunk)`, where `d_query` is
    w.r.t. the pre-scaled query.
    """
    scores, capped = _block_scores(query_chunk, key_chunk, valid, cap)
    probs = ops.exp(scores - logsumexp[..., None])
    # einsum lets the backend fold the transposes into the matmuls.
    d_value = ops.einsum("bhqk,bhqd->bhkd", probs, d_output)
    d_probs = ops.einsum("bhqd,bhkd->bhqk", d_output, value_chunk)
    d_scores = probs * (d_probs - delta[..., None])
    if capped is not None:
        d_scores = d_scores * (1.0 - capped * capped)
    d_query = ops.einsum("bhqk,bhkd->bhqd", d_scores, key_chunk)
    d_key = ops.einsum("bhqk,bhqd->bhkd", d_scores, query_chunk)
    return d_query, d_key, d_value


class Problem:
    """Chunk geometry of one call and its block mask builder.

    `masks` is `(key_mask, query_mask, attention_mask, causal)`, as
    `memory_efficient_attention` takes them.
    """

    def __init__(self, length, num_keys, masks, query_chunk_size,
                 key_chunk_size, soft_cap=None):
        self.length = length
        self.soft_cap = soft_cap
        self.num_keys = num_keys
        # Never pad short sequences up to a large chunk.
        self.query_chunk = _clamp_chunk(query_chunk_size, length)
        self.key_chunk = _clamp_chunk(key_chunk_size, num_keys)
        self.num_query_chunks = _num_chunks(length, self.query_chunk)
        self.num_key_chunks = _num_chunks(num_keys, self.key_chunk)
        self.causal = masks[3]
        self.masks = _ChunkMasks(
            masks, length, num_keys, self.query_chunk, self.key_chunk
        )

    def split_queries(self, x):
        return _split_heads_chunks(x, self.query_chunk)

    def split_keys(self, x):
        return _split_heads_chunks(x, self.key_chunk)

    def split_inputs(self, query, key, value, scale):
        """The scaled query's chunks and the key's and value's chunks."""
        return (
            self.split_queries(query * scale),
            self.split_keys(key),
            self.split_keys(value),
        )

    def gradients(self, d_query_chunks, d_key_chunks, d_value_chunks, query,
                  scale):
        """`(d_query, d_key, d_value, d_scale)` from the blocks' sums.

        The chunks of `d_query` are w.r.t. the pre-scaled query
        `query * scale`; the chain rule gives the query's and the scale's.
        """
        d_scaled_query = merge_heads_chunks(d_query_chunks, self.length)
        d_key = merge_heads_chunks(d_key_chunks, self.num_keys)
        d_value = merge_heads_chunks(d_value_chunks, self.num_keys)
        d_scale = ops.sum(d_scaled_query * query)
        return d_scaled_query * scale, d_key, d_value, d_scale

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
