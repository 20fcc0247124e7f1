"""Claim 5's measurements over lengths: the init curves (one query among
n keys per scale mode, `keras_attention.diagnostics.length_at_init`), the
grid's length axis, and recall runs read held-out at multiples of their
trained length, their position table tiled (docs/experiments.md says why
only recall, and how). Beside the accuracy this reads fading directly: the
query row's mean weight on the pair holding its key, per layer.

A check that needs no training: L pairs repeated k times, read with the
tiled rows, give the trained model's logits exactly (each key appears k
times with the same score), except under ssmax, whose log(n) grows.
"""

import math

import keras
import numpy as np

from keras_attention.diagnostics import length_at_init
from keras_attention.recording import record_attention
from pipelines.builders import build_model
from pipelines.builders import build_task
from pipelines.common import UsageError
from pipelines.engine.presets import ARMS
from pipelines.reports.numbers import mean_sd
from pipelines.run_dir import restore_model

# Held-out examples evaluated in one call.
_BATCH = 128
INIT_STATISTICS = ("entropy_normalized", "relevant_weight", "max_weight")
# Queries per n of the init curves: standard errors of the mean weights
# about 0.01-0.03 (measured at d_k 64).
INIT_TRIALS = 256
# The arms whose scale modes the init curves draw.
INIT_ARMS = ("scaled", "unscaled", "qk_norm", "ssmax")
# The length axis of each kind of task: the number of recall pairs, or
# the sequence length of the positional tasks.
LENGTH_AXES = ("num_pairs", "seq_len")


def length_axis(plan):
    """The grid's length axis (`num_pairs` or `seq_len`), or None."""
    return next((name for name in LENGTH_AXES if name in plan.axes), None)


def tiled_positions(train_pairs, eval_pairs):
    """The trained position row each position of an `eval_pairs` recall
    input reads: pairs cycle through the trained rows, the query (last)
    keeps its row `train_pairs`.

    >>> tiled_positions(2, 5)
    [0, 1, 0, 1, 0, 2]
    """
    return [j % train_pairs for j in range(eval_pairs)] + [train_pairs]


def check_multiples(config, multiples, flag="--length-multiples"):
    """Raises `UsageError` unless recall with enough distinct keys."""
    if config.task != "recall":
        raise UsageError(
            f"{flag}: evaluating at longer inputs is defined for recall only "
            f"(its query finds the pair by content); {config.task} is "
            "positional, give it a --seq-len axis instead")
    longest = max(multiples) * config.num_pairs
    if longest > config.num_keys:
        raise UsageError(
            f"{flag} {max(multiples)}: {longest} pairs need --num-keys >= "
            f"{longest} (recall's keys are distinct); got {config.num_keys}")


def longer_model(model, config, eval_pairs):
    """`(model, task)`: the trained recall `model` of `config` rebuilt for
    `eval_pairs` pairs, its position table tiled, and its task there (the
    same keys, values and token ids)."""
    eval_config = config.replace(num_pairs=eval_pairs)
    task = build_task(eval_config)
    longer = build_model(eval_config, task)
    rows = tiled_positions(config.num_pairs, eval_pairs)
    for layer in longer.layers:
        if not layer.weights:
            continue
        weights = model.get_layer(layer.name).get_weights()
        if layer.name == "position_embedding":
            weights = [weights[0][rows]]
        layer.set_weights(weights)
    return longer, task


def evaluate(model, task, tokens, targets, sample_weight):
    """`{"accuracy", "relevant_weight": [per layer]}` of `model` on a
    recall batch; the relevant weight is the query row's on the pair
    holding its key, the mean over heads and examples."""
    correct = weight = 0.0
    relevant = {}
    for start in range(0, len(tokens), _BATCH):
        batch = tokens[start:start + _BATCH]
        with record_attention(model) as records:
            logits = model(batch, training=False)
        predicted = np.argmax(keras.ops.convert_to_numpy(logits), axis=-1)
        weights = sample_weight[start:start + _BATCH]
        correct += float(np.sum((predicted == targets[start:start + _BATCH])
                                * weights))
        weight += float(np.sum(weights))
        cells = task.target_cells(batch)
        for name, record in records.items():
            attention = np.asarray(keras.ops.convert_to_numpy(
                record["weights"]), np.float64)
            values = [attention[b, :, row, column].mean()
                      for b, example in enumerate(cells)
                      for row, column in example]
            relevant.setdefault(name, []).extend(values)
    order = sorted(relevant, key=lambda name: int(name.rsplit("_", 1)[-1]))
    return {"accuracy": correct / max(weight, 1e-12),
            "relevant_weight": [float(np.mean(relevant[n])) for n in order]}


def extrapolation(plan, runs, log=print):
    """Finished recall runs of `plan` evaluated at multiples of their
    length, on each length's own held-out set of the run's seed.

    Args:
        runs: `[(run, multiples)]`, a `Run` and the multiples to read it
            at (1 is its own length).

    Returns:
        `[{"arm", "seed", "key_dim", "train_pairs", "multiple",
        "eval_pairs", "accuracy", "relevant_weight"}]`.
    """
    records = []
    for run, multiples in runs:
        config = run.config
        model = restore_model(config.logdir)
        try:
            for multiple in multiples:
                longer, task = longer_model(model, config,
                                            multiple * config.num_pairs)
                tokens, targets, weights = task.heldout(
                    plan.base.heldout_size, config.seed)
                records.append({
                    "arm": run.arm, "seed": run.values["seed"],
                    "key_dim": config.key_dim,
                    "train_pairs": config.num_pairs, "multiple": multiple,
                    "eval_pairs": multiple * config.num_pairs,
                    **evaluate(longer, task, tokens, targets,
                               np.asarray(weights, np.float64))})
                del longer
        finally:
            del model
            keras.backend.clear_session()
    if runs:
        log(f"length: {len(runs)} recall runs evaluated held-out at "
            "multiples of their length")
    return records


def init_curves(key_dim, reference_length, trials=INIT_TRIALS):
    """`{"key_dim", "reference_length", "trials", "modes": {mode:
    {"num_keys", "score_scale", <statistic>, <statistic>_sem, "theory"}}}`
    at init over n = 16 .. 4096; ssmax's s_h at 1/log(`reference_length`).
    """
    curves = {}
    for arm in map(ARMS.get, INIT_ARMS):
        measured = length_at_init(
            arm.scale, key_dim=key_dim, num_trials=trials,
            qk_norm=arm.qk_norm, reference_length=reference_length
            if arm.scale == "ssmax" else None)
        curves[arm.mode] = {
            "num_keys": [int(n) for n in measured["num_keys"]],
            **{name: [float(v) for v in measured[name]] for name in (
                "score_scale", *INIT_STATISTICS,
                *(f"{name}_sem" for name in INIT_STATISTICS))},
            "theory": {name: [float(v) for v in measured["theory"][name]]
                       for name in INIT_STATISTICS}}
    return {"key_dim": key_dim, "reference_length": reference_length,
            "trials": trials, "modes": curves}


def half_point(curve):
    """The first n where the relevant weight is below 1/2, or None."""
    return next((n for n, w in zip(curve["num_keys"],
                                   curve["relevant_weight"]) if w < 0.5),
                None)


def theory_half(key_dim):
    """The n where the i.i.d. theory's relevant weight under the sqrt
    scale is 1/2: e^{s*} = (n - 1) e^{σ²/2}, s* = √d_k, σ = 1."""
    return 1.0 + math.exp(math.sqrt(key_dim) - 0.5)


def evaluated_runs(plan):
    """`[(run, multiples)]`: the recall runs at the largest trained d_k in
    the slice, those at the shortest trained length at `length_multiples`,
    the others at their own length (for the query's weight on its pair)."""
    if plan.base.task != "recall":
        return []
    axis = length_axis(plan)
    key_dim = plan.trained_axis("key_dim")[-1]
    multiples = list(plan.options.get("length_multiples") or ())
    chosen = []
    for run in plan.trained_runs():
        if run.values["key_dim"] != key_dim or not plan.in_slice(
                run.values, free=axis):
            continue
        shortest = axis is None or run.values[axis] == plan.trained_axis(
            axis)[0]
        if shortest and multiples:
            chosen.append((run, multiples))
        elif axis is not None:
            chosen.append((run, [1]))
    return chosen


def pair_weights(records, arm, train_pairs, multiple):
    """The relevant weight (the largest of the layers' means) and the
    accuracy of each evaluated seed."""
    chosen = [r for r in records if r["arm"] == arm
              and r["train_pairs"] == train_pairs
              and r["multiple"] == multiple]
    return ([max(r["relevant_weight"]) for r in chosen],
            [r["accuracy"] for r in chosen])


def multiple_rows(plan, records):
    """Per multiple of the shortest evaluated length (when read at more
    than 1x), per arm: accuracy and relevant weight over seeds."""
    shortest = min((r["train_pairs"] for r in records), default=None)
    multiples = sorted({r["multiple"] for r in records
                        if r["train_pairs"] == shortest})
    if len(multiples) < 2:
        return []
    rows = []
    for multiple in multiples:
        arms = {}
        for arm in plan.arms:
            weight, accuracy = pair_weights(records, arm, shortest, multiple)
            arms[arm] = {"accuracy": accuracy,
                         "accuracy_mean": mean_sd(accuracy)[0],
                         "relevant_weight": weight,
                         "relevant_weight_mean": mean_sd(weight)[0]}
        rows.append({"multiple": multiple, "eval_pairs": multiple * shortest,
                     "arms": arms})
    return rows
