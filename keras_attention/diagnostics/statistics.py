"""Numpy statistics of recorded attention: spread of the scores, peakedness
and saturation of the weights, per-head means of one layer's record.

Every function takes and returns numpy arrays (or Python floats), so it can
be used on any recorded attention, not only inside the probe.

The score statistics (`score_std`, `max_abs_score`) share their arguments
and result: `scores` are the scaled pre-softmax scores, e.g. `(B, H, T, S)`;
`mask` is an optional boolean array broadcastable to `scores`, `True` where
a query may attend to a key, and masked entries are ignored. They return a
Python float, 0.0 when no entry may attend; non-finite scores are left out
so that the statistic itself is always finite.
"""

import keras
import numpy as np

from keras_attention.ops import attention_entropy

# A row whose largest weight reaches this value is counted as saturated: the
# softmax is effectively an argmax and passes almost no gradient.
SATURATION_THRESHOLD = 0.99

# The per-layer statistics that the probe averages over layers (and heads)
# into its `"summary"`, in this order.
SUMMARY_KEYS = (
    "score_std",
    "entropy",
    "entropy_normalized",
    "max_weight",
    "saturated_fraction",
    "grad_norm_query",
    "grad_norm_key",
    "grad_norm_scores",
    "max_abs_score",
)

# Summary keys taken as the maximum over layers (and heads), not the mean.
SUMMARY_MAX_KEYS = ("max_abs_score",)


def _as_float_array(values, name):
    array = np.asarray(values, dtype=np.float64)
    if array.ndim < 1:
        raise ValueError(
            f"`{name}` must be an array with keys on the last axis; received "
            f"a scalar."
        )
    return array


def _broadcast_mask(mask, shape):
    """Boolean mask broadcast to `shape`, or all-True when `mask` is None."""
    if mask is None:
        return np.ones(shape, dtype=bool)
    mask = np.asarray(mask)
    try:
        return np.broadcast_to(mask.astype(bool), shape)
    except ValueError:
        raise ValueError(
            f"`mask` must be broadcastable to {tuple(shape)}; received shape "
            f"{mask.shape}."
        ) from None


def score_std(scores, mask=None):
    """Standard deviation of pre-softmax scores over the attendable entries.

    This is the quantity the `1/sqrt(d_k)` scale is meant to keep near 1:
    unscaled dot products of unit-variance vectors have a standard deviation
    of about `sqrt(d_k)`, which saturates the softmax.

    Args:
        scores: scaled pre-softmax scores (see the module's note).
        mask: optional boolean array, `True` where a query may attend.

    Returns:
        A Python float, the standard deviation over the finite attendable
        scores (0.0 when there are none).

    Example:

    >>> score_std(np.array([[1.0, 3.0, 100.0]]), mask=[[True, True, False]])
    1.0
    """
    selected = _attendable_scores(scores, mask)
    return float(np.std(selected)) if selected.size else 0.0


def _attendable_scores(scores, mask):
    """The finite scores of the entries a query may attend to, flat."""
    scores = _as_float_array(scores, "scores")
    return scores[_broadcast_mask(mask, scores.shape) & np.isfinite(scores)]


def max_abs_score(scores, mask=None):
    """Largest attention logit `|q·k·scale|` over the attendable entries.

    The "logit growth" that Dehghani et al. (2023) and Wortsman et al.
    (2023) track: attention logits that grow without bound during training
    precede the collapse of the softmax into one-hot rows.

    Args:
        scores: scaled pre-softmax scores (see the module's note).
        mask: optional boolean array, `True` where a query may attend.

    Returns:
        A Python float, the largest `|score|` over the finite attendable
        scores (0.0 when there are none).

    Example:

    >>> scores = np.array([[1.0, -3.0, 100.0]])
    >>> max_abs_score(scores, mask=[[True, True, False]])
    3.0
    """
    selected = _attendable_scores(scores, mask)
    return float(np.max(np.abs(selected))) if selected.size else 0.0


def _valid_rows(weights_shape, mask):
    """`(..., T)` bool: query rows with at least one attendable key."""
    return np.any(_broadcast_mask(mask, weights_shape), axis=-1)


def max_weight(weights, mask=None):
    """Largest attention weight of each query row.

    Args:
        weights: attention probabilities `(B, H, T, S)`.
        mask: optional boolean array broadcastable to `weights`, `True` where
            a query may attend to a key; masked keys do not count.

    Returns:
        Float array `(B, H, T)`; rows with no attendable key give 0.

    Example:

    >>> max_weight(np.array([[[[0.5, 0.25, 0.25]]]]))
    array([[[0.5]]])
    """
    weights = _as_float_array(weights, "weights")
    allowed = _broadcast_mask(mask, weights.shape)
    masked = np.where(allowed, np.nan_to_num(weights), 0.0)
    return np.max(masked, axis=-1, initial=0.0)


def _saturated_rows(weights, mask, threshold):
    """(saturated, valid) bool arrays of shape `(..., T)`."""
    valid = _valid_rows(np.shape(weights), mask)
    return (max_weight(weights, mask) >= threshold) & valid, valid


def saturated_fraction(weights, mask=None, threshold=SATURATION_THRESHOLD):
    """Fraction of query rows whose largest weight is at least `threshold`.

    Only rows with at least one attendable key are counted.

    Args:
        weights: attention probabilities `(B, H, T, S)`.
        mask: optional boolean array broadcastable to `weights`, `True` where
            a query may attend to a key.
        threshold: a row is saturated when its maximum weight is
            `>= threshold`.

    Returns:
        A Python float in [0, 1]; 0.0 when no row has an attendable key.

    Raises:
        ValueError: if `threshold` is not in (0, 1].

    Example:

    >>> w = np.array([[[[1.0, 0.0], [0.5, 0.5]]]])
    >>> saturated_fraction(w)
    0.5
    """
    if not (0.0 < threshold <= 1.0):
        raise ValueError(
            f"`threshold` must be in (0, 1]; received {threshold!r}."
        )
    weights = _as_float_array(weights, "weights")
    saturated, valid = _saturated_rows(weights, mask, threshold)
    count = int(np.sum(valid))
    if count == 0:
        return 0.0
    return float(np.sum(saturated)) / count


def global_norm(gradient):
    """L2 norm of a whole gradient array, as a Python float."""
    return float(np.sqrt(np.sum(np.square(np.asarray(gradient, np.float64)))))


def _head_mean(per_row, valid):
    """Per-head mean of `(B, H, T)` values over the valid rows -> `(H,)`."""
    counts = np.sum(valid, axis=(0, 2))
    totals = np.sum(np.where(valid, per_row, 0.0), axis=(0, 2))
    return totals / np.maximum(counts, 1)


def layer_statistics(record):
    """Per-head statistics of one attention layer's record (no gradients).

    Args:
        record: a dict with `"weights"` `(B, H, T, S)`, `"scores"` of the
            same shape and `"mask"` (boolean, broadcastable, or `None`), as
            `keras_attention.record_attention` records for each layer.

    Returns:
        A dict with per-head arrays `(H,)` `"entropy"`,
        `"entropy_normalized"`, `"max_weight"` and `"saturated_fraction"`
        (means over the query rows that may attend somewhere),
        `"entropy_rows"` (the normalised entropy of each such row, flat),
        the floats `"score_std"` and `"max_abs_score"` (see
        `max_abs_score`) and the float32 `"weights"`.

    Example:

    >>> uniform = np.full((1, 1, 2, 4), 0.25)
    >>> record = {"weights": uniform, "scores": 0 * uniform, "mask": None}
    >>> stats = layer_statistics(record)
    >>> stats["entropy_normalized"].round(6), stats["max_weight"]
    (array([1.]), array([0.25]))
    """
    weights = np.asarray(record["weights"], dtype=np.float32)
    mask = record.get("mask")
    mask = None if mask is None else np.asarray(mask, dtype=bool)
    valid = _valid_rows(weights.shape, mask)
    entropy, normalized = (
        keras.ops.convert_to_numpy(
            attention_entropy(weights, mask, normalize=normalize)
        ).astype(np.float64)
        for normalize in (False, True)
    )
    saturated, _ = _saturated_rows(weights, mask, SATURATION_THRESHOLD)
    return {
        "entropy": _head_mean(entropy, valid),
        "entropy_normalized": _head_mean(normalized, valid),
        "entropy_rows": normalized[valid].ravel(),
        "max_weight": _head_mean(max_weight(weights, mask), valid),
        "saturated_fraction": _head_mean(saturated.astype(np.float64), valid),
        "score_std": score_std(record["scores"], mask),
        "max_abs_score": max_abs_score(record["scores"], mask),
        "weights": weights,
    }
