"""The attention summary's format: its plugin name, its metadata and the
encoding of its two blobs `[meta, weights]`.

Floor 2 (`keras_attention.viz`), but imports only numpy, TensorBoard's
protos and the core's argument checks, never Keras: the Attention
dashboard (`keras_attention.viz.tensorboard_plugin`) reads summaries with
it inside TensorBoard, which must start whatever Keras backend is
installed, or none. `keras_attention.viz.summary` builds the summaries
(their statistics need the diagnostics, hence Keras) and writes them in
this format.

Example:

```python
meta, weights = decode_summary(blobs)   # weights float32 (E, H, T, S)
```
"""

import json

import numpy as np
from tensorboard.compat.proto import summary_pb2

from keras_attention.validation import check_choice

PLUGIN_NAME = "attention"
FORMAT_VERSION = 1
# float16 keeps ~3 significant digits of small weights (a uniform row over
# 2048 keys is 4.9e-4, which uint8 rounds to 0 or 1/255); uint8 halves the
# bytes when only the picture matters.
DTYPES = ("float16", "uint8")
# Bytes of one weight in each of `DTYPES`.
ITEMSIZE = {"float16": 2, "uint8": 1}
_UINT8_SCALE = 255.0


def summary_tag(layer):
    """The summary tag of `layer`'s attention maps."""
    return f"attention/{layer}/maps"


def summary_metadata(layer):
    """`SummaryMetadata` naming the plugin, for the summary of `layer`."""
    content = {"version": FORMAT_VERSION, "layer": str(layer)}
    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=PLUGIN_NAME, content=json.dumps(content).encode()
        ),
        data_class=summary_pb2.DATA_CLASS_BLOB_SEQUENCE,
    )


def encode_weights(weights, dtype="float16"):
    """The weights as little-endian bytes of `dtype` (see `DTYPES`)."""
    dtype = check_choice(dtype, "dtype", DTYPES)
    weights = np.clip(np.asarray(weights, np.float32), 0.0, 1.0)
    if dtype == "uint8":
        return np.round(weights * _UINT8_SCALE).astype(np.uint8).tobytes()
    return weights.astype("<f2").tobytes()


def decode_meta(blob):
    """The summary's first blob (UTF-8 JSON: shape, dtype, labels, target
    cells, statistics) as a dict.

    Raises:
        ValueError: if the blob is not UTF-8 JSON.
    """
    return json.loads(bytes(blob).decode("utf-8"))


def example_nbytes(meta):
    """Bytes of one example's `(H, T, S)` weights in the second blob.

    Raises:
        ValueError: if `meta` names no shape of four or an unknown dtype.
    """
    try:
        _, heads, queries, keys = meta["shape"]
        itemsize = ITEMSIZE[meta["dtype"]]
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            f"an attention summary's meta needs a 4-d `shape` and a `dtype` "
            f"of {DTYPES}; received shape {meta.get('shape')!r}, dtype "
            f"{meta.get('dtype')!r}") from None
    return heads * queries * keys * itemsize


def decode_summary(blobs):
    """`(meta, weights)` of a summary's two blobs; weights float32
    `(E, H, T, S)`, as they were logged (after the dtype's rounding)."""
    if len(blobs) != 2:
        raise ValueError(
            f"`blobs` must be the two blobs [meta, weights] of an attention "
            f"summary; received {len(blobs)}."
        )
    meta = decode_meta(blobs[0])
    shape = tuple(meta["shape"])
    if meta["dtype"] == "uint8":
        array = np.frombuffer(blobs[1], np.uint8) / _UINT8_SCALE
    else:
        array = np.frombuffer(blobs[1], "<f2")
    return meta, array.astype(np.float32).reshape(shape)
