"""Train a toy attention model on a synthetic task, with attention diagnostics.

    keras-attention train --task recall --key-dim 64 --scale sqrt --steps 1000

A run writes under `--logdir DIR`:

    DIR/config.json        the resolved config (flags, file and task defaults)
    DIR/checkpoints/       tf.train checkpoints; a rerun resumes from the last
    DIR/model.keras        the trained model
    DIR/metrics.json       held-out loss/accuracy, steps, wall time,
                           examples/s, steps to the target accuracy, the
                           diagnostics at step 0 and at the end
    DIR/events.*           config (text), HParams, steps_to_target
    DIR/train/events.*     loss, accuracy, learning_rate, steps/s, examples/s
    DIR/eval/events.*      held-out loss and accuracy, and the attention
                           diagnostics: attention/<layer>/... (heat maps,
                           entropy, max weight, saturation, score std) and
                           gradients/<layer>/... (norms of dL/dW_Q, W_K, W_V
                           and of dL/dscores)

One training step serves every distribution strategy (default, mirrored,
multi-worker, TPU): a `tf.function` calls `strategy.run` on a per-replica
step whose loss is normalised by the global number of scored positions, and
a Keras optimizer all-reduces the gradients. Diagnostics run eagerly on a
host copy of the model, outside compiled code, on the chief only.

A run killed at any point and started again with the same command resumes
from its last checkpoint: the data stream is a pure function of
`(seed, step)`, so the resumed run sees the batches the killed one would
have seen, and steps the killed run already logged are not logged again.
"""

import json
import math
import os
import shutil
import sys
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf

from keras_attention.diagnostics import diagnostics_probe
from keras_attention.diagnostics import write_diagnostics
from keras_attention.models import build_sequence_model
from keras_attention.tasks import make_task
from pipelines.common import UsageError
from pipelines.common import write_json_atomic
from pipelines.config import RUNTIME_FIELDS
from pipelines.config import TrainConfig
from pipelines.config import add_train_arguments
from pipelines.config import config_from_args

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.json"
MODEL_FILE = "model.keras"
CHECKPOINT_DIR = "checkpoints"
TRAIN_LOGS = "train"
EVAL_LOGS = "eval"

# Largest held-out batch per evaluation call.
MAX_EVAL_BATCH = 1024


# ---------------------------------------------------------- command line
def add_arguments(parser):
    """Adds the `train` flags (see `pipelines.config.add_train_arguments`)."""
    add_train_arguments(parser)


def run(args):
    """Runs `keras-attention train` for parsed `args`; returns the exit
    status."""
    config = config_from_args(args)
    metrics = train(config)
    if metrics.get("diverged_at_step") is not None:
        print(
            f"keras-attention train: error: the loss became non-finite at "
            f"step {metrics['diverged_at_step']}; lower --learning-rate or "
            f"set --clip-norm",
            file=sys.stderr,
        )
        return 1
    print(
        f"held-out accuracy {metrics['heldout_accuracy']:.4f}, loss "
        f"{metrics['heldout_loss']:.4f} after {metrics['steps']} steps "
        f"({metrics['wall_time_s']:.1f} s, "
        f"{metrics['examples_per_s']:.0f} examples/s); run in "
        f"{metrics['logdir']}"
    )
    return 0


# ---------------------------------------------------- task, model, optimizer
def build_task(config):
    """The `SequenceTask` of a config (resolved first if needed)."""
    config = config.resolve()
    return make_task(config.task, **config.task_options())


def build_model(config, task=None):
    """Builds the config's model (uninitialised weights come from the
    current global random state; call `keras.utils.set_random_seed` first
    for reproducible weights).

    Args:
        config: a `TrainConfig` (resolved first if needed).
        task: the config's task, if already built.

    Returns:
        A functional `keras.Model` from `tokens` to float32 `logits`.
    """
    config = config.resolve()
    task = build_task(config) if task is None else task
    return build_sequence_model(
        vocab_size=task.vocab_size,
        seq_len=task.seq_len,
        num_classes=task.num_classes,
        d_model=config.d_model,
        num_layers=config.num_layers,
        key_dim=config.key_dim,
        num_heads=config.num_heads,
        value_dim=config.value_dim,
        scale=config.scale,
        qk_norm=config.qk_norm,
        causal=config.causal,
        norm=config.norm,
        ff_dim=config.ff_dim,
        dropout=config.dropout,
        token_factors=task.token_factors,
        qk_init_std=config.qk_init_std,
        qk_init_gain=config.qk_init_gain,
        implementation=config.implementation,
        name=f"{config.task}_model",
    )


@keras.saving.register_keras_serializable(package="keras_attention")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to `peak`, then constant or cosine decay to 0.

    The optimizer calls the schedule with its update count `i` (0 for the
    first update): the rate is `peak * (i + 1) / warmup_steps` during warmup.

    Args:
        peak: learning rate after warmup.
        warmup_steps: number of warmup updates (0 for none).
        total_steps: length of the run (the cosine reaches 0 there).
        decay: `"constant"` or `"cosine"`.
    """

    def __init__(self, peak, warmup_steps, total_steps, decay="constant"):
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.decay = decay

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        rate = keras.ops.convert_to_tensor(self.peak, "float32")
        if self.decay == "cosine":
            span = float(max(self.total_steps - self.warmup_steps, 1))
            progress = keras.ops.clip((step - self.warmup_steps) / span, 0, 1)
            rate = rate * 0.5 * (1.0 + keras.ops.cos(math.pi * progress))
        if self.warmup_steps > 0:
            ramp = keras.ops.minimum((step + 1.0) / self.warmup_steps, 1.0)
            rate = rate * ramp
        return rate

    def get_config(self):
        return {
            "peak": self.peak,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "decay": self.decay,
        }


def build_optimizer(config, num_replicas=1):
    """The config's Keras optimizer with its warmup schedule.

    Gradient clipping is by global norm. Under several replicas the training
    step hands the optimizer each replica's share `g / num_replicas` of the
    global gradient `g` (the optimizer sums the shares), so the clipping
    norm is scaled by the same factor.
    """
    schedule = WarmupSchedule(
        config.learning_rate,
        config.warmup_steps,
        config.steps,
        config.lr_schedule,
    )
    clip = None
    if config.clip_norm is not None:
        clip = config.clip_norm / num_replicas
    weight_decay = config.weight_decay or None
    if config.optimizer == "sgd":
        optimizer = keras.optimizers.SGD(
            schedule,
            momentum=config.momentum,
            weight_decay=weight_decay,
            global_clipnorm=clip,
        )
    elif config.optimizer == "adam":
        optimizer = keras.optimizers.Adam(
            schedule, weight_decay=weight_decay, global_clipnorm=clip
        )
    else:
        optimizer = keras.optimizers.AdamW(
            schedule, weight_decay=config.weight_decay, global_clipnorm=clip
        )
    if config.precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer, schedule


# ------------------------------------------------------------- devices
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


def _accelerator(strategy):
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


def _strategy_name(strategy):
    """The `--strategy` value that names `strategy`'s kind."""
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return "tpu"
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "multiworker"
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return "mirrored"
    return "default"


def _is_chief(strategy):
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


def _eval_batch_size(num_examples, num_replicas):
    """The largest divisor of `num_examples` that is a multiple of
    `num_replicas` and at most `MAX_EVAL_BATCH` (or `num_replicas`)."""
    best = num_replicas
    for size in range(num_replicas, min(num_examples, MAX_EVAL_BATCH) + 1,
                      num_replicas):
        if num_examples % size == 0:
            best = size
    return best


# ------------------------------------------------------------- run dir
def check_resumable(config):
    """Raises `UsageError` when `config.logdir` holds a run with a different
    config (other than the `RUNTIME_FIELDS`)."""
    path = os.path.join(config.logdir, CONFIG_FILE)
    if not os.path.exists(path):
        return
    try:
        with open(path) as handle:
            previous = json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise UsageError(
            f"--logdir {config.logdir}: cannot read {CONFIG_FILE} ({error})"
        ) from None
    current = config.to_dict()
    changed = sorted(
        name
        for name in set(current) | set(previous)
        if name not in RUNTIME_FIELDS
        and previous.get(name) != current.get(name)
    )
    if changed:
        name = changed[0]
        raise UsageError(
            f"--logdir {config.logdir} holds a run with a different config "
            f"({name}: {previous.get(name)!r} there, {current.get(name)!r} "
            f"now); use a new --logdir"
        )


def read_event_scalars(directory):
    """Reads the summaries under `directory` (not recursive).

    Returns:
        `{tag: {step: value}}`, `value` a float for scalar summaries and
        `None` for the others. A record cut short by a crash ends the read of
        its file.
    """
    values = {}
    if not tf.io.gfile.isdir(directory):
        return values
    pattern = os.path.join(directory, "events.out.tfevents.*")
    for path in sorted(tf.io.gfile.glob(pattern)):
        try:
            for event in tf.compat.v1.train.summary_iterator(path):
                for value in event.summary.value:
                    number = None
                    if value.HasField("tensor"):
                        array = tf.make_ndarray(value.tensor)
                        if array.shape == () and array.dtype.kind == "f":
                            number = float(array)
                    elif value.HasField("simple_value"):
                        number = float(value.simple_value)
                    values.setdefault(value.tag, {})[int(event.step)] = number
        except tf.errors.DataLossError:
            continue
    return values


def _last_logged_step(tags):
    steps = [step for by_step in tags.values() for step in by_step]
    return max(steps) if steps else -1


class _LogWriter:
    """A summary writer that skips steps an earlier, killed run of the same
    command already logged, so a resumed run logs each step once."""

    def __init__(self, directory, is_chief):
        self.previous = read_event_scalars(directory) if is_chief else {}
        self.last_logged = _last_logged_step(self.previous)
        self.writer = (
            tf.summary.create_file_writer(directory)
            if is_chief
            else tf.summary.create_noop_writer()
        )

    def wants(self, step):
        """Whether `step` is past everything logged here before."""
        return step > self.last_logged

    def scalars(self, values, step):
        """Logs `{tag: value}` at `step`, each tag only past its last step
        logged before (a kill can land between two tags of one step)."""
        with self.writer.as_default():
            for tag, value in values.items():
                if step > max(self.previous.get(tag, {-1: None})):
                    tf.summary.scalar(tag, value, step=step)

    def flush(self):
        self.writer.flush()

    def close(self):
        self.writer.close()


def _hparams(config):
    """The config's HParams: plain values, one type per name."""
    values = {
        "task": config.task,
        "scale": str(config.scale),
        "key_dim": config.key_dim,
        "num_heads": config.num_heads,
        "d_model": config.d_model,
        "num_layers": config.num_layers,
        "qk_norm": config.qk_norm,
        "optimizer": config.optimizer,
        "learning_rate": float(config.learning_rate),
        "seed": config.seed,
    }
    if config.arm is not None:
        values["arm"] = config.arm
    return values


def _write_run_header(writer, config, hparams_experiment=True):
    """Config as text and as HParams, at step 0 of the root writer."""
    from tensorboard.plugins.hparams import api as hp

    if not writer.wants(0):
        return
    hparams = _hparams(config)
    with writer.writer.as_default():
        if hparams_experiment:
            hp.hparams_config(
                hparams=[hp.HParam(name) for name in hparams],
                metrics=[
                    hp.Metric("accuracy", group=EVAL_LOGS,
                              display_name="heldout_accuracy"),
                    hp.Metric("loss", group=EVAL_LOGS,
                              display_name="heldout_loss"),
                    hp.Metric("steps_to_target",
                              display_name="steps_to_target"),
                ],
            )
        # One session per run directory: runs that share a trial id are
        # merged into one row of the HParams dashboard.
        hp.hparams(hparams, trial_id=os.path.basename(
            os.path.abspath(config.logdir)))
        text = json.dumps(config.to_dict(), indent=2, sort_keys=True)
        tf.summary.text(
            "config", "```\n" + text + "\n```", step=0
        )
    writer.flush()


def _plain(value):
    """numpy values and arrays as JSON-friendly Python values."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    array = np.asarray(value)
    if array.ndim == 0:
        return float(array)
    return array.tolist()


def _diagnostics_record(diagnostics):
    """The JSON part of `probe_diagnostics` output: summary and per-layer
    statistics without the weights and per-row arrays."""
    return {
        "loss": float(diagnostics["loss"]),
        "accuracy": float(diagnostics["accuracy"]),
        "summary": _plain(diagnostics["summary"]),
        "layers": {
            name: _plain({
                key: value
                for key, value in stats.items()
                if key not in ("weights", "entropy_rows")
            })
            for name, stats in diagnostics["layers"].items()
        },
    }


def _summary_from_events(tags, step):
    """The `attention/mean/*` diagnostics summary logged at `step`."""
    prefix = "attention/mean/"
    summary = {
        tag[len(prefix):]: by_step[step]
        for tag, by_step in tags.items()
        if tag.startswith(prefix) and by_step.get(step) is not None
    }
    return {"summary": summary} if summary else None


# --------------------------------------------------------------- train
def train(config, return_model=False, hparams_experiment=True):
    """Trains the config's model on its task and writes the run directory.

    Resumes from the last checkpoint in `config.logdir` when there is one.

    Args:
        config: a `TrainConfig`; `None` fields get the task's defaults.
        return_model: also return the trained model (a copy of the weights
            outside any distribution strategy).
        hparams_experiment: declare this run's HParams experiment. A
            pipeline that trains many runs under one TensorBoard logdir
            (compare) declares one experiment at its root instead:
            TensorBoard reads a single experiment per logdir.

    Returns:
        The metrics dict written to `metrics.json` (on the chief), and with
        `return_model=True` the tuple `(metrics, model)`.

    Raises:
        UsageError: on bad settings, before anything is written.

    Example:

    >>> metrics = train(TrainConfig(task="reverse", steps=500,
    ...                             logdir="runs/reverse"))
    >>> metrics["heldout_accuracy"]
    """
    start_time = time.time()

    # -------- settings: everything is checked before anything is written.
    config = config.resolve()
    task = config.validate()
    strategy = resolve_strategy(config.strategy)
    num_replicas = strategy.num_replicas_in_sync
    for name in ("batch_size", "heldout_size"):
        if getattr(config, name) % num_replicas:
            raise UsageError(
                f"--{name.replace('_', '-')} ({getattr(config, name)}) must "
                f"be divisible by the number of replicas ({num_replicas})"
            )
    accelerator = _accelerator(strategy)
    config = config.replace(
        precision=resolve_precision(config.precision, accelerator),
        jit_compile="on" if resolve_jit(config.jit_compile, accelerator)
        else "off",
    )
    check_resumable(config)
    export_run = _export_hook(config)
    is_chief = _is_chief(strategy)

    if config.deterministic:
        # A process-wide switch; it stays on after the run.
        tf.config.experimental.enable_op_determinism()
    previous_policy = keras.config.dtype_policy()
    try:
        keras.config.set_dtype_policy(config.precision)
        result = _train(
            config, task, strategy, is_chief, export_run, start_time,
            hparams_experiment,
        )
    finally:
        keras.config.set_dtype_policy(previous_policy)
    metrics, model = result
    return (metrics, model) if return_model else metrics


def _export_hook(config):
    """The export pipeline's `export_run(run_dir, path)` when `--export` is
    set, checked before training starts."""
    if config.export is None:
        return None
    try:
        from pipelines import export as export_pipeline
    except ImportError:
        raise UsageError(
            "--export: the export pipeline is not installed"
        ) from None
    return export_pipeline.export_run


def _train(config, task, strategy, is_chief, export_run, start_time,
           hparams_experiment=True):
    logdir = config.logdir
    num_replicas = strategy.num_replicas_in_sync
    global_batch = config.batch_size
    jit_compile = config.jit_compile == "on"
    # The gradients are all-reduced in the step (rather than only inside the
    # optimizer) when the optimizer must see the global gradient: to clip
    # its norm, or to skip a loss-scaled step on every replica alike.
    aggregate_in_step = num_replicas > 1 and (
        config.clip_norm is not None or config.precision == "mixed_float16"
    )
    # The norm of an embedding's sparse gradient is taken over its unsummed
    # slices, wrong when a token repeats in the batch, so clipping takes
    # dense gradients; so does the in-step all-reduce, which then packs the
    # same tensors on every replica.
    densify_gradients = config.clip_norm is not None or aggregate_in_step

    # -------- model and optimizer, identical on every replica and worker.
    with strategy.scope():
        keras.utils.set_random_seed(config.seed)
        model = build_model(config, task)
        optimizer, schedule = build_optimizer(config, num_replicas)
        optimizer.build(model.trainable_variables)
    # A copy outside the strategy for eager diagnostics and saving.
    host_model = build_model(config, task)

    # -------- checkpoint: resume where the last run of this command stopped.
    step_variable = tf.Variable(0, dtype=tf.int64, trainable=False)
    checkpoint = tf.train.Checkpoint(
        model=checkpoint_variables(model),
        optimizer=optimizer,
        step=step_variable,
    )
    checkpoint_dir = os.path.join(logdir, CHECKPOINT_DIR)
    latest = tf.train.latest_checkpoint(checkpoint_dir)
    if latest is not None:
        checkpoint.restore(latest).assert_existing_objects_matched()
    start_step = int(step_variable.numpy())
    # Non-chief workers save too (saving may need every worker) but into a
    # scratch directory, as TensorFlow's multi-worker convention has it.
    save_dir = checkpoint_dir if is_chief else tempfile.mkdtemp(
        prefix="keras-attention-worker-"
    )
    manager = tf.train.CheckpointManager(checkpoint, save_dir, max_to_keep=3)

    if is_chief:
        os.makedirs(logdir, exist_ok=True)
        write_json_atomic(os.path.join(logdir, CONFIG_FILE), config.to_dict())
    root_writer = _LogWriter(logdir, is_chief)
    train_writer = _LogWriter(os.path.join(logdir, TRAIN_LOGS), is_chief)
    eval_writer = _LogWriter(os.path.join(logdir, EVAL_LOGS), is_chief)
    _write_run_header(root_writer, config, hparams_experiment)

    # -------- data: every step's global batch is a function of (seed, step).
    train_data = strategy.distribute_datasets_from_function(
        lambda context: task.dataset(
            global_batch,
            config.seed,
            start_step=start_step,
            input_context=context,
            train_size=config.train_size,
        )
    )
    train_iterator = iter(train_data)
    eval_batch = _eval_batch_size(config.heldout_size, num_replicas)
    eval_data = strategy.distribute_datasets_from_function(
        lambda context: task.heldout_dataset(
            eval_batch,
            num_examples=config.heldout_size,
            seed=config.seed,
            input_context=context,
        )
    )
    heldout = task.heldout(config.heldout_size, config.seed)
    probe = tuple(array[: config.probe_size] for array in heldout)

    # -------- the step: one code path for every strategy.
    def weighted_sums(targets, logits, weights):
        per_position = keras.ops.sparse_categorical_crossentropy(
            targets, logits, from_logits=True
        )
        correct = tf.cast(
            tf.equal(tf.argmax(logits, -1, output_type=tf.int32), targets),
            tf.float32,
        )
        return (
            tf.reduce_sum(per_position * weights),
            tf.reduce_sum(correct * weights),
        )

    def forward_backward(tokens, targets, weights, global_weight):
        with tf.GradientTape() as tape:
            logits = tf.cast(model(tokens, training=True), tf.float32)
            loss_sum, correct = weighted_sums(targets, logits, weights)
            # Dividing by the global weight makes the replicas' summed
            # gradients the gradient of the global-batch mean loss.
            loss = loss_sum / global_weight
            scaled_loss = (
                optimizer.scale_loss(loss)
                if isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
                else loss
            )
        gradients = tape.gradient(scaled_loss, model.trainable_variables)
        return loss, correct / global_weight, gradients

    def densify(gradients):
        if not densify_gradients:
            return gradients
        return [
            tf.reshape(tf.convert_to_tensor(g), v.shape)
            for g, v in zip(gradients, model.trainable_variables)
        ]

    def forward_backward_update(tokens, targets, weights, global_weight):
        loss, accuracy, gradients = forward_backward(
            tokens, targets, weights, global_weight
        )
        optimizer.apply(densify(gradients), model.trainable_variables)
        return loss, accuracy

    # With one replica XLA compiles the whole step, update included, rather
    # than running the optimizer's many small ops one by one outside it.
    # With several, the optimizer's cross-replica update must stay outside
    # the compiled cluster.
    update_in_xla = jit_compile and num_replicas == 1
    if update_in_xla:
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
            context.all_reduce(
                tf.distribute.ReduceOp.SUM, tf.reduce_sum(weights)
            ),
            1e-12,
        )
        # With one replica (so always under update_in_xla) nothing is
        # aggregated here.
        if not aggregate_in_step:
            return forward_backward_update(
                tokens, targets, weights, global_weight
            )
        loss, accuracy, gradients = forward_backward(
            tokens, targets, weights, global_weight
        )
        gradients = context.all_reduce(
            tf.distribute.ReduceOp.SUM, densify(gradients)
        )
        gradients = [g / num_replicas for g in gradients]
        optimizer.apply(gradients, model.trainable_variables)
        return loss, accuracy

    @tf.function(autograph=False)
    def train_step(iterator):
        tokens, targets, weights = next(iterator)
        loss, accuracy = strategy.run(
            replica_step, args=(tokens, targets, weights)
        )
        return (
            strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None),
            strategy.reduce(tf.distribute.ReduceOp.SUM, accuracy, axis=None),
        )

    def replica_eval(tokens, targets, weights):
        logits = tf.cast(model(tokens, training=False), tf.float32)
        loss_sum, correct = weighted_sums(targets, logits, weights)
        return loss_sum, correct, tf.reduce_sum(weights)

    @tf.function(autograph=False)
    def eval_step(batch):
        sums = strategy.run(replica_eval, args=batch)
        return [
            strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)
            for value in sums
        ]

    def evaluate():
        totals = np.zeros(3)
        for batch in eval_data:
            totals += np.array([float(value) for value in eval_step(batch)])
        weight = max(totals[2], 1e-12)
        return totals[0] / weight, totals[1] / weight

    # Compiled once per run: eager probing cost about 3x more per call.
    probe_host_model = diagnostics_probe(host_model)

    def diagnose(step):
        host_model.set_weights(model.get_weights())
        diagnostics = probe_host_model(*probe)
        if eval_writer.wants(step):
            write_diagnostics(diagnostics, step, eval_writer.writer)
        return _diagnostics_record(diagnostics)

    # -------- state carried over from the run this one resumes.
    eval_tags = eval_writer.previous
    history = [
        (step, value)
        for step, value in sorted(eval_tags.get("accuracy", {}).items())
        if 0 < start_step and step <= start_step and value is not None
    ]
    diagnostics_init = (
        _summary_from_events(eval_tags, 0) if start_step > 0 else None
    )
    diagnostics_final = None
    heldout_loss = heldout_accuracy = None

    def run_evaluation(step):
        nonlocal heldout_loss, heldout_accuracy
        heldout_loss, heldout_accuracy = evaluate()
        if history and history[-1][0] == step:
            history.pop()  # Re-measured at the end of a finished run.
        history.append((step, heldout_accuracy))
        eval_writer.scalars(
            {"loss": heldout_loss, "accuracy": heldout_accuracy}, step
        )

    def save_checkpoint(step):
        step_variable.assign(step)
        # Events first: once the checkpoint exists, everything logged up to
        # its step is on disk.
        for writer in (train_writer, eval_writer, root_writer):
            writer.flush()
        manager.save(checkpoint_number=step)

    # -------- the loop.
    progbar = keras.utils.Progbar(
        config.steps,
        verbose=config.verbose if is_chief else 0,
        stateful_metrics=["loss", "accuracy", "heldout_accuracy", "steps/s"],
        unit_name="step",
    )
    progbar.update(min(start_step, config.steps))

    step = start_step
    if start_step == 0:
        run_evaluation(0)
        if is_chief:
            diagnostics_init = diagnose(0)
    window_losses, window_accuracies = [], []
    window_start, paused = time.time(), 0.0
    loop_start, loop_paused = time.time(), 0.0
    first_step_time = None
    diverged_at = None
    while step < config.steps:
        loss, accuracy = train_step(train_iterator)
        if first_step_time is None:
            float(loss)  # Waits for the first step: tracing, compiling.
            first_step_time = time.time() - loop_start
        step += 1
        window_losses.append(loss)
        window_accuracies.append(accuracy)

        if step % config.log_every == 0 or step == config.steps:
            mean_loss = float(np.mean([float(x) for x in window_losses]))
            mean_accuracy = float(
                np.mean([float(x) for x in window_accuracies])
            )
            elapsed = max(time.time() - window_start - paused, 1e-9)
            steps_per_second = len(window_losses) / elapsed
            train_writer.scalars(
                {
                    "loss": mean_loss,
                    "accuracy": mean_accuracy,
                    "learning_rate": float(schedule(step - 1)),
                    "steps_per_second": steps_per_second,
                    "examples_per_second": steps_per_second * global_batch,
                },
                step,
            )
            progbar.update(
                step,
                values=[
                    ("loss", round(mean_loss, 4)),
                    ("accuracy", round(mean_accuracy, 4)),
                    ("steps/s", round(steps_per_second, 1)),
                ],
            )
            window_losses, window_accuracies = [], []
            window_start, paused = time.time(), 0.0
            if not math.isfinite(mean_loss):
                diverged_at = step
                break

        pause_start = time.time()
        if step % config.eval_every == 0 or step == config.steps:
            run_evaluation(step)
            progbar.update(
                step, values=[("heldout_accuracy", round(heldout_accuracy, 4))]
            )
        if is_chief and (
            step % config.diagnostics_every == 0 or step == config.steps
        ):
            diagnostics_final = diagnose(step)
        if step % config.checkpoint_every == 0 or step == config.steps:
            save_checkpoint(step)
        pause = time.time() - pause_start
        paused += pause
        loop_paused += pause
    train_time = max(time.time() - loop_start - loop_paused, 1e-9)
    steps_run = step - start_step
    # Throughput leaves out the first step, which traces and compiles.
    if steps_run > 1 and train_time > first_step_time:
        steps_per_second = (steps_run - 1) / (train_time - first_step_time)
    else:
        steps_per_second = steps_run / train_time

    # -------- the end: a run that was already complete is only re-measured.
    if diverged_at is None:
        if heldout_accuracy is None or history[-1][0] != step:
            run_evaluation(step)
        if is_chief and diagnostics_final is None:
            diagnostics_final = diagnose(step)
        host_model.set_weights(model.get_weights())
        if is_chief:
            _save_model(host_model, os.path.join(logdir, MODEL_FILE))

    steps_to_target = next(
        (s for s, accuracy in history if accuracy >= config.target_accuracy),
        None,
    )
    if steps_to_target is not None and is_chief:
        root_writer.scalars({"steps_to_target": float(steps_to_target)}, step)
    for writer in (train_writer, eval_writer, root_writer):
        writer.close()
    if not is_chief:
        shutil.rmtree(save_dir, ignore_errors=True)

    metrics = {
        "task": config.task,
        "arm": config.arm,
        "logdir": logdir,
        "heldout_loss": heldout_loss,
        "heldout_accuracy": heldout_accuracy,
        "steps": step,
        "resumed_from_step": start_step,
        "wall_time_s": time.time() - start_time,
        "train_time_s": train_time,
        "first_step_time_s": first_step_time,
        "steps_per_s": steps_per_second,
        "examples_per_s": steps_per_second * global_batch,
        "steps_to_target": steps_to_target,
        "target_accuracy": config.target_accuracy,
        "eval_history": [[s, accuracy] for s, accuracy in history],
        "diagnostics": {
            "init": diagnostics_init,
            "final": diagnostics_final,
        },
        "num_replicas": num_replicas,
        "strategy": _strategy_name(strategy),
        "precision": config.precision,
        "jit_compile": config.jit_compile == "on",
        "diverged_at_step": diverged_at,
    }
    if is_chief:
        write_json_atomic(os.path.join(logdir, METRICS_FILE), metrics)
        if export_run is not None and diverged_at is None:
            export_run(logdir, config.export)
    return metrics, host_model


def checkpoint_variables(model):
    """The model's variables keyed by path, for `tf.train.Checkpoint`.

    A Keras 3 functional model keeps its layers in Keras' own containers,
    which `tf.train.Checkpoint` does not traverse; naming every variable
    explicitly makes checkpoints hold all of them (non-trainable ones too).
    """
    variables = {variable.path: variable for variable in model.variables}
    if len(variables) != len(model.variables):
        raise ValueError(
            f"`model` {model.name!r} has variables with the same path; "
            "give its layers unique names."
        )
    return variables


def _save_model(model, path):
    """`model.save(path)` through a temporary file and a rename."""
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(
        prefix=".tmp-", suffix=".keras", dir=directory
    )
    os.close(handle)
    try:
        model.save(temporary, overwrite=True)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def restore_model(run_dir):
    """The trained model of a run directory.

    Loads `run_dir/model.keras` when the run finished, else rebuilds the
    model from `run_dir/config.json` and restores the latest checkpoint.

    Args:
        run_dir: a directory written by `train`.

    Returns:
        A `keras.Model`.

    Raises:
        UsageError: when `run_dir` holds neither a model nor a checkpoint.
    """
    model_path = os.path.join(run_dir, MODEL_FILE)
    if os.path.exists(model_path):
        return keras.saving.load_model(model_path)
    config_path = os.path.join(run_dir, CONFIG_FILE)
    latest = tf.train.latest_checkpoint(os.path.join(run_dir, CHECKPOINT_DIR))
    if not os.path.exists(config_path) or latest is None:
        raise UsageError(
            f"{run_dir} holds no trained run ({MODEL_FILE}, or {CONFIG_FILE} "
            f"with {CHECKPOINT_DIR}/)"
        )
    with open(config_path) as handle:
        config = TrainConfig.from_dict(json.load(handle), source=config_path)
    model = build_model(config)
    status = tf.train.Checkpoint(model=checkpoint_variables(model)).restore(
        latest
    )
    status.expect_partial().assert_existing_objects_matched()
    return model
