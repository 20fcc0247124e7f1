"""The backend-specific part of training: one small module per Keras backend.

Training is Keras's `fit` on every backend; each module provides
`open_devices(strategy)` returning a `Devices`, `prepare(config)` for
process-wide switches, `feed(batches, devices, count)`, what `fit` reads
of the first `count` of a generator function of this process's batches,
and `adapt_model(model, config, devices)`, what Keras's trainer
needs changed for the run (a train step where Keras's cannot do its
update). Only the running backend's module is imported
(`backend_module`); this `__init__` imports no framework, as the command
line reads `BACKENDS` before Keras is imported.
"""

import importlib
from typing import Callable, NamedTuple

BACKENDS = ("tensorflow", "jax", "torch")


class Devices(NamedTuple):
    """Where a run trains.

    Attributes:
        num_replicas: devices that each take an equal share of the global
            batch (over all processes).
        chief: whether this process writes the run directory.
        shard: `(index, count)`: this process feeds rows
            `[index * n, (index + 1) * n)` of every global batch,
            `n = batch_size // count`.
        scope: `scope()` is the context the model and optimizer are built
            in (their variables placed on the devices).
        device_count: the accelerator devices visible to this process.
        handle: the framework's distribution object, or `None`.
        deterministic: whether the process already runs deterministic ops
            (TensorFlow's op determinism, once on, stays on).
    """

    backend: str
    num_replicas: int
    accelerator: str
    strategy: str
    chief: bool
    shard: tuple
    scope: Callable
    device_count: int
    handle: object
    deterministic: bool = False


def backend_from_argv(argv):
    """The value of `--backend` in `argv` when it names one of `BACKENDS`,
    else `None` (a bad value is left to the argument parser)."""
    for index, arg in enumerate(argv):
        if arg == "--backend" and index + 1 < len(argv):
            value = argv[index + 1]
        elif arg.startswith("--backend="):
            value = arg.split("=", 1)[1]
        else:
            value = None
        if value is not None:
            return value if value in BACKENDS else None
    return None


# What the frameworks read from the environment once, when they start, for
# deterministic kernels: XLA's GPU ops (JAX), cuBLAS's workspace (torch).
XLA_DETERMINISTIC = "--xla_gpu_deterministic_ops=true"
CUBLAS_WORKSPACE = (
    "CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def set_deterministic_environment(argv, environ):
    """With `--deterministic` in `argv`, sets in `environ` what JAX and
    torch read before their first GPU computation, so the process and the
    workers it starts (which inherit it) run deterministic kernels; they
    change nothing on a CPU."""
    if "--deterministic" not in argv:
        return
    flags = environ.get("XLA_FLAGS", "")
    if XLA_DETERMINISTIC not in flags.split():
        environ["XLA_FLAGS"] = f"{flags} {XLA_DETERMINISTIC}".strip()
    environ.setdefault(*CUBLAS_WORKSPACE)


def backend_module(backend):
    """The training module of `backend`, one of `BACKENDS`."""
    # importlib, not three imports at the top: TensorFlow must stay
    # unimported in a JAX or torch run.
    return importlib.import_module(f"{__name__}._{backend}")
