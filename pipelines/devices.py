"""Devices: the backend's distribution, the dtype policy and XLA of a run.

`open_run_devices(config)` asks the running backend's module
(`pipelines.backends`) for the run's `Devices`, resolves `"auto"` precision
and `jit_compile` for the accelerator found, checks that the global batch
splits over the replicas, and returns the config with what it resolved.
"""

from pipelines.backends import backend_module
from pipelines.common import UsageError


def resolve_precision(precision, devices):
    """`"auto"`: bfloat16 on TPUs; on GPUs float16 with TensorFlow (loss
    scaling, the path its kernels are tuned for) and bfloat16 with JAX and
    torch (no loss scale to carry in a stateless step; the H200's bf16
    matrix units run at its full rate); float32 on CPUs, where mixed
    precision only adds casts."""
    if precision != "auto":
        return precision
    if devices.accelerator == "tpu":
        return "mixed_bfloat16"
    if devices.accelerator == "gpu":
        return ("mixed_float16" if devices.backend == "tensorflow"
                else "mixed_bfloat16")
    return "float32"


def resolve_jit(jit_compile, devices):
    """Whether the steps are XLA-compiled. TensorFlow `"auto"`: on
    accelerators, where fusing a toy model's small ops pays (on a CPU it
    mostly adds compile time); JAX: always, as Keras's JAX trainer does
    (without `jax.jit` every op dispatches alone); torch: never (eager)."""
    if devices.backend == "torch":
        if jit_compile == "on":
            raise UsageError(
                "--jit-compile on: torch runs train eagerly; use "
                "--jit-compile auto or off, or --backend jax"
            )
        return False
    if jit_compile == "auto":
        return devices.backend == "jax" or devices.accelerator != "cpu"
    return jit_compile == "on"


def check_divisible(config, num_replicas):
    """Raises `UsageError` unless the global batch and the held-out set split
    evenly over `num_replicas`."""
    for name in ("batch_size", "heldout_size"):
        if getattr(config, name) % num_replicas:
            raise UsageError(
                f"--{name.replace('_', '-')} ({getattr(config, name)}) must "
                f"be divisible by the number of replicas ({num_replicas})"
            )


def open_run_devices(config):
    """`(config, devices)`: the run's `Devices` and its config with
    `precision` and `jit_compile` resolved for them.

    Raises:
        UsageError: when the strategy cannot be set up here, or the batch
            does not split over its replicas.
    """
    module = backend_module(config.backend)
    devices = module.open_devices(config.strategy)
    check_divisible(config, devices.num_replicas)
    config = config.replace(
        precision=resolve_precision(config.precision, devices),
        jit_compile="on" if resolve_jit(config.jit_compile, devices) else "off",
    )
    return config, devices
