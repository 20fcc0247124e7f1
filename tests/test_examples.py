"""The scripts of `examples/`, run as a user runs them (at tiny sizes), and
what they log read back with TensorBoard's own event reader.

Each script runs in this process through `runpy` with its command-line
flags; the attention summaries are decoded here from the raw blobs (JSON,
then little-endian float16), not by the package.
"""

import json
import math
import pathlib
import os
import runpy
import subprocess
import sys

import keras
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util.tensor_util import make_ndarray

from _backends import from_outer_run
from _backends import run_pytest_under

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
# Tiny sizes: 64 sequences in batches of 16 for 2 epochs are 8 batches; with
# an update every 3 batches the monitor logs at steps 0, 3, 6 and the end.
TINY = ["--sequences", "64", "--batch-size", "16", "--epochs", "2",
        "--update-freq", "3", "--seq-len", "6"]
STEPS = [0, 3, 6, 8]
SEQ_LEN = 6
NUM_EXAMPLES = 4


def run_example(name, argv, monkeypatch, capsys):
    """Runs examples/<name>.py as `python examples/<name>.py *argv` does;
    returns its module namespace and what it printed."""
    monkeypatch.setattr(sys, "argv", [str(EXAMPLES / f"{name}.py"), *argv])
    namespace = runpy.run_path(str(EXAMPLES / f"{name}.py"),
                               run_name="__main__")
    return namespace, capsys.readouterr().out


def read_run(directory):
    """`(maps, scalars)` of one run directory by TensorBoard's reader:
    `maps[tag][step] = (meta, weights)`, `scalars[tag][step] = value`."""
    reader = event_accumulator.EventAccumulator(
        str(directory), size_guidance={event_accumulator.TENSORS: 0})
    reader.Reload()
    maps, scalars = {}, {}
    for tag in reader.Tags()[event_accumulator.TENSORS]:
        plugin = reader.SummaryMetadata(tag).plugin_data.plugin_name
        for event in reader.Tensors(tag):
            if plugin == "attention":
                meta_blob, weight_blob = event.tensor_proto.string_val
                meta = json.loads(meta_blob.decode("utf-8"))
                assert meta["dtype"] == "float16"
                weights = np.frombuffer(weight_blob, "<f2").astype(
                    np.float32).reshape(meta["shape"])
                maps.setdefault(tag, {})[event.step] = (meta, weights)
            elif plugin == "scalars":
                scalars.setdefault(tag, {})[event.step] = float(
                    make_ndarray(event.tensor_proto))
    return maps, scalars


def softmax(scores):
    scores = scores - scores.max(-1, keepdims=True)
    return np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)


def normalized_entropy(weights):
    return -np.sum(weights * np.log(np.maximum(weights, 1e-30)), -1) / (
        np.log(weights.shape[-1]))


# ------------------------------------------------ (a) MultiHeadAttention
@pytest.mark.example_script
def test_mha_fit_tensorboard(tmp_path, capsys):
    keras.backend.clear_session()  # layer names count from the start
    keras.utils.set_random_seed(0)
    logdir = tmp_path / "logs"
    # Its main(), to keep the trained model.
    namespace = runpy.run_path(str(EXAMPLES / "mha_fit_tensorboard.py"))
    model = namespace["main"]([*TINY, "--logdir", str(logdir)])
    assert f"tensorboard --logdir {logdir}" in capsys.readouterr().out
    maps, scalars = read_run(logdir / "train")

    # One map tag, the layer's own name, at every logging step.
    assert list(maps) == ["attention/multi_head_attention/maps"]
    logged = maps["attention/multi_head_attention/maps"]
    assert sorted(logged) == STEPS
    meta, weights = logged[STEPS[-1]]
    assert weights.shape == (NUM_EXAMPLES, 2, SEQ_LEN, SEQ_LEN)
    # The labels are the example digits, queries and keys alike.
    tokens, _ = namespace["reversal_data"](NUM_EXAMPLES, SEQ_LEN, 10, seed=1)
    digits = [[str(t) for t in row] for row in tokens]
    assert meta["query_labels"] == digits == meta["key_labels"]
    # The last maps are what the trained layer itself returns for the
    # examples (float16 in the file).
    layer = model.get_layer("multi_head_attention")
    features = keras.Model(model.input, layer.input[0])(tokens)  # (x, x)
    _, own = layer(features, features, return_attention_scores=True)
    np.testing.assert_allclose(weights, keras.ops.convert_to_numpy(own),
                               atol=1e-3)
    # The statistics are those of the weights, computed here in numpy.
    np.testing.assert_allclose(
        meta["statistics"]["entropy_normalized"],
        normalized_entropy(weights).mean(-1), atol=1e-2)

    # Training moved the maps. Per head, the entropy scalar at each step is
    # that of the logged maps, and the gradient at the scores is logged
    # (the examples have targets).
    assert not np.allclose(logged[0][1], weights, atol=1e-3)
    for head in range(2):
        entropy = scalars[
            f"attention/multi_head_attention/entropy_normalized/head{head}"]
        assert sorted(entropy) == STEPS
        for step in STEPS:
            assert entropy[step] == pytest.approx(
                normalized_entropy(logged[step][1][:, head]).mean(), abs=1e-2)
    assert sorted(scalars["gradients/multi_head_attention/scores"]) == STEPS
    # fit's own loss, per epoch, written by the monitor.
    assert sorted(scalars["epoch_loss"]) == [0, 1]


# ------------------------------------------------- (b) the scale lesson
@pytest.mark.example_script
def test_scale_vs_no_scale(tmp_path, monkeypatch, capsys):
    keras.backend.clear_session()  # layer names count from the start
    keras.utils.set_random_seed(0)
    key_dim = 16
    logdir = tmp_path / "logs"
    _, printed = run_example(
        "scale_vs_no_scale",
        [*TINY, "--key-dim", str(key_dim), "--logdir", str(logdir)],
        monkeypatch, capsys)
    lines = printed.strip().splitlines()
    assert lines[-1] == f"tensorboard --logdir {logdir}"
    for line, arm in zip(lines[-3:-1], ("scaled", "unscaled")):
        assert line.split()[0] == arm and "final loss" in line
        assert "entropy" in line

    runs = {arm: read_run(logdir / f"{arm}-dk{key_dim}-seed0" / "train")
            for arm in ("scaled", "unscaled")}
    tag = "attention/attention/maps"
    for arm, (maps, scalars) in runs.items():
        assert sorted(maps[tag]) == STEPS, arm
        # (x, y) examples: the gradient at the scores at every step.
        assert sorted(scalars["gradients/attention/scores"]) == STEPS, arm
    scaled_meta, scaled = runs["scaled"][0][tag][0]
    unscaled_meta, unscaled = runs["unscaled"][0][tag][0]

    # At step 0 both runs have the same weights and inputs, so the unscaled
    # scores are the scaled ones times sqrt(d_k): their std by exactly that,
    # per example and head.
    ratio = (np.asarray(unscaled_meta["statistics"]["score_std"])
             / np.asarray(scaled_meta["statistics"]["score_std"]))
    np.testing.assert_allclose(ratio, math.sqrt(key_dim), rtol=1e-4)
    score_std = {arm: scalars["attention/attention/score_std"][0]
                 for arm, (_, scalars) in runs.items()}
    assert score_std["unscaled"] / score_std["scaled"] == pytest.approx(
        math.sqrt(key_dim), rel=1e-4)
    # ... and the scaled scores have a std near 1 (unit-variance q and k).
    assert 0.5 < np.mean(scaled_meta["statistics"]["score_std"]) < 2.0
    # The unscaled weights are the scaled ones sharpened: softmax of
    # sqrt(d_k) * log(w) (log w is the scores up to a constant per row;
    # float16 weights: measured within 5e-4).
    np.testing.assert_allclose(
        unscaled, softmax(math.sqrt(key_dim) * np.log(scaled)), atol=2e-3)
    assert (normalized_entropy(unscaled).mean()
            < normalized_entropy(scaled).mean() - 0.2)


@pytest.mark.parametrize("name, flag", [
    ("mha_fit_tensorboard", "--update-freq"),
    ("scale_vs_no_scale", "--key-dim"),
])
def test_bad_flag_refused_before_training(name, flag, tmp_path, monkeypatch,
                                          capsys):
    logdir = tmp_path / "logs"
    with pytest.raises(SystemExit) as exit_info:
        run_example(name, [flag, "0", "--logdir", str(logdir)], monkeypatch,
                    capsys)
    assert exit_info.value.code == 2
    assert (f"error: argument {flag}: must be a positive integer; received "
            f"'0'") in capsys.readouterr().err
    assert not logdir.exists()


# ---------------------------------------------------- the README's snippet
def test_readme_snippet_runs(tmp_path, monkeypatch):
    """README.md's `fit` code block (the one with `AttentionMonitor(`),
    with the example's `PositionEmbedding` and 64 sequences in place of
    4096, writes the maps of `multi_head_attention` under logs/train."""
    readme = (EXAMPLES.parent / "README.md").read_text()
    snippets = [block.split("```", 1)[0]
                for block in readme.split("```python\n")[1:]]
    snippet, = [block for block in snippets if "AttentionMonitor(" in block]
    assert len(snippet.splitlines()) <= 15
    assert "(4096, 8)" in snippet
    snippet = snippet.replace("(4096, 8)", "(64, 8)")
    example = runpy.run_path(
        str(EXAMPLES / "mha_fit_tensorboard.py"))
    monkeypatch.chdir(tmp_path)
    keras.backend.clear_session()  # layer names count from the start
    keras.utils.set_random_seed(0)
    namespace = {"PositionEmbedding": example["PositionEmbedding"]}
    exec(compile(snippet, "README.md", "exec"), namespace)
    maps, _ = read_run(tmp_path / "logs" / "train")
    # 64 sequences in Keras's default batches of 32: 2 a epoch, 8 in all.
    logged = maps["attention/multi_head_attention/maps"]
    assert sorted(logged) == [0, 8]
    meta, weights = logged[8]
    assert weights.shape == (4, 2, 8, 8)
    # Labelled with the digits of the first four sequences.
    assert meta["query_labels"] == [
        [str(d) for d in row] for row in namespace["x_train"][:4]]


# ------------------------------------------------------- other backends
@pytest.mark.slow
@from_outer_run
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_examples_on_other_backends(backend):
    """Both scripts and their checks on JAX and torch (a child pytest;
    measured 19-42 s on JAX, 14-22 s on torch on 2 shared cores: slow,
    the default run covers the scripts on TensorFlow)."""
    run_pytest_under(backend, ["test_examples.py"], markers="example_script")


@pytest.mark.slow
@from_outer_run
def test_mha_example_without_tensorflow(tmp_path):
    """examples/mha_fit_tensorboard.py as a user runs it on JAX where
    TensorFlow cannot be imported: the monitor writes fit's loss itself
    (measured 13-21 s)."""
    pytest.importorskip("jax")
    logdir = tmp_path / "logs"
    # `sys.modules["tensorflow"] = None`: importing it fails and find_spec
    # finds nothing, as when it is not installed.
    code = ("import runpy, sys; sys.modules['tensorflow'] = None; "
            "sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__'); "
            "assert sys.modules['tensorflow'] is None")
    result = subprocess.run(
        [sys.executable, "-c", code, str(EXAMPLES / "mha_fit_tensorboard.py"),
         *TINY, "--logdir", str(logdir)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
             "PYTHONPATH": os.pathsep.join(filter(None, [
                 str(EXAMPLES.parent), os.environ.get("PYTHONPATH")]))})
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"tensorboard --logdir {logdir}" in result.stdout
    maps, scalars = read_run(logdir / "train")
    assert sorted(maps["attention/multi_head_attention/maps"]) == STEPS
    assert sorted(scalars["epoch_loss"]) == [0, 1]
