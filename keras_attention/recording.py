"""Finding the attention layers of a model, and recording what they compute.

`attention_layers(model)` is the one way the package finds the attention
layers of a model (nested models included): `ScaledDotProductAttention`
and the ones Keras ships, `keras.layers.MultiHeadAttention` (and its
subclasses), `keras.layers.GroupQueryAttention`, `keras.layers.Attention`
and `keras.layers.AdditiveAttention` (these two with one head).
`record_attention(model)` captures their scores, weights and masks during
calls (eager or traced), for diagnostics and for the exported `attention`
signature; `projection_kernels(layer)` gives a layer's W_Q, W_K and W_V
for the gradient norms. The Keras layers are recorded through their private
methods, all reached in `keras_attention._keras_layers` (the Keras versions
tested are named there).
Floor 1 (layer): imports `keras_attention.layer` and `_keras_layers` only.
"""

import contextlib

from keras_attention import _keras_layers
from keras_attention.layer import ScaledDotProductAttention

# Every kind of layer `attention_layers` finds.
SUPPORTED_LAYERS = (ScaledDotProductAttention,) + (
    _keras_layers.KERAS_ATTENTION_LAYERS)


def attention_layers(model):
    """The attention layers of `model`, in build order.

    The layers of `SUPPORTED_LAYERS`: `ScaledDotProductAttention` and
    Keras's `MultiHeadAttention` (with its subclasses),
    `GroupQueryAttention`, `Attention` and `AdditiveAttention`.

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
    if isinstance(model, SUPPORTED_LAYERS):
        return [model]
    return [
        layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if isinstance(layer, SUPPORTED_LAYERS)
    ]


def projection_kernels(layer):
    """The query, key and value kernels (W_Q, W_K, W_V) of an attention
    layer, for the gradient norms of the diagnostics.

    Args:
        layer: a layer `attention_layers` finds.

    Returns:
        A tuple of three Keras variables, `None` in place of one the layer
        does not have: `keras.layers.Attention` and `AdditiveAttention`
        project nothing (`(None, None, None)`), and a LoRA or quantized
        projection of a Keras layer computes its kernel from other
        variables.

    Example:

    ```python
    query_kernel, key_kernel, value_kernel = projection_kernels(layer)
    ```
    """
    if isinstance(layer, ScaledDotProductAttention):
        return (layer.query_kernel, layer.key_kernel, layer.value_kernel)
    return _keras_layers.projection_kernels(layer)


@contextlib.contextmanager
def record_attention(model, score_offsets=None):
    """Records each attention layer's scores, weights and mask during calls.

    Inside the context every attention layer of `model` (see
    `attention_layers`) takes the path that materialises the weights and
    stores, under its name, the float32 pre-softmax `"scores"`
    `(B, H, T, S)` as the softmax sees them (scaled, before the mask), the
    softmax `"weights"` (before dropout; what the layer returns with
    `return_attention_scores=True`) and the boolean `"mask"`
    `(B or 1, H or 1, T, S)` (or `None`). `keras.layers.Attention` and
    `AdditiveAttention` have `H = 1`; `GroupQueryAttention` records
    `num_query_heads` heads. Meant for diagnostics calls, eager or traced
    (`tf.function`, `jax.jit`): the recorded tensors are part of the
    computation, so a `tf.GradientTape` around the call (or
    `torch.autograd.grad` after it) can differentiate the loss with respect
    to the scores. A recorded Keras layer's output is exactly what it
    returns with `return_attention_scores=True` (its plain call may run a
    fused kernel instead: the same up to rounding, about 3e-9 in the
    outputs of a small model on torch). Everything a layer had is
    restored on exit, even on error.

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
            names another layer or holds a tensor that is not rank 4; at a
            call, if a Keras layer attends over several axes (its scores
            are not `(B, H, T, S)`).
        RuntimeError: if the installed Keras version's attention layers
            differ from the versions tested (one line naming the layer and
            the version; nothing is recorded wrong).

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
            "`model` contains no attention layer to record (supported: "
            f"{supported_names()})."
        )
    offsets = _checked_offsets(score_offsets, layers)
    records = {}
    with contextlib.ExitStack() as stack:
        for layer in layers:
            offset = offsets.get(layer.name)
            if isinstance(layer, ScaledDotProductAttention):
                stack.enter_context(_own_layer(layer, records, offset))
            else:
                stack.enter_context(
                    _keras_layers.recorded(layer, records, offset))
        yield records


def supported_names():
    """The supported layer classes' names, for error messages."""
    return ", ".join(cls.__name__ for cls in SUPPORTED_LAYERS) + (
        " and subclasses")


@contextlib.contextmanager
def _own_layer(layer, records, offset):
    """`ScaledDotProductAttention` records through its own hook."""
    previous = (layer._recorder, layer._score_offset)
    object.__setattr__(layer, "_recorder", records)
    object.__setattr__(layer, "_score_offset", offset)
    try:
        yield
    finally:
        object.__setattr__(layer, "_recorder", previous[0])
        object.__setattr__(layer, "_score_offset", previous[1])


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
