"""Training throughput of the pipeline's trainer against a plain `Model.fit`.

Runs, in one process, on the same task stream and global batch:

* `ours`: `pipelines.train.train(config)` on a temporary log directory, the
  real trainer (custom loop, `ScaledDotProductAttention`), with the attention
  diagnostics effectively off (`diagnostics_every` past the end of the run);
* `ours + diagnostics`: the same run at the default `diagnostics_every`;
* `ours, in-memory data`: the same run with its input stream replaced by the
  stream's first batch cached in memory and repeated, so no batch is
  generated during the timed steps;
* `plain fit`: `Model.fit` on a Keras model of the same sizes whose attention
  is `keras.layers.MultiHeadAttention` (same d_model, heads, key_dim,
  value_dim, feed-forward, pre-norm layer norms, classifier, no biases in the
  attention; the embedding layers are the library's own so that only the
  attention layer and the training loop differ), compiled with the same
  optimizer and the same `jit_compile`, fed by the same `task.batches(...)`
  as `(tokens, targets, sample_weight)`;

both on the Keras backend `--backend` names (default: KERAS_BACKEND, else
tensorflow).

Each variant runs `--rounds` times (in reversed order every other round, so
the slow spells of a shared machine and first-run effects do not all land on
one variant) and reports its best round. Timing excludes start-up and
compilation: the trainer's throughput is the median of its logged
`steps_per_second` windows (`log_every` steps each, the first `--warmup`
steps left out; the trainer already leaves its evaluation, diagnostics and
checkpoint pauses out of them); `Model.fit` gets the same statistic from the
end times of its steps (a callback).

Model FLOPs utilization (MFU) is `tokens/s * FLOPs/token / matmul FLOP/s`,
with the matmul FLOPs of a token counted analytically (projections, Q K^T,
A V, output projection, feed-forward, classifier; forward x 3 for forward
plus backward; embeddings, norms and softmax left out) and the machine's
matmul throughput measured in the same run with a large float32 matmul (the
best of a measurement before the first round and one after each round).
Tokens are all `batch * seq_len` positions of a batch.

The diagnostics overhead is `t_diag / (diagnostics_every * t_step + t_diag)`:
the fraction of throughput lost when every `diagnostics_every` steps pay one
diagnostics call `t_diag` (the mean of the calls the trainer made after a
run's first, timed from the trainer's copy of the weights into the probed
model to the end of `write_diagnostics`).

Usage:

    python scripts/bench_train.py                       # recall, ~3 min
    python scripts/bench_train.py --task sort --steps 400 --jit on
    # the diagnostics' cost at the comparison's settings and interval:
    python scripts/bench_train.py --compare-preset default --key-dim 1024 --scale none

Bad arguments exit with status 2 and one line on stderr.
"""

import itertools
import json
import os
import statistics
import sys
import time

import _bench  # first: backend, log level, sys.path
import _training
from _bench import add_flag
from _bench import keras

from keras_attention.embeddings import FactoredEmbedding
from keras_attention.embeddings import PositionEmbedding
from pipelines.builders import build_optimizer
from pipelines.engine.presets import COMPARE_PRESETS
from pipelines.settings import TrainConfig
from pipelines.devices import open_run_devices

PROG = "bench_train.py"
TASKS = ("recall", "reverse", "sort", "copy")
# Goals of the benchmark.
GOAL_RATIO = 1.0
GOAL_DIAGNOSTICS_OVERHEAD = 0.05
GOAL_STARVATION = 0.05


def parse_args(argv=None):
    parser = _bench.parser(
        PROG,
        "Training throughput and model FLOPs utilization of the "
        "pipeline's trainer against a plain Model.fit with "
        "keras.layers.MultiHeadAttention."
    )
    parser.add_argument("--task", choices=TASKS, default="recall",
                        help="synthetic task (default recall)")
    add_flag(parser, "--steps", 250, "steps per timed run (default 250)")
    add_flag(parser, "--rounds", 2,
             "runs of each variant; the best counts (default 2)")
    add_flag(parser, "--warmup", 50,
             "steps left out of the timing (default 50)")
    add_flag(parser, "--batch-size", None, "global batch (default: the task's)")
    add_flag(parser, "--d-model", None, "model width (default: the task's)")
    add_flag(parser, "--layers", None,
             "attention blocks (default: the task's)")
    parser.add_argument("--backend", choices=("tensorflow", "jax", "torch"),
                        default=None,
                        help="Keras backend (read before Keras is imported; "
                        "default: KERAS_BACKEND, else tensorflow)")
    parser.add_argument("--jit", choices=("on", "off"), default=None,
                        help="XLA for both trainers (default: the "
                        "trainer's choice: off on a CPU with TensorFlow, on "
                        "with JAX, off with torch)")
    add_flag(parser, "--key-dim", None, "d_k (default: the task's)")
    parser.add_argument("--scale", choices=("sqrt", "none", "inverse"),
                        help="score scale (default: the task's)")
    add_flag(parser, "--diagnostics-every", TrainConfig.diagnostics_every,
             "interval of the diagnostics whose cost is measured (default: "
             "the trainer's, %(default)s)")
    parser.add_argument("--compare-preset", choices=tuple(COMPARE_PRESETS),
                        help="train with a comparison preset's settings "
                        "(its model, jit, intervals) under the flags above")
    add_flag(parser, "--matmul-size", 2048,
             "n of the n x n float32 matmul that measures the machine "
             "(default 2048)")
    args = parser.parse_args(argv)
    if args.warmup >= args.steps:
        parser.error(
            f"--warmup ({args.warmup}) must be smaller than --steps "
            f"({args.steps})"
        )
    return args


# ------------------------------------------------------------- the trainer
def run_trainer(config, warmup, diagnostics_every=None, synthetic=False):
    """Runs `pipelines.train.train` on a temporary logdir, evaluation,
    checkpoints and (unless `diagnostics_every`) diagnostics out of the way.

    Returns:
        `(steps_per_second, metrics, diagnostics_seconds)`.
    """
    config = config.replace(**_training.quiet_run_settings(config.steps))
    if diagnostics_every is not None:
        config = config.replace(diagnostics_every=diagnostics_every)
    durations = []
    contexts = [_training.timed_diagnostics(durations)]
    if synthetic:
        contexts.append(_training.in_memory_data())
    steps_per_second, metrics = _training.train_and_time(
        config, warmup, "bench-train-", contexts
    )
    return steps_per_second, metrics, durations


# ------------------------------------------------------------- plain fit
def build_plain_model(config, task):
    """The trainer's model with `keras.layers.MultiHeadAttention` as the
    attention (pre-norm blocks, gelu feed-forward, final norm, classifier)."""
    if config.norm != "pre":
        raise ValueError(f"`norm` must be 'pre'; received {config.norm!r}.")
    d_model = config.d_model
    ff_dim = 4 * d_model if config.ff_dim is None else config.ff_dim
    tokens = keras.Input(shape=(task.seq_len,), dtype="int32", name="tokens")
    if task.token_factors is not None:
        embed = FactoredEmbedding(task.token_factors, d_model, mask_zero=True)
    else:
        embed = keras.layers.Embedding(task.vocab_size, d_model, mask_zero=True)
    x = embed(tokens)
    x = PositionEmbedding(task.seq_len)(x)
    for _ in range(config.num_layers):
        h = keras.layers.LayerNormalization(epsilon=1e-6)(x)
        h = keras.layers.MultiHeadAttention(
            num_heads=config.num_heads, key_dim=config.key_dim,
            value_dim=config.value_dim or config.key_dim, use_bias=False,
        )(h, h, use_causal_mask=config.causal)
        x = keras.layers.Add()([x, h])
        if ff_dim > 0:
            h = keras.layers.LayerNormalization(epsilon=1e-6)(x)
            h = keras.layers.Dense(ff_dim, activation="gelu")(h)
            h = keras.layers.Dense(d_model)(h)
            x = keras.layers.Add()([x, h])
    x = keras.layers.LayerNormalization(epsilon=1e-6)(x)
    logits = keras.layers.Dense(task.num_classes, dtype="float32")(x)
    return keras.Model(tokens, logits, name="plain_mha_model")


def run_plain_fit(config, task, warmup, synthetic=False):
    """Trains the plain model with `Model.fit`; returns steady steps/s (the
    median of `config.log_every`-step windows after `warmup` steps)."""
    keras.utils.set_random_seed(config.seed)
    model = build_plain_model(config, task)
    optimizer, _ = build_optimizer(config)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=["sparse_categorical_accuracy"],
        jit_compile=config.jit_compile == "on",
    )
    data = task.batches(config.batch_size, config.seed)
    if synthetic:
        data = itertools.repeat(next(data))

    ends = []

    class _Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            ends.append(time.perf_counter())

    model.fit(data, epochs=1, steps_per_epoch=config.steps, verbose=0,
              shuffle=False, callbacks=[_Clock()])
    # Windows of `log_every` steps after the warm-up, as the trainer logs
    # them, and the same statistic (the median).
    window = config.log_every
    rates = [
        window / (ends[stop - 1] - ends[stop - 1 - window])
        for stop in range(warmup + window, len(ends) + 1, window)
    ]
    return statistics.median(rates)


# ------------------------------------------------------------- report
def _table(headers, rows):
    return _bench.text_table(headers, rows, header_justify="left")


def _verdict(ok, difference, noise):
    """"met" / "NOT met", flagged when `difference` (a relative change) is
    no larger than the run's noise floor."""
    text = "met" if ok else "NOT met"
    if abs(difference) <= noise:
        text += ", within the noise floor"
    return text


def bench_settings(args):
    """The settings the benchmark trains with, over the defaults."""
    settings = dict(task=args.task, steps=args.steps,
                    jit_compile=args.jit or "auto",
                    strategy="default", precision="float32")
    if args.compare_preset:
        chosen = COMPARE_PRESETS[args.compare_preset]
        preset = chosen.layer_values(chosen.task)
        args.diagnostics_every = preset.pop("diagnostics_every")
        settings = {**preset, **dict(steps=args.steps, strategy="default",
                                     precision="float32")}
    for flag, name in (("batch_size", "batch_size"), ("d_model", "d_model"),
                       ("layers", "num_layers"), ("key_dim", "key_dim"),
                       ("scale", "scale")):
        if getattr(args, flag) is not None:
            settings[name] = getattr(args, flag)
    return settings


def main(argv=None):
    args = parse_args(argv)
    _bench.setup_tensorflow(PROG, backends=("tensorflow", "jax", "torch"))
    config, task = _training.resolved_config(PROG, bench_settings(args))
    # The trainer's own resolution of "auto", so that fit compiles alike.
    config, _ = open_run_devices(config)
    tokens_per_step = config.batch_size * task.seq_len
    flops_per_token = _bench.model_flops_per_token(config, task)

    print(f"task {config.task}: batch {config.batch_size} x seq_len "
          f"{task.seq_len} = {tokens_per_step} tokens/step; d_model "
          f"{config.d_model}, layers {config.num_layers}, heads "
          f"{config.num_heads}, key_dim {config.key_dim}, ff "
          f"{4 * config.d_model if config.ff_dim is None else config.ff_dim}"
          f"; optimizer {config.optimizer}; jit_compile {config.jit_compile} "
          f"for both; {config.steps} steps per run, first {args.warmup} "
          f"untimed; Keras {keras.__version__} on {config.backend}, "
          f"{os.cpu_count()} CPU(s)")
    print(f"model FLOPs/token (fwd+bwd matmuls): {flops_per_token:,.0f}")

    matmul = _bench.measure_matmul_flops(args.matmul_size)
    print(f"measured {args.matmul_size}x{args.matmul_size} float32 matmul: "
          f"{matmul / 1e9:.1f} GFLOP/s", flush=True)

    # Each variant runs once per round, in reversed order in every other
    # round, so slow spells of a shared machine and first-run effects do not
    # all land on one variant; each variant reports its best round.
    variants = {
        "ours": lambda: run_trainer(config, args.warmup),
        "ours + diagnostics": lambda: run_trainer(
            config, args.warmup, diagnostics_every=args.diagnostics_every),
        "ours, in-memory data": lambda: run_trainer(
            config, args.warmup, synthetic=True),
        "plain fit (MHA)": lambda: (
            run_plain_fit(config, task, args.warmup), None, []),
    }
    rounds = {name: [] for name in variants}
    wall = {name: 0.0 for name in variants}
    diag_times = []
    for round_index in range(args.rounds):
        for name in _bench.round_order(variants, round_index, "reverse"):
            start = time.perf_counter()
            steps_per_second, _, durations = variants[name]()
            wall[name] += time.perf_counter() - start
            rounds[name].append(steps_per_second)
            if name == "ours + diagnostics":
                # The first call of a run traces the eager probe.
                diag_times.extend(durations[1:])
            print(f"  round {round_index + 1}: {name}: "
                  f"{steps_per_second:.1f} steps/s", flush=True)
        # The peak is the best the machine showed while it was shared.
        matmul = max(matmul, _bench.measure_matmul_flops(args.matmul_size))
    results = {name: max(values) for name, values in rounds.items()}
    print(f"best {args.matmul_size}x{args.matmul_size} float32 matmul: "
          f"{matmul / 1e9:.1f} GFLOP/s")

    plain = results["plain fit (MHA)"]
    rows = []
    for name, steps_per_second in results.items():
        tokens_per_second = steps_per_second * tokens_per_step
        rows.append([
            name, f"{1e3 / steps_per_second:.2f}",
            " / ".join(f"{1e3 / value:.1f}" for value in rounds[name]),
            f"{tokens_per_second:,.0f}",
            f"{tokens_per_second * flops_per_token / 1e9:.2f}",
            f"{100 * tokens_per_second * flops_per_token / matmul:.1f}%",
            f"{steps_per_second / plain:.2f}", f"{wall[name]:.0f}",
        ])
    print()
    print(_table(["trainer", "ms/step", "rounds ms/step", "tokens/s",
                  "model GFLOP/s", "MFU", "vs plain", "run s"], rows))

    # Diagnostics run eagerly between steps, outside the timed windows:
    # their cost is the time of one call against the steps between calls.
    step_time = 1.0 / results["ours"]
    # The mean, not the median: calls that also draw the Images tab's heat
    # maps (every `heatmap_every` steps) cost more, and they are part of it.
    diag_call = statistics.mean(diag_times)
    every = args.diagnostics_every
    overhead = diag_call / (every * step_time + diag_call)
    step_change = results["ours + diagnostics"] / results["ours"] - 1.0
    print()
    print(_table(
        [f"diagnostics (every {every} steps)", "value"],
        [
            ["seconds per call (mean of calls after a run's first)",
             f"{diag_call:.3f} ({len(diag_times)} calls)"],
            [f"{every} steps", f"{every * step_time:.3f} s"],
            [f"throughput lost at diagnostics_every={every}",
             f"{100 * overhead:.1f}%"],
            ["step time between calls vs diagnostics off",
             f"{-100 * step_change:+.1f}%"],
        ],
    ))

    starved = 1.0 - results["ours"] / results["ours, in-memory data"]
    print()
    print(_table(
        ["input pipeline (ours)", "ms/step"],
        [
            ["real task pipeline", f"{1e3 / results['ours']:.2f}"],
            ["one batch cached in memory",
             f"{1e3 / results['ours, in-memory data']:.2f}"],
            ["slowdown of the real pipeline", f"{100 * starved:+.1f}%"],
        ],
    ))

    ratio = results["ours"] / plain
    # "ours" and "ours + diagnostics" run the same steps between the
    # diagnostics calls: their difference is what the machine's noise alone
    # does to a figure.
    noise = abs(step_change)
    print()
    print(f"noise floor (same steps, ours vs ours + diagnostics): "
          f"{100 * noise:.1f}%")
    print(f"goal ours/plain >= {GOAL_RATIO:.1f}: {ratio:.2f} "
          f"({_verdict(ratio >= GOAL_RATIO, ratio - 1.0, noise)})")
    print(f"goal diagnostics cost <= {100 * GOAL_DIAGNOSTICS_OVERHEAD:.0f}%: "
          f"{100 * overhead:.1f}% "
          f"({_verdict(overhead <= GOAL_DIAGNOSTICS_OVERHEAD, 0.0, -1.0)})")
    print(f"goal input pipeline never starves the step (real within "
          f"{100 * GOAL_STARVATION:.0f}% of in-memory): "
          f"{100 * starved:+.1f}% "
          f"({_verdict(starved <= GOAL_STARVATION, starved, noise)})")
    print(json.dumps({
        "tokens_per_s": {name: [value * tokens_per_step for value in values]
                         for name, values in rounds.items()},
        "matmul_flops_per_s": matmul,
        "flops_per_token": flops_per_token,
        "diagnostics_call_s": diag_times,
        "diagnostics_overhead": overhead,
        "ours_vs_plain": ratio,
        "noise_floor": noise,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
