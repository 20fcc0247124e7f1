"""Recording the attention layers Keras ships: the one place that reaches
into their private methods.

`keras_attention.recording` records `ScaledDotProductAttention` through the
layer's own hook; the layers of `keras.layers` have none, so while a
recording is active this module puts wrappers on the *instance* (never the
class) and takes them off again on exit, even on error:

* `MultiHeadAttention` (and its subclasses) and `GroupQueryAttention`:
  `_compute_attention` is wrapped to take the explicit path, the one that
  materialises the weights (Keras >= 3.7 otherwise calls
  `ops.dot_product_attention`, which has no weights to give), by the means
  the installed version reads: the `return_attention_scores` argument
  (MultiHeadAttention, Keras >= 3.9) or the `_return_attention_scores`
  attribute (MultiHeadAttention 3.7 - 3.8, GroupQueryAttention >= 3.7); a
  layer built with `flash_attention=True` (which refuses to return weights)
  takes the explicit path too, for the recorded call only: the same
  attention, another kernel. `_masked_softmax` is wrapped to record its
  input (the scaled scores, before the mask) and its output (the weights,
  before dropout) and to add the score offset. An instance attribute keeps
  the identity check of Keras >= 3.15 (`type(self)._compute_attention is
  MultiHeadAttention._compute_attention`) true, so a causal-only call still
  passes `use_causal_mask=True`, which the wrapper forwards; the explicit
  path then builds the causal mask itself.
* `Attention` and `AdditiveAttention` (one head): `_apply_scores`, which
  takes the scores and the mask and returns the output and the weights, is
  wrapped the same way; the records get a head axis of 1.

The signatures are read with `inspect` before anything is patched, and a
call that did not go through the wrapped softmax fails: a Keras version
that differs gets one line (`RuntimeError` naming the layer and the
version), never wrong numbers. Tested with Keras 3.15.1 and 3.8.0.
Floor 1, beside `recording`: imports Keras only.
"""

import contextlib
import inspect

import keras
from keras import ops

MULTI_HEAD = tuple(
    cls for cls in (
        keras.layers.MultiHeadAttention,
        getattr(keras.layers, "GroupQueryAttention", None),
    ) if cls is not None
)
# AdditiveAttention is a subclass of Attention.
SINGLE_HEAD = (keras.layers.Attention,)
KERAS_ATTENTION_LAYERS = MULTI_HEAD + SINGLE_HEAD

# Marks our wrappers, so a nested recording wraps the layer's own method.
_ORIGINAL = "_keras_attention_original"


def projection_kernels(layer):
    """`(W_Q, W_K, W_V)` of a Keras attention layer: the kernel variables
    of its query, key and value projections, `None` for one it has not
    (Attention, AdditiveAttention) or whose kernel is not a variable (a
    LoRA or quantized projection computes it)."""
    if not isinstance(layer, MULTI_HEAD):
        return (None, None, None)
    kernels = []
    for name in ("_query_dense", "_key_dense", "_value_dense"):
        kernel = getattr(getattr(layer, name, None), "kernel", None)
        kernels.append(kernel if isinstance(kernel, keras.Variable) else None)
    return tuple(kernels)


@contextlib.contextmanager
def recorded(layer, records, offset):
    """While active, every call of the Keras attention `layer` stores
    `{"scores", "weights", "mask"}` in `records[layer.name]`, the scores
    float32 `(B, H, T, S)` as its softmax sees them (scaled, before the
    mask), and adds `offset` (or nothing, for `None`) to them before the
    softmax.

    Raises:
        RuntimeError: if the installed Keras's methods differ from the
            tested ones (checked before patching).
    """
    if isinstance(layer, MULTI_HEAD):
        patches = _multi_head_patches(layer, records, offset)
    else:
        patches = {"_apply_scores": _single_head_patch(layer, records, offset)}
    missing = object()
    previous = {name: layer.__dict__.get(name, missing) for name in patches}
    try:
        for name, wrapper in patches.items():
            object.__setattr__(layer, name, wrapper)
        yield
    finally:
        for name, value in previous.items():
            if value is missing:
                layer.__dict__.pop(name, None)
            else:
                object.__setattr__(layer, name, value)


def _unsupported(layer, what):
    return RuntimeError(
        f"Cannot record attention layer {layer.name!r} "
        f"({type(layer).__name__}): {what} in Keras {keras.version()}; "
        "recording is tested with Keras 3.8 and 3.15."
    )


def _method(layer, name, parameters):
    """The layer's own method (not a wrapper of ours) and the parameter
    names of the Keras class's method it overrides or is, which Keras's
    callers follow; their first names must be `parameters` (names, or the
    number of parameters)."""
    method = getattr(layer, name, None)
    method = getattr(method, _ORIGINAL, method)
    base = next(cls for cls in KERAS_ATTENTION_LAYERS
                if isinstance(layer, cls))
    if not callable(method) or not callable(getattr(base, name, None)):
        raise _unsupported(layer, f"{base.__name__} has no `{name}`")
    found = list(inspect.signature(getattr(base, name)).parameters)[1:]
    if isinstance(parameters, int):
        fits, expected = len(found) == parameters, f"{parameters} parameters"
    else:
        fits = found[:len(parameters)] == list(parameters)
        expected = list(parameters)
    if not fits:
        raise _unsupported(
            layer, f"`{base.__name__}.{name}` takes {found}, not {expected}"
        )
    return method, found


def _argument(names, args, kwargs, name, default=None):
    """The value of parameter `name` in a call `(*args, **kwargs)`."""
    index = names.index(name)
    if name in kwargs:
        return kwargs[name]
    return args[index] if index < len(args) else default


def _replaced(names, args, kwargs, name, value):
    """`(args, kwargs)` with `name` set to `value`, passed the way the
    caller passed it (a subclass's override may take fewer keywords)."""
    index = names.index(name)
    if name in kwargs or index >= len(args):
        return args, {**kwargs, name: value}
    return args[:index] + (value,) + args[index + 1:], kwargs


def _wrapper(original, function):
    setattr(function, _ORIGINAL, original)
    return function


def _multi_head_patches(layer, records, offset):
    compute, compute_names = _method(
        layer, "_compute_attention",
        ("query", "key", "value", "attention_mask", "training"),
    )
    # (scores, mask): named `attention_scores` or `scores` by the class.
    softmax, softmax_names = _method(layer, "_masked_softmax", 2)
    by_argument = "return_attention_scores" in compute_names
    calls = [0]  # softmax calls, to check each attention call made one

    def masked_softmax(*args, **kwargs):
        scores = _argument(softmax_names, args, kwargs, softmax_names[0])
        mask = _argument(softmax_names, args, kwargs, softmax_names[1])
        if len(scores.shape) != 4:
            raise ValueError(
                f"Cannot record attention layer {layer.name!r}: it attends "
                f"over several axes (scores of shape {tuple(scores.shape)}); "
                "recording takes scores (B, H, T, S)."
            )
        recorded_scores, fed = _scores_and_input(scores, offset)
        args, kwargs = _replaced(softmax_names, args, kwargs,
                                 softmax_names[0], fed)
        weights = softmax(*args, **kwargs)
        records[layer.name] = {
            "scores": recorded_scores,
            "weights": weights,
            "mask": _rank4_mask(mask),
        }
        calls[0] += 1
        return weights

    def compute_attention(*args, **kwargs):
        if by_argument:  # Keras >= 3.9's MultiHeadAttention
            args, kwargs = _replaced(compute_names, args, kwargs,
                                     "return_attention_scores", True)
        # Keras 3.7 - 3.8's MultiHeadAttention and GroupQueryAttention >=
        # 3.7 read the request from the instance; flash attention refuses it.
        state = {"_return_attention_scores": True, "_flash_attention": False}
        saved = {name: layer.__dict__[name] for name in state
                 if name in layer.__dict__}
        before = calls[0]
        try:
            for name in saved:
                object.__setattr__(layer, name, state[name])
            result = compute(*args, **kwargs)
        finally:
            for name, value in saved.items():
                object.__setattr__(layer, name, value)
        if calls[0] == before:
            raise _unsupported(
                layer, "its weights were not computed through "
                "`_masked_softmax`"
            )
        return result

    return {
        "_compute_attention": _wrapper(compute, compute_attention),
        "_masked_softmax": _wrapper(softmax, masked_softmax),
    }


def _single_head_patch(layer, records, offset):
    apply, names = _method(
        layer, "_apply_scores", ("scores", "value", "scores_mask")
    )

    def apply_scores(*args, **kwargs):
        scores = _argument(names, args, kwargs, "scores")
        if len(scores.shape) != 3:
            raise ValueError(
                f"Cannot record attention layer {layer.name!r}: its scores "
                f"have shape {tuple(scores.shape)}; recording takes scores "
                "(B, T, S)."
            )
        recorded_scores, fed = _scores_and_input(
            ops.expand_dims(scores, 1), offset
        )
        mask = _argument(names, args, kwargs, "scores_mask")
        args, kwargs = _replaced(names, args, kwargs, "scores",
                                 ops.squeeze(fed, 1))
        result = apply(*args, **kwargs)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise _unsupported(
                layer, "`_apply_scores` does not return (output, weights)"
            )
        records[layer.name] = {
            "scores": recorded_scores,
            "weights": ops.expand_dims(result[1], 1),
            "mask": _rank4_mask(mask),
        }
        return result

    return _wrapper(apply, apply_scores)


def _scores_and_input(scores, offset):
    """The float32 scores to record and the softmax's input made from them
    (plus the offset), in the scores' dtype: the input depends on the
    recorded tensor, so a tape or autograd differentiates through it, and
    the float32 round trip is exact, so the layer's numbers do not change.
    The input is a new tensor: Keras 3.8 masks it in place on torch
    (`scores -= ...`), which changed a record that shared its storage."""
    recorded = ops.cast(scores, "float32")
    shifted = ops.copy(recorded) if offset is None else (
        recorded + ops.cast(offset, "float32"))
    return recorded, ops.cast(shifted, scores.dtype)


def _rank4_mask(mask):
    """A boolean mask `(B or 1, 1, T or 1, S)` from the layer's `(B, T, S)`
    (or `(B, S)`) mask; `None` stays `None`."""
    if mask is None:
        return None
    mask = ops.cast(mask, "bool")
    while len(mask.shape) < 4:
        mask = ops.expand_dims(mask, 1)
    return mask
