"""Training steps on TensorFlow: `tf.GradientTape` under `tf.function`, over
a `tf.distribute` strategy (default, mirrored, multi-worker or TPU).

Every process computes the global batch of a step and each replica takes
its rows of it, so the data are the same whatever the strategy. The
variables are TensorFlow's own, updated in place: `sync()` and `reload()`
have nothing to do.
"""

import json
import os

import keras
import numpy as np
import tensorflow as tf

from pipelines.backends import Devices
from pipelines.common import UsageError

# Created once per process and reused by later runs: a multi-worker cluster
# or a TPU system can be set up only once, and two mirrored strategies over
# the same devices would number their collective operations alike and
# clash.
_STRATEGIES = {}


def _strategy(name):
    if name not in _STRATEGIES:
        _STRATEGIES[name] = _create_strategy(name)
    return _STRATEGIES[name]


def _create_strategy(name):
    if name == "auto":
        resolver = _find_tpu()
        if resolver is not None:
            _STRATEGIES["tpu"] = _tpu_strategy(resolver)
            return _STRATEGIES["tpu"]
        if len(tf.config.list_logical_devices("GPU")) > 1:
            return _strategy("mirrored")
    if name in ("auto", "default"):
        return tf.distribute.get_strategy()
    if name == "mirrored":
        devices = (tf.config.list_logical_devices("GPU")
                   or tf.config.list_logical_devices("CPU"))
        return tf.distribute.MirroredStrategy(
            devices=[device.name for device in devices])
    if name == "multiworker":
        cluster = json.loads(os.environ.get("TF_CONFIG") or "{}")
        if not cluster.get("cluster"):
            raise UsageError(
                "--strategy multiworker needs TF_CONFIG describing the "
                "cluster and this worker's task"
            )
        return tf.distribute.MultiWorkerMirroredStrategy()
    resolver = _find_tpu()
    if resolver is None:
        raise UsageError("--strategy tpu: no TPU found")
    return _tpu_strategy(resolver)


def _find_tpu():
    try:
        return tf.distribute.cluster_resolver.TPUClusterResolver()
    except (ValueError, RuntimeError, ImportError, KeyError):
        return None


def _tpu_strategy(resolver):
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def _accelerator(strategy):
    kind = _strategy_name(strategy)
    if kind == "tpu":
        return "tpu"
    # The default strategy has no device list; it places ops on the first
    # GPU when there is one.
    devices = ([device.name for device in tf.config.list_logical_devices()]
               if kind == "default" else strategy.extended.worker_devices)
    return "gpu" if any("GPU" in d.upper() for d in devices) else "cpu"


def _strategy_name(strategy):
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return "tpu"
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "multiworker"
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return "mirrored"
    return "default"


def _is_chief(strategy):
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(
        strategy, tf.distribute.MultiWorkerMirroredStrategy
    ):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    return task_type in (None, "chief") or (
        task_type == "worker" and task_id == 0
        and "chief" not in resolver.cluster_spec().as_dict()
    )


def open_devices(strategy):
    """The `Devices` of `--strategy strategy` on TensorFlow: `"auto"` picks
    a TPU when one is found, mirrored over several GPUs, else the default
    strategy; `"mirrored"` is over the GPUs or the logical CPUs."""
    strategy = _strategy(strategy)
    return Devices(
        backend="tensorflow",
        num_replicas=strategy.num_replicas_in_sync,
        accelerator=_accelerator(strategy),
        strategy=_strategy_name(strategy),
        chief=_is_chief(strategy),
        # Every worker builds the global batch; replicas slice it.
        shard=(0, 1),
        scope=lambda: strategy.scope(),
        device_count=max(len(tf.config.list_logical_devices("GPU")), 1),
        handle=strategy,
    )


def prepare(config):
    """Process-wide switches: TensorFlow's op determinism (it stays on)."""
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()


class Steps:
    """The compiled train and evaluation steps of `model` on TensorFlow
    (arguments as for `pipelines.backends._jax.Steps`)."""

    def __init__(self, model, optimizer, task, config, devices):
        strategy = devices.handle
        self._strategy = strategy
        self._replicas = strategy.num_replicas_in_sync
        self._train_step = _make_train_step(model, optimizer, task, strategy,
                                            config)
        self._eval_step = _make_eval_step(model, task, strategy)

    def _distribute(self, batch):
        """The replicas' rows of a global batch."""
        if self._replicas == 1:
            return tuple(tf.convert_to_tensor(array) for array in batch)
        rows = batch[0].shape[0] // self._replicas

        def replica_rows(context):
            start = context.replica_id_in_sync_group * rows
            return tuple(array[start:start + rows] for array in batch)

        return self._strategy.experimental_distribute_values_from_function(
            replica_rows
        )

    def train_step(self, batch):
        """One update on the global `batch`; returns the mean loss and
        accuracy."""
        return self._train_step(self._distribute(batch))

    def eval_sums(self, batch):
        """`[loss sum, correct sum, weight sum]` of one held-out batch."""
        return np.array([float(value) for value in
                         self._eval_step(self._distribute(batch))])

    def sync(self):
        """Nothing to do: the variables are updated in place."""

    def reload(self):
        """Nothing to do: the step reads the variables themselves."""


def _make_train_step(model, optimizer, task, strategy, config):
    num_replicas = strategy.num_replicas_in_sync
    jit_compile = config.jit_compile == "on"
    # The gradients are all-reduced in the step (rather than only inside the
    # optimizer) when the optimizer must see the global gradient: to clip
    # its norm, or to skip a loss-scaled step on every replica alike.
    aggregate_in_step = num_replicas > 1 and (
        config.clip_norm is not None or config.precision == "mixed_float16"
    )
    # The norm of an embedding's sparse gradient is taken over its unsummed
    # slices, wrong when a token repeats in the batch, so clipping takes
    # dense gradients; so does the in-step all-reduce.
    densify_gradients = config.clip_norm is not None or aggregate_in_step
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

    def forward_backward(tokens, targets, weights, global_weight):
        with tf.GradientTape() as tape:
            logits = tf.cast(model(tokens, training=True), tf.float32)
            loss_sum, correct = task.weighted_sums(targets, logits, weights)
            # Dividing by the global weight makes the replicas' summed
            # gradients the gradient of the global-batch mean loss.
            loss = loss_sum / global_weight
            objective = optimizer.scale_loss(loss) if scaled else loss
        gradients = tape.gradient(objective, model.trainable_variables)
        return loss, correct / global_weight, gradients

    def densify(gradients):
        if not densify_gradients:
            return gradients
        return [tf.reshape(tf.convert_to_tensor(g), v.shape)
                for g, v in zip(gradients, model.trainable_variables)]

    def forward_backward_update(tokens, targets, weights, global_weight):
        loss, accuracy, gradients = forward_backward(
            tokens, targets, weights, global_weight
        )
        optimizer.apply(densify(gradients), model.trainable_variables)
        return loss, accuracy

    # With one replica XLA compiles the whole step, update included; with
    # several, the optimizer's cross-replica update stays outside it.
    if jit_compile and num_replicas == 1:
        forward_backward_update = tf.function(
            forward_backward_update, jit_compile=True, autograph=False
        )
    elif jit_compile:
        forward_backward = tf.function(
            forward_backward, jit_compile=True, autograph=False
        )

    def replica_step(tokens, targets, weights):
        context = tf.distribute.get_replica_context()
        global_weight = tf.maximum(
            context.all_reduce(tf.distribute.ReduceOp.SUM,
                               tf.reduce_sum(weights)),
            1e-12,
        )
        if not aggregate_in_step:
            return forward_backward_update(tokens, targets, weights,
                                           global_weight)
        loss, accuracy, gradients = forward_backward(
            tokens, targets, weights, global_weight
        )
        gradients = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                       densify(gradients))
        gradients = [g / num_replicas for g in gradients]
        optimizer.apply(gradients, model.trainable_variables)
        return loss, accuracy

    @tf.function(autograph=False)
    def train_step(batch):
        loss, accuracy = strategy.run(replica_step, args=batch)
        return (
            strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None),
            strategy.reduce(tf.distribute.ReduceOp.SUM, accuracy, axis=None),
        )

    return train_step


def _make_eval_step(model, task, strategy):
    def replica_eval(tokens, targets, weights):
        logits = tf.cast(model(tokens, training=False), tf.float32)
        loss_sum, correct = task.weighted_sums(targets, logits, weights)
        return loss_sum, correct, tf.reduce_sum(weights)

    @tf.function(autograph=False)
    def eval_step(batch):
        sums = strategy.run(replica_eval, args=batch)
        return [strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)
                for value in sums]

    return eval_step
