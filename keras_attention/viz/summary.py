"""The attention summary: what the Attention dashboard of TensorBoard shows.

For one attention layer at one step, a summary holds the weights of a few
probe examples `(examples, heads, T, S)` in a compact dtype, the query and
key labels of each example, the map cells its targets read from, and per
example and head the statistics of `keras_attention.diagnostics`
(normalised entropy, max weight, saturated fraction, score std).

It is an ordinary TensorBoard summary in the run's event files: a string
tensor of two blobs, `[meta, weights]` (UTF-8 JSON, then the raw
little-endian array), whose metadata names the plugin (`PLUGIN_NAME`) and
has the blob-sequence data class. A blob sequence rather than a numeric
tensor because TensorBoard's data provider then hands the dashboard one
step's blobs by key, instead of every step of the tag at once (a 2048 x 2048
float16 map is 8 MB a step).
"""

import json

import numpy as np

from keras_attention.diagnostics import layer_statistics
from keras_attention.diagnostics import score_std
from keras_attention.validation import check_choice
from keras_attention.validation import check_writer
# The format, kept where the dashboard reads it without Keras; its names
# stay importable from here.
from keras_attention.viz.summary_format import DTYPES
from keras_attention.viz.summary_format import FORMAT_VERSION
from keras_attention.viz.summary_format import PLUGIN_NAME  # noqa: F401
from keras_attention.viz.summary_format import decode_summary  # noqa: F401
from keras_attention.viz.summary_format import encode_weights
from keras_attention.viz.summary_format import summary_metadata
from keras_attention.viz.summary_format import summary_tag

# Per example and head, in this order; `score_std` only when the record has
# scores.
STATISTICS = (
    "entropy_normalized",
    "max_weight",
    "saturated_fraction",
    "score_std",
)


def head_statistics(record):
    """Per example and head statistics of a record, by the diagnostics'
    own functions (`layer_statistics` over the (example, head) pairs,
    `score_std` on each head's scores).

    Args:
        record: a dict with `"weights"` `(E, H, T, S)`, optional `"scores"`
            of the same shape and optional boolean `"mask"` (broadcastable),
            as `keras_attention.record_attention` records.

    Returns:
        `{name: float array (E, H)}` for the names of `STATISTICS` (without
        `"score_std"` when the record has no scores).
    """
    weights = _check_weights(record.get("weights"))
    mask = record.get("mask")
    if mask is not None:
        mask = np.broadcast_to(np.asarray(mask, bool), weights.shape)
    scores = record.get("scores")
    if scores is not None:
        scores = np.asarray(scores, np.float32)
        if scores.shape != weights.shape:
            raise ValueError(
                f"`record['scores']` must have the shape of the weights "
                f"{weights.shape}; received {scores.shape}."
            )
    examples, heads, queries, keys = weights.shape
    # One call over every (example, head) pair, laid out as the heads of one
    # example: its per-head means are the per-(example, head) statistics.
    # Measured at d_k 1024: 1.5 ms against 6 ms for a call per example.
    pairs = (1, examples * heads, queries, keys)
    stats = layer_statistics({
        "weights": weights.reshape(pairs),
        # Its layer-wide `score_std` is not used: the scores are per head.
        "scores": (weights if scores is None else scores).reshape(pairs),
        "mask": None if mask is None else mask.reshape(pairs),
    })
    result = {name: stats[name].reshape(examples, heads).astype(np.float64)
              for name in ("entropy_normalized", "max_weight",
                           "saturated_fraction")}
    if scores is not None:
        result["score_std"] = np.array([
            [score_std(scores[example, head],
                       None if mask is None else mask[example, head])
             for head in range(heads)]
            for example in range(examples)
        ], np.float64)
    return result


def attention_summary(record, query_labels, key_labels=None,
                      target_cells=None, dtype="float16", statistics=None):
    """The two blobs of an attention summary.

    Args:
        record: as for `head_statistics`: the weights `(E, H, T, S)` of the
            examples to show, optionally their scores and mask.
        query_labels: `E` lists of `T` strings (e.g.
            `task.token_labels(tokens)`), or one list of `T` for every
            example.
        key_labels: the same with `S` strings; `None` (self-attention) uses
            the query labels, which needs `T == S`.
        target_cells: optional `E` lists of `(row, column)` cells, e.g.
            `task.target_cells(tokens)`.
        dtype: `"float16"` or `"uint8"` (weights quantised to `k / 255`).
        statistics: optional `{name: (E, H) array}` of the names of
            `STATISTICS`, already computed (the probe reduces them on the
            device: `probe_diagnostics`' `"per_example"`); by default
            `head_statistics(record)`.

    Returns:
        `(meta, data)`: the JSON-able dict and the weights' bytes.
    """
    dtype = check_choice(dtype, "dtype", DTYPES)
    weights = _check_weights(record.get("weights"))
    num_examples, num_heads, num_queries, num_keys = weights.shape
    query_labels = _check_labels(query_labels, "query_labels", num_examples,
                                 num_queries)
    if key_labels is None:
        if num_queries != num_keys:
            raise ValueError(
                f"`key_labels` must be given when queries and keys differ "
                f"in length ({num_queries} != {num_keys})."
            )
        key_labels = query_labels
    key_labels = _check_labels(key_labels, "key_labels", num_examples,
                               num_keys)
    cells = _check_cells(target_cells, num_examples, num_queries, num_keys)
    stats = (head_statistics(record) if statistics is None
             else _check_statistics(statistics, weights.shape[:2]))
    meta = {
        "version": FORMAT_VERSION,
        "shape": list(weights.shape),
        "dtype": dtype,
        "query_labels": query_labels,
        "key_labels": key_labels,
        "target_cells": cells,
        "statistics": {name: values.tolist() for name, values in
                       stats.items()},
    }
    return meta, encode_weights(weights, dtype)


def write_attention_summary(layer, record, step, query_labels,
                            key_labels=None, target_cells=None,
                            dtype="float16", *, writer, statistics=None):
    """Writes the attention summary of `layer` at `step`.

    Args:
        layer: the layer's name (the dashboard's layer menu).
        record, query_labels, key_labels, target_cells, dtype,
            statistics: as for `attention_summary`.
        step: the training step.
        writer: the `keras_attention.events.SummaryWriter` to write to (the
            summary is in the file when this returns).

    Raises:
        ValueError: as `attention_summary`, or if `writer` is not a
            `SummaryWriter`.
        OSError: if the system refuses the write.

    Example:

    ```python
    with record_attention(model) as records:
        model(tokens[:4])
    write_attention_summary(
        "attention_0", records["attention_0"], step=100,
        query_labels=task.token_labels(tokens[:4]),
        target_cells=task.target_cells(tokens[:4]), writer=writer)
    ```
    """
    check_writer(writer)
    meta, data = attention_summary(record, query_labels, key_labels,
                                   target_cells, dtype, statistics)
    writer.tensor(summary_tag(layer), [json.dumps(meta).encode(), data],
                  int(step), summary_metadata(layer))


def _check_weights(weights):
    if weights is None:
        raise ValueError("`record` must hold the attention `'weights'`.")
    weights = np.asarray(weights, np.float32)
    if weights.ndim != 4 or 0 in weights.shape:
        raise ValueError(
            f"`record['weights']` must be a non-empty (examples, heads, T, S) "
            f"array; received shape {weights.shape}."
        )
    if not np.all(np.isfinite(weights)):
        raise ValueError("`record['weights']` must be finite; it holds NaN "
                         "or inf.")
    return weights


def _check_statistics(statistics, shape):
    """`{name: float64 (E, H)}` of the given statistics, in `STATISTICS`'
    order (`score_std` may be absent)."""
    checked = {}
    for name in STATISTICS:
        if name not in statistics:
            if name == "score_std":
                continue
            raise ValueError(f"`statistics` must hold {name!r}.")
        values = np.asarray(statistics[name], np.float64)
        if values.shape != tuple(shape):
            raise ValueError(
                f"`statistics[{name!r}]` must have the shape "
                f"(examples, heads) {tuple(shape)}; received "
                f"{values.shape}.")
        checked[name] = values
    return checked


def _check_labels(labels, name, num_examples, length):
    """`num_examples` lists of `length` strings."""
    array = np.asarray(labels, dtype=object)
    if array.ndim == 1:
        array = np.broadcast_to(array, (num_examples, array.shape[0]))
    if array.shape != (num_examples, length):
        raise ValueError(
            f"`{name}` must be {num_examples} lists of {length} labels (or "
            f"one list of {length}); received shape {array.shape}."
        )
    return [[str(label) for label in row] for row in array]


def _check_cells(cells, num_examples, num_queries, num_keys):
    if cells is None:
        return [[] for _ in range(num_examples)]
    if len(cells) != num_examples:
        raise ValueError(
            f"`target_cells` must hold one list of (row, column) cells per "
            f"example ({num_examples}); received {len(cells)}."
        )
    checked = []
    for example_cells in cells:
        pairs = [(int(row), int(column)) for row, column in example_cells]
        for row, column in pairs:
            if not (0 <= row < num_queries and 0 <= column < num_keys):
                raise ValueError(
                    f"`target_cells` holds the cell ({row}, {column}), "
                    f"outside the {num_queries} x {num_keys} map."
                )
        checked.append([list(pair) for pair in pairs])
    return checked
