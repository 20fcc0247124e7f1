"""Export a token model: a TensorFlow SavedModel, `.keras`, TFLite or ONNX.

`export_model(model, path)` writes a SavedModel that serves without this
package or Keras: plain `tf.saved_model.load(path)` in any TensorFlow process
runs it. It has two signatures, both taking int32 `tokens` `(B, T)`:

- `serving_default` returns `logits` (float32 `(B, T, C)`) and `predictions`
  (int32, the argmax of the logits over classes);
- `attention` returns the attention weights `(B, H, T, S)` of every
  `ScaledDotProductAttention` layer, keyed by layer name (`attention_0`,
  ...), so a served model can show where it attends.

`format="keras"` writes the native Keras file instead (load it with
`keras.saving.load_model` after `import keras, keras_attention`),
`format="tflite"` converts the SavedModel to a TensorFlow Lite flat buffer
with the same two signatures, and `format="onnx"` writes one ONNX graph
with both groups of outputs, for ONNX Runtime (`keras_attention.export_onnx`).

Every format is written to a temporary path beside `path` and renamed into
place only once complete, so an interrupted export never leaves a partial
model at `path`, and an existing model is replaced only with
`overwrite=True`.

Floor 2: imports keras, TensorFlow (lazily, for the formats that need it),
`keras_attention.{files, serving, export_onnx, validation}`.
"""

import contextlib
import ctypes
import errno
import importlib.util
import os
import shutil
import tempfile

import keras

from keras_attention import export_onnx
from keras_attention.files import atomic_path
from keras_attention.serving import check_tensorflow_backend
from keras_attention.serving import check_token_model
from keras_attention.serving import serving_module
from keras_attention.validation import check_bool
from keras_attention.validation import check_choice

FORMATS = ("saved_model", "keras", "tflite", "onnx")
# The name a file format's path must end in; a SavedModel is a directory,
# whose name must end in none of them.
SUFFIXES = {"keras": ".keras", "tflite": ".tflite", "onnx": ".onnx"}
# The modules each format imports to be written.
PACKAGES = {
    "saved_model": ("tensorflow",),
    "keras": (),
    "tflite": ("tensorflow",),
    "onnx": export_onnx.PACKAGES,
}

_PACKAGE_NAMES = {"tensorflow": "TensorFlow"}
_SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")


def export_model(model, path, format="saved_model", overwrite=False):
    """Exports a token-to-logits model to `path`.

    Args:
        model: a Keras model with one integer input `(B, T)` of token ids and
            one output `(B, T, C)` of logits, such as the models of
            `keras_attention.models.build_sequence_model`. `T` may be `None`
            (variable length); the signatures then accept any length.
        path: where to write: a directory for `"saved_model"` (its name
            must not end in a file format's suffix), a file for `"keras"`,
            `"tflite"` and `"onnx"` (its name must end in `.keras`,
            `.tflite`, `.onnx`). Missing parent directories are created.
        format: `"saved_model"` (default), `"keras"`, `"tflite"` or
            `"onnx"`.
        overwrite: replace an existing model at `path`. Without it an
            existing `path` is an error and is left untouched. Even with it,
            a directory that is not a SavedModel is never replaced.

    Returns:
        The absolute path written.

    Raises:
        ValueError: on a model that does not map tokens to logits or
            cannot take dynamic shapes, an unknown `format`, a `path` that
            exists (without `overwrite`), is not writable or does not suit
            the format, when a package the format needs is missing, or when
            Keras does not run on the TensorFlow backend (all formats but
            `"keras"`).

    Example:

    ```python
    model = build_sequence_model(vocab_size=12, seq_len=8)
    export_model(model, "/tmp/reverse_model")
    served = tf.saved_model.load("/tmp/reverse_model")
    served.signatures["serving_default"](tokens=tokens)["predictions"]
    ```
    """
    if not isinstance(model, keras.Model):
        raise ValueError(
            f"`model` must be a keras.Model; received {type(model).__name__}."
        )
    check_choice(format, "format", FORMATS)
    overwrite = check_bool(overwrite, "overwrite")
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ValueError(
            f"`path` must be a non-empty path; received {path!r}.")
    path = os.path.abspath(os.fspath(path))
    check_token_model(model)
    check_packages(format)
    if format != "keras":
        check_tensorflow_backend(format)
    check_export_target(path, format, overwrite)

    with contextlib.ExitStack() as stack:
        staged = _stage(stack, path, directory=format == "saved_model")
        if format == "saved_model":
            _write_saved_model(model, staged)
        elif format == "keras":
            model.save(staged)
        elif format == "onnx":
            export_onnx.write_onnx(model, staged)
        else:
            flat_buffer = _tflite_model(model, os.path.dirname(path))
            with open(staged, "wb") as handle:
                handle.write(flat_buffer)
    return path


# ----------------------------------------------------------------- checks
def missing_packages(format):
    """The modules that `format` needs and that are not installed."""
    def installed(name):
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # A finder that refuses it.
            return False

    return [name for name in PACKAGES[format] if not installed(name)]


def check_packages(format):
    """Raises `ValueError` naming the packages `format` needs and misses."""
    missing = [_PACKAGE_NAMES.get(name, name)
               for name in missing_packages(format)]
    if not missing:
        return
    listed = " and ".join([", ".join(missing[:-1]), missing[-1]]
                          if len(missing) > 1 else missing)
    how = ('pip install "sdpa-keras-attention[onnx]"' if format == "onnx"
           else "pip install tensorflow")
    verb, pronoun = ("is", "it") if len(missing) == 1 else ("are", "them")
    raise ValueError(
        f'format="{format}" needs {listed}, which {verb} not installed '
        f'({how}); format="keras" exports without {pronoun}.'
    )


def _is_saved_model(path):
    return os.path.isdir(path) and any(
        os.path.isfile(os.path.join(path, name)) for name in _SAVED_MODEL_FILES
    )


def check_export_target(path, format="saved_model", overwrite=False):
    """Checks, touching nothing, that `export_model` may write `path`.

    Args:
        path: the export path.
        format: the export format (see `export_model`).
        overwrite: whether an existing model at `path` may be replaced.

    Raises:
        ValueError: when `path` does not suit `format`, exists (without
            `overwrite`), is anything but a model of `format` (with it: a
            SavedModel directory, or a model file of that format), or lies
            under an existing file.

    Example:

    ```python
    check_export_target("/tmp/model.keras", format="keras")  # no error
    ```
    """
    path = os.path.abspath(os.fspath(path))
    suffix = SUFFIXES.get(format)
    if suffix is not None and not path.endswith(suffix):
        raise ValueError(
            f'`path` must end in "{suffix}" for format="{format}"; received '
            f"{path}."
        )
    named = [name for name, end in SUFFIXES.items() if path.endswith(end)]
    if suffix is None and named:
        raise ValueError(
            f'`path` {path} names a format="{named[0]}" file, but '
            f'format="{format}" writes a directory; give the matching '
            "format or another path."
        )
    ancestor = os.path.dirname(path)
    while not os.path.lexists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise ValueError(
            f"`path` {path} is not writable: {ancestor} is not a directory."
        )
    if not os.path.lexists(path):
        return
    if not overwrite:
        raise ValueError(
            f"`path` {path} already exists; pass overwrite=True to replace it."
        )
    found = _kind_of(path, format)
    if found is not None:
        raise ValueError(
            f"`path` {path} is {found}, not {_KIND_NAMES[format]}; "
            "refusing to replace it even with overwrite=True."
        )


# What `overwrite=True` may replace, per format, in words.
_KIND_NAMES = {"saved_model": "a SavedModel directory",
               "keras": "a .keras model file",
               "tflite": "a TFLite model file", "onnx": "an ONNX model file"}


def _kind_of(path, format):
    """`None` when the existing `path` is a model of `format` (what an
    export may replace), else what it is, in words."""
    if os.path.islink(path):
        return "a symbolic link"
    if format == "saved_model":
        if not os.path.isdir(path):
            return "a file" if os.path.isfile(path) else "not a directory"
        return None if _is_saved_model(path) else (
            "a directory without saved_model.pb")
    if os.path.isdir(path):
        return "a directory"
    if not os.path.isfile(path):
        return "not a regular file"
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError as error:
        return f"a file that cannot be read ({error.strerror})"
    # A .keras file is a zip archive; a TFLite flat buffer carries the
    # file identifier "TFL3" after its 4-byte root offset; an ONNX
    # ModelProto begins with its ir_version field (field 1, varint: 0x08).
    if format == "keras" and head[:4] == b"PK\x03\x04":
        return None
    if format == "tflite" and head[4:8] == b"TFL3":
        return None
    if format == "onnx" and head[:1] == b"\x08":
        return None
    return "a file of another kind"


# ------------------------------------------------------------------ writes
def _stage(stack, path, directory):
    """Enters `atomic_path` for `path` on `stack`, creating the missing
    parent directories; returns the temporary path to write the export to.

    The export is renamed onto `path` by `_move_into_place`, which can
    replace an existing SavedModel atomically. The parent directories it
    created are removed again when the export fails.
    """
    parent = os.path.dirname(path)
    missing = parent
    created = []  # deepest first
    while not os.path.lexists(missing):
        created.append(missing)
        missing = os.path.dirname(missing)

    def remove_created(kind, error, traceback):
        if kind is not None:
            for directory in created:
                with contextlib.suppress(OSError):
                    os.rmdir(directory)  # only while it is empty

    stack.push(remove_created)  # runs after `atomic_path` has cleaned up
    try:
        os.makedirs(parent, exist_ok=True)
        return stack.enter_context(
            atomic_path(path, directory=directory, replace=_move_into_place)
        )
    except OSError as error:
        reason = error.strerror or str(error)
        raise ValueError(
            f"`path` {path} is not writable: cannot create a temporary "
            f"export in {parent} ({reason})."
        ) from None


def _write_saved_model(model, directory):
    """Writes the SavedModel of `serving_module(model)`; returns its
    signature keys."""
    import tensorflow as tf

    module, signatures = serving_module(model)
    tf.saved_model.save(module, directory, signatures=signatures)
    return list(signatures)


def _tflite_model(model, scratch_parent):
    """The TFLite flat buffer of `serving_module(model)`.

    Conversion goes through a SavedModel (written to a scratch directory in
    `scratch_parent`, removed afterwards) because the converter's direct
    Keras 3 entry point (`from_keras_model`) fails on TF >= 2.16
    (tensorflow/tensorflow#63867), and Keras's own LiteRT exporter
    (`model.export(format="litert")`, Keras 3.15) writes one signature,
    `serving_default` with the logits alone (`output_0`).

    Raises:
        ValueError: when the converter refuses the model, naming the ops
            it could not convert.
    """
    import tensorflow as tf

    with tempfile.TemporaryDirectory(prefix=".saved_model.tmp-",
                                     dir=scratch_parent) as scratch:
        saved_model = os.path.join(scratch, "saved_model")
        signature_keys = _write_saved_model(model, saved_model)
        converter = tf.lite.TFLiteConverter.from_saved_model(
            saved_model, signature_keys=signature_keys
        )
        try:
            return converter.convert()
        except Exception as error:  # its ConverterError is not public API
            # Its message is a page of MLIR locations; the op list is the
            # line that says what to change.
            lines = [line.strip() for line in str(error).splitlines()]
            named = [line for line in lines if " ops: " in line]
            detail = "; ".join(named) or (lines or ["no message"])[0][:300]
            raise ValueError(
                f"`model` does not convert to TFLite ({detail})."
            ) from None


def _move_into_place(source, path):
    """Renames the finished export `source` to `path` (`atomic_path`'s
    last step).

    A file replaces a file in one atomic rename. An existing SavedModel
    directory (`check_export_target` allowed it: `overwrite=True`) is
    swapped with the new model in one atomic exchange where the system
    offers it (Linux `renameat2`): `os.replace` cannot put anything onto a
    non-empty directory, and deleting the old model first would leave no
    model at `path` for a moment, or none at all after a crash. No library
    offers the exchange. Elsewhere the old model is renamed aside, the new
    one renamed in and the old one deleted (on failure it is renamed back).
    """
    if not os.path.isdir(path) or os.path.islink(path):
        if os.path.lexists(path) and os.path.isdir(source):
            os.remove(path)  # A file (or link) making way for a SavedModel.
        os.replace(source, path)
        return
    if _exchange(source, path):
        # `source` now holds the old model.
        shutil.rmtree(source, ignore_errors=True)
        return
    aside = tempfile.mkdtemp(
        prefix=f".{os.path.basename(path)}.old-", dir=os.path.dirname(path)
    )
    old = os.path.join(aside, "model")
    os.rename(path, old)
    try:
        os.rename(source, path)
    except BaseException:
        os.rename(old, path)
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(first, second):
    """Atomically swaps two existing paths; returns `False` where the system
    cannot (no `renameat2`, or a file system without exchange support)."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [
        ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
        ctypes.c_uint,
    ]
    status = renameat2(
        _AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second),
        _RENAME_EXCHANGE,
    )
    if status == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), second)
