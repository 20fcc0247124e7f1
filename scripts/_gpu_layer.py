"""The layer stage of `gpu_check.py`, on Keras's JAX backend, in its own
process (JAX takes most of the accelerator's memory for the process that
uses it, so the parent, which runs the pipelines next, never does).

    python scripts/_gpu_layer.py --json RESULTS.json [--smoke]
        [--deadline EPOCH_S] [--arrays CASES.npz]

Writes the `layer` section of the results JSON after every case:

- `peak`: a bf16 `size^3` matrix product on random data (the measured peak
  that every fraction of this check refers to);
- `correctness`: the layer's output and its gradients (input and every
  weight) on every path (`explicit`, `explicit_weights` with the weights
  returned, `fused`, `memory_efficient`), in float32 and under
  `mixed_bfloat16`, with a padding mask and with a causal one, against a
  float32 explicit layer of the same weights; the length is no multiple of
  the memory-efficient path's 512-row chunks, so ragged blocks are checked;
- `speed`: forward + backward of one self-attention layer (Q, K, V and
  output projections in every peer) at each length: ours on each path,
  `keras.layers.MultiHeadAttention`, and the same projections around
  `jax.nn.dot_product_attention` (cuDNN on a GPU, XLA elsewhere), in bf16;
  TFLOP/s, the fraction of the peak, XLA's compiled footprint (arguments,
  outputs and temporaries) and the device's peak bytes so far where JAX
  reports it.

`--arrays` also saves the correctness cases' inputs (`x`, `cotangent`,
`valid`), each mask's weights (`MASK/weight/I`, named in
`MASK/weight_name/I`) and each case's output, input gradient and weight
gradients (`PATH/DTYPE/MASK/I`, in that order), for a check against
another implementation. Past `--deadline` no new
case starts and the section says it was cut.
"""

import argparse
import os
import sys
import time

os.environ["KERAS_BACKEND"] = "jax"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _gpu_results  # noqa: E402  (sets sys.path for the library)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_attention  # noqa: E402

PATHS = ("explicit", "explicit_weights", "fused", "memory_efficient")
# bfloat16 keeps 8 bits of mantissa: a relative error of a few 1e-3 per
# rounding, compounded over the projections, two products and a softmax.
TOLERANCE = {"float32": 2e-4, "bfloat16": 5e-2}
# The long sequences first: the goal (>= 0.9x the native fused attention)
# is set at >= 4k tokens, and a deadline cuts the last cases.
FULL = dict(check_len=1100, seq_lens=(4096, 16384, 1024), heads=16,
            key_dim=64, tokens=32768, matmul=8192, case_s=0.5)
SMOKE = dict(check_len=600, seq_lens=(64,), heads=2, key_dim=8,
             tokens=256, matmul=256, case_s=0.05)
# The correctness cases' shape (a few MB of arrays at 1100 tokens).
CHECK_BATCH, CHECK_HEADS, CHECK_KEY_DIM = 2, 2, 16


def timed(function, args, seconds):
    """Compiles `jax.jit(function)` for `args` and times it: the compile
    seconds, seconds per call (repeated to fill about `seconds`, after a
    warm-up call), and XLA's footprint in bytes (None where not reported)."""
    started = time.perf_counter()
    compiled = jax.jit(function).lower(*args).compile()
    compile_s = time.perf_counter() - started
    try:
        memory = compiled.memory_analysis()
        footprint = (memory.argument_size_in_bytes
                     + memory.output_size_in_bytes
                     + memory.temp_size_in_bytes
                     - memory.alias_size_in_bytes)
    except Exception:  # noqa: BLE001 - a backend without the analysis
        footprint = None
    jax.block_until_ready(compiled(*args))
    started = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    once = time.perf_counter() - started
    repeats = int(max(3, min(50, seconds / max(once, 1e-9))))
    started = time.perf_counter()
    for _ in range(repeats):
        out = compiled(*args)
    jax.block_until_ready(out)
    return compile_s, (time.perf_counter() - started) / repeats, footprint


def device_peak_mib():
    """The device's peak bytes in use so far (MiB), where JAX reports it."""
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return None if peak is None else peak / 2**20


def matmul_peak(size, seconds):
    a, b = (jax.random.normal(jax.random.PRNGKey(i), (size, size),
                              jnp.bfloat16) for i in (1, 2))
    _, per_call, _ = timed(lambda a, b: a @ b, (a, b), seconds)
    return dict(size=size, ms=1e3 * per_call,
                tflops=2 * size**3 / per_call / 1e12)


def ours(heads, key_dim, width, policy, path):
    implementation = "explicit" if path == "explicit_weights" else path
    return keras_attention.ScaledDotProductAttention(
        key_dim=key_dim, num_heads=heads, output_dim=width,
        implementation=implementation, dtype=policy)


def _loss_of(layer, cotangent, **call):
    """`(weights, inputs) -> (sum(output * cotangent), output)`, the layer
    called with `weights` for its trainable variables (first output only:
    `explicit_weights` returns two).

    Through `__call__` in a `StatelessScope`, not `stateless_call`: that one
    runs `call` directly, which skips the dtype policy's input cast and
    autocast, so a `mixed_bfloat16` layer would compute in float32.
    """
    variables = list(layer.trainable_variables)

    def loss(weights, inputs):
        with keras.StatelessScope(state_mapping=list(zip(variables, weights))):
            out = layer(*inputs, **call)
        out = out[0] if isinstance(out, (tuple, list)) else out
        value = out.astype("float32")
        if cotangent is not None:
            value = value * cotangent
        return jnp.sum(value), out

    return loss


def forward_backward(layer, x, call, cotangent):
    """The output, the input's gradient and the weights' gradients of
    `sum(layer(x) * cotangent)`, as float32 numpy arrays."""
    loss = _loss_of(layer, cotangent, **call)
    trainable = [v.value for v in layer.trainable_variables]
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
    (_, out), (dweights, (dx,)) = step(trainable, (jnp.asarray(x),))
    return [np.asarray(a, "float32") for a in (out, dx, *dweights)]


def correctness(section, results, sizes, deadline, arrays):
    rng = np.random.default_rng(0)
    batch, length = CHECK_BATCH, sizes["check_len"]
    heads, key_dim = CHECK_HEADS, CHECK_KEY_DIM
    width = heads * key_dim
    x = rng.standard_normal((batch, length, width)).astype("float32")
    cotangent = rng.standard_normal(x.shape).astype("float32")
    valid = np.ones((batch, length), bool)
    valid[1, length * 3 // 4:] = False
    masks = {"padding": dict(query_mask=valid, value_mask=valid),
             "causal": dict(use_causal_mask=True)}
    if arrays is not None:
        arrays.update(x=x, cotangent=cotangent, valid=valid)
    for mask_name, mask in masks.items():
        reference = ours(heads, key_dim, width, "float32", "explicit")
        reference(x[:1])
        want = forward_backward(reference, x, mask, cotangent)
        if arrays is not None:  # the weights, in the gradients' order
            for i, weight in enumerate(reference.trainable_variables):
                arrays[f"{mask_name}/weight/{i}"] = np.asarray(weight.value)
                arrays[f"{mask_name}/weight_name/{i}"] = np.array(weight.name)
        for path in PATHS:
            for dtype in ("float32", "bfloat16"):
                if time.time() > deadline:
                    return False
                case = dict(path=path, dtype=dtype, mask=mask_name,
                            seq_len=length, tolerance=TOLERANCE[dtype])
                policy = "float32" if dtype == "float32" else "mixed_bfloat16"
                call = dict(mask, return_attention_scores=True) \
                    if path == "explicit_weights" else mask
                try:
                    layer = ours(heads, key_dim, width, policy, path)
                    layer(x[:1])
                    layer.set_weights(reference.get_weights())
                    got = forward_backward(layer, x, call, cotangent)
                except Exception as error:  # noqa: BLE001 - a path missing
                    case.update(ok=False, max_relative_error=None,
                                error=_one_line(error))
                else:
                    case["max_relative_error"] = max(
                        float(np.max(np.abs(g - w)) / (np.max(np.abs(w))
                                                       + 1e-12))
                        for g, w in zip(got, want))
                    case["ok"] = bool(np.all([np.isfinite(g).all()
                                              for g in got])
                                      and case["max_relative_error"]
                                      <= TOLERANCE[dtype])
                    if arrays is not None:
                        for i, value in enumerate(got):
                            arrays[f"{path}/{dtype}/{mask_name}/{i}"] = value
                section["correctness"].append(case)
                results.save()
    return True


def native_loss(heads, key_dim, on_gpu):
    """The projections around `jax.nn.dot_product_attention`, in bf16."""
    implementation = "cudnn" if on_gpu else "xla"

    def loss(weights, inputs):
        (x,) = inputs
        batch, length, width = x.shape
        q, k, v = (jnp.reshape(x @ kernel, (batch, length, heads, key_dim))
                   for kernel in weights[:3])
        out = jax.nn.dot_product_attention(q, k, v,
                                           implementation=implementation)
        out = jnp.reshape(out, (batch, length, width)) @ weights[3]
        return jnp.sum(out.astype("float32"))

    return loss, implementation


def speed(section, results, sizes, deadline, peak_tflops):
    rng = np.random.default_rng(1)
    heads, key_dim = sizes["heads"], sizes["key_dim"]
    width = heads * key_dim
    on_gpu = jax.default_backend() == "gpu"
    for length in sizes["seq_lens"]:
        batch = max(1, sizes["tokens"] // length)
        x = jnp.asarray(rng.standard_normal((batch, length, width)),
                        jnp.bfloat16)
        # Forward: 4 projections and two (T x S) products; backward twice
        # the forward.
        flops = 3 * (8 * batch * length * width**2
                     + 4 * batch * heads * length**2 * key_dim)
        peers = ["native", "ours_explicit", "ours_fused",
                 "ours_memory_efficient", "mha"]
        for peer in peers:
            if time.time() > deadline:
                return False
            case = dict(seq_len=length, batch=batch, heads=heads,
                        key_dim=key_dim, peer=peer, flops=flops)
            try:
                if peer == "native":
                    loss, case["implementation"] = native_loss(
                        heads, key_dim, on_gpu)
                    weights = [jnp.asarray(rng.standard_normal((width, width))
                                           / np.sqrt(width), jnp.bfloat16)
                               for _ in range(4)]
                else:
                    if peer == "mha":
                        layer = keras.layers.MultiHeadAttention(
                            heads, key_dim, dtype="mixed_bfloat16")
                        layer(x[:1], x[:1])
                    else:
                        layer = ours(heads, key_dim, width, "mixed_bfloat16",
                                     peer[len("ours_"):])
                        layer(x[:1])
                    plain = _loss_of(layer, None)
                    arguments = (lambda x: (x, x)) if peer == "mha" else (
                        lambda x: (x,))

                    def loss(weights, inputs, plain=plain, arguments=arguments):
                        return plain(weights, arguments(inputs[0]))[0]
                    weights = [v.value for v in layer.trainable_variables]
                gradient = jax.grad(loss, argnums=(0, 1))
                compile_s, seconds, footprint = timed(
                    gradient, (weights, (x,)), sizes["case_s"])
            except Exception as error:  # noqa: BLE001 - no kernel, OOM
                case["error"] = _one_line(error)
            else:
                tflops = flops / seconds / 1e12
                case.update(
                    ms=1e3 * seconds, compile_s=compile_s, tflops=tflops,
                    peak_fraction=tflops / peak_tflops,
                    xla_mib=None if footprint is None else footprint / 2**20,
                    device_peak_mib=device_peak_mib())
            section["speed"].append(case)
            results.save()
            keras.backend.clear_session()
    return True


def _one_line(error):
    """An exception as one short line (XLA's messages run over lines)."""
    return " ".join(f"{type(error).__name__}: {error}".split())[:300]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="_gpu_layer.py")
    parser.add_argument("--json", required=True)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--deadline", type=float, default=float("inf"))
    parser.add_argument("--arrays")
    args = parser.parse_args(argv)
    sizes = SMOKE if args.smoke else FULL
    results = _gpu_results.Results(args.json).load()
    section = results.stage("layer")
    section.clear()
    device = jax.devices()[0]
    section.update(
        status="running", sizes=sizes, correctness=[], speed=[],
        device=f"{device.platform}: {device.device_kind}",
        versions={"jax": jax.__version__, "keras": keras.__version__,
                  "python": sys.version.split()[0]})
    started = time.time()
    section["peak"] = matmul_peak(sizes["matmul"], 4 * sizes["case_s"])
    results.save()
    arrays = {} if args.arrays else None
    whole = correctness(section, results, sizes, args.deadline, arrays)
    if arrays is not None:
        np.savez(args.arrays, **arrays)
    whole = whole and speed(section, results, sizes, args.deadline,
                            section["peak"]["tflops"])
    section["seconds"] = time.time() - started
    section["status"] = "done" if whole else "cut"
    if not whole:
        section["note"] = "the budget ran out; later cases not run"
    section["tensorflow_modules"] = sorted(
        name for name in sys.modules if name.split(".")[0] == "tensorflow")
    results.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
