"""`write_diagnostics`: the probe's result as TensorBoard summaries."""

import numpy as np
import tensorflow as tf

from keras_attention.diagnostics.heatmaps import attention_heatmaps
from keras_attention.validation import check_int

# `write_diagnostics` shrinks heatmap cells (down to 1 pixel) so that images
# stay within this many pixels a side where possible; TensorBoard shows larger
# ones no better and they slow down the probe.
MAX_HEATMAP_SIDE = 512
DEFAULT_CELL_PIXELS = 8

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
        diagnostics: the dict returned by `probe_diagnostics` (or by a
            `diagnostics_probe` function).
        step: the training step to record the summaries at.
        writer: a `tf.summary` writer; when `None` the default writer is
            used (and, as with `tf.summary`, nothing is written if there is
            none).
        max_images: number of probe examples rendered per head; 0 writes no
            images.

    Raises:
        ValueError: if `diagnostics` lacks `"layers"` or `"summary"`, or
            `max_images` is not a non-negative integer.

    Example:

    ```python
    writer = tf.summary.create_file_writer("runs/probe")
    write_diagnostics(probe_diagnostics(model, x, y, w), 500, writer)
    ```
    """
    max_images = check_int(
        max_images, "max_images", minimum=0, expected="a non-negative integer"
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
            _write_heatmaps(prefix, weights, step, max_images)
    for key, value in diagnostics["summary"].items():
        tf.summary.scalar(f"attention/mean/{key}", float(value), step=step)


def _write_heatmaps(prefix, weights, step, max_images):
    """One image summary per head, of its first `max_images` examples."""
    longest = max(weights.shape[2], weights.shape[3], 1)
    cell_pixels = max(1, min(DEFAULT_CELL_PIXELS, MAX_HEATMAP_SIDE // longest))
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
