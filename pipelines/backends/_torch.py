"""Devices on torch, for Keras's own torch trainer: one device (the first
GPU, else the CPU): Keras's distribution API for torch is not in a release.
"""

import contextlib
import os

import torch

from pipelines.backends import CUBLAS_WORKSPACE
from pipelines.backends import Devices
from pipelines.common import UsageError


def open_devices(strategy):
    """The one-device `Devices` of a torch run."""
    if strategy not in ("auto", "default"):
        raise UsageError(
            f"--strategy {strategy}: torch runs train on one device (Keras's "
            "distribution API for torch is not in a release yet); use "
            "--strategy auto, or --backend jax or tensorflow"
        )
    gpus = torch.cuda.device_count()
    return Devices(
        backend="torch", num_replicas=1,
        accelerator="gpu" if gpus else "cpu", strategy="default",
        chief=True, shard=(0, 1), scope=contextlib.nullcontext,
        device_count=max(gpus, 1), handle=None,
    )


def prepare(config):
    """Process-wide switches: torch's deterministic algorithms when asked
    for, an op without one raising rather than warning (on a GPU cuBLAS
    needs its workspace set before its first matmul)."""
    if config.deterministic:
        os.environ.setdefault(*CUBLAS_WORKSPACE)
        torch.use_deterministic_algorithms(True)


def feed(batches, devices, count):
    """What `fit` reads: the generator of `batches()`."""
    del devices, count
    return batches()


def adapt_model(model, config, devices):
    """Nothing: Keras's torch trainer does the run's update as it is."""
    del model, config, devices
