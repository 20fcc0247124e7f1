"""Claim 5's measurements over lengths: the init curves (one query among
n keys per scale mode, `keras_attention.diagnostics.length_at_init`), the
grid's length axis, and a recall model trained at one length, evaluated
held-out at longer ones.

Recall needs no positions: the query finds its pair by content, and the
pairs come in random order. The toy model still adds a learned position
embedding, one row per position it was built for, and a model trained on
L pairs (L + 1 tokens, the query last) has never seen a row past L. So the
model for kL pairs is the trained model with its position table *tiled*:
pair position j gets the trained row j mod L and the query keeps its own
trained row L. Every other weight (an ssmax layer's trained s_h included)
is copied, so the longer model differs from the trained one only in how
many pairs it reads; the ssmax factor log(n) follows the keys n it sees.
A check that needs no training: L pairs repeated k times, read with the
tiled rows, give exactly the trained model's logits (each key appears k
times with the same score, so every softmax average is the same), except
under ssmax, whose log(n) grows with the repeats.

The positional tasks (reverse, sort, copy) are left out: their targets
are defined by positions (position i of a reversal reads T - 1 - i), which
a model trained at T never saw past T, and a tiled table would change the
task rather than its length. They take a `--seq-len` axis, each length its
own trained model.

Besides the accuracy this measures attention fading directly: the mean
weight the query row puts on the pair holding its key, per layer (over
heads and held-out examples).
"""

import math

import keras
import numpy as np

from keras_attention.diagnostics import length_at_init
from keras_attention.recording import record_attention
from pipelines.builders import build_model
from pipelines.builders import build_task
from pipelines.common import UsageError
from pipelines.common import markdown_table
from pipelines.compare.measure import document_arms
from pipelines.engine.presets import ARMS
from pipelines.reports.numbers import fmt_mean_sd
from pipelines.reports.numbers import mean_sd
from pipelines.reports.plotting import finish_panel
from pipelines.reports.plotting import log2_axis
from pipelines.reports.plotting import new_figure
from pipelines.reports.plotting import series_panel
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
    input reads: pairs cycle through rows 0 .. train_pairs - 1, the query
    (last) keeps row `train_pairs`.

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
    """The trained recall `model` of `config` (built for `config.num_pairs`
    pairs) rebuilt for `eval_pairs` pairs, its position table tiled.

    Returns:
        `(model, task)`: the longer model and the recall task at
        `eval_pairs` (the same keys, values and token ids).
    """
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
    """Accuracy and the relevant-pair weight per layer of `model` on a
    recall batch.

    Returns:
        `{"accuracy": float, "relevant_weight": [per layer]}`; the relevant
        weight is the query row's weight on the pair holding its key, the
        mean over heads and examples.
    """
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


def evaluate_run(config, multiples, heldout_size):
    """One finished recall run evaluated at each multiple of its length.

    Returns:
        `[{"multiple", "eval_pairs", "accuracy", "relevant_weight"}]`; the
        held-out examples at each length are the task's own held-out set
        of the run's seed at that length.
    """
    model = restore_model(config.logdir)
    rows = []
    try:
        for multiple in multiples:
            longer, task = longer_model(model, config,
                                        multiple * config.num_pairs)
            tokens, targets, weights = task.heldout(heldout_size, config.seed)
            rows.append({"multiple": multiple,
                         "eval_pairs": multiple * config.num_pairs,
                         **evaluate(longer, task, tokens, targets,
                                    np.asarray(weights, np.float64))})
            del longer
    finally:
        del model
        keras.backend.clear_session()
    return rows


def extrapolation(plan, runs, log=print):
    """Trained recall runs evaluated at multiples of their length.

    Args:
        plan: the `Grid`.
        runs: `[(run, multiples)]`: a finished `Run` of the grid and the
            length multiples to evaluate it at (1 is its own length).

    Returns:
        `[{"arm", "seed", "key_dim", "train_pairs", "multiple",
        "eval_pairs", "accuracy", "relevant_weight"}]`.
    """
    records = []
    for run, multiples in runs:
        for row in evaluate_run(run.config, multiples,
                                plan.base.heldout_size):
            records.append({"arm": run.arm, "seed": run.values["seed"],
                            "key_dim": run.config.key_dim,
                            "train_pairs": run.config.num_pairs, **row})
    if runs:
        log(f"length: {len(runs)} recall runs evaluated held-out at "
            "multiples of their length")
    return records


def init_curves(key_dim, reference_length, trials=INIT_TRIALS):
    """`{"key_dim", "reference_length", "trials", "modes": {mode:
    {"num_keys", "score_scale", <statistic>, <statistic>_sem, "theory":
    {<statistic>: [...]}}}}` at init, lists over n = 16 .. 4096; ssmax's
    s_h starts at 1/log(`reference_length`), the key count it is built
    for."""
    curves = {}
    for arm in map(ARMS.get, INIT_ARMS):
        measured = length_at_init(
            arm.scale, key_dim=key_dim, num_trials=trials,
            qk_norm=arm.qk_norm, reference_length=reference_length
            if arm.scale == "ssmax" else None)
        curves[arm.mode] = {
            "num_keys": [int(n) for n in measured["num_keys"]],
            "score_scale": [float(c) for c in measured["score_scale"]],
            **{name: [float(v) for v in measured[name]]
               for name in INIT_STATISTICS},
            **{f"{name}_sem": [float(v) for v in measured[f"{name}_sem"]]
               for name in INIT_STATISTICS},
            "theory": {name: [float(v) for v in measured["theory"][name]]
                       for name in INIT_STATISTICS},
        }
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


# ---------------------------------------------------------------- words
def evaluated_runs(plan):
    """`[(run, multiples)]`: the recall runs measured at lengths, at the
    largest trained d_k with the other axes at their slice: those at the
    shortest trained length at `length_multiples`, the others at their own
    length (1x, for the query's weight on its pair)."""
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
    """Per multiple of the shortest evaluated length (when it was
    evaluated at more than 1x): per arm accuracy and relevant weight over
    seeds."""
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



def table(plan, rows):
    """The report's lines on the evaluated lengths (none without rows)."""
    if not rows:
        return []
    arms = list(plan.arms)
    cells = [[f"{row['eval_pairs']} ({row['multiple']}×)"] + [
        fmt_mean_sd(row["arms"][arm]["accuracy"]) for arm in arms] + [
        fmt_mean_sd(row["arms"][arm]["relevant_weight"]) for arm in arms]
        for row in rows]
    return ["Trained at the shortest length, evaluated held-out at longer "
            "ones (position table tiled; accuracy, then the query's weight "
            "on its pair):", "",
            *markdown_table(["pairs", *(f"accuracy {a}" for a in arms),
                             *(f"weight {a}" for a in arms)], cells), ""]


def length_eval_figure(document):
    """Accuracy and relevant weight against the evaluated length."""
    claim = (document.get("claims") or {}).get("5")
    rows = ((claim or {}).get("extrapolation") or {}).get("rows")
    if not rows:
        return None
    figure, axes = new_figure(11, 4.0, 1, 2)
    pairs = [row["eval_pairs"] for row in rows]
    for ax, key, title in zip(axes[0], ("accuracy", "relevant_weight"),
                              ("held-out accuracy", "query's weight on "
                               "its pair")):
        series_panel(ax, [
            (arm, arm, pairs, [row["arms"][arm][f"{key}_mean"]
                               for row in rows], None)
            for arm in document_arms(document, rows[0]["arms"])],
            spread="none")
        log2_axis(ax, pairs, "evaluated pairs")
        finish_panel(ax, title, f"Trained at {pairs[0]} pairs", unit=True)
    return figure


def points(rows):
    """`[(tag, value, evaluated pairs)]`: accuracy and relevant_weight, a
    tag per arm."""
    return [point for row in rows for arm, values in row["arms"].items()
            for point in ((f"accuracy/{arm}", values["accuracy_mean"],
                           row["eval_pairs"]),
                          (f"relevant_weight/{arm}",
                           values["relevant_weight_mean"],
                           row["eval_pairs"]))]
