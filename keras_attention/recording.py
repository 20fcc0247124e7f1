"""Finding the attention layers of a model, and recording what they compute.

`attention_layers(model)` is the one way the package finds the
`ScaledDotProductAttention` layers of a model (nested models included);
`record_attention(model)` captures their scores, weights and masks during
eager calls, for diagnostics and for the exported `attention` signature.
Floor 1 (layer): imports `keras_attention.layer` only.
"""

import contextlib

from keras_attention.layer import ScaledDotProductAttention


def attention_layers(model):
    """The `ScaledDotProductAttention` layers of `model`, in build order.

    Args:
        model: a Keras model or layer (nested models are searched too); an
            attention layer on its own is its own only attention layer.

    Returns:
        A list of layers; empty if `model` has none.

    Example:

    ```python
    model = build_sequence_model(vocab_size=10, seq_len=8, num_layers=2)
    [layer.name for layer in attention_layers(model)]
    # ['attention_0', 'attention_1']
    ```
    """
    if isinstance(model, ScaledDotProductAttention):
        return [model]
    return [
        layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if isinstance(layer, ScaledDotProductAttention)
    ]


@contextlib.contextmanager
def record_attention(model):
    """Records each attention layer's scores, weights and mask during calls.

    Inside the context every `ScaledDotProductAttention` layer of `model`
    takes the explicit path and stores, under its name, the float32 scaled
    pre-softmax `"scores"` `(B, H, T, S)`, the softmax `"weights"` and the
    boolean `"mask"` (or `None`). Meant for eager diagnostics calls: the
    recorded tensors are part of the computation, so a `tf.GradientTape`
    around the call can differentiate the loss with respect to the scores.

    Args:
        model: a Keras layer or model containing attention layers.

    Yields:
        A dict mapping layer name to its record (filled by the calls).

    Example:

    ```python
    with record_attention(model) as records:
        model(tokens)
    records["attention_0"]["weights"].shape   # (batch, heads, T, S)
    ```
    """
    layers = attention_layers(model)
    if not layers:
        raise ValueError(
            "`model` contains no ScaledDotProductAttention layer to record."
        )
    records = {}
    previous = [layer._recorder for layer in layers]
    for layer in layers:
        object.__setattr__(layer, "_recorder", records)
    try:
        yield records
    finally:
        for layer, recorder in zip(layers, previous):
            object.__setattr__(layer, "_recorder", recorder)
