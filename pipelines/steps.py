"""What a run trains with, on any backend: its `Parts` (`build_parts`: the
model compiled for Keras's `fit`), the data `fit` and `evaluate` read
(`train_feed`, `heldout_feed`) and the diagnostics (`make_diagnose`).

The loss is the weighted mean cross-entropy of the global batch, whatever
the replicas: each batch's weights are divided by the global batch's total
weight before they reach `fit`, and the loss sums (`reduction="sum"`), so
the replicas' summed gradients are the gradient of the global-batch mean
and Keras's loss tracker averages the steps' means (Keras scales neither a
`"sum"` loss nor, on TensorFlow, its gradients for the replicas; a
`"mean_with_sample_weight"` loss would be each replica's own mean). The
held-out set's weights are divided by its total weight times its number of
batches, so `evaluate`'s loss is the set's weighted mean exactly. The
accuracy is a weighted metric, unchanged by the scale.
"""

from typing import Callable, NamedTuple

import keras
import numpy as np

from keras_attention.dashboard import DASHBOARD_EXAMPLES
from keras_attention.dashboard import AttentionLogger
from keras_attention.dashboard import is_finite
from keras_attention.diagnostics import diagnostics_probe
from keras_attention.tasks.text_patterns import pattern_scores
from pipelines.backends import backend_module
from pipelines.builders import build_model
from pipelines.builders import seed_run
from pipelines.builders import build_optimizer
from pipelines.common import to_jsonable
from pipelines.devices import MAX_EVAL_BATCH

# Probe examples drawn in the Images tab's heat maps.
MAX_IMAGES = 3


def eval_batch_size(num_examples, num_replicas):
    """The largest divisor of `num_examples` that is a multiple of
    `num_replicas` and at most `MAX_EVAL_BATCH` (or `num_replicas`)."""
    best = num_replicas
    for size in range(num_replicas, min(num_examples, MAX_EVAL_BATCH) + 1,
                      num_replicas):
        if num_examples % size == 0:
            best = size
    return best


def steps_per_call(config):
    """Steps in one compiled call of `fit`: the largest number dividing
    every interval the loop acts at and the run's length, so each step it
    acts at (a checkpoint resumed from included) ends a call: the loop's
    hooks run between calls. One on torch, where Keras refuses more."""
    if config.backend == "torch":
        return 1
    return int(np.gcd.reduce([
        config.log_every, config.eval_every, config.diagnostics_every,
        config.checkpoint_every, config.steps]))


class Parts(NamedTuple):
    """What a run trains with: the model (built in the devices' scope and
    compiled for `fit`), its optimizer, the schedule, the host copy for
    saving and the finite check at the start, and the model's compiled
    diagnostics probe."""

    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    schedule: Callable
    host_model: keras.Model
    probe: Callable

    def synced_host_model(self):
        """The host copy, holding the model's current weights."""
        self.host_model.set_weights(self.model.get_weights())
        return self.host_model


def build_parts(config, devices, task, learning_rate=None):
    """The `Parts` of a run of `config` on `devices`, the weights drawn
    from its seed; `learning_rate` as for `build_optimizer`."""
    with devices.scope():
        seed_run(config.seed)
        model = build_model(config, task)
        optimizer, schedule = build_optimizer(config, devices.num_replicas,
                                              learning_rate)
        optimizer.build(model.trainable_variables)
        compile_for_fit(model, optimizer, config, devices)
    # A copy outside any distribution for saving.
    host_model = build_model(config, task)
    return Parts(
        model, optimizer, schedule, host_model,
        # Compiled once per run (eager probing cost about 3x more per
        # call), on the trained model itself, as `AttentionMonitor` probes
        # a `fit`: the weights are not copied to the host and back for it.
        diagnostics_probe(model),
    )


def compile_for_fit(model, optimizer, config, devices):
    """Compiles `model` for `fit` (in the devices' scope): the weighted
    cross-entropy summed over positions (see the module docstring), the
    weighted accuracy, XLA as resolved, `steps_per_call` steps a call; and
    the backend's `adapt_model`."""
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="sum"),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(
            name="accuracy")],
        jit_compile=config.jit_compile == "on",
        steps_per_execution=steps_per_call(config),
    )
    backend_module(config.backend).adapt_model(model, config, devices)


def _normalized(batch):
    """`batch` with its weights divided by their total."""
    tokens, targets, weights = batch
    total = max(float(np.sum(weights, dtype=np.float64)), 1e-12)
    return tokens, targets, (weights / total).astype(np.float32)


def _rows(batch, index, count):
    rows = len(batch[0]) // count
    return tuple(array[index * rows:(index + 1) * rows] for array in batch)


def train_feed(task, config, devices, start_step):
    """What `fit` reads from `start_step` on: each step's global batch
    (a function of `(seed, step)`), its weights divided by their total,
    this process's rows of it."""
    index, count = devices.shard

    def batches():
        for batch in task.batches(config.batch_size, config.seed,
                                  start_step=start_step,
                                  train_size=config.train_size):
            yield _rows(_normalized(batch), index, count)

    return backend_module(config.backend).feed(batches, devices,
                                               config.steps - start_step)


def heldout_feed(task, config, devices):
    """`(feed, batches)`: `feed()`, what `evaluate` reads of this process's
    rows of the held-out set, its weights divided by the set's total weight
    times its number of `batches`."""
    size = eval_batch_size(config.heldout_size, devices.num_replicas)
    heldout = list(task.heldout_batches(
        size, num_examples=config.heldout_size, seed=config.seed))
    total = sum(float(np.sum(batch[2], dtype=np.float64))
                for batch in heldout)
    scale = len(heldout) / max(total, 1e-12)
    index, count = devices.shard
    heldout = [_rows((tokens, targets, (weights * scale).astype(np.float32)),
                     index, count) for tokens, targets, weights in heldout]

    def batches():
        yield from heldout

    def feed():
        return backend_module(config.backend).feed(batches, devices,
                                                   len(heldout))

    return feed, len(heldout)


def make_diagnose(parts, probe, writer, task):
    """`diagnose(step, images=True)`: the diagnostics of the current weights
    on the probe batch, logged to `writer` (the Images tab's heat maps when
    `images`) and returned as their JSON record.

    It also writes the Attention dashboard's summary of the first
    `DASHBOARD_EXAMPLES` probe examples, labelled by the `task`, and every
    head's score on each of the task's `attention_patterns`
    (`patterns/<pattern>/<layer>/head_<h>`, beside `patterns/<pattern>/chance`;
    in the record under `"patterns"`)."""
    token_ids = np.asarray(probe[0])
    # The Images tab's heat maps carry the same token labels.
    labels = task.token_labels(token_ids)
    patterns = task.attention_patterns(token_ids)
    # The same logger as `keras_attention.AttentionMonitor`'s.
    logger = AttentionLogger(
        parts.probe, *probe, labels=labels,
        target_cells=task.target_cells(token_ids[:DASHBOARD_EXAMPLES]),
        dashboard=True, dashboard_examples=DASHBOARD_EXAMPLES,
        max_images=MAX_IMAGES,
    )

    def diagnose(step, images=True):
        diagnostics = logger.probe()
        scores = _pattern_scores(diagnostics, patterns)
        # A diverged model's maps are not drawn (the dashboard refuses NaN);
        # the loop stops on the non-finite loss at its next log step.
        if writer.wants(step) and is_finite(diagnostics):
            logger.write(diagnostics, step, writer.writer, images=images)
            for tag, value in _pattern_scalars(scores):
                writer.writer.scalar(tag, value, step)
        record = diagnostics_record(diagnostics)
        if scores:
            record["patterns"] = scores
        return record

    return diagnose
def _pattern_scores(diagnostics, patterns):
    """`{pattern: {"chance": float, layer: [score of each head]}}` of the
    patterns that have a query in the probe batch."""
    scores = {}
    for pattern, cells in patterns.items():
        for name, stats in diagnostics["layers"].items():
            heads, chance = pattern_scores(stats["weights"], cells)
            if heads is not None:
                scores.setdefault(pattern, {"chance": chance})[name] = [
                    float(score) for score in heads]
    return scores


def _pattern_scalars(scores):
    """The `(tag, value)` scalars of `_pattern_scores`."""
    for pattern, by_layer in scores.items():
        yield f"patterns/{pattern}/chance", by_layer["chance"]
        for name, heads in by_layer.items():
            if name != "chance":
                for head, score in enumerate(heads):
                    yield f"patterns/{pattern}/{name}/head_{head}", score


def diagnostics_record(diagnostics):
    """The JSON part of `probe_diagnostics` output: loss, accuracy, summary
    and per-layer statistics, without the weights and per-row arrays."""

    def floats(values):
        return {
            key: to_jsonable(np.asarray(value, np.float64))
            for key, value in values.items()
            if key not in ("weights", "scores", "mask", "entropy_rows",
                           "per_example")
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
