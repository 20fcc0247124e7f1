"""Training throughput of the pipeline's trainer against Keras's `Model.fit`
on the same model, data, optimizer and loss.

Runs, in one process on the Keras backend `--backend` names (default:
KERAS_BACKEND, else tensorflow), each variant as a whole training run of
`--steps` steps of the task's stream:

* `ours`: `pipelines.train.train(config)` on a temporary log directory:
  Keras's `fit` with the run's callback (`pipelines.loop.RunLoop`), at
  the steps per call dividing its intervals, evaluation and checkpoints
  at the end only, diagnostics at step 0 and at the end only;
* `fit, 1 step/call` and `fit, N steps/call`: `Model.fit` on the same model
  (`build_model`, the same initial weights), the same optimizer and
  schedule (`build_optimizer`), the task's weighted cross-entropy as
  `SparseCategoricalCrossentropy(from_logits=True,
  reduction="mean_with_sample_weight")` with the per-position weights as
  `sample_weight` and a weighted accuracy, the trainer's `jit_compile`, fed
  the trainer's batches (`task.batches`, a function of (seed, step)) by a
  Python generator, at `steps_per_execution` 1 and N (`--steps-per-
  execution`, default the trainer's `log_every`, the steps between its
  host syncs); no callback with a batch hook, no progress bar;
* `ours + diagnostics`: `ours` at `--diagnostics-every` (unless
  `--no-diagnostics`).

Each run's clocks (`time.perf_counter` for wall time and
`time.process_time` for this process's CPU time, all threads) are read
around its steps after a warm-up of `--warmup` steps (rounded up to a
multiple of `log_every`): for the trainer at its log intervals, right after
it has read a window's metrics to the host; for `fit` at the start and end
of the epoch of a second `fit` that follows a first, untimed, warm-up
`fit`. So compiling is left out of the step time and reported apart
(`start s`: build, compile and warm-up steps). The variants run once per
round, in reversed order every other round (a shared machine's slow spells
and first-run effects spread over them); a variant's figure is the median
over rounds with the range beside it, and its ratio to `ours` is taken
within each round (its steps/s over ours) and then the median. After the
same steps from the same weights, each run's weights are compared with
ours (`weights vs ours`: max |difference| over max |weight|): the
comparison trains one model, not two. `task.batches alone` is the time of
drawing the timed steps' batches, which every loop pays in its step.

Model FLOPs utilization (MFU) is `tokens/s * FLOPs/token / matmul FLOP/s`,
with the matmul FLOPs of a token counted analytically (projections, Q K^T,
A V, output projection, feed-forward, classifier; forward x 3 for forward
plus backward) and the machine's matmul throughput measured in the same run
with a large float32 matmul (the best of one measurement before the first
round and one after the last). Tokens are all `batch * seq_len` positions.

The diagnostics' cost is `t_diag / (diagnostics_every * t_step + t_diag)`,
the throughput lost when every `diagnostics_every` steps pay one call
`t_diag` (the mean of the calls after each run's first, each the whole
call the trainer's loop makes: state sync, probe, summaries, record);
beside it the timed steps of `ours + diagnostics` against `ours`.

What `fit` does per call is its own and counted: on TensorFlow Keras reads
the logs to the host after every call, on JAX (Keras 3.15.1)
`steps_per_execution` is a Python loop over one compiled step, and on torch
Keras refuses more than 1 step per call (N is 1 there). The trainer's
`jit_compile` is also what Keras's `"auto"` picks here (off on a CPU with
TensorFlow, on with JAX, off with torch).

Measured on the 2-core CPU shared with other jobs (load average 1.2 to 4.1
with this one), 2026-12-04, main at acf00ea-c9bcd64, Keras 3.15.1, the
recall task at the trainer's defaults (1 layer, d_model 64, key_dim 64,
batch 64 x 17 tokens, SGD), 250 timed steps after 50, 3 rounds, N = 10;
each backend run twice (1, 2), TensorFlow also with XLA (`--jit on`),
torch also with one thread (`--threads 1`):

    python scripts/bench_train.py --backend B --no-diagnostics

fit's steps/s over ours, median of the 3 rounds and their range:

    run              clock  ours ms/step  fit, 1 step/call  fit, 10/call
    tensorflow (1)   wall          11.0   0.85 (.80-.89)    0.97 (.88-1.01)
                     CPU           17.9   0.83 (.78-.88)    0.91 (.82-.97)
    tensorflow (2)   wall          17.9   0.92 (.91-1.45)   0.92 (.90-1.72)
                     CPU           18.3   0.89 (.85-.92)    0.90 (.85-1.01)
    tensorflow, XLA  wall          20.3   1.08 (.86-1.08)   1.12 (.91-1.24)
                     CPU           20.2   0.86 (.86-1.07)   1.09 (.91-1.10)
    jax (1)          wall           7.6   0.95 (.78-1.07)   0.89 (.87-1.30)
                     CPU           13.5   0.93 (.78-1.05)   0.88 (.85-1.26)
    jax (2)          wall          13.0   1.03 (.97-1.59)   1.54 (1.00-1.57)
                     CPU           14.1   0.99 (.97-1.02)   0.94 (.88-1.00)
    torch (1)        wall          15.1   0.90 (.88-.93)    -
                     CPU           30.1   0.90 (.90-.93)    -
    torch, 1 thread  wall          21.3   0.88 (.76-.96)    -
                     CPU           21.0   0.84 (.77-.97)    -

In every run the weights after the 300 steps were the same both ways (max
difference 0). `task.batches` took 0.22-0.28 ms of each step. The wall
clock moved with the other jobs (ours' own rounds up to 38% apart); the
CPU clock less, except on torch at its default 2 threads: two more torch
runs under a heavier load gave 17-301 ms/step in both loops, rounds up to
14x apart (its threads spin while the cores are taken), where at one
thread ours' rounds stayed within 11%. The figures these replace (fit at
0.79x on TensorFlow, 0.28x on torch, 1.24x on JAX) came from a
`MultiHeadAttention` model timed by a callback that synced the host every
step, without `steps_per_execution`.

Usage:

    python scripts/bench_train.py --backend jax      # recall
    python scripts/bench_train.py --task sort --steps 400 --jit on
    # the diagnostics' cost at the comparison's settings and interval:
    python scripts/bench_train.py --compare-preset default \\
        --key-dim 1024 --scale none

Bad arguments exit with status 2 and one line on stderr.
"""

import json
import os
import statistics
import sys

import _bench  # first: backend, log level, sys.path
import _training
import numpy as np
from _bench import add_flag
from _bench import keras

from pipelines.devices import open_run_devices
from pipelines.engine.presets import COMPARE_PRESETS
from pipelines.settings import TrainConfig
from pipelines.steps import steps_per_call

PROG = "bench_train.py"
TASKS = ("recall", "reverse", "sort", "copy")
# The trainer gives way to `fit` when `fit` runs at this fraction of its
# steps/s or better on every backend.
GOAL_FIT = 0.95
GOAL_DIAGNOSTICS_OVERHEAD = 0.05
OURS, DIAGNOSED, DATA = "ours", "ours + diagnostics", "task.batches alone"


def parse_args(argv=None):
    parser = _bench.parser(
        PROG,
        "Training throughput of the pipeline's trainer against "
        "Model.fit on the same model, data and optimizer."
    )
    parser.add_argument("--task", choices=TASKS, default="recall",
                        help="synthetic task (default recall)")
    add_flag(parser, "--steps", 300, "steps per run (default 300)")
    add_flag(parser, "--rounds", 3,
             "runs of each variant; the median counts (default 3)")
    add_flag(parser, "--warmup", 50,
             "steps before the timed ones, rounded up to a multiple of "
             "log_every (default 50)")
    add_flag(parser, "--steps-per-execution", None,
             "fit's steps per call beside 1 (default: the trainer's "
             "log_every)")
    add_flag(parser, "--batch-size", None,
             "global batch (default: the task's)")
    add_flag(parser, "--d-model", None, "model width (default: the task's)")
    add_flag(parser, "--layers", None,
             "attention blocks (default: the task's)")
    parser.add_argument("--backend", choices=("tensorflow", "jax", "torch"),
                        default=None,
                        help="Keras backend (read before Keras is imported; "
                        "default: KERAS_BACKEND, else tensorflow)")
    parser.add_argument("--jit", choices=("on", "off"), default=None,
                        help="XLA for both loops (default: the "
                        "trainer's choice: off on a CPU with TensorFlow, on "
                        "with JAX, off with torch)")
    add_flag(parser, "--key-dim", None, "d_k (default: the task's)")
    parser.add_argument("--scale", choices=("sqrt", "none", "inverse"),
                        help="score scale (default: the task's)")
    add_flag(parser, "--diagnostics-every", TrainConfig.diagnostics_every,
             "interval of the diagnostics whose cost is measured (default: "
             "the trainer's, %(default)s)")
    add_flag(parser, "--threads", None,
             "threads of TensorFlow's pools or torch's kernels (default: "
             "the framework's; JAX's are set by XLA_FLAGS before start-up)")
    parser.add_argument("--no-diagnostics", action="store_true",
                        help="leave out the `ours + diagnostics` run")
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
        if args.jit is not None:
            settings["jit_compile"] = args.jit
    for flag, name in (("batch_size", "batch_size"), ("d_model", "d_model"),
                       ("layers", "num_layers"), ("key_dim", "key_dim"),
                       ("scale", "scale")):
        if getattr(args, flag) is not None:
            settings[name] = getattr(args, flag)
    return settings


def timed_warmup(args, log_every):
    """The steps before the timed ones: `--warmup` rounded up to a multiple
    of `log_every` (the trainer reads the clocks at its logs); exits 2 when
    that leaves no step to time."""
    warmup = -(-args.warmup // log_every) * log_every
    if warmup >= args.steps:
        _bench.fail(PROG, f"--warmup ({args.warmup}), rounded up to a "
                    f"multiple of log_every ({log_every}), is {warmup}: it "
                    f"must be smaller than --steps ({args.steps})", status=2)
    return warmup


def fit_steps_per_call(args, config):
    """fit's steps per call beside 1: `--steps-per-execution`, else the
    trainer's `log_every`; 1 on torch, where Keras refuses more (exit 2
    when asked for more there)."""
    if config.backend != "torch":
        return args.steps_per_execution or config.log_every
    if (args.steps_per_execution or 1) > 1:
        _bench.fail(PROG, "--steps-per-execution must be 1 on torch (Keras "
                    f"refuses more); received {args.steps_per_execution}",
                    status=2)
    return 1


# ------------------------------------------------------------- the runs
def variants(config, task, warmup, per_call, diagnostics_every, durations):
    """`{name: (steps per call, run)}`, `run()` giving `(Timing, model)`."""
    runs = {OURS: (steps_per_call(config),
                   lambda: _training.time_trainer(config, warmup))}
    for steps in dict.fromkeys((1, per_call)):
        runs[f"fit, {steps} step{'s' * (steps > 1)}/call"] = (
            steps, lambda steps=steps: _training.time_fit(
                config, task, warmup, steps))
    if keras.backend.backend() == "jax" and per_call > 1:
        # Keras 3.15.1 loops over one compiled step per batch on JAX;
        # `scan_train_steps` makes the call one compiled `lax.scan`.
        runs[f"fit, {per_call} steps/call, scanned"] = (
            per_call, lambda: _training.time_fit(
                config, task, warmup, per_call, scan=True))
    if diagnostics_every is not None:
        diagnosed = config.replace(diagnostics_every=diagnostics_every)
        runs[DIAGNOSED] = (steps_per_call(diagnosed), lambda: (
            _training.time_trainer(
                diagnosed, warmup,
                [_training.timed_diagnostics(durations)])))
    return runs


def weight_difference(weights, reference):
    """max |weights - reference| over max |reference|, over all arrays."""
    top = max(float(np.max(np.abs(r))) for r in reference)
    return max(float(np.max(np.abs(np.asarray(w) - r)))
               for w, r in zip(weights, reference)) / max(top, 1e-30)


# ------------------------------------------------------------- report
def _spread(values, digits=2):
    """`median (min-max)` of `values`, or the one value."""
    text = f"{statistics.median(values):.{digits}f}"
    if len(values) > 1:
        text += f" ({min(values):.{digits}f}-{max(values):.{digits}f})"
    return text


def _per_step_ms(timings, clock):
    return [1e3 * getattr(t, clock) / t.steps for t in timings]


def results_table(names, timings, per_call, ratios, weights, tokens,
                  flops_per_token, matmul):
    """The main table: one row per variant and the data stream's row."""
    rows = []
    for name in names:
        wall = _per_step_ms(timings[name], "wall_s")
        tokens_per_second = tokens * 1e3 / statistics.median(wall)
        rows.append([
            name, per_call.get(name, "-"), _spread(wall),
            _spread(_per_step_ms(timings[name], "cpu_s")),
            _spread(ratios["wall"][name]) if name in ratios["wall"] else "-",
            _spread(ratios["cpu"][name]) if name in ratios["cpu"] else "-",
            (f"{max(weights[name]):.0e}" if name in weights else "-"),
            (_spread([t.start_s for t in timings[name]], 1)
             if name != DATA else "-"),
            (f"{100 * tokens_per_second * flops_per_token / matmul:.1f}%"
             if name != DATA else "-"),
        ])
    return _bench.text_table(
        ["trainer", "steps/call", "wall ms/step", "CPU ms/step",
         "vs ours wall", "vs ours CPU", "weights vs ours", "start s",
         "MFU"], rows, header_justify="left")


def diagnostics_table(every, durations, timings, warmup, last):
    """The diagnostics' cost; returns `(table, overhead)`."""
    # The trainer diagnoses after its log at a step; the call at `warmup`
    # falls inside the timed steps, the call at the last step after them.
    inside = sum(step % every == 0 for step in range(warmup, last))
    step_time = statistics.median(
        [t.wall_s / t.steps for t in timings[OURS]])
    # The mean, not the median: calls that also draw the Images tab's heat
    # maps (every `heatmap_every` steps) cost more, and they are part of it.
    call = statistics.mean(durations)
    overhead = call / (every * step_time + call)
    slower = {clock: statistics.median(
        [d / o for d, o in zip(
            [getattr(t, clock) for t in timings[DIAGNOSED]],
            [getattr(t, clock) for t in timings[OURS]])]) - 1.0
        for clock in ("wall_s", "cpu_s")}
    table = _bench.text_table(
        [f"diagnostics (every {every} steps)", "value"],
        [
            ["seconds per call (mean of calls after a run's first)",
             f"{call:.3f} ({len(durations)} calls)"],
            [f"{every} steps", f"{every * step_time:.3f} s"],
            [f"throughput lost at diagnostics_every={every}",
             f"{100 * overhead:.1f}%"],
            [f"{last - warmup} timed steps with {inside} calls vs "
             "without (wall, CPU)",
             f"{100 * slower['wall_s']:+.1f}%, "
             f"{100 * slower['cpu_s']:+.1f}%"],
        ], header_justify="left")
    return table, overhead


def _range_over_median(values):
    return (max(values) - min(values)) / statistics.median(values)


def _verdict(ratios, noise):
    """"met" / "NOT met" for ratios of fit's steps/s over ours, flagged
    when the gap to the goal is within the noise."""
    median = statistics.median(ratios)
    text = "met" if median >= GOAL_FIT else "NOT met"
    if abs(median - GOAL_FIT) <= noise:
        text += ", within the noise"
    return text


def main(argv=None):
    args = parse_args(argv)
    if args.threads is not None and keras.backend.backend() == "jax":
        _bench.fail(PROG, "--threads is not for JAX: set XLA_FLAGS before "
                    "start-up (--xla_cpu_multi_thread_eigen=false "
                    "intra_op_parallelism_threads=1 for one)", status=2)
    _bench.setup_tensorflow(PROG, args.threads,
                            ("tensorflow", "jax", "torch"))
    config, task = _training.resolved_config(PROG, bench_settings(args))
    config = config.replace(**_training.quiet_run_settings(config.steps))
    # The trainer's own resolution of "auto", so that fit compiles alike.
    config, _ = open_run_devices(config)
    warmup = timed_warmup(args, config.log_every)
    per_call = fit_steps_per_call(args, config)
    steps = config.steps - warmup
    tokens = config.batch_size * task.seq_len
    flops_per_token = _bench.model_flops_per_token(config, task)

    print(f"task {config.task}: batch {config.batch_size} x seq_len "
          f"{task.seq_len} = {tokens} tokens/step; d_model "
          f"{config.d_model}, layers {config.num_layers}, heads "
          f"{config.num_heads}, key_dim {config.key_dim}, ff "
          f"{4 * config.d_model if config.ff_dim is None else config.ff_dim}"
          f"; optimizer {config.optimizer}; jit_compile {config.jit_compile} "
          f"for both; {steps} timed steps after {warmup}, {args.rounds} "
          f"rounds; Keras {keras.__version__} on {config.backend}, "
          f"{os.cpu_count()} CPU(s), threads "
          f"{'default' if args.threads is None else args.threads}")
    print(f"model FLOPs/token (fwd+bwd matmuls): {flops_per_token:,.0f}")
    matmul = _bench.measure_matmul_flops(args.matmul_size)

    durations = []
    runs = variants(config, task, warmup, per_call,
                    None if args.no_diagnostics else args.diagnostics_every,
                    durations)
    names = list(runs)
    timings = {name: [] for name in names + [DATA]}
    ratios = {"wall": {name: [] for name in names},
              "cpu": {name: [] for name in names}}
    weights = {name: [] for name in names}
    for index in range(args.rounds):
        trained = {}
        calls = len(durations)
        for name in _bench.round_order(names, index, "reverse"):
            timing, model = runs[name][1]()
            timings[name].append(timing)
            trained[name] = model.get_weights()
            del model
            print(f"  round {index + 1}: {name}: "
                  f"{1e3 * timing.wall_s / timing.steps:.2f} ms/step wall, "
                  f"{1e3 * timing.cpu_s / timing.steps:.2f} CPU; start "
                  f"{timing.start_s:.1f} s", flush=True)
        # The first call of a run traces the probe.
        del durations[calls:calls + 1]
        timings[DATA].append(_training.time_data(config, task, warmup))
        ours = timings[OURS][-1]
        for name in names:
            for clock, field in (("wall", "wall_s"), ("cpu", "cpu_s")):
                ratios[clock][name].append(
                    getattr(ours, field) / getattr(timings[name][-1], field))
            weights[name].append(
                weight_difference(trained[name], trained[OURS]))
    # The peak is the best the machine showed while it was shared.
    matmul = max(matmul, _bench.measure_matmul_flops(args.matmul_size))
    print(f"best {args.matmul_size}x{args.matmul_size} float32 matmul: "
          f"{matmul / 1e9:.1f} GFLOP/s")

    print()
    print(results_table(names + [DATA], timings,
                        {name: runs[name][0] for name in names}, ratios,
                        weights, tokens, flops_per_token, matmul))
    overhead = None
    if DIAGNOSED in runs and durations:
        table, overhead = diagnostics_table(
            args.diagnostics_every, durations, timings, warmup,
            config.steps)
        print()
        print(table)

    # Ours against itself: how far apart identical runs land.
    noise = {clock: _range_over_median(_per_step_ms(timings[OURS], field))
             for clock, field in (("wall", "wall_s"), ("cpu", "cpu_s"))}
    best_fit = f"fit, {per_call} step{'s' * (per_call > 1)}/call"
    print()
    for clock in ("wall", "cpu"):
        values = ratios[clock][best_fit]
        print(f"goal {best_fit} >= {GOAL_FIT}x ours (steps/s, {clock} "
              f"clock): {_spread(values)} "
              f"({_verdict(values, noise[clock])}; ours' own spread "
              f"{100 * noise[clock]:.0f}%)")
    if overhead is not None:
        met = overhead <= GOAL_DIAGNOSTICS_OVERHEAD
        print(f"goal diagnostics cost <= "
              f"{100 * GOAL_DIAGNOSTICS_OVERHEAD:.0f}%: "
              f"{100 * overhead:.1f}% ({'met' if met else 'NOT met'})")
    print(json.dumps({
        "timed_steps": steps,
        "steps_per_call": {name: runs[name][0] for name in names},
        "wall_ms_per_step": {name: _per_step_ms(timings[name], "wall_s")
                             for name in timings},
        "cpu_ms_per_step": {name: _per_step_ms(timings[name], "cpu_s")
                            for name in timings},
        "start_s": {name: [t.start_s for t in timings[name]]
                    for name in names},
        "vs_ours": ratios,
        "weights_vs_ours": weights,
        "tokens_per_s": {name: [tokens * 1e3 / ms for ms in
                                _per_step_ms(timings[name], "wall_s")]
                         for name in names},
        "matmul_flops_per_s": matmul,
        "flops_per_token": flops_per_token,
        "diagnostics_call_s": durations,
        "diagnostics_overhead": overhead,
        "fit_vs_ours": statistics.median(ratios["wall"][best_fit]),
        "noise": noise,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
