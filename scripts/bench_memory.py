"""Peak memory and step time of memory-efficient attention against peers.

Measures one training step (forward, backward and an SGD update of the four
projection kernels) of single-head self-attention, batch 1, model width 64,
key_dim 64, at several sequence lengths, for three computations of the same
function with the same weights:

* `explicit`: Q/K/V/O projections around softmax of the full `(B, H, T, S)`
  score matrix, written with `keras.ops` (what the layer's explicit path does);
* `memory_efficient`: the same projections around
  `keras_attention.memory_efficient.memory_efficient_attention` (chunked keys
  and queries, online softmax, recomputing backward);
* `mha`: `keras.layers.MultiHeadAttention` with the same kernels.

Every case runs in its own subprocess so that its peak resident set size
(`resource.getrusage(RUSAGE_SELF).ru_maxrss`, a high-water mark) is its own.
A `baseline` subprocess only imports TensorFlow and the library and builds
the inputs and weights; the table also shows each case's peak RSS over that
baseline. Each step function is traced and run once (warm-up) before it is
timed; the table reports the median of the timed steps, as wall-clock
seconds and as process CPU seconds (all threads; steadier than wall time on
a shared machine).

Before measuring, a `check` subprocess verifies at a short length that the
three cases agree on the output and on the kernel gradients.

Usage:

    python scripts/bench_memory.py                          # 1k, 4k, 16k
    python scripts/bench_memory.py --seq-lens 1024,4096
    python scripts/bench_memory.py --seq-lens 16384 --cases memory_efficient \\
        --query-chunk-size 1024 --key-chunk-size 1024

Bad arguments exit with status 2 and one line on stderr.
"""

import json
import os
import resource
import statistics
import subprocess
import sys

import _bench  # first: backend, log level, sys.path
from _bench import add_flag
from _bench import keras
from _bench import tf

import numpy as np

from keras_attention.memory_efficient import memory_efficient_attention

PROG = "bench_memory.py"
CASES = ("explicit", "memory_efficient", "mha")
INTERNAL_CASES = ("baseline", "check") + CASES
WIDTH = 64
KEY_DIM = 64
BATCH = 1
HEADS = 1
LEARNING_RATE = 1e-3
# Short sequences get several timed steps; long ones (seconds per step and
# GiB-sized score matrices on a shared machine) get one.
REPEATS_UP_TO_4K = 3
CHECK_SEQ_LEN = 300
# A 16k explicit step takes tens of seconds on two shared cores.
SUBPROCESS_TIMEOUT_S = 3600


def parse_args(argv=None):
    parser = _bench.parser(
        PROG,
        "Peak RSS and training-step time of explicit attention, "
        "memory-efficient attention and keras.layers.MultiHeadAttention."
    )
    add_flag(parser, "--seq-lens", [1024, 4096, 16384],
             "comma-separated sequence lengths (default 1024,4096,16384)",
             _bench.positive_int_list)
    add_flag(parser, "--cases", list(CASES),
             f"comma-separated subset of {','.join(CASES)} (default all)",
             lambda flag: _bench.subset_list(flag, CASES))
    add_flag(parser, "--query-chunk-size", 512,
             "query rows per block of the memory-efficient case (default 512)")
    add_flag(parser, "--key-chunk-size", 512,
             "keys per block of the memory-efficient case (default 512)")
    parser.add_argument("--case", choices=INTERNAL_CASES, default=None,
                        help="internal: measure one case in this process and "
                        "print JSON")
    add_flag(parser, "--seq-len", None,
             "internal: the sequence length of --case")
    args = parser.parse_args(argv)
    if args.case is not None and args.seq_len is None:
        parser.error("--case needs --seq-len")
    return args


# One case, inside its own process.


def _peak_rss_mib():
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _build_inputs(seq_len):
    """Input sequence and the Q, K, V, O kernels, the same in every case."""
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(BATCH, seq_len, WIDTH)).astype("float32"))
    limit = (6.0 / (WIDTH + HEADS * KEY_DIM)) ** 0.5
    shapes = {
        "query": (WIDTH, HEADS, KEY_DIM),
        "key": (WIDTH, HEADS, KEY_DIM),
        "value": (WIDTH, HEADS, KEY_DIM),
        "output": (HEADS, KEY_DIM, WIDTH),
    }
    kernels = {
        name: rng.uniform(-limit, limit, size=shape).astype("float32")
        for name, shape in shapes.items()
    }
    return x, kernels


def _explicit_attend(q, k, v, scale):
    """Softmax of the full `(B, H, T, S)` score matrix, with `keras.ops`."""
    ops = keras.ops
    scores = ops.einsum("bthk,bshk->bhts", q * scale, k)
    weights = ops.softmax(scores, axis=-1)
    return ops.einsum("bhts,bshk->bthk", weights, v)


def build_case(case, kernels, args):
    """Returns `(forward, variables)` of one case; kernels in Q, K, V, O
    order."""
    if case == "mha":
        layer = keras.layers.MultiHeadAttention(
            num_heads=HEADS, key_dim=KEY_DIM, use_bias=False
        )
        layer.build((BATCH, None, WIDTH), (BATCH, None, WIDTH))
    else:
        if case == "explicit":
            attend = _explicit_attend
        else:

            def attend(q, k, v, scale):
                return memory_efficient_attention(
                    q, k, v, scale,
                    query_chunk_size=args.query_chunk_size,
                    key_chunk_size=args.key_chunk_size,
                )

        layer = _bench.HandProjectedAttention(HEADS, KEY_DIM, attend=attend)
        layer.build((BATCH, None, WIDTH))
    variables = _bench.weights_in_order(layer, use_bias=False)
    for variable, name in zip(variables, _bench.PROJECTIONS):
        variable.assign(kernels[name])
    if case == "mha":
        return (lambda x: layer(x, x)), variables
    return layer, variables


def make_train_step(forward, variables):
    @tf.function
    def train_step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(forward(x)))
        gradients = tape.gradient(loss, variables)
        for variable, gradient in zip(variables, gradients):
            variable.assign_sub(LEARNING_RATE * gradient)
        return loss

    return train_step


def run_case(args):
    """Measures `args.case` at `args.seq_len`; prints one JSON line."""
    _bench.setup_tensorflow(PROG)
    x, kernels = _build_inputs(args.seq_len)
    result = {"case": args.case, "seq_len": args.seq_len}
    if args.case == "check":
        result["max_errors"] = check_cases_agree(x, kernels, args)
    elif args.case != "baseline":
        forward, variables = build_case(args.case, kernels, args)
        train_step = make_train_step(forward, variables)
        train_step(x).numpy()  # trace and warm up
        repeats = REPEATS_UP_TO_4K if args.seq_len <= 4096 else 1
        times = {name: [] for name in _bench.CLOCKS}
        for _ in range(repeats):
            starts = {name: clock() for name, clock in _bench.CLOCKS.items()}
            train_step(x).numpy()
            for name, clock in _bench.CLOCKS.items():
                times[name].append(clock() - starts[name])
        result["step_s"] = statistics.median(times["wall"])
        result["step_cpu_s"] = statistics.median(times["cpu"])
    result["peak_rss_mib"] = _peak_rss_mib()
    print(json.dumps(result))


def check_cases_agree(x, kernels, args):
    """Max abs difference to `explicit` of each case's output and gradients."""
    results = {}
    for case in CASES:
        forward, variables = build_case(case, kernels, args)
        with tf.GradientTape() as tape:
            output = forward(x)
            loss = tf.reduce_mean(tf.square(output))
        gradients = tape.gradient(loss, variables)
        results[case] = [output.numpy()] + [g.numpy() for g in gradients]
    errors = {}
    for case in CASES:
        errors[case] = max(
            float(np.max(np.abs(got - want))
                  / max(1e-12, np.max(np.abs(want))))
            for got, want in zip(results[case], results["explicit"])
        )
    return errors


# The driver: one subprocess per case.


def _measure(case, seq_len, args):
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--case",
        case,
        "--seq-len",
        str(seq_len),
        "--query-chunk-size",
        str(args.query_chunk_size),
        "--key-chunk-size",
        str(args.key_chunk_size),
    ]
    completed = subprocess.run(
        command, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S
    )
    lines = completed.stdout.strip().splitlines()
    if completed.returncode != 0 or not lines:
        last = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        return {
            "case": case,
            "seq_len": seq_len,
            "error": f"exit {completed.returncode}: {last}",
        }
    return json.loads(lines[-1])


def _format_row(row, baseline_mib):
    if "error" in row:
        return (f"{row['seq_len']:>8}  {row['case']:<17} "
                f"failed ({row['error']})")
    over = row["peak_rss_mib"] - baseline_mib
    return (
        f"{row['seq_len']:>8}  {row['case']:<17} {row['peak_rss_mib']:>10.0f}"
        f" {over:>10.0f} {row['step_s']:>10.3f} {row['step_cpu_s']:>10.3f}"
    )


def main(argv=None):
    args = parse_args(argv)
    if args.case is not None:
        run_case(args)
        return

    check = _measure("check", CHECK_SEQ_LEN, args)
    if "error" in check:
        _bench.fail(PROG, f"check failed: {check['error']}")
    worst = max(check["max_errors"].values())
    print(
        f"check at T={CHECK_SEQ_LEN}: max relative difference to explicit "
        f"(output and kernel gradients) = {worst:.2e}"
    )
    if not worst <= 1e-4:
        _bench.fail(PROG, "the cases disagree; the table would not compare "
                    "the same computation")

    print(
        f"batch {BATCH}, heads {HEADS}, key_dim {KEY_DIM}, width {WIDTH}; "
        "memory_efficient chunks "
        f"{args.query_chunk_size}x{args.key_chunk_size}"
    )
    header = (
        f"{'seq_len':>8}  {'case':<17} {'peak MiB':>10} {'over base':>10}"
        f" {'step s':>10} {'cpu s':>10}"
    )
    print(header)
    print("-" * len(header))
    summaries = []
    for seq_len in args.seq_lens:
        baseline = _measure("baseline", seq_len, args)
        if "error" in baseline:
            _bench.fail(PROG, f"baseline failed: {baseline['error']}")
        baseline_mib = baseline["peak_rss_mib"]
        print(f"{seq_len:>8}  {'baseline':<17} {baseline_mib:>10.0f}")
        rows = {}
        for case in args.cases:
            rows[case] = _measure(case, seq_len, args)
            print(_format_row(rows[case], baseline_mib), flush=True)
        summaries.append(_summary(seq_len, rows, baseline_mib))
    print()
    for line in summaries:
        if line:
            print(line)


def _summary(seq_len, rows, baseline_mib):
    """Ratio line mem-eff/MHA memory and mem-eff/explicit time, if measured."""
    ok = {case: row for case, row in rows.items() if "error" not in row}
    ours = ok.get("memory_efficient")
    if ours is None:
        return ""
    parts = [f"T={seq_len}:"]
    if "mha" in ok:
        peak = ours["peak_rss_mib"] / ok["mha"]["peak_rss_mib"]
        over = (ours["peak_rss_mib"] - baseline_mib) / max(
            1.0, ok["mha"]["peak_rss_mib"] - baseline_mib
        )
        parts.append(
            f"mem-eff/MHA memory {peak:.2f} (peak), {over:.3f} (over baseline)"
        )
    if "explicit" in ok:
        wall = ours["step_s"] / ok["explicit"]["step_s"]
        cpu = ours["step_cpu_s"] / ok["explicit"]["step_cpu_s"]
        parts.append(
            f"mem-eff/explicit time {wall:.2f} (wall), {cpu:.2f} (cpu)")
    return "  ".join(parts)


if __name__ == "__main__":
    main()
