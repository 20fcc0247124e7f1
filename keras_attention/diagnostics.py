"""Attention diagnostics for TensorBoard, computed on a fixed probe batch.

The training pipeline probes every few hundred steps, outside the training
step (`diagnostics_probe`, the compiled form of `probe_diagnostics`), and
hands the result to `write_diagnostics`. One forward and backward pass on
the probe batch gives, for every
`ScaledDotProductAttention` layer:

* how peaked the attention is: per-head mean softmax entropy (raw and
  normalised by the log of the number of attendable keys), mean maximum
  weight and the fraction of saturated rows;
* how spread the pre-softmax scores are (`score_std`), which is what the
  `1/sqrt(d_k)` scale controls;
* how much gradient reaches the projections and the scores (vanishing
  gradients through a saturated softmax show up here first);
* the weights themselves, rendered as heatmap images.

The numeric helpers take and return numpy arrays so they can be used on any
recorded attention, not only inside `probe_diagnostics`.
"""

import functools
import math

import keras
import numpy as np
import tensorflow as tf

from keras_attention.layer import ScaledDotProductAttention
from keras_attention.recording import attention_layers
from keras_attention.recording import record_attention
from keras_attention.ops import attention_entropy

# A row whose largest weight reaches this value is counted as saturated: the
# softmax is effectively an argmax and passes almost no gradient.
SATURATION_THRESHOLD = 0.99

# `write_diagnostics` shrinks heatmap cells (down to 1 pixel) so that images
# stay within this many pixels a side where possible; TensorBoard shows larger
# ones no better and they slow down the probe.
MAX_HEATMAP_SIDE = 512
DEFAULT_CELL_PIXELS = 8


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
        scores: scaled pre-softmax scores, e.g. `(B, H, T, S)`.
        mask: optional boolean array broadcastable to `scores`, `True` where
            a query may attend to a key; masked entries are ignored.

    Returns:
        A Python float; 0.0 when no entry may attend. Non-finite scores are
        left out so the statistic itself is always finite.

    Example:

    >>> score_std(np.array([[1.0, 3.0, 100.0]]), mask=[[True, True, False]])
    1.0
    """
    scores = _as_float_array(scores, "scores")
    selected = scores[_broadcast_mask(mask, scores.shape) & np.isfinite(scores)]
    if selected.size == 0:
        return 0.0
    return float(np.std(selected))


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


def _check_threshold(threshold):
    if not (0.0 < threshold <= 1.0):
        raise ValueError(
            f"`threshold` must be in (0, 1]; received {threshold!r}."
        )


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

    Example:

    >>> w = np.array([[[[1.0, 0.0], [0.5, 0.5]]]])
    >>> saturated_fraction(w)
    0.5
    """
    _check_threshold(threshold)
    weights = _as_float_array(weights, "weights")
    saturated, valid = _saturated_rows(weights, mask, threshold)
    count = int(np.sum(valid))
    if count == 0:
        return 0.0
    return float(np.sum(saturated)) / count


def _oklab_to_linear_srgb(lab):
    """OKLab (Ottosson 2020) to linear-light sRGB, both `(..., 3)`."""
    lightness, a, b = lab[..., 0], lab[..., 1], lab[..., 2]
    long_ = (lightness + 0.3963377774 * a + 0.2158037573 * b) ** 3
    medium = (lightness - 0.1055613458 * a - 0.0638541728 * b) ** 3
    short = (lightness - 0.0894841775 * a - 1.2914855480 * b) ** 3
    red = 4.0767416621 * long_ - 3.3077115913 * medium + 0.2309699292 * short
    green = -1.2684380046 * long_ + 2.6097574011 * medium - 0.3413193965 * short
    blue = -0.0041960863 * long_ - 0.7034186147 * medium + 1.7076147010 * short
    return np.stack([red, green, blue], axis=-1)


def _srgb_gamma(linear):
    linear = np.clip(linear, 0.0, 1.0)
    return np.where(
        linear <= 0.0031308,
        12.92 * linear,
        1.055 * np.power(linear, 1.0 / 2.4) - 0.055,
    )


def _build_colormap(num_colors=256):
    """A dark-purple -> blue -> teal -> green -> yellow map, `(n, 3)` uint8.

    Control points are (lightness, chroma, hue in degrees) in OKLab, with
    lightness strictly increasing. Interpolating linearly in OKLab keeps the
    steps perceptually even; colours outside the sRGB gamut are brought in by
    shrinking their chroma only, so the lightness ramp stays exact.
    """
    control_points = np.array(
        [
            [0.27, 0.11, 305.0],
            [0.42, 0.12, 270.0],
            [0.57, 0.10, 215.0],
            [0.72, 0.13, 160.0],
            [0.85, 0.17, 130.0],
            [0.95, 0.19, 105.0],
        ]
    )
    hue = np.deg2rad(control_points[:, 2])
    control_lab = np.stack(
        [
            control_points[:, 0],
            control_points[:, 1] * np.cos(hue),
            control_points[:, 1] * np.sin(hue),
        ],
        axis=-1,
    )
    positions = np.linspace(0.0, 1.0, num_colors)
    knots = np.linspace(0.0, 1.0, len(control_points))
    lab = np.stack(
        [np.interp(positions, knots, control_lab[:, i]) for i in range(3)],
        axis=-1,
    )
    def with_chroma(factor):
        return np.concatenate([lab[:, :1], lab[:, 1:] * factor[:, None]], -1)

    def in_gamut(factor):
        rgb = _oklab_to_linear_srgb(with_chroma(factor))
        return np.all((rgb >= -1e-9) & (rgb <= 1.0 + 1e-9), axis=-1)

    # Bisection for the largest in-gamut chroma factor; factor 0 (grey) is
    # always inside for lightness in [0, 1].
    low = np.zeros(num_colors)
    high = np.ones(num_colors)
    for _ in range(30):
        middle = 0.5 * (low + high)
        inside = in_gamut(middle)
        low = np.where(inside, middle, low)
        high = np.where(inside, high, middle)
    chroma_factor = np.where(in_gamut(np.ones(num_colors)), 1.0, low)
    gamut_lab = with_chroma(chroma_factor)
    srgb = _srgb_gamma(_oklab_to_linear_srgb(gamut_lab))
    return np.round(srgb * 255.0).astype(np.uint8)


_COLORMAP = _build_colormap()


def colorize(values, vmin=0.0, vmax=1.0):
    """Maps values to RGB colours of a perceptually uniform colour map.

    The map runs from dark purple (`vmin`) through blue, teal and green to
    yellow (`vmax`) with monotonically increasing lightness, so it stays
    readable in greyscale and for colour-blind readers.

    Args:
        values: array of any shape.
        vmin: value mapped to the darkest colour; smaller values are clipped.
        vmax: value mapped to the lightest colour; larger values are clipped.

    Returns:
        uint8 array of shape `values.shape + (3,)`. NaN maps like `vmin`.

    Example:

    >>> colorize(np.array([0.0, 1.0])).shape
    (2, 3)
    """
    if not (math.isfinite(vmin) and math.isfinite(vmax) and vmin < vmax):
        raise ValueError(
            f"`vmin` and `vmax` must be finite with vmin < vmax; received "
            f"vmin={vmin!r}, vmax={vmax!r}."
        )
    values = np.asarray(values, dtype=np.float64)
    unit = np.clip(np.nan_to_num((values - vmin) / (vmax - vmin)), 0.0, 1.0)
    indices = np.round(unit * (len(_COLORMAP) - 1)).astype(np.int64)
    return _COLORMAP[indices]


def attention_heatmaps(weights, num_examples=3, cell_pixels=8):
    """Renders attention weights as one RGB image per (example, head).

    Layout: image `e * H + h` shows example `e`, head `h` (example-major).
    Query positions run top to bottom and key positions left to right; each
    weight is a `cell_pixels` square coloured by `colorize` on the fixed
    range [0, 1], so images from different steps and heads are comparable.

    Args:
        weights: attention probabilities `(B, H, T, S)`.
        num_examples: number of leading examples to render (fewer if
            `B < num_examples`).
        cell_pixels: side of each cell in pixels.

    Returns:
        uint8 array `(min(B, num_examples) * H, T * cell_pixels,
        S * cell_pixels, 3)`.

    Example:

    >>> attention_heatmaps(np.full((2, 4, 3, 5), 0.2), cell_pixels=2).shape
    (8, 6, 10, 3)
    """
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim != 4:
        raise ValueError(
            f"`weights` must have shape (B, H, T, S); received shape "
            f"{weights.shape}."
        )
    if not isinstance(num_examples, (int, np.integer)) or num_examples < 1:
        raise ValueError(
            f"`num_examples` must be a positive integer; received "
            f"{num_examples!r}."
        )
    if not isinstance(cell_pixels, (int, np.integer)) or cell_pixels < 1:
        raise ValueError(
            f"`cell_pixels` must be a positive integer; received "
            f"{cell_pixels!r}."
        )
    queries, keys = weights.shape[2:]
    cells = colorize(weights[:num_examples].reshape(-1, queries, keys))
    # Colour first, enlarge after: repeating uint8 pixels is far cheaper
    # than colouring every pixel.
    return np.repeat(np.repeat(cells, cell_pixels, axis=1), cell_pixels, axis=2)


def encode_png(image_uint8):
    """Encodes an `(height, width, channels)` uint8 image as PNG bytes.

    Args:
        image_uint8: uint8 array with 1 (grey), 3 (RGB) or 4 (RGBA) channels.

    Returns:
        The PNG file contents as `bytes`.

    Example:

    >>> encode_png(np.zeros((2, 2, 3), np.uint8))[:4]
    b'\\x89PNG'
    """
    image = np.asarray(image_uint8)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] not in (
        1,
        3,
        4,
    ):
        raise ValueError(
            f"`image_uint8` must be a uint8 array (height, width, 1|3|4); "
            f"received dtype {image.dtype} and shape {image.shape}."
        )
    return tf.io.encode_png(image).numpy()


def _attention_layers(model):
    """Maps name -> every `ScaledDotProductAttention` inside `model`."""
    return {layer.name: layer for layer in attention_layers(model)}


def _default_loss(targets, logits, sample_weight):
    """Cross-entropy from logits, averaged over the weighted positions."""
    per_position = keras.ops.sparse_categorical_crossentropy(
        targets, logits, from_logits=True
    )
    weight_sum = tf.reduce_sum(sample_weight)
    # A probe batch of pure padding has no loss rather than a 0/0.
    return tf.reduce_sum(per_position * sample_weight) / tf.maximum(
        weight_sum, 1e-12
    )


def _global_norm(gradient):
    return float(np.sqrt(np.sum(np.square(np.asarray(gradient, np.float64)))))


def _head_mean(per_row, valid):
    """Per-head mean of `(B, H, T)` values over the valid rows -> `(H,)`."""
    counts = np.sum(valid, axis=(0, 2))
    totals = np.sum(np.where(valid, per_row, 0.0), axis=(0, 2))
    return totals / np.maximum(counts, 1)


def _layer_statistics(record):
    """Per-head statistics of one `record_attention` record (no gradients)."""
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
        "weights": weights,
    }


_SUMMARY_KEYS = (
    "score_std",
    "entropy",
    "entropy_normalized",
    "max_weight",
    "saturated_fraction",
    "grad_norm_query",
    "grad_norm_key",
    "grad_norm_scores",
)


def probe_diagnostics(model, tokens, targets, sample_weight, loss_fn=None):
    """Attention statistics and gradient norms on one probe batch.

    Runs one eager forward pass (with `training=False`) and one backward pass
    under `record_attention`, so it costs about one training step.

    Args:
        model: a Keras model containing `ScaledDotProductAttention` layers
            and returning logits.
        tokens: model inputs for the probe batch.
        targets: integer class ids, shaped like the logits without their
            last axis.
        sample_weight: weights shaped like `targets` (0 for padding), or
            `None` for all ones.
        loss_fn: optional `loss_fn(targets, logits, sample_weight)` returning
            a scalar tensor; defaults to sparse categorical cross-entropy from
            logits averaged over the weighted positions.

    Returns:
        A dict with `"loss"` and `"accuracy"` (weighted) floats, `"layers"`
        mapping each attention layer's name to its statistics (per-head
        arrays `"entropy"`, `"entropy_normalized"`, `"max_weight"`,
        `"saturated_fraction"` of shape `(H,)`; `"entropy_rows"`, the
        normalised entropy of every query row with an attendable key;
        floats `"score_std"`, `"grad_norm_query"`, `"grad_norm_key"`,
        `"grad_norm_value"`, `"grad_norm_scores"`; and `"weights"`
        `(B, H, T, S)`), and `"summary"` with the mean of each statistic over
        layers and heads.

    Example:

    >>> diagnostics = probe_diagnostics(model, tokens, targets, weights)
    >>> write_diagnostics(diagnostics, step=1000, writer=writer)
    """
    layers = _check_model(model)
    targets, sample_weight = _probe_targets(targets, sample_weight)
    loss_fn = _default_loss if loss_fn is None else loss_fn
    return _diagnostics_from(
        targets,
        sample_weight,
        *_forward_backward(model, layers, loss_fn, tokens, targets, sample_weight),
    )


def diagnostics_probe(model, loss_fn=None):
    """`probe_diagnostics` for repeated calls on one model, compiled once.

    The forward and backward passes run as one `tf.function`, traced on the
    first call (and again only for a new input shape). A training run that
    probes every few hundred steps spends several times less on each call
    than with the eager `probe_diagnostics` (measured by
    scripts/bench_train.py).

    Args:
        model: as for `probe_diagnostics`; it is probed with its current
            weights at every call.
        loss_fn: as for `probe_diagnostics`.

    Returns:
        A function `probe(tokens, targets, sample_weight)` returning what
        `probe_diagnostics(model, tokens, targets, sample_weight, loss_fn)`
        returns.

    Example:

    >>> probe = diagnostics_probe(model)
    >>> write_diagnostics(probe(tokens, targets, weights), step, writer)
    """
    layers = _check_model(model)
    loss_fn = _default_loss if loss_fn is None else loss_fn

    # A partial, not a closure: TensorFlow counts traces per code object, and
    # a new probe for each run of a sweep would read as retracing.
    forward_backward = tf.function(
        functools.partial(_forward_backward, model, layers, loss_fn),
        autograph=False,
        reduce_retracing=True,
    )

    def probe(tokens, targets, sample_weight):
        targets, sample_weight = _probe_targets(targets, sample_weight)
        return _diagnostics_from(
            targets,
            sample_weight,
            *forward_backward(tokens, targets, sample_weight),
        )

    return probe


def _check_model(model):
    layers = _attention_layers(model)
    if not layers:
        raise ValueError(
            "`model` must contain at least one ScaledDotProductAttention "
            f"layer; found none in {model.name!r}."
        )
    return layers


def _probe_targets(targets, sample_weight):
    targets = tf.convert_to_tensor(targets)
    if sample_weight is None:
        sample_weight = tf.ones(tf.shape(targets), dtype=tf.float32)
    sample_weight = tf.cast(tf.convert_to_tensor(sample_weight), tf.float32)
    if sample_weight.shape != targets.shape:
        raise ValueError(
            f"`sample_weight` must have the shape of `targets` "
            f"{tuple(targets.shape)}; received {tuple(sample_weight.shape)}."
        )
    return targets, sample_weight


def _forward_backward(model, layers, loss_fn, tokens, targets, sample_weight):
    """Logits, loss, the attention records and the gradients of the loss
    w.r.t. each recorded layer's W_Q, W_K, W_V and scores (in that order)."""
    with tf.GradientTape() as tape:
        with record_attention(model) as records:
            logits = model(tokens, training=False)
        logits = tf.cast(logits, tf.float32)
        loss = loss_fn(targets, logits, sample_weight)

    records = {name: records[name] for name in records if name in layers}
    if not records:
        raise ValueError(
            f"No attention was recorded while calling `model` "
            f"{model.name!r}; its attention layers were not called."
        )
    sources = []
    for name, record in records.items():
        layer = layers[name]
        sources += [
            layer.query_kernel,
            layer.key_kernel,
            layer.value_kernel,
            record["scores"],
        ]
    gradients = tape.gradient(
        loss, sources, unconnected_gradients=tf.UnconnectedGradients.ZERO
    )
    return logits, loss, records, gradients


def _diagnostics_from(targets, sample_weight, logits, loss, records, gradients):
    correct = tf.cast(
        tf.equal(
            tf.argmax(logits, axis=-1, output_type=tf.int64),
            tf.cast(targets, tf.int64),
        ),
        tf.float32,
    )
    accuracy = float(tf.reduce_sum(correct * sample_weight)) / max(
        float(tf.reduce_sum(sample_weight)), 1e-12
    )

    layer_stats = {}
    for index, name in enumerate(records):
        grad_query, grad_key, grad_value, grad_scores = gradients[
            4 * index : 4 * index + 4
        ]
        stats = _layer_statistics(records[name])
        stats["grad_norm_query"] = _global_norm(grad_query)
        stats["grad_norm_key"] = _global_norm(grad_key)
        stats["grad_norm_value"] = _global_norm(grad_value)
        stats["grad_norm_scores"] = _global_norm(grad_scores)
        layer_stats[name] = stats

    summary = {
        key: float(np.mean([np.mean(s[key]) for s in layer_stats.values()]))
        for key in _SUMMARY_KEYS
    }
    return {
        "loss": float(loss),
        "accuracy": accuracy,
        "layers": layer_stats,
        "summary": summary,
    }


_PER_HEAD_KEYS = (
    "entropy",
    "entropy_normalized",
    "max_weight",
    "saturated_fraction",
)

_GRADIENT_TAGS = {
    "grad_norm_query": "query_kernel",
    "grad_norm_key": "key_kernel",
    "grad_norm_value": "value_kernel",
    "grad_norm_scores": "scores",
}


def write_diagnostics(diagnostics, step, writer=None, max_images=3):
    """Writes the output of `probe_diagnostics` as TensorBoard summaries.

    Tags, for each attention layer `<layer>` and head `<h>`:

    * `attention/<layer>/{entropy,entropy_normalized,max_weight,
      saturated_fraction}/head<h>` and `attention/<layer>/score_std`
      (scalars);
    * `attention/<layer>/entropy_rows` (histogram of per-row normalised
      entropy);
    * `attention/<layer>/heatmap/head<h>` (images of the first `max_images`
      probe examples, see `attention_heatmaps`; cells are 8 pixels, or
      fewer so that images stay within `MAX_HEATMAP_SIDE` pixels);
    * `gradients/<layer>/{query_kernel,key_kernel,value_kernel,scores}`
      (scalars, L2 norms of the loss gradient);

    and `attention/mean/<key>` for every entry of `diagnostics["summary"]`.

    Args:
        diagnostics: the dict returned by `probe_diagnostics`.
        step: the training step to record the summaries at.
        writer: a `tf.summary` writer; when `None` the default writer is
            used (and, as with `tf.summary`, nothing is written if there is
            none).
        max_images: number of probe examples rendered per head; 0 writes no
            images.

    Example:

    >>> writer = tf.summary.create_file_writer("runs/probe")
    >>> write_diagnostics(probe_diagnostics(model, x, y, w), 500, writer)
    """
    if not isinstance(max_images, (int, np.integer)) or max_images < 0:
        raise ValueError(
            f"`max_images` must be a non-negative integer; received "
            f"{max_images!r}."
        )
    missing = {"layers", "summary"} - set(diagnostics)
    if missing:
        raise ValueError(
            f"`diagnostics` must be the dict returned by probe_diagnostics; "
            f"missing keys {sorted(missing)}."
        )
    step = int(step)
    if writer is None:
        _write_all(diagnostics, step, max_images)
    else:
        with writer.as_default():
            _write_all(diagnostics, step, max_images)
        writer.flush()


def _write_all(diagnostics, step, max_images):
    for name, stats in diagnostics["layers"].items():
        prefix = f"attention/{name}"
        for key in _PER_HEAD_KEYS:
            for head, value in enumerate(np.asarray(stats[key])):
                tf.summary.scalar(
                    f"{prefix}/{key}/head{head}", float(value), step=step
                )
        tf.summary.scalar(
            f"{prefix}/score_std", float(stats["score_std"]), step=step
        )
        tf.summary.histogram(
            f"{prefix}/entropy_rows",
            np.asarray(stats["entropy_rows"], dtype=np.float64),
            step=step,
        )
        for key, tag in _GRADIENT_TAGS.items():
            tf.summary.scalar(
                f"gradients/{name}/{tag}", float(stats[key]), step=step
            )
        if max_images > 0:
            weights = np.asarray(stats["weights"])
            longest = max(weights.shape[2], weights.shape[3], 1)
            cell_pixels = max(
                1, min(DEFAULT_CELL_PIXELS, MAX_HEATMAP_SIDE // longest)
            )
            images = attention_heatmaps(
                weights, num_examples=max_images, cell_pixels=cell_pixels
            )
            num_heads = weights.shape[1]
            # Example-major layout: regroup so each head gets its examples.
            images = images.reshape((-1, num_heads) + images.shape[1:])
            for head in range(num_heads):
                tf.summary.image(
                    f"{prefix}/heatmap/head{head}",
                    images[:, head],
                    step=step,
                    max_outputs=max_images,
                )
    for key, value in diagnostics["summary"].items():
        tf.summary.scalar(f"attention/mean/{key}", float(value), step=step)
