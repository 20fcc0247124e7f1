"""Tests for the training pipeline (`keras-attention train`).

References are computed independently of the trainer: the first update by
hand from a GradientTape, held-out accuracy and loss in numpy from the saved
model's logits, learning rates from the warmup formula, and the resumed run
against an uninterrupted one.
"""

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_file_loader import (
    EventFileLoader,
)
from tensorboard.plugins.hparams import plugin_data_pb2

from keras_attention.tasks import make_task
from pipelines.cli import main
from pipelines.common import UsageError
from pipelines.builders import build_model
from pipelines.checkpoints import last_checkpointed_step
from pipelines.settings import TASK_DEFAULTS
from pipelines.settings import Layer
from pipelines.settings import TrainConfig
from pipelines.settings import resolve_config
from pipelines.flags import add_train_arguments
from pipelines.flags import config_from_args
from pipelines.run_dir import restore_model
from pipelines.tensorboard import read_event_scalars
from pipelines.train import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse(argv):
    parser = add_train_arguments(argparse.ArgumentParser())
    return config_from_args(parser.parse_args(argv))


def tree_listing(path):
    """Every file under `path` with its size and modification time."""
    listing = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            stat = os.stat(full)
            listing[full] = (stat.st_size, stat.st_mtime_ns)
    return listing


def log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def weighted_loss_and_accuracy(logits, targets, weights):
    """Masked mean cross-entropy and accuracy, in float64 numpy."""
    logits = np.asarray(logits, np.float64)
    log_probs = np.take_along_axis(
        log_softmax(logits), targets[..., None], axis=-1
    )[..., 0]
    correct = logits.argmax(-1) == targets
    return (
        float(-(log_probs * weights).sum() / weights.sum()),
        float((correct * weights).sum() / weights.sum()),
    )


# ------------------------------------------------------------ config
def test_config_flags_file_and_task_defaults(tmp_path):
    config_file = tmp_path / "settings.json"
    config_file.write_text(json.dumps(
        {"task": "sort", "steps": 77, "learning_rate": 0.5, "qk_norm": True}
    ))
    config = parse([
        "--config", str(config_file), "--steps", "99", "--no-qk-norm",
        "--scale", "2.5", "--layers", "3",
    ])
    # The command line overrides the file; the file fills the rest.
    assert (config.task, config.steps, config.learning_rate) == (
        "sort", 99, 0.5
    )
    assert config.qk_norm is False
    assert config.scale == 2.5 and config.num_layers == 3

    # The task's defaults fill what neither gave.
    assert config.key_dim == TASK_DEFAULTS["sort"]["key_dim"]
    assert config.seq_len == TASK_DEFAULTS["sort"]["seq_len"]
    assert config.num_pairs is None  # Not a sort option.
    assert config.logdir == os.path.join("runs", "sort")
    assert TrainConfig.from_dict(config.to_dict()) == config
    json.dumps(config.to_dict())  # JSON-serialisable.

    recall = resolve_config([Layer("test", {"task": "recall"})])
    assert recall.optimizer == "sgd" and recall.momentum == 0.9
    assert parse(["--scale", "none"]).scale == "none"
    assert parse(["--qk-norm"]).qk_norm is True


BAD_FLAGS = [
    (["--task", "nope"], "--task"),
    (["--steps", "0"], "--steps"),
    (["--steps", "ten"], "--steps"),
    (["--batch-size", "-4"], "--batch-size"),
    (["--d-model", "0"], "--d-model"),
    (["--key-dim", "0"], "--key-dim"),
    (["--num-heads", "0"], "--num-heads"),
    (["--num-layers", "0"], "--num-layers"),
    (["--heldout-size", "0"], "--heldout-size"),
    (["--learning-rate", "-0.1"], "--learning-rate"),
    (["--scale", "bogus"], "--scale"),
    (["--scale", "-2"], "--scale"),
    (["--optimizer", "rmsprop"], "--optimizer"),
    (["--precision", "float64"], "--precision"),
    (["--strategy", "everything"], "--strategy"),
    (["--task", "reverse", "--seq-len", "1"], "--seq-len"),
    (["--task", "copy", "--seq-len", "2"], "--seq-len"),
    (["--task", "recall", "--seq-len", "5"], "--seq-len"),
    (["--task", "sort", "--vocab-size", "2"], "--vocab-size"),
    (["--task", "copy", "--vocab-size", "4"], "--vocab-size"),
    (["--task", "recall", "--num-keys", "4"], "--num-keys"),
    (["--task", "recall", "--num-values", "1"], "--num-values"),
    (["--task", "recall", "--vocab-size", "40"], "--vocab-size"),
    (["--steps", "10", "--warmup-steps", "20"], "--warmup-steps"),
    (["--config", "/nonexistent/settings.json"], "--config"),
]


@pytest.mark.parametrize("argv, flag", BAD_FLAGS)
def test_bad_flags_exit_2_with_one_line_and_touch_nothing(
    argv, flag, tmp_path, capsys
):
    logdir = tmp_path / "run"
    status = main(["train", *argv, "--logdir", str(logdir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1, err
    assert err[0].startswith("keras-attention train: error: ")
    assert flag in err[0]
    assert not logdir.exists()


def test_bad_config_file_and_logdir(tmp_path, capsys):
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"stepz": 10}))
    bad_value = tmp_path / "bad_value.json"
    bad_value.write_text(json.dumps({"key_dim": -3}))
    not_json = tmp_path / "not.json"
    not_json.write_text("{steps: 3")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    cases = [
        (["--config", str(unknown)], "stepz"),
        (["--config", str(bad_value)], "--key-dim"),
        (["--config", str(not_json)], "not valid JSON"),
        (["--logdir", str(a_file / "run")], "--logdir"),
        (["--logdir", str(a_file)], "--logdir"),
    ]
    for argv, needle in cases:
        if "--logdir" not in argv:
            argv = argv + ["--logdir", str(tmp_path / "run")]
        assert main(["train", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], (argv, err)
    assert not (tmp_path / "run").exists()
    assert a_file.read_text() == "x"


def test_logdir_with_another_run_is_refused_untouched(tmp_path, capsys):
    logdir = tmp_path / "run"
    logdir.mkdir()
    argv = ["train", "--task", "recall", "--num-pairs", "4", "--num-keys",
            "8", "--num-values", "4", "--d-model", "16", "--key-dim", "16",
            "--steps", "5", "--logdir", str(logdir)]
    other = parse(argv[1:]).replace(precision="float32", key_dim=32)
    (logdir / "config.json").write_text(json.dumps(other.to_dict()))
    before = tree_listing(logdir)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "key_dim: 32 there, 16 now" in err[0], err
    assert tree_listing(logdir) == before


# ------------------------------------------------------------- training
@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="differentiates with tf.GradientTape")
@pytest.mark.parametrize("jit_compile", ["off", "on"])
def test_first_step_is_the_hand_computed_sgd_update(
    tmp_path, jit_compile, tiny_config
):
    # Here only: the JAX and torch child runs collect this module too, and
    # would otherwise import TensorFlow for nothing (5-7 CPU-s each).
    import tensorflow as tf

    # With jit_compile="on" and one replica the update itself runs in XLA.
    config = tiny_config(
        seed=5, steps=1, optimizer="sgd", learning_rate=0.3, momentum=0.9,
        warmup_steps=0, log_every=1, logdir=str(tmp_path / "run"),
        jit_compile=jit_compile,
    )
    train(config)

    resolved = config
    task = make_task("recall", num_pairs=4, num_keys=8, num_values=4)
    keras.utils.set_random_seed(resolved.seed)
    model = build_model(resolved)
    tokens, targets, weights = (
        np.asarray(t) for t in task.batch(resolved.seed, 0, 16)
    )
    with tf.GradientTape() as tape:
        logits = model(tokens, training=True)
        per_position = tf.nn.sparse_softmax_cross_entropy_with_logits(
            targets, logits
        )
        loss = tf.reduce_sum(per_position * weights) / weights.sum()
    gradients = tape.gradient(loss, model.trainable_variables)
    # SGD with momentum starts from a zero velocity: w - lr * g.
    expected = [
        np.asarray(v) - 0.3 * np.asarray(tf.convert_to_tensor(g))
        for v, g in zip(model.trainable_variables, gradients)
    ]
    trained = restore_model(str(tmp_path / "run"))
    by_path = {v.path: np.asarray(v) for v in trained.trainable_variables}
    for variable, want in zip(model.trainable_variables, expected):
        np.testing.assert_allclose(
            by_path[variable.path], want, rtol=1e-5, atol=1e-6
        )

    numpy_loss, _ = weighted_loss_and_accuracy(
        np.asarray(logits), targets, weights
    )
    logged = read_event_scalars(str(tmp_path / "run" / "train"))
    assert logged["loss"][1] == pytest.approx(numpy_loss, rel=1e-5)


def _hparams_logged(run_dir):
    for name in sorted(os.listdir(run_dir)):
        if not name.startswith("events.out.tfevents"):
            continue
        for event in EventFileLoader(os.path.join(run_dir, name)).Load():
            for value in event.summary.value:
                if value.tag == "_hparams_/session_start_info":
                    data = plugin_data_pb2.HParamsPluginData.FromString(
                        value.metadata.plugin_data.content
                    )
                    return {
                        key: _hparam_value(hparam)
                        for key, hparam in
                        data.session_start_info.hparams.items()
                    }
    return None


def _hparam_value(value):
    kind = value.WhichOneof("kind")
    return getattr(value, kind)


@pytest.mark.backends("jax", "torch")
def test_run_directory_events_and_metrics(tmp_path, tiny_config):
    run_dir = tmp_path / "run"
    config = tiny_config(
        seed=5, steps=20, log_every=5, eval_every=10, diagnostics_every=10,
        checkpoint_every=10, learning_rate=0.2, warmup_steps=8,
        target_accuracy=0.3, arm="sqrt-arm", logdir=str(run_dir),
    )
    metrics = train(config)

    resolved = TrainConfig.from_dict(
        json.loads((run_dir / "config.json").read_text())
    )
    # XLA is the JAX trainer's way (`jax.jit`); off on a CPU elsewhere.
    jit = "on" if keras.backend.backend() == "jax" else "off"
    assert resolved == config.replace(precision="float32", jit_compile=jit)
    assert (run_dir / "model.keras").is_file()
    checkpoints = os.listdir(run_dir / "checkpoints")
    assert sorted(checkpoints) == ["ckpt-10.npz", "ckpt-20.npz"]
    assert metrics == json.loads((run_dir / "metrics.json").read_text())

    # Train scalars every log_every steps. Update s (1-based) uses the rate
    # for i = s - 1 updates done: linear warmup over 8 updates, then a
    # cosine from the peak to 0 at step 20.
    train_tags = read_event_scalars(str(run_dir / "train"))
    for tag in ("loss", "accuracy", "learning_rate", "steps_per_second",
                "examples_per_second"):
        assert sorted(train_tags[tag]) == [5, 10, 15, 20], tag
    for step, rate in train_tags["learning_rate"].items():
        done = step - 1
        progress = min(max((done - 8) / (20 - 8), 0.0), 1.0)
        expected = (
            0.2 * min(1.0, (done + 1) / 8)
            * 0.5 * (1.0 + math.cos(math.pi * progress))
        )
        # float32: the cosine cancels near the end of the run.
        assert rate == pytest.approx(expected, rel=1e-6, abs=1e-7)
    for step, rate in train_tags["examples_per_second"].items():
        assert rate == pytest.approx(
            16 * train_tags["steps_per_second"][step], rel=1e-5
        )

    # Held-out scalars and diagnostics at step 0 and every 10 steps; tags
    # name the layer.
    eval_tags = read_event_scalars(str(run_dir / "validation"))
    assert sorted(eval_tags["accuracy"]) == [0, 10, 20]
    for tag in (
        "attention/attention_0/score_std",
        "attention/attention_0/entropy/head0",
        "attention/attention_0/max_weight/head0",
        "attention/attention_0/saturated_fraction/head0",
        "gradients/attention_0/query_kernel",
        "gradients/attention_0/key_kernel",
        "gradients/attention_0/value_kernel",
    ):
        assert sorted(eval_tags[tag]) == [0, 10, 20], tag
    # The Images tab's heat maps come every heatmap_every steps (250 by
    # default) among the diagnostics steps, and at step 0 and the last.
    assert sorted(eval_tags["attention/attention_0/heatmap/head0"]) == [0, 20]
    assert all(
        tag.startswith(("attention/", "gradients/"))
        for tag in eval_tags
        if tag not in ("loss", "accuracy", "config", "steps_to_target")
        and not tag.startswith("_hparams_/")
    )

    # The config as text and as HParams beside the held-out metrics (the
    # HParams session's run); nothing at the run's root.
    assert 0 in eval_tags["config"]
    assert not [name for name in os.listdir(run_dir)
                if name.startswith("events.out.tfevents")]
    hparams = _hparams_logged(str(run_dir / "validation"))
    assert hparams["task"] == "recall" and hparams["key_dim"] == 16
    assert hparams["scale"] == "sqrt" and hparams["arm"] == "sqrt-arm"
    assert hparams["optimizer"] == "sgd"

    # Held-out numbers recomputed in numpy from the saved model.
    task = make_task("recall", num_pairs=4, num_keys=8, num_values=4)
    tokens, targets, weights = task.heldout(64, seed=5)
    model = keras.saving.load_model(run_dir / "model.keras")
    loss, accuracy = weighted_loss_and_accuracy(
        keras.ops.convert_to_numpy(model(tokens)), targets, weights
    )
    assert metrics["heldout_accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert metrics["heldout_loss"] == pytest.approx(loss, rel=1e-5)
    assert eval_tags["accuracy"][20] == pytest.approx(accuracy, abs=1e-6)
    assert [s for s, _ in metrics["eval_history"]] == [0, 10, 20]
    reached = [s for s, a in metrics["eval_history"] if a >= 0.3]
    assert metrics["steps_to_target"] == (reached[0] if reached else None)
    assert metrics["steps"] == 20 and metrics["resumed_from_step"] == 0
    assert metrics["wall_time_s"] > 0 and metrics["examples_per_s"] > 0
    for when in ("init", "final"):
        summary = metrics["diagnostics"][when]["summary"]
        assert set(summary) >= {
            "score_std", "entropy", "max_weight", "saturated_fraction",
            "grad_norm_query", "grad_norm_key",
        }
        assert all(math.isfinite(value) for value in summary.values())
    assert metrics["diagnostics"]["init"]["summary"]["score_std"] == (
        pytest.approx(eval_tags["attention/mean/score_std"][0], rel=1e-6)
    )

    # Without model.keras the model comes back from config + checkpoint.
    os.remove(run_dir / "model.keras")
    for got, want in zip(restore_model(str(run_dir)).get_weights(),
                         model.get_weights()):
        np.testing.assert_array_equal(got, want)


@pytest.mark.backends("jax", "torch")
def test_divergence_stops_with_a_clear_report(tmp_path, capsys):
    logdir = tmp_path / "run"
    status = main([
        "train", "--task", "recall", "--num-pairs", "4", "--num-keys", "8",
        "--num-values", "4", "--d-model", "16", "--key-dim", "16",
        "--optimizer", "sgd", "--learning-rate", "1e12", "--warmup-steps",
        "0", "--steps", "40", "--log-every", "2", "--heldout-size", "64",
        "--quiet", "--strategy", "default", "--logdir", str(logdir),
    ])
    assert status == 1
    assert "non-finite" in capsys.readouterr().err
    metrics = json.loads((logdir / "metrics.json").read_text())
    assert metrics["diverged_at_step"] is not None
    assert metrics["diverged_at_step"] < 40
    assert not (logdir / "model.keras").exists()


# --------------------------------------------------------------- resume
KILL_ARGV = [
    "train", "--task", "recall", "--num-pairs", "4", "--num-keys", "8",
    "--num-values", "4", "--d-model", "16", "--key-dim", "16",
    "--batch-size", "16", "--steps", "150", "--log-every", "1",
    "--eval-every", "25", "--diagnostics-every", "100",
    "--checkpoint-every", "25", "--heldout-size", "64", "--probe-size", "8",
    "--seed", "11", "--deterministic", "--strategy", "default", "--quiet",
]


def _checkpoint_step(run_dir):
    return last_checkpointed_step(str(run_dir / "checkpoints")) or 0


def _logged_train_steps(run_dir):
    return read_event_scalars(str(run_dir / "train")).get("loss", {})


# tests/test_reliability.py kills a run mid-save on TensorFlow and JAX by
# default; this older case, killed at a random point, runs under -m slow.
@pytest.mark.slow
def test_sigkill_resume_matches_uninterrupted_run(tmp_path):
    import tensorflow as tf  # reads the killed run's truncated event files

    killed_dir = tmp_path / "killed"
    command = [sys.executable, "-m", "pipelines", *KILL_ARGV,
               "--logdir", str(killed_dir)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        # Kill once a checkpoint exists and steps past it are logged: the
        # resumed run recomputes those steps and must not log them again.
        deadline = time.time() + 240
        while time.time() < deadline:
            saved = _checkpoint_step(killed_dir)
            if saved >= 25 and max(
                _logged_train_steps(killed_dir), default=0
            ) >= saved + 3:
                break
            assert process.poll() is None, process.stderr.read()[-3000:]
            time.sleep(0.02)
        else:
            pytest.fail("the run logged no steps past a checkpoint in time")
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    process.stderr.close()
    assert process.returncode == -signal.SIGKILL
    assert not (killed_dir / "metrics.json").exists()  # Really cut short.
    killed_at = _checkpoint_step(killed_dir)
    assert 25 <= killed_at < 150
    assert max(_logged_train_steps(killed_dir)) > killed_at

    # The same command again resumes and finishes.
    assert main([*KILL_ARGV, "--logdir", str(killed_dir)]) == 0
    resumed = json.loads((killed_dir / "metrics.json").read_text())
    assert resumed["resumed_from_step"] == killed_at
    assert resumed["steps"] == 150

    clean_dir = tmp_path / "clean"
    assert main([*KILL_ARGV, "--logdir", str(clean_dir)]) == 0
    clean = json.loads((clean_dir / "metrics.json").read_text())
    for got, want in zip(restore_model(str(killed_dir)).get_weights(),
                         restore_model(str(clean_dir)).get_weights()):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert resumed["heldout_accuracy"] == pytest.approx(
        clean["heldout_accuracy"], abs=1e-6
    )
    assert [s for s, _ in resumed["eval_history"]] == list(range(0, 151, 25))
    np.testing.assert_allclose(
        [a for _, a in resumed["eval_history"]],
        [a for _, a in clean["eval_history"]],
        atol=1e-6,
    )

    # Every step is logged exactly once across the killed and the resumed
    # run's event files: one continuous curve.
    for sub, tag, steps in (
        ("train", "loss", range(1, 151)),
        ("validation", "accuracy", range(0, 151, 25)),
    ):
        seen = []
        directory = killed_dir / sub
        for name in sorted(os.listdir(directory)):
            try:
                for event in tf.compat.v1.train.summary_iterator(
                    str(directory / name)
                ):
                    seen += [
                        event.step for value in event.summary.value
                        if value.tag == tag
                    ]
            except tf.errors.DataLossError:
                pass
        assert sorted(seen) == list(steps), (sub, sorted(seen))
    train_clean = read_event_scalars(str(clean_dir / "train"))["loss"]
    train_killed = read_event_scalars(str(killed_dir / "train"))["loss"]
    for step, value in train_clean.items():
        assert train_killed[step] == pytest.approx(value, rel=1e-6)


def test_heatmap_images_come_every_heatmap_every_steps(tmp_path, tiny_config):
    run_dir = tmp_path / "run"
    train(tiny_config(steps=20, eval_every=20, diagnostics_every=5,
                      heatmap_every=10, checkpoint_every=20,
                      logdir=str(run_dir)))
    eval_tags = read_event_scalars(str(run_dir / "validation"))
    assert sorted(eval_tags["attention/attention_0/score_std"]) == [
        0, 5, 10, 15, 20]
    assert sorted(eval_tags["attention/attention_0/heatmap/head0"]) == [
        0, 10, 20]


def _file_digests(directory):
    return {
        os.path.relpath(os.path.join(root, name), directory):
            open(os.path.join(root, name), "rb").read()
        for root, _, names in os.walk(directory) for name in names
    }


@pytest.mark.backends("jax", "torch")
def test_rerun_of_a_finished_run_changes_no_byte_and_steps_are_identity(
        tmp_path, capsys):
    """Issue 23, 1 and 2: a second identical command says the run is
    complete and leaves every file as it was; a changed --steps (the cosine
    schedule's length) is refused in one line, with config.json intact."""
    logdir = tmp_path / "run"
    argv = ["train", "--key-dim", "8", "--d-model", "16", "--batch-size",
            "8", "--heldout-size", "32", "--steps", "20", "--eval-every",
            "10", "--checkpoint-every", "10", "--quiet", "--logdir",
            str(logdir)]
    assert main(argv) == 0
    before = _file_digests(logdir)
    capsys.readouterr()
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.strip() == (f"keras-attention train: the run in {logdir} is "
                           "complete (20 steps); nothing to do")
    assert _file_digests(logdir) == before
    assert main([*argv, "--steps", "40", "--warmup-steps", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "steps: 20 there, 40 now" in err[0], err
    assert _file_digests(logdir) == before


def test_the_loop_fetches_once_a_log(tmp_path, tiny_config, monkeypatch):
    # `RunLoop` reads `fit`'s metric sums and the learning rate to the host
    # in one transfer a log; an evaluation or a checkpoint at a log step
    # fetches nothing more (the sums were moved and reset), one between
    # logs fetches once.
    fetches = []
    convert = keras.ops.convert_to_numpy

    def counting(value):
        caller = sys._getframe(1).f_code.co_filename
        if caller.endswith(os.path.join("pipelines", "loop.py")):
            fetches.append(np.shape(convert(value)))
        return convert(value)

    monkeypatch.setattr(keras.ops, "convert_to_numpy", counting)
    train(tiny_config(steps=20, log_every=5, eval_every=10,
                      checkpoint_every=10, diagnostics_every=20,
                      logdir=str(tmp_path / "logs")))
    # Logs at 5, 10, 15, 20: the four metric variables and the rate.
    assert fetches == [(5,)] * 4
    fetches.clear()
    train(tiny_config(steps=20, log_every=10, eval_every=5,
                      checkpoint_every=20, diagnostics_every=20,
                      logdir=str(tmp_path / "evals")))
    # Logs at 10 and 20, evaluations between them at 5 and 15.
    assert fetches == [(4,), (5,), (4,), (5,)]
