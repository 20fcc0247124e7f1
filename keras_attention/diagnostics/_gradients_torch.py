"""The probe's passes on torch: `torch.autograd.grad`, eagerly.

torch records the graph as the forward pass runs, so the gradient with
respect to each layer's recorded scores (a tensor made inside the pass) is
asked of autograd directly; no score offsets are needed. Everything is
returned detached, as numpy arrays. There is no compiled form: torch runs
eagerly (the compiled probe is this same pass). torch is imported inside
the function: this module is imported on every backend (see `probe`).
"""

import functools

import keras

from keras_attention.recording import projection_kernels


def forward_backward(model, layers, forward, tokens, targets, sample_weight):
    """`(logits, loss, records, gradients)` of one pass, as numpy arrays.

    Args and Returns: as for `_gradients_tensorflow.forward_backward`.
    """
    import torch

    logits, loss, records = forward(
        functools.partial(model, training=False),
        tokens, targets, sample_weight, None,
    )
    sources = {
        name: [
            *(None if kernel is None else kernel.value
              for kernel in projection_kernels(layers[name])),
            record["scores"],
        ]
        for name, record in records.items()
    }
    # autograd refuses a tensor that does not require a gradient (a frozen
    # kernel); like an unconnected one, it gets zeros. A kernel the layer
    # does not have (`None`) gets `None`.
    wanted = [
        source for group in sources.values() for source in group
        if source is not None and source.requires_grad
    ]
    found = (
        torch.autograd.grad(loss, wanted, allow_unused=True)
        if wanted and loss.requires_grad else []
    )
    by_id = {id(source): grad for source, grad in zip(wanted, found)}
    detach = keras.ops.convert_to_numpy
    gradients = {
        name: [
            None if source is None
            else detach(torch.zeros_like(source))
            if by_id.get(id(source)) is None
            else detach(by_id[id(source)])
            for source in group
        ]
        for name, group in sources.items()
    }
    records = {
        name: {key: None if value is None else detach(value)
               for key, value in record.items()}
        for name, record in records.items()
    }
    return detach(logits), detach(loss), records, gradients


def compiled(model, layers, forward):
    """`forward_backward` for `model`, run eagerly at every call."""
    return functools.partial(forward_backward, model, layers, forward)
