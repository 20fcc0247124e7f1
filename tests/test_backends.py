"""The library on TensorFlow, JAX and torch.

The cases here are written once, with `keras.ops` and the per-backend
gradient helpers of `_backends`, and compared with numpy references written
here or with a second code path (gradients of the custom backward passes
against automatic differentiation of the path that returns the weights).
They run on TensorFlow in this process; `test_marked_cases_pass_under` runs
them, with every case marked `@pytest.mark.backends(...)` in the modules
this run collected (one case of every behaviour of test_layer.py, the Keras
harness tests, the diagnostics probe, the pipeline, `fit` with the monitor),
on jax and torch in one child run per backend (whole modules under
`-m slow`). `test_torch_matches_tensorflow`
loads a `.keras` file saved here into a torch process and compares outputs
and gradients; `test_probe_matches_tensorflow` loads it into a jax and a
torch process and compares the probe's gradient norms and statistics.
"""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from keras import ops

import keras_attention.ops as attention_ops
from _backends import BACKEND
from _backends import OTHER_BACKENDS
from _backends import REPO_ROOT
from _backends import finish_pytest
from _backends import from_outer_run
from _backends import gradients_of
from _backends import layer_gradients
from _backends import marked_modules
from _backends import run_pytest_under
from _backends import start_pytest_under
from _backends import to_np
from keras_attention import ScaledDotProductAttention
from keras_attention import scaled_dot_product_attention
from keras_attention.memory_efficient import memory_efficient_attention

# Every case here passes on torch too (run by the child runs at the end).
pytestmark = pytest.mark.backends("torch")

RNG = np.random.default_rng(7)
# The score scale each mode stands for, written out here.
SCALE_VALUES = {
    "sqrt": lambda d: d**-0.5,
    "none": lambda d: 1.0,
    "inverse": lambda d: 1.0 / d,
    "learned": lambda d: d**-0.5,  # its initial value
    # Per query: s_h log(n) / sqrt(d) for a query that sees n keys.
    "ssmax": lambda d, s, n: s * np.log(np.maximum(n, 1)) / np.sqrt(d),
}
# The s_h the tests give ssmax's two heads, away from its initial value.
SSMAX_S = np.array([0.7, 0.4])
SCALES = list(attention_ops.SCALE_MODES) + [0.3]
PATHS = ["explicit", "fused", "memory_efficient", "auto"]


def randn(*shape):
    return RNG.standard_normal(shape).astype("float32")


def np_attention(q, k, v, scale, valid):
    """softmax(q k^T * scale) v in float64 with zero rows where nothing is
    valid; q `(B, T, H, d)`, valid broadcastable to `(B, H, T, S)`."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scores = np.einsum("bthd,bshd->bhts", q, k) * scale
    valid = np.broadcast_to(valid, scores.shape)
    scores = np.where(valid, scores, -np.inf)
    top = scores.max(-1, keepdims=True)
    exps = np.where(valid, np.exp(scores - np.where(np.isfinite(top), top, 0)), 0)
    total = exps.sum(-1, keepdims=True)
    weights = exps / np.where(total > 0, total, 1.0)
    return np.einsum("bhts,bshd->bthd", weights, v)


def test_every_scale_mode_has_a_reference_value():
    assert set(attention_ops.SCALE_MODES) <= set(SCALE_VALUES)


# ------------------------------------------- the layer: scales x paths
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("scale", SCALES, ids=str)
@pytest.mark.backends("jax", cases=[
    "learned-fused", "ssmax-explicit", "ssmax-fused", "ssmax-memory_efficient",
    "ssmax-auto"])
def test_scale_modes_on_every_path(scale, path):
    """Values against numpy; gradients of every weight (the learned scale
    included) against autodiff of the path that returns the weights."""
    b, t, features, heads, key_dim = 2, 7, 6, 2, 4
    layer = ScaledDotProductAttention(
        key_dim=key_dim, num_heads=heads, output_dim=5, scale=scale,
        use_bias=True, bias_initializer="random_normal", implementation=path,
    )
    x = randn(b, t, features)
    value_mask = np.ones((b, t), bool)
    value_mask[1, 5:] = False
    kwargs = dict(value_mask=value_mask, use_causal_mask=True)
    layer(x, **kwargs)
    if scale == "learned":
        layer.learned_scale.assign(0.7)  # away from the other modes' values
    if scale == "ssmax":
        layer.ssmax_scale.assign(SSMAX_S)
    w = {v.path.split("/")[-1]: to_np(v).astype(np.float64) for v in layer.weights}
    project = lambda name: (  # noqa: E731
        np.einsum("btd,dhk->bthk", x, w[f"{name}_kernel"]) + w[f"{name}_bias"]
    )
    valid = value_mask[:, None, None, :] & np.tril(np.ones((t, t), bool))
    if scale == "learned":
        numeric_scale = 0.7
    elif scale == "ssmax":  # (B, H, T, 1), n from the masks
        numeric_scale = SCALE_VALUES[scale](
            key_dim, SSMAX_S[None, :, None, None],
            valid.sum(-1, keepdims=True))
    elif isinstance(scale, str):
        numeric_scale = SCALE_VALUES[scale](key_dim)
    else:
        numeric_scale = scale
    attended = np_attention(
        project("query"), project("key"), project("value"), numeric_scale, valid
    )
    expected = np.einsum("bthd,hdo->bto", attended, w["output_kernel"])
    expected += w["output_bias"]
    np.testing.assert_allclose(to_np(layer(x, **kwargs)), expected, atol=1e-5)

    upstream = ops.convert_to_tensor(randn(b, t, 5))
    _, grads = layer_gradients(
        layer, [x], lambda y: ops.sum(y * upstream), **kwargs
    )
    # The second path: the same weights in an explicit layer that returns
    # the weights, differentiated automatically.
    explicit = ScaledDotProductAttention.from_config(
        {**layer.get_config(), "implementation": "explicit"}
    )
    explicit(x, **kwargs)
    explicit.set_weights(layer.get_weights())
    _, reference = layer_gradients(
        explicit, [x], lambda y: ops.sum(y[0] * upstream),
        return_attention_scores=True, **kwargs,
    )
    for variable, grad, ref in zip(layer.trainable_weights, grads, reference):
        assert np.all(np.isfinite(grad)), variable.path
        np.testing.assert_allclose(
            grad, ref, rtol=1e-4, atol=1e-5, err_msg=variable.path
        )
    if scale in ("learned", "ssmax"):
        assert np.all(np.abs(grads[-1]) > 1e-4)  # the scale is learned


@pytest.mark.parametrize("length,masked", [(64, False), (64, True),
                                           (4096, False), (4096, True)])
@pytest.mark.backends("jax")
def test_auto_picks_the_measured_path(length, masked):
    # The choice the layer's `_choose_path` docstring measures per backend.
    layer = ScaledDotProductAttention(key_dim=2)
    heads = np.zeros((1, length, 1, 2), "float32")
    path = layer._choose_path(heads, heads, False, False, masked)
    if length == 4096 and (masked or BACKEND != "torch"):
        assert path == "memory_efficient"
    else:
        assert path == ("fused" if BACKEND == "torch" else "explicit")
    assert layer._choose_path(heads, heads, True, False, masked) == (
        "explicit_weights"
    )


# ---------------------------------- the memory-efficient function itself
B, T, S, H, DK, DV = 2, 37, 29, 3, 8, 5
MASK_RNG = np.random.default_rng(1)
KEY_MASK = MASK_RNG.random((B, S)) > 0.3
KEY_MASK[1] = False  # example 1 has no key: zero output and gradients
QUERY_MASK = MASK_RNG.random((B, T)) > 0.2
MASK_CASES = {
    "none": {},
    "key_mask": {"key_mask": KEY_MASK},
    "query_mask": {"query_mask": QUERY_MASK},
    "attention_b_1_t_s": {"attention_mask": MASK_RNG.random((B, 1, T, S)) > 0.3},
    "attention_1_h_t_1": {"attention_mask": MASK_RNG.random((1, H, T, 1)) > 0.2},
    "causal": {"causal": True},
    "all": {
        "key_mask": KEY_MASK, "query_mask": QUERY_MASK, "causal": True,
        "attention_mask": MASK_RNG.random((B, H, T, S)) > 0.3,
    },
}


def _valid(key_mask=None, query_mask=None, attention_mask=None, causal=False):
    valid = np.ones((B, H, T, S), bool)
    if key_mask is not None:
        valid &= key_mask[:, None, None, :]
    if query_mask is not None:
        valid &= query_mask[:, None, :, None]
    if attention_mask is not None:
        valid &= attention_mask
    if causal:
        valid &= np.tril(np.ones((T, S), bool))
    return valid


@pytest.mark.parametrize("case", sorted(MASK_CASES))
def test_memory_efficient_values_and_gradients(case):
    masks = MASK_CASES[case]
    q, k, v = randn(B, T, H, DK), randn(B, S, H, DK), randn(B, S, H, DV)
    upstream = ops.convert_to_tensor(randn(B, T, H, DV))
    valid = _valid(**masks)
    scale = np.float32(0.3)

    def chunked(q, k, v, scale):
        out = memory_efficient_attention(
            q, k, v, scale, query_chunk_size=8, key_chunk_size=16, **masks
        )
        return ops.sum(out * upstream)

    def explicit(q, k, v, scale):
        out, _ = scaled_dot_product_attention(
            q, k, v, mask=valid, scale=scale, return_weights=True
        )
        return ops.sum(out * upstream)

    output = memory_efficient_attention(
        q, k, v, 0.3, query_chunk_size=8, key_chunk_size=16, **masks
    )
    np.testing.assert_allclose(
        to_np(output), np_attention(q, k, v, 0.3, valid), atol=1e-5
    )
    grads = gradients_of(chunked, [q, k, v, scale])
    reference = gradients_of(explicit, [q, k, v, scale])
    for name, grad, ref in zip(("query", "key", "value"), grads, reference):
        assert np.all(np.isfinite(grad)), name
        np.testing.assert_allclose(grad, ref, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(grads[3], reference[3], rtol=1e-4, atol=1e-5)
    if "key_mask" in masks:
        np.testing.assert_array_equal(grads[0][1], 0.0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_memory_efficient_low_precision_unscaled_stays_finite(dtype):
    rng = np.random.default_rng(3)
    inputs = [
        ops.cast(rng.standard_normal(shape), dtype)
        for shape in ((1, 20, 2, 1024), (1, 24, 2, 1024), (1, 24, 2, 4))
    ]

    def loss(q, k, v):
        out = memory_efficient_attention(
            q, k, v, 1.0, causal=True, query_chunk_size=8, key_chunk_size=16
        )
        return ops.sum(ops.cast(out, "float32"))

    output = memory_efficient_attention(
        *inputs, 1.0, causal=True, query_chunk_size=8, key_chunk_size=16
    )
    assert keras.backend.standardize_dtype(output.dtype) == dtype
    for grad in gradients_of(loss, inputs):
        assert np.all(np.isfinite(np.asarray(grad, np.float32)))
    # Scores with std ~32: a softmax in the input dtype would overflow.
    rounded = [to_np(ops.cast(x, "float32")) for x in inputs]
    expected = np_attention(*rounded, 1.0, np.tril(np.ones((20, 24), bool)))
    np.testing.assert_allclose(
        to_np(ops.cast(output, "float32")), expected, atol=0.02
    )


# ------------------------------------------- torch against TensorFlow
TORCH_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np, keras, torch
    import keras_attention
    assert keras.backend.backend() == "torch"
    model = keras.saving.load_model(sys.argv[1])
    data = np.load(sys.argv[2])
    tokens, targets, weight = data["tokens"], data["targets"], data["weight"]
    logits = model(tokens)
    loss = keras.ops.sum(logits * keras.ops.convert_to_tensor(data["upstream"]))
    grads = torch.autograd.grad(loss, [v.value for v in model.trainable_weights])
    out = {"logits": keras.ops.convert_to_numpy(logits)}
    for i, g in enumerate(grads):
        out[f"grad_{i}"] = keras.ops.convert_to_numpy(g)
    np.savez(sys.argv[3], **out)
    """
)
# The probe of the same model on another backend: eager and compiled, the
# numbers `_probe_numbers` keeps, as JSON on the last line.
PROBE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np, keras
    import keras_attention
    from keras_attention.diagnostics import diagnostics_probe
    from keras_attention.diagnostics import probe_diagnostics
    assert keras.backend.backend() == sys.argv[3]
    model = keras.saving.load_model(sys.argv[1])
    data = np.load(sys.argv[2])
    batch = data["tokens"], data["targets"], data["weight"]
    results = {"eager": probe_diagnostics(model, *batch),
               "compiled": diagnostics_probe(model)(*batch)}
    print(json.dumps({kind: {"loss": result["loss"],
                             "summary": result["summary"],
                             "layers": {name: {key: float(np.mean(value))
                                               for key, value in stats.items()
                                               if key not in ("weights",
                                                              "per_example")}
                                        for name, stats
                                        in result["layers"].items()}}
                      for kind, result in results.items()}))
    """
)


def _tiny_model():
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(13, 16, mask_zero=True)(tokens)
    x = ScaledDotProductAttention(
        key_dim=8, num_heads=2, output_dim=16, scale="learned", qk_norm=True,
        use_bias=True, bias_initializer="random_normal", name="attention_0",
    )(x, use_causal_mask=True)
    x = ScaledDotProductAttention(key_dim=4, num_heads=2, name="attention_1")(x)
    return keras.Model(tokens, keras.layers.Dense(13)(x))


def _saved_tiny_model(tmp_path):
    """`(model, tokens, targets, weight, upstream)`, the model saved as
    tmp_path/model.keras and the arrays as tmp_path/data.npz."""
    keras.utils.set_random_seed(3)
    model = _tiny_model()
    tokens = RNG.integers(1, 13, size=(3, 9)).astype("int32")
    tokens[1, 6:] = 0
    targets = RNG.integers(0, 13, size=(3, 9)).astype("int32")
    weight = (tokens != 0).astype("float32")
    upstream = randn(3, 9, 13)
    model.save(tmp_path / "model.keras")
    np.savez(tmp_path / "data.npz", tokens=tokens, targets=targets,
             weight=weight, upstream=upstream)
    return model, tokens, targets, weight, upstream


def _run_script(script, backend, *arguments):
    """The last line of what `script` prints, under KERAS_BACKEND=`backend`."""
    result = subprocess.run(
        [sys.executable, "-c", script, *map(str, arguments)],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
        env={**os.environ, "KERAS_BACKEND": backend, "JAX_PLATFORMS": "cpu",
             "PYTHONPATH": os.pathsep.join(
                 filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")]))},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return (result.stdout.strip().splitlines() or [""])[-1]


@from_outer_run
def test_torch_matches_tensorflow(tmp_path):
    """A `.keras` file saved on TensorFlow, loaded on torch: the same logits
    and gradients of every weight, float32 within 1e-5."""
    pytest.importorskip("torch")
    import tensorflow as tf

    model, tokens, _, _, upstream = _saved_tiny_model(tmp_path)
    with tf.GradientTape() as tape:
        logits = model(tokens)
        loss = tf.reduce_sum(logits * upstream)
    grads = tape.gradient(loss, model.trainable_weights)
    _run_script(TORCH_SCRIPT, "torch", tmp_path / "model.keras",
                tmp_path / "data.npz", tmp_path / "out.npz")
    out = np.load(tmp_path / "out.npz")
    np.testing.assert_allclose(out["logits"], to_np(logits), atol=1e-5)
    for i, (variable, grad) in enumerate(zip(model.trainable_weights, grads)):
        np.testing.assert_allclose(
            out[f"grad_{i}"], to_np(grad), rtol=1e-5, atol=1e-5,
            err_msg=variable.path,
        )


@from_outer_run
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_probe_matches_tensorflow(tmp_path, backend):
    """The diagnostics probe of a `.keras` file saved on TensorFlow (two
    layers: learned scale, qk-norm, biases, an output projection, causal
    and padding masks), eager and compiled on `backend`: the same loss,
    per-layer gradient norms of W_Q, W_K, W_V and the scores, and
    statistics as the TensorFlow probe, float32 within 1e-5."""
    pytest.importorskip(backend)
    from keras_attention.diagnostics import probe_diagnostics

    model, tokens, targets, weight, _ = _saved_tiny_model(tmp_path)
    expected = probe_diagnostics(model, tokens, targets, weight)
    found = json.loads(_run_script(
        PROBE_SCRIPT, backend, tmp_path / "model.keras",
        tmp_path / "data.npz", backend,
    ))
    for kind, result in found.items():
        assert result["loss"] == pytest.approx(expected["loss"], rel=1e-5)
        assert list(result["summary"]) == list(expected["summary"])
        for key, value in expected["summary"].items():
            np.testing.assert_allclose(result["summary"][key], value,
                                       rtol=1e-5, atol=1e-6,
                                       err_msg=f"{kind} {key}")
        assert list(result["layers"]) == list(expected["layers"])
        for name, stats in expected["layers"].items():
            for key, value in stats.items():
                if key in ("weights", "per_example"):
                    continue
                if key.startswith("grad_norm"):
                    assert value > 0, (name, key)
                np.testing.assert_allclose(
                    result["layers"][name][key], np.mean(value), rtol=1e-5,
                    atol=1e-7, err_msg=f"{kind} {name} {key}",
                )


# ------------------------------------------------------ the child runs
# One child pytest per backend runs every case this run collected that is
# marked `@pytest.mark.backends(...)` for it (tests/conftest.py): one case of
# every behaviour of the layer (values and weights, masks, rows without
# keys, gradients, bad arguments, mixed precision, dropout, qk-norm, Keras
# masks, the scale modes, the memory-efficient function), the Keras harness
# (which saves and loads a `.keras` file), the diagnostics probe, Keras's own
# attention layers recorded, the training pipeline and `fit` with the
# monitor. JAX compiles every new shape of every eager op and every fit()
# step, so its marked cases are the fewest; the chunked function on JAX has
# its own default test in test_memory_efficient.py. One process per backend
# pays Keras's and the backend's start once (about 10 s each on 2 cores).
MODULES = ["test_layer.py", "test_backends.py", "test_layer_harness.py",
           "test_probe.py", "test_ssmax.py", "test_recording_keras.py"]


@pytest.fixture(scope="module")
def marked_children(request):
    """Both backends' child runs, started at once (this process only waits
    on them, and each keeps about one core busy: side by side they take
    the longer one's time, not the sum); None for a backend with no marked
    case in this run or not installed."""
    children = {}
    for backend in OTHER_BACKENDS:
        modules = marked_modules(request.config, backend)
        children[backend] = start_pytest_under(
            backend, modules, markers=f"{backend} and not slow"
        ) if modules else None
    yield children
    for child in children.values():
        if child and child.poll() is None:
            child.kill()
            child.communicate()


@from_outer_run
@pytest.mark.parametrize("backend", OTHER_BACKENDS)
def test_marked_cases_pass_under(backend, request, marked_children):
    if not marked_modules(request.config, backend):
        pytest.skip(f"this run collected no case marked for {backend}")
    finish_pytest(backend, marked_children[backend])


@pytest.mark.slow
@from_outer_run
@pytest.mark.parametrize("backend", OTHER_BACKENDS)
def test_all_cases_pass_under(backend):
    run_pytest_under(backend, MODULES)
