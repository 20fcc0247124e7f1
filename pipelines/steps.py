"""What a run trains with, on any backend: its `Parts` (`build_parts`), the
held-out evaluation (`make_evaluate`) and the diagnostics (`make_diagnose`).
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


class Parts(NamedTuple):
    """What a run trains with: the model and optimizer (built in the
    devices' scope), the schedule, the host copy for saving and the
    finite check at the start, the backend's compiled steps and the
    trained model's compiled probe."""

    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    schedule: Callable
    host_model: keras.Model
    steps: object
    probe: Callable

    def synced_host_model(self):
        """The host copy, holding the steps' current weights."""
        self.steps.sync()
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
    # A copy outside any distribution for saving.
    host_model = build_model(config, task)
    steps = backend_module(config.backend).Steps(model, optimizer, task,
                                                 config, devices)
    return Parts(
        model, optimizer, schedule, host_model, steps,
        # Compiled once per run (eager probing cost about 3x more per
        # call), on the trained model itself, as `AttentionMonitor` probes
        # a `fit`: the weights are not copied to the host and back for it.
        diagnostics_probe(model),
    )


def make_evaluate(steps, task, config, devices):
    """`evaluate()`: the weighted mean loss and accuracy over the held-out
    set (this process's rows of it) and the task's `heldout_scalars`."""
    index, count = devices.shard
    eval_batch = eval_batch_size(config.heldout_size, devices.num_replicas)

    def evaluate():
        totals = np.zeros(3)
        for batch in task.heldout_batches(
            eval_batch, num_examples=config.heldout_size, seed=config.seed,
            shard_index=index, num_shards=count,
        ):
            totals += steps.eval_sums(batch)
        weight = max(totals[2], 1e-12)
        loss, accuracy = totals[0] / weight, totals[1] / weight
        return loss, accuracy, task.heldout_scalars(loss, accuracy)

    return evaluate


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
        # The steps' state into the model's variables (JAX; a copy on the
        # device), which the probe reads.
        parts.steps.sync()
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
