"""Devices on TensorFlow, for Keras's own TensorFlow trainer: a
`tf.distribute` strategy (default, mirrored, multi-worker or TPU), the data
`fit` reads under it, and the train step where Keras's cannot clip or
scale the loss across replicas.

Every process computes the global batch of a step and each replica takes
its rows of it, so the data are the same whatever the strategy.
"""

import itertools
import json
import os

import numpy as np
import tensorflow as tf
# Where Keras reads it (`trainers/trainer.py`, `model_supports_jit`).
from tensorflow.python.framework import config as tf_config

from pipelines.backends import Devices
from pipelines.common import UsageError

# The most bytes of batches `feed` holds in memory (the default comparison's
# 1000 steps: 25 MB).
IN_MEMORY_BYTES = 512 * 2**20

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
        deterministic=tf_config.is_op_determinism_enabled(),
    )


def prepare(config):
    """Process-wide switches: TensorFlow's op determinism (it stays on)."""
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()


def feed(batches, devices, count):
    """What `fit` reads of the first `count` of `batches()` (global
    batches): on one replica, a dataset of them in memory when they take
    at most `IN_MEMORY_BYTES`, else their generator; over several
    replicas, a distributed dataset in which replica `r` of the global
    batch's `R` takes rows `[r * n, (r + 1) * n)`, on every worker alike
    (each builds the global batch).

    In memory because a Python generator reaches TensorFlow through a
    `PyFunc` op (`Dataset.from_generator`, as `fit` feeds one), and once a
    function holding one has run, this process's compiled steps run
    slower: on 2 CPU cores the comparison's XLA step went from 44.8 to
    34.7 steps/s, for the rest of the process, after one; a dataset of
    tensors changed nothing (49.4, 47.9).
    """
    strategy = devices.handle
    replicas = strategy.num_replicas_in_sync
    if replicas == 1:
        first = next(batches())
        if count * sum(array.nbytes for array in first) > IN_MEMORY_BYTES:
            return batches()
        return tf.data.Dataset.from_tensor_slices(tuple(
            np.stack(arrays) for arrays in
            zip(*itertools.islice(batches(), count))))
    first = next(batches())
    rows = first[0].shape[0] // replicas
    signature = tuple(tf.TensorSpec((rows,) + array.shape[1:], array.dtype)
                      for array in first)

    def dataset(context):
        local = replicas // context.num_input_pipelines
        replica = context.input_pipeline_id * local

        def replica_rows():
            # The pipeline's replicas take its elements in turn.
            for batch in batches():
                for index in range(replica, replica + local):
                    yield tuple(array[index * rows:(index + 1) * rows]
                                for array in batch)

        return tf.data.Dataset.from_generator(
            replica_rows, output_signature=signature)

    return strategy.distribute_datasets_from_function(dataset)


def adapt_model(model, config, devices):
    """Fits Keras's TensorFlow trainer to the run: its train step where
    Keras's cannot do the run's update (`_train_step`); under
    `MultiWorkerMirroredStrategy`, its symbolic build from zeros of the
    model's input shape: Keras 3.15's own first reduces a
    distributed batch across the workers, which fails there ("Attempt to
    convert a value (PerReplica...) to a Tensor"), in `fit` and `evaluate`
    alike, and needs only the shapes; and steps whose logs are vectors of
    one value: Keras reduces a step's logs over the workers along their
    axis 0, which a scalar lacks ("Invalid reduction dimension 0"); the
    logs are the metrics' results, the same on every replica."""
    step = _train_step(config, devices)
    if step is not None:
        # An instance attribute, as a subclass's method would be: the model
        # stays the plain functional one that is saved.
        model.train_step = step.__get__(model)
    if isinstance(devices.handle, tf.distribute.MultiWorkerMirroredStrategy):
        # One example of the shapes the model takes: tokens, targets and
        # weights are all `(batch, seq_len)`.
        shape = (1,) + tuple(size or 1 for size in model.inputs[0].shape[1:])
        batch = (np.zeros(shape, "int32"), np.zeros(shape, "int32"),
                 np.zeros(shape, "float32"))
        model._maybe_symbolic_build = (  # noqa: SLF001
            lambda iterator=None, data_batch=None: model._symbolic_build(
                data_batch=batch))
        model.train_step = _vector_logs(model.train_step)
        model.test_step = _vector_logs(model.test_step)


def _vector_logs(step):
    def vector_step(data):
        return {name: tf.reshape(value, (1,))
                for name, value in step(data).items()}

    return vector_step


def _train_step(config, devices):
    """The train step for `fit` where Keras's cannot do the run's update,
    else `None`.

    Keras clips each replica's gradient before the optimizer all-reduces
    them, and takes the norm of an embedding's sparse gradient over its
    unsummed slices (wrong when a token repeats in the batch: 9% of a
    clipped step on a 4-token check); its loss scaling would check each
    replica's own gradient. With `--clip-norm`, or `mixed_float16` over
    several replicas, this step densifies the gradients and all-reduces
    them first, so the optimizer clips and checks the global gradient
    (each replica hands it `g / R`, which it sums again; its clip norm is
    scaled alike by `build_optimizer`).
    """
    replicas = devices.num_replicas
    if config.clip_norm is None and not (
            replicas > 1 and config.precision == "mixed_float16"):
        return None

    def train_step(model, data):
        x, y, sample_weight = data
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(x=x, y=y, y_pred=y_pred,
                                      sample_weight=sample_weight,
                                      training=True)
            scaled = model.optimizer.scale_loss(loss)
        gradients = [
            tf.reshape(tf.convert_to_tensor(gradient), variable.shape)
            for gradient, variable in zip(
                tape.gradient(scaled, model.trainable_variables),
                model.trainable_variables)]
        if replicas > 1:
            context = tf.distribute.get_replica_context()
            gradients = [gradient / replicas for gradient in
                         context.all_reduce(tf.distribute.ReduceOp.SUM,
                                            gradients)]
        model.optimizer.apply(gradients, model.trainable_variables)
        for metric in model.metrics:
            if metric.name == "loss":
                # As Keras's step: the replicas' mean of `R` times theirs.
                metric.update_state(loss * replicas,
                                    sample_weight=tf.shape(x)[0])
        return model.compute_metrics(x, y, y_pred,
                                     sample_weight=sample_weight)

    return train_step
