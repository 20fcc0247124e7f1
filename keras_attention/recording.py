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
def record_attention(model, score_offsets=None):
    """Records each attention layer's scores, weights and mask during calls.

    Inside the context every `ScaledDotProductAttention` layer of `model`
    takes the explicit path and stores, under its name, the float32 scaled
    pre-softmax `"scores"` `(B, H, T, S)`, the softmax `"weights"` and the
    boolean `"mask"` (or `None`). Meant for diagnostics calls: the recorded
    tensors are part of the computation, so a `tf.GradientTape` around the
    call (or `torch.autograd.grad` after it) can differentiate the loss with
    respect to the scores.

    JAX cannot differentiate with respect to a tensor made inside the
    function, so `score_offsets` gives the scores stand-ins that are
    inputs: each layer adds its offset to its scaled scores before the
    softmax. Offsets of zeros leave every number unchanged, and the
    gradient of the loss with respect to an offset is the gradient with
    respect to that layer's scores, on every backend.

    Args:
        model: a Keras layer or model containing attention layers.
        score_offsets: optional dict mapping attention layer names (of
            layers of `model`) to float32 rank-4 tensors broadcastable to
            their scores `(B, H, T, S)`, meant to be zeros. The recorded
            `"scores"` do not include them; the `"weights"` do.

    Yields:
        A dict mapping layer name to its record (filled by the calls).

    Raises:
        ValueError: if `model` has no attention layer, or `score_offsets`
            names another layer or holds a tensor that is not rank 4.

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
    offsets = _checked_offsets(score_offsets, layers)
    records = {}
    previous = [(layer._recorder, layer._score_offset) for layer in layers]
    for layer in layers:
        object.__setattr__(layer, "_recorder", records)
        object.__setattr__(layer, "_score_offset", offsets.get(layer.name))
    try:
        yield records
    finally:
        for layer, (recorder, offset) in zip(layers, previous):
            object.__setattr__(layer, "_recorder", recorder)
            object.__setattr__(layer, "_score_offset", offset)


def _checked_offsets(score_offsets, layers):
    if score_offsets is None:
        return {}
    if not isinstance(score_offsets, dict):
        raise ValueError(
            "`score_offsets` must be a dict mapping attention layer names to "
            f"tensors; received {type(score_offsets).__name__}."
        )
    names = [layer.name for layer in layers]
    for name, offset in score_offsets.items():
        if name not in names:
            raise ValueError(
                f"`score_offsets` names {name!r}, which is not an attention "
                f"layer of the model; its attention layers are {names}."
            )
        if len(getattr(offset, "shape", ())) != 4:
            raise ValueError(
                f"`score_offsets[{name!r}]` must be a rank-4 tensor "
                "broadcastable to the scores (B, H, T, S); received shape "
                f"{tuple(getattr(offset, 'shape', ()))}."
            )
    return score_offsets
