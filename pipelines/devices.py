"""A run's devices (`open_run_devices`), the dtype policy and XLA resolved
for them, and the memory check that refuses a run that cannot fit.
"""

import os

import keras

from keras_attention.paths import attention_path
from keras_attention.paths import materialises
from pipelines.backends import backend_module
from pipelines.common import UsageError

# Score-sized float32 tensors a layer keeps per (example, head) while it
# trains on a materialised path: the scores, the weights, and their two
# gradients. `train --task reverse --seq-len 100000` grew past 6.7 GB and
# failed deep in a step; this estimate says 2,384 GiB (the probe's maps).
_MAPS_PER_LAYER = 4
# A weight, its gradient and Adam's two moments: 4 float32.
_BYTES_PER_WEIGHT = 16
# The largest held-out batch of an evaluation (`steps.eval_batch_size`).
MAX_EVAL_BATCH = 1024


def resolve_precision(precision, backend, accelerator):
    """`"auto"`: bfloat16 on TPUs; on GPUs float16 with TensorFlow (loss
    scaling, the path its kernels are tuned for) and bfloat16 with JAX and
    torch (no loss scale to carry in a stateless step; the H200's bf16
    matrix units run at its full rate); float32 on CPUs, where mixed
    precision only adds casts."""
    if precision != "auto":
        return precision
    if accelerator == "tpu":
        return "mixed_bfloat16"
    if accelerator == "gpu":
        return ("mixed_float16" if backend == "tensorflow"
                else "mixed_bfloat16")
    return "float32"


def probe_precision(config):
    """The dtype policy a run of `config` trains under here, found without
    setting up the devices (on JAX that sets a distribution globally). A
    TPU counts when the config names its strategy."""
    if config.precision != "auto":
        return config.precision
    if config.backend == "torch":
        # Keras lists no torch devices; torch's own count sets up nothing.
        accelerator = backend_module("torch").open_devices(
            "default").accelerator
    else:
        kind = keras.distribution.list_devices()[0].split(":")[0]
        accelerator = "tpu" if config.strategy == "tpu" else kind
    return resolve_precision("auto", config.backend, accelerator)


def resolve_jit(jit_compile, devices, source="flags", deterministic=False):
    """Whether the steps are compiled (XLA; `torch.compile` on torch).
    TensorFlow `"auto"`: on accelerators, where fusing a toy model's small
    ops pays (on a CPU it mostly adds compile time), and never with
    `deterministic` (Keras's TensorFlow trainer turns XLA off under op
    determinism); JAX: always, as Keras's JAX trainer does; torch: only
    when the user asks (`--jit-compile on`, not a preset's "on"): on 2 CPU
    cores the comparison's step took 17.8 ms compiled against 14.4 eager,
    after 62 s of compiling, with the same loss to 7 digits."""
    if devices.backend == "tensorflow" and deterministic:
        return False
    if devices.backend == "torch":
        return jit_compile == "on" and not source.startswith("preset")
    if jit_compile == "auto":
        return devices.backend == "jax" or devices.accelerator != "cpu"
    return jit_compile == "on"


def open_run_devices(config):
    """`(config, devices)`: the run's `Devices` and its config with
    `precision` and `jit_compile` resolved for them.

    Raises:
        UsageError: when the strategy cannot be set up here, or the batch
            or the held-out set does not split over its replicas.
    """
    devices = backend_module(config.backend).open_devices(config.strategy)
    for name in ("batch_size", "heldout_size"):
        if getattr(config, name) % devices.num_replicas:
            raise UsageError(
                f"--{name.replace('_', '-')} ({getattr(config, name)}) must "
                "be divisible by the number of replicas "
                f"({devices.num_replicas})"
            )
    config = config.replace(
        precision=resolve_precision(config.precision, devices.backend,
                                    devices.accelerator),
        jit_compile="on" if resolve_jit(
            config.jit_compile, devices,
            config.sources.get("jit_compile", "flags"),
            config.deterministic or devices.deterministic) else "off",
    )
    return config, devices


def attention_bytes(config, seq_len):
    """An estimate of the attention maps' bytes for a run of `config` on
    sequences of `seq_len`: the training batch's (none where its path
    keeps no maps: `materialises`) or the probe's, which materialises its
    weights, the larger."""
    one_map = 4 * config.num_heads * seq_len * seq_len * (
        _MAPS_PER_LAYER * config.num_layers)
    path = attention_path(seq_len, seq_len, **config.group("attention"))
    train = config.batch_size * one_map if materialises(path) else 0
    return max(train, config.probe_size * one_map)


def model_bytes(config, task):
    """An estimate of the bytes of a run of `config` on `task` besides its
    attention maps, `(weights, activations)`: the weights with their
    gradients and Adam's moments; the data with the activations of the
    projections and the feed-forward network (every layer's of a training
    batch or one layer's of a held-out batch, the larger)."""
    d, heads = config.d_model, config.num_heads
    values = config.value_dim or config.key_dim
    widths = (2 * heads * config.key_dim + 2 * heads * values
              + (config.ff_dim or 0) + 4 * d)
    weights = (task.vocab_size * d + task.seq_len * d
               + config.num_layers * d * widths + d * task.num_classes)
    # The held-out set and a fixed training pool are generated whole, as
    # int32 tokens, targets and weights (`--train-size 2147483647` ended in
    # numpy's MemoryError for 64 GiB).
    data = 3 * task.seq_len * (config.heldout_size + (config.train_size or 0))
    activations = data + task.seq_len * widths * max(
        config.num_layers * config.batch_size,
        min(config.heldout_size, MAX_EVAL_BATCH))
    return weights * _BYTES_PER_WEIGHT, activations * 4


def check_memory(config, task, memory=None):
    """Raises `UsageError` (the estimate, the limit and what to change)
    when a run's attention maps, or its weights and activations, cannot
    fit in `memory` bytes (default: this machine's physical memory).
    `task` may be a sequence length alone: the maps are checked only."""
    if memory is None:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    seq_len = getattr(task, "seq_len", task)
    needed = attention_bytes(config, seq_len)
    if needed > memory:
        raise UsageError(
            f"the attention maps of sequences of {seq_len} need about "
            f"{needed / 2**30:,.1f} GiB (--batch-size {config.batch_size}, "
            f"--probe-size {config.probe_size}, --num-heads "
            f"{config.num_heads}, --num-layers {config.num_layers}), more "
            f"than this machine's {memory / 2**30:,.1f} GiB; shorten the "
            "sequences (--seq-len, --num-pairs), lower --batch-size and "
            "--probe-size, or use --implementation memory_efficient"
        )
    if isinstance(task, int):
        return
    weights, activations = model_bytes(config, task)
    if weights + activations > memory:
        raise UsageError(
            f"the model and its batches need about "
            f"{(weights + activations) / 2**30:,.1f} GiB (weights with "
            f"their gradients and optimizer state {weights / 2**30:,.1f} "
            f"GiB, activations {activations / 2**30:,.1f} GiB), more than "
            f"this machine's {memory / 2**30:,.1f} GiB; lower --d-model, "
            "--num-heads, --key-dim, --value-dim, --ff-dim, --num-layers, "
            "--batch-size, --heldout-size, --train-size or the vocabulary "
            "(--vocab-size, --num-keys, --num-values)"
        )
