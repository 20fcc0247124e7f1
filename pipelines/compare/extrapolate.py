"""A recall model trained at one length, evaluated held-out at longer ones.

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

import keras
import numpy as np

from keras_attention.recording import record_attention
from pipelines.builders import build_model
from pipelines.builders import build_task
from pipelines.common import UsageError
from pipelines.run_dir import restore_model

# Held-out examples evaluated in one call.
_BATCH = 128


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
            records.append({"arm": run.arm, "seed": run.seed,
                            "key_dim": run.config.key_dim,
                            "train_pairs": run.config.num_pairs, **row})
    if runs:
        log(f"length: {len(runs)} recall runs evaluated held-out at "
            "multiples of their length")
    return records
