"""Export a token model to ONNX, for ONNX Runtime.

`onnx_model(model)` converts the served outputs (`keras_attention.serving`)
into one ONNX graph: the input `tokens`, int32 `(batch, T)` (`T` free when
the model takes any length), and the outputs `logits`, `predictions` and
each attention layer's weights (`attention_0`, ...). The graph's metadata
names the two output groups and records the opset; `onnx_info(path)` reads
them back.

The converter is tf2onnx, called on the TensorFlow function that the
SavedModel's signatures also trace, not `model.export(format="onnx")`
(Keras 3.15). On TensorFlow Keras converts only the model's `call` (no
attention maps), through the same tf2onnx, whose 1.17 has no mapping for
the `Erfc` op of TensorFlow's GELU (onnx/tensorflow-onnx#2347; the fix,
PR #2463, is open): Keras writes the file anyway, and `onnx.checker` then
fails with "No Op registered for Erfc with domain_version of 15". Here
`Erfc` is converted as `1 - Erf`. On JAX Keras calls jax2onnx 0.17.1, which
fails on our models with a free batch ("TypeError: reshape with symbolic
dimensions requires mapping to input axes"); on torch, for a free batch,
Keras takes the TorchScript exporter, which fails in Keras's
`layer_normalization` ("SymbolicValueError: Failed to export a node ...
because it is not constant"). Runs from every backend load as `.keras` on
TensorFlow, so this one path serves them all.

Floor 2: imports numpy, `keras_attention.serving`; TensorFlow, tf2onnx and
onnx lazily (they are the optional `onnx` extra).
"""

import contextlib
import logging

import numpy as np

from keras_attention.serving import ATTENTION_SIGNATURE
from keras_attention.serving import LOGITS
from keras_attention.serving import PREDICTIONS
from keras_attention.serving import SERVING_SIGNATURE
from keras_attention.serving import check_tensorflow_backend
from keras_attention.serving import serving_outputs
from keras_attention.serving import token_spec
from keras_attention.serving import trace

# The graph's ops (MatMul, Softmax, Erf, ...) are the same at opsets 13, 15,
# 17 and 18, with the same errors against the model (measured); the opset
# is fixed so that a file does not change with tf2onnx's default.
ONNX_OPSET = 17
# The packages the conversion imports (the `onnx` extra also brings
# onnxruntime, to serve the file).
PACKAGES = ("tensorflow", "tf2onnx", "onnx")
OPSET_KEY = "onnx_opset"
GROUP_KEY = "outputs."  # + group name: its outputs, comma-separated
BATCH, LENGTH = "batch", "length"


def onnx_model(model):
    """The ONNX model (`onnx.ModelProto`) serving `model`.

    Args:
        model: a token-to-logits Keras model (see
            `keras_attention.export.export_model`), on the TensorFlow
            backend.

    Returns:
        A model that passes `onnx.checker.check_model`, with the input
        `tokens` and the outputs `logits`, `predictions` and, for each
        attention layer, its weights under the layer's name.

    Raises:
        ValueError: on a model that does not map tokens to logits, cannot
            take dynamic shapes, or uses an op that does not convert; when
            Keras does not run on TensorFlow.
    """
    check_tensorflow_backend("onnx")
    import onnx
    import tensorflow as tf
    import tf2onnx

    spec = token_spec(model)
    # One call of the model returns both groups: the weights are part of
    # the computation of the logits.
    function = tf.function(lambda tokens: serving_outputs(model, tokens),
                           input_signature=[spec])
    outputs = trace(function, spec).structured_outputs
    try:
        with _quiet("tf2onnx"):
            proto, _ = tf2onnx.convert.from_function(
                function, input_signature=[spec], opset=ONNX_OPSET,
                custom_op_handlers={"Erfc": (_erfc_as_one_minus_erf, [])},
            )
    except Exception as error:  # the converter's own failures, any type
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        raise ValueError(
            f"`model` does not convert to ONNX (tf2onnx: {reason[:300]})."
        ) from None
    _name_dimensions(proto, outputs, spec)
    groups = {
        SERVING_SIGNATURE: [LOGITS, PREDICTIONS],
        ATTENTION_SIGNATURE: [
            name for name in outputs if name not in (LOGITS, PREDICTIONS)
        ],
    }
    metadata = {GROUP_KEY + group: ",".join(names)
                for group, names in groups.items()}
    metadata[OPSET_KEY] = str(ONNX_OPSET)
    onnx.helper.set_model_props(proto, metadata)
    proto.doc_string = (
        "tokens (int32) -> logits, predictions and each attention layer's "
        "weights (batch, heads, T, T)"
    )
    try:
        onnx.checker.check_model(proto, full_check=True)
    except onnx.checker.ValidationError as error:
        # tf2onnx writes an op it could not convert as it is, and says so
        # only in its log.
        unconverted = sorted({
            node.op_type for node in proto.graph.node
            if not onnx.defs.has(node.op_type, node.domain)
        })
        detail = (f"ops without an ONNX mapping: {', '.join(unconverted)}"
                  if unconverted else " ".join(str(error).split())[:300])
        raise ValueError(f"`model` does not convert to ONNX ({detail}).") \
            from None
    return proto


def onnx_info(path):
    """The opset and output groups recorded in the ONNX file at `path`.

    Returns:
        A dict `{"opset": int, "outputs": {group: [output names]}}`.

    Example:

    ```python
    onnx_info("reverse.onnx")
    # {'opset': 17, 'outputs': {'serving_default': ['logits',
    #  'predictions'], 'attention': ['attention_0']}}
    ```
    """
    import onnx

    proto = onnx.load(path, load_external_data=False)
    props = {entry.key: entry.value for entry in proto.metadata_props}
    return {
        "opset": int(props[OPSET_KEY]),
        "outputs": {
            key[len(GROUP_KEY):]: [name for name in value.split(",") if name]
            for key, value in props.items() if key.startswith(GROUP_KEY)
        },
    }


def write_onnx(model, path):
    """Writes `onnx_model(model)` to the file `path`."""
    import onnx

    onnx.save(onnx_model(model), path)


def _erfc_as_one_minus_erf(ctx, node, name, args):
    """tf2onnx handler: `Erfc(x)` as `1 - Erf(x)` (ONNX has no Erfc).

    In GELU, `0.5 x erfc(-x / sqrt 2)`, the difference is float32 rounding
    of `1 - erf`: below 1e-6 in the logits of the tests' models.
    """
    from tf2onnx import utils

    (x,) = node.input
    dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(x))
    erf = ctx.make_node("Erf", [x], op_name_scope=node.name).output[0]
    one = ctx.make_const(utils.make_name(f"{node.name}/one"),
                         np.array(1, dtype)).output[0]
    node.type = "Sub"
    ctx.replace_inputs(node, [one, erf])


def _name_dimensions(proto, outputs, spec):
    """Names the free dimensions `batch` and `length` in the graph's input
    and outputs (tf2onnx names them `unk__N`, one name per output), so that
    the file says which ones follow the tokens."""
    length = spec.shape[1]
    length = LENGTH if length is None else length
    shapes = {spec.name: (BATCH, length)}
    for name, output in outputs.items():
        dims = list(output.shape)
        dims[0] = BATCH
        if len(dims) == 4:  # attention weights (B, H, T, S)
            dims[2] = dims[3] = length
        else:
            dims[1] = length
        shapes[name] = tuple(dims)
    for value in list(proto.graph.input) + list(proto.graph.output):
        for dim, size in zip(value.type.tensor_type.shape.dim,
                             shapes[value.name]):
            if isinstance(size, str):
                dim.dim_param = size
            elif size is not None:
                dim.dim_value = size


@contextlib.contextmanager
def _quiet(name):
    """Silences the logger `name` (tf2onnx logs every step at INFO and an
    unconverted op at ERROR; `onnx_model` reports what matters itself)."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
