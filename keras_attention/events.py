"""`SummaryWriter`: TensorBoard event files written (and `read_events`: read
back) without TensorFlow.

Floor 0: numpy, the standard library, TensorBoard's protos, its numpy
summary builders (`scalar_pb`, `histogram_pb`, `text_pb`), its record
framing (`RecordWriter`, `PyRecordReader_New`) and plugin metadata, and
Pillow for PNG; never TensorFlow, not even through `tensorboard.compat.tf`
(which imports it whenever it is installed, so TensorBoard's own
`EventFileWriter` and `EventFileLoader` are not used). The summaries are
those TensorFlow 2's `tf.summary` writes, value for value: the same plugin
metadata, tensor dtypes and shapes, so TensorBoard and the Attention
dashboard read either writer's runs alike.

Each record is handed to the operating system before the call that wrote
it returns: a refused write (full disk, file too large, read-only
directory) raises `OSError`, with its errno, from that call, and the file is
cut back to its last whole record, so it stays readable. TensorBoard's
`EventFileWriter` queues records for a thread, where a refusal is lost.

The CRC-32C is TensorBoard's pure-Python one (4-8 MB/s; TensorFlow's is
native). Measured in one process on a shared 2-core CPU, one diagnostics
step as `pipelines/steps.py`'s `make_diagnose` writes it (2 layers, 1 head,
16 tokens: scalars, histograms, 3 heat maps a head, the dashboard summary
of 4 examples) took 109 ms here against 121 ms through `tf.summary`, 22 ms
of it the CRC of 91 kB; with 4 heads 362 against 458 ms (76 ms CRC).
Drawing the heat maps dominates. A 2048 x 2048 float16 dashboard map
(8 MB) is where the CRC tells: 1.8 s against 0.4 s.
"""

import io
import itertools
import os
import socket
import time

import numpy as np
from PIL import Image
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.compat.proto import tensor_pb2
from tensorboard.compat.tensorflow_stub import errors
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import (
    PyRecordReader_New,
)
from tensorboard.plugins.histogram.summary_v2 import histogram_pb
from tensorboard.plugins.image import metadata as image_metadata
from tensorboard.plugins.scalar.summary_v2 import scalar_pb
from tensorboard.plugins.text.summary_v2 import text_pb
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util import tensor_util

from keras_attention.validation import check_int

# What TensorFlow's event writer puts in the first event of every file;
# TensorBoard reads the version from it.
FILE_VERSION = "brain.Event:2"
DEFAULT_BUCKETS = 30
# Numbers the files a process opens, as TensorFlow's writer does, so two
# writers opened on one directory in the same second never share a name.
_FILE_NUMBERS = itertools.count()


def encode_png(image_uint8):
    """Encodes an `(height, width, channels)` uint8 image as PNG bytes.

    Args:
        image_uint8: uint8 array with 1 (grey), 3 (RGB) or 4 (RGBA) channels.

    Returns:
        The PNG file contents as `bytes`.

    Raises:
        ValueError: if `image_uint8` is not such an array.

    Example:

    >>> encode_png(np.zeros((2, 2, 3), np.uint8))[:4]
    b'\\x89PNG'
    """
    image = np.asarray(image_uint8)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] not in (
        1, 3, 4,
    ):
        raise ValueError(
            f"`image_uint8` must be a uint8 array (height, width, 1|3|4); "
            f"received dtype {image.dtype} and shape {image.shape}."
        )
    buffer = io.BytesIO()
    # Pillow's PNG default is zlib level 6, as is `tf.io.encode_png`'s.
    Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(
        buffer, format="PNG")
    return buffer.getvalue()


class SummaryWriter:
    """Writes TensorBoard summaries to a new event file in `logdir`.

    The file is named as TensorFlow names its own,
    `events.out.tfevents.<seconds>.<host>.<pid>.<n>`, and starts with the
    file-version event. Every summary method writes one event at `step`
    before it returns (no queue, no thread).

    Args:
        logdir: the directory of the run; made if missing.
        filename_suffix: ends the file's name (marks a file to replace).

    Attributes:
        logdir: the directory.
        path: the event file's path.

    Raises:
        OSError: if the directory or the file cannot be made.

    Example:

    ```python
    with SummaryWriter("runs/a") as writer:
        writer.scalar("loss", 0.25, step=10)
        writer.image("maps", np.zeros((1, 8, 8, 3), np.uint8), step=10)
    ```
    """

    def __init__(self, logdir, filename_suffix=""):
        logdir = os.fspath(logdir)
        os.makedirs(logdir, exist_ok=True)
        name = (f"events.out.tfevents.{int(time.time()):010d}."
                f"{socket.gethostname()}.{os.getpid()}."
                f"{next(_FILE_NUMBERS)}{filename_suffix}")
        self.logdir = logdir
        self.path = os.path.join(logdir, name)
        self._records = RecordWriter(_WholeRecords(self.path))
        self._write_event(event_pb2.Event(wall_time=time.time(),
                                          file_version=FILE_VERSION))

    @property
    def closed(self):
        """Whether `close` has been called."""
        return self._records.closed

    def scalar(self, tag, value, step):
        """Writes a scalar, a float32 tensor as `tf.summary.scalar` does.

        Args:
            tag: the summary's tag.
            value: a real number (any numeric scalar; NaN and inf kept).
            step: the step, an integer >= 0.

        Raises:
            ValueError: if `tag`, `value` or `step` is not as above.
        """
        array = np.asarray(value)
        if array.size != 1 or array.dtype.kind not in "biuf":
            raise ValueError(f"`value` must be a real number; received "
                             f"{value!r}.")
        self.write_summary(scalar_pb(_check_tag(tag), array.reshape(())),
                           step)

    def histogram(self, tag, values, step, buckets=DEFAULT_BUCKETS):
        """Writes a histogram as TensorFlow 2's `tf.summary.histogram` does:
        a float64 `(buckets, 3)` tensor of left edge, right edge and count,
        built by TensorBoard's `histogram_pb`.

        The buckets split `[min, max]` of the values evenly (the last one
        closed); when all values are equal every edge is that value and the
        last bucket holds them all; with no values every entry is 0.
        Non-finite values are left out (TensorBoard cannot place them, and
        `histogram_pb` would turn every edge into NaN).

        Args:
            tag: the summary's tag.
            values: an array of real numbers, any shape.
            step: the step, an integer >= 0.
            buckets: the number of buckets, a positive integer.

        Raises:
            ValueError: if an argument is not as above.
        """
        buckets = check_int(buckets, "buckets")
        try:
            data = np.asarray(values, dtype=np.float64).ravel()
        except (TypeError, ValueError):
            raise ValueError(f"`values` must be an array of real numbers; "
                             f"received {type(values).__name__}.") from None
        # `histogram_pb` counts through a (values, buckets) one-hot array:
        # 1M values in 30 buckets took 368 ms and 70 MB against 23 ms for
        # `np.histogram`; the diagnostics' histograms (entropy per query
        # row, ~1e4 values) take ~10 ms.
        self.write_summary(histogram_pb(_check_tag(tag),
                                        data[np.isfinite(data)], buckets),
                           step)

    def image(self, tag, images, step, max_outputs=3):
        """Writes images as `tf.summary.image` does: a string tensor of the
        width, the height, then one PNG per image.

        Args:
            tag: the summary's tag.
            images: a uint8 array `(N, height, width, channels)`, with 1, 3
                or 4 channels.
            step: the step, an integer >= 0.
            max_outputs: at most this many of the first images are written.

        Raises:
            ValueError: if an argument is not as above.
        """
        images = np.asarray(images)
        if images.dtype != np.uint8 or images.ndim != 4 or (
                images.shape[-1] not in (1, 3, 4)):
            raise ValueError(
                f"`images` must be a uint8 array (N, height, width, 1|3|4); "
                f"received dtype {images.dtype} and shape {images.shape}.")
        max_outputs = check_int(max_outputs, "max_outputs")
        _, height, width, _ = images.shape
        blobs = [str(width).encode(), str(height).encode()]
        blobs += [encode_png(image) for image in images[:max_outputs]]
        self.tensor(tag, blobs, step,
                    image_metadata.create_summary_metadata(None, None))

    def text(self, tag, text, step):
        """Writes a text summary (Markdown), as `tf.summary.text` does.

        Args:
            tag: the summary's tag.
            text: a `str`.
            step: the step, an integer >= 0.

        Raises:
            ValueError: if an argument is not as above.
        """
        if not isinstance(text, str):
            raise ValueError(f"`text` must be a str; received "
                             f"{type(text).__name__}.")
        self.write_summary(text_pb(_check_tag(tag), text), step)

    def tensor(self, tag, value, step, metadata):
        """Writes a tensor summary with the given plugin metadata, as
        `tf.summary.write` does.

        Args:
            tag: the summary's tag.
            value: a numpy array or number (its dtype is kept), a `bytes`
                string, a list of `bytes` (a string tensor; kept as Python
                objects, since a fixed-width numpy byte array drops trailing
                NUL bytes), or a `TensorProto`.
            step: the step, an integer >= 0.
            metadata: the `summary_pb2.SummaryMetadata` naming the plugin.

        Raises:
            ValueError: if an argument is not as above.

        Example:

        ```python
        writer.tensor("attention/l0/maps", [b"{}", weights.tobytes()], 5,
                      summary_metadata("l0"))
        ```
        """
        if not isinstance(metadata, summary_pb2.SummaryMetadata):
            raise ValueError(f"`metadata` must be a SummaryMetadata; "
                             f"received {type(metadata).__name__}.")
        summary = summary_pb2.Summary()
        summary.value.add(tag=_check_tag(tag), metadata=metadata,
                          tensor=_tensor_proto(value))
        self.write_summary(summary, step)

    def write_summary(self, summary, step):
        """Writes a ready-made `Summary` as one event, as
        `tf.summary.experimental.write_raw_pb` does (HParams, custom-scalar
        layouts).

        Args:
            summary: a `tensorboard.compat.proto.summary_pb2.Summary`.
            step: the step, an integer >= 0.

        Raises:
            ValueError: if an argument is not as above, or the writer is
                closed.
            OSError: if the system refuses the write.

        Example:

        ```python
        writer.write_summary(hparams_pb({"lr": 0.1}), step=0)
        ```
        """
        if not isinstance(summary, summary_pb2.Summary):
            raise ValueError(f"`summary` must be a summary_pb2.Summary; "
                             f"received {type(summary).__name__}.")
        step = check_int(step, "step", minimum=0)
        self._write_event(event_pb2.Event(wall_time=time.time(), step=step,
                                          summary=summary))

    def flush(self):
        """Makes what was written durable (`fsync`), as TensorFlow's flush
        does; each write already reached the operating system.

        Raises:
            OSError: if the system refuses.
        """
        if not self.closed:
            self._records.flush()

    def close(self):
        """Flushes and closes the file; later calls do nothing.

        Raises:
            OSError: if the system refuses the flush (the file is closed
                all the same).
        """
        if not self.closed:
            self._records.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def _write_event(self, event):
        if self.closed:
            raise ValueError(f"The SummaryWriter of {self.path} is closed.")
        self._records.write(event.SerializeToString())


class _WholeRecords:
    """The file under `RecordWriter`: unbuffered, so each record reaches the
    system in the call that wrote it, whole or not at all; "x" never
    truncates another writer's file."""

    def __init__(self, path):
        self._file = open(path, "xb", buffering=0)
        self._end = 0

    @property
    def closed(self):
        return self._file.closed

    def write(self, record):
        """Writes all of `record`, or cuts the file back and raises."""
        view = memoryview(record)
        try:
            while view:
                view = view[self._file.write(view):]
        except OSError:
            # A partial record would end every reader's pass over the file
            # there, also past records written once space is freed.
            try:
                os.ftruncate(self._file.fileno(), self._end)
                self._file.seek(self._end)
            except OSError:
                pass
            raise
        self._end += len(record)

    def flush(self):
        os.fsync(self._file.fileno())

    def close(self):
        try:
            self.flush()
        finally:
            self._file.close()


def read_events(path):
    """The `Event` protos of one event file, in order, up to its first
    record that is cut short or fails its checksum (a crash mid-write).
    TensorFlow-free, like the writer (TensorBoard's `EventFileLoader`
    imports TensorFlow whenever it is installed)."""
    reader = PyRecordReader_New(os.fspath(path))
    try:
        while True:
            try:
                reader.GetNext()
            except (errors.OutOfRangeError, errors.DataLossError):
                return
            yield event_pb2.Event.FromString(reader.record())
    finally:
        reader.file_handle.close()


def _check_tag(tag):
    if not isinstance(tag, str) or not tag:
        raise ValueError(f"`tag` must be a non-empty str; received {tag!r}.")
    return tag


def _tensor_proto(value):
    if isinstance(value, tensor_pb2.TensorProto):
        return value
    if isinstance(value, (list, tuple)) and all(
            isinstance(item, bytes) for item in value):
        value = np.array(value, dtype=object).reshape(len(value))
    try:
        return tensor_util.make_tensor_proto(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"`value` cannot be written as a tensor: "
                         f"{error}") from None
