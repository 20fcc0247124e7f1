"""Latency of an exported model: ONNX Runtime against the SavedModel and Keras.

One toy sequence model (`build_sequence_model`, the training runs' kind) is
exported per sequence length `T` as a SavedModel and as ONNX, and three
peers serve the same int32 token batch (padding in two rows) in the same
process, in turn within each round (the order rotates from round to round,
so a slow spell of a shared machine hits them alike):

* `onnx`: `onnxruntime.InferenceSession` on the CPU, asked for `logits` and
  `predictions`;
* `saved_model`: the SavedModel's `serving_default` signature, loaded with
  `tf.saved_model.load` (what TF Serving runs);
* `keras`: `model.predict_on_batch`, the Keras model itself (a traced
  `tf.function`; no XLA on a CPU-only machine).

A second row per `T` times the attention maps: ONNX Runtime asked for every
output (the maps are computed for the logits anyway) against the
SavedModel's `attention` signature. The table gives each peer's median
latency per batch and the ratios ONNX Runtime / peer (below 1: ONNX Runtime
is faster). The peers' logits are checked to agree first.

Usage:

    python scripts/bench_export.py                      # T 64 and 512
    python scripts/bench_export.py --threads 1 --clock cpu
    python scripts/bench_export.py --seq-lens 128 --repeats 5

TensorFlow backend only (the SavedModel and the ONNX conversion are
TensorFlow's). Bad arguments exit with status 2 and one line on stderr.
"""

import os
import statistics
import tempfile

import _bench  # first: backend, log level, sys.path
from _bench import add_flag
from _bench import keras
from _bench import tf

import numpy as np

from keras_attention.export import export_model
from keras_attention.models import build_sequence_model

PROG = "bench_export.py"
VOCAB = 64


def parse_args(argv=None):
    parser = _bench.parser(
        PROG, "Per-batch latency of ONNX Runtime against the SavedModel "
        "and the Keras model, on the same inputs."
    )
    add_flag(parser, "--seq-lens", [64, 512],
             "comma-separated sequence lengths (default 64,512)",
             _bench.positive_int_list)
    add_flag(parser, "--batch", 8, "sequences per batch (default 8)")
    add_flag(parser, "--d-model", 64, "model width (default 64, the "
             "training tasks' default)")
    add_flag(parser, "--heads", 4, "attention heads (default 4)")
    add_flag(parser, "--layers", 2, "attention blocks (default 2)")
    add_flag(parser, "--repeats", 30, "timed rounds (default 30)")
    add_flag(parser, "--warmup", 5, "untimed rounds first (default 5)")
    add_flag(parser, "--threads", None, "intra-op threads of TensorFlow "
             "and ONNX Runtime (default: each library's own)")
    parser.add_argument("--clock", choices=sorted(_bench.CLOCKS),
                        default="wall", help="wall (default) or cpu: the "
                        "process's CPU time, all threads")
    args = parser.parse_args(argv)
    if args.d_model % args.heads:
        parser.error(f"--d-model ({args.d_model}) must be a multiple of "
                     f"--heads ({args.heads})")
    return args


def onnx_session(path, threads):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(
        path, options, providers=["CPUExecutionProvider"])


def peers(model, directory, tokens, threads):
    """The callables timed for one model: name -> (serving, attention)."""
    saved = export_model(model, os.path.join(directory, "saved"))
    onnx_path = export_model(model, os.path.join(directory, "model.onnx"),
                             format="onnx")
    session = onnx_session(onnx_path, threads)
    loaded = tf.saved_model.load(saved)
    constant = tf.constant(tokens)
    return {
        "onnx": (
            lambda: session.run(["logits", "predictions"],
                                {"tokens": tokens})[0],
            lambda: session.run(None, {"tokens": tokens}),
        ),
        "saved_model": (
            lambda: loaded.signatures["serving_default"](
                tokens=constant)["logits"].numpy(),
            lambda: [value.numpy() for value in
                     loaded.signatures["attention"](tokens=constant).values()],
        ),
        "keras": (lambda: np.asarray(model.predict_on_batch(tokens)), None),
    }


def time_case(calls, args):
    """Median seconds per call of each callable in `calls` (name -> fn)."""
    clock = _bench.CLOCKS[args.clock]
    times = {name: [] for name in calls}
    for index in range(args.warmup + args.repeats):
        for name in _bench.round_order(calls, index, "rotate"):
            start = clock()
            calls[name]()
            if index >= args.warmup:
                times[name].append(clock() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv=None):
    args = parse_args(argv)
    _bench.setup_tensorflow(PROG, threads=args.threads)
    rows = []
    for length in args.seq_lens:
        keras.utils.set_random_seed(0)
        model = build_sequence_model(
            vocab_size=VOCAB, seq_len=length, d_model=args.d_model,
            key_dim=args.d_model // args.heads, num_heads=args.heads,
            ff_dim=4 * args.d_model, num_layers=args.layers)
        tokens = np.random.default_rng(1).integers(
            1, VOCAB, (args.batch, length)).astype("int32")
        tokens[1, length // 2:] = 0
        tokens[-1, length // 4:] = 0
        with tempfile.TemporaryDirectory(prefix="bench_export-") as scratch:
            _bench.note(f"T={length}: exporting")
            cases = peers(model, scratch, tokens, args.threads)
            logits = {name: serve() for name, (serve, _) in cases.items()}
            error = max(float(np.max(np.abs(value - logits["keras"])))
                        for value in logits.values())
            _bench.note(f"T={length}: timing (peers' logits agree to "
                        f"{error:.1e})")
            serving = time_case(
                {name: serve for name, (serve, _) in cases.items()}, args)
            attention = time_case(
                {name: maps for name, (_, maps) in cases.items() if maps},
                args)
        rows.append(_row(length, "logits", serving))
        rows.append(_row(length, "+ attention", attention))
    threads = args.threads or "default"
    print(f"batch {args.batch}, d_model {args.d_model}, {args.heads} heads, "
          f"{args.layers} layers; median of {args.repeats} rounds, "
          f"{args.clock} clock, threads {threads}")
    print(_bench.text_table(
        ["T", "outputs", "onnx ms", "saved_model ms", "keras ms",
         "onnx/saved_model", "onnx/keras"], rows))


def _row(length, outputs, seconds):
    def ms(name):
        return f"{seconds[name] * 1e3:.2f}" if name in seconds else "-"

    def ratio(name):
        return (f"{seconds['onnx'] / seconds[name]:.2f}"
                if name in seconds else "-")

    return [length, outputs, ms("onnx"), ms("saved_model"), ms("keras"),
            ratio("saved_model"), ratio("keras")]


if __name__ == "__main__":
    main()
