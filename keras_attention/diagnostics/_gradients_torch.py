"""The probe's passes on torch: `torch.autograd.grad`, eagerly.

torch records the graph as the forward pass runs, so the gradient with
respect to each layer's recorded scores (a tensor made inside the pass) is
asked of autograd directly; no score offsets are needed. Everything is
returned detached, where it was computed (the GPU, when the model is on
one); `fetch` brings the reduced outputs to the host. There is no compiled
form: torch runs eagerly (the compiled probe is this same pass, with the
reduction under `torch.no_grad`). torch is imported inside the functions:
this module is imported on every backend (see `probe`).
"""

import functools

import keras

from keras_attention.diagnostics.reductions import fetch_flat
from keras_attention.recording import projection_kernels


def forward_backward(model, layers, forward, tokens, targets, sample_weight):
    """`(logits, loss, records, gradients, values)` of one pass, detached.

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
    gradients = {
        name: [
            None if source is None
            else torch.zeros_like(source).detach()
            if by_id.get(id(source)) is None
            else by_id[id(source)].detach()
            for source in group
        ]
        for name, group in sources.items()
    }
    records = {
        name: {key: None if value is None else value.detach()
               for key, value in record.items()}
        for name, record in records.items()
    }
    values = [variable.value.detach()
              for variable in model.trainable_variables]
    logits = keras.tree.map_structure(lambda output: output.detach(),
                                      logits)
    return logits, loss.detach(), records, gradients, values


def compiled(model, layers, forward, reduce):
    """The passes of `model` and `reduce` of them, run eagerly at every
    call."""
    return functools.partial(_reduced, model, layers, forward, reduce)


def _reduced(model, layers, forward, reduce, tokens, targets, sample_weight):
    import torch

    passes = forward_backward(model, layers, forward, tokens, targets,
                              sample_weight)
    with torch.no_grad():
        return reduce(*passes, targets, sample_weight)


# The outputs to the host in one copy.
fetch = fetch_flat
