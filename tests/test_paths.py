"""The layer's path policy (`keras_attention.paths`), with faked devices.

`choose_path` is checked against the table in its module docstring, case
by case; the layer is then run with `device_kind` faked to a GPU and a
TPU, on this CPU, and must take the path the table names and still give
the explicit path's numbers (the reference: the same layer with
`implementation="explicit"`). Runs under TensorFlow, and the marked cases
under JAX and torch.
"""

import numpy as np
import pytest
from keras import ops

from keras_attention import ScaledDotProductAttention
from keras_attention import _layer_utils
from keras_attention import layer as layer_module
from keras_attention import paths

LONG = 4096  # 4096 x 4096 query-key pairs: the threshold


def path(device, backend="tensorflow", length=64, **options):
    return paths.choose_path(device=device, backend=backend,
                             query_length=length, key_length=length,
                             **options)


@pytest.mark.parametrize("device,backend,masked,short,long", [
    ("gpu", "jax", True, "fused", "fused"),
    ("gpu", "tensorflow", True, "fused", "fused"),
    ("gpu", "torch", False, "fused", "fused"),
    ("tpu", "jax", True, "explicit", "memory_efficient"),
    ("cpu", "tensorflow", True, "explicit", "memory_efficient"),
    ("cpu", "jax", False, "explicit", "memory_efficient"),
    ("cpu", "torch", True, "fused", "memory_efficient"),
    ("cpu", "torch", False, "fused", "fused"),
])
def test_auto_follows_the_table(device, backend, masked, short, long):
    assert path(device, backend, masked=masked) == short
    assert path(device, backend, LONG, masked=masked) == long
    # Just under the threshold is still short.
    assert paths.choose_path(device=device, backend=backend,
                             query_length=LONG, key_length=LONG - 1,
                             masked=masked) == short


@pytest.mark.parametrize("device", paths.DEVICE_KINDS)
def test_weights_dropout_and_the_monitor_materialise_everywhere(device):
    for length in (64, LONG):
        assert path(device, length=length,
                    needs_weights=True) == "explicit_weights"
        assert path(device, length=length, needs_weights=True,
                    implementation="fused") == "explicit_weights"


@pytest.mark.parametrize("device", paths.DEVICE_KINDS)
def test_a_soft_cap_is_never_fused_and_long_ones_are_chunked(device):
    assert path(device, logit_soft_cap=30.0) == "explicit_weights"
    assert path(device, length=LONG,
                logit_soft_cap=30.0) == "memory_efficient"
    assert path(device, length=LONG, logit_soft_cap=30.0,
                implementation="explicit") == "explicit_weights"
    assert path(device, length=LONG, logit_soft_cap=30.0,
                implementation="memory_efficient") == "memory_efficient"


def test_where_the_fused_op_does_not_fit_a_gpu_falls_back():
    # float16: its score product can overflow; values narrower than the
    # queries: JAX's op refuses them.
    for options in ({"float16": True}, {"fused_fits": False}):
        assert path("gpu", **options) == "explicit"
        assert path("gpu", length=LONG, **options) == "memory_efficient"
    assert path("gpu", implementation="fused",
                fused_fits=False) == "explicit"


@pytest.mark.parametrize("implementation", [
    "explicit", "fused", "memory_efficient"])
@pytest.mark.parametrize("device", paths.DEVICE_KINDS)
def test_a_named_path_is_taken_at_every_length(implementation, device):
    for length in (64, LONG):
        assert path(device, length=length,
                    implementation=implementation) == implementation


def test_unknown_lengths_are_short():
    assert paths.choose_path(device="cpu", backend="jax") == "explicit"
    assert paths.choose_path(device="gpu", backend="jax") == "fused"


def test_a_bad_device_is_refused_naming_it():
    with pytest.raises(ValueError, match="`device`"):
        paths.choose_path(device="npu")


@pytest.mark.parametrize("platform,kind", [
    ("cpu", "cpu"), ("gpu", "gpu"), ("cuda", "gpu"), ("rocm", "gpu"),
    ("tpu", "tpu"), ("METAL", "cpu")])
def test_a_backends_platform_names_its_device_kind(monkeypatch, platform,
                                                   kind):
    # JAX's platform names, through the uncached lookup.
    jax = pytest.importorskip("jax")
    monkeypatch.setattr(jax, "default_backend", lambda: platform)
    assert paths._kind_of.__wrapped__("jax") == kind


@pytest.fixture
def fused_calls(spy):
    """The calls of the fused path, each its keyword arguments."""
    return spy(_layer_utils, "fused_attention")


@pytest.mark.parametrize("mask", ["none", "causal", "padding"])
@pytest.mark.backends("jax", "torch")
def test_the_layer_on_a_faked_gpu_takes_the_fused_op(monkeypatch, mask,
                                                     fused_calls):
    monkeypatch.setattr(paths, "device_kind", lambda: "gpu")
    rng = np.random.default_rng(5)
    query = rng.standard_normal((2, 6, 8)).astype("float32")
    value = rng.standard_normal((2, 9, 8)).astype("float32")
    options = {}
    if mask == "causal":
        options["use_causal_mask"] = True
    elif mask == "padding":
        key_mask = rng.random((2, 9)) < 0.5
        key_mask[0] = False  # rows with no key: zero output
        options = {"value_mask": key_mask, "use_causal_mask": True}
    layer = ScaledDotProductAttention(key_dim=4, num_heads=2,
                                      scale="learned", output_dim=5)
    output = layer(query, value, **options)
    # The causal mask alone goes to the op's own causal mode.
    assert [call.get("causal", False) for call in fused_calls] == [
        mask == "causal"]
    explicit = ScaledDotProductAttention.from_config(
        {**layer.get_config(), "implementation": "explicit"})
    explicit(query, value, **options)
    explicit.set_weights(layer.get_weights())
    np.testing.assert_allclose(ops.convert_to_numpy(output),
                               ops.convert_to_numpy(
                                   explicit(query, value, **options)),
                               atol=1e-5)
    if mask == "padding":
        np.testing.assert_array_equal(ops.convert_to_numpy(output)[0], 0.0)


def test_the_layer_on_a_faked_tpu_chunks_long_sequences(monkeypatch, spy,
                                                        fused_calls):
    monkeypatch.setattr(paths, "device_kind", lambda: "tpu")
    monkeypatch.setattr(paths, "MEMORY_EFFICIENT_THRESHOLD", 16)
    chunked = spy(layer_module, "memory_efficient_attention")
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 5, 8)).astype("float32")
    layer = ScaledDotProductAttention(key_dim=4, num_heads=2)
    layer(x)
    assert chunked and not fused_calls
