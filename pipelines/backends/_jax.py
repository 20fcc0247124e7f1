"""Devices on JAX: data-parallel through `keras.distribution`, for Keras's
own JAX trainer.

Over several local devices `keras.distribution.DataParallel` replicates the
variables and shards the batch, so `fit`'s step is one SPMD program whose
loss is the global-batch mean. Multi-host runs start JAX's distributed runtime
with `keras.distribution.initialize()` (`KERAS_DISTRIBUTION_*` variables).
"""

import contextlib
import os

import jax
import keras

from keras_attention.scan_steps import scan_train_steps
from pipelines.backends import XLA_DETERMINISTIC
from pipelines.backends import Devices
from pipelines.common import UsageError

# Strategies on JAX: "auto"/"mirrored" shard over every local device,
# "default" keeps one, "multiworker"/"tpu" start the distributed runtime
# first (a TPU pod's hosts are JAX processes).
_MULTI_HOST = ("multiworker", "tpu")


def open_devices(strategy):
    """The `Devices` of `--strategy strategy` on JAX (set once per
    process: a `keras.distribution` is global)."""
    if strategy in _MULTI_HOST and jax.process_count() == 1:
        try:
            keras.distribution.initialize()
        except (ValueError, RuntimeError) as error:
            raise UsageError(
                f"--strategy {strategy}: JAX's distributed runtime did not "
                f"start ({error}); set KERAS_DISTRIBUTION_JOB_ADDRESSES, "
                "KERAS_DISTRIBUTION_NUM_PROCESSES and "
                "KERAS_DISTRIBUTION_PROCESS_ID"
            ) from None
    devices = jax.devices()
    accelerator = {"gpu": "gpu", "cuda": "gpu", "rocm": "gpu",
                   "tpu": "tpu"}.get(devices[0].platform, "cpu")
    count = 1 if strategy == "default" else len(devices)
    distribution = None if count == 1 else keras.distribution.DataParallel(
        devices=keras.distribution.list_devices())
    keras.distribution.set_distribution(distribution)
    scope = (contextlib.nullcontext if distribution is None
             else distribution.scope)
    name = ("default" if count == 1 else
            "multiworker" if jax.process_count() > 1 else "mirrored")
    return Devices(
        backend="jax", num_replicas=count, accelerator=accelerator,
        strategy=name, chief=jax.process_index() == 0,
        shard=(jax.process_index(), jax.process_count()),
        scope=scope, device_count=len(jax.local_devices()),
        handle=distribution,
    )


def prepare(config):
    """Process-wide switches: none, as XLA reads its flags once, when JAX
    starts (`set_deterministic_environment` sets them for the command
    line). A deterministic run on a GPU whose JAX started without them is
    refused; XLA on a CPU is deterministic."""
    if (config.deterministic and jax.default_backend() != "cpu"
            and XLA_DETERMINISTIC not in os.environ.get("XLA_FLAGS", "")):
        raise UsageError(
            f"--deterministic: JAX started without XLA_FLAGS="
            f"{XLA_DETERMINISTIC}; give --deterministic on the command "
            "line (not only in a config file), or set XLA_FLAGS before "
            "JAX starts")


def feed(batches, devices, count):
    """What `fit` reads: the generator of `batches()`, this process's rows
    (Keras places them on the devices and, under `DataParallel`, makes the
    global arrays of them)."""
    del devices, count
    return batches()


def adapt_model(model, config, devices):
    """The steps of one `fit` call in one compiled `lax.scan`
    (`scan_train_steps`: Keras 3.15.1 dispatches one jitted call a step).
    Keras's JAX step does the run's update as it is (one SPMD program:
    the clipping and the loss scaling see the global gradient)."""
    del config, devices
    scan_train_steps(model)
