"""The probe's passes on JAX: `jax.value_and_grad` of a stateless call,
compiled with `jax.jit`.

JAX differentiates a function with respect to its inputs only, not a tensor
made inside it, so the recorded scores cannot be asked for their gradient.
The pass instead gives `record_attention` a zero score offset per layer, an
input of the differentiated function that each layer adds to its scores
before the softmax: the gradient with respect to the offset is the gradient
with respect to the scores. The other input is the list of trainable
variable values, read through `model.stateless_call`; W_Q, W_K and W_V are
picked out of its gradient by variable identity. JAX is imported inside the
functions: this module is imported on every backend (see `probe`).
"""

import functools

from keras_attention.recording import projection_kernels


def forward_backward(model, layers, forward, tokens, targets, sample_weight):
    """`(logits, loss, records, gradients, values)` of one pass, run op by
    op.

    Args and Returns: as for `_gradients_tensorflow.forward_backward`.
    """
    _build(model, tokens)
    trainable, non_trainable = _values(model)
    return _passes(
        model, layers, forward, trainable, non_trainable, tokens, targets,
        sample_weight,
    ) + (trainable,)


def compiled(model, layers, forward, reduce):
    """The passes of `model` and `reduce` of them in one `jax.jit`.

    The variable values are arguments of the jitted function, read at every
    call, so a probe follows the model's weights; it is traced again only
    for a new input shape. The records leave the passes as values (not as
    tracers kept in a closure), and only `reduce`'s small outputs leave the
    jitted function.
    """
    import jax

    run = jax.jit(functools.partial(_reduced, model, layers, forward,
                                    reduce))

    def probe(tokens, targets, sample_weight):
        _build(model, tokens)
        return run(*_values(model), tokens, targets, sample_weight)

    return probe


def _reduced(model, layers, forward, reduce, trainable, non_trainable,
             tokens, targets, sample_weight):
    passes = _passes(model, layers, forward, trainable, non_trainable,
                     tokens, targets, sample_weight)
    return reduce(*passes, trainable, targets, sample_weight)


def fetch(outputs):
    """`outputs` as numpy arrays: one `jax.device_get` for all of them."""
    import jax

    return jax.device_get(outputs)


def _build(model, tokens):
    # `stateless_call` needs the variables; a subclassed model gets them at
    # its first call (which the TensorFlow and torch passes make themselves).
    if not model.built:
        model(tokens, training=False)


def _values(model):
    return (
        [variable.value for variable in model.trainable_variables],
        [variable.value for variable in model.non_trainable_variables],
    )


def _passes(model, layers, forward, trainable, non_trainable, tokens, targets,
            sample_weight):
    """The pure function of the variable values behind both entry points."""
    import jax
    import jax.numpy as jnp

    def loss_of(trainable, score_offsets):
        def call(tokens):
            logits, _ = model.stateless_call(
                trainable, non_trainable, tokens, training=False
            )
            return logits

        logits, loss, records = forward(
            call, tokens, targets, sample_weight, score_offsets
        )
        return loss, (logits, records)

    # The offsets take the scores' shapes, found by abstract evaluation:
    # a trace, nothing computed. Eagerly that is 14 of the 106 ms of a
    # probe of the default recall model; under `jax.jit` it is part of the
    # one trace.
    shapes = jax.eval_shape(lambda values: loss_of(values, None)[1][1],
                            trainable)
    offsets = {
        name: jnp.zeros(record["scores"].shape, record["scores"].dtype)
        for name, record in shapes.items()
    }
    (loss, (logits, records)), (d_trainable, d_offsets) = jax.value_and_grad(
        loss_of, argnums=(0, 1), has_aux=True
    )(trainable, offsets)
    position = {
        id(variable): index
        for index, variable in enumerate(model.trainable_variables)
    }

    def gradient_of(kernel):
        if kernel is None:  # the layer has no such kernel
            return None
        # A frozen kernel is not differentiated; zeros, as on the other
        # backends.
        index = position.get(id(kernel))
        if index is None:
            return jnp.zeros(kernel.shape, kernel.dtype)
        return d_trainable[index]

    gradients = {
        name: [
            *(gradient_of(kernel) for kernel in projection_kernels(
                layers[name])),
            d_offsets[name],
        ]
        for name in records
    }
    return logits, loss, records, gradients
