"""What an exported token model serves: its inputs, outputs and checks.

Every exported format serves the same two groups of outputs for int32
`tokens` `(B, T)`:

- `serving_default`: `logits` (float32 `(B, T, C)`) and `predictions`
  (int32, the argmax of the logits over classes);
- `attention`: the weights `(B, H, T, S)` of every
  `ScaledDotProductAttention` layer, keyed by layer name (`attention_0`,
  ...).

`serving_outputs(model, tokens)` computes them in a TensorFlow function,
`serving_module(model)` wraps them as the signatures of a SavedModel (and of
the TFLite model converted from it), and `keras_attention.export_onnx` as
the outputs of one ONNX graph.

Floor 2: imports keras, TensorFlow (lazily: only the export formats need
it), `keras_attention.recording`.
"""

import contextlib

import keras

from keras_attention.recording import attention_layers
from keras_attention.recording import record_attention

SERVING_SIGNATURE = "serving_default"
ATTENTION_SIGNATURE = "attention"
TOKENS = "tokens"
LOGITS = "logits"
PREDICTIONS = "predictions"


def serving_outputs(model, tokens, groups=(SERVING_SIGNATURE,
                                           ATTENTION_SIGNATURE)):
    """The served outputs of `model` for `tokens`, from one call of it.

    Meant to be traced in a `tf.function`.

    Args:
        model: a token-to-logits Keras model (see `check_token_model`).
        tokens: an int32 tensor `(B, T)` of token ids.
        groups: the output groups to return, `SERVING_SIGNATURE` (logits,
            predictions) and/or `ATTENTION_SIGNATURE` (each attention
            layer's weights; none for a model without attention layers).
            Only with `ATTENTION_SIGNATURE` do the attention layers take the
            path that materialises their weights.

    Returns:
        A dict of float32 (predictions: int32) tensors, keyed by output
        name.
    """
    import tensorflow as tf

    input_dtype = keras.backend.standardize_dtype(model.inputs[0].dtype)
    recorded = ATTENTION_SIGNATURE in groups and attention_layers(model)
    with (record_attention(model) if recorded
          else contextlib.nullcontext({})) as records:
        logits = model(tf.cast(tokens, input_dtype), training=False)
    outputs = {}
    if SERVING_SIGNATURE in groups:
        logits = tf.cast(logits, tf.float32)
        outputs[LOGITS] = logits
        outputs[PREDICTIONS] = tf.argmax(logits, axis=-1,
                                         output_type=tf.int32)
    for name, record in records.items():
        outputs[name] = tf.cast(record["weights"], tf.float32)
    return outputs


def serving_module(model):
    """A `tf.Module` serving `model` through the two export signatures.

    Its `serving_default` and `attention` attributes are `tf.function`s with
    an input signature of int32 `tokens` `(None, T)` (`T` from the model's
    input, `None` when the model takes any length). The module tracks the
    model's variables as plain `tf.Variable`s, not the Keras objects, so a
    SavedModel of it loads without Keras.

    Args:
        model: a token-to-logits Keras model (see `check_token_model`).

    Returns:
        A tuple `(module, signatures)`: the module, and the dict of concrete
        functions to pass as `signatures` to `tf.saved_model.save`.

    Raises:
        ValueError: on a model that does not map tokens to logits, or when
            Keras does not run on the TensorFlow backend.

    Example:

    ```python
    module, signatures = serving_module(model)
    tf.saved_model.save(module, "/tmp/served", signatures=signatures)
    ```
    """
    check_tensorflow_backend("saved_model")
    import tensorflow as tf

    spec = token_spec(model)

    def signature(group):
        def serve(tokens):
            # A signature's concrete function checks the dtype of its input
            # but not its shape; check it here, before the model sees it.
            tokens = tf.ensure_shape(tokens, spec.shape,
                                     name="check_tokens_shape")
            return serving_outputs(model, tokens, groups=(group,))

        return tf.function(serve, input_signature=[spec])

    module = tf.Module(name="serving")
    # Not named `serve`: the TFLite converter takes a SavedModel with a
    # `serve` attribute for a `model.export` artifact and keeps only that.
    module.serving_default = signature(SERVING_SIGNATURE)
    signatures = {SERVING_SIGNATURE: trace(module.serving_default, spec)}
    if attention_layers(model):
        module.attention = signature(ATTENTION_SIGNATURE)
        signatures[ATTENTION_SIGNATURE] = trace(module.attention, spec)
    # Track exactly the variables the traced functions read, as the
    # `tf.Variable`s they capture: they are restored without Keras, and the
    # TFLite converter can fold them into constants.
    captured = {}
    for function in signatures.values():
        for variable in function.variables:
            captured[id(variable)] = variable
    module.model_variables = list(captured.values())
    return module, signatures


def token_spec(model):
    """The `tf.TensorSpec` of the served tokens: int32 `(None, T)`, `T` from
    the model's input (`None` for any length)."""
    import tensorflow as tf

    return tf.TensorSpec((None, check_token_model(model)), tf.int32,
                         name=TOKENS)


def trace(function, spec):
    """The concrete function of the `tf.function` `function` of tokens,
    checked to serve any batch (and any length where `spec` leaves it free).

    Args:
        function: a `tf.function` with the input signature `[spec]`,
            returning a dict of served outputs (see `serving_outputs`).
        spec: its token spec (see `token_spec`).

    Raises:
        ValueError: when the model cannot be traced with a free batch (or
            length), or fixes one in an output: it cannot take dynamic
            shapes.
    """
    shape = tuple(spec.shape.as_list())
    try:
        concrete = function.get_concrete_function()
    except Exception as error:  # A model's own code fails in many ways.
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        raise ValueError(
            f"`model` cannot take dynamic shapes: tracing it with tokens of "
            f"shape {shape} failed ({reason[:300]})."
        ) from None
    for name, output in concrete.structured_outputs.items():
        dims = output.shape.as_list()
        # Logits and predictions are (B, T, ...), weights (B, H, T, S).
        free = [0]
        if shape[1] is None:
            free += [2, 3] if len(dims) == 4 else [1]
        fixed = [axis for axis in free if dims[axis] is not None]
        if fixed:
            raise ValueError(
                f"`model` cannot take dynamic shapes: for tokens of shape "
                f"{shape} its output {name!r} has the fixed shape "
                f"{tuple(dims)} (axes {fixed} should follow the tokens)."
            )
    return concrete


# ----------------------------------------------------------------- checks
def check_tensorflow_backend(format):
    """Raises `ValueError` unless Keras runs on TensorFlow, which `format`
    needs."""
    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            f'format="{format}" needs the TensorFlow backend of Keras; the '
            f'backend is "{keras.backend.backend()}". Use format="keras".'
        )


def check_token_model(model):
    """Returns the model's sequence length `T` (or `None`) after checking
    that it maps one `(B, T)` integer input to one rank-3 output.

    Raises:
        ValueError: naming what the model has instead.
    """
    try:
        inputs, outputs = model.inputs, model.outputs
    except (AttributeError, ValueError):
        inputs = outputs = None
    if not inputs or not outputs:
        raise ValueError(
            "`model` must be built with a known input, such as a functional "
            "model from `keras.Input`; it has no defined inputs/outputs."
        )
    if len(inputs) != 1 or len(outputs) != 1:
        raise ValueError(
            "`model` must have one input (token ids) and one output "
            f"(logits); it has {len(inputs)} inputs and {len(outputs)} "
            "outputs."
        )
    token_input, logits = inputs[0], outputs[0]
    input_dtype = keras.backend.standardize_dtype(token_input.dtype)
    if len(token_input.shape) != 2 or "int" not in input_dtype:
        raise ValueError(
            "`model` must take integer token ids of shape (batch, length); "
            f"its input has shape {tuple(token_input.shape)} and dtype "
            f"{token_input.dtype}."
        )
    if len(logits.shape) != 3:
        raise ValueError(
            "`model` must return logits of shape (batch, length, classes); "
            f"its output has shape {tuple(logits.shape)}."
        )
    return token_input.shape[1]
