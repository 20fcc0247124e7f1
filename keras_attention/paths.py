"""Which path a `ScaledDotProductAttention` call takes: one policy, by
device.

`choose_path` is the whole policy; the layer asks it on every call, and
a memory estimate asks `attention_path` and `materialises`. `"auto"`
picks, for a call that needs only the output (T·S the query-key pairs,
"long" from `MEMORY_EFFICIENT_THRESHOLD` = 4096²):

| device | short | long |
|---|---|---|
| GPU | fused | fused |
| TPU (untested) | explicit | memory-efficient |
| CPU, TensorFlow and JAX | explicit | memory-efficient |
| CPU, torch | fused | fused unmasked, else memory-efficient |

With a `logit_soft_cap`, which the fused ops do not take: explicit
(weights materialised) when short, memory-efficient when long, on every
device.

A call that returns the weights, runs dropout or is recorded by the
monitor takes the explicit path that materialises them ("explicit_weights")
on every device. Fused means `keras.ops.dot_product_attention`: cuDNN's or
the backend's flash kernel on a GPU, which serves every mask the layer
builds; it needs the values as wide as the queries (JAX's op) and is not
taken for float16, whose score product can overflow where the explicit
path's float32 softmax does not.

Why, by measurement:
- GPU: one H200, bf16 forward+backward, batch 2, 16 heads of 64, width
  1024 (2026-12-04, JAX): fused 2.07 ms at T 4096 and 18.81 ms at T 16384,
  the memory-efficient path 15.74 and 231.8 ms (7.6x and 12.3x).
- CPU (fwd+bwd at batch 8, width 256, d_k 64, ms at (T, heads) = (128, 8)
  / (512, 8) / (2048, 1), one thread): JAX explicit 28 / 382 / 653
  against fused 36 / 574 / 1303; torch fused 28 / 179 / 241 against
  explicit 28 / 310 / 497 and memory-efficient 46 / 529 / 425; TensorFlow
  has no fused kernel (its op is two einsums).
- torch's CPU kernel is chunked itself only without a mask: at T 8192
  unmasked it grew the peak RSS by 29 MiB (explicit 798), with a causal
  mask by 346 MiB (memory-efficient 51).
- TPU: no measurement; XLA fuses the explicit path's softmax there, and
  the long rule keeps the maps out of memory.

Floor 1 (layer), beside `keras_attention.layer`: imports keras only (and
the backend's own framework, inside `device_kind`, for its devices).
"""

import functools

import keras

# From this many query-key pairs per head a call is "long": "auto" keeps
# its score maps out of memory.
MEMORY_EFFICIENT_THRESHOLD = 4096 * 4096

PATHS = ("explicit_weights", "explicit", "fused", "memory_efficient")
DEVICE_KINDS = ("cpu", "gpu", "tpu")


def choose_path(*, implementation="auto", device="cpu", backend=None,
                query_length=None, key_length=None, masked=True,
                logit_soft_cap=None, needs_weights=False, float16=False,
                fused_fits=True):
    """The path of one call (the module's table).

    Args:
        implementation: the layer's `implementation`.
        device: `"cpu"`, `"gpu"` or `"tpu"` (`device_kind()`).
        backend: the Keras backend (default: the running one).
        query_length: number of queries `T`, or `None` when unknown.
        key_length: number of keys `S`, or `None`.
        masked: whether a mask reaches the scores.
        logit_soft_cap: the layer's `logit_soft_cap`.
        needs_weights: the call materialises the weights (returned,
            dropout, the monitor's recorder).
        float16: the layer computes in float16.
        fused_fits: the fused op takes these shapes (values as wide as
            the queries).

    Returns:
        One of `PATHS`: `"explicit_weights"` (the weights materialised,
        and the only materialising path that caps), `"explicit"` (output
        only, a hand-written backward), `"fused"` or `"memory_efficient"`.
    """
    if device not in DEVICE_KINDS:
        raise ValueError(f"`device` must be one of {DEVICE_KINDS}; "
                         f"received {device!r}.")
    backend = backend or keras.backend.backend()
    if needs_weights:
        return "explicit_weights"
    long = (query_length is not None and key_length is not None
            and query_length * key_length >= MEMORY_EFFICIENT_THRESHOLD)
    fused = fused_fits and not float16
    if implementation == "memory_efficient":
        return implementation
    if logit_soft_cap is not None:
        # The fused ops take no cap; the layer refuses "fused" with one.
        return ("memory_efficient" if long and implementation == "auto"
                else "explicit_weights")
    if implementation == "fused":
        return "fused" if fused_fits else "explicit"
    if implementation == "explicit":
        return implementation
    if device == "gpu" and fused:
        return "fused"
    if long and (backend != "torch" or masked or device != "cpu"):
        return "memory_efficient"
    if device == "cpu" and backend == "torch" and fused:
        return "fused"
    return "explicit"


@functools.cache
def _kind_of(backend):
    if backend == "jax":
        import jax

        platform = jax.default_backend()
    elif backend == "torch":
        import torch

        platform = "gpu" if torch.cuda.is_available() else "cpu"
    elif backend == "tensorflow":
        import tensorflow as tf

        platform = next((kind for kind in ("TPU", "GPU")
                         if tf.config.list_logical_devices(kind)), "cpu")
    else:
        platform = "cpu"
    platform = platform.lower()
    return "gpu" if platform in ("cuda", "rocm") else (
        platform if platform in DEVICE_KINDS else "cpu")


def device_kind():
    """`"cpu"`, `"gpu"` or `"tpu"`: the kind of device the running Keras
    backend computes on by default (asked once per backend)."""
    return _kind_of(keras.backend.backend())


def materialises(path, device=None):
    """Whether `path` keeps `(B, H, T, S)` score maps in memory while it
    trains on `device` (default: this one): the explicit paths do, the
    memory-efficient one does not, and the fused one does not on a GPU
    (cuDNN's and the flash kernels keep them on chip); on a CPU the fused
    ops of TensorFlow and JAX are einsums, and torch's chunks only
    unmasked calls, so it counts there."""
    if path == "memory_efficient":
        return False
    if path == "fused":
        return (device or device_kind()) != "gpu"
    return True


def attention_path(query_length, key_length, implementation="auto",
                   logit_soft_cap=None, masked=True, **options):
    """The path a `ScaledDotProductAttention` built with these options takes
    on this device for `query_length` queries and `key_length` keys
    (`None` when unknown) when its call needs no weights: a memory
    estimate asks it whether the score maps are materialised.

    Args:
        query_length: number of queries `T`, or `None`.
        key_length: number of keys `S`, or `None`.
        implementation: the layer's `implementation`.
        logit_soft_cap: the layer's `logit_soft_cap`.
        masked: whether a mask reaches the scores (default `True`: the
            path that holds under any mask).
        **options: the layer's other arguments; they choose no path.

    Returns:
        One of `PATHS` (`choose_path`).
    """
    del options
    return choose_path(implementation=implementation, device=device_kind(),
                       query_length=query_length, key_length=key_length,
                       masked=masked, logit_soft_cap=logit_soft_cap)
