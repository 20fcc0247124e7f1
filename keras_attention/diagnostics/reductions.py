"""The probe's statistics, reduced where the probe runs (the device).

`reduce_passes` runs inside the compiled probe (a `jax.jit`, a
`tf.function`, torch's eager pass) on the outputs of the forward and
backward passes, with `keras.ops`. What leaves it is small: per layer and
per (example, head) a few sums (entropy, normalised entropy, max weight,
saturated rows, attendable rows, score count, mean and centred sum of
squares, largest |score|), the per-row normalised entropy for the
histogram, four gradient norms, the maps of the first `maps` examples
only, the weighted accuracy's two sums and one flag for whether every
trained weight is finite. Before, the whole recorded scores, weights, mask
and the full W_Q/W_K/W_V and dL/dscores gradients went to the host and were
reduced there in float64 numpy (in `train --task text`, about 100 MB a
call to show 4 examples).

`host_statistics` turns one layer's fetched sums into the per-head and
per-(example, head) statistics of `statistics.layer_statistics` (the numpy
functions there stay the reference the tests compare with). Sums over a
query row are float32 on the device; the sums over examples and the
combination of the score moments (Chan et al.'s pairwise update) are
float64 on the host.
"""

import keras
import numpy as np

from keras_attention.diagnostics.statistics import SATURATION_THRESHOLD
from keras_attention.ops import attention_entropy

# The per-(example, head) sums of one layer, each `(B, H)` float32.
ROW_SUMS = ("entropy", "entropy_normalized", "max_weight", "saturated")


def reduce_passes(logits, loss, records, gradients, variables, targets,
                  sample_weight, maps=None):
    """The probe's passes reduced to what the host needs.

    Args:
        logits: the model's outputs.
        loss: the scalar loss.
        records: `{layer name: {"weights", "scores", "mask"}}` as
            `record_attention` records them.
        gradients: `{layer name: [dW_Q, dW_K, dW_V, dscores]}`, `None` for
            a kernel the layer does not have.
        variables: the values of the model's trainable variables.
        targets, sample_weight: the probe's (either may be `None`).
        maps: how many examples' maps to return; `None` for all.

    Returns:
        A nested dict of tensors (`None` where there is nothing):
        `"loss"`, `"accuracy"` (`[weighted correct, weight]`, or `None`
        where the targets are not class ids of the logits),
        `"weights_finite"` and `"layers"` (by name: `_layer_sums`).
    """
    return {
        "loss": keras.ops.cast(loss, "float32"),
        "accuracy": _accuracy_sums(logits, targets, sample_weight),
        "weights_finite": _all_finite(variables),
        "layers": {name: _layer_sums(record, gradients[name], maps)
                   for name, record in records.items()},
    }


def _layer_sums(record, gradients, maps):
    ops = keras.ops
    weights = ops.cast(record["weights"], "float32")
    scores = ops.cast(record["scores"], "float32")
    mask = record.get("mask")
    allowed = (ops.ones(ops.shape(weights), "bool") if mask is None
               else ops.broadcast_to(ops.cast(mask, "bool"),
                                     ops.shape(weights)))
    valid = ops.any(allowed, axis=-1)  # rows with an attendable key
    # A NaN weight counts as 0 in the max, as `statistics.max_weight` has it.
    peak = ops.max(ops.where(allowed & (weights == weights), weights, 0.0),
                   axis=-1)
    normalized = attention_entropy(weights, mask, normalize=True)
    per_row = {
        "entropy": attention_entropy(weights, mask),
        "entropy_normalized": normalized,
        "max_weight": peak,
        "saturated": ops.cast(peak >= SATURATION_THRESHOLD, "float32"),
    }
    sums = {key: ops.sum(ops.where(valid, value, 0.0), axis=-1)
            for key, value in per_row.items()}
    sums["rows"] = ops.sum(ops.cast(valid, "float32"), axis=-1)
    # The scores' moments over the finite attendable entries, centred on
    # each (example, head)'s own mean: no cancellation at large scores.
    counted = allowed & ops.isfinite(scores)
    count = ops.sum(ops.cast(counted, "float32"), axis=(-2, -1))
    kept = ops.where(counted, scores, 0.0)
    mean = ops.sum(kept, axis=(-2, -1)) / ops.maximum(count, 1.0)
    centred = ops.where(counted, scores - mean[..., None, None], 0.0)
    sums.update(
        score_count=count, score_mean=mean,
        score_m2=ops.sum(centred * centred, axis=(-2, -1)),
        max_abs_score=ops.max(ops.abs(kept), axis=(-2, -1)),
        entropy_rows=normalized, valid_rows=valid,
        weights=weights[:maps], scores=scores[:maps],
        mask=None if mask is None else allowed[:maps],
        gradient_norms=[
            None if gradient is None
            else ops.sqrt(ops.sum(ops.square(ops.cast(gradient,
                                                      "float32"))))
            for gradient in gradients],
    )
    return sums


def _all_finite(variables):
    """One flag: whether every float value in `variables` is finite."""
    ops = keras.ops
    flags = [ops.all(ops.isfinite(value)) for value in variables
             if "float" in keras.backend.standardize_dtype(value.dtype)]
    if not flags:
        return ops.convert_to_tensor(True)
    return ops.all(ops.stack(flags))


def _accuracy_sums(logits, targets, sample_weight):
    """`[weighted correct, weight]` of the logits' argmax against integer
    class ids shaped like the logits without their last axis; `None` for
    other targets (none, one-hot, regression, several outputs), decided
    from the static shapes and dtypes."""
    ops = keras.ops
    if targets is None or keras.tree.is_nested(logits):
        return None
    target_shape, logit_shape = tuple(targets.shape), tuple(logits.shape)
    integer = keras.backend.standardize_dtype(targets.dtype).startswith(
        ("int", "uint"))
    if (not integer or len(target_shape) != len(logit_shape) - 1
            or any(a is not None and b is not None and a != b
                   for a, b in zip(target_shape, logit_shape))):
        return None
    correct = ops.cast(
        ops.argmax(logits, axis=-1) == ops.cast(targets, "int32"), "float32")
    weight = ops.ones_like(correct)
    if sample_weight is not None:
        weight = ops.cast(sample_weight, "float32")
        # Keras's per-example weights `(B,)` weigh every position.
        weight = ops.reshape(
            weight, tuple(ops.shape(weight))
            + (1,) * (len(target_shape) - len(weight.shape)))
        weight = ops.broadcast_to(weight, ops.shape(correct))
    return ops.stack([ops.sum(correct * weight), ops.sum(weight)])


def fetch_flat(outputs):
    """`outputs` (eager tensors, nested, `None` kept) as numpy arrays, in
    one copy to the host: every tensor flattened into one float32 buffer
    where it lives, copied once, then cut back into the tensors' shapes
    and dtypes. On a GPU each copy waits for the device: one per output
    tensor made a log wait about 30 times. (JAX has `jax.device_get` for
    a whole tree.) Every output here is float32 or bool: exact."""
    ops = keras.ops
    leaves = [leaf for leaf in keras.tree.flatten(outputs)
              if leaf is not None]
    if not leaves:
        return outputs
    flat = ops.convert_to_numpy(ops.concatenate(
        [ops.reshape(ops.cast(leaf, "float32"), (-1,)) for leaf in leaves]))
    arrays, start = {}, 0
    for leaf in leaves:
        shape = tuple(int(size) for size in leaf.shape)
        size = int(np.prod(shape))
        arrays[id(leaf)] = flat[start:start + size].reshape(shape).astype(
            keras.backend.standardize_dtype(leaf.dtype))
        start += size
    return keras.tree.map_structure(
        lambda leaf: None if leaf is None else arrays[id(leaf)], outputs)


def host_statistics(sums):
    """One layer's statistics from its fetched `_layer_sums` (numpy).

    Returns:
        The per-layer dict of `probe_diagnostics`: per head `(H,)`
        `"entropy"`, `"entropy_normalized"`, `"max_weight"`,
        `"saturated_fraction"` (means over the rows with an attendable
        key); `"entropy_rows"`; `"score_std"`, `"max_abs_score"`; the maps
        `"weights"`, `"scores"`, `"mask"`; and `"per_example"`, the
        dashboard's statistics of the examples mapped, `(maps, H)` each.
    """
    rows = np.asarray(sums["rows"], np.float64)
    per_head_rows = np.maximum(rows.sum(axis=0), 1.0)
    per_example_rows = np.maximum(rows, 1.0)
    stats = {
        ("saturated_fraction" if key == "saturated" else key):
            np.asarray(sums[key], np.float64).sum(axis=0) / per_head_rows
        for key in ROW_SUMS
    }
    valid = np.asarray(sums["valid_rows"], bool)
    stats["entropy_rows"] = np.asarray(sums["entropy_rows"],
                                       np.float64)[valid].ravel()
    count = np.asarray(sums["score_count"], np.float64)
    mean = np.asarray(sums["score_mean"], np.float64)
    m2 = np.asarray(sums["score_m2"], np.float64)
    total = count.sum()
    if total > 0:
        overall = float(np.sum(count * mean) / total)
        spread = m2.sum() + np.sum(count * np.square(mean - overall))
        stats["score_std"] = float(np.sqrt(max(spread, 0.0) / total))
    else:
        stats["score_std"] = 0.0
    stats["max_abs_score"] = float(np.max(sums["max_abs_score"],
                                          initial=0.0))
    stats["weights"] = np.asarray(sums["weights"], np.float32)
    stats["scores"] = np.asarray(sums["scores"], np.float32)
    stats["mask"] = (None if sums["mask"] is None
                     else np.asarray(sums["mask"], bool))
    shown = len(stats["weights"])
    stats["per_example"] = {
        "entropy_normalized": (np.asarray(sums["entropy_normalized"],
                                          np.float64)
                               / per_example_rows)[:shown],
        "max_weight": (np.asarray(sums["max_weight"], np.float64)
                       / per_example_rows)[:shown],
        "saturated_fraction": (np.asarray(sums["saturated"], np.float64)
                               / per_example_rows)[:shown],
        "score_std": np.sqrt(m2 / np.maximum(count, 1.0))[:shown],
    }
    return stats
