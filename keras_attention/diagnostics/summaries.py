"""`write_diagnostics`: the probe's result as TensorBoard summaries."""

import numpy as np

from keras_attention.validation import check_int
from keras_attention.validation import check_writer

from keras_attention.diagnostics.drawing import LabelledHeatmaps
from keras_attention.diagnostics.drawing import axis_labels
from keras_attention.diagnostics.drawing import map_labels

# A labelled map is at most about this many pixels a side (cells shrink and
# labels thin out for long sequences); TensorBoard shows larger ones no
# better and they slow down the probe.
MAX_HEATMAP_SIDE = 512

# One renderer for the process: the probe batch is the same at every step
# (and in every run of a seed), so each example's figure is drawn once and
# later steps only blit the new weights into it.
_HEATMAPS = LabelledHeatmaps(vmax=1.0)

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


def write_diagnostics(diagnostics, step, writer, max_images=3,
                      query_labels=None, key_labels=None):
    """Writes the output of `probe_diagnostics` as TensorBoard summaries.

    Tags, for each attention layer `<layer>` and head `<h>`:

    * `attention/<layer>/{entropy,entropy_normalized,max_weight,
      saturated_fraction}/head<h>` and `attention/<layer>/score_std`
      (scalars);
    * `attention/<layer>/entropy_rows` (histogram of per-row normalised
      entropy);
    * `attention/<layer>/heatmap/head<h>` (images of the first `max_images`
      probe examples: labelled maps drawn with matplotlib, queries down the
      side, keys along the bottom, a colour bar on the fixed scale [0, 1]
      so that steps and heads compare; about `MAX_HEATMAP_SIDE` pixels a
      side at most);
    * `gradients/<layer>/{query_kernel,key_kernel,value_kernel,scores}`
      (scalars, L2 norms of the loss gradient; only those whose
      `grad_norm_*` key the layer's statistics hold);

    and `attention/mean/<key>` for every entry of `diagnostics["summary"]`.

    Args:
        diagnostics: the dict returned by `probe_diagnostics` (or by a
            `diagnostics_probe` function).
        step: the training step to record the summaries at.
        writer: the `keras_attention.events.SummaryWriter` to write to
            (each summary is written when its call returns; nothing is
            flushed).
        max_images: number of probe examples rendered per head; 0 writes no
            images.
        query_labels: the token labels of the probe examples, `(B, T)`
            nested sequences of strings (`task.token_labels(tokens)`), for
            the maps' query axis; `None` labels positions `0..T-1`.
        key_labels: the same for the key axis, `(B, S)`; by default the
            query labels (self-attention).

    Raises:
        ValueError: if `diagnostics` lacks `"layers"` or `"summary"`,
            `max_images` is not a non-negative integer, `writer` is not a
            `SummaryWriter`, or the labels do not match the weights' shape.
        OSError: if the system refuses a write (the summaries written
            before it stay in the file).

    Example:

    ```python
    with SummaryWriter("runs/probe") as writer:
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
    check_writer(writer)
    step = int(step)
    labels = (query_labels, key_labels)
    if max_images > 0:
        # Checked before anything is written, so bad labels leave no half
        # of a step behind.
        for stats in diagnostics["layers"].values():
            _check_labels(np.shape(stats["weights"]), max_images, labels)
    _write_all(writer, diagnostics, step, max_images, labels)


def _write_all(writer, diagnostics, step, max_images, labels):
    for name, stats in diagnostics["layers"].items():
        prefix = f"attention/{name}"
        for key in _PER_HEAD_KEYS:
            for head, value in enumerate(np.asarray(stats[key])):
                writer.scalar(f"{prefix}/{key}/head{head}", float(value),
                              step)
        writer.scalar(f"{prefix}/score_std", float(stats["score_std"]), step)
        writer.histogram(
            f"{prefix}/entropy_rows",
            np.asarray(stats["entropy_rows"], dtype=np.float64),
            step,
        )
        for key, tag in _GRADIENT_TAGS.items():
            # Absent where the probe had no targets; None where the layer
            # has no such kernel.
            if stats.get(key) is not None:
                writer.scalar(f"gradients/{name}/{tag}", float(stats[key]),
                              step)
        if max_images > 0:
            weights = np.asarray(stats["weights"])
            _write_heatmaps(writer, prefix, weights, step, max_images, labels)
    for key, value in diagnostics["summary"].items():
        writer.scalar(f"attention/mean/{key}", float(value), step)


def _example_labels(labels, example, length, name):
    """Labels of one example's axis, or `None` (positions)."""
    if labels is None:
        return None
    if len(labels) <= example:
        raise ValueError(
            f"`{name}` must hold the labels of every rendered example; "
            f"received {len(labels)} for {example + 1} examples."
        )
    return axis_labels(labels[example], length, name)


def _check_labels(shape, max_images, labels):
    examples, _, queries, keys = shape
    for example in range(min(examples, max_images)):
        map_labels(_example_labels(labels[0], example, queries,
                                   "query_labels"),
                   _example_labels(labels[1], example, keys, "key_labels"),
                   queries, keys)


def _write_heatmaps(writer, prefix, weights, step, max_images, labels):
    """One image summary per head, of its first `max_images` examples."""
    examples, num_heads, queries, keys = weights.shape
    examples = min(examples, max_images)
    query_labels, key_labels = labels
    if key_labels is None and queries == keys:
        key_labels = query_labels
    for head in range(num_heads):
        images = _same_size([
            _HEATMAPS.render(
                weights[example, head],
                _example_labels(query_labels, example, queries,
                                "query_labels"),
                _example_labels(key_labels, example, keys, "key_labels"),
                title=f"head {head}, example {example}",
            )
            for example in range(examples)
        ])
        writer.image(f"{prefix}/heatmap/head{head}", images, step,
                     max_outputs=max_images)


def _same_size(tiles):
    """The tiles stacked `(N, H, W, 3)`, each padded with white on the right
    and at the bottom to the largest. A tile's margin fits its longest
    label, so examples whose labels differ in length differ in size (recall
    with 128 keys: `k127:v15` beside examples whose longest is `k99:v15`),
    which `np.stack` refused mid-run."""
    height = max(tile.shape[0] for tile in tiles)
    width = max(tile.shape[1] for tile in tiles)
    return np.stack([np.pad(tile, ((0, height - tile.shape[0]),
                                   (0, width - tile.shape[1]), (0, 0)),
                            constant_values=255) for tile in tiles])
