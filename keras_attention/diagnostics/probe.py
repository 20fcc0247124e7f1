"""The probe: one forward and backward pass on a fixed batch, under
`record_attention`, turned into per-layer statistics and gradient norms.

Two entry points compute the same result: `probe_diagnostics` runs eagerly
once; `diagnostics_probe` compiles the passes for a model and returns a
function to call at every probe.

The forward pass and the loss are written once here, with `keras.ops`; the
backward pass is one small private module per Keras backend, chosen from
`_GRADIENTS` by `keras.backend.backend()` (as Keras chooses
`keras/src/backend/<name>/trainer.py`): `_gradients_tensorflow`
(`tf.GradientTape`, compiled with `tf.function`), `_gradients_jax`
(`jax.value_and_grad` of `model.stateless_call` over the trainable values
and zero score offsets, compiled with `jax.jit`) and `_gradients_torch`
(`torch.autograd.grad`, eager). All three are imported here, at module
level, and each imports its framework inside its functions, as
`keras_attention.memory_efficient` does with its loops: the house rules
forbid function-local imports of project modules, and a plain import (not
`importlib.import_module` on a table of names) keeps these modules in the
import graph that tests/test_house.py checks for floors and cycles.
Importing them costs nothing: TensorFlow, JAX and torch are imported only
when a pass runs on their own backend, so the probe (like
`keras_attention.recording`) imports without TensorFlow.
"""

import functools

import keras
import numpy as np

from keras_attention.diagnostics import _gradients_jax
from keras_attention.diagnostics import _gradients_tensorflow
from keras_attention.diagnostics import _gradients_torch
from keras_attention.diagnostics.statistics import SUMMARY_KEYS
from keras_attention.diagnostics.statistics import SUMMARY_MAX_KEYS
from keras_attention.diagnostics.statistics import global_norm
from keras_attention.diagnostics.statistics import layer_statistics
from keras_attention.recording import attention_layers
from keras_attention.recording import record_attention
from keras_attention.recording import supported_names

_GRADIENT_KEYS = ("grad_norm_query", "grad_norm_key", "grad_norm_value",
                  "grad_norm_scores")

# The backward pass of each Keras backend: a module with
# `forward_backward(model, layers, forward, tokens, targets, sample_weight)`
# and `compiled(model, layers, forward)`.
_GRADIENTS = {
    "tensorflow": _gradients_tensorflow,
    "jax": _gradients_jax,
    "torch": _gradients_torch,
}


def default_loss(targets, logits, sample_weight):
    """Cross-entropy from logits, averaged over the weighted positions.

    The probe's loss when no `loss_fn` is given.

    Args:
        targets: integer class ids, shaped like `logits` without its last
            axis.
        logits: float logits `(..., num_classes)`.
        sample_weight: float weights shaped like `targets`.

    Returns:
        A scalar tensor; 0 for a batch whose weights are all 0.
    """
    per_position = keras.ops.sparse_categorical_crossentropy(
        targets, logits, from_logits=True
    )
    ops = keras.ops
    weight_sum = ops.sum(sample_weight)
    # A probe batch of pure padding has no loss rather than a 0/0.
    return ops.sum(per_position * sample_weight) / ops.maximum(
        weight_sum, 1e-12
    )


def probe_diagnostics(model, tokens, targets, sample_weight, loss_fn=None):
    """Attention statistics and gradient norms on one probe batch, eagerly.

    The one-off, eager form: one forward pass (with `training=False`) and one
    backward pass under `record_attention`, run op by op, so it costs about
    one training step and traces nothing. To probe the same model again and
    again (as the training pipeline does), use the compiled
    `diagnostics_probe` instead; it returns the same dict. On JAX, op by op
    means each operation is compiled at its first use in a process: the
    first eager probe of the default recall model took 9.4 s, the first
    call of a compiled probe 2.0 s (later calls 106 and 7 ms).

    Args:
        model: a Keras model returning logits and containing attention
            layers: `ScaledDotProductAttention`, or Keras's
            `MultiHeadAttention` (and subclasses), `GroupQueryAttention`,
            `Attention`, `AdditiveAttention` (see
            `keras_attention.recording.attention_layers`).
        tokens: model inputs for the probe batch.
        targets: integer class ids, shaped like the logits without their
            last axis (any targets `loss_fn` takes when it is given), or
            `None`: no loss, and gradient norms of 0.
        sample_weight: weights shaped like `targets` (0 for padding), or
            `None` for all ones (passed as they are to a given `loss_fn`).
        loss_fn: optional `loss_fn(targets, logits, sample_weight)` returning
            a scalar tensor; defaults to `default_loss` (sparse categorical
            cross-entropy from logits averaged over the weighted positions).

    Returns:
        A dict with `"loss"` and `"accuracy"` (weighted; `None` unless the
        targets are integer class ids of the logits) floats, `"layers"`
        mapping each attention layer's name to its statistics (per-head
        arrays `"entropy"`, `"entropy_normalized"`, `"max_weight"`,
        `"saturated_fraction"` of shape `(H,)`; `"entropy_rows"`, the
        normalised entropy of every query row with an attendable key;
        floats `"score_std"`, `"max_abs_score"` (the largest
        `|q·k·scale|`), `"grad_norm_query"`, `"grad_norm_key"`,
        `"grad_norm_value"`, `"grad_norm_scores"` (the L2 norms of the
        gradients of the loss; 0 for a kernel that is not trainable, on
        every backend; `None` for a kernel the layer does not have, see
        `keras_attention.recording.projection_kernels`: Keras's
        `Attention` and `AdditiveAttention` project nothing); and
        `"weights"`, `"scores"` (scaled, before the mask) `(B, H, T, S)`
        and the boolean `"mask"` or `None`), in the model's order of
        layers, and `"summary"` with the mean of each statistic of
        `SUMMARY_KEYS` over layers and heads (the maximum for
        `SUMMARY_MAX_KEYS`), over the layers that have it (absent where
        none has).

    Raises:
        ValueError: if `model` has no attention layer, none of them was
            called, or `sample_weight` is not shaped like `targets`.

    Example:

    ```python
    diagnostics = probe_diagnostics(model, tokens, targets, weights)
    write_diagnostics(diagnostics, step=1000, writer=writer)
    ```
    """
    layers = _check_model(model)
    targets, sample_weight = _probe_targets(targets, sample_weight,
                                            loss_fn is None)
    loss_fn = default_loss if loss_fn is None else loss_fn
    passes = _backend().forward_backward(
        model, layers, _forward_pass(model, layers, loss_fn),
        tokens, targets, sample_weight,
    )
    return _diagnostics_from(layers, targets, sample_weight, *passes)


def diagnostics_probe(model, loss_fn=None):
    """A compiled probe of `model`: `probe_diagnostics` for repeated calls.

    The compiled form: it returns a function, and the forward and backward
    passes inside it run as one compiled function, traced on the first call
    (and again only for a new input shape): a `tf.function` on TensorFlow,
    a `jax.jit` on JAX; torch runs the eager passes. A training run that
    probes every few hundred steps spends several times less on each call
    than with the eager `probe_diagnostics`: on TensorFlow 125 -> 15 ms per
    call on recall (measured by scripts/bench_train.py, in training, the
    copy of the weights included). The default recall model alone (probe
    batch 16 x 17, median of 20 calls, 2-core CPU): JAX 106 -> 7 ms,
    TensorFlow 49 -> 7 ms, after a first call that traces and compiles
    (JAX 2.9 s, TensorFlow 0.6 s).

    Args:
        model: as for `probe_diagnostics`; it is probed with its current
            weights at every call.
        loss_fn: as for `probe_diagnostics`.

    Returns:
        A function `probe(tokens, targets, sample_weight)` returning what
        `probe_diagnostics(model, tokens, targets, sample_weight, loss_fn)`
        returns.

    Raises:
        ValueError: if `model` has no attention layer.

    Example:

    ```python
    probe = diagnostics_probe(model)
    write_diagnostics(probe(tokens, targets, weights), step, writer)
    ```
    """
    layers = _check_model(model)
    default = loss_fn is None
    loss_fn = default_loss if default else loss_fn
    forward_backward = _backend().compiled(
        model, layers, _forward_pass(model, layers, loss_fn)
    )

    def probe(tokens, targets, sample_weight):
        targets, sample_weight = _probe_targets(targets, sample_weight,
                                                default)
        return _diagnostics_from(
            layers,
            targets,
            sample_weight,
            *forward_backward(tokens, targets, sample_weight),
        )

    return probe


def _check_model(model):
    """Maps name -> every attention layer inside `model`."""
    layers = {layer.name: layer for layer in attention_layers(model)}
    if not layers:
        raise ValueError(
            "`model` must contain at least one attention layer "
            f"({supported_names()}); found none in {model.name!r}."
        )
    return layers


def _probe_targets(targets, sample_weight, default_loss_fn=True):
    """The targets and weights as tensors. No targets: no loss (`None`,
    `None`). A given `loss_fn` takes the weights as they come (`None`
    included: Keras's losses broadcast weights themselves); the default
    loss gets ones shaped like `targets` for `None`, and weights of exactly
    that shape."""
    ops = keras.ops
    if targets is None:
        return None, None
    targets = ops.convert_to_tensor(targets)
    if not default_loss_fn:
        return targets, (None if sample_weight is None
                         else ops.convert_to_tensor(sample_weight))
    if sample_weight is None:
        sample_weight = ops.ones(ops.shape(targets), dtype="float32")
    sample_weight = ops.cast(ops.convert_to_tensor(sample_weight), "float32")
    if sample_weight.shape != targets.shape:
        raise ValueError(
            f"`sample_weight` must have the shape of `targets` "
            f"{tuple(targets.shape)}; received {tuple(sample_weight.shape)}."
        )
    return targets, sample_weight


def _backend():
    backend = keras.backend.backend()
    if backend not in _GRADIENTS:
        raise ValueError(
            f"The diagnostics probe supports the "
            f"{', '.join(repr(name) for name in _GRADIENTS)} backends. "
            f"Received: backend={backend!r}"
        )
    return _GRADIENTS[backend]


def _forward_pass(model, layers, loss_fn):
    """`forward(call, tokens, targets, sample_weight, score_offsets)`, the
    forward pass the backend modules differentiate (`_forward`)."""
    return functools.partial(_forward, model, layers, loss_fn)


def _forward(model, layers, loss_fn, call, tokens, targets, sample_weight,
             score_offsets):
    """The logits (float32), the loss and the attention records (by layer
    name) of `call(tokens)`: the model's call, or on JAX its stateless call
    with the values being differentiated."""
    with record_attention(model, score_offsets) as records:
        logits = call(tokens)
    logits = keras.tree.map_structure(
        lambda output: keras.ops.cast(output, "float32"), logits)
    # Without targets there is no loss: 0, as the sum of an empty slice of
    # the outputs, so that every backend's backward pass takes it (a
    # `tf.GradientTape` refuses a constant) and gives zeros.
    loss = (keras.ops.sum(keras.tree.flatten(logits)[0][..., :0])
            if targets is None
            else loss_fn(targets, logits, sample_weight))
    records = {name: records[name] for name in records if name in layers}
    if not records:
        raise ValueError(
            f"No attention was recorded while calling `model` "
            f"{model.name!r}; its attention layers were not called."
        )
    return logits, loss, records


def _diagnostics_from(layers, targets, sample_weight, logits, loss, records,
                      gradients):
    to_numpy = keras.ops.convert_to_numpy
    accuracy = _accuracy(logits, targets, sample_weight)

    layer_stats = {}
    # In the model's order: `jax.jit` hands dicts back with sorted keys
    # ("attention_10" before "attention_2").
    for name in (name for name in layers if name in records):
        grad_query, grad_key, grad_value, grad_scores = gradients[name]
        stats = layer_statistics(records[name])
        # Kept for the Attention dashboard's summary, which needs the
        # scores too (no second forward pass for it).
        stats["scores"] = np.asarray(to_numpy(records[name]["scores"]),
                                     np.float32)
        mask = records[name].get("mask")
        stats["mask"] = None if mask is None else np.asarray(to_numpy(mask))
        # `None` for a kernel the layer does not have (Attention).
        for key, grad in zip(_GRADIENT_KEYS, (grad_query, grad_key,
                                              grad_value, grad_scores)):
            stats[key] = None if grad is None else global_norm(grad)
        layer_stats[name] = stats

    summary = {}
    for key in SUMMARY_KEYS:
        # Over the layers that have the statistic (a model of Keras
        # `Attention` layers has no kernel gradients: no key).
        values = [np.mean(s[key]) for s in layer_stats.values()
                  if s[key] is not None]
        if values:
            reduce = np.max if key in SUMMARY_MAX_KEYS else np.mean
            summary[key] = float(reduce(values))
    return {
        "loss": float(to_numpy(loss)),
        "accuracy": accuracy,
        "layers": layer_stats,
        "summary": summary,
    }


def _accuracy(logits, targets, sample_weight):
    """The weighted accuracy of the logits' argmax against integer class
    ids of their shape without the last axis; `None` where the targets are
    not such ids (no targets, one-hot or regression targets, several
    outputs)."""
    if targets is None or keras.tree.is_nested(logits):
        return None
    to_numpy = keras.ops.convert_to_numpy
    logits, targets = to_numpy(logits), np.asarray(to_numpy(targets))
    if (targets.shape != logits.shape[:-1]
            or not np.issubdtype(targets.dtype, np.integer)):
        return None
    weight = np.ones(targets.shape)
    if sample_weight is not None:
        weight = np.asarray(to_numpy(sample_weight), np.float64)
        # Keras's per-example weights `(B,)` weigh every position of `(B, T)`.
        weight = np.broadcast_to(
            weight.reshape(weight.shape
                           + (1,) * (targets.ndim - weight.ndim)),
            targets.shape)
    correct = np.argmax(logits, axis=-1) == targets
    return float(np.sum(correct * weight)) / max(float(np.sum(weight)), 1e-12)
