"""Export a trained run's model: SavedModel (default), .keras, TFLite, ONNX.

    keras-attention export --logdir runs/reverse --out exported/reverse
    keras-attention export --logdir runs/reverse --out reverse.tflite
    keras-attention export --logdir runs/reverse --out reverse.onnx

The model is the run's `model.keras` when the run finished, else the latest
checkpoint in `checkpoints/` (a run still training or killed). Without
`--format` the format follows the name of `--out`: `.keras` writes the Keras
file, `.tflite` a TensorFlow Lite model, `.onnx` an ONNX model, anything
else a SavedModel directory with the signatures `serving_default` (tokens
-> logits, predictions) and `attention` (tokens -> each attention layer's
weights). A `--format` whose suffix `--out` does not have is refused.

The export is written beside `--out` and renamed into place when complete;
an existing `--out` is replaced only with `--overwrite`, and only when it
is a model of the same format (a SavedModel directory, or a `.keras`,
TFLite or ONNX file); `--out` inside a training run's folder is refused, so
an export never replaces a run's own files.

A run trained on any backend exports the same files: SavedModel, TFLite
and ONNX are converted from TensorFlow (see `keras_attention.export_onnx`
for why ONNX too), so a process running Keras on JAX or torch hands them to
a child process running Keras on TensorFlow, which loads the run's saved
state (`model.keras` loads on every backend; checkpoints are numpy arrays).
Without the packages a format needs (TensorFlow; for ONNX also tf2onnx and
onnx) it is refused in one line, and `.keras` export still works.
"""

import os
import subprocess
import sys

import keras

from keras_attention.export import FORMATS
from keras_attention.export import SUFFIXES
from keras_attention.export import check_export_target
from keras_attention.export import check_packages
from keras_attention.export import export_model
from keras_attention.export_onnx import onnx_info
from pipelines.checkpoints import CHECKPOINT_DIR
from pipelines.checkpoints import DamagedCheckpoints
from pipelines.common import EnvironmentFailure
from pipelines.common import UsageError
from pipelines.common import one_line
from pipelines.common import usage_error
from pipelines.common import writing
from pipelines.run_dir import CONFIG_FILE
from pipelines.run_dir import METRICS_FILE
from pipelines.run_dir import restore_model

_SUFFIX_FORMATS = {suffix: format for format, suffix in SUFFIXES.items()}


def add_arguments(parser):
    """Adds the `export` flags."""
    parser.add_argument("--logdir", required=True, metavar="DIR",
                        help="directory of a training run (finished or "
                        "checkpointed)")
    parser.add_argument("--out", required=True, metavar="PATH",
                        help="where to write the exported model")
    parser.add_argument("--format", metavar="FORMAT", help="saved_model, "
                        "keras, tflite or onnx (default: from the suffix of "
                        "--out, .keras, .tflite or .onnx, else saved_model)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing model at --out")


def run(args):
    """Runs `keras-attention export` for parsed `args`; returns 0."""
    path, format = export_run(args.logdir, args.out, format=args.format,
                              overwrite=args.overwrite)
    line = f"exported {format} model of {args.logdir} to {path}"
    if format == "onnx":
        info = onnx_info(path)
        groups = "; ".join(f"{group}: {', '.join(names)}"
                           for group, names in info["outputs"].items())
        line += f" (ONNX opset {info['opset']}; outputs {groups})"
    print(line)
    return 0


# The arguments of `keras_attention.export` that are this command's flags.
_FLAGS = {"path": "--out", "format": "--format", "overwrite": "--overwrite"}


def check_out_path(path, format=None, overwrite=False, flag="--out"):
    """Checks, touching nothing, that an export may write `path` (given by
    `flag`; only `--out` comes with `--overwrite`), before any expensive
    work. Returns the format: `format`, or when `None` the one the suffix
    of `path` names (`.keras`, `.tflite`, `.onnx`), else `"saved_model"`.

    Raises:
        UsageError: on an unknown format or one whose packages are missing,
            or a `path` that does not suit it, exists (without `overwrite`)
            or cannot be written.
    """
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise UsageError(f"{flag} must be a path; got {path!r}")
    if format is None:
        suffix = os.path.splitext(os.fspath(path))[1].lower()
        format = _SUFFIX_FORMATS.get(suffix, "saved_model")
    elif format not in FORMATS:
        raise UsageError(
            f"--format must be one of {', '.join(FORMATS)}; got {format!r}")
    if flag != "--out" and os.path.lexists(path):  # No --overwrite to offer.
        raise UsageError(f"{flag} {path} already exists; remove it or choose "
                         "another")
    try:
        check_packages(format)
        check_export_target(path, format, overwrite)
    except ValueError as error:
        raise usage_error(error, {**_FLAGS, "path": flag}) from None
    return format


def check_outside_runs(path, run_dir):
    """`UsageError` when `path` is, or lies inside, `run_dir` or another
    folder holding a run's `config.json` and its `metrics.json` or
    `checkpoints/`: an export never writes among a run's files. Symbolic
    links are followed."""
    inside = os.path.realpath(os.fspath(run_dir))
    folder, parent = None, os.path.realpath(os.fspath(path))
    while folder != parent:  # Up to the root, the root included.
        folder, parent = parent, os.path.dirname(parent)
        if folder == inside or _is_run_folder(folder):
            raise UsageError(
                f"--out {path} is inside the run directory {folder}; "
                "export to a path outside it")


def _is_run_folder(folder):
    return os.path.isfile(os.path.join(folder, CONFIG_FILE)) and (
        os.path.isfile(os.path.join(folder, METRICS_FILE))
        or os.path.isdir(os.path.join(folder, CHECKPOINT_DIR)))


def export_run(run_dir, path, format=None, overwrite=False):
    """Exports the model of the training run in `run_dir` to `path`, with
    `check_out_path`'s `format` and `overwrite`; returns `(absolute path
    written, format)`.

    Raises:
        UsageError: as `check_out_path`, and on a missing or corrupt run
            directory or a model that cannot take dynamic shapes; nothing is
            written then.
        WriteFailure: when the system refuses the export's writes (a full
            disk); nothing is left at or beside `path`.

    Example:

    ```python
    export_run("runs/reverse", "exported/reverse")
    ```
    """
    format = check_out_path(path, format, overwrite)
    if not os.path.isdir(run_dir):
        raise UsageError(f"--logdir {run_dir} is not a directory")
    check_outside_runs(path, run_dir)
    if format != "keras" and keras.backend.backend() != "tensorflow":
        return _export_in_tensorflow(run_dir, path, format, overwrite)
    model = _restore(run_dir)
    try:
        # The export is staged beside `path`; a refused write removes it.
        with writing(f"the export {os.path.abspath(path)}"):
            written = export_model(model, path, format=format,
                                   overwrite=overwrite)
    except ValueError as error:
        raise usage_error(error, _FLAGS) from None
    return written, format


def _export_in_tensorflow(run_dir, path, format, overwrite):
    """`export_run` in a child process running Keras on TensorFlow; its one
    line of error becomes this process's."""
    command = [sys.executable, "-m", "pipelines", "export", "--logdir",
               os.fspath(run_dir), "--out", os.fspath(path), "--format",
               format] + (["--overwrite"] if overwrite else [])
    env = {**os.environ, "KERAS_BACKEND": "tensorflow"}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    child = subprocess.run(command, env=env, capture_output=True, text=True,
                           check=False)
    if child.returncode != 0:
        lines = child.stderr.strip().splitlines() or ["no output"]
        # The child's own line, without its prefix.
        message = lines[-1].removeprefix("keras-attention export: error: ")
        error = UsageError if child.returncode == 2 else EnvironmentFailure
        raise error(f"{message} (exporting in a TensorFlow process)")
    return os.path.abspath(os.fspath(path)), format


def _restore(run_dir):
    try:
        return restore_model(run_dir)
    except DamagedCheckpoints as error:
        raise UsageError(
            f"--logdir {run_dir}: cannot restore the run's model: checkpoint "
            f"file {error.file} is corrupt ({error.reason}) and no earlier "
            "checkpoint is whole") from None
    except UsageError:
        raise
    except Exception as error:  # Corrupt files fail in many ways.
        raise UsageError(
            f"--logdir {run_dir}: cannot restore the run's model "
            f"({type(error).__name__}: {one_line(error)})") from None
