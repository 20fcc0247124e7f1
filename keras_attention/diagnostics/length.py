"""Attention against the number of keys n at initialisation, for a score
scale, beside the closed-form theory for i.i.d. Gaussian scores.

The setting is one query among n keys, as in associative recall. The query
`q` has i.i.d. N(0, 1) components. In the *recall row*, one key, *the
relevant key*, points the query's way, `k* = sqrt(d_k) · q / |q|` (the
typical norm of a random key), and the other n - 1 keys have i.i.d. N(0, 1)
components; in the *random row*, all n keys are random (no key is aligned
with the query, as for most queries at initialisation). With a score scale
c (the number multiplying `q·k`), a random key's score is N(0, σ²) with
σ = c |q| ≈ c sqrt(d_k), and the relevant key's is s* = c sqrt(d_k) |q|
≈ c d_k. Under the 1/sqrt(d_k) scale σ = 1 and s* ≈ sqrt(d_k) at every n,
so the relevant key's weight fades as n grows; ssmax's c grows like log n.

Theory, for large n (`iid_theory`). The simple forms, for small σ: the
sum of e^s over N random keys is close to its mean N e^{σ²/2}, so

* relevant weight  w* ≈ e^{s*} / (e^{s*} + (n - 1) e^{σ²/2});
* normalised entropy of the random row ≈ 1 - σ²/(2 log n); of the recall
  row [h(w*) + (1 - w*) H] / log n, with H the random keys' entropy in
  nats (log(n - 1) - σ²/2) and h the binary entropy;
* max weight ≈ e^{σ m} / (e^{σ m} + (N - 1) e^{σ²/2}) for the largest of
  N random keys, m the expected maximum of N standard normals (Blom's
  Φ⁻¹((N - 3/8)/(N + 1/4)), about sqrt(2 log N)), or w* where that is
  larger.

They break down at large σ: past σ ≈ m (about sqrt(2 log n), the random
energy model's transition) the sum is carried by its few largest terms,
the mean N e^{σ²/2} overstates it by orders of magnitude, and
1 - σ²/(2 log n) goes negative (-10.5 for no scale at d_k 64, n = 16).
The theory computed here keeps the largest key apart (e^{σ m}) and sums
the other N - 1 as draws below it, (N - 1) e^{σ²/2} Φ(m - σ)/Φ(m), which
is the simple sum for small σ; the entropy is the log of the sum minus
the mean score under the weights. `holds` marks σ < m, where the simple forms
hold: at every n from 16 for σ = 1 (the sqrt scale), at no n up to 4096
for σ = 8 (no scale at d_k 64). Measured at d_k 64 (256 queries, n from
16 to 4096), the computed theory is within 0.03 of the measured means
where `holds`, and within 0.05 past it (σ up to 8.3); it takes
|q| = sqrt(d_k), and the spread of |q| (0.7) lowers the measured mean
relevant weight by up to 0.02.

The measurement runs the library's own scales (`keras_attention.scales`)
and softmax (`keras_attention.ops`); the draws come from numpy, so they are
the same on every backend.

Floor 2 (diagnostics): imports the core only.
"""

import math
import statistics

import numpy as np
from keras import ops

from keras_attention import scales
from keras_attention.ops import attention_entropy
from keras_attention.ops import attention_scores
from keras_attention.ops import masked_softmax
from keras_attention.validation import check_int
from keras_attention.validation import is_positive_real

# n from 16 to 4096 keys, powers of 2.
DEFAULT_LENGTHS = tuple(2**power for power in range(4, 13))

# The measured statistics: of the recall row, then of the random row.
STATISTICS = ("entropy_normalized", "relevant_weight", "max_weight",
              "iid_entropy_normalized", "iid_max_weight")

# The epsilon of the layer's query and key normalization (`qk_norm`).
QK_NORM_EPSILON = 1e-6

# At most this many key components drawn at once (64 MiB of float32).
_CHUNK_ELEMENTS = 2**24


def length_at_init(scale="sqrt", key_dim=64, lengths=DEFAULT_LENGTHS,
                   num_trials=256, seed=0, reference_length=None,
                   head_scale=None, qk_norm=False):
    """Entropy, relevant-key weight and max weight against the keys n.

    Args:
        scale: a mode of `keras_attention.scales.SCALE_MODES` or a positive
            number; `"learned"` and `"ssmax"` at their initial values.
        key_dim: `d_k`.
        lengths: the numbers of keys n, increasing, each at least 2.
        num_trials: independent queries (each with its own keys) per n.
        seed: seed of the draws. The keys at n are the first n of those at
            the largest n, so the curves are smooth in n.
        reference_length: for `"ssmax"`, the key length the layer is built
            for, which sets `s_h = 1/log(reference_length)`; by default the
            layer's fallback, `scales.SSMAX_REFERENCE_LENGTH`.
        head_scale: for `"ssmax"`, `s_h` itself (e.g. a trained value),
            instead of `reference_length`.
        qk_norm: layer-normalize the query and every key first (zero mean,
            unit variance over d_k, as the layer's `qk_norm` does at init:
            gain 1, bias 0, epsilon `QK_NORM_EPSILON`), so that every
            |q| = |k| = sqrt(d_k) and σ = c sqrt(d_k) exactly.

    Returns:
        A dict of plain values: `"scale"`, `"key_dim"`, `"num_trials"`,
        `"head_scale"` (ssmax's s_h, else `None`); float64 arrays over n:
        `"num_keys"`, `"score_scale"` (c at each n), the means over trials
        of `STATISTICS` (the recall row's `"entropy_normalized"`,
        `"relevant_weight"`, `"max_weight"`; the random row's
        `"iid_entropy_normalized"`, `"iid_max_weight"`) and their standard
        errors (`"<name>_sem"`); and `"theory"`, `iid_theory` at each n (the
        same five names, `"score_std"` σ, `"relevant_score"` s* and the bool
        `"holds"`), and `"qk_norm"`.

    Raises:
        ValueError: naming the argument, for an unknown scale, a length
            below 2, lengths out of order, a non-positive count, or a
            `reference_length` or `head_scale` with another mode.

    Example:

    >>> curves = length_at_init("sqrt", key_dim=64, lengths=(16, 4096))
    >>> curves["relevant_weight"].round(2)
    array([0.99, 0.31])
    >>> curves["theory"]["relevant_weight"].round(2)
    array([0.99, 0.31])
    """
    key_dim = check_int(key_dim, "key_dim")
    num_trials = check_int(num_trials, "num_trials")
    scales.check_scale(scale, key_dim)
    lengths = _checked_lengths(lengths)
    head_scale = _head_scale(scale, reference_length, head_scale)
    score_scale = np.array([_score_scale(scale, key_dim, n, head_scale)
                            for n in lengths])
    sums = np.zeros((2, len(STATISTICS), len(lengths)))  # sum, of squares
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK_ELEMENTS // (lengths[-1] * key_dim))
    for start in range(0, num_trials, chunk):
        size = min(chunk, num_trials - start)
        query = rng.standard_normal((size, key_dim), dtype=np.float32)
        relevant = math.sqrt(key_dim) * query / np.linalg.norm(
            query, axis=-1, keepdims=True)
        others = rng.standard_normal((size, lengths[-1], key_dim),
                                     dtype=np.float32)
        if qk_norm:
            query, relevant, others = map(_layer_norm,
                                          (query, relevant, others))
        recall = np.concatenate([relevant[:, None], others], axis=1)
        for index, n in enumerate(lengths):
            recall_row = _row(query, recall[:, :n], score_scale[index])
            random_row = _row(query, others[:, :n], score_scale[index])
            values = (*recall_row, random_row[0], random_row[2])
            sums[0, :, index] += [np.sum(v) for v in values]
            sums[1, :, index] += [np.sum(v**2) for v in values]
    means = sums[0] / num_trials
    spread = np.sqrt(np.maximum(sums[1] / num_trials - means**2, 0.0))
    sem = spread / math.sqrt(max(num_trials - 1, 1))
    num_keys = np.asarray(lengths, np.float64)
    return {
        "scale": scale,
        "key_dim": key_dim,
        "num_trials": num_trials,
        "head_scale": head_scale,
        "qk_norm": bool(qk_norm),
        "num_keys": num_keys,
        "score_scale": score_scale,
        **{name: means[i] for i, name in enumerate(STATISTICS)},
        **{f"{name}_sem": sem[i] for i, name in enumerate(STATISTICS)},
        "theory": iid_theory(num_keys, score_scale * math.sqrt(key_dim),
                             score_scale * key_dim),
    }


def _layer_norm(x):
    """Zero mean and unit variance over the last axis (float32)."""
    mean = x.mean(axis=-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return ((x - mean) / np.sqrt(variance + QK_NORM_EPSILON)).astype(
        np.float32)


def _checked_lengths(lengths):
    lengths = [check_int(n, "lengths", minimum=2) for n in lengths]
    if not lengths or any(b <= a for a, b in zip(lengths, lengths[1:])):
        raise ValueError(
            "`lengths` must be increasing numbers of keys, each at least 2; "
            f"received {lengths!r}."
        )
    return lengths


def _head_scale(scale, reference_length, head_scale):
    """ssmax's s_h (a float), or None for the other modes."""
    if not (isinstance(scale, str) and scale == "ssmax"):
        if reference_length is not None or head_scale is not None:
            raise ValueError(
                '`reference_length` and `head_scale` apply to scale="ssmax" '
                f"only; received scale={scale!r}."
            )
        return None
    if head_scale is not None:
        if reference_length is not None or not is_positive_real(head_scale):
            raise ValueError(
                "`head_scale` must be a positive number, given without "
                f"`reference_length`; received {head_scale!r}."
            )
        return float(head_scale)
    return scales.ssmax_initial_scale(check_int(
        reference_length, "reference_length", minimum=2, allow_none=True))


def _score_scale(scale, key_dim, num_keys, head_scale):
    """c, the number multiplying q·k for a query that sees `num_keys`."""
    if head_scale is not None:
        factor = scales.ssmax_query_factor(
            np.full((1, 1, 1), float(num_keys)), [head_scale], key_dim)
        return float(ops.convert_to_numpy(factor).reshape(()))
    if isinstance(scale, str) and scale == "learned":
        return scales.learned_initial_scale(key_dim)
    return scales.resolve_scale(scale, key_dim)


def _row(query, keys, score_scale):
    """Per trial: normalised entropy, key 0's weight and the max weight,
    from the library's scores and softmax."""
    scores = attention_scores(query[:, None, None, :], keys[:, :, None, :],
                              score_scale)  # (trials, 1, 1, n)
    weights = masked_softmax(scores)
    entropy = attention_entropy(weights, normalize=True)
    weights = np.asarray(ops.convert_to_numpy(weights), np.float64)[:, 0, 0]
    return (np.asarray(ops.convert_to_numpy(entropy), np.float64).ravel(),
            weights[:, 0], weights.max(axis=-1))


def iid_theory(num_keys, score_std, relevant_score):
    """The closed-form large-n theory of the module docstring.

    Args:
        num_keys: n, a float array.
        score_std: σ of the random keys' scores, broadcastable to it.
        relevant_score: s*, the relevant key's score, broadcastable.

    Returns:
        A dict of float64 arrays: `"score_std"`, `"relevant_score"`, the
        recall row's `"entropy_normalized"`, `"relevant_weight"`,
        `"max_weight"`, the random row's `"iid_entropy_normalized"`,
        `"iid_max_weight"` (entropies clipped to [0, 1]), and the bool
        `"holds"` (see the module docstring).

    Example:

    >>> iid_theory(np.array([4096.0]), 1.0, 8.0)["relevant_weight"].round(3)
    array([0.306])
    """
    n, sigma, s_star = np.broadcast_arrays(*(
        np.asarray(x, np.float64) for x in (num_keys, score_std,
                                             relevant_score)))
    recall = _RandomKeys(n - 1.0, sigma)
    relevant = _sigmoid(s_star - recall.log_sum)
    binary = -(_xlogx(relevant) + _xlogx(1.0 - relevant))
    entropy = (binary + (1.0 - relevant) * recall.entropy) / np.log(n)
    largest = _sigmoid(sigma * recall.top - np.logaddexp(
        recall.log_rest, s_star))
    random = _RandomKeys(n, sigma)
    return {
        "score_std": sigma,
        "relevant_score": s_star,
        "entropy_normalized": np.clip(entropy, 0.0, 1.0),
        "relevant_weight": relevant,
        "max_weight": np.maximum(relevant, largest),
        "iid_entropy_normalized": np.clip(random.entropy / np.log(n), 0.0,
                                          1.0),
        "iid_max_weight": _sigmoid(sigma * random.top - random.log_rest),
        "holds": sigma < random.top,
    }


class _RandomKeys:
    """The softmax of N i.i.d. N(0, σ²) scores, in closed form.

    The largest score is σ m, m the expected maximum of N standard normals
    (Blom's approximation, `top`); the other N - 1 are draws below it, whose
    e^s have the mean e^{σ²/2} Φ(m - σ) / Φ(m), so their sum is
    `exp(log_rest)` and the row's `exp(log_sum)`. `entropy` (nats) is
    log(sum) minus the mean score under the weights: σ m for the largest,
    σ (σ - φ(m - σ)/Φ(m - σ)) (the cut tilted normal's mean) for the rest.
    """

    def __init__(self, count, sigma):
        self.top = np.array([
            statistics.NormalDist().inv_cdf((c - 0.375) / (c + 0.25))
            for c in np.ravel(count)]).reshape(np.shape(count))
        below = self.top - sigma
        log_cdf = _log_normal_cdf(below)
        self.log_rest = (np.log(np.maximum(count - 1.0, 1e-300))
                         + sigma**2 / 2 + log_cdf
                         - _log_normal_cdf(self.top))
        self.log_sum = np.logaddexp(sigma * self.top, self.log_rest)
        largest = _sigmoid(sigma * self.top - self.log_rest)
        ratio = np.exp(-below**2 / 2 - 0.5 * math.log(2 * math.pi)
                       - log_cdf)  # φ/Φ at m - σ
        mean_score = (largest * sigma * self.top
                      + (1.0 - largest) * sigma * (sigma - ratio))
        self.entropy = np.maximum(self.log_sum - mean_score, 0.0)


def _log_normal_cdf(x):
    """log Φ(x), finite far into the left tail (Mills ratio below -20)."""
    x = np.asarray(x, np.float64)
    direct = np.log(np.maximum(
        0.5 * np.vectorize(math.erfc)(-x / math.sqrt(2.0)), 1e-300))
    far = np.minimum(x, -20.0)
    tail = (-far**2 / 2 - np.log(-far) - 0.5 * math.log(2 * math.pi)
            + np.log1p(-1.0 / far**2))
    return np.where(x < -20.0, tail, direct)


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _xlogx(x):
    return np.where(x > 0.0, x * np.log(np.maximum(x, 1e-300)), 0.0)
