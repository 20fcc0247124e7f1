"""Claims 4 (depth) and 5 (length) from hand-made records, the evaluation
of a recall model at longer lengths against hand-checkable cases, and one
tiny comparison over a depth axis, end to end."""

import contextlib
import io
import json
import math
import os

import keras
import numpy as np
import pytest

from keras_attention.recording import attention_layers
from pipelines import cli
from pipelines.builders import build_model
from pipelines.builders import build_task
from pipelines.builders import seed_run
from pipelines.compare.claims.depth import depth_claim
from pipelines.compare.claims.depth import depth_verdict
from pipelines.compare.claims.length import length_claim
from pipelines.compare.claims.length import length_verdict
from pipelines.compare.claims.length_measures import evaluate
from pipelines.compare.claims.length_measures import evaluated_runs
from pipelines.compare.claims.length_measures import longer_model
from pipelines.compare.claims.length_measures import tiled_positions
from pipelines.settings import Layer
from pipelines.settings import resolve_config
from pipelines.engine import Grid
from pipelines.tensorboard import read_event_scalars

SEEDS = [0, 1]
DEPTHS = [1, 2, 4]
TARGET = 0.9


def _grid(axes, arms=("scaled", "unscaled")):
    base = resolve_config([Layer("test", {"target_accuracy": TARGET,
                                          "logdir": "unused"})])
    return Grid(command="compare", logdir="unused", base=base,
                arms=list(arms), axes={"key_dim": [64], **axes,
                                       "seed": list(SEEDS)})


def _profile(depth, arm, seed):
    """Per layer: entropy and |dL/dscores| that differ by layer and seed."""
    return [{"entropy_normalized": (0.3 if arm == "unscaled" else 0.8)
             + 0.01 * layer + 0.001 * seed,
             "grad_norm_scores": (1.0 + seed) * (0.5 ** layer
                                                 if arm == "unscaled"
                                                 else 0.9 ** layer)}
            for layer in range(depth)]


def _depth_results(accuracy):
    """`accuracy(arm, depth, seed)` -> a final accuracy."""
    runs = []
    for depth in DEPTHS:
        for arm in ("scaled", "unscaled"):
            for seed in SEEDS:
                value = accuracy(arm, depth, seed)
                runs.append({
                    "arm": arm, "key_dim": 64, "seed": seed,
                    "num_layers": depth, "final_accuracy": value,
                    "steps_to_target": 500 if value >= TARGET else None,
                    "layers": {"init": _profile(depth, arm, seed),
                               "final": _profile(depth, arm, seed + 5)}})
    return {"runs": runs, "init_only": [], "heatmaps": []}


def test_claim_4_widening_gap_with_per_layer_means_and_gradient_ratio():
    # At 2 layers one seed keeps up: the depths between are not judged.
    unscaled = {1: [0.95, 0.93], 2: [0.5, 0.95], 4: [0.1, 0.2]}
    results = _depth_results(lambda arm, depth, seed: 1.0 if arm == "scaled"
                             else unscaled[depth][seed])
    claim = depth_claim(_grid({"num_layers": DEPTHS}), results)
    assert claim["trend"] == "widens" and claim["holds"] is True
    first, last = claim["by_depth"][0], claim["by_depth"][-1]
    assert first["gap"]["difference"] == pytest.approx([0.05, 0.07])
    assert claim["gap_change"] == pytest.approx(0.85 - 0.06)
    assert claim["ceiling"] is False
    # Entropy per layer: the mean over the two seeds, written out here.
    entropy = last["arms"]["unscaled"]["entropy_init"]["mean"]
    assert entropy == pytest.approx([0.3005, 0.3105, 0.3205, 0.3305])
    assert last["arms"]["scaled"]["entropy_final"]["mean"][0] == \
        pytest.approx(0.8 + 0.0055)
    # First over last |dL/dscores| per seed, then the mean: 0.5**-3 = 8
    # unscaled, 0.9**-3 scaled; the bottom vanishes faster unscaled.
    gradient = last["arms"]["unscaled"]["gradient"]
    assert gradient["first_over_last"] == pytest.approx(8.0)
    assert gradient["first"] == pytest.approx(1.5)
    assert last["arms"]["scaled"]["gradient"]["first_over_last"] == \
        pytest.approx(0.9 ** -3)
    assert claim["bottom_vanishes_faster_unscaled"] is False
    lines, holds = depth_verdict(claim, TARGET)
    assert holds is True
    assert any("Depth WIDENS the gap" in line and "+0.06" in line
               and "+0.85" in line for line in lines)
    # |dL/dscores| unscaled over scaled: (1.5 * 0.5**3) / (1.5 * 0.9**3).
    assert any(f"{0.5 ** 3 / 0.9 ** 3:.2f}× in the last" in line
               for line in lines)


@pytest.mark.parametrize("unscaled,trend,holds,ceiling", [
    # Unscaled never learns at any depth: the gap is at its ceiling.
    ({1: [0.1, 0.1], 2: [0.1, 0.15], 4: [0.12, 0.1]}, "leaves", True, True),
    # Unscaled catches up as the stack deepens.
    ({1: [0.1, 0.2], 2: [0.6, 0.7], 4: [0.95, 0.96]}, "closes", False, True),
])
def test_claim_4_leaves_and_closes(unscaled, trend, holds, ceiling):
    results = _depth_results(lambda arm, depth, seed: 0.99 if arm == "scaled"
                             else unscaled[depth][seed])
    claim = depth_claim(_grid({"num_layers": DEPTHS}), results)
    assert (claim["trend"], claim["holds"], claim["ceiling"]) == (
        trend, holds, ceiling)
    lines, _ = depth_verdict(claim, TARGET)
    assert any(f"Depth {trend.upper()}" in line for line in lines)


def test_claim_4_is_not_supported_when_the_scaled_deep_stack_fails_too():
    results = _depth_results(
        lambda arm, depth, seed: (0.99 if depth < 4 else 0.5)
        if arm == "scaled" else 0.1)
    claim = depth_claim(_grid({"num_layers": DEPTHS}), results)
    assert claim["holds"] is False


def _curves(sqrt_weight, ssmax_weight, key_dim=64):
    """Init curves of two lengths with the given relevant weights."""
    def curve(weights):
        return {"num_keys": [16, 4096], "relevant_weight": list(weights),
                "entropy_normalized": [0.5, 0.9], "max_weight": list(weights),
                "theory": {"relevant_weight": list(weights),
                           "entropy_normalized": [0.5, 0.9],
                           "max_weight": list(weights)}}
    modes = {"sqrt": curve(sqrt_weight), "none": curve((1.0, 1.0)),
             "qk_norm": curve(sqrt_weight), "ssmax": curve(ssmax_weight)}
    return {"key_dim": key_dim, "reference_length": 17, "trials": 8,
            "modes": modes}


def _length_results(accuracy):
    runs = [{"arm": arm, "key_dim": 64, "seed": seed, "num_pairs": pairs,
             "final_accuracy": accuracy[arm][pairs],
             "steps_to_target": None}
            for arm in accuracy for pairs in (16, 64) for seed in SEEDS]
    return {"runs": runs, "init_only": [], "heatmaps": []}


def _extrapolated(weights):
    """`weights[arm]` per multiple 1, 2, 4: the relevant weight (two
    layers: the larger counts) and an accuracy."""
    return [{"arm": arm, "seed": seed, "key_dim": 64, "train_pairs": 16,
             "multiple": multiple, "eval_pairs": 16 * multiple,
             "accuracy": weight, "relevant_weight": [0.01, weight]}
            for arm, values in weights.items() for seed in SEEDS
            for multiple, weight in zip((1, 2, 4), values)]


def test_claim_5_fades_at_init_in_training_and_when_extrapolating():
    grid = _grid({"num_pairs": [16, 64]}, arms=("scaled", "ssmax"))
    results = _length_results({"scaled": {16: 1.0, 64: 0.6},
                               "ssmax": {16: 1.0, 64: 0.95}})
    records = _extrapolated({"scaled": (0.9, 0.6, 0.3),
                             "ssmax": (0.9, 0.85, 0.8)})
    # The 64-pair runs at their own length: the weight the trained part
    # is decided on.
    records += [{"arm": arm, "seed": seed, "key_dim": 64, "train_pairs": 64,
                 "multiple": 1, "eval_pairs": 64, "accuracy": 0.9,
                 "relevant_weight": [weight, 0.0]}
                for arm, weight in (("scaled", 0.45), ("ssmax", 0.8))
                for seed in SEEDS]
    claim = length_claim(grid, results, _curves((0.99, 0.31), (0.9, 0.99)),
                         records, "num_pairs")
    assert claim["init"]["fades"] is True
    assert claim["init"]["relevant_weight_fall"] == pytest.approx(0.68)
    assert claim["init"]["half_weight_n"] == 4096
    assert claim["init"]["theory_half_weight_n"] == pytest.approx(
        1 + math.exp(8 - 0.5))
    trained = claim["trained"]
    assert trained["basis"] == "relevant_weight"
    assert trained["scaled_fall"] == pytest.approx(0.9 - 0.45)
    assert trained["ssmax_fall"] == pytest.approx(0.9 - 0.8)
    assert trained["scaled_accuracy_fall"] == pytest.approx(0.4)
    assert trained["fades"] is True
    extrapolation = claim["extrapolation"]
    assert extrapolation["scaled_weight_fall"] == pytest.approx(0.6)
    assert [row["eval_pairs"] for row in extrapolation["rows"]] == [16, 32, 64]
    assert claim["holds"] is True
    lines, holds = length_verdict(claim)
    assert holds is True and "0.99 at n 16 and 0.31 at n 4096" in lines[0]


def test_claim_5_a_fall_every_arm_shares_is_not_fading():
    grid = _grid({"num_pairs": [16, 64]}, arms=("scaled", "ssmax"))
    results = _length_results({"scaled": {16: 1.0, 64: 0.5},
                               "ssmax": {16: 1.0, 64: 0.48}})
    claim = length_claim(grid, results, _curves((0.99, 0.31), (0.9, 0.99)),
                         [], "num_pairs")
    assert claim["trained"]["basis"] == "accuracy"
    assert claim["trained"]["fades"] is False
    assert claim["extrapolation"]["fades"] is None
    assert claim["holds"] is False
    # At a d_k whose relevant score outgrows log n, init does not fade.
    claim = length_claim(grid, results, _curves((0.99, 0.97), (0.9, 0.99)),
                         [], None)
    assert claim["init"]["fades"] is False and claim["holds"] is False
    assert "does NOT fade" in length_verdict(claim)[0][0]


def test_the_runs_evaluated_at_lengths():
    grid = _grid({"num_pairs": [16, 64], "num_layers": [1, 2]},
                 arms=("scaled", "ssmax"))
    grid.options["length_multiples"] = [1, 2, 4]
    chosen = {(run.arm, *(run.values[name] for name in (
                  "num_pairs", "num_layers", "seed"))): multiples
              for run, multiples in evaluated_runs(grid)}
    # One layer only (the slice of the other axis); the shortest length
    # at every multiple, the longer one at its own length.
    assert chosen == {(arm, pairs, 1, seed): [1, 2, 4] if pairs == 16
                      else [1] for arm in ("scaled", "ssmax")
                      for pairs in (16, 64) for seed in SEEDS}


# ------------------------------------------------- evaluation at length
def _tiny_config(**values):
    return resolve_config([Layer("test", {
        "num_pairs": 3, "num_keys": 12, "num_values": 4, "d_model": 8,
        "key_dim": 8, "num_layers": 2, "logdir": "unused", **values})])


def test_tiled_positions_by_hand():
    assert tiled_positions(3, 3) == [0, 1, 2, 3]
    assert tiled_positions(3, 7) == [0, 1, 2, 0, 1, 2, 0, 3]


@pytest.mark.parametrize("scale", ["sqrt", "ssmax"])
def test_the_longer_model_is_the_trained_one_with_its_table_tiled(scale):
    config = _tiny_config(scale=scale)
    seed_run(0)
    model = build_model(config)
    if scale == "ssmax":
        # A trained s_h, not the 1/log(n) a new layer starts from.
        for layer in attention_layers(model):
            layer.ssmax_scale.assign([0.7])
    tokens = build_task(config).heldout(4, 0)[0]
    same, _ = longer_model(model, config, 3)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(same(tokens)),
        keras.ops.convert_to_numpy(model(tokens)))
    longer, task = longer_model(model, config, 7)
    assert task.seq_len == 8 and task.num_keys == config.num_keys
    table = model.get_layer("position_embedding").get_weights()[0]
    np.testing.assert_array_equal(
        longer.get_layer("position_embedding").get_weights()[0],
        table[[0, 1, 2, 0, 1, 2, 0, 3]])
    for short, long in zip(attention_layers(model), attention_layers(longer)):
        for a, b in zip(short.get_weights(), long.get_weights()):
            np.testing.assert_array_equal(a, b)
    if scale == "ssmax":
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(attention_layers(longer)[0]
                                       .ssmax_scale), [0.7])


def test_evaluate_uniform_attention_and_accuracy_by_hand():
    config = _tiny_config()
    seed_run(1)
    model = build_model(config)
    longer, task = longer_model(model, config, 6)
    for layer in attention_layers(longer):
        # Zero queries: every score 0, uniform weights over the 7 keys.
        layer.query_kernel.assign(np.zeros(layer.query_kernel.shape))
    tokens, targets, weights = task.heldout(20, 3)
    found = evaluate(longer, task, tokens, targets, weights)
    np.testing.assert_allclose(found["relevant_weight"], [1 / 7, 1 / 7],
                               rtol=1e-6)
    predicted = np.argmax(keras.ops.convert_to_numpy(longer(tokens)), -1)
    expected = np.sum((predicted == targets) * weights) / np.sum(weights)
    assert found["accuracy"] == pytest.approx(expected)


@pytest.mark.parametrize("flags, message", [
    (["--task", "reverse", "--length-multiples", "2"], "recall only"),
    # 8 x 16 pairs need 128 distinct keys; recall's default is 64.
    (["--length-multiples", "1,8"], "--num-keys >= 128"),
    (["--length-multiples", "0"], "--length-multiples"),
])
def test_bad_length_multiples_exit_2_with_one_line(flags, message, tmp_path,
                                                   capsys):
    status = cli.main(["compare", *flags, "--logdir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert status == 2 and message in err
    assert len(err.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "r")


# --------------------------------------------------------- end to end
def test_a_tiny_comparison_over_depth(tmp_path):
    logdir = str(tmp_path / "runs")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli.main([
            "compare", "--arms", "scaled,unscaled", "--key-dims", "8",
            "--num-layers", "1,2", "--seeds", "1", "--steps", "6",
            "--d-model", "8", "--num-pairs", "3", "--num-keys", "6",
            "--num-values", "4", "--eval-every", "3",
            "--diagnostics-every", "3", "--checkpoint-every", "6",
            "--heldout-size", "16", "--probe-size", "4",
            "--variance-samples", "0", "--jit-compile", "off",
            "--length-multiples", "1,2", "--logdir", logdir])
    assert status == 0
    with open(os.path.join(logdir, "comparison.json")) as handle:
        document = json.load(handle)
    claim = document["claims"]["4"]
    assert claim["depths"] == [1, 2]
    for row in claim["by_depth"]:
        for arm in ("scaled", "unscaled"):
            run = f"{arm}-layers{row['num_layers']}-dk8-seed0"
            with open(os.path.join(logdir, run, "metrics.json")) as handle:
                layers = json.load(handle)["diagnostics"]["init"]["layers"]
            entropy = [np.mean(layers[f"attention_{i}"]["entropy_normalized"])
                       for i in range(row["num_layers"])]
            assert row["arms"][arm]["entropy_init"]["mean"] == \
                pytest.approx(entropy)
    # Claims 1-3 read the one-layer runs only.
    gap = document["claims"]["3"]["by_key_dim"][0]["accuracy_difference"]
    accuracy = {(r["arm"], r["num_layers"]): r["final_accuracy"]
                for r in document["runs"]}
    assert gap == pytest.approx([accuracy["scaled", 1]
                                 - accuracy["unscaled", 1]])
    assert document["slice"] == {"num_layers": 1}
    # Depth over TensorBoard's step axis.
    scalars = read_event_scalars(os.path.join(logdir, "depth"))
    assert scalars["final/accuracy/unscaled"] == pytest.approx(
        {1: accuracy["unscaled", 1], 2: accuracy["unscaled", 2]})
    # Claim 5 from the one-layer runs, evaluated at 3 and 6 pairs.
    rows = document["claims"]["5"]["extrapolation"]["rows"]
    assert [row["eval_pairs"] for row in rows] == [3, 6]
    # At 1x the model is the trained one on the run's own held-out set:
    # the training pipeline's last evaluation, a second code path.
    for arm in ("scaled", "unscaled"):
        assert rows[0]["arms"][arm]["accuracy"][0] == pytest.approx(
            accuracy[arm, 1], abs=1e-6)
    report = open(os.path.join(logdir, "comparison.md")).read()
    assert "## Claim 4: depth" in report and "## Claim 5" in report
    for name in ("depth_accuracy", "depth_entropy", "length_init",
                 "length_eval"):
        assert os.path.exists(os.path.join(logdir, "figures", f"{name}.png"))
