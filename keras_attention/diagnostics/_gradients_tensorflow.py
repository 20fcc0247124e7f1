"""The probe's passes on TensorFlow: a `tf.GradientTape`, compiled with
`tf.function`.

The tape records the forward pass, so the gradient with respect to each
layer's recorded scores (a tensor made inside the pass) is asked of it
directly; no score offsets are needed. TensorFlow is imported inside the
functions: this module is imported on every backend (see `probe`).
"""

import functools


from keras_attention.diagnostics.reductions import fetch_flat
from keras_attention.recording import projection_kernels


def forward_backward(model, layers, forward, tokens, targets, sample_weight):
    """`(logits, loss, records, gradients, values)` of one pass, eagerly or
    traced.

    Args:
        model: the probed model.
        layers: its attention layers by name.
        forward: `forward(call, tokens, targets, sample_weight,
            score_offsets)` from `probe`, returning `(logits, loss,
            records)`.
        tokens: model inputs.
        targets: integer class ids.
        sample_weight: float32 weights shaped like `targets`.

    Returns:
        The logits, the loss, the records by layer name, and `gradients`
        mapping each recorded layer's name to the gradients of the loss
        with respect to its W_Q, W_K, W_V and scores (zeros where the loss
        does not depend on one, and for a kernel that is not trainable;
        `None` for a kernel the layer does not have, see
        `recording.projection_kernels`), and the values of the model's
        trainable variables.
    """
    import tensorflow as tf

    with tf.GradientTape() as tape:
        logits, loss, records = forward(
            functools.partial(model, training=False),
            tokens, targets, sample_weight, None,
        )
    sources = {
        name: [*projection_kernels(layers[name]), record["scores"]]
        for name, record in records.items()
    }
    present = {
        name: [source for source in group if source is not None]
        for name, group in sources.items()
    }
    found = tape.gradient(
        loss, present, unconnected_gradients=tf.UnconnectedGradients.ZERO
    )
    gradients = {}
    for name, group in sources.items():
        grads = iter(found[name])
        # The tape watches a frozen kernel too (Keras keeps its tf.Variable
        # trainable); zeros, as on JAX and torch, whose passes
        # differentiate only the trainable variables.
        gradients[name] = [
            None if source is None
            else _zero_if_frozen(source, next(grads))
            for source in group
        ]
    values = [variable.value for variable in model.trainable_variables]
    return logits, loss, records, gradients, values


def _zero_if_frozen(source, grad):
    import tensorflow as tf

    if not getattr(source, "trainable", True):
        return tf.zeros_like(grad)
    return grad


def compiled(model, layers, forward, reduce):
    """The passes of `model` and `reduce` of them as one `tf.function`.

    Traced on the first call and again only for a new input shape
    (`reduce_retracing` relaxes the shapes after the second). A partial of
    a module function, not a closure: TensorFlow counts traces per code
    object, and a new probe for each run of a sweep would read as
    retracing.
    """
    import tensorflow as tf

    return tf.function(
        functools.partial(_reduced, model, layers, forward, reduce),
        autograph=False,
        reduce_retracing=True,
    )


def _reduced(model, layers, forward, reduce, tokens, targets, sample_weight):
    passes = forward_backward(model, layers, forward, tokens, targets,
                              sample_weight)
    return reduce(*passes, targets, sample_weight)


# The outputs to the host in one copy.
fetch = fetch_flat
