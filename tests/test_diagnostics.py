"""Tests for keras_attention.diagnostics: numpy references, hand cases."""

import glob
import io
import math

import keras
import matplotlib
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.util import tensor_util

from keras_attention import diagnostics as diag
from keras_attention.diagnostics.drawing import LabelledHeatmaps
from keras_attention.events import SummaryWriter
from keras_attention.layer import ScaledDotProductAttention


def numpy_entropy(weights, mask=None):
    """(raw, normalised) entropy per row, written out independently."""
    weights = np.asarray(weights, np.float64)
    if mask is None:
        mask = np.ones(weights.shape, bool)
    mask = np.broadcast_to(mask, weights.shape)
    raw = np.zeros(weights.shape[:-1])
    normalized = np.zeros(weights.shape[:-1])
    for index in np.ndindex(*weights.shape[:-1]):
        row = weights[index][mask[index]]
        row = row[row > 0]
        raw[index] = -np.sum(row * np.log(row))
        n = int(mask[index].sum())
        normalized[index] = raw[index] / math.log(n) if n > 1 else 0.0
    return raw, normalized


def srgb_to_lstar(rgb8):
    """CIE L* of sRGB uint8 colours (D65), via relative luminance Y."""
    c = np.asarray(rgb8, np.float64) / 255.0
    linear = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    y = linear @ np.array([0.2126, 0.7152, 0.0722])
    delta = 6.0 / 29.0
    f = np.where(y > delta**3, np.cbrt(y), y / (3 * delta**2) + 4.0 / 29.0)
    return 116.0 * f - 16.0


# ---------------------------------------------------------------- numerics


def test_uniform_and_one_hot_entropy_and_saturation():
    uniform = np.full((1, 1, 2, 4), 0.25)
    one_hot = np.zeros((1, 1, 2, 4))
    one_hot[..., 1] = 1.0
    stats_uniform = diag.layer_statistics(
        {"weights": uniform, "scores": np.zeros_like(uniform), "mask": None}
    )
    stats_hot = diag.layer_statistics(
        {"weights": one_hot, "scores": np.zeros_like(one_hot), "mask": None}
    )
    np.testing.assert_allclose(stats_uniform["entropy_normalized"], [1.0], 1e-6)
    np.testing.assert_allclose(stats_uniform["entropy"], [math.log(4)], 1e-6)
    np.testing.assert_allclose(
        stats_hot["entropy_normalized"], [0.0], atol=1e-6
    )
    np.testing.assert_allclose(stats_uniform["max_weight"], [0.25])
    np.testing.assert_allclose(stats_hot["max_weight"], [1.0])
    assert stats_uniform["saturated_fraction"][0] == 0.0
    assert stats_hot["saturated_fraction"][0] == 1.0


def test_max_weight_ignores_masked_keys_and_empty_rows():
    weights = np.array([[[[0.1, 0.6, 0.3], [0.2, 0.2, 0.6], [0.0, 0.0, 0.0]]]])
    mask = np.array([[[[True, False, True], [True, True, True], [False] * 3]]])
    # Row 0: key 1 is masked, so the largest attendable weight is 0.3.
    np.testing.assert_allclose(
        diag.max_weight(weights, mask), [[[0.3, 0.6, 0.0]]]
    )
    np.testing.assert_allclose(
        diag.max_weight(weights), [[[0.6, 0.6, 0.0]]]
    )


def test_saturated_fraction_counts_only_attendable_rows():
    weights = np.array(
        [[[[0.995, 0.005], [0.5, 0.5], [0.99, 0.01], [0.0, 0.0]]]]
    )
    mask = np.array([[[[True, True]] * 3 + [[False, False]]]])
    # 2 of the 3 attendable rows reach 0.99; the fully masked row is skipped.
    assert diag.saturated_fraction(weights, mask) == pytest.approx(2 / 3)
    # Without the mask, the all-zero row counts as an unsaturated row.
    assert diag.saturated_fraction(weights) == pytest.approx(2 / 4)
    assert diag.saturated_fraction(weights, mask, threshold=0.999) == 0.0
    nothing_attends = np.zeros(2, bool)
    assert diag.saturated_fraction(weights[..., :2], nothing_attends) == 0.0
    with pytest.raises(ValueError, match="threshold"):
        diag.saturated_fraction(weights, threshold=1.5)


def test_score_std_with_mask():
    scores = np.array([[[[1.0, 5.0, 100.0], [3.0, -50.0, 7.0]]]])
    mask = np.array([[[[True, True, False], [True, False, True]]]])
    expected = np.std([1.0, 5.0, 3.0, 7.0])  # mean 4, variance 5
    assert diag.score_std(scores, mask) == pytest.approx(math.sqrt(5.0))
    assert diag.score_std(scores, mask) == pytest.approx(expected)
    # A key mask broadcast over rows.
    key_mask = np.array([True, True, False])
    assert diag.score_std(scores, key_mask) == pytest.approx(
        np.std([1.0, 5.0, 3.0, -50.0])
    )
    assert diag.score_std(scores, np.zeros_like(mask)) == 0.0
    with pytest.raises(ValueError, match="mask"):
        diag.score_std(scores, np.ones((2, 2), bool))


def test_statistics_are_finite_for_fully_masked_rows_and_saturation():
    weights = np.zeros((2, 2, 3, 4))
    weights[..., 0] = 1.0
    weights[1, :, 2] = 0.0  # a fully masked row
    mask = np.ones((2, 2, 3, 4), bool)
    mask[1, :, 2] = False
    scores = np.where(mask, 1e4, 0.0)
    stats = diag.layer_statistics(
        {"weights": weights, "scores": scores, "mask": mask}
    )
    for key in ("entropy", "entropy_normalized", "max_weight", "entropy_rows"):
        assert np.all(np.isfinite(stats[key])), key
    assert stats["entropy_rows"].shape == (2 * 2 * 3 - 2,)
    np.testing.assert_allclose(stats["saturated_fraction"], [1.0, 1.0])


# ---------------------------------------------------------------- images


def test_colorize_is_matplotlib_viridis():
    # Matplotlib's own lookup, called directly, is the reference.
    reference = matplotlib.colormaps["viridis"]
    values = np.linspace(0.0, 1.0, 257)
    expected = reference(values, bytes=True)[:, :3]
    np.testing.assert_array_equal(diag.colorize(values), expected)
    # Another range and shape: (values - vmin) / (vmax - vmin) is looked up.
    grid = np.linspace(-2.0, 6.0, 24).reshape(2, 3, 4)
    np.testing.assert_array_equal(
        diag.colorize(grid, -2.0, 6.0),
        reference((grid + 2.0) / 8.0, bytes=True)[..., :3],
    )
    assert diag.colorize(0.5).shape == (3,)


def test_colorize_lightness_is_monotonic_and_endpoints_distinct():
    values = np.linspace(0.0, 1.0, 64)
    colours = diag.colorize(values)
    assert colours.dtype == np.uint8 and colours.shape == (64, 3)
    lightness = srgb_to_lstar(colours)
    assert np.all(np.diff(lightness) > 0.0)
    # Dark to light over most of the range, and the ends differ in colour.
    assert lightness[-1] - lightness[0] > 60.0
    assert np.abs(colours[0].astype(int) - colours[-1].astype(int)).max() > 100
    # Clipping outside [vmin, vmax] and a custom range.
    np.testing.assert_array_equal(diag.colorize(-3.0), colours[0])
    np.testing.assert_array_equal(diag.colorize(7.0), colours[-1])
    np.testing.assert_array_equal(diag.colorize(10.0, 0.0, 10.0), colours[-1])
    np.testing.assert_array_equal(diag.colorize(np.nan), colours[0])
    with pytest.raises(ValueError, match="vmin"):
        diag.colorize(values, 1.0, 1.0)


def test_heatmap_layout_and_hot_cell():
    batch, heads, queries, keys, cell = 4, 2, 3, 5, 4
    weights = np.zeros((batch, heads, queries, keys))
    weights[1, 1, 2, 3] = 1.0  # example 1, head 1, query 2 attends key 3
    images = diag.attention_heatmaps(weights, num_examples=3, cell_pixels=cell)
    assert images.dtype == np.uint8
    assert images.shape == (3 * heads, queries * cell, keys * cell, 3)
    hot = diag.colorize(1.0)
    cold = diag.colorize(0.0)
    image = images[1 * heads + 1]
    hot_cell = image[2 * cell : 3 * cell, 3 * cell : 4 * cell]
    assert np.all(hot_cell == hot)
    hot_pixels = np.all(images == hot, axis=-1)
    assert hot_pixels.sum() == cell * cell
    assert np.all(np.all(images == cold, axis=-1) | hot_pixels)
    # The hot colour is the lightest one.
    assert srgb_to_lstar(hot) > srgb_to_lstar(cold) + 50
    # Fewer examples than requested.
    one_example = diag.attention_heatmaps(weights[:1], num_examples=3)
    assert one_example.shape[0] == heads
    with pytest.raises(ValueError, match="cell_pixels"):
        diag.attention_heatmaps(weights, cell_pixels=0)
    with pytest.raises(ValueError, match="weights"):
        diag.attention_heatmaps(weights[0])


def test_png_round_trip():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(6, 9, 3), dtype=np.uint8)
    data = diag.encode_png(image)
    assert isinstance(data, bytes) and data[:8] == b"\x89PNG\r\n\x1a\n"
    np.testing.assert_array_equal(decode_png(data), image)
    with pytest.raises(ValueError, match="image_uint8"):
        diag.encode_png(image.astype(np.float32))


def decode_png(data):
    """The pixels of PNG bytes, `(height, width, channels)`."""
    return np.asarray(Image.open(io.BytesIO(data)))


# ---------------------------------------------------------------- summaries


def read_events(logdir):
    """tag -> list of (step, plugin name, numpy value) from the event files."""
    events = {}
    for path in glob.glob(f"{logdir}/events.out.tfevents.*"):
        for event in event_file_loader.EventFileLoader(path).Load():
            for value in event.summary.value:
                events.setdefault(value.tag, []).append(
                    (
                        event.step,
                        value.metadata.plugin_data.plugin_name,
                        tensor_util.make_ndarray(value.tensor),
                    )
                )
    return events


def test_write_diagnostics_tags_values_and_images(tmp_path):
    weights = np.zeros((4, 2, 3, 5))
    weights[:, 0] = 0.2  # head 0 uniform over 5 keys
    weights[:, 1, :, 0] = 1.0  # head 1 one-hot
    stats = diag.layer_statistics(
        {"weights": weights, "scores": np.zeros_like(weights), "mask": None}
    )
    stats.update(
        grad_norm_query=3.0,
        grad_norm_key=4.0,
        grad_norm_value=5.0,
        grad_norm_scores=6.0,
    )
    diagnostics = {
        "loss": 1.5,
        "accuracy": 0.25,
        "layers": {"attn": stats},
        "summary": {"entropy_normalized": 0.5, "grad_norm_query": 3.0},
    }
    with SummaryWriter(tmp_path) as writer:
        diag.write_diagnostics(diagnostics, step=7, writer=writer,
                               max_images=2)
    events = read_events(str(tmp_path))

    expected = {"attention/attn/score_std", "attention/attn/entropy_rows"}
    for key in ("entropy", "entropy_normalized", "max_weight",
                "saturated_fraction", "heatmap"):
        expected |= {f"attention/attn/{key}/head{h}" for h in range(2)}
    expected |= {
        f"gradients/attn/{name}"
        for name in ("query_kernel", "key_kernel", "value_kernel", "scores")
    }
    expected |= {
        "attention/mean/entropy_normalized",
        "attention/mean/grad_norm_query",
    }
    assert set(events) == expected

    def scalar(tag):
        ((step, plugin, value),) = events[tag]
        assert step == 7 and plugin == "scalars"
        return float(value)

    # Hand-computed: uniform over 5 keys -> ln 5 nats, normalised 1.
    prefix = "attention/attn"
    assert scalar(f"{prefix}/entropy/head0") == pytest.approx(math.log(5), 1e-5)
    assert scalar(f"{prefix}/entropy_normalized/head0") == pytest.approx(
        1.0, 1e-5
    )
    assert scalar(f"{prefix}/entropy_normalized/head1") == pytest.approx(
        0.0, abs=1e-6
    )
    assert scalar("attention/attn/max_weight/head0") == pytest.approx(0.2)
    assert scalar("attention/attn/saturated_fraction/head1") == 1.0
    assert scalar("gradients/attn/value_kernel") == 5.0
    assert scalar("attention/mean/entropy_normalized") == 0.5

    ((_, plugin, histogram),) = events["attention/attn/entropy_rows"]
    assert plugin == "histograms"
    # 4 examples x 2 heads x 3 rows were counted.
    assert histogram[:, 2].sum() == pytest.approx(24)

    ((_, plugin, image_tensor),) = events["attention/attn/heatmap/head1"]
    assert plugin == "images"
    assert len(image_tensor) == 2 + 2  # max_images examples
    decoded = decode_png(image_tensor[2])
    assert decoded.shape[:2] == (int(image_tensor[1]), int(image_tensor[0]))
    # Head 1 is one-hot on key 0: in the drawn map (left of the colour bar)
    # the first column of cells is the top colour, the 4 columns right of
    # it the bottom colour, 3 rows of cells tall.
    hot = np.all(decoded == diag.colorize(1.0), axis=-1)
    columns = np.flatnonzero(hot.any(axis=0))
    first = columns[0]
    last = first
    while last + 1 in columns:
        last += 1
    cell = last - first + 1
    rows = np.flatnonzero(hot[:, first:last + 1].all(axis=1))
    top, height = rows[0], rows[-1] - rows[0] + 1
    assert abs(height - 3 * cell) <= 2
    cold = decoded[top + 1:top + height - 1, last + 2:last + 4 * cell - 1]
    assert np.all(cold == diag.colorize(0.0))


def test_heatmaps_of_examples_with_labels_of_other_lengths(tmp_path):
    # Each tile's margin fits its longest label: two examples whose labels
    # differ in length make tiles of two sizes, padded white to one.
    weights = np.full((2, 1, 3, 3), 1.0 / 3)
    stats = diag.layer_statistics(
        {"weights": weights, "scores": np.zeros_like(weights), "mask": None})
    stats.update(grad_norm_query=0.0, grad_norm_key=0.0,
                 grad_norm_value=0.0, grad_norm_scores=0.0)
    labels = [["a", "b", "c"], ["a", "b", "a-much-longer-label"]]
    writer = SummaryWriter(tmp_path)
    diag.write_diagnostics({"layers": {"l": stats}, "summary": {}}, step=0,
                           writer=writer, query_labels=labels)
    writer.close()
    ((_, _, tensor),) = read_events(str(tmp_path))["attention/l/heatmap/head0"]
    first, second = (decode_png(png) for png in tensor[2:])
    # Each tile as the renderer draws it alone (PNG is lossless).
    tiles = [LabelledHeatmaps(vmax=1.0).render(
        weights[i, 0], labels[i], title=f"head 0, example {i}")
        for i in range(2)]
    height, width = tiles[0].shape[:2]
    assert tiles[1].shape[1] > width and first.shape == tiles[1].shape
    np.testing.assert_array_equal(second, tiles[1])
    np.testing.assert_array_equal(first[:height, :width], tiles[0])
    assert np.all(first[height:] == 255) and np.all(first[:, width:] == 255)


def test_write_diagnostics_labels_and_long_sequences(tmp_path):
    weights = np.full((2, 1, 100, 300), 1.0 / 300)
    stats = diag.layer_statistics(
        {"weights": weights, "scores": np.zeros_like(weights), "mask": None}
    )
    stats.update(
        grad_norm_query=0.0,
        grad_norm_key=0.0,
        grad_norm_value=0.0,
        grad_norm_scores=0.0,
    )
    diagnostics = {"layers": {"long": stats}, "summary": {}}
    query_labels = [[f"q{i}" for i in range(100)]] * 2
    key_labels = [[f"k{i}" for i in range(300)]] * 2
    writer = SummaryWriter(tmp_path)
    diag.write_diagnostics(diagnostics, step=0, writer=writer,
                           query_labels=query_labels, key_labels=key_labels)
    ((_, _, image_tensor),) = read_events(str(tmp_path))[
        "attention/long/heatmap/head0"
    ]
    height, width, _ = decode_png(image_tensor[2]).shape
    # Cells shrink so the map stays about MAX_HEATMAP_SIDE wide (8-pixel
    # cells would make it 2400), and it keeps its 1:3 shape.
    assert width <= diag.MAX_HEATMAP_SIDE + 200
    assert height < width / 2
    with pytest.raises(ValueError, match="key_labels"):
        diag.write_diagnostics(diagnostics, step=1, writer=writer,
                               query_labels=query_labels,
                               key_labels=[["k"] * 299] * 2)
    with pytest.raises(ValueError, match="query_labels"):
        diag.write_diagnostics(diagnostics, step=1, writer=writer,
                               query_labels=query_labels[:1],
                               key_labels=key_labels)
    writer.close()
    # Bad labels are found before anything of the step is written.
    assert all(step == 0 for values in read_events(str(tmp_path)).values()
               for step, _, _ in values)


def test_write_diagnostics_rejects_bad_input(tmp_path):
    writer = SummaryWriter(tmp_path)
    with pytest.raises(ValueError, match="diagnostics"):
        diag.write_diagnostics({"loss": 1.0}, step=0, writer=writer)
    with pytest.raises(ValueError, match="max_images"):
        diag.write_diagnostics(
            {"layers": {}, "summary": {}}, step=0, writer=writer, max_images=-1
        )
    with pytest.raises(ValueError, match="writer"):
        diag.write_diagnostics({"layers": {}, "summary": {}}, step=0,
                               writer=None)
    writer.close()


# ---------------------------------------------------------- probe batch

VOCAB, WIDTH, HEADS, KEY_DIM = 11, 8, 2, 4


class TinyModel(keras.Model):
    """Embedding -> self-attention (padding masked) -> Dense logits."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.embedding = keras.layers.Embedding(VOCAB, WIDTH)
        self.attention = ScaledDotProductAttention(
            key_dim=KEY_DIM, num_heads=HEADS, name="attention_0"
        )
        self.head = keras.layers.Dense(VOCAB)

    def call(self, tokens, training=None):
        hidden = self.embedding(tokens)
        return self.head(
            self.attention(hidden, query_mask=tokens != 0, training=training)
        )


def probe_batch(seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, VOCAB, size=(3, 6)).astype("int32")
    tokens[1, 4:] = 0  # padding: these rows and keys are masked
    tokens[2, 1:] = 0  # a single valid position: normalised entropy 0
    targets = rng.integers(0, VOCAB, size=(3, 6)).astype("int32")
    sample_weight = (tokens != 0).astype("float32")
    return tokens, targets, sample_weight


def reference_forward(model, tokens, targets, sample_weight):
    """The same model rebuilt from its weights with plain TF ops.

    Returns (loss, logits, scores, weights, mask, dL/dscores, dL/dW_Q): a
    second code path that shares no code with the layer or diagnostics.
    """
    layer = model.attention
    valid = tokens != 0
    mask = valid[:, None, :, None] & valid[:, None, None, :]
    mask = np.broadcast_to(mask, (3, HEADS, 6, 6))
    query_kernel = tf.Variable(np.asarray(layer.query_kernel))
    with tf.GradientTape(persistent=True) as tape:
        hidden = tf.convert_to_tensor(model.embedding(tokens))
        q = tf.einsum("btd,dhk->bthk", hidden, query_kernel)
        k = tf.einsum("btd,dhk->bthk", hidden, np.asarray(layer.key_kernel))
        v = tf.einsum("btd,dhk->bthk", hidden, np.asarray(layer.value_kernel))
        scores = tf.einsum("bthk,bshk->bhts", q, k) / math.sqrt(KEY_DIM)
        tape.watch(scores)
        probabilities = tf.nn.softmax(tf.where(mask, scores, -1e9), axis=-1)
        weights = tf.where(mask, probabilities, 0.0)
        attended = tf.einsum("bhts,bshd->bthd", weights, v)
        logits = model.head(tf.reshape(attended, (3, 6, HEADS * KEY_DIM)))
        log_probs = tf.nn.log_softmax(logits, axis=-1)
        picked = tf.gather(log_probs, targets, axis=-1, batch_dims=2)
        loss = -tf.reduce_sum(picked * sample_weight) / np.sum(sample_weight)
    grad_scores = tape.gradient(loss, scores)
    grad_query = tape.gradient(loss, query_kernel)
    return (
        float(loss),
        logits.numpy(),
        scores.numpy(),
        weights.numpy(),
        mask,
        grad_scores.numpy(),
        grad_query.numpy(),
    )


@pytest.fixture(scope="module")
def tiny_model():
    keras.utils.set_random_seed(1)
    model = TinyModel()
    model(probe_batch()[0])
    return model


def test_probe_diagnostics_matches_independent_forward(tiny_model):
    tokens, targets, sample_weight = probe_batch()
    result = diag.probe_diagnostics(tiny_model, tokens, targets, sample_weight)
    loss, logits, scores, weights, mask, grad_scores, grad_query = (
        reference_forward(tiny_model, tokens, targets, sample_weight)
    )
    stats = result["layers"]["attention_0"]

    assert result["loss"] == pytest.approx(loss, rel=1e-5)
    correct = (np.argmax(logits, -1) == targets) * sample_weight
    expected_accuracy = correct.sum() / sample_weight.sum()
    assert result["accuracy"] == pytest.approx(expected_accuracy)

    np.testing.assert_allclose(stats["weights"], weights, atol=1e-6)
    assert stats["score_std"] == pytest.approx(np.std(scores[mask]), rel=1e-5)
    assert stats["grad_norm_scores"] == pytest.approx(
        np.linalg.norm(grad_scores), rel=1e-4
    )
    assert stats["grad_norm_query"] == pytest.approx(
        np.linalg.norm(grad_query), rel=1e-4
    )

    # Entropy of the recorded weights, over rows that may attend somewhere.
    raw, normalized = numpy_entropy(stats["weights"], mask)
    rows = mask.any(-1)
    for head in range(HEADS):
        head_rows = rows[:, head]
        assert stats["entropy"][head] == pytest.approx(
            raw[:, head][head_rows].mean(), rel=1e-5
        )
        assert stats["entropy_normalized"][head] == pytest.approx(
            normalized[:, head][head_rows].mean(), rel=1e-5
        )
        assert stats["max_weight"][head] == pytest.approx(
            weights[:, head].max(-1)[head_rows].mean(), rel=1e-5
        )
    np.testing.assert_allclose(
        np.sort(stats["entropy_rows"]), np.sort(normalized[rows]), atol=1e-6
    )
    assert stats["entropy_rows"].shape == (HEADS * (6 + 4 + 1),)

    assert stats["entropy"].shape == (HEADS,)
    summary = result["summary"]
    assert summary["entropy"] == pytest.approx(np.mean(stats["entropy"]))
    assert summary["grad_norm_key"] == pytest.approx(stats["grad_norm_key"])
    for value in summary.values():
        assert isinstance(value, float) and math.isfinite(value)
    assert stats["grad_norm_key"] > 0 and stats["grad_norm_value"] > 0


def test_probe_diagnostics_second_path_via_model_loss(tiny_model):
    """dL/dW_Q from a plain tape on the model (fused attention path)."""
    tokens, targets, sample_weight = probe_batch(seed=3)
    result = diag.probe_diagnostics(tiny_model, tokens, targets, sample_weight)
    kernels = [
        tiny_model.attention.query_kernel,
        tiny_model.attention.key_kernel,
        tiny_model.attention.value_kernel,
    ]
    with tf.GradientTape() as tape:
        logits = tiny_model(tokens, training=False)
        per_position = keras.losses.sparse_categorical_crossentropy(
            targets, logits, from_logits=True
        )
        loss = tf.reduce_sum(per_position * sample_weight) / sample_weight.sum()
    grads = tape.gradient(loss, kernels)
    stats = result["layers"]["attention_0"]
    for grad, key in zip(grads, ("query", "key", "value")):
        assert stats[f"grad_norm_{key}"] == pytest.approx(
            float(tf.norm(grad)), rel=1e-4
        ), key

    doubled = diag.probe_diagnostics(
        tiny_model,
        tokens,
        targets,
        sample_weight,
        loss_fn=lambda y, logits, w: 2.0 * diag.default_loss(y, logits, w),
    )
    assert doubled["loss"] == pytest.approx(2 * result["loss"], rel=1e-6)
    assert doubled["layers"]["attention_0"]["grad_norm_query"] == pytest.approx(
        2 * stats["grad_norm_query"], rel=1e-5
    )


def test_compiled_probe_matches_independent_forward_and_follows_weights():
    """The compiled probe against the numpy-free reference forward, before
    and after the weights change (a trace must not freeze the weights)."""
    keras.utils.set_random_seed(4)
    model = TinyModel()
    tokens, targets, sample_weight = probe_batch(seed=5)
    model(tokens)
    probe = diag.diagnostics_probe(model)
    for round_index in range(2):
        result = probe(tokens, targets, sample_weight)
        loss, _, scores, weights, mask, grad_scores, grad_query = (
            reference_forward(model, tokens, targets, sample_weight)
        )
        stats = result["layers"]["attention_0"]
        assert result["loss"] == pytest.approx(loss, rel=1e-5)
        np.testing.assert_allclose(stats["weights"], weights, atol=1e-6)
        assert stats["score_std"] == pytest.approx(
            np.std(scores[mask]), rel=1e-5
        )
        assert stats["grad_norm_scores"] == pytest.approx(
            np.linalg.norm(grad_scores), rel=1e-4
        )
        assert stats["grad_norm_query"] == pytest.approx(
            np.linalg.norm(grad_query), rel=1e-4
        )
        eager = diag.probe_diagnostics(model, tokens, targets, sample_weight)
        for key, value in eager["summary"].items():
            assert result["summary"][key] == pytest.approx(value, rel=1e-5), key
        # New weights for the second round.
        kernel = model.attention.query_kernel
        kernel.assign(kernel.numpy() * 3.0)
    with pytest.raises(ValueError, match="ScaledDotProductAttention"):
        diag.diagnostics_probe(keras.Sequential([keras.layers.Dense(2)]))


def test_probe_diagnostics_averages_over_layers_and_writes(tmp_path):
    keras.utils.set_random_seed(2)
    inputs = keras.Input((5,), dtype="int32")
    hidden = keras.layers.Embedding(VOCAB, WIDTH)(inputs)
    first = ScaledDotProductAttention(key_dim=4, num_heads=2, name="first")
    second = ScaledDotProductAttention(
        key_dim=4, num_heads=2, scale="none", name="second"
    )
    hidden = second(first(hidden, use_causal_mask=True))
    model = keras.Model(inputs, keras.layers.Dense(VOCAB)(hidden))
    tokens = np.arange(10, dtype="int32").reshape(2, 5)
    targets = (tokens + 1) % VOCAB
    result = diag.probe_diagnostics(model, tokens, targets, None)
    assert set(result["layers"]) == {"first", "second"}
    for key in ("score_std", "saturated_fraction", "grad_norm_scores"):
        per_layer = [
            np.mean(result["layers"][name][key]) for name in ("first", "second")
        ]
        assert result["summary"][key] == pytest.approx(np.mean(per_layer))
    # The causal first query row sees one key: max weight 1, entropy 0.
    first_weights = result["layers"]["first"]["weights"]
    np.testing.assert_allclose(first_weights[:, :, 0, 0], 1.0, atol=1e-6)

    with SummaryWriter(tmp_path) as writer:
        diag.write_diagnostics(result, step=3, writer=writer)
    tags = set(read_events(str(tmp_path)))
    assert "gradients/second/scores" in tags
    assert "attention/first/heatmap/head1" in tags
    assert "attention/mean/grad_norm_scores" in tags


def test_probe_diagnostics_rejects_models_without_attention():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    with pytest.raises(ValueError, match="model"):
        diag.probe_diagnostics(
            model, np.zeros((2, 4)), np.zeros(2, "int32"), None
        )
    with pytest.raises(ValueError, match="sample_weight"):
        diag.probe_diagnostics(
            TinyModel(), np.ones((2, 3), "int32"), np.ones((2, 3), "int32"),
            np.ones((2,)),
        )
