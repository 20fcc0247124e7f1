"""Training steps on torch: `backward()` and `optimizer.apply`, on one device
(the first GPU, else the CPU): Keras's distribution API for torch is not in
a release. The variables are updated in place: `sync()` and `reload()`
have nothing to do.
"""

import contextlib

import keras
import numpy as np
import torch

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
    """Process-wide switches: deterministic kernels when asked for."""
    if config.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)


class Steps:
    """The eager train and evaluation steps of `model` on torch (arguments
    as for `pipelines.backends._jax.Steps`)."""

    def __init__(self, model, optimizer, task, config, devices):
        del config, devices
        self.model, self.optimizer, self.task = model, optimizer, task
        self._scaled = isinstance(optimizer,
                                  keras.optimizers.LossScaleOptimizer)

    def train_step(self, batch):
        """One update on `batch`; returns the mean loss and accuracy."""
        tokens, targets, weights = (keras.ops.convert_to_tensor(array)
                                    for array in batch)
        self.model.zero_grad()
        logits = keras.ops.cast(self.model(tokens, training=True), "float32")
        loss_sum, correct = self.task.weighted_sums(targets, logits, weights)
        total = keras.ops.maximum(keras.ops.sum(weights), 1e-12)
        loss = loss_sum / total
        objective = self.optimizer.scale_loss(loss) if self._scaled else loss
        objective.backward()
        variables = self.model.trainable_variables
        gradients = [variable.value.grad for variable in variables]
        with torch.no_grad():
            self.optimizer.apply(gradients, variables)
        return loss.detach(), (correct / total).detach()

    def eval_sums(self, batch):
        """`[loss sum, correct sum, weight sum]` of one held-out batch."""
        tokens, targets, weights = (keras.ops.convert_to_tensor(array)
                                    for array in batch)
        with torch.no_grad():
            logits = keras.ops.cast(self.model(tokens, training=False),
                                    "float32")
            loss_sum, correct = self.task.weighted_sums(targets, logits,
                                                        weights)
        return np.array([float(loss_sum), float(correct),
                         float(np.sum(batch[2]))])

    def sync(self):
        """Nothing to do: the variables are updated in place."""

    def reload(self):
        """Nothing to do: the step reads the variables themselves."""
