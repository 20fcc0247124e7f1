"""The compiled steps: one train step and one evaluation for every strategy.

`make_train_step` returns a `tf.function` that calls `strategy.run` on a
per-replica step whose loss is normalised by the global number of scored
positions; the Keras optimizer all-reduces the gradients, or the step does
when the optimizer must see the global gradient (clipping, loss scaling).
`make_evaluate` returns the held-out loss and accuracy over a distributed
dataset; `make_diagnose` the compiled attention-diagnostics probe.
`build_parts` builds a run's model, optimizer and compiled functions in one
`Parts`, which a sweep may keep for the next run of the same shapes.
"""

from typing import Callable, NamedTuple

import keras
import numpy as np
import tensorflow as tf

from keras_attention.diagnostics import diagnostics_probe
from keras_attention.diagnostics import write_diagnostics
from keras_attention.recording import record_attention
from keras_attention.viz import write_attention_summary
from pipelines.builders import build_model
from pipelines.builders import build_optimizer
from pipelines.common import to_jsonable

# Largest held-out batch per evaluation call.
MAX_EVAL_BATCH = 1024
# Probe examples shown by the Attention dashboard (each costs
# heads * T * S * 2 bytes a step in the event file).
DASHBOARD_EXAMPLES = 4


def eval_batch_size(num_examples, num_replicas):
    """The largest divisor of `num_examples` that is a multiple of
    `num_replicas` and at most `MAX_EVAL_BATCH` (or `num_replicas`)."""
    best = num_replicas
    for size in range(num_replicas, min(num_examples, MAX_EVAL_BATCH) + 1,
                      num_replicas):
        if num_examples % size == 0:
            best = size
    return best


def weighted_sums(targets, logits, weights):
    """The weighted sums of the cross-entropy and of the correct
    predictions over the positions of a batch."""
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


def make_train_step(model, optimizer, strategy, config):
    """The compiled train step of `model` under `strategy`.

    Args:
        model: the model, built in `strategy.scope()`.
        optimizer: its optimizer, built for its trainable variables.
        strategy: the `tf.distribute.Strategy`.
        config: the resolved `TrainConfig` (`clip_norm`, `precision`,
            `jit_compile` resolved to `"on"`/`"off"`).

    Returns:
        `train_step(iterator)`: takes the next global batch from a
        distributed iterator, updates the weights once and returns the
        global-batch mean loss and accuracy.
    """
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
    # dense gradients; so does the in-step all-reduce, which then packs the
    # same tensors on every replica.
    densify_gradients = config.clip_norm is not None or aggregate_in_step

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

    return train_step


class Parts(NamedTuple):
    """What a run trains with: the model and optimizer (built in the
    strategy's scope), the schedule, the host copy for diagnostics and
    saving, and the compiled train step, evaluation step and probe."""

    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    schedule: Callable
    host_model: keras.Model
    train_step: Callable
    eval_step: Callable
    probe: Callable


def build_parts(config, strategy, task, learning_rate=None):
    """The `Parts` of a run of `config`, the weights drawn from its seed.

    Args:
        config: the resolved `TrainConfig`.
        strategy: the `tf.distribute.Strategy`.
        task: the config's task.
        learning_rate: optional scalar variable for the peak learning rate
            (see `build_optimizer`).
    """
    with strategy.scope():
        keras.utils.set_random_seed(config.seed)
        model = build_model(config, task)
        optimizer, schedule = build_optimizer(
            config, strategy.num_replicas_in_sync, learning_rate
        )
        optimizer.build(model.trainable_variables)
    # A copy outside the strategy for eager diagnostics and saving.
    host_model = build_model(config, task)
    return Parts(
        model, optimizer, schedule, host_model,
        make_train_step(model, optimizer, strategy, config),
        make_eval_step(model, strategy),
        # Compiled once per run: eager probing cost about 3x more per call.
        diagnostics_probe(host_model),
    )


def make_evaluate(model, strategy, eval_data, eval_step=None):
    """The held-out evaluation of `model` over a distributed dataset.

    Returns:
        `evaluate()`: the weighted mean loss and accuracy over every batch
        of `eval_data`, as floats.
    """
    eval_step = make_eval_step(model, strategy) if eval_step is None else eval_step

    def evaluate():
        totals = np.zeros(3)
        for batch in eval_data:
            totals += np.array([float(value) for value in eval_step(batch)])
        weight = max(totals[2], 1e-12)
        return totals[0] / weight, totals[1] / weight

    return evaluate


def make_eval_step(model, strategy):
    """The compiled evaluation of one distributed batch: the sums of the
    weighted loss, of the correct predictions and of the weights."""
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

    return eval_step


# Probe examples drawn in the Images tab's heat maps.
MAX_IMAGES = 3


def make_diagnose(host_model, model, probe, writer, task=None,
                  probe_host_model=None):
    """`diagnose(step, images=True)`: the diagnostics of the current weights
    on the probe batch, logged to `writer` (with the Images tab's heat maps
    when `images`) and returned as their JSON record.

    With the `task`, it also writes the Attention dashboard's summary of
    the first `DASHBOARD_EXAMPLES` probe examples of every attention layer,
    labelled by `task.token_labels` and `task.target_cells`.
    `probe_host_model` is the compiled probe of `host_model` (default: a new
    `diagnostics_probe`; a sweep passes the one it keeps across runs)."""
    if probe_host_model is None:
        # Compiled once per run: eager probing cost about 3x more per call.
        probe_host_model = diagnostics_probe(host_model)
    write_maps = None if task is None else _dashboard_writer(
        host_model, probe[0], task)
    # The Images tab's heat maps carry the same token labels.
    labels = None if task is None else task.token_labels(np.asarray(probe[0]))

    def diagnose(step, images=True):
        host_model.set_weights(model.get_weights())
        diagnostics = probe_host_model(*probe)
        if writer.wants(step):
            if write_maps is not None:
                write_maps(step, writer.writer)
            write_diagnostics(diagnostics, step, writer.writer,
                              max_images=MAX_IMAGES if images else 0,
                              query_labels=labels)
        return diagnostics_record(diagnostics)

    return diagnose


def _dashboard_writer(host_model, tokens, task):
    """`write(step, writer)`: the dashboard summary of the first probe
    examples, from a compiled forward pass under `record_attention` (the
    probe returns weights but not the per-head scores the summary needs;
    this pass on a few examples costs a fraction of the probe's)."""
    tokens = tokens[:DASHBOARD_EXAMPLES]
    token_ids = np.asarray(tokens)
    labels = task.token_labels(token_ids)
    cells = task.target_cells(token_ids)

    def forward(tokens):
        with record_attention(host_model) as records:
            host_model(tokens, training=False)
        # A mask is None when the layer had none.
        return {name: {key: record.get(key) for key in
                       ("weights", "scores", "mask")
                       if record.get(key) is not None}
                for name, record in records.items()}

    forward = tf.function(forward, autograph=False)

    def write(step, writer):
        for name, record in forward(tokens).items():
            write_attention_summary(
                name, {key: np.asarray(value) for key, value in
                       record.items()},
                step, labels, target_cells=cells, writer=writer)

    return write


def diagnostics_record(diagnostics):
    """The JSON part of `probe_diagnostics` output: loss, accuracy, summary
    and per-layer statistics, without the weights and per-row arrays."""

    def floats(values):
        return {
            key: to_jsonable(np.asarray(value, np.float64))
            for key, value in values.items()
            if key not in ("weights", "entropy_rows")
        }

    return {
        "loss": float(diagnostics["loss"]),
        "accuracy": float(diagnostics["accuracy"]),
        "summary": floats(diagnostics["summary"]),
        "layers": {
            name: floats(stats)
            for name, stats in diagnostics["layers"].items()
        },
    }
