"""The layer on a GPU, on Keras's JAX and torch backends: correctness, speed
against the backend's native fused attention, and a short training run.

    python scripts/gpu_layer_check.py                   # both backends (a GPU)
    python scripts/gpu_layer_check.py --smoke           # tiny shapes, a CPU, < 1 min
    python scripts/gpu_layer_check.py --backends torch --output OUT.json

Each backend runs in its own process (Keras fixes its backend at import).
TensorFlow is not needed: the library's layer, functional core and models
import without it, and the training data (the `reverse` task: position i
reads position T-1-i) is drawn here with numpy, so the check runs on a
machine that has only JAX or PyTorch.

Per backend it measures:
- correctness: the layer's output and gradients (input and weights) on every
  implementation, float32 and bfloat16, padding and causal masks, against a
  float32 explicit-path layer with the same weights on the same device;
- forward + backward time of one self-attention layer (Q, K, V and output
  projections included in every peer) for ours (each implementation),
  `keras.layers.MultiHeadAttention`, and the same projections around the
  backend's native fused attention (`torch.nn.functional.
  scaled_dot_product_attention`, `jax.nn.dot_product_attention`, cuDNN where
  it is available), as TFLOP/s and a fraction of the measured bf16 matmul
  peak, with peak device memory;
- a short `fit` of the toy sequence model on `reverse` at length 512:
  tokens/s, model FLOPs utilization, accuracy reached.

It writes one JSON (`--output`, default `scripts/results/gpu_layer_check.json`)
and the printed table beside it (`.txt`), and exits 1 if any backend failed,
stopped early or had a correctness case out of tolerance.

On a GPU machine with JAX and PyTorch but no package index, carry Keras as
wheels built for its Python, e.g. here:
`pip download keras==3.15.1 --python-version 3.12 --only-binary=:all: -d wheels`,
there: `pip install --no-index --find-links wheels keras`, then run this
script from the checkout (no install needed).
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

# The checkout runs as it is, installed or not (a GPU machine may only have
# the source tree and the wheels it carries).
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

BACKENDS = ("jax", "torch")
IMPLEMENTATIONS = ("explicit", "fused", "memory_efficient")
FULL = dict(seq_lens=(1024, 4096, 16384), heads=(8, 16), key_dims=(64, 128),
            tokens=32768, repeats=10, fit_steps=300, fit_len=512, matmul=8192)
SMOKE = dict(seq_lens=(64,), heads=(2,), key_dims=(16,), tokens=256,
             repeats=2, fit_steps=3, fit_len=32, matmul=256)
# bfloat16 keeps 8 bits of mantissa: a relative error of a few 1e-3 per
# operation, compounded over two matmuls and a softmax.
TOLERANCE = {"float32": 2e-4, "bfloat16": 5e-2}


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="gpu_layer_check.py", description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated subset of jax,torch")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes that run on a CPU in seconds")
    parser.add_argument("--output", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results",
        "gpu_layer_check.json"))
    # Two backends in one call of at most 8 minutes, with room for start-up.
    parser.add_argument("--timeout", type=float, default=210.0,
                        help="seconds per backend (default: 210)")
    parser.add_argument("--worker", choices=BACKENDS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or any(b not in BACKENDS for b in backends):
        parser.exit(2, f"gpu_layer_check.py: error: --backends must be a subset "
                       f"of jax,torch; received {args.backends!r}\n")
    args.backends = backends
    return args


# ------------------------------------------------------------- the worker
def worker(backend, sizes, output):
    """Runs every measurement under `backend` and writes them to `output`."""
    os.environ["KERAS_BACKEND"] = backend
    import keras
    import numpy as np

    import keras_attention
    from _gpu_kit import BackendKit
    from keras_attention.models import build_sequence_model

    kit = BackendKit(backend)
    result = {"backend": backend, "keras": keras.__version__,
              "device": kit.device_name(), "correctness": [], "speed": [],
              "fit": None}
    result["bf16_peak_tflops"] = kit.matmul_peak(sizes["matmul"])
    rng = np.random.default_rng(0)

    def save():
        # After every case: a worker stopped by the time limit still leaves
        # what it measured.
        with open(output + ".tmp", "w") as handle:
            json.dump(result, handle, indent=2)
        os.replace(output + ".tmp", output)

    def layer(kind, heads, key_dim, dtype, implementation="auto"):
        if kind == "mha":
            return keras.layers.MultiHeadAttention(heads, key_dim, dtype=dtype)
        return keras_attention.ScaledDotProductAttention(
            key_dim=key_dim, num_heads=heads, implementation=implementation,
            dtype=dtype)

    # ---- correctness against a float32 explicit layer with the same weights.
    batch, length, heads, key_dim = 2, sizes["seq_lens"][0], 2, 16
    x = rng.standard_normal((batch, length, heads * key_dim)).astype("float32")
    valid = np.ones((batch, length), bool)
    valid[1, length * 3 // 4:] = False
    cotangent = rng.standard_normal(x.shape).astype("float32")
    masks = {"padding": dict(query_mask=valid, value_mask=valid),
             "causal": dict(use_causal_mask=True)}
    for mask_name, mask in masks.items():
        reference = layer("ours", heads, key_dim, "float32", "explicit")
        reference(x[:1])
        want = kit.forward_backward(reference, x, mask, cotangent)
        for implementation in IMPLEMENTATIONS:
            for dtype in ("float32", "bfloat16"):
                policy = "float32" if dtype == "float32" else "mixed_bfloat16"
                case = dict(implementation=implementation, dtype=dtype,
                            mask=mask_name)
                try:
                    candidate = layer("ours", heads, key_dim, policy,
                                      implementation)
                    candidate(x[:1])
                    candidate.set_weights(reference.get_weights())
                    got = kit.forward_backward(candidate, x, mask, cotangent)
                except Exception as error:  # noqa: BLE001 - a path missing
                    case.update(ok=False, max_relative_error=None,
                                error=_error_text(error))
                else:
                    error = max(
                        float(np.max(np.abs(g - w)) / (np.max(np.abs(w))
                                                       + 1e-12))
                        for g, w in zip(got, want))
                    case.update(max_relative_error=error,
                                ok=error <= TOLERANCE[dtype])
                result["correctness"].append(case)
                save()

    # ---- speed: forward + backward of one self-attention layer.
    for length in sizes["seq_lens"]:
        for heads in sizes["heads"]:
            for key_dim in sizes["key_dims"]:
                batch = max(1, sizes["tokens"] // length)
                width = heads * key_dim
                x = rng.standard_normal((batch, length, width)).astype(
                    "float32")
                flops = 3 * (4 * 2 * batch * length * width * width
                             + 4 * batch * heads * length * length * key_dim)
                peers = {f"ours_{i}": ("ours", i) for i in IMPLEMENTATIONS}
                peers["mha"] = ("mha", None)
                for name, (kind, implementation) in peers.items():
                    case = dict(seq_len=length, heads=heads, key_dim=key_dim,
                                batch=batch, peer=name)
                    try:
                        model = layer(kind, heads, key_dim, "mixed_bfloat16",
                                      implementation or "auto")
                        seconds, peak = kit.time_layer(
                            model, kind == "ours", x, sizes["repeats"])
                    except Exception as error:  # noqa: BLE001 - OOM, no kernel
                        case["error"] = _error_text(error)
                    else:
                        case.update(_rates(seconds, flops, peak,
                                           result["bf16_peak_tflops"]))
                    result["speed"].append(case)
                    save()
                    keras.backend.clear_session()
                case = dict(seq_len=length, heads=heads, key_dim=key_dim,
                            batch=batch, peer="native")
                try:
                    seconds, peak = kit.time_native(x, heads, key_dim,
                                                    sizes["repeats"])
                    case.update(_rates(seconds, flops, peak,
                                       result["bf16_peak_tflops"]))
                except Exception as error:  # noqa: BLE001
                    case["error"] = _error_text(error)
                result["speed"].append(case)
                save()

    # ---- a short fit on reverse.
    length, vocab, batch = sizes["fit_len"], 16, 32
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = build_sequence_model(vocab_size=vocab, seq_len=length,
                                 num_classes=vocab, d_model=128,
                                 num_layers=2, key_dim=32, num_heads=4)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True),
                  metrics=["accuracy"])
    tokens, targets = _reverse_data(rng, sizes["fit_steps"] * batch, length,
                                    vocab)
    model.fit(tokens[:batch], targets[:batch], batch_size=batch, verbose=0)
    started = time.perf_counter()
    model.fit(tokens, targets, batch_size=batch, epochs=1, verbose=0)
    seconds = time.perf_counter() - started
    heldout_tokens, heldout_targets = _reverse_data(rng, 256, length, vocab)
    _, accuracy = model.evaluate(heldout_tokens, heldout_targets, verbose=0)
    params = model.count_params()
    # 6 FLOPs per parameter per token (forward and backward), plus attention's
    # 12 * layers * T * width per token.
    flops_per_token = 6 * params + 12 * 2 * length * 128
    tokens_per_s = sizes["fit_steps"] * batch * length / seconds
    result["fit"] = dict(
        task="reverse", seq_len=length, batch=batch, steps=sizes["fit_steps"],
        tokens_per_s=tokens_per_s, accuracy=float(accuracy),
        mfu=tokens_per_s * flops_per_token
        / (result["bf16_peak_tflops"] * 1e12))
    save()


def _error_text(error):
    """An exception as one short line (Keras wraps messages over lines)."""
    return " ".join(f"{type(error).__name__}: {error}".split())[:200]


def _rates(seconds, flops, peak_bytes, peak_tflops):
    tflops = flops / seconds / 1e12
    return dict(ms=seconds * 1e3, tflops=tflops,
                peak_fraction=tflops / peak_tflops,
                peak_memory_mib=None if peak_bytes is None
                else peak_bytes / 2**20)


def _reverse_data(rng, count, length, vocab):
    tokens = rng.integers(1, vocab, size=(count, length), dtype="int32")
    return tokens, tokens[:, ::-1].copy()


# ------------------------------------------------------------- the parent
def _table(results):
    lines = []
    for backend, result in results["backends"].items():
        if "error" in result:
            lines.append(f"{backend}: failed: {result['error']}")
            continue
        bad = [c for c in result["correctness"] if not c["ok"]]
        def describe(case):
            error = case["max_relative_error"]
            return case.get("error") or f"{error:.2e}"

        lines.append(
            f"{backend} on {result['device']}: bf16 matmul peak "
            f"{result['bf16_peak_tflops']:.1f} TFLOP/s; correctness "
            f"{len(result['correctness']) - len(bad)}/"
            f"{len(result['correctness'])} within tolerance"
            + "".join(f"\n  FAIL {c['implementation']} {c['dtype']} "
                      f"{c['mask']}: {describe(c)}" for c in bad))
        lines.append(f"  {'T':>6} {'H':>3} {'d_k':>4} {'B':>3} {'peer':<22}"
                     f"{'ms':>9} {'TFLOP/s':>8} {'peak':>6} {'MiB':>8} "
                     f"{'/native':>8}")
        native = {(c["seq_len"], c["heads"], c["key_dim"]): c.get("ms")
                  for c in result["speed"] if c["peer"] == "native"}
        for case in result["speed"]:
            key = (case["seq_len"], case["heads"], case["key_dim"])
            head = (f"  {case['seq_len']:>6} {case['heads']:>3} "
                    f"{case['key_dim']:>4} {case['batch']:>3} "
                    f"{case['peer']:<22}")
            if "error" in case:
                lines.append(head + " error: " + case["error"][:60])
                continue
            memory = case["peak_memory_mib"]
            speed = (native[key] / case["ms"]) if native.get(key) else None
            lines.append(
                head + f"{case['ms']:>9.2f} {case['tflops']:>8.1f} "
                f"{case['peak_fraction']:>6.2f} "
                f"{'-' if memory is None else f'{memory:.0f}':>8} "
                f"{'-' if speed is None else f'{speed:.2f}x':>8}")
        fit = result["fit"]
        if result.get("stopped"):
            lines.append(f"  stopped: {result['stopped']}")
        if fit is None:
            continue
        lines.append(
            f"  fit reverse T={fit['seq_len']}: {fit['tokens_per_s']:.0f} "
            f"tokens/s, MFU {fit['mfu']:.3f}, accuracy {fit['accuracy']:.3f} "
            f"after {fit['steps']} steps")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sizes = SMOKE if args.smoke else FULL
    if args.worker:
        worker(args.worker, sizes, args.output)
        return 0
    results = {"date": datetime.date.today().isoformat(),
               "smoke": args.smoke, "sizes": sizes, "backends": {}}
    for backend in args.backends:
        with tempfile.TemporaryDirectory() as scratch:
            part = os.path.join(scratch, "part.json")
            command = [sys.executable, os.path.abspath(__file__), "--worker",
                       backend, "--output", part] + (
                ["--smoke"] if args.smoke else [])
            env = dict(os.environ, KERAS_BACKEND=backend)
            try:
                done = subprocess.run(command, env=env, capture_output=True,
                                      text=True, timeout=args.timeout)
                problem = None if done.returncode == 0 else (
                    done.stderr.strip().splitlines()[-1:] or ["no output"]
                )[0][:300]
            except subprocess.TimeoutExpired:
                problem = f"timed out after {args.timeout:.0f} s"
            if not os.path.exists(part):
                results["backends"][backend] = {"error": problem or "no output"}
                continue
            with open(part) as handle:
                results["backends"][backend] = json.load(handle)
            if problem:  # what was measured before it stopped is kept
                results["backends"][backend]["stopped"] = problem
    table = _table(results)
    print(table)
    # The library's writer imports Keras, whose backend must be one this
    # machine has: one of those just measured.
    os.environ.setdefault("KERAS_BACKEND", args.backends[0])
    from pipelines.common import write_json_atomic, write_text_atomic

    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    write_json_atomic(args.output, results)
    write_text_atomic(os.path.splitext(args.output)[0] + ".txt", table + "\n")
    failed = [b for b, r in results["backends"].items()
              if "error" in r or "stopped" in r
              or not all(c["ok"] for c in r["correctness"])]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
