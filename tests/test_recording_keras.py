"""Recording the attention layers Keras ships, on every Keras backend.

The recorded weights of `MultiHeadAttention` (and a subclass),
`GroupQueryAttention`, `Attention` and `AdditiveAttention` are checked
against what each layer returns itself with `return_attention_scores=True`,
the recorded scores and masks against numpy written here from the layer's
own variables, and the diagnostics probe's gradient norms on models built
from them against automatic differentiation of a forward pass written out
here with `keras.ops` (a code path without recording). The cases run on
TensorFlow here, and on JAX and torch in the child runs of
test_backends.py.
"""

import math

import keras
import numpy as np
import pytest
from keras import ops

from _backends import gradients_of
from _backends import to_np
from keras_attention import diagnostics as diag
from keras_attention.recording import attention_layers
from keras_attention.recording import projection_kernels
from keras_attention.recording import record_attention

WIDTH, BATCH, QUERIES, KEYS, VOCAB = 8, 2, 5, 6, 7
MHA = keras.layers.MultiHeadAttention
GQA = keras.layers.GroupQueryAttention
SINGLE_HEAD = ("attention", "additive")
KERAS_VERSION = tuple(int(part) for part in keras.version().split(".")[:2])
PATCHED = ("_compute_attention", "_masked_softmax", "_apply_scores")


class PassThroughAttention(keras.layers.MultiHeadAttention):
    """A subclass overriding `_compute_attention`, as users do: Keras then
    skips its causal-only fast path (it checks the class's method)."""

    def _compute_attention(self, *args, **kwargs):
        return super()._compute_attention(*args, **kwargs)


class FusedOnlyAttention(keras.layers.MultiHeadAttention):
    """A subclass that never materialises the weights."""

    def _compute_attention(self, query, key, value, *args, **kwargs):
        return ops.dot_product_attention(query, key, value), None


def make_layer(kind, name=None):
    return {
        "mha": lambda: MHA(num_heads=2, key_dim=4, name=name),
        "subclass": lambda: PassThroughAttention(2, 4, name=name),
        "gqa": lambda: GQA(head_dim=4, num_query_heads=4,
                           num_key_value_heads=2, name=name),
        "attention": lambda: keras.layers.Attention(name=name),
        "additive": lambda: keras.layers.AdditiveAttention(name=name),
    }[kind]()


@pytest.fixture
def rng():
    keras.utils.set_random_seed(7)
    return np.random.default_rng(7)


def inputs(rng):
    query = rng.standard_normal((BATCH, QUERIES, WIDTH)).astype("float32")
    value = rng.standard_normal((BATCH, KEYS, WIDTH)).astype("float32")
    return query, value


def masks_for(kind, case, rng):
    """The call's mask arguments and the expected mask (B or 1, 1, T, S)."""
    if case == "none":
        return {}, None
    if case == "causal":
        causal = np.tril(np.ones((QUERIES, KEYS), bool))
        return {"use_causal_mask": True}, causal[None, None]
    if case == "padding":
        valid = np.ones((BATCH, KEYS), bool)
        valid[1, 3:] = False
        if kind in SINGLE_HEAD:
            return {"mask": [None, valid]}, valid[:, None, None, :]
        return {"value_mask": valid}, valid[:, None, None, :]
    mask = rng.random((BATCH, QUERIES, KEYS)) < 0.6
    mask[:, :, 0] = True  # every query keeps a key
    return {"attention_mask": mask}, mask[:, None]


def call(layer, query, value, masks, **kwargs):
    if isinstance(layer, keras.layers.Attention):
        return layer([query, value], **masks, **kwargs)
    return layer(query, value, **masks, **kwargs)


def array(variable):
    return to_np(variable).astype(np.float64)


def numpy_scores(layer, query, value):
    """The scaled scores before the mask, (B, H, T, S), from the layer's
    variables: written here, not read from Keras."""
    if isinstance(layer, keras.layers.AdditiveAttention):
        summed = np.tanh(query[:, :, None, :] + value[:, None, :, :])
        return np.sum(array(layer.scale) * summed, -1)[:, None]
    if isinstance(layer, keras.layers.Attention):
        return np.einsum("btd,bsd->bts", query, value)[:, None]
    heads = []
    for dense, x in ((layer._query_dense, query), (layer._key_dense, value)):
        heads.append(np.einsum("btd,dhk->bthk", x, array(dense.kernel))
                     + array(dense.bias))
    q, k = heads
    k = np.repeat(k, q.shape[2] // k.shape[2], axis=2)  # GQA's groups
    return np.einsum("bthk,bshk->bhts", q, k) / math.sqrt(q.shape[-1])


def numpy_softmax(scores, mask):
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    exps = np.exp(scores - scores.max(-1, keepdims=True))
    return exps / exps.sum(-1, keepdims=True)


def assert_restored(layer):
    assert not set(PATCHED) & set(layer.__dict__), layer.name


# ------------------------------------------- the layers' own weights
@pytest.mark.parametrize("case", ["none", "padding", "attention_mask",
                                  "causal"])
@pytest.mark.parametrize("kind", ["mha", "subclass", "gqa", "attention",
                                  "additive"])
def test_recorded_weights_equal_the_layers_own(kind, case, rng):
    if case == "attention_mask" and kind in SINGLE_HEAD:
        pytest.skip("Attention and AdditiveAttention take no attention_mask")
    if case == "padding" and kind in SINGLE_HEAD and KERAS_VERSION < (3, 9):
        pytest.skip("Keras < 3.9's Attention itself fails on a (B, S) mask")
    layer = make_layer(kind)
    query, value = inputs(rng)
    masks, expected_mask = masks_for(kind, case, rng)
    plain = to_np(call(layer, query, value, masks))
    own_output, own_weights = (
        to_np(x) for x in call(layer, query, value, masks,
                               return_attention_scores=True))
    with record_attention(layer) as records:
        output = to_np(call(layer, query, value, masks))
    record = records[layer.name]
    weights = to_np(record["weights"])
    heads = 1 if kind in SINGLE_HEAD else own_weights.shape[1]
    assert weights.shape == (BATCH, heads, QUERIES, KEYS)
    np.testing.assert_array_equal(
        weights, own_weights[:, None] if kind in SINGLE_HEAD else own_weights)
    # The same output as the layer's own weights-returning call, and the
    # plain call's up to the rounding of its fused kernel.
    np.testing.assert_array_equal(output, own_output)
    np.testing.assert_allclose(output, plain, rtol=1e-5, atol=1e-6)

    scores = record["scores"]
    assert keras.backend.standardize_dtype(scores.dtype) == "float32"
    np.testing.assert_allclose(
        to_np(scores), numpy_scores(layer, query, value), rtol=1e-5,
        atol=1e-5)
    if expected_mask is None:
        assert record["mask"] is None
    else:
        mask = to_np(record["mask"])
        assert mask.dtype == bool and mask.ndim == 4 and mask.shape[1] == 1
        np.testing.assert_array_equal(
            np.broadcast_to(mask, (BATCH, 1, QUERIES, KEYS)),
            np.broadcast_to(expected_mask, (BATCH, 1, QUERIES, KEYS)))
    np.testing.assert_allclose(
        weights, numpy_softmax(to_np(scores).astype(np.float64),
                               expected_mask), atol=1e-6)
    assert_restored(layer)


@pytest.mark.parametrize("kind", ["mha", "gqa", "attention", "additive"])
def test_score_offsets_shift_the_softmax_input(kind, rng):
    layer = make_layer(kind)
    query, value = inputs(rng)
    masks, mask = masks_for(kind, "causal", rng)
    _, own_weights = call(layer, query, value, masks,
                          return_attention_scores=True)
    heads = {"mha": 2, "gqa": 4}.get(kind, 1)
    zeros = np.zeros((BATCH, heads, QUERIES, KEYS), "float32")
    with record_attention(layer, {layer.name: zeros}) as records:
        call(layer, query, value, masks)
    np.testing.assert_array_equal(
        np.reshape(to_np(records[layer.name]["weights"]),
                   np.shape(to_np(own_weights))), to_np(own_weights))

    offset = rng.standard_normal((BATCH, heads, QUERIES, KEYS)).astype(
        "float32")
    with record_attention(layer, {layer.name: offset}) as records:
        call(layer, query, value, masks)
    record = records[layer.name]
    expected = numpy_scores(layer, query, value)
    np.testing.assert_allclose(to_np(record["scores"]), expected, rtol=1e-5,
                               atol=1e-5)  # without the offset
    np.testing.assert_allclose(to_np(record["weights"]),
                               numpy_softmax(expected + offset, mask),
                               atol=1e-5)


def test_flash_attention_layer_is_recorded_on_the_explicit_path(rng):
    """A layer built with `flash_attention=True` refuses to return its
    weights; recorded, it runs the explicit path for that call (the same
    attention) and gets its setting back."""
    flash = MHA(num_heads=2, key_dim=4, flash_attention=True)
    twin = MHA(num_heads=2, key_dim=4)
    query, value = inputs(rng)
    for layer in (flash, twin):
        layer.build(query.shape, value.shape)
    flash.set_weights(twin.get_weights())
    with pytest.raises(ValueError, match="flash attention"):
        flash(query, value, return_attention_scores=True)
    own_output, own_weights = twin(query, value, return_attention_scores=True)
    with record_attention(flash) as records:
        output = flash(query, value)
    np.testing.assert_array_equal(to_np(records[flash.name]["weights"]),
                                  to_np(own_weights))
    np.testing.assert_array_equal(to_np(output), to_np(own_output))
    assert flash._flash_attention is True
    assert_restored(flash)


@pytest.mark.parametrize("policy", ["mixed_bfloat16"])
def test_mixed_precision_records_float32_scores_with_their_gradient(policy,
                                                                    rng):
    """The scores are recorded in float32 (the softmax still gets the
    layer's own, the round trip is exact) and stay connected to the loss:
    the probe's |dL/dscores| of a mixed-precision model is the float32
    twin's, up to the low precision."""
    low, _ = probe_model("mha", True, rng)
    keras.utils.set_random_seed(7)
    tokens = keras.Input((QUERIES,), dtype="int32")
    hidden = keras.layers.Embedding(VOCAB, WIDTH, dtype=policy)(tokens)
    layer = MHA(num_heads=2, key_dim=4, dtype=policy, name="attn")
    hidden = layer(hidden, hidden, use_causal_mask=True)
    mixed = keras.Model(tokens, keras.layers.Dense(VOCAB, dtype=policy)(
        hidden))
    mixed.set_weights(low.get_weights())
    ids = rng.integers(0, VOCAB, (BATCH, QUERIES)).astype("int32")
    query = ops.take(mixed.layers[1].embeddings, ids, axis=0)
    _, own_weights = layer(query, query, use_causal_mask=True,
                           return_attention_scores=True)
    with record_attention(layer) as records:
        layer(query, query, use_causal_mask=True)
    record = records["attn"]
    assert keras.backend.standardize_dtype(record["scores"].dtype) == (
        "float32")
    np.testing.assert_array_equal(to_np(record["weights"]),
                                  to_np(own_weights))
    expected = diag.probe_diagnostics(low, ids, ids, None)["layers"]["attn"]
    found = diag.probe_diagnostics(mixed, ids, ids, None)["layers"]["attn"]
    for key in ("grad_norm_scores", "grad_norm_query"):
        assert found[key] == pytest.approx(expected[key], rel=0.05), key


# ------------------------------------------------ finding and restoring
def test_attention_layers_finds_every_kind_in_build_order(rng):
    inner_input = keras.Input((QUERIES, WIDTH))
    inner = keras.Model(
        inner_input,
        make_layer("gqa", "inner_gqa")(inner_input, inner_input),
        name="inner",
    )
    x = keras.Input((QUERIES, WIDTH))
    h = make_layer("mha", "mha")(x, x)
    h = make_layer("subclass", "subclass")(h, h)
    h = inner(h)
    h = make_layer("attention", "dot")([h, h])
    h = make_layer("additive", "additive")([h, h])
    model = keras.Model(x, keras.layers.Dense(3, name="head")(h))
    assert [layer.name for layer in attention_layers(model)] == [
        "mha", "subclass", "inner_gqa", "dot", "additive"]
    with record_attention(model) as records:
        model(inputs(rng)[0])
    assert sorted(records) == sorted(["mha", "subclass", "inner_gqa", "dot",
                                      "additive"])
    kernels = projection_kernels(model.get_layer("mha"))
    assert [k.path for k in kernels] == [
        "mha/query/kernel", "mha/key/kernel", "mha/value/kernel"]
    assert projection_kernels(model.get_layer("dot")) == (None,) * 3


def test_record_restores_the_layers_on_error_and_nests(rng):
    layer = make_layer("mha")
    query, value = inputs(rng)
    layer(query, value)
    with pytest.raises(ZeroDivisionError):
        with record_attention(layer):
            1 / 0
    assert_restored(layer)
    with record_attention(layer) as outer:
        with record_attention(layer) as inner:
            layer(query, value)
        assert list(inner) == [layer.name] and not outer
        layer(query, value)
        assert list(outer) == [layer.name]
    assert_restored(layer)


def test_unsupported_keras_fails_with_one_line(rng, monkeypatch):
    query, value = inputs(rng)
    fused = FusedOnlyAttention(num_heads=2, key_dim=4, name="fused")
    fused(query, value)
    with record_attention(fused):
        with pytest.raises(RuntimeError, match=r"'fused'.*Keras 3\."):
            fused(query, value)
    assert_restored(fused)

    axes = MHA(num_heads=2, key_dim=4, attention_axes=(1, 2), name="axes")
    grid = rng.standard_normal((BATCH, 3, 4, WIDTH)).astype("float32")
    with record_attention(axes):
        with pytest.raises(ValueError, match="'axes'.*several axes"):
            axes(grid, grid)

    # A Keras version whose `_masked_softmax` differs is refused before
    # anything is patched.
    layer = make_layer("mha", "changed")
    monkeypatch.setattr(MHA, "_masked_softmax",
                        lambda self, scores, mask, axis: scores)
    with pytest.raises(RuntimeError, match=r"'changed'.*Keras 3\."):
        with record_attention(layer):
            pass
    assert_restored(layer)


# ---------------------------------------------------- the probe on them
def probe_model(kind, causal, rng):
    """Embedding -> one attention layer (self-attention) -> Dense, with
    weights drawn from `rng`: scores of order 1, so no gradient is tiny."""
    tokens = keras.Input((QUERIES,), dtype="int32")
    hidden = keras.layers.Embedding(VOCAB, WIDTH)(tokens)
    layer = make_layer(kind, "attn")
    if kind in SINGLE_HEAD:
        hidden = layer([hidden, hidden], use_causal_mask=causal)
    else:
        hidden = layer(hidden, hidden, use_causal_mask=causal)
    model = keras.Model(tokens, keras.layers.Dense(VOCAB)(hidden))
    model.set_weights([
        (rng.standard_normal(w.shape) * (1.0 if i == 0 else 0.5)).astype(
            "float32") for i, w in enumerate(model.get_weights())])
    return model, layer


def reference_loss(model, layer, tokens, targets, causal):
    """The model's loss written out with `keras.ops`, as a function of an
    offset added to the scores and of W_Q, W_K, W_V (where the layer has
    them)."""
    embedding = model.layers[1].embeddings
    head = model.layers[-1]
    single_head = isinstance(layer, keras.layers.Attention)

    def loss(offset, *kernels):
        x = ops.take(embedding, tokens, axis=0)
        if single_head:
            q = k = v = x[:, :, None, :]
            scale = 1.0
        else:
            q, k, v = (
                ops.einsum("btd,dhk->bthk", x, w) + dense.bias
                for w, dense in zip(kernels, (layer._query_dense,
                                              layer._key_dense,
                                              layer._value_dense)))
            repeats = q.shape[2] // k.shape[2]  # GQA's groups
            k, v = (ops.repeat(t, repeats, axis=2) for t in (k, v))
            scale = 1.0 / math.sqrt(q.shape[-1])
        scores = ops.einsum("bthk,bshk->bhts", q, k) * scale + (
            ops.convert_to_tensor(offset))
        if causal:
            scores = ops.where(np.tril(np.ones((QUERIES, QUERIES), bool)),
                               scores, -1e9)
        attended = ops.einsum("bhts,bshk->bthk", ops.softmax(scores, -1), v)
        if single_head:
            out = attended[:, :, 0]
        else:
            out = ops.einsum("bthk,hkd->btd", attended,
                             layer._output_dense.kernel)
            out = out + layer._output_dense.bias
        logits = ops.matmul(out, head.kernel) + head.bias
        return ops.mean(ops.sparse_categorical_crossentropy(
            targets, logits, from_logits=True))

    return loss


@pytest.mark.parametrize("kind, causal, compiled", [
    ("mha", True, False), ("mha", True, True), ("gqa", False, False),
    ("attention", True, False),
])
def test_probe_gradients_match_a_written_out_forward_pass(kind, causal,
                                                          compiled, rng):
    model, layer = probe_model(kind, causal, rng)
    tokens = rng.integers(0, VOCAB, (BATCH, QUERIES)).astype("int32")
    targets = rng.integers(0, VOCAB, (BATCH, QUERIES)).astype("int32")
    if compiled:
        result = diag.diagnostics_probe(model)(tokens, targets, None)
    else:
        result = diag.probe_diagnostics(model, tokens, targets, None)
    stats = result["layers"]["attn"]

    heads = stats["weights"].shape[1]
    offset = np.zeros((BATCH, heads, QUERIES, QUERIES), "float32")
    kernels = [to_np(k) for k in projection_kernels(layer) if k is not None]
    loss = reference_loss(model, layer, tokens, targets, causal)
    assert result["loss"] == pytest.approx(
        float(to_np(loss(offset, *kernels))), rel=1e-5)
    grads = gradients_of(loss, [offset, *kernels])
    assert stats["grad_norm_scores"] == pytest.approx(
        np.linalg.norm(grads[0]), rel=1e-4)
    assert stats["grad_norm_scores"] > 1e-3
    for index, key in enumerate(("query", "key", "value")):
        norm = stats[f"grad_norm_{key}"]
        if not kernels:  # Attention has no projections
            assert norm is None
        else:
            assert norm == pytest.approx(np.linalg.norm(grads[index + 1]),
                                         rel=1e-4)
            assert norm > 1e-3
    if not kernels:
        assert "grad_norm_query" not in result["summary"]
    assert_restored(layer)


def test_probe_gives_zero_for_a_frozen_projection(rng):
    """A frozen Keras projection's gradient norm is 0, as a frozen kernel
    of our layer's is, on every backend."""
    model, layer = probe_model("mha", False, rng)
    layer._query_dense.trainable = False
    ids = rng.integers(0, VOCAB, (BATCH, QUERIES)).astype("int32")
    stats = diag.probe_diagnostics(model, ids, ids, None)["layers"]["attn"]
    assert stats["grad_norm_query"] == 0.0
    assert stats["grad_norm_key"] > 1e-3 and stats["grad_norm_scores"] > 1e-3


def test_probe_refuses_a_model_without_attention_naming_the_kinds():
    x = keras.Input((3,))
    model = keras.Model(x, keras.layers.Dense(2)(x))
    with pytest.raises(ValueError, match="MultiHeadAttention.*Attention"):
        diag.probe_diagnostics(model, np.zeros((1, 3)), np.zeros((1,)),
                               None)


def test_summaries_of_a_layer_without_projections(rng, tmp_path):
    """`write_diagnostics` writes |dL/dscores| of a Keras `Attention` layer
    and no kernel gradients (it has none), read back with TensorBoard's
    own event reader."""
    from tensorboard.backend.event_processing import event_file_loader

    from keras_attention.events import SummaryWriter

    model, _ = probe_model("attention", True, rng)
    ids = rng.integers(0, VOCAB, (BATCH, QUERIES)).astype("int32")
    result = diag.probe_diagnostics(model, ids, ids, None)
    with SummaryWriter(tmp_path) as writer:
        diag.write_diagnostics(result, step=3, writer=writer, max_images=0)
    tags = {
        value.tag
        for path in tmp_path.glob("events.out.tfevents.*")
        for event in event_file_loader.EventFileLoader(str(path)).Load()
        for value in event.summary.value
    }
    assert {tag for tag in tags if tag.startswith("gradients/")} == {
        "gradients/attn/scores"}
    assert "attention/mean/grad_norm_scores" in tags
    assert "attention/mean/grad_norm_query" not in tags
    assert "attention/attn/entropy/head0" in tags
