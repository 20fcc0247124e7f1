"""The TensorFlow-free event writer (`keras_attention.events`), checked
against readers it shares no code with: TensorBoard's `EventAccumulator` and
data provider (what the dashboards read), numpy's histogram,
TensorFlow's own record reader and `tf.summary` (when TensorFlow is
installed), and a child process in which `import tensorflow` fails.
"""

import io
import json
import math
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from tensorboard import context
from tensorboard.backend.event_processing import data_provider
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.backend.event_processing import plugin_event_multiplexer
from tensorboard.backend.event_processing.event_file_loader import (
    EventFileLoader,
)
from tensorboard.backend.event_processing.event_file_loader import (
    RawEventFileLoader,
)
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import metadata as custom_metadata
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.hparams import summary_v2 as hp
from tensorboard.util.tensor_util import make_ndarray

from keras_attention.events import SummaryWriter
from keras_attention.events import encode_png
from keras_attention.events import read_events
from keras_attention.viz.summary import summary_metadata
from pipelines.common import WriteFailure
from pipelines.tensorboard import DiscardingWriter
from pipelines.tensorboard import LogWriter
from pipelines.tensorboard import read_event_scalars

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def accumulator(path):
    """TensorBoard's accumulator over one event file, keeping every event."""
    acc = event_accumulator.EventAccumulator(
        path, size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    return acc


def tensors(path, tag):
    """`[(step, numpy value)]` of `tag`, as TensorBoard read them."""
    return [(event.step, make_ndarray(event.tensor_proto))
            for event in accumulator(path).Tensors(tag)]


def png_pixels(data):
    image = np.asarray(Image.open(io.BytesIO(data)))
    return image[..., None] if image.ndim == 2 else image


def _child(code, *args):
    """Runs `code` in a fresh Python with this tree first on the path."""
    env = dict(os.environ, PYTHONPATH=ROOT, KERAS_BACKEND="numpy")
    return subprocess.run([sys.executable, "-c", code, *args], env=env,
                          capture_output=True, text=True, timeout=300)


# ------------------------------------------------------------ the file
def test_file_name_first_event_and_scalars(tmp_path):
    values = [(0, 1.5), (3, np.float32(-2.25)), (7, 4), (9, math.nan),
              (10, np.array(0.125))]
    with SummaryWriter(tmp_path / "run") as writer:
        for step, value in values:
            writer.scalar("loss", value, step)
        other = SummaryWriter(tmp_path / "run")
        other.close()
    name = os.path.basename(writer.path)
    assert re.fullmatch(
        rf"events\.out\.tfevents\.\d{{10}}\.{re.escape(socket.gethostname())}"
        rf"\.{os.getpid()}\.\d+", name), name
    assert other.path != writer.path and writer.closed

    first = next(EventFileLoader(writer.path).Load())
    assert first.file_version == "brain.Event:2"
    acc = accumulator(writer.path)
    assert acc.SummaryMetadata("loss").plugin_data.plugin_name == "scalars"
    read = tensors(writer.path, "loss")
    assert [step for step, _ in read] == [step for step, _ in values]
    for (_, got), (_, want) in zip(read, values):
        assert got.dtype == np.float32 and got.shape == ()
        np.testing.assert_array_equal(got, np.float32(want))
    # The pipelines' reader sees the same floats.
    logged = read_event_scalars(str(tmp_path / "run"))["loss"]
    assert logged[3] == -2.25 and math.isnan(logged[9])


def test_histograms_against_numpys_histogram(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.normal(2.0, 3.0, (40, 25))
    cases = {"normal": (data, 30), "few": (data[:3, :3], 4),
             "constant": (np.full(17, 0.5), 5), "empty": (np.zeros(0), 6)}
    with SummaryWriter(tmp_path) as writer:
        for tag, (values, buckets) in cases.items():
            writer.histogram(tag, values, 2, buckets=buckets)
        with_nan = np.concatenate([data.ravel(), [np.nan, np.inf, -np.inf]])
        writer.histogram("with_nan", with_nan, 2)
    acc = accumulator(writer.path)
    for tag, (values, buckets) in cases.items():
        assert acc.SummaryMetadata(tag).plugin_data.plugin_name == (
            "histograms")
        ((step, got),) = tensors(writer.path, tag)
        assert step == 2 and got.shape == (buckets, 3)
        assert got[:, 2].sum() == values.size
        if values.size and values.min() < values.max():
            counts, edges = np.histogram(values, bins=buckets)
            np.testing.assert_array_equal(got[:, 2], counts)
            np.testing.assert_allclose(got[:, 0], edges[:-1], rtol=1e-12)
            np.testing.assert_allclose(got[:, 1], edges[1:], rtol=1e-12)
            assert got[0, 0] == values.min() and got[-1, 1] == values.max()
    # All values equal: every edge is the value, the last bucket holds all.
    ((_, got),) = tensors(writer.path, "constant")
    np.testing.assert_array_equal(got, [[0.5, 0.5, 0]] * 4 + [[0.5, 0.5, 17]])
    ((_, got),) = tensors(writer.path, "empty")
    np.testing.assert_array_equal(got, np.zeros((6, 3)))
    ((_, got),) = tensors(writer.path, "with_nan")
    # Non-finite values are left out; the finite ones are all counted.
    np.testing.assert_array_equal(got, tensors(writer.path, "normal")[0][1])


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_images_decode_to_the_input_pixels(tmp_path, channels):
    rng = np.random.default_rng(channels)
    images = rng.integers(0, 256, (4, 5, 7, channels), dtype=np.uint8)
    with SummaryWriter(tmp_path) as writer:
        writer.image("maps", images, 11, max_outputs=3)
    assert accumulator(writer.path).SummaryMetadata(
        "maps").plugin_data.plugin_name == "images"
    ((step, blobs),) = tensors(writer.path, "maps")
    assert step == 11 and blobs.shape == (2 + 3,)
    assert (int(blobs[0]), int(blobs[1])) == (7, 5)  # width, height
    for image, data in zip(images, blobs[2:]):
        np.testing.assert_array_equal(png_pixels(data), image)
    np.testing.assert_array_equal(png_pixels(encode_png(images[3])),
                                  images[3])


def test_text_hparams_custom_scalars_and_blobs_read_by_the_dashboards(
        tmp_path):
    text = "```\n{\"key_dim\": 16}\n```  ünïcode"
    layout = layout_pb2.Layout(category=[layout_pb2.Category(
        title="c", chart=[layout_pb2.Chart(title="t")])])
    # Trailing NULs: a fixed-width numpy byte array would drop them.
    blobs = [json.dumps({"shape": [1]}).encode(), b"\x01\x00\x00"]
    experiment = hp.hparams_config_pb(
        hparams=[hp.HParam("arm", hp.Discrete(["a", "b"])),
                 hp.HParam("seed")],
        metrics=[hp.Metric("accuracy", group="eval")])
    with SummaryWriter(tmp_path / "run") as writer:
        writer.text("config", text, 0)
        writer.write_summary(experiment, 0)
        writer.write_summary(hp.hparams_pb({"arm": "a", "seed": 3},
                                           trial_id="trial"), 0)
        writer.tensor(custom_metadata.CONFIG_SUMMARY_TAG,
                      layout.SerializeToString(), 0,
                      custom_metadata.create_summary_metadata())
        writer.tensor("attention/l0/maps", blobs, 4, summary_metadata("l0"))
        writer.scalar("loss", 0.5, 4)

    ((_, got),) = tensors(writer.path, "config")
    assert got.shape == () and got.item().decode("utf-8") == text
    acc = accumulator(writer.path)
    content = acc.PluginTagToContent(hparams_metadata.PLUGIN_NAME)
    parsed = hparams_metadata.parse_experiment_plugin_data(
        content[hparams_metadata.EXPERIMENT_TAG])
    assert [info.name for info in parsed.hparam_infos] == ["arm", "seed"]
    assert [v.string_value for v in
            parsed.hparam_infos[0].domain_discrete.values] == ["a", "b"]
    assert parsed.metric_infos[0].name.tag == "accuracy"
    session = hparams_metadata.parse_session_start_info_plugin_data(
        content[hparams_metadata.SESSION_START_INFO_TAG])
    assert session.hparams["arm"].string_value == "a"
    assert session.hparams["seed"].number_value == 3
    ((_, got),) = tensors(writer.path, custom_metadata.CONFIG_SUMMARY_TAG)
    assert layout_pb2.Layout.FromString(got.item()) == layout

    # What TensorBoard's server hands the dashboards.
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer,
                                                     str(tmp_path))
    ctx = context.RequestContext()
    scalars = provider.read_scalars(ctx, experiment_id="",
                                    plugin_name="scalars", downsample=10)
    assert [(d.step, d.value) for d in scalars["run"]["loss"]] == [(4, 0.5)]
    sequences = provider.read_blob_sequences(
        ctx, experiment_id="", plugin_name="attention", downsample=10)
    (datum,) = sequences["run"]["attention/l0/maps"]
    assert datum.step == 4
    assert [provider.read_blob(ctx, blob_key=ref.blob_key)
            for ref in datum.values] == blobs


# --------------------------------------------------------- TensorFlow
def test_tensorflow_reads_the_file_and_writes_the_same_summaries(tmp_path):
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(1)
    values = rng.normal(size=200)
    images = rng.integers(0, 256, (2, 3, 4, 3), dtype=np.uint8)
    with SummaryWriter(tmp_path / "ours") as writer:
        writer.scalar("s", 0.1, 5)
        writer.histogram("h", values, 5, buckets=7)
        writer.image("i", images, 5, max_outputs=2)
        writer.text("t", "hello", 5)
    theirs = tf.summary.create_file_writer(str(tmp_path / "theirs"))
    with theirs.as_default():
        tf.summary.scalar("s", 0.1, step=5)
        tf.summary.histogram("h", values, step=5, buckets=7)
        tf.summary.image("i", images, step=5, max_outputs=2)
        tf.summary.text("t", "hello", step=5)
    theirs.close()

    def values_of(directory):
        (path,) = tf.io.gfile.glob(f"{directory}/events.out.tfevents.*")
        found = {}
        # TFRecordDataset checks both CRCs of every record.
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                found[value.tag] = (event.step, value)
        return found

    ours, reference = values_of(tmp_path / "ours"), values_of(
        tmp_path / "theirs")
    assert set(ours) == set(reference) == {"s", "h", "i", "t"}
    for tag, (step, value) in ours.items():
        want_step, want = reference[tag]
        assert step == want_step
        assert value.metadata == want.metadata, tag
        got, expected = (tf.make_ndarray(value.tensor),
                         tf.make_ndarray(want.tensor))
        assert got.dtype == expected.dtype and got.shape == expected.shape
        if tag == "i":
            for data, other in zip(got[2:], expected[2:]):
                np.testing.assert_array_equal(tf.io.decode_png(data),
                                              tf.io.decode_png(other))
            np.testing.assert_array_equal(got[:2], expected[:2])
        elif got.dtype.kind == "f":
            np.testing.assert_allclose(got, expected, rtol=1e-12)
        else:
            np.testing.assert_array_equal(got, expected)

    # The reader does check: one flipped byte is a DataLossError.
    (path,) = tf.io.gfile.glob(f"{tmp_path / 'ours'}/events.out.tfevents.*")
    with open(path, "rb") as good:
        data = bytearray(good.read())
    data[-6] ^= 0xFF
    with open(tmp_path / "bad", "wb") as bad:
        bad.write(data)
    with pytest.raises(tf.errors.DataLossError):
        list(tf.data.TFRecordDataset(str(tmp_path / "bad")))


# -------------------------------------------------------- refused writes
REFUSED = """
import errno, json, os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
from keras_attention.events import SummaryWriter
from keras_attention.viz.summary import summary_metadata
writer = SummaryWriter(sys.argv[1])
writer.scalar("before", 1.0, 1)
size = os.path.getsize(writer.path)
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 2000, resource.RLIM_INFINITY))
try:
    writer.tensor("big", [b"x" * 10000], 2, summary_metadata("l"))
    raised = None
except OSError as error:
    raised = [type(error).__name__, error.errno == errno.EFBIG]
cut_back = os.path.getsize(writer.path) == size
writer.scalar("after", 3.0, 3)
writer.close()
print(json.dumps({"raised": raised, "cut_back": cut_back}))
"""


def test_a_refused_write_raises_oserror_from_the_call(tmp_path):
    result = _child(REFUSED, str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome == {"raised": ["OSError", True], "cut_back": True}
    # The file stays whole: every record before and after reads back.
    tags = read_event_scalars(str(tmp_path))
    assert tags == {"before": {1: 1.0}, "after": {3: 3.0}}

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(OSError):
        SummaryWriter(blocked)
    if os.geteuid() != 0:  # root writes into read-only directories
        readonly = tmp_path / "readonly"
        readonly.mkdir(mode=0o500)
        with pytest.raises(PermissionError):
            SummaryWriter(readonly)


def test_log_writer_turns_a_refused_write_into_write_failure(tmp_path):
    logs = LogWriter(str(tmp_path), is_chief=True)
    logs.scalars({"loss": 1.0}, 1)

    def refuse(*args):
        raise OSError(28, os.strerror(28), logs.writer.path)

    logs.writer.scalar = refuse
    with pytest.raises(WriteFailure, match="No space left on device"):
        logs.scalars({"loss": 0.5}, 2)
    logs.close()
    # Resumed from a checkpoint at step 1: it wants the steps after it.
    resumed = LogWriter(str(tmp_path), is_chief=True, first_step=2)
    assert not resumed.wants(1) and resumed.wants(2)
    resumed.scalars({"loss": 0.25}, 2)
    resumed.close()
    assert read_event_scalars(str(tmp_path)) == {"loss": {1: 1.0, 2: 0.25}}


def test_a_non_chief_writes_nothing(tmp_path):
    public = {name for name in dir(SummaryWriter) if not name.startswith("_")
              and callable(getattr(SummaryWriter, name))}
    assert public <= set(dir(DiscardingWriter))
    logs = LogWriter(str(tmp_path / "worker"), is_chief=False)
    logs.scalars({"loss": 1.0}, 1)
    logs.writer.image("i", np.zeros((1, 2, 2, 3), np.uint8), 1)
    logs.close()
    assert not (tmp_path / "worker").exists()


# ---------------------------------------------------- without TensorFlow
WITHOUT_TENSORFLOW = """
import sys

class NoTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorflow":
            raise ImportError(f"{name} is blocked in this test")

sys.meta_path.insert(0, NoTensorFlow())
import numpy as np
from tensorboard.backend.event_processing.event_file_loader import (
    EventFileLoader)
from tensorboard.util.tensor_util import make_ndarray
from keras_attention.events import SummaryWriter

with SummaryWriter(sys.argv[1]) as writer:
    writer.scalar("s", 2.5, 1)
    writer.histogram("h", np.arange(10.0), 1, buckets=5)
    writer.image("i", np.full((1, 2, 3, 3), 7, np.uint8), 1)
    writer.text("t", "no tf", 1)
found = {value.tag: make_ndarray(value.tensor)
         for event in EventFileLoader(writer.path).Load()
         for value in event.summary.value}
assert float(found["s"]) == 2.5, found
assert found["h"][:, 2].tolist() == [2.0] * 5, found["h"]
assert found["i"][:2].tolist() == [b"3", b"2"] and len(found["i"]) == 3
assert found["t"].item() == b"no tf"
loaded = sorted(name for name in sys.modules if name.startswith("tensorflow"))
print("loaded:", loaded)
"""


def test_writes_and_reads_back_where_tensorflow_cannot_be_imported(tmp_path):
    result = _child(WITHOUT_TENSORFLOW, str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "loaded: []"


# ------------------------------------------------------------ arguments
def test_bad_arguments_name_the_argument(tmp_path):
    writer = SummaryWriter(tmp_path)
    image = np.zeros((1, 2, 2, 3), np.uint8)
    bad = [
        (lambda: writer.scalar("", 1.0, 0), "`tag`"),
        (lambda: writer.scalar("s", "1.0", 0), "`value`"),
        (lambda: writer.scalar("s", [1.0, 2.0], 0), "`value`"),
        (lambda: writer.scalar("s", 1.0, -1), "`step`"),
        (lambda: writer.scalar("s", 1.0, 1.5), "`step`"),
        (lambda: writer.histogram("h", [1.0], 0, buckets=0), "`buckets`"),
        (lambda: writer.histogram("h", ["a"], 0), "`values`"),
        (lambda: writer.image("i", image.astype(np.float32), 0), "`images`"),
        (lambda: writer.image("i", image[0], 0), "`images`"),
        (lambda: writer.image("i", image, 0, max_outputs=0),
         "`max_outputs`"),
        (lambda: writer.text("t", b"bytes", 0), "`text`"),
        (lambda: writer.tensor("x", 1.0, 0, None), "`metadata`"),
        (lambda: writer.write_summary(b"", 0), "`summary`"),
        (lambda: encode_png(image[0, ..., :2]), "`image_uint8`"),
    ]
    for call, name in bad:
        with pytest.raises(ValueError, match=name):
            call()
    writer.close()
    writer.close()
    with pytest.raises(ValueError, match="closed"):
        writer.scalar("s", 1.0, 0)
    # Nothing but the file-version event was written.
    assert len(list(EventFileLoader(writer.path).Load())) == 1


def test_read_events_agrees_with_tensorboard_and_stops_at_a_cut_record(
        tmp_path):
    """`read_events` against TensorBoard's own `RawEventFileLoader`: the same
    events, whole file and cut mid-record (a crash), and a flipped byte in
    a record's data ends the read there."""
    with SummaryWriter(str(tmp_path)) as writer:
        for step in range(5):
            writer.scalar("loss", 1.0 / (step + 1), step)
        path = writer.path

    def ours(file):
        return [event.SerializeToString() for event in read_events(file)]

    def theirs(file):
        # The raw records: EventFileLoader also migrates the summaries.
        return list(RawEventFileLoader(file).Load())

    whole = ours(path)
    assert len(whole) == 6  # the file_version event and five scalars
    assert whole == theirs(path)
    data = open(path, "rb").read()
    cut = tmp_path / "cut"
    cut.write_bytes(data[:-7])  # the last record loses its tail
    assert ours(str(cut)) == whole[:-1] == theirs(str(cut))
    # A flipped byte in the last record's data: its CRC fails.
    flipped = bytearray(data)
    flipped[-6] ^= 0xFF
    cut.write_bytes(bytes(flipped))
    assert ours(str(cut)) == whole[:-1]
