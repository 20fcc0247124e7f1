"""The probe: one forward and backward pass on a fixed batch, under
`record_attention`, turned into per-layer statistics and gradient norms.

Two entry points compute the same result: `probe_diagnostics` runs eagerly
once; `diagnostics_probe` compiles the passes for a model and returns a
function to call at every probe. Both reduce the statistics where the
passes ran (`reductions.reduce_passes`, `keras.ops`) and fetch the small
result to the host in one transfer (the backend module's `fetch`).

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
from keras_attention.diagnostics.reductions import host_statistics
from keras_attention.diagnostics.reductions import reduce_passes
from keras_attention.recording import attention_layers
from keras_attention.recording import record_attention
from keras_attention.recording import supported_names
from keras_attention.validation import check_int

_GRADIENT_KEYS = ("grad_norm_query", "grad_norm_key", "grad_norm_value",
                  "grad_norm_scores")

# The backward pass of each Keras backend: a module with
# `forward_backward(model, layers, forward, tokens, targets, sample_weight)`
# (eager), `compiled(model, layers, forward, reduce)` (the passes and
# `reduce` in one compiled function) and `fetch(outputs)` (to numpy).
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


def probe_diagnostics(model, tokens, targets, sample_weight, loss_fn=None,
                      maps=None):
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
        maps: how many examples' maps to return (the first); `None` for
            all.

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
        and the boolean `"mask"` or `None`) of the first `maps`
        examples, with `"per_example"`, their statistics of the
        dashboard's summary (`viz.summary.STATISTICS`, `(maps, H)`
        each)), in the model's order of
        layers, and `"summary"` with the mean of each statistic of
        `SUMMARY_KEYS` over layers and heads (the maximum for
        `SUMMARY_MAX_KEYS`), over the layers that have it (absent where
        none has), and `"weights_finite"`, whether every float weight the
        model trains is finite.

    Raises:
        ValueError: if `model` has no attention layer, none of them was
            called, `sample_weight` is not shaped like `targets`, or
            `maps` is not a positive integer or `None`.

    Example:

    ```python
    diagnostics = probe_diagnostics(model, tokens, targets, weights)
    write_diagnostics(diagnostics, step=1000, writer=writer)
    ```
    """
    layers = _check_model(model)
    maps = _check_maps(maps)
    targets, sample_weight = _probe_targets(targets, sample_weight,
                                            loss_fn is None)
    loss_fn = default_loss if loss_fn is None else loss_fn
    backend = _backend()
    passes = backend.forward_backward(
        model, layers, _forward_pass(model, layers, loss_fn),
        tokens, targets, sample_weight,
    )
    reduced = reduce_passes(*passes, targets, sample_weight, maps=maps)
    return _diagnostics_from(layers, backend.fetch(reduced))


def diagnostics_probe(model, loss_fn=None, maps=None):
    """A compiled probe of `model`: `probe_diagnostics` for repeated calls.

    The compiled form: it returns a `DiagnosticsProbe`, whose passes and
    statistics run as one compiled function, traced on the first call (and
    again only for a new input shape): a `tf.function` on TensorFlow, a
    `jax.jit` on JAX; torch runs the eager passes. The statistics are
    reduced inside it (`keras_attention.diagnostics.reductions`) and leave
    it in one transfer to the host; nothing goes back to the device. A
    training run that probes every few hundred steps spends several times
    less on each call than with the eager `probe_diagnostics`. The default
    recall model alone (probe batch 16 x 17, median of 20 calls, 2-core
    CPU, before the statistics moved into the compiled call): JAX 106 -> 7
    ms, TensorFlow 49 -> 7 ms, after a first call that traces and compiles
    (JAX 2.9 s, TensorFlow 0.6 s).

    Args:
        model: as for `probe_diagnostics`; it is probed with its current
            weights at every call.
        loss_fn: as for `probe_diagnostics`.
        maps: how many of the examples' maps (weights, scores, mask) the
            probe returns, the first ones; `None` for all. The statistics
            cover every example whatever `maps` is.

    Returns:
        A `DiagnosticsProbe`: `probe(tokens, targets, sample_weight)`
        returns what `probe_diagnostics(model, tokens, targets,
        sample_weight, loss_fn, maps)` returns.

    Raises:
        ValueError: if `model` has no attention layer, or `maps` is not a
            positive integer or `None`.

    Example:

    ```python
    probe = diagnostics_probe(model)
    write_diagnostics(probe(tokens, targets, weights), step, writer)
    ```
    """
    return DiagnosticsProbe(model, loss_fn, maps)


class DiagnosticsProbe:
    """The compiled probe `diagnostics_probe` returns.

    Calling it probes the model and returns the diagnostics. A caller that
    keeps the training thread free splits the call in three:
    `prepare(tokens, targets, sample_weight)` once (the examples on the
    device), `dispatch(prepared)` at each probe (the compiled call, which
    returns at once where the backend dispatches asynchronously: JAX, and
    TensorFlow or torch on a GPU), and `collect(pending)`, the one
    device-to-host transfer and the host's arithmetic on a few numbers,
    which another thread may run.
    """

    def __init__(self, model, loss_fn=None, maps=None):
        self._layers = _check_model(model)
        self.maps = _check_maps(maps)
        self._default_loss = loss_fn is None
        backend = _backend()
        self._fetch = backend.fetch
        self._run = backend.compiled(
            model, self._layers,
            _forward_pass(model, self._layers,
                          default_loss if loss_fn is None else loss_fn),
            functools.partial(reduce_passes, maps=self.maps),
        )

    def prepare(self, tokens, targets, sample_weight):
        """The examples as tensors of the backend, on its device."""
        targets, sample_weight = _probe_targets(targets, sample_weight,
                                                self._default_loss)
        tokens = keras.tree.map_structure(keras.ops.convert_to_tensor,
                                          tokens)
        return tokens, targets, sample_weight

    def dispatch(self, prepared):
        """Runs the compiled probe on `prepare`'s examples; returns its
        outputs where they are (on the device)."""
        return self._run(*prepared)

    def collect(self, pending):
        """The diagnostics dict of `dispatch`'s outputs."""
        return _diagnostics_from(self._layers, self._fetch(pending))

    def __call__(self, tokens, targets, sample_weight):
        return self.collect(self.dispatch(
            self.prepare(tokens, targets, sample_weight)))


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


def _check_maps(maps):
    return check_int(maps, "maps", allow_none=True)


def _diagnostics_from(layers, fetched):
    """The diagnostics dict of the fetched `reductions.reduce_passes`."""
    layer_stats = {}
    # In the model's order: `jax.jit` hands dicts back with sorted keys
    # ("attention_10" before "attention_2").
    for name in (name for name in layers if name in fetched["layers"]):
        sums = fetched["layers"][name]
        stats = host_statistics(sums)
        # `None` for a kernel the layer does not have (Attention).
        for key, norm in zip(_GRADIENT_KEYS, sums["gradient_norms"]):
            stats[key] = None if norm is None else float(norm)
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
    accuracy = fetched["accuracy"]
    if accuracy is not None:
        correct, weight = np.asarray(accuracy, np.float64)
        accuracy = float(correct) / max(float(weight), 1e-12)
    return {
        "loss": float(fetched["loss"]),
        "accuracy": accuracy,
        "layers": layer_stats,
        "summary": summary,
        "weights_finite": bool(fetched["weights_finite"]),
    }
