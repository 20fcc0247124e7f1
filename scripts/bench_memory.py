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
A `baseline` subprocess only imports TensorFlow and builds the inputs and
weights; the table also shows each case's peak RSS over that baseline. Each
step function is traced and run once (warm-up) before it is timed; the table
reports the median of the timed steps, as wall-clock seconds and as process
CPU seconds (all threads; steadier than wall time on a shared machine).

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
import time

from _cli_args import OneLineErrorParser as _Parser
from _cli_args import positive_int as _positive_int
from _cli_args import positive_int_list as _positive_int_list
from _cli_args import subset_list as _subset_list

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Run from a source checkout without installing the package.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

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
    parser = _Parser(
        prog="bench_memory.py",
        description=(
            "Peak RSS and training-step time of explicit attention, "
            "memory-efficient attention and keras.layers.MultiHeadAttention."
        ),
    )
    parser.add_argument(
        "--seq-lens",
        type=_positive_int_list("--seq-lens"),
        default=[1024, 4096, 16384],
        help="comma-separated sequence lengths (default 1024,4096,16384)",
    )
    parser.add_argument(
        "--cases",
        type=_subset_list("--cases", CASES),
        default=list(CASES),
        help=f"comma-separated subset of {','.join(CASES)} (default all)",
    )
    parser.add_argument(
        "--query-chunk-size",
        type=_positive_int("--query-chunk-size"),
        default=512,
        help="query rows per block of the memory-efficient case (default 512)",
    )
    parser.add_argument(
        "--key-chunk-size",
        type=_positive_int("--key-chunk-size"),
        default=512,
        help="keys per block of the memory-efficient case (default 512)",
    )
    parser.add_argument(
        "--case",
        choices=INTERNAL_CASES,
        default=None,
        help="internal: measure one case in this process and print JSON",
    )
    parser.add_argument(
        "--seq-len",
        type=_positive_int("--seq-len"),
        default=None,
        help="internal: the sequence length of --case",
    )
    args = parser.parse_args(argv)
    if args.case is not None and args.seq_len is None:
        parser.error("--case needs --seq-len")
    return args


# One case, inside its own process.


def _peak_rss_mib():
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _build_inputs(tf, seq_len):
    """Input sequence and the Q, K, V, O kernels, the same in every case."""
    import numpy as np

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


def _hand_projected(keras, kernels, attend):
    """Forward function and variables: Q/K/V/O einsums around `attend`."""
    ops = keras.ops
    variables = {
        name: keras.Variable(value, name=f"{name}_kernel")
        for name, value in kernels.items()
    }

    def forward(x):
        q = ops.einsum("btd,dhk->bthk", x, variables["query"])
        k = ops.einsum("bsd,dhk->bshk", x, variables["key"])
        v = ops.einsum("bsd,dhk->bshk", x, variables["value"])
        attended = attend(q, k, v, 1.0 / KEY_DIM**0.5)
        return ops.einsum("bthk,hko->bto", attended, variables["output"])

    return forward, list(variables.values())


def _explicit_attend(keras):
    ops = keras.ops

    def attend(q, k, v, scale):
        scores = ops.einsum("bthk,bshk->bhts", q * scale, k)
        weights = ops.softmax(scores, axis=-1)
        return ops.einsum("bhts,bshk->bthk", weights, v)

    return attend


def _memory_efficient_attend(query_chunk_size, key_chunk_size):
    from keras_attention.memory_efficient import memory_efficient_attention

    def attend(q, k, v, scale):
        return memory_efficient_attention(
            q,
            k,
            v,
            scale,
            query_chunk_size=query_chunk_size,
            key_chunk_size=key_chunk_size,
        )

    return attend


def _mha(keras, kernels):
    layer = keras.layers.MultiHeadAttention(
        num_heads=HEADS, key_dim=KEY_DIM, use_bias=False
    )
    shape = (BATCH, None, WIDTH)
    layer.build(shape, shape)
    dense_layers = (
        layer.query_dense,
        layer.key_dense,
        layer.value_dense,
        layer.output_dense,
    )
    for dense, name in zip(dense_layers, ("query", "key", "value", "output")):
        dense.kernel.assign(kernels[name])
    variables = [dense.kernel for dense in dense_layers]
    return (lambda x: layer(x, x)), variables


def build_case(keras, case, kernels, args):
    """Returns `(forward, variables)` of one case; kernels in Q, K, V, O order."""
    if case == "explicit":
        return _hand_projected(keras, kernels, _explicit_attend(keras))
    if case == "memory_efficient":
        attend = _memory_efficient_attend(args.query_chunk_size, args.key_chunk_size)
        return _hand_projected(keras, kernels, attend)
    return _mha(keras, kernels)


def make_train_step(tf, forward, variables):
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
    import keras
    import tensorflow as tf

    if keras.backend.backend() != "tensorflow":
        sys.stderr.write(
            "bench_memory.py: error: needs the tensorflow Keras backend; "
            f"KERAS_BACKEND is {keras.backend.backend()!r}\n"
        )
        sys.exit(2)
    tf.get_logger().setLevel("ERROR")
    x, kernels = _build_inputs(tf, args.seq_len)
    result = {"case": args.case, "seq_len": args.seq_len}
    if args.case == "check":
        result["max_errors"] = check_cases_agree(keras, tf, x, kernels, args)
    elif args.case != "baseline":
        forward, variables = build_case(keras, args.case, kernels, args)
        train_step = make_train_step(tf, forward, variables)
        train_step(x).numpy()  # trace and warm up
        repeats = REPEATS_UP_TO_4K if args.seq_len <= 4096 else 1
        wall_times, cpu_times = [], []
        for _ in range(repeats):
            wall_start, cpu_start = time.perf_counter(), time.process_time()
            train_step(x).numpy()
            wall_times.append(time.perf_counter() - wall_start)
            cpu_times.append(time.process_time() - cpu_start)
        result["step_s"] = statistics.median(wall_times)
        result["step_cpu_s"] = statistics.median(cpu_times)
    result["peak_rss_mib"] = _peak_rss_mib()
    print(json.dumps(result))


def check_cases_agree(keras, tf, x, kernels, args):
    """Max abs difference to `explicit` of each case's output and gradients."""
    import numpy as np

    results = {}
    for case in CASES:
        forward, variables = build_case(keras, case, kernels, args)
        with tf.GradientTape() as tape:
            output = forward(x)
            loss = tf.reduce_mean(tf.square(output))
        gradients = tape.gradient(loss, variables)
        results[case] = [output.numpy()] + [g.numpy() for g in gradients]
    errors = {}
    for case in CASES:
        errors[case] = max(
            float(np.max(np.abs(got - want)) / max(1e-12, np.max(np.abs(want))))
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
        return f"{row['seq_len']:>8}  {row['case']:<17} failed ({row['error']})"
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
        sys.stderr.write(f"bench_memory.py: error: check failed: {check['error']}\n")
        sys.exit(1)
    worst = max(check["max_errors"].values())
    print(
        f"check at T={CHECK_SEQ_LEN}: max relative difference to explicit "
        f"(output and kernel gradients) = {worst:.2e}"
    )
    if not worst <= 1e-4:
        sys.stderr.write(
            "bench_memory.py: error: the cases disagree; the table would not "
            "compare the same computation\n"
        )
        sys.exit(1)

    print(
        f"batch {BATCH}, heads {HEADS}, key_dim {KEY_DIM}, width {WIDTH}; "
        f"memory_efficient chunks {args.query_chunk_size}x{args.key_chunk_size}"
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
            sys.stderr.write(
                f"bench_memory.py: error: baseline failed: {baseline['error']}\n"
            )
            sys.exit(1)
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
        parts.append(f"mem-eff/explicit time {wall:.2f} (wall), {cpu:.2f} (cpu)")
    return "  ".join(parts)


if __name__ == "__main__":
    main()
