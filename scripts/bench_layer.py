"""Forward+backward time of `ScaledDotProductAttention` against Keras peers.

Times one training step (loss = sum(output), gradients with respect to every
trainable weight and to the input) of four self-attention layers that compute
the same function with the same weights:

* `ours`: `keras_attention.ScaledDotProductAttention` with
  `output_dim=width`, once per requested `implementation` (by default the
  `"explicit"` path, which materialises the weights, and the `"fused"` path,
  which calls `keras.ops.dot_product_attention`; `"memory_efficient"` and
  `"auto"` on request);
* `MHA`: `keras.layers.MultiHeadAttention` with the same heads and dims
  (it always projects back to the model width);
* `dpa`: Q/K/V/O projections written by hand as einsums with the same kernel
  shapes around `keras.ops.dot_product_attention`;
* `torch` (when PyTorch is installed, on the TensorFlow backend, whose CPU
  comparison it is): the same step in PyTorch around
  `torch.nn.functional.scaled_dot_product_attention`, eager, on the CPU,
  with the same weights and input (`--threads` sets its threads too).

Each peer gets its own `tf.function` per case (with or without
`jit_compile`), or on `--backend jax` its own `jax.jit` (always compiled; on
a GPU in bf16 `keras.ops.dot_product_attention` is cuDNN's fused kernel).
After the warm-up calls the peers are timed in turn within each repeat, in
an order that rotates from one repeat to the next, so machine noise hits
them alike; the table reports the median of the repeats.

Usage:

    python scripts/bench_layer.py                      # full table
    python scripts/bench_layer.py --seq-lens 128,512   # quick run
    python scripts/bench_layer.py --jit off --heads 8 --repeats 5
    python scripts/bench_layer.py --backend jax --precision mixed_bfloat16
    python scripts/bench_layer.py --threads 1 --clock cpu  # a shared machine

The full default table is about 6 minutes of single-thread CPU work. Ratios
within about 10% of 1 are within the run-to-run noise of a loaded machine.
Bad arguments exit with status 2 and one line on stderr.
"""

import itertools
import os
import platform
import statistics

import _bench  # first: backend, log level, sys.path
from _bench import add_flag
from _bench import keras

import numpy as np

from keras_attention.layer import IMPLEMENTATIONS
from keras_attention.layer import ScaledDotProductAttention
from pipelines.builders import seed_run

PROG = "bench_layer.py"
MASKS = ("none", "causal")
JIT_MODES = {"both": (False, True), "off": (False,), "on": (True,)}
# The peers' agreement with MHA, relative to its largest output: bfloat16's
# 8-bit mantissa, compounded over projections, two products and a softmax.
TOLERANCE = {"float32": 1e-4, "mixed_bfloat16": 5e-2}
# Sequences longer than this get one warm-up call and one timed repeat by
# default: at batch 8 and 8 heads one step at 2048 tokens does about 250
# GFLOP and moves several 1 GiB score-sized tensors (11-15 s of CPU time).
LONG_SEQUENCE = 1024
SHORT_DEFAULTS = {"warmup": 2, "repeats": 5}
LONG_DEFAULTS = {"warmup": 1, "repeats": 1}
# Each timed sample strings together enough calls to last about this long.
SAMPLE_SECONDS = 0.2


def parse_args(argv=None):
    parser = _bench.parser(
        PROG,
        "Forward+backward time of ScaledDotProductAttention against "
        "keras.layers.MultiHeadAttention and hand-projected "
        "keras.ops.dot_product_attention."
    )
    add_flag(parser, "--seq-lens", [128, 512, 2048],
             "comma-separated sequence lengths (default 128,512,2048)",
             _bench.positive_int_list)
    add_flag(parser, "--heads", [1, 8],
             "comma-separated head counts (default 1,8)",
             _bench.positive_int_list)
    add_flag(parser, "--repeats", None,
             f"timed repeats per case; default {SHORT_DEFAULTS['repeats']}, "
             f"or {LONG_DEFAULTS['repeats']} for sequences longer than "
             f"{LONG_SEQUENCE}")
    add_flag(parser, "--warmup", None,
             "untimed calls per peer and case; the first one traces, the "
             f"last one sizes the timed samples; default "
             f"{SHORT_DEFAULTS['warmup']}, or {LONG_DEFAULTS['warmup']} for "
             f"sequences longer than {LONG_SEQUENCE}")
    parser.add_argument("--jit", choices=sorted(JIT_MODES), default="both",
                        help="tf.function jit_compile off, on or both "
                        "(default both; JAX always compiles)")
    parser.add_argument("--backend", choices=("tensorflow", "jax"),
                        help="Keras backend (default: KERAS_BACKEND, else "
                        "tensorflow)")
    parser.add_argument("--precision", choices=tuple(TOLERANCE),
                        default="float32", help="every Keras peer's dtype "
                        "policy (default float32)")
    add_flag(parser, "--batch", 8, "default 8")
    add_flag(parser, "--width", 256,
             "model width D, also the output width (default 256)")
    add_flag(parser, "--key-dim", 64,
             "per-head query/key/value size (default 64)")
    parser.add_argument("--use-bias", choices=("on", "off"), default="off",
                        help="biases on all four projections of every peer "
                        "(default off)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall: elapsed time (default); cpu: CPU time of "
                        "this process, all threads, which other jobs on a "
                        "shared machine disturb far less (best with "
                        "--threads 1)")
    add_flag(parser, "--threads", None,
             "TensorFlow intra-op and inter-op threads (default: TF's choice)")
    add_flag(parser, "--masks", ["none"],
             "comma-separated masks of the call (none, causal; default "
             "none): every peer gets the same",
             lambda flag: _bench.subset_list(flag, MASKS))
    add_flag(parser, "--implementations", ["explicit", "fused"],
             "comma-separated implementations of our layer to time "
             f"({', '.join(IMPLEMENTATIONS)}; default explicit,fused)",
             lambda flag: _bench.subset_list(flag, IMPLEMENTATIONS))
    return parser.parse_args(argv)


def build_peers(args, seq_len, heads, x):
    """The peers of one (seq_len, heads) case with shared weights: a dict
    peer name -> layer, in table order."""
    use_bias = args.use_bias == "on"
    shape = (args.batch, seq_len, args.width)
    ours = {}
    for implementation in args.implementations:
        layer = ScaledDotProductAttention(
            key_dim=args.key_dim, num_heads=heads, output_dim=args.width,
            use_bias=use_bias, implementation=implementation,
            name=f"ours_{implementation}", dtype=args.precision,
        )
        layer.build(shape)
        ours[implementation] = layer
    mha = keras.layers.MultiHeadAttention(
        num_heads=heads, key_dim=args.key_dim, use_bias=use_bias, name="mha",
        dtype=args.precision)
    mha.build(shape, shape)
    dpa = _bench.HandProjectedAttention(
        num_heads=heads, key_dim=args.key_dim, use_bias=use_bias, name="dpa",
        dtype=args.precision)
    dpa.build(shape)
    # Every peer gets the weights of the first of ours.
    weights = [_bench.weights_in_order(layer, use_bias)
               for layer in (*ours.values(), mha, dpa)]
    values = [w.numpy() for w in weights[0]]
    for variables in weights[1:]:
        for variable, value in zip(variables, values):
            variable.assign(value)

    peers = {f"ours-{name}": layer for name, layer in ours.items()}
    peers["mha"] = mha
    peers["dpa"] = dpa
    if keras.backend.backend() != "tensorflow":
        return peers
    try:
        peers["torch"] = _bench.TorchAttention(
            values, heads, args.key_dim, use_bias, x)
    except ImportError:
        _bench.note("torch is not installed: no torch peer")
    return peers


def _call(name, layer, x, mask="none"):
    causal = {"use_causal_mask": True} if mask == "causal" else {}
    return layer(x, x, **causal) if name == "mha" else layer(x, **causal)


def check_peers_agree(peers, x, precision, mask="none"):
    """Checks the peers' outputs on a short prefix of `x` against MHA.

    Exits with an error if a peer computes something else (the timings would
    be meaningless); a peer whose call raises is reported on stderr and
    left out. Returns the peers that ran, in the same order.
    """
    prefix = x[:, : min(x.shape[1], 64)]
    outputs = {}
    for name, layer in peers.items():
        try:
            outputs[name] = np.asarray(keras.ops.convert_to_numpy(
                _call(name, layer, prefix, mask)), "float32")
        except Exception as error:  # Report the peer and time the others.
            _bench.note(f"{name} failed: {type(error).__name__}: "
                        f"{str(error).strip()[:300]}")
    if "mha" not in outputs:
        _bench.fail(PROG, "MultiHeadAttention, the reference peer, failed")
    reference = outputs["mha"]
    tolerance = TOLERANCE[precision] * max(1.0, float(np.max(np.abs(
        reference))))
    for name, output in outputs.items():
        error = float(np.max(np.abs(output - reference)))
        if not error <= tolerance:
            _bench.fail(
                PROG,
                f"peer {name} differs from MultiHeadAttention by {error:.3g} "
                f"(> {tolerance:.3g}); the timings would not compare the same "
                "computation",
            )
    return {name: layer for name, layer in peers.items() if name in outputs}


def make_step(name, layer, jit, mask="none"):
    """One compiled step (a `tf.function`, or on JAX a `jax.jit`): loss =
    sum(output) and all its gradients (the torch peer: its own eager step).
    It returns a scalar that depends on every gradient: fetching it waits
    for the whole backward pass, also on asynchronous devices."""
    if name == "torch":
        return layer.step
    ops = keras.ops
    loss = lambda output: ops.sum(ops.cast(output, "float32"))  # noqa: E731
    if keras.backend.backend() == "jax":
        gradients, values = _bench.jax_loss_and_gradients(
            layer, lambda layer, x: _call(name, layer, x, mask), loss)
        leaves = _bench.jax.tree_util.tree_leaves
        step = _bench.jax.jit(lambda values, x: sum(
            ops.sum(ops.cast(g, "float32"))
            for g in leaves(gradients(values, x)[1])))
        return lambda x: step(values, x)
    tf = _bench.tf
    variables = list(layer.trainable_variables)

    @tf.function(jit_compile=jit, reduce_retracing=False)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            value = loss(_call(name, layer, x, mask))
        gradients = tape.gradient(value, variables + [x])
        return tf.add_n([tf.reduce_sum(tf.cast(g, "float32"))
                         for g in gradients])

    return step


def time_case(peers, x, jit, warmup, repeats, clock=_bench.CLOCKS["wall"],
              mask="none"):
    """Median milliseconds per step of each peer, peers interleaved.

    Each repeat times a few back-to-back calls of every peer (the same count
    for all of them, enough for about `SAMPLE_SECONDS`), so short steps are
    not lost in timer and scheduler noise. A peer whose warm-up raises is
    reported on stderr and gets `None` instead of a time. Returns a dict
    peer name -> median ms (or `None`), and the calls per sample.
    """
    steps = {}
    slowest = 1e-9
    for name, layer in peers.items():
        step = make_step(name, layer, jit, mask)
        try:
            for _ in range(warmup):
                start = clock()
                _wait(step(x))
                elapsed = clock() - start
        except Exception as error:  # Report the peer and time the others.
            message = str(error).strip().splitlines()[-1] if str(error) else ""
            _bench.note(f"{name} failed (jit={'on' if jit else 'off'}): "
                        f"{type(error).__name__}: {message[:300]}")
            continue
        steps[name] = step
        slowest = max(slowest, elapsed)
    calls = max(1, int(SAMPLE_SECONDS / slowest))
    times = {name: [] for name in steps}
    for repeat in range(repeats):
        for name in _bench.round_order(steps, repeat, "rotate"):
            step = steps[name]
            start = clock()
            for _ in range(calls):
                _wait(step(x))
            elapsed = clock() - start
            times[name].append(1000.0 * elapsed / calls)
    return {name: statistics.median(times[name]) if name in times else None
            for name in peers}, calls


def _framework():
    """The backend's version and its devices, as one phrase."""
    if keras.backend.backend() == "jax":
        jax = _bench.jax
        return f"JAX {jax.__version__} on {jax.devices()[0].device_kind}"
    tf = _bench.tf
    return (f"TF {tf.__version__}, GPUs: "
            f"{len(tf.config.list_physical_devices('GPU'))}")


def _torch_version():
    try:
        import torch
    except ImportError:
        return "not installed"
    return torch.__version__


def _wait(result):
    """Fetches a step's result (a tensor, or the torch peer's float), so the
    timing includes the whole backward pass."""
    return np.asarray(result)


def _repeats_per_length(rows):
    seen = {}
    for row in rows:
        seen.setdefault(row["seq_len"], (row["repeats"], row["warmup"]))
    return [(n, r, w) for n, (r, w) in seen.items()]


def _format_ms(value):  # "-": a peer not built here (torch on JAX)
    return value if isinstance(value, str) else (
        "failed" if value is None else f"{value:.2f}")


def _format_ratio(numerator, denominator):
    if not all(isinstance(value, float) for value in (numerator, denominator)):
        return "n/a"
    return f"{numerator / denominator:.3f}"


COLUMNS = ("seq_len", "heads", "jit", "impl", "mask", "ours ms", "MHA ms",
           "dpa ms", "torch ms", "ours/MHA", "ours/dpa", "ours/torch")
WIDTHS = (7, 5, 3, 16, 6, 9, 9, 9, 9, 8, 8, 10)
# The columns before the times.
LABELS = 5


def format_table(rows, header_lines):
    cells = [
        (str(row["seq_len"]), str(row["heads"]), "on" if row["jit"] else "off",
         row["impl"], row["mask"], _format_ms(row["ours"]),
         _format_ms(row["mha"]),
         _format_ms(row["dpa"]), _format_ms(row["torch"]),
         _format_ratio(row["ours"], row["mha"]),
         _format_ratio(row["ours"], row["dpa"]),
         _format_ratio(row["ours"], row["torch"]))
        for row in rows
    ]
    table = _bench.text_table(COLUMNS, cells, WIDTHS)
    return "\n".join(list(header_lines) + [table])


def main(argv=None):
    args = parse_args(argv)
    _bench.setup_tensorflow(PROG, args.threads, ("tensorflow", "jax"))
    on_jax = keras.backend.backend() == "jax"  # compiles every step: "on"
    jit_modes = JIT_MODES["on" if on_jax else args.jit]
    seed_run(0)

    clock = _bench.CLOCKS[args.clock]
    rows = []
    for seq_len in args.seq_lens:
        defaults = (SHORT_DEFAULTS if seq_len <= LONG_SEQUENCE
                    else LONG_DEFAULTS)
        repeats = args.repeats or defaults["repeats"]
        warmup = args.warmup or defaults["warmup"]
        x = keras.ops.convert_to_tensor(np.random.default_rng(
            seq_len).standard_normal((args.batch, seq_len, args.width)),
            "float32")
        for heads, mask in itertools.product(args.heads, args.masks):
            peers = build_peers(args, seq_len, heads, x)
            if mask != "none":  # the torch peer takes no mask
                peers.pop("torch", None)
            peers = check_peers_agree(peers, x, args.precision, mask)
            for jit in jit_modes:
                medians, calls = time_case(peers, x, jit, warmup, repeats,
                                           clock, mask)
                for implementation in args.implementations:
                    row = dict(seq_len=seq_len, heads=heads, jit=jit,
                               impl=implementation, mask=mask,
                               ours=medians.get(f"ours-{implementation}"),
                               mha=medians.get("mha"), dpa=medians.get("dpa"),
                               torch=medians.get("torch", "-"),
                               repeats=repeats, warmup=warmup)
                    rows.append(row)
                    _bench.note(
                        f"seq_len={seq_len} heads={heads} "
                        f"jit={'on' if jit else 'off'} {implementation} "
                        f"mask={mask}: "
                        + ", ".join(f"{peer} {_format_ms(row[peer.lower()])} "
                                    "ms" for peer in ("ours", "MHA", "dpa",
                                                      "torch"))
                        + f" ({repeats} repeats of {calls} calls)")

    header = [
        "Forward+backward step (loss = sum(output); gradients w.r.t. all "
        "trainable weights and the input), self-attention, "
        f"{args.precision}, no dropout.",
        f"batch {args.batch}, width {args.width}, key_dim {args.key_dim}, "
        f"use_bias={args.use_bias == 'on'} on all peers, "
        f"ours output_dim={args.width}.",
        "ours = keras_attention.ScaledDotProductAttention(implementation="
        "impl); MHA = keras.layers.MultiHeadAttention; dpa = hand einsum "
        "projections + keras.ops.dot_product_attention; torch = the same "
        "step in PyTorch around F.scaled_dot_product_attention (eager).",
        "Median of the repeats (each the mean of back-to-back calls lasting "
        f"~{SAMPLE_SECONDS:g} s), peers interleaved, after warm-up calls "
        "(repeats/warm-up per seq_len: "
        + ", ".join(f"{n}: {r}/{w}" for n, r, w in _repeats_per_length(rows))
        + ").",
        f"{_framework()}, Keras {keras.__version__}, "
        f"torch {_torch_version()}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs, TF threads "
        f"{args.threads or 'default'}, clock {args.clock} "
        f"({'process CPU time' if args.clock == 'cpu' else 'elapsed time'}).",
        "",
    ]
    print(format_table(rows, header))


if __name__ == "__main__":
    main()
