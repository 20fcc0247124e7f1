"""The backend-specific part of training: one small module per Keras backend.

Floor 3 (the pipelines). The training loop (`pipelines.train`) is the same
on every backend; what differs is how one step computes its gradients and
applies them, and how the devices are found and shared, as in Keras's own
`keras/src/backend/<name>/trainer.py`:

- `_tensorflow`: `tf.GradientTape` under `tf.function`, over a
  `tf.distribute` strategy (default, mirrored, multi-worker, TPU);
- `_jax`: `model.stateless_call` under `jax.value_and_grad`, then
  `optimizer.stateless_apply`, all in one `jax.jit`, data-parallel over the
  local devices through `keras.distribution`;
- `_torch`: `backward()` and `optimizer.apply`, on one device.

Each module provides `open_devices(strategy)` returning a `Devices`,
`prepare(config)` for process-wide switches, and `Steps(model, optimizer,
task, config, devices)` with `train_step(batch)`, `eval_sums(batch)`,
`sync()` and `reload()`. Only the module of the running backend is
imported (`backend_module(name)`), so TensorFlow is imported only where a
TensorFlow run needs it. This package's `__init__` imports no framework:
the command line reads `BACKENDS` before Keras is imported.
"""

import importlib
from typing import Callable, NamedTuple

BACKENDS = ("tensorflow", "jax", "torch")

_MODULES = {name: f"pipelines.backends._{name}" for name in BACKENDS}


class Devices(NamedTuple):
    """Where a run trains.

    Attributes:
        backend: the Keras backend.
        num_replicas: devices that each take an equal share of the global
            batch (data parallelism over all processes).
        accelerator: `"cpu"`, `"gpu"` or `"tpu"`.
        strategy: the `--strategy` value naming the kind of distribution.
        chief: whether this process writes the run directory.
        shard: `(index, count)`: this process feeds rows
            `[index * n, (index + 1) * n)` of every global batch,
            `n = batch_size // count`.
        scope: `scope()` returns the context in which the model and the
            optimizer are built (their variables placed on the devices).
        device_count: the accelerator devices visible to this process.
        handle: the framework's own object for the distribution (a
            `tf.distribute.Strategy`, a `keras.distribution.Distribution`),
            or `None`.
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


def backend_from_argv(argv):
    """The value of `--backend` in a command line's `argv` when it names one
    of `BACKENDS`, else `None`: read before Keras is imported, which fixes
    its backend (a bad value is left to the argument parser)."""
    for index, arg in enumerate(argv):
        value = (argv[index + 1] if arg == "--backend" and index + 1 < len(argv)
                 else arg.split("=", 1)[1] if arg.startswith("--backend=")
                 else None)
        if value is not None:
            return value if value in BACKENDS else None
    return None


def backend_module(backend):
    """The training module of `backend`, one of `BACKENDS`."""
    # importlib rather than three imports at the top: importing the module
    # of a backend imports its framework, and TensorFlow must stay
    # unimported in a JAX or torch run.
    return importlib.import_module(_MODULES[backend])
