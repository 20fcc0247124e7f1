"""Training steps on JAX: `stateless_call`, `value_and_grad` and
`stateless_apply` in one `jax.jit`, data-parallel through `keras.distribution`.

The state lives in JAX arrays between steps, as in Keras's JAX trainer;
`sync()` writes it into the Keras variables, `reload()` reads them back.
Over several local devices `keras.distribution.DataParallel` replicates the
variables and shards the batch, so the step is one SPMD program whose loss
is the global-batch mean. Multi-host runs start JAX's distributed runtime
with `keras.distribution.initialize()` (`KERAS_DISTRIBUTION_*` variables).
"""

import contextlib

import jax
import keras
import numpy as np

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
    """Process-wide switches: none on JAX (XLA on CPU is deterministic)."""
    del config


class Steps:
    """The compiled train and evaluation steps of `model` on JAX.

    Args:
        model, optimizer: built in `devices.scope()`, the optimizer for the
            model's trainable variables.
        task: the task; its `weighted_sums` give the loss and accuracy.
        config: the resolved `TrainConfig`.
        devices: the run's `Devices`.
    """

    def __init__(self, model, optimizer, task, config, devices):
        self.model, self.optimizer = model, optimizer
        self._distribution = devices.handle
        scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

        def loss_and_updates(trainable, non_trainable, optimizer_values,
                             tokens, targets, weights):
            logits, non_trainable = model.stateless_call(
                trainable, non_trainable, tokens, training=True
            )
            logits = keras.ops.cast(logits, "float32")
            loss_sum, correct = task.weighted_sums(targets, logits, weights)
            # The sum over the global batch: under SPMD the reduction is
            # global, so this is the gradient of the global-batch mean.
            total = keras.ops.maximum(keras.ops.sum(weights), 1e-12)
            loss = loss_sum / total
            objective = loss
            if scaled:
                mapping = list(zip(optimizer.variables, optimizer_values))
                with keras.StatelessScope(state_mapping=mapping):
                    objective = optimizer.scale_loss(loss)
            return objective, (loss, correct / total, non_trainable)

        gradient = jax.value_and_grad(loss_and_updates, has_aux=True)

        def train_step(state, tokens, targets, weights):
            trainable, non_trainable, optimizer_values = state
            (_, (loss, accuracy, non_trainable)), grads = gradient(
                trainable, non_trainable, optimizer_values, tokens, targets,
                weights,
            )
            trainable, optimizer_values = optimizer.stateless_apply(
                optimizer_values, grads, trainable
            )
            return (trainable, non_trainable, optimizer_values), loss, accuracy

        def eval_sums(state, tokens, targets, weights):
            trainable, non_trainable, _ = state
            logits, _ = model.stateless_call(
                trainable, non_trainable, tokens, training=False
            )
            loss_sum, correct = task.weighted_sums(
                targets, keras.ops.cast(logits, "float32"), weights
            )
            return keras.ops.stack([loss_sum, correct,
                                    keras.ops.sum(weights)])

        if config.jit_compile == "on":
            # The old state's buffers are reused for the new one.
            train_step = jax.jit(train_step, donate_argnums=0)
            eval_sums = jax.jit(eval_sums)
        self._train_step, self._eval_sums = train_step, eval_sums
        self.reload()

    def _put(self, batch):
        """The process's rows of a batch as (sharded) device arrays."""
        if self._distribution is None:
            return tuple(jax.device_put(array) for array in batch)
        return tuple(
            jax.make_array_from_process_local_data(
                self._distribution.get_data_layout(
                    (array.shape[0] * jax.process_count(),)
                    + array.shape[1:]
                ).backend_layout,
                array,
            )
            for array in batch
        )

    def train_step(self, batch):
        """One update on `batch` `(tokens, targets, weights)`; returns the
        global-batch mean loss and accuracy."""
        self._state, loss, accuracy = self._train_step(
            self._state, *self._put(batch)
        )
        self._synced = False
        return loss, accuracy

    def eval_sums(self, batch):
        """`[loss sum, correct sum, weight sum]` of one held-out batch."""
        return np.asarray(self._eval_sums(self._state, *self._put(batch)),
                          np.float64)

    def _variables(self):
        return (self.model.trainable_variables,
                self.model.non_trainable_variables, self.optimizer.variables)

    def sync(self):
        """Writes the state into the Keras variables (once per state)."""
        if self._synced:
            return
        self._synced = True
        for variables, values in zip(self._variables(), self._state):
            for variable, value in zip(variables, values):
                # A copy: the next step donates the state's buffers, which
                # the variables must not share.
                variable.assign(jax.numpy.array(value, copy=True))

    def reload(self):
        """Takes the Keras variables' values as the state."""
        self._state = tuple([variable.value for variable in variables]
                            for variables in self._variables())
        # The variables hold it, but the next step donates its buffers.
        self._synced = False
