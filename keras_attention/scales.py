"""The score scales: the modes, the fixed ones as numbers, and the
length-aware factor of `scale="ssmax"`.

A fixed mode is one number multiplying every score. `"learned"` is one
trainable scalar; `"ssmax"` (Scalable-Softmax, Nakanishi 2025, arXiv
2501.19399) multiplies the scores of a query that may attend to n keys by
`s_h · log(n) / sqrt(d_k)`, with `s_h` trainable per head. Both trainable
weights live in the layer; the functions here compute with them.

Floor 0 (core): imports keras only (`keras_attention.ops` imports it).
"""

import math

from keras import ops

# The score scales: 1/sqrt(d_k), none (1), 1/d_k (muP's attention scale, Yang
# et al. 2022, Tensor Programs V), a trainable scalar starting at
# 1/sqrt(d_k), and the length-aware ssmax. A positive number is accepted
# wherever a mode is.
SCALE_MODES = ("sqrt", "none", "inverse", "learned", "ssmax")

# The modes whose scale is a trainable weight of the layer.
TRAINABLE_SCALE_MODES = ("learned", "ssmax")

# The key length at which an ssmax layer starts equal to the 1/sqrt(d_k)
# scale when it is built without a static key length: 64, the middle (on a
# log axis) of the lengths this project trains recall at (17 to 257 keys
# for 16 to 256 pairs).
SSMAX_REFERENCE_LENGTH = 64


def resolve_scale(scale, key_dim):
    """Returns the numeric score scale for `scale` and `key_dim`.

    Args:
        scale: `None` or `"sqrt"` for `1/sqrt(key_dim)`, `"none"` for 1.0,
            `"inverse"` for `1/key_dim`, or a positive finite number.
        key_dim: size of the query/key vectors.

    Returns:
        A Python float.

    Raises:
        ValueError: naming `scale`, for any other string (the trainable
            modes have no fixed number), a bool, a non-number, or a number
            that is not positive and finite.
    """
    if scale is None or (isinstance(scale, str) and scale == "sqrt"):
        return 1.0 / math.sqrt(key_dim)
    if isinstance(scale, str) and scale == "none":
        return 1.0
    if isinstance(scale, str) and scale == "inverse":
        return 1.0 / key_dim
    if isinstance(scale, str) and scale in TRAINABLE_SCALE_MODES:
        raise ValueError(
            f'`scale="{scale}"` is a trainable weight of '
            "ScaledDotProductAttention and has no fixed value; pass a "
            "positive number (or a tensor) here."
        )
    if isinstance(scale, (str, bool)) or not isinstance(scale, (int, float)):
        modes = ", ".join(f'"{mode}"' for mode in SCALE_MODES)
        raise ValueError(
            f"`scale` must be one of {modes} or a positive number; "
            f"received {scale!r}."
        )
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(
            f"`scale` must be a positive finite number; received {scale!r}."
        )
    return float(scale)


def check_scale(scale, key_dim):
    """Raises the `ValueError` of `resolve_scale` unless `scale` is a mode
    of `SCALE_MODES` or a positive finite number."""
    if not (isinstance(scale, str) and scale in TRAINABLE_SCALE_MODES):
        resolve_scale(scale, key_dim)


def learned_initial_scale(key_dim):
    """The initial value of `scale="learned"`: `1/sqrt(key_dim)`, the
    scale it replaces."""
    return resolve_scale("sqrt", key_dim)


def ssmax_initial_scale(key_length=None):
    """The initial `s_h` of `scale="ssmax"`: `1 / log(n0)`.

    `n0` is `key_length` (the static key length the layer is built for)
    when it is at least 2, else `SSMAX_REFERENCE_LENGTH`. A query that sees
    n0 keys (in a causal layer, the last query) then gets exactly the
    1/sqrt(d_k) scores, so an ssmax model
    starts where the scaled model starts at its training length, and
    differs at other lengths and as `s_h` learns. An s_h of order 1 would
    start saturated: at d_k 64 with unit-variance q and k,
    `keras_attention.diagnostics.length_at_init` (256 queries) measured at
    64 random keys a mean max weight of 0.590 and a normalised entropy of
    0.311 for s_h = 1, against 0.105 and 0.887 for the sqrt scale, which
    s_h = 1/log 64 reproduces there.

    Returns:
        A Python float.
    """
    if key_length is None or key_length < 2:
        key_length = SSMAX_REFERENCE_LENGTH
    return 1.0 / math.log(key_length)


def ssmax_query_factor(num_keys, head_scale, key_dim):
    """The per-query factor `s_h · log(n) / sqrt(d_k)` of `scale="ssmax"`.

    It multiplies the queries (`(B, T, H, d_k)`, as every attention path
    takes them) rather than the scores: one product over `T * d_k` values
    whatever the path, and the gradient of `s_h` comes through it. A query
    that sees one key gets factor 0 (log 1), so equal scores and all of its
    weight on that key; a query that sees none (n = 0) is counted as 1, so
    the factor stays finite and the masks give it zero weights.

    Args:
        num_keys: the number of keys each query may attend to after every
            mask, float, broadcastable to `(B, H, T)` (rank 3).
        head_scale: `s_h`, a `(H,)` tensor or variable.
        key_dim: `d_k`.

    Returns:
        A float32 tensor `(B or 1, T or 1, H, 1)`.
    """
    log_keys = ops.log(ops.maximum(ops.cast(num_keys, "float32"), 1.0))
    log_keys = ops.expand_dims(ops.transpose(log_keys, (0, 2, 1)), -1)
    head_scale = ops.reshape(ops.cast(head_scale, "float32"), (1, 1, -1, 1))
    return log_keys * head_scale / math.sqrt(key_dim)
