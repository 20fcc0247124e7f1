"""The claims, their verdicts and the report, from hand-made run records.

No training: each test builds a comparison's `Grid` and the results dict that
`compare.measure.collect` would return, then checks the claim statistics
and the verdict texts against numbers computed here.
"""

import math
import statistics

import pytest

from keras_attention.diagnostics import SUMMARY_KEYS
from pipelines.compare import evaluate_claims
from pipelines.compare import grid_claims
from pipelines.compare import render_report
from pipelines.compare.claims.learning import control_lines
from pipelines.compare.claims.learning import learning_claim
from pipelines.compare.claims.learning import learning_verdict
from pipelines.compare.claims.saturation import saturation_claim
from pipelines.compare.claims.saturation import saturation_verdict
from pipelines.compare.claims.variance import variance_claim
from pipelines.compare.claims.variance import variance_verdict
from pipelines.compare.report import status_word
from pipelines.reports.numbers import mean_sd
from pipelines.settings import Layer
from pipelines.settings import resolve_config
from pipelines.engine import Grid

KEY_DIMS = [16, 64]
TRAINED = 64
SEEDS = [0, 1]
TARGET = 0.9


def _plan(arms=("scaled", "unscaled"), train_key_dims=(TRAINED,)):
    base = resolve_config(
        [Layer("test", {"target_accuracy": TARGET, "logdir": "unused"})]
    )
    return Grid(command="compare", logdir="unused", base=base,
                arms=list(arms),
                axes={"key_dim": list(KEY_DIMS), "seed": list(SEEDS)},
                trained={"key_dim": list(train_key_dims)})


def _summary(arm, key_dim, seed):
    """Init statistics in the lesson's shape: the unscaled scores are the
    scaled ones times sqrt(d_k), and peakier the larger d_k."""
    unscaled = arm != "scaled"
    wobble = 0.01 * seed
    return {
        "score_std": (1.0 + wobble) * (math.sqrt(key_dim) if unscaled else 1),
        "entropy": 2.0 - wobble,
        "entropy_normalized": (4.0 / key_dim if unscaled else 0.85) + wobble,
        "max_weight": 0.9 if unscaled else 0.2,
        "saturated_fraction": 0.5 + wobble if unscaled else 0.0,
        "grad_norm_query": 4.0 if unscaled else 1.0,
        "grad_norm_key": 3.0 if unscaled else 1.0,
        "grad_norm_scores": (0.1 if unscaled else 1.0) + wobble,
        "max_abs_score": 4.0 * (math.sqrt(key_dim) if unscaled else 1),
    }


def _run(arm, seed, accuracy, steps_to_target=None):
    return {
        "arm": arm, "key_dim": TRAINED, "seed": seed,
        "run": f"{arm}-dk{TRAINED}-seed{seed}",
        "final_accuracy": accuracy, "final_loss": 1.0, "steps": 1000,
        "steps_to_target": steps_to_target, "target_accuracy": TARGET,
        "diverged_at_step": None, "wall_time_s": 10.0, "eval_history": [],
        "init": _summary(arm, TRAINED, seed),
        "final": dict(_summary(arm, TRAINED, seed), score_std=2.0),
    }


def _results(accuracies=None, arms=("scaled", "unscaled")):
    """Trained runs at d_k 64, init-only records at d_k 16."""
    accuracies = accuracies or {"scaled": [0.95, 0.9], "unscaled": [0.1, 0.2]}
    runs = [
        _run(arm, seed, accuracy,
             steps_to_target=400 + 100 * seed if accuracy >= TARGET else None)
        for arm in arms
        for seed, accuracy in zip(SEEDS, accuracies[arm])
    ]
    init_only = [
        {"arm": arm, "key_dim": 16, "seed": seed,
         "init": _summary(arm, 16, seed)}
        for arm in arms for seed in SEEDS
    ]
    return {"runs": runs, "init_only": init_only, "heatmaps": []}


def _variance_rows(off_by=0.0):
    rows = []
    for key_dim in KEY_DIMS:
        error = math.sqrt((2.0 + 6.0 / key_dim) / 10000)
        rows.append({
            "key_dim": key_dim, "samples": 10000,
            "var_unscaled": key_dim * (1 + off_by * error),
            "theory_unscaled": float(key_dim),
            "var_scaled": 1.0 + error, "theory_scaled": 1.0,
            "std_unscaled": math.sqrt(key_dim), "std_scaled": 1.0,
            "relative_standard_error": error,
        })
    return rows


def _mean(arm, key_dim, key):
    return statistics.fmean(_summary(arm, key_dim, s)[key] for s in SEEDS)


def test_mean_sd_is_the_sample_mean_and_sd_of_the_given_values():
    assert mean_sd([1.0, None, 2.0, 3.0]) == pytest.approx((2.0, 1.0))
    assert mean_sd([0.25]) == (0.25, 0.0)
    assert mean_sd([None]) == (None, None)


def test_records_carry_every_summary_key():
    assert set(_summary("scaled", 16, 0)) == set(SUMMARY_KEYS)


def test_claim_1_holds_with_the_ratio_of_the_seeds_mean_score_std():
    claim = variance_claim(_plan(), _results(), _variance_rows(off_by=1))
    assert claim["holds"] is True
    assert claim["variance_within_tolerance"] == [True, True]
    for row, key_dim in zip(claim["score_std_ratios"], KEY_DIMS):
        ratio = (_mean("unscaled", key_dim, "score_std")
                 / _mean("scaled", key_dim, "score_std"))
        assert row["key_dim"] == key_dim
        assert row["ratio"] == pytest.approx(ratio)
        assert row["relative_error"] == pytest.approx(
            ratio / math.sqrt(key_dim) - 1)
    lines, holds = variance_verdict(claim, _variance_rows(off_by=1))
    assert holds is True and status_word(holds) == "holds"
    worst = max(1 * r["relative_standard_error"] for r in _variance_rows())
    assert f"(largest relative deviation {worst:.1%})" in lines[0]
    assert "4.00 at d_k 16 (√d_k = 4.00), 8.00 at d_k 64" in lines[1]
    assert "within 5% of √d_k everywhere" in lines[1]
    assert "score std, 1.00–1.00: close to 1" in lines[1]


def test_claim_1_fails_beyond_four_standard_errors():
    rows = _variance_rows(off_by=4.5)
    claim = variance_claim(_plan(), _results(), rows)
    assert claim["holds"] is False
    assert claim["variance_within_tolerance"] == [False, False]
    lines, holds = variance_verdict(claim, rows)
    assert "NOT confirmed" in lines[0] and status_word(holds) == "not supported"


def test_claim_1_fails_when_the_ratio_misses_sqrt_key_dim():
    results = _results()
    for record in results["runs"] + results["init_only"]:
        if record["arm"] == "unscaled":
            record["init"]["score_std"] *= 1.1
    claim = variance_claim(_plan(), results, _variance_rows())
    assert claim["holds"] is False
    assert all(r["relative_error"] == pytest.approx(0.1)
               for r in claim["score_std_ratios"])
    lines, _ = variance_verdict(claim, _variance_rows())
    assert "NOT within 5% of √d_k everywhere" in lines[1]


def test_claim_2_compares_mean_normalized_entropy_per_key_dim():
    claim = saturation_claim(_plan(), _results())
    assert claim["holds"] is True
    assert claim["unscaled_lower"] and claim["unscaled_falling_with_key_dim"]
    for row, key_dim in zip(claim["entropy"], KEY_DIMS):
        for arm in ("scaled", "unscaled"):
            for key in ("entropy_normalized", "max_weight",
                        "saturated_fraction"):
                assert row[f"{arm}_{key}"] == pytest.approx(
                    _mean(arm, key_dim, key))
    (text,), holds = saturation_verdict(claim)
    assert holds is True
    pieces = [
        f"d_k {d}: {_mean('scaled', d, 'entropy_normalized'):.2f} vs "
        f"{_mean('unscaled', d, 'entropy_normalized'):.2f}" for d in KEY_DIMS
    ]
    assert ", ".join(pieces) in text
    saturated = _mean("unscaled", TRAINED, "saturated_fraction")
    assert f"largest d_k: {saturated:.0%} unscaled, 0% scaled" in text


def test_claim_2_fails_when_unscaled_entropy_does_not_fall():
    results = _results()
    for record in results["runs"]:
        if record["arm"] == "unscaled":
            record["init"]["entropy_normalized"] = 0.5  # above d_k 16's 0.25
    claim = saturation_claim(_plan(), results)
    assert claim["unscaled_lower"] is True
    assert claim["unscaled_falling_with_key_dim"] is False
    assert claim["holds"] is False
    (text,), _ = saturation_verdict(claim)
    assert "does NOT fall steadily" in text


def test_claims_need_both_arms():
    plan = _plan(arms=("scaled", "learned"))
    results = _results(
        {"scaled": [0.95, 0.9], "learned": [0.9, 0.9]},
        arms=("scaled", "learned"))
    claims = evaluate_claims(plan, {**results, "variance": []})
    assert [claims[n]["holds"] for n in "123"] == [None, None, None]
    assert saturation_verdict(claims["2"]) == (
        ["Needs the scaled and unscaled arms."], None)
    assert learning_verdict(claims["3"], TARGET) == (
        ["Needs trained scaled and unscaled runs."], None)
    assert claims["3"]["arms_at_largest_key_dim"]["learned"] == {
        "seeds": 2, "reached": 2, "final_accuracy": pytest.approx(0.9)}
    assert status_word(None) == "not measured"


def test_claim_3_holds_with_a_gap_on_every_seed_and_vanishing_gradient():
    claim = learning_claim(_plan(), _results())
    assert claim["holds"] is True
    (gap,) = claim["by_key_dim"]
    assert gap["seeds"] == SEEDS
    assert gap["accuracy_difference"] == pytest.approx([0.85, 0.7])
    assert (gap["scaled_reached"], gap["unscaled_reached"]) == (2, 0)
    for key in ("scores", "query", "key"):
        ratio = (_mean("unscaled", TRAINED, f"grad_norm_{key}")
                 / _mean("scaled", TRAINED, f"grad_norm_{key}"))
        assert gap[f"grad_{key}_ratio"] == pytest.approx(ratio)
    lines, holds = learning_verdict(claim, TARGET)
    assert holds is True
    assert lines[0] == (
        "d_k 64: scaled minus unscaled final accuracy per seed +0.85, "
        "+0.70; target 0.9 reached by 2/2 scaled and 0/2 unscaled runs. "
        "A training gap on every seed."
    )
    scores = gap["grad_scores_ratio"]
    assert lines[1].startswith(
        f"Gradients at init, d_k 64, unscaled/scaled: |dL/dscores| "
        f"{scores:.2f}×, |dL/dW_Q| 4.00×, |dL/dW_K| 3.00×.")
    assert "(here it is smaller unscaled)" in lines[1]
    assert lines[-1] == ("Claim 3 holds: the scaled model learns and the "
                         "unscaled one stalls on every seed at d_k 64.")


def test_claim_3_needs_the_gap_on_every_seed():
    results = _results({"scaled": [0.95, 0.3], "unscaled": [0.1, 0.3]})
    claim = learning_claim(_plan(), results)
    (gap,) = claim["by_key_dim"]
    assert gap["gap_on_average"] and not gap["gap_every_seed"]
    assert claim["holds"] is False
    lines, _ = learning_verdict(claim, TARGET)
    assert lines[0].endswith("A gap on average, but not on every seed.")
    assert lines[-1].startswith("Claim 3 is NOT supported")


def test_claim_3_needs_a_smaller_gradient_at_the_softmax_input():
    results = _results()
    for record in results["runs"]:
        if record["arm"] == "unscaled":
            record["init"]["grad_norm_scores"] = 2.0
    claim = learning_claim(_plan(), results)
    assert claim["by_key_dim"][0]["gap_every_seed"]
    assert claim["holds"] is False
    lines, _ = learning_verdict(claim, TARGET)
    assert "NOT smaller unscaled" in lines[1]


def test_control_arms_explain_a_gap():
    arms = {"saturated_init": {"seeds": 2, "reached": 0,
                               "final_accuracy": 0.125},
            "compensated_init": {"seeds": 2, "reached": 1,
                                 "final_accuracy": 0.5},
            "qk_norm": {"seeds": 2, "reached": 2, "final_accuracy": 0.95}}
    lines = control_lines(arms, 64, gap=True)
    assert lines[0].startswith(
        "Control at d_k 64: `saturated_init` reached the target in 0/2 "
        "seeds (mean final accuracy 0.125).")
    assert "what stalls learning is the saturated start" in lines[0]
    assert "an unsaturated start recovers much" in lines[1]
    assert lines[2] == ("At d_k 64, `qk_norm` reached the target in 2/2 "
                        "seeds (mean final accuracy 0.950).")
    # Without a gap the controls are only reported.
    assert [line.split(",")[1] for line in control_lines(arms, 64, False)] == [
        " `saturated_init` reached the target in 0/2 seeds (mean final "
        "accuracy 0.125).", " `compensated_init` reached the target in 1/2 "
        "seeds (mean final accuracy 0.500).", " `qk_norm` reached the target"
        " in 2/2 seeds (mean final accuracy 0.950)."]


def test_report_shows_the_verdicts_and_the_seed_means():
    plan, results = _plan(), _results()
    results = {**results, "variance": _variance_rows()}
    claims = evaluate_claims(plan, results)
    report = render_report(plan, results, grid_claims(plan), claims,
                           wall_time_s=12.4, trained_now=["a"])
    for number in "123":
        assert f"**Claim {number}." in report
        assert f": {status_word(claims[number]['holds'])}.**" in report
    assert "Wall time of this invocation: 12 s (1 runs trained now); the " \
           "training runs' own wall times sum to 40 s." in report
    assert "### d_k = 16 (init only)" in report
    accuracy = [0.95, 0.9]
    cell = (f"{statistics.fmean(accuracy):.3f} ± "
            f"{statistics.stdev(accuracy):.3f}")
    assert f"| final held-out accuracy | {cell} | 0.150 ± 0.071 |" in report
    assert "| steps to 0.9 (seeds reaching) | 450 ± 71 (2/2) | never (0/2) |" \
        in report
    assert "| final: score std | 2.000 ± 0.000 | 2.000 ± 0.000 |" in report


@pytest.mark.parametrize("reached, saturated, compensated", [
    (0, "it failed too, so what stalls learning is the saturated start, "
        "not the missing divisor as such.",
        "it failed as well, so an unsaturated start alone did not rescue "
        "the unscaled model here."),
    (1, "it still learned, so the scale helps beyond the starting point.",
        "it learned, so an unsaturated start recovers much of what the "
        "scale gives."),
])
def test_control_lines_in_full(reached, saturated, compensated):
    arm = {"seeds": 1, "reached": reached, "final_accuracy": None}
    lines = control_lines({"saturated_init": arm, "compensated_init": arm},
                          1024, gap=True)
    outcome = f"reached the target in {reached}/1 seeds (mean final " \
              "accuracy –)"
    assert lines == [
        f"Control at d_k 1024: `saturated_init` {outcome}. It has the scale "
        "but starts from the unscaled model's saturated scores; " + saturated,
        f"Control at d_k 1024: `compensated_init` {outcome}. It has no scale "
        "but starts from unsaturated scores; " + compensated,
    ]
