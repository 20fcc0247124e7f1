"""Tests of model export (`keras_attention.export`, `keras-attention export`).

References are independent of the exporter: the Keras model's own logits,
attention weights recomputed in numpy from each attention layer's input and
kernels, and the exported files read back by other programs: a Python
process that cannot import Keras or this package (it loads the SavedModel
with plain TensorFlow and runs `saved_model_cli show --all` in it), the
TFLite interpreter and `keras.saving.load_model`.

The processes that read the SavedModel start with the first test and work
while the in-process tests go on; the tests that need their results come
last.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attention import export as export_lib
from keras_attention.export import export_model
from keras_attention.export import serving_module
from keras_attention.recording import attention_layers
from keras_attention.models import build_sequence_model
from pipelines.cli import main
from pipelines.run_dir import restore_model
from pipelines.train import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB, SEQ_LEN, HEADS, KEY_DIM = 12, 7, 2, 8
SMALL = dict(
    vocab_size=VOCAB, seq_len=SEQ_LEN, d_model=16, key_dim=KEY_DIM,
    num_heads=HEADS, ff_dim=32, num_layers=2,
)

# A process that can import neither Keras nor this package (a `None` entry in
# `sys.modules` makes `import` fail and `find_spec` report "not installed"),
# loads the SavedModel with plain TensorFlow, runs both signatures and calls
# the serving signature with bad inputs.
FRESH_PROCESS = textwrap.dedent(
    """
    import contextlib, io, json, os, sys, time
    for name in ("keras", "keras_attention", "tf_keras"):
        sys.modules[name] = None
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.tools import saved_model_cli
    {wait_for}

    saved_model, tokens_file, out, ready = sys.argv[1:5]
    wait_for(ready)
    tokens = tf.constant(np.load(tokens_file))
    loaded = tf.saved_model.load(saved_model)
    served = loaded.signatures["serving_default"](tokens=tokens)
    weights = loaded.signatures["attention"](tokens=tokens)
    arrays = {"served/" + k: v.numpy() for k, v in served.items()}
    arrays.update({"attention/" + k: v.numpy() for k, v in weights.items()})
    np.savez(out + ".npz", **arrays)

    bad_inputs = {
        "float32": tf.cast(tokens, tf.float32),
        "int64": tf.cast(tokens, tf.int64),
        "rank1": tokens[0],
        "rank3": tokens[None],
        "length": tokens[:, :3],
    }
    errors = {}
    for label, bad in bad_inputs.items():
        for way, call in (
            ("signature", loaded.signatures["serving_default"]),
            ("function", lambda tokens: loaded.serving_default(tokens)),
        ):
            try:
                call(tokens=bad)
                errors[label + "/" + way] = None
            except Exception as error:
                errors[label + "/" + way] = [type(error).__name__, str(error)]
    leaked = sorted(
        name for name, module in sys.modules.items()
        if module is not None
        and name.split(".")[0] in ("keras", "keras_attention")
    )

    # `saved_model_cli show --all`: the console script calls this `main`.
    sys.argv = ["saved_model_cli", "show", "--all", "--dir", saved_model]
    listing = io.StringIO()
    with contextlib.redirect_stdout(listing):
        try:
            saved_model_cli.main()
        except SystemExit as exit:
            assert not exit.code, exit.code
    with open(out + ".json", "w") as handle:
        json.dump(
            {"errors": errors, "leaked": leaked, "cli": listing.getvalue()},
            handle,
        )
    """
)

# Exports with overwrite=True onto an existing SavedModel and is killed with
# SIGKILL once the new model is completely written, just before it would be
# moved into place.
KILLED_EXPORT = textwrap.dedent(
    """
    import os, signal, sys, time
    import keras
    from keras_attention import export
    from keras_attention.models import build_sequence_model
    {wait_for}

    def die(source, path):
        os.kill(os.getpid(), signal.SIGKILL)

    export._move_into_place = die
    keras.utils.set_random_seed(11)
    model = build_sequence_model(**{options})
    wait_for(sys.argv[2])
    export.export_model(model, sys.argv[1], overwrite=True)
    """
)

# The processes start (and import TensorFlow) while the test process writes
# the model they read; they wait for a flag file.
WAIT_FOR = """
def wait_for(flag, timeout=600):
    deadline = time.monotonic() + timeout
    while not os.path.exists(flag):
        if time.monotonic() > deadline:
            sys.exit("timed out waiting for " + flag)
        time.sleep(0.05)
"""
FRESH_PROCESS = FRESH_PROCESS.replace("{wait_for}", WAIT_FOR)
KILLED_EXPORT = KILLED_EXPORT.replace("{wait_for}", WAIT_FOR)


def _env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [REPO, env.get("PYTHONPATH")])
    )
    return env


def _start(script_or_argv, *args):
    argv = (
        [sys.executable, "-c", script_or_argv, *args]
        if isinstance(script_or_argv, str)
        else list(script_or_argv)
    )
    return subprocess.Popen(
        argv, cwd=REPO, env=_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )


def _finish(process, timeout=240):
    stdout, stderr = process.communicate(timeout=timeout)
    return process.returncode, stdout, stderr


def _numpy_attention_weights(model, tokens):
    """Each attention layer's weights from its input and kernels, in numpy.

    The models mask padding (id 0) for queries and keys; a masked query row
    attends nowhere and has all-zero weights.
    """
    valid = tokens != 0
    mask = valid[:, None, :, None] & valid[:, None, None, :]
    weights = {}
    for layer in attention_layers(model):
        # The attention sits in a TransformerBlock: its query is the block's
        # input, layer-normalized in a pre-norm block.
        block = next(block for block in model.layers
                     if getattr(block, "attention", None) is layer)
        x = keras.Model(model.input, block.input)(tokens)
        if block.norm == "pre":
            x = block.attention_norm(x)
        x = np.asarray(x, "float64")
        q = np.einsum("btd,dhk->bhtk", x, np.asarray(layer.query_kernel))
        k = np.einsum("bsd,dhk->bhsk", x, np.asarray(layer.key_kernel))
        scores = np.einsum("bhtk,bhsk->bhts", q, k) / np.sqrt(layer.key_dim)
        scores = np.where(mask, scores, -np.inf)
        peak = np.max(scores, axis=-1, keepdims=True)
        peak = np.where(np.isfinite(peak), peak, 0.0)  # rows with no key
        exp = np.where(mask, np.exp(scores - peak), 0.0)
        total = exp.sum(-1, keepdims=True)
        weights[layer.name] = exp / np.maximum(total, 1e-300)
    return weights


def _tree(path):
    """Relative path -> sha256 of every file under `path` (or of `path`)."""
    if os.path.isfile(path):
        with open(path, "rb") as handle:
            return {".": hashlib.sha256(handle.read()).hexdigest()}
    listing = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as handle:
                listing[os.path.relpath(full, path)] = hashlib.sha256(
                    handle.read()
                ).hexdigest()
    return listing


def _one_error_line(capsys):
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("keras-attention export: error: ")
    return lines[0]


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(3)
    return build_sequence_model(**SMALL, name="export_test_model")


@pytest.fixture(scope="module")
def tokens():
    tokens = np.random.default_rng(0).integers(1, VOCAB, size=(4, SEQ_LEN))
    tokens[1, 5:] = 0  # padding: masked queries and keys
    tokens[3, 2:] = 0
    return tokens.astype("int32")


@pytest.fixture(scope="module")
def reference(model, tokens):
    return {
        "logits": np.asarray(model(tokens)),
        "weights": _numpy_attention_weights(model, tokens),
    }


@pytest.fixture(scope="module")
def exported(model, tokens, tmp_path_factory):
    """One SavedModel for all tests, and the processes that read it.

    It is written over an export of a different model (with overwrite), so
    the readers also show that the overwrite replaced the model.
    """
    directory = tmp_path_factory.mktemp("export")
    path = str(directory / "served")
    tokens_file = str(directory / "tokens.npy")
    killed_target = str(directory / "killed" / "served")
    ready = str(directory / "ready")
    processes = {
        "fresh": _start(
            FRESH_PROCESS, path, tokens_file, str(directory / "fresh"), ready
        ),
        "killed": _start(
            KILLED_EXPORT.replace("{options}", repr(SMALL)),
            killed_target,
            ready,
        ),
    }
    try:
        keras.utils.set_random_seed(7)
        other = build_sequence_model(**{**SMALL, "num_layers": 1})
        export_model(other, path)
        export_model(model, path, overwrite=True)
        np.save(tokens_file, tokens)
        shutil.copytree(path, killed_target)
        killed_before = _tree(killed_target)
        with open(ready, "w"):
            pass
        yield {
            "path": path,
            "dir": directory,
            "processes": processes,
            "killed_target": killed_target,
            "killed_before": killed_before,
        }
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.communicate()


@pytest.fixture(scope="module")
def fresh_process(exported):
    status, _, stderr = _finish(exported["processes"]["fresh"])
    assert status == 0, stderr[-3000:]
    base = str(exported["dir"] / "fresh")
    with open(base + ".json") as handle:
        report = json.load(handle)
    arrays = dict(np.load(base + ".npz"))
    return report, arrays


# --------------------------------------------------------------- SavedModel
def test_saved_model_in_place_matches_the_model(exported, reference, tokens):
    # Runs first: it starts the processes that read the SavedModel, which
    # work while the tests in this process go on.
    path = exported["path"]
    # No staging directory is left beside the model.
    assert [n for n in os.listdir(exported["dir"]) if n.startswith(".")] == []
    assert os.stat(path).st_mode & 0o055 == 0o055  # readable by a server
    loaded = tf.saved_model.load(path)
    served = loaded.serving_default(tf.constant(tokens))
    np.testing.assert_allclose(
        served["logits"].numpy(), reference["logits"], rtol=0, atol=1e-5
    )
    weights = loaded.attention(tf.constant(tokens))
    np.testing.assert_allclose(
        weights["attention_0"].numpy(), reference["weights"]["attention_0"],
        rtol=0, atol=1e-5,
    )


def test_failed_export_leaves_nothing(model, tmp_path, monkeypatch):
    def fail_midway(model, directory):
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "saved_model.pb"), "wb") as handle:
            handle.write(b"partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(export_lib, "_write_saved_model", fail_midway)
    for format, name in (("saved_model", "out"), ("tflite", "out.tflite")):
        with pytest.raises(RuntimeError, match="disk full"):
            export_model(model, str(tmp_path / name), format=format)
    assert os.listdir(tmp_path) == []


def test_variable_length_model_serves_any_length():
    keras.utils.set_random_seed(4)
    model = build_sequence_model(**{**SMALL, "seq_len": None, "max_len": 10})
    module, signatures = serving_module(model)
    for signature in signatures.values():
        (spec,) = tf.nest.flatten(signature.structured_input_signature)
        assert spec.name == "tokens"
        assert spec.shape.as_list() == [None, None]
        assert spec.dtype == tf.int32
    rng = np.random.default_rng(5)
    for length in (3, 10):
        tokens = rng.integers(1, VOCAB, size=(2, length)).astype("int32")
        served = signatures["serving_default"](tf.constant(tokens))
        np.testing.assert_allclose(
            served["logits"].numpy(), np.asarray(model(tokens)), atol=1e-6
        )
        weights = signatures["attention"](tf.constant(tokens))
        reference = _numpy_attention_weights(model, tokens)
        np.testing.assert_allclose(
            weights["attention_1"].numpy(), reference["attention_1"], atol=1e-5
        )


# ------------------------------------------------------- .keras and TFLite
def test_keras_file_loads_in_safe_mode_and_training_continues(
    model, tokens, reference, tmp_path
):
    path = str(tmp_path / "model.keras")
    assert export_model(model, path, format="keras") == path
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(
        np.asarray(loaded(tokens)), reference["logits"], rtol=0, atol=1e-6
    )
    before = [w.numpy() for w in model.weights]
    loaded.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        run_eagerly=True,  # Nothing to trace for eight small steps.
    )
    targets = (tokens + 1) % VOCAB
    history = loaded.fit(tokens, targets, epochs=8, batch_size=4, verbose=0)
    losses = history.history["loss"]
    assert all(np.isfinite(losses)) and losses[-1] < 0.8 * losses[0]
    # The exported file is a copy: the original model did not change.
    for old, new in zip(before, model.weights):
        np.testing.assert_array_equal(old, new.numpy())


def test_tflite_runs_in_the_interpreter_with_matching_outputs(
    model, tokens, reference, tmp_path
):
    path = str(tmp_path / "model.tflite")
    export_model(model, path, format="tflite")
    assert sorted(os.listdir(tmp_path)) == ["model.tflite"]
    interpreter = tf.lite.Interpreter(model_path=path)
    signatures = interpreter.get_signature_list()
    assert signatures["serving_default"]["inputs"] == ["tokens"]
    assert sorted(signatures["serving_default"]["outputs"]) == [
        "logits", "predictions"
    ]
    served = interpreter.get_signature_runner("serving_default")(tokens=tokens)
    np.testing.assert_allclose(
        served["logits"], reference["logits"], rtol=0, atol=1e-4
    )
    np.testing.assert_array_equal(
        served["predictions"], np.argmax(reference["logits"], axis=-1)
    )
    weights = interpreter.get_signature_runner("attention")(tokens=tokens)
    assert sorted(weights) == ["attention_0", "attention_1"]
    for name, value in weights.items():
        np.testing.assert_allclose(
            value, reference["weights"][name], rtol=0, atol=1e-5
        )


# ------------------------------------------------------------ library checks
def test_export_model_rejects_bad_arguments_before_writing(model, tmp_path):
    taken = tmp_path / "taken.keras"
    taken.write_bytes(b"not yours")
    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    (plain_dir / "notes.txt").write_text("keep me")
    blocker = tmp_path / "file"
    blocker.write_text("")
    cases = [
        (dict(path=str(tmp_path / "m"), format="h5"), "`format`"),
        (dict(path=str(tmp_path / "m"), format="onnx"), '".onnx"'),
        (dict(path=str(tmp_path / "m.onnx")), 'a format="onnx" file'),
        (dict(path=str(tmp_path / "m.h5"), format="keras"), '".keras"'),
        (dict(path=str(taken), format="keras"), "overwrite=True"),
        (dict(path=str(plain_dir), overwrite=True),
         "a directory without saved_model.pb, not a SavedModel directory"),
        (dict(path=str(blocker / "sub" / "m")), "not a directory"),
        (dict(path=""), "`path`"),
    ]
    before = _tree(str(tmp_path))
    for kwargs, expected in cases:
        with pytest.raises(ValueError, match=expected):
            export_model(model, **kwargs)
    with pytest.raises(ValueError, match="`model`"):
        export_model("model", str(tmp_path / "m"))
    token_input = keras.Input((3,), dtype="int32")
    embedded = keras.layers.Embedding(5, 4)(token_input)
    two_outputs = keras.Model(token_input, [embedded, embedded])
    with pytest.raises(ValueError, match="one input"):
        export_model(two_outputs, str(tmp_path / "m"))
    images = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten()])
    with pytest.raises(ValueError, match="integer token ids"):
        export_model(images, str(tmp_path / "m"))
    assert _tree(str(tmp_path)) == before
    assert sorted(os.listdir(tmp_path)) == ["file", "plain", "taken.keras"]


# -------------------------------------------------------------- command line
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_config):
    """A finished training run that exported itself with `--export`."""
    root = tmp_path_factory.mktemp("run")
    logdir = str(root / "run")
    exported_path = str(root / "at_end.keras")
    config = tiny_config(
        "reverse", num_layers=1, steps=3, eval_every=3, diagnostics_every=3,
        checkpoint_every=3, heldout_size=32, probe_size=4, logdir=logdir,
        export=exported_path,
    )
    train(config)
    return {"logdir": logdir, "exported": exported_path}


def _run_tokens():
    return np.random.default_rng(9).integers(1, 8, size=(3, 6)).astype("int32")


def test_train_export_writes_the_trained_model(run_dir):
    trained = restore_model(run_dir["logdir"])
    loaded = keras.saving.load_model(run_dir["exported"], safe_mode=True)
    tokens = _run_tokens()
    np.testing.assert_allclose(
        np.asarray(loaded(tokens)), np.asarray(trained(tokens)), atol=1e-6
    )


def test_cli_exports_a_checkpointed_run(run_dir, tmp_path, capsys):
    logdir = str(tmp_path / "checkpointed")
    shutil.copytree(run_dir["logdir"], logdir)
    os.remove(os.path.join(logdir, "model.keras"))  # as if killed mid-run
    out = str(tmp_path / "from_checkpoint.keras")
    assert main(["export", "--logdir", logdir, "--out", out]) == 0
    assert out in capsys.readouterr().out
    tokens = _run_tokens()
    finished = keras.saving.load_model(
        os.path.join(run_dir["logdir"], "model.keras")
    )
    loaded = keras.saving.load_model(out, safe_mode=True)
    np.testing.assert_allclose(
        np.asarray(loaded(tokens)), np.asarray(finished(tokens)), atol=1e-6
    )


def test_cli_refuses_existing_out_unless_overwrite(run_dir, model, tmp_path,
                                                  capsys):
    out = tmp_path / "model.keras"
    model.save(str(out))  # An older model, of another architecture.
    older = out.read_bytes()
    argv = ["export", "--logdir", run_dir["logdir"], "--out", str(out)]
    assert main(argv) == 2
    line = _one_error_line(capsys)
    assert "already exists" in line and "--overwrite" in line
    assert out.read_bytes() == older
    assert os.listdir(tmp_path) == ["model.keras"]
    assert main(argv + ["--overwrite"]) == 0
    loaded = keras.saving.load_model(str(out), safe_mode=True)
    trained = restore_model(run_dir["logdir"])
    tokens = _run_tokens()
    np.testing.assert_allclose(
        np.asarray(loaded(tokens)), np.asarray(trained(tokens)), atol=1e-6
    )
    assert os.listdir(tmp_path) == ["model.keras"]


def test_overwrite_replaces_only_a_model_of_the_same_kind(run_dir, tmp_path,
                                                          capsys):
    """`--overwrite` replaces a model of the format it writes, nothing else,
    and never a run's own files (this run's or another's)."""
    notes = tmp_path / "notes.keras"
    notes.write_text("not a model")
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "keep.txt").write_text("keep me")
    onnx_named = tmp_path / "other.onnx"
    onnx_named.write_bytes(b"PK\x03\x04 a zip, not an ONNX graph")
    tflite_named = tmp_path / "m.tflite"
    tflite_named.write_bytes(b"\x00" * 16)
    link = tmp_path / "link.keras"
    link.symlink_to(run_dir["exported"])
    other_run = tmp_path / "other_run"
    other_run.mkdir()
    (other_run / "config.json").write_text("{}")
    (other_run / "metrics.json").write_text("{}")
    own = os.path.join(run_dir["logdir"], "model.keras")
    cases = [
        (notes, "is a file of another kind, not a .keras model file"),
        (folder, "is a directory without saved_model.pb, not a SavedModel "
         "directory"),
        (onnx_named, "is a file of another kind, not an ONNX model file"),
        (tflite_named, "is a file of another kind, not a TFLite model file"),
        (link, "is a symbolic link, not a .keras model file"),
        (own, f"is inside the run directory {os.path.realpath(run_dir['logdir'])}"),
        (other_run / "model.keras", "is inside the run directory "
         f"{os.path.realpath(other_run)}"),
    ]
    before = {**_tree(str(tmp_path)), **_tree(run_dir["logdir"])}
    for out, expected in cases:
        assert main(["export", "--logdir", run_dir["logdir"], "--out",
                     str(out), "--overwrite"]) == 2, out
        assert expected in _one_error_line(capsys), out
    assert {**_tree(str(tmp_path)), **_tree(run_dir["logdir"])} == before
    # A .keras model is replaced by one.
    assert main(["export", "--logdir", run_dir["logdir"], "--out",
                 str(tmp_path / "fresh.keras")]) == 0
    assert main(["export", "--logdir", run_dir["logdir"], "--out",
                 str(tmp_path / "fresh.keras"), "--overwrite"]) == 0
    capsys.readouterr()


def test_cli_bad_run_dirs_formats_and_paths_exit_2(run_dir, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    corrupt_model = tmp_path / "corrupt_model"
    shutil.copytree(run_dir["logdir"], corrupt_model)
    # Cut short, as a crash leaves it (Keras says "File not found").
    whole = (corrupt_model / "model.keras").read_bytes()
    (corrupt_model / "model.keras").write_bytes(whole[: len(whole) // 2])
    corrupt_config = tmp_path / "corrupt_config"
    shutil.copytree(run_dir["logdir"], corrupt_config)
    os.remove(corrupt_config / "model.keras")
    (corrupt_config / "config.json").write_text("{not json")
    corrupt_checkpoint = tmp_path / "corrupt_checkpoint"
    shutil.copytree(run_dir["logdir"], corrupt_checkpoint)
    os.remove(corrupt_checkpoint / "model.keras")
    for name in os.listdir(corrupt_checkpoint / "checkpoints"):
        if name.endswith(".npz"):
            (corrupt_checkpoint / "checkpoints" / name).write_bytes(b"\x00bad")
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    out = str(tmp_path / "out" / "model")
    good = run_dir["logdir"]
    cases = [
        (["--logdir", str(tmp_path / "missing"), "--out", out],
         "not a directory"),
        (["--logdir", str(empty), "--out", out], "holds no trained run"),
        (["--logdir", str(corrupt_model), "--out", out],
         "model.keras is damaged (File is not a zip file)"),
        (["--logdir", str(corrupt_config), "--out", out], "cannot restore"),
        (["--logdir", str(corrupt_checkpoint), "--out", out], "cannot restore"),
        (["--logdir", good, "--out", out, "--format", "h5"], "--format"),
        (["--logdir", good, "--out", out, "--format", "onnx"],
         'must end in ".onnx" for --format onnx'),
        (["--logdir", good, "--out", str(blocker / "m.keras")],
         "not writable"),
        (["--logdir", good, "--out", out, "--format", "keras"], '".keras"'),
    ]
    before = _tree(str(tmp_path))
    for argv, expected in cases:
        assert main(["export", *argv]) == 2, argv
        line = _one_error_line(capsys)
        assert expected in line, (argv, line)
    assert _tree(str(tmp_path)) == before
    assert not os.path.exists(tmp_path / "out")


# ------------------------------------ SavedModel, read by other processes
def test_saved_model_serves_without_keras_and_matches_the_model(
    fresh_process, reference, tokens
):
    report, arrays = fresh_process
    assert report["leaked"] == []
    logits = arrays["served/logits"]
    assert logits.dtype == np.float32
    assert logits.shape == (4, SEQ_LEN, VOCAB)
    np.testing.assert_allclose(logits, reference["logits"], rtol=0, atol=1e-5)
    predictions = arrays["served/predictions"]
    assert predictions.dtype == np.int32
    np.testing.assert_array_equal(
        predictions, np.argmax(reference["logits"], axis=-1)
    )
    names = sorted(
        key.split("/", 1)[1] for key in arrays if key.startswith("attention/")
    )
    assert names == ["attention_0", "attention_1"]
    for name in names:
        weights = arrays["attention/" + name]
        assert weights.dtype == np.float32
        assert weights.shape == (4, HEADS, SEQ_LEN, SEQ_LEN)
        np.testing.assert_allclose(
            weights, reference["weights"][name], rtol=0, atol=1e-5
        )
    # Padded query rows attend nowhere; the others sum to one.
    sums = arrays["attention/attention_0"].sum(-1)
    np.testing.assert_allclose(
        sums, np.broadcast_to((tokens != 0)[:, None, :], sums.shape), atol=1e-5
    )


def test_served_signature_rejects_wrong_dtype_and_rank_at_the_signature(
    fresh_process,
):
    errors = fresh_process[0]["errors"]
    for label in ("float32", "int64"):
        kind, message = errors[f"{label}/signature"]
        assert kind == "InvalidArgumentError"
        assert "expected to be a int32 tensor" in message
    for label in ("rank1", "rank3", "length"):
        kind, message = errors[f"{label}/signature"]
        assert kind == "InvalidArgumentError"
        assert f"is not compatible with expected shape [?,{SEQ_LEN}]" in message
        # Stopped before the model: no model node is named in the error.
        assert "attention_0" not in message and "embedding" not in message
    for label in ("float32", "int64", "rank1", "rank3", "length"):
        kind, message = errors[f"{label}/function"]
        assert kind == "TypeError"
        assert "TensorSpec(shape=(None, 7), dtype=tf.int32" in message


def test_saved_model_cli_lists_both_signatures(fresh_process):
    stdout = fresh_process[0]["cli"]
    sections = {}
    for block in stdout.split("signature_def['")[1:]:
        name, body = block.split("']", 1)
        sections[name] = body.split("Method name is")[0]
    assert {"serving_default", "attention"} <= set(sections)

    def tensor(section, key):
        body = sections[section].split(f"['{key}'] tensor_info:", 1)[1]
        dtype = body.split("dtype: ", 1)[1].split()[0]
        shape = body.split("shape: ", 1)[1].split("\n")[0].strip()
        return dtype, shape

    for section in ("serving_default", "attention"):
        assert tensor(section, "tokens") == ("DT_INT32", f"(-1, {SEQ_LEN})")
    assert tensor("serving_default", "logits") == (
        "DT_FLOAT", f"(-1, {SEQ_LEN}, {VOCAB})"
    )
    assert tensor("serving_default", "predictions") == (
        "DT_INT32", f"(-1, {SEQ_LEN})"
    )
    for name in ("attention_0", "attention_1"):
        assert tensor("attention", name) == (
            "DT_FLOAT", f"(-1, {HEADS}, {SEQ_LEN}, {SEQ_LEN})"
        )


def test_killed_export_leaves_the_existing_model_untouched(exported):
    status, _, stderr = _finish(exported["processes"]["killed"])
    assert status == -signal.SIGKILL, stderr[-3000:]
    target = exported["killed_target"]
    assert _tree(target) == exported["killed_before"]
    # The export had been written completely beside the target.
    parent = os.path.dirname(target)
    staged = [
        name for name in os.listdir(parent) if name.startswith(".served.tmp-")
    ]
    assert len(staged) == 1
    assert os.path.isfile(os.path.join(parent, staged[0], "saved_model.pb"))


_JAX_TRAIN_AND_EXPORT = textwrap.dedent("""
    import sys

    import numpy as np

    from pipelines.cli import main
    from pipelines.run_dir import restore_model

    logdir, out, tokens_path, logits_path = sys.argv[1:5]
    assert main(["train", "--backend", "jax", "--key-dim", "8",
                 "--d-model", "16", "--batch-size", "8", "--heldout-size",
                 "32", "--probe-size", "4", "--steps", "6", "--eval-every",
                 "6", "--diagnostics-every", "6", "--checkpoint-every", "6",
                 "--quiet", "--logdir", logdir]) == 0
    # A SavedModel asked for in a JAX process: exported by a TensorFlow one.
    assert main(["export", "--logdir", logdir, "--out", out]) == 0
    tokens = np.load(tokens_path)
    logits = restore_model(logdir)(tokens, training=False)
    np.save(logits_path, np.asarray(logits, np.float32))
""")


def test_a_jax_run_exports_the_same_saved_model(tmp_path):
    """Issue 17, 7: the SavedModel of a run trained on JAX, written from the
    JAX process through a TensorFlow child, gives the JAX model's logits."""
    logdir, out = tmp_path / "run", tmp_path / "saved"
    # Ids of the default recall task's vocabulary (1 + 64 keys x 17).
    tokens = np.random.default_rng(0).integers(1, 1089, (3, 17)).astype(
        np.int32)
    np.save(tmp_path / "tokens.npy", tokens)
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="2",
               JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    child = subprocess.run(
        [sys.executable, "-c", _JAX_TRAIN_AND_EXPORT, str(logdir), str(out),
         str(tmp_path / "tokens.npy"), str(tmp_path / "logits.npy")],
        env=env, cwd=str(tmp_path), capture_output=True, text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert json.loads((logdir / "config.json").read_text())["backend"] == "jax"
    served = tf.saved_model.load(str(out)).signatures["serving_default"]
    got = served(tokens=tf.constant(tokens))["logits"].numpy()
    np.testing.assert_allclose(got, np.load(tmp_path / "logits.npy"),
                               rtol=1e-5, atol=1e-5)
