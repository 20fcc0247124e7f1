"""Tests of ONNX export, checked by ONNX Runtime and `onnx.checker`, and of
a variable-length model in TFLite's interpreter.

References are the Keras models themselves, on the backend they were
built or trained on: their logits (the default attention path) and their
attention weights (`record_attention`), against an
`onnxruntime.InferenceSession` of the exported file. Token batches have
padding (id 0, masked) in some rows.

A run trained on TensorFlow exports in this process. For JAX and torch, a
child process on that backend (started by the first test, working while
the in-process tests go on) saves a variable-length model built there as
the model of a run directory and exports the run through the command line,
which hands ONNX to a TensorFlow process: a `.keras` file loads on every
backend, and that is all the export reads of a finished run. (Training on
JAX, then exporting, is `test_export.test_a_jax_run_exports_the_same_
saved_model`.)
"""

import importlib.util
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
tf2onnx = pytest.importorskip("tf2onnx")

from _onnx_reference import LENGTHS  # noqa: E402
from _onnx_reference import VARIABLE  # noqa: E402
from _onnx_reference import VOCAB  # noqa: E402
from _onnx_reference import keras_reference  # noqa: E402
from _onnx_reference import padded_tokens  # noqa: E402
from keras_attention import export_onnx  # noqa: E402
from keras_attention.export import export_model  # noqa: E402
from keras_attention.models import build_sequence_model  # noqa: E402
from pipelines.cli import main  # noqa: E402
from pipelines.run_dir import restore_model  # noqa: E402
from pipelines.train import train  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOGITS_TOLERANCE, WEIGHTS_TOLERANCE = 1e-4, 1e-5
FIXED_LENGTH = 6


# Runs in a child on KERAS_BACKEND: saves a variable-length model built on
# the backend as the model of a run directory, the Keras references at each
# length, and exports the run through the command line (which hands ONNX to
# a TensorFlow process).
BACKEND_CHILD = textwrap.dedent("""
    import sys

    import numpy as np

    sys.path.insert(0, sys.argv[2])  # tests/, for the shared helpers
    from _onnx_reference import (LENGTHS, VARIABLE, keras_reference,
                                 padded_tokens)
    from keras_attention.models import build_sequence_model
    from pipelines.builders import seed_run
    from pipelines.cli import main

    root = sys.argv[1]
    seed_run(5)  # keras.utils.set_random_seed would import TensorFlow
    model = build_sequence_model(**VARIABLE)
    model.save(root + "/run/model.keras")
    arrays = {}
    for length in LENGTHS:
        tokens = padded_tokens(length, 3, length)
        for key, value in keras_reference(model, tokens).items():
            arrays[f"{length}/{key}"] = value
    np.savez(root + "/reference.npz", **arrays)
    assert main(["export", "--logdir", root + "/run", "--out",
                 root + "/run.onnx"]) == 0
    # Converted in the TensorFlow child, not here.
    assert "tensorflow" not in sys.modules and "tf2onnx" not in sys.modules
""")


def _start_backend_child(backend, root):
    env = dict(os.environ, KERAS_BACKEND=backend, JAX_PLATFORMS="cpu",
               TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [REPO, env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-c", BACKEND_CHILD, str(root),
         os.path.join(REPO, "tests")],
        cwd=str(root), env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )


def session(path):
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the refusals are asserted, not logged
    return ort.InferenceSession(path, options,
                                providers=["CPUExecutionProvider"])


def check_against(path, tokens, reference):
    """Runs the ONNX file at `path` on `tokens` and compares every output
    with `reference` (see `keras_reference`); returns the largest errors."""
    served = session(path)
    names = [output.name for output in served.get_outputs()]
    got = dict(zip(names, served.run(None, {"tokens": tokens})))
    assert sorted(got) == sorted([*reference, "predictions"])
    assert got["predictions"].dtype == np.int32
    np.testing.assert_array_equal(got["predictions"],
                                  np.argmax(reference["logits"], axis=-1))
    errors = {}
    for name, expected in reference.items():
        assert got[name].dtype == np.float32 and got[name].shape == \
            expected.shape, name
        tolerance = LOGITS_TOLERANCE if name == "logits" else \
            WEIGHTS_TOLERANCE
        np.testing.assert_allclose(got[name], expected, rtol=0,
                                   atol=tolerance, err_msg=name)
        errors[name] = float(np.max(np.abs(got[name] - expected)))
    # Padded query rows attend nowhere; the others sum to one.
    for name in reference:
        if name.startswith("attention_"):
            sums = got[name].sum(-1)
            np.testing.assert_allclose(sums, np.broadcast_to(
                (tokens != 0)[:, None, :], sums.shape), atol=1e-5)
    return errors


def dims(value):
    return [dim.dim_param or dim.dim_value
            for dim in value.type.tensor_type.shape.dim]


def _one_error_line(capsys):
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("keras-attention export: error: ")
    return lines[0]


def _tree(root):
    return sorted(
        os.path.relpath(os.path.join(directory, name), root)
        for directory, _, files in os.walk(root) for name in files
    )


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def backend_children(tmp_path_factory):
    """The JAX and torch children, started at once; finished on demand."""
    children = {}
    for backend in ("jax", "torch"):
        if importlib.util.find_spec(backend) is not None:
            root = tmp_path_factory.mktemp(backend)
            (root / "run").mkdir()
            children[backend] = (root, _start_backend_child(backend, root))
    yield children
    for _, process in children.values():
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.fixture(scope="module")
def tf_run(tmp_path_factory, tiny_config):
    """A finished tiny training run on TensorFlow, of the default task
    (recall: its model embeds tokens with a FactoredEmbedding)."""
    logdir = str(tmp_path_factory.mktemp("tf") / "run")
    train(tiny_config("recall", num_layers=1, steps=3, eval_every=3,
                      diagnostics_every=3, checkpoint_every=3,
                      heldout_size=32, probe_size=4, logdir=logdir))
    return logdir


# ------------------------------------------------------------------ tests
def test_variable_length_model_matches_at_every_length(backend_children,
                                                       tmp_path):
    # Runs first: the fixture starts the other backends' children.
    keras.utils.set_random_seed(5)
    model = build_sequence_model(**{**VARIABLE, "num_layers": 2})
    path = export_model(model, str(tmp_path / "model.onnx"), format="onnx")
    assert os.listdir(tmp_path) == ["model.onnx"]
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    assert {(op.domain, op.version) for op in proto.opset_import} >= {
        ("", export_onnx.ONNX_OPSET)}
    (tokens_input,) = proto.graph.input
    assert tokens_input.name == "tokens"
    assert tokens_input.type.tensor_type.elem_type == onnx.TensorProto.INT32
    assert dims(tokens_input) == ["batch", "length"]
    shapes = {output.name: dims(output) for output in proto.graph.output}
    assert shapes == {
        "logits": ["batch", "length", VOCAB],
        "predictions": ["batch", "length"],
        "attention_0": ["batch", 2, "length", "length"],
        "attention_1": ["batch", 2, "length", "length"],
    }
    assert export_onnx.onnx_info(path) == {
        "opset": export_onnx.ONNX_OPSET,
        "outputs": {"serving_default": ["logits", "predictions"],
                    "attention": ["attention_0", "attention_1"]},
    }
    for length in LENGTHS:
        tokens = padded_tokens(length, 3, length)
        check_against(path, tokens, keras_reference(model, tokens))
    # Past the position table the engine refuses; it never makes up rows.
    with pytest.raises(Exception, match="position_embedding"):
        session(path).run(None, {"tokens": np.ones((1, 13), np.int32)})
    # One group alone.
    logits, = session(path).run(["logits"], {"tokens": tokens})
    np.testing.assert_allclose(logits, np.asarray(model(tokens)), atol=1e-4)


def test_variable_length_model_serves_every_length_in_tflite(tmp_path):
    keras.utils.set_random_seed(5)
    model = build_sequence_model(**VARIABLE)
    path = export_model(model, str(tmp_path / "model.tflite"),
                        format="tflite")
    interpreter = tf.lite.Interpreter(model_path=path)
    for length in LENGTHS:
        tokens = padded_tokens(length, 3, length)
        reference = keras_reference(model, tokens)
        served = interpreter.get_signature_runner("serving_default")(
            tokens=tokens)
        np.testing.assert_allclose(served["logits"], reference["logits"],
                                   rtol=0, atol=LOGITS_TOLERANCE)
        weights = interpreter.get_signature_runner("attention")(
            tokens=tokens)
        np.testing.assert_allclose(weights["attention_0"],
                                   reference["attention_0"], rtol=0,
                                   atol=WEIGHTS_TOLERANCE)


def test_cli_exports_a_tensorflow_run_and_prints_the_opset(tf_run, tmp_path,
                                                           capsys):
    out = str(tmp_path / "run.onnx")
    assert main(["export", "--logdir", tf_run, "--out", out]) == 0
    line = capsys.readouterr().out.strip()
    assert line == (
        f"exported onnx model of {tf_run} to {out} (ONNX opset "
        f"{export_onnx.ONNX_OPSET}; outputs serving_default: logits, "
        "predictions; attention: attention_0)"
    )
    onnx.checker.check_model(out, full_check=True)
    (tokens_input,) = onnx.load(out).graph.input
    model = restore_model(tf_run)
    length = model.inputs[0].shape[1]
    assert dims(tokens_input) == ["batch", length]  # the model's own T
    for batch in (2, 5):
        tokens = padded_tokens(batch, batch, length)
        check_against(out, tokens, keras_reference(model, tokens))
    with pytest.raises(Exception, match="tokens"):  # the engine checks T
        session(out).run(None, {"tokens": np.ones((2, length - 1),
                                                  np.int32)})


@keras.saving.register_keras_serializable(package="test_export_onnx")
class FixedBatch(keras.layers.Layer):
    """Reshapes to a batch of 4: a model that cannot take another batch."""

    def call(self, x):
        return keras.ops.reshape(x, (4,) + tuple(x.shape[1:]))


class NeedsABatchSize(keras.layers.Layer):
    """Reads the batch size as a number: tracing with a free batch fails."""

    def call(self, x):
        return keras.ops.reshape(x, (int(x.shape[0]),) + tuple(x.shape[1:]))

    def compute_output_shape(self, input_shape):
        return input_shape


class BoolNewAxes(keras.layers.Layer):
    """Indexes a boolean tensor of free shape with new axes: a TensorFlow
    op (StridedSlice) that TFLite's builtin ops do not cover."""

    def call(self, x):
        keep = (x[..., 0] > 0)[:, None, :, None]
        return x * keras.ops.cast(keep[:, 0, :, :], x.dtype)


def test_cli_bad_onnx_exports_exit_2_and_write_nothing(tf_run, tmp_path,
                                                       capsys, monkeypatch):
    taken = tmp_path / "taken.onnx"
    taken.write_bytes(b"an older model")
    fixed_run = tmp_path / "fixed_run"
    fixed_run.mkdir()
    tokens = keras.Input((FIXED_LENGTH,), dtype="int32")
    hidden = keras.layers.Embedding(VOCAB, 4)(tokens)
    keras.Model(tokens, FixedBatch()(hidden)).save(
        str(fixed_run / "model.keras"))
    out = str(tmp_path / "out" / "model")
    cases = [
        (["--out", str(taken)], "already exists; pass --overwrite"),
        (["--out", out + ".onnx", "--format", "tflite"],
         'must end in ".tflite" for --format tflite'),
        (["--out", out + ".onnx", "--format", "saved_model"],
         'names a --format onnx file, but --format saved_model writes a '
         'directory'),
        (["--out", out + ".tflite", "--format", "onnx"],
         'must end in ".onnx" for --format onnx'),
        (["--logdir", str(fixed_run), "--out", out + ".onnx"],
         "cannot take dynamic shapes: for tokens of shape (None, 6) its "
         "output 'logits' has the fixed shape (4, 6, 4)"),
    ]
    before = _tree(tmp_path)
    for argv, expected in cases:
        if "--logdir" not in argv:
            argv = ["--logdir", tf_run, *argv]
        assert main(["export", *argv]) == 2, argv
        assert expected in _one_error_line(capsys), argv
    monkeypatch.setitem(sys.modules, "tf2onnx", None)  # not installed
    assert main(["export", "--logdir", tf_run, "--out", out + ".onnx"]) == 2
    assert _one_error_line(capsys).endswith(
        "--format onnx needs tf2onnx, which is not installed (pip install "
        '"sdpa-keras-attention[onnx]"); --format keras exports without it')
    assert _tree(tmp_path) == before
    assert taken.read_bytes() == b"an older model"
    assert not os.path.exists(tmp_path / "out")


def test_failed_or_unconvertible_export_leaves_the_old_model(tmp_path,
                                                             monkeypatch):
    path = tmp_path / "model.onnx"
    # As an ONNX model begins (ir_version 7): `overwrite` replaces only one.
    path.write_bytes(b"\x08\x07the served model")
    tokens = keras.Input((None,), dtype="int32")
    hidden = keras.layers.Embedding(VOCAB, 4)(tokens)
    model = keras.Model(tokens, keras.layers.Dense(VOCAB, "gelu")(hidden))

    def fail_midway(model, staged):
        with open(staged, "wb") as handle:
            handle.write(b"partial")
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(export_onnx, "write_onnx", fail_midway)
        with pytest.raises(OSError, match="disk full"):
            export_model(model, str(path), format="onnx", overwrite=True)
    # Without its Erfc handler tf2onnx leaves TensorFlow's GELU op in the
    # graph, as Keras's own exporter does; the export names it and stops.
    convert = tf2onnx.convert.from_function

    def without_handlers(*args, custom_op_handlers=None, **kwargs):
        return convert(*args, **kwargs)

    monkeypatch.setattr(tf2onnx.convert, "from_function", without_handlers)
    with pytest.raises(ValueError, match=r"ops without an ONNX mapping: "
                                         r"Erfc\)"):
        export_model(model, str(path), format="onnx", overwrite=True)
    assert os.listdir(tmp_path) == ["model.onnx"]
    assert path.read_bytes() == b"\x08\x07the served model"
    untraceable = keras.Model(tokens, NeedsABatchSize()(model(tokens)))
    with pytest.raises(ValueError, match=r"cannot take dynamic shapes: "
                       r"tracing it with tokens of shape \(None, None\) "
                       r"failed \(TypeError: "):
        export_model(untraceable, str(path), format="onnx", overwrite=True)
    # The TFLite converter's refusal, in one line.
    unconvertible = keras.Model(tokens, BoolNewAxes()(model(tokens)))
    with pytest.raises(ValueError, match=r"does not convert to TFLite "
                                         r"\(TF Select ops: StridedSlice\)"):
        export_model(unconvertible, str(tmp_path / "m.tflite"),
                     format="tflite")
    assert os.listdir(tmp_path) == ["model.onnx"]


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_models_from_other_backends_export_to_onnx(backend, backend_children):
    if backend not in backend_children:
        pytest.skip(f"{backend} is not installed")
    root, process = backend_children[backend]
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-3000:]
    # The line of the JAX (torch) process, after the TensorFlow child's.
    assert stdout.strip().endswith(
        f"(ONNX opset {export_onnx.ONNX_OPSET}; outputs serving_default: "
        "logits, predictions; attention: attention_0)")
    path = str(root / "run.onnx")
    onnx.checker.check_model(path, full_check=True)
    reference = dict(np.load(root / "reference.npz"))
    for length in LENGTHS:
        expected = {key.split("/", 1)[1]: value for key, value in
                    reference.items() if key.startswith(f"{length}/")}
        check_against(path, padded_tokens(length, 3, length), expected)
