"""Devices: the distribution strategy, the dtype policy, XLA and the chief.

`resolve_strategy(name)` creates (once per process) the strategy that
`--strategy` names; `resolve_precision` and `resolve_jit` turn `"auto"` into
what suits the accelerator the strategy runs on; `is_chief` says whether
this process writes the run directory.
"""

import json
import os

import tensorflow as tf

from pipelines.common import UsageError


def resolve_strategy(name):
    """Creates the `tf.distribute.Strategy` for `--strategy name`.

    `"auto"` picks a TPU when a TPU cluster resolver finds one, a
    `MirroredStrategy` when more than one GPU is visible, else the default
    strategy. `"mirrored"` mirrors over the GPUs, or over the logical CPU
    devices when there is no GPU. `"multiworker"` reads the cluster from
    `TF_CONFIG`.

    Strategies are created once per process and reused by later runs: a
    multi-worker cluster or a TPU system can be set up only once, and two
    mirrored strategies over the same devices would number their collective
    operations from the same start and clash.

    Raises:
        UsageError: when the requested strategy cannot be set up here.
    """
    if name not in _STRATEGIES:
        _STRATEGIES[name] = _create_strategy(name)
    return _STRATEGIES[name]


_STRATEGIES = {}


def _create_strategy(name):
    if name == "auto":
        tpu_resolver = _find_tpu()
        if tpu_resolver is not None:
            _STRATEGIES["tpu"] = _tpu_strategy(tpu_resolver)
            return _STRATEGIES["tpu"]
        if len(tf.config.list_logical_devices("GPU")) > 1:
            return resolve_strategy("mirrored")
        return tf.distribute.get_strategy()
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        devices = tf.config.list_logical_devices("GPU") or (
            tf.config.list_logical_devices("CPU")
        )
        return tf.distribute.MirroredStrategy(
            devices=[device.name for device in devices]
        )
    if name == "multiworker":
        cluster = json.loads(os.environ.get("TF_CONFIG") or "{}")
        if not cluster.get("cluster"):
            raise UsageError(
                "--strategy multiworker needs TF_CONFIG describing the cluster "
                "and this worker's task"
            )
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "tpu":
        resolver = _find_tpu()
        if resolver is None:
            raise UsageError("--strategy tpu: no TPU found")
        return _tpu_strategy(resolver)
    raise UsageError(f"--strategy: unknown strategy {name!r}")


def _find_tpu():
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
    except (ValueError, RuntimeError, ImportError, KeyError):
        return None
    return resolver


def _tpu_strategy(resolver):
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def accelerator(strategy):
    """`"tpu"`, `"gpu"` or `"cpu"`: where the replicas run."""
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return "tpu"
    try:
        devices = strategy.extended.worker_devices
    except (RuntimeError, NotImplementedError):
        # The default strategy has no device list; it places ops on the
        # first GPU when there is one.
        devices = [device.name for device in tf.config.list_logical_devices()]
    if any("GPU" in device.upper() for device in devices):
        return "gpu"
    return "cpu"


def resolve_precision(precision, accelerator):
    """`"auto"`: bfloat16 on TPUs, float16 on GPUs that have tensor cores
    (compute capability 7.0 or newer), float32 elsewhere, where mixed
    precision would only add casts."""
    if precision != "auto":
        return precision
    if accelerator == "tpu":
        return "mixed_bfloat16"
    if accelerator == "gpu":
        gpus = tf.config.list_physical_devices("GPU")
        details = tf.config.experimental.get_device_details(gpus[0])
        if details.get("compute_capability", (0, 0)) >= (7, 0):
            return "mixed_float16"
    return "float32"


def resolve_jit(jit_compile, accelerator):
    """`"auto"`: XLA on accelerators, where fusing the small ops of a toy
    model pays; on a CPU it mostly adds compile time."""
    if jit_compile == "auto":
        return accelerator != "cpu"
    return jit_compile == "on"


def strategy_name(strategy):
    """The `--strategy` value that names `strategy`'s kind."""
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return "tpu"
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "multiworker"
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return "mirrored"
    return "default"


def is_chief(strategy):
    """Whether this process writes the run (worker 0 or the chief)."""
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


def check_divisible(config, num_replicas):
    """Raises `UsageError` unless the global batch and the held-out set split
    evenly over `num_replicas`."""
    for name in ("batch_size", "heldout_size"):
        if getattr(config, name) % num_replicas:
            raise UsageError(
                f"--{name.replace('_', '-')} ({getattr(config, name)}) must "
                f"be divisible by the number of replicas ({num_replicas})"
            )
