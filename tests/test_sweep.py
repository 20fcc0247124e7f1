"""Tests of `keras-attention sweep` and what it is built from.

A tiny sweep (two arms, one optimizer, two learning rates, one seed, d_k 16,
a few steps, no XLA) runs once per module in this process; the analysis and
the verdicts are checked on hand-made run records whose answers are worked
out here.
"""

import contextlib
import io
import json
import math
import os

import keras
import numpy as np
import pytest

from keras_attention.diagnostics import max_abs_score
from keras_attention.diagnostics import probe_diagnostics
from keras_attention.recording import record_attention
from pipelines import cli
from pipelines.builders import build_model
from pipelines.builders import build_task
from pipelines.flags import add_train_arguments
from pipelines.flags import config_from_args
from pipelines.common import OneLineErrorParser
from pipelines.reports.plotting import figure_svg
from pipelines.sweep import figures
from pipelines.sweep.analysis import lr_sensitivity
from pipelines.sweep.analysis import sensitivities
from pipelines.sweep.analysis import best_rates
from pipelines.sweep.analysis import verdicts
from pipelines.sweep.init_picture import growth_exponents
from pipelines.sweep.init_picture import measure_init
from pipelines.tensorboard import read_event_scalars
from pipelines.train import train

TINY_FLAGS = [
    "--arms", "scaled,unscaled", "--optimizers", "adam",
    "--learning-rates", "1e-2,1e-3", "--key-dims", "16", "--seeds", "1",
    "--steps", "12", "--d-model", "16", "--num-pairs", "4", "--num-keys", "8",
    "--num-values", "4", "--eval-every", "6", "--diagnostics-every", "6",
    "--checkpoint-every", "6", "--heldout-size", "64", "--probe-size", "8",
    "--jit-compile", "off", "--jobs", "1", "--init-key-dims", "none",
]
RUN_NAMES = sorted(f"{arm}-adam-lr{lr}-dk16-seed0"
                   for arm in ("scaled", "unscaled") for lr in ("0.01", "0.001"))


def _main(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(argv)
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    logdir = str(tmp_path_factory.mktemp("sweep") / "runs")
    status, out, err = _main(["sweep", *TINY_FLAGS, "--logdir", logdir])
    assert status == 0, err[-3000:]
    with open(os.path.join(logdir, "sweep.json")) as handle:
        return logdir, out, json.load(handle)


# ------------------------------------------------------------- bad flags
@pytest.mark.parametrize("flags,named", [
    (["--learning-rates", "abc"], "--learning-rates"),
    # A bad item is refused as `train` refuses the single value.
    (["--learning-rates", "0,1e-3"], "--learning-rates must be"),
    (["--learning-rates", "1e-3,1e-3"], "--learning-rates"),
    (["--learning-rates", "nan"], "--learning-rates must be"),
    (["--optimizers", "rmsprop"], "--optimizers must be one of"),
    (["--arms", "scaled,bogus"], "--arms"),
    (["--key-dims", "0"], "--key-dims must be"),
    (["--seeds", "0"], "--seeds"),
    (["--jobs", "0"], "--jobs"),
    (["--preset", "huge"], "--preset"),
    (["--seed", "1"], "--seeds"),
    (["--scale", "none"], "--arms"),
    (["--steps", "0"], "--steps"),
])
def test_bad_values_exit_2_with_one_line_and_write_nothing(tmp_path, flags,
                                                           named):
    logdir = tmp_path / "never"
    status, out, err = _main(["sweep", *flags, "--logdir", str(logdir)])
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and named in err
    assert not logdir.exists()


def test_grid_is_the_product_with_each_run_configured():
    parser = OneLineErrorParser()
    cli.sweep.add_arguments(parser)
    args = parser.parse_args([
        "--arms", "scaled,unscaled,inverse", "--optimizers", "sgd,adam",
        "--learning-rates", "3e-3,1e-4", "--key-dims", "64,16",
        "--seeds", "0,5", "--logdir", "unused",
    ])
    plan = cli.sweep.plan_from_args(args)
    runs = plan.runs()
    assert len(runs) == 3 * 2 * 2 * 2 * 2
    assert plan.axis("learning_rate") == [1e-4, 3e-3]
    assert plan.axis("key_dim") == [16, 64]
    names = ("optimizer", "learning_rate", "key_dim", "seed")
    keys = {(r.arm, *(r.values[name] for name in names)) for r in runs}
    assert len(keys) == len(runs)
    scales = {"scaled": "sqrt", "unscaled": "none", "inverse": "inverse"}
    for run in runs:
        config = run.config
        assert (config.optimizer, config.learning_rate, config.key_dim,
                config.seed) == tuple(run.values[name] for name in names)
        assert config.scale == scales[run.arm] and config.arm == run.arm
        assert config.logdir == os.path.join("unused", run.name)
        # The comparison's model and task.
        assert (config.task, config.d_model, config.qk_init_std) == (
            "recall", 64, "unit")


def test_a_single_value_replaces_the_presets_axis():
    parser = OneLineErrorParser()
    cli.sweep.add_arguments(parser)
    plan = cli.sweep.plan_from_args(parser.parse_args(
        ["--learning-rate", "0.1", "--optimizer", "sgd", "--logdir", "u"]))
    assert plan.axis("learning_rate") == [0.1]
    assert plan.axis("optimizer") == ["sgd"]
    assert {run.name.split("-")[2] for run in plan.runs()} == {"lr0.1"}


def test_scale_inverse_on_train():
    parser = OneLineErrorParser()
    add_train_arguments(parser)
    config = config_from_args(parser.parse_args(["--scale", "inverse"]))
    assert config.scale == "inverse"


# ------------------------------------------------------------ the sweep
def test_sweep_json_schema(tiny_sweep):
    logdir, out, document = tiny_sweep
    assert {"preset", "grid", "runs", "curves", "sensitivity", "best",
            "verdicts", "init_by_key_dim", "overhead", "timing",
            "figures"} <= set(document)
    assert sorted(r["run"] for r in document["runs"]) == RUN_NAMES
    for record in document["runs"]:
        assert {"arm", "optimizer", "learning_rate", "key_dim", "seed",
                "final_loss", "final_accuracy", "init_loss",
                "steps_to_target", "diverged_at_step", "final"} <= set(record)
        assert set(record["final"]) == {"entropy_normalized",
                                        "saturated_fraction",
                                        "max_abs_score", "score_std"}
        assert record["final"]["max_abs_score"] > 0
        assert math.isfinite(record["init_loss"])
        assert 0.0 <= record["final_accuracy"] <= 1.0
    assert len(document["curves"]) == 2 and len(document["best"]) == 2
    assert {v["optimizer"] for v in document["verdicts"]} == {"adam"}
    timing = document["timing"]
    assert timing["trained_now"] == 4 and timing["builds"] == 2
    assert timing["wall_time_s"] > 0 and timing["cpu_time_s"] > 0
    assert 0 < document["overhead"]["overhead_fraction"]
    for path in document["figures"].values():
        assert os.path.getsize(os.path.join(logdir, path)) > 1000
    report = open(os.path.join(logdir, "sweep.md")).read()
    assert "## Verdicts" in report and "unscaled" in report


def test_rerun_skips_finished_runs_and_retrains_a_missing_one(tiny_sweep):
    logdir = tiny_sweep[0]
    metrics = os.path.join(logdir, RUN_NAMES[0], "metrics.json")
    stamps = {name: os.path.getmtime(os.path.join(logdir, name,
                                                  "metrics.json"))
              for name in RUN_NAMES}
    status, out, _ = _main(["sweep", *TINY_FLAGS, "--logdir", logdir])
    assert status == 0 and "4 of 4 runs already complete; skipped" in out
    for name in RUN_NAMES:
        assert os.path.getmtime(os.path.join(logdir, name, "metrics.json")) \
            == stamps[name]
    os.remove(metrics)
    status, out, _ = _main(["sweep", *TINY_FLAGS, "--logdir", logdir])
    assert status == 0 and "3 of 4 runs already complete; skipped" in out
    assert f"{RUN_NAMES[0]}:" in out and os.path.exists(metrics)


def test_html_is_self_contained(tiny_sweep):
    logdir = tiny_sweep[0]
    page = open(os.path.join(logdir, "sweep.html")).read()
    assert "http://" not in page and "https://" not in page
    # The figures inline as SVG (no init figure without init key dims).
    assert page.count("<svg") == 3 and "<script" not in page


def test_hparams_experiment_and_end_metrics(tiny_sweep):
    logdir, _, document = tiny_sweep
    experiment = read_event_scalars(os.path.join(logdir, "experiment"))
    assert "_hparams_/experiment" in experiment
    for record in document["runs"]:
        ends = read_event_scalars(os.path.join(logdir, record["run"],
                                               "validation"))
        assert ends["final_loss"][record["steps"]] == pytest.approx(
            record["final_loss"], rel=1e-6)
        assert ends["final_max_abs_score"][record["steps"]] == pytest.approx(
            record["final"]["max_abs_score"], rel=1e-6)


def test_lr_figure_plots_the_json(tiny_sweep):
    document = tiny_sweep[2]
    figure = figures.lr_figure(document["curves"])
    (loss_ax,), (accuracy_ax,) = figure.axes[0:1], figure.axes[1:2]
    for ax, metric in ((loss_ax, "loss"), (accuracy_ax, "accuracy")):
        plotted = {line.get_label(): (list(line.get_xdata()),
                                      list(line.get_ydata()))
                   for line in ax.lines}
        for curve in document["curves"]:
            xs, ys = plotted[curve["arm"]]
            assert xs == curve["learning_rates"]
            np.testing.assert_allclose(ys, curve[metric]["mean"])
        assert ax.get_xscale() == "log"
    assert figure_svg(figure).startswith("<svg")


def test_sensitivity_figure_plots_the_json(tiny_sweep):
    document = tiny_sweep[2]
    figure = figures.sensitivity_figure(document["sensitivity"])
    heights = sorted(patch.get_height() for patch in figure.axes[0].patches)
    np.testing.assert_allclose(
        heights, sorted(s["mean"] for s in document["sensitivity"]))
    assert figure_svg(figure).startswith("<svg")


# ------------------------------------------------- analysis by hand
def _record(arm, rate, seed, loss, accuracy, target_step=None, init=2.0,
            diverged=None, optimizer="sgd"):
    return {"arm": arm, "optimizer": optimizer, "learning_rate": rate,
            "key_dim": 1024, "seed": seed, "final_loss": loss,
            "final_accuracy": accuracy, "init_loss": init,
            "steps_to_target": target_step, "diverged_at_step": diverged,
            "final": {"max_abs_score": 1.0, "entropy_normalized": 0.5}}


def test_sensitivity_against_a_hand_computed_example():
    # Capped losses [0.5, 0.1, 2.0] (a NaN counts as the init loss 2.0):
    # mean 2.6 / 3 minus the best 0.1.
    assert lr_sensitivity([0.5, 0.1, float("nan")], 2.0) == pytest.approx(
        2.6 / 3 - 0.1)
    # A loss above the init loss is capped at it.
    assert lr_sensitivity([3.0, 1.0], 2.0) == pytest.approx(0.5)
    records = [
        _record("scaled", 0.01, 0, 0.5, 0.9), _record("scaled", 0.1, 0, 0.1, 1),
        _record("scaled", 1.0, 0, None, None, diverged=7),
        _record("scaled", 0.01, 1, 0.3, 0.9), _record("scaled", 0.1, 1, 0.3, 1),
        _record("scaled", 1.0, 1, 5.0, 0.1),
    ]
    (result,) = sensitivities(records)
    # Seed 0: [0.5, 0.1, 2.0] -> 0.7667; seed 1: [0.3, 0.3, 2.0] -> 0.5667.
    assert result["per_seed"][0] == pytest.approx(2.6 / 3 - 0.1)
    assert result["per_seed"][1] == pytest.approx(2.6 / 3 - 0.3)
    assert result["mean"] == pytest.approx(2.6 / 3 - 0.2)
    # The sample sd (n - 1) of two values a, b: |a - b| / sqrt(2).
    assert result["sd"] == pytest.approx(0.2 / 2 ** 0.5)


def _verdict(records, optimizer="sgd"):
    (verdict,) = [v for v in verdicts(best_rates(records), 1000, 0.9)
                  if v["optimizer"] == optimizer]
    return verdict


def _scaled_learns():
    return [_record("scaled", rate, seed, 0.05, 1.0, target_step=400)
            for rate in (0.01, 0.1) for seed in (0, 1)]


def test_verdict_unscaled_fails_everywhere():
    records = _scaled_learns() + [
        _record("unscaled", rate, seed, 1.2 if rate == 0.1 else 1.5,
                0.899 if rate == 0.1 else 0.2)
        for rate in (0.01, 0.1) for seed in (0, 1)]
    verdict = _verdict(records)
    assert verdict["headline"].startswith(
        "unscaled attention fails at every learning rate tried")
    # 0.899 is not the target, and the line gives it unrounded.
    assert "0.899" in verdict["lines"][0]
    assert "largest rate tried" in verdict["lines"][0]  # best at the edge


def test_verdict_names_the_rates_that_rescue_or_partly_rescue():
    rescued = _scaled_learns() + [
        _record("unscaled", 0.01, 0, 1.5, 0.2), _record("unscaled", 0.01, 1, 1.5, 0.2),
        _record("unscaled", 0.1, 0, 0.1, 0.95, 900),
        _record("unscaled", 0.1, 1, 0.1, 0.97, 800)]
    headline = _verdict(rescued)["headline"]
    assert "rescues unscaled" in headline and "0.1" in headline
    assert "fails at every" not in headline
    partly = rescued[:-1] + [_record("unscaled", 0.1, 1, 1.2, 0.5)]
    headline = _verdict(partly)["headline"]
    assert "only partly" in headline and "0.1" in headline


def test_verdict_says_when_the_grid_separates_nothing():
    records = [_record(arm, rate, 0, 1.9, 0.1) for arm in ("scaled", "unscaled")
               for rate in (0.01, 0.1)]
    assert "does not separate them" in _verdict(records)["headline"]


def test_a_diverged_run_is_no_success():
    records = _scaled_learns() + [
        _record("unscaled", 0.01, s, 1.5, 0.2) for s in (0, 1)] + [
        _record("unscaled", 0.1, s, None, None, target_step=100, diverged=300)
        for s in (0, 1)]
    assert _verdict(records)["headline"].startswith("unscaled attention fails")


# ------------------------------------------------------- diagnostics
def test_max_abs_score_against_numpy():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(2, 1, 4, 5)) * 3
    mask = rng.random((2, 1, 4, 5)) > 0.4
    scores[~mask] = 1e6  # masked entries must not count
    assert max_abs_score(scores, mask) == pytest.approx(
        np.abs(scores[mask]).max())
    assert max_abs_score(scores, np.zeros_like(mask)) == 0.0


def test_probe_reports_the_largest_scaled_logit(tiny_config):
    config = tiny_config(scale="inverse", key_dim=8)
    task = build_task(config)
    keras.utils.set_random_seed(0)
    model = build_model(config, task)
    tokens, targets, weights = task.heldout(8, 0)
    diagnostics = probe_diagnostics(model, tokens, targets, weights)
    with record_attention(model) as records:
        model(tokens)
    (record,) = records.values()
    mask = None if record["mask"] is None else np.asarray(record["mask"])
    expected = max_abs_score(np.asarray(record["scores"]), mask)
    assert diagnostics["summary"]["max_abs_score"] == pytest.approx(
        expected, rel=1e-5)


def test_init_picture_growth_follows_the_scale(tiny_config):
    base = tiny_config(d_model=32)
    rows = measure_init(base, [4, 64, 512], [0], log=lambda line: None)
    slopes = growth_exponents(rows)
    # Predicted: 0 (sqrt, qk_norm), +1/2 (none), -1/2 (inverse).
    assert slopes["none"] == pytest.approx(0.5, abs=0.1)
    assert slopes["sqrt"] == pytest.approx(0.0, abs=0.1)
    assert slopes["inverse"] == pytest.approx(-0.5, abs=0.1)
    assert slopes["qk_norm"] == pytest.approx(0.0, abs=0.1)
    figure = figures.init_figure(rows)
    for container in figure.axes[0].containers:  # one errorbar per mode
        mode = container.get_label()
        data_line = container.lines[0]
        np.testing.assert_allclose(
            np.asarray(data_line.get_ydata(), float),
            [r["score_std"]["mean"] for r in rows if r["mode"] == mode])
    assert {c.get_label() for c in figure.axes[0].containers} == set(slopes)
    assert figure_svg(figure).startswith("<svg")
