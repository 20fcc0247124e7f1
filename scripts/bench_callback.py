"""The cost of `AttentionMonitor` in `model.fit`: fit with the callback over
fit without it, in one run, on the Keras backend `--backend` names.

The default model is the recall task's `build_sequence_model` at the
training pipeline's defaults (`keras-attention train --task recall`: 1
layer, 1 head, d_model 64, key_dim 64, batch 64), compiled with Adam and
sparse categorical cross-entropy from logits as the pipeline trains it, fed
the task's own batches from memory. The callback logs its default
`update_freq=100` with `(x, y)` examples (the pipeline's 16-example probe
batch, so the gradient statistics are on) and no heat-map images.

One model is fitted `--rounds` times in each of three arms, one epoch of
`--steps` batches per fit, interleaved (in reversed order every other
round): without the callback, with it, and with it timed inside its hooks
(a subclass whose hooks first wait for JAX's queued batches, so that their
time is the callback's own work; that wait disturbs JAX's pipelining, so
this arm is kept out of the ratio). A first fit of each arm, untimed,
compiles the train step and the callback's probe (the callback keeps its
compiled probe for the next fit of the same model); its ratio is printed
too, as `first fit`. Every fit is timed on both clocks, wall
(`time.perf_counter`) and this process's CPU time (`time.process_time`,
which other jobs on a shared machine disturb far less); the ratio is that
of the medians. `--steps-per-execution` compiles the model with that many
batches a call, as a user would on an accelerator; `--num-layers` and
`--probe-size` make the probed model and batch bigger.

Measured on 2 idle CPU cores (2026-12-04), 1000 steps, 3 rounds (the
table in `keras_attention/callbacks.py`): with / without 1.127 wall and
0.934 CPU on TensorFlow (1.084 and 0.992 over 500 steps, 5 rounds), 0.938
and 0.931 on JAX, 1.017 and 1.018 on torch; inside the hooks 0.5%, 0.5%
and 0.8% of a fit.

Usage:

    python scripts/bench_callback.py --backend jax
    python scripts/bench_callback.py --steps 2000 --rounds 7
    python scripts/bench_callback.py --num-layers 4 --probe-size 32 \
        --steps-per-execution 10

Bad arguments exit with status 2 and one line on stderr.
"""

import statistics
import tempfile
import time

import _bench  # noqa: F401  (first: backend, log level, sys.path)
import keras
import numpy as np

from keras_attention import AttentionMonitor
from pipelines.builders import build_model
from pipelines.builders import build_probe_batch
from pipelines.builders import seed_run
from pipelines.builders import build_task
from pipelines.settings import Layer
from pipelines.settings import resolve_config

PROG = "bench_callback.py"
_HOOKS = ("on_train_begin", "on_train_batch_begin", "on_epoch_end",
          "on_train_end")


class _TimedMonitor(AttentionMonitor):
    """`AttentionMonitor` that adds the wall time spent in its hooks to
    `self.seconds` (a steadier figure than the ratio on a busy machine: it
    counts only the callback's own work)."""

    seconds = 0.0


def _drain(model):
    """Waits for the batches JAX has queued: JAX dispatches steps ahead of
    their computation, and the probe's first read of the weights would
    otherwise count their time as the callback's (0.2-0.45 s a probe
    before, 12 ms once drained, on the recall model)."""
    state = getattr(model, "_jax_state", None)
    if keras.backend.backend() == "jax" and state:
        import jax

        # A list: Keras's tracked list is no pytree (its arrays would be
        # one leaf, not waited for).
        jax.block_until_ready(list(state.get("trainable_variables") or []))


def _timed(name):
    def hook(self, *args, **kwargs):
        _drain(self._model)
        start = time.perf_counter()
        try:
            return getattr(AttentionMonitor, name)(self, *args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start

    return hook


for _name in _HOOKS:
    setattr(_TimedMonitor, _name, _timed(_name))


def main(argv=None):
    parser = _bench.parser(PROG, __doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("tensorflow", "jax", "torch"),
                        help="Keras backend (default: KERAS_BACKEND)")
    _bench.add_flag(parser, "--steps", 1000, "batches per fit")
    _bench.add_flag(parser, "--rounds", 5, "timed fits each way")
    _bench.add_flag(parser, "--update-freq", 100,
                    "the callback's update_freq")
    _bench.add_flag(parser, "--steps-per-execution", 1,
                    "the model's steps_per_execution")
    _bench.add_flag(parser, "--num-layers", 1, "attention layers (probed)")
    _bench.add_flag(parser, "--probe-size", 16, "examples probed")
    args = parser.parse_args(argv)
    config = resolve_config([Layer(PROG, {
        "task": "recall", "num_layers": args.num_layers,
        "probe_size": args.probe_size})])
    task = build_task(config)
    seed_run(config.seed)  # TensorFlow stays unimported on JAX and torch
    model = build_model(config, task)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=args.steps_per_execution,
    )
    batches = task.batches(config.batch_size, config.seed)
    data = [next(batches) for _ in range(args.steps)]
    x, y, weight = (np.concatenate(parts) for parts in zip(*data))
    tokens, targets, _ = build_probe_batch(config, task)
    with tempfile.TemporaryDirectory() as log_dir:
        monitors = {
            "with": AttentionMonitor(log_dir, (tokens, targets),
                                     update_freq=args.update_freq),
            "timed": _TimedMonitor(log_dir, (tokens, targets),
                                   update_freq=args.update_freq),
        }

        def fit(name):
            clocks = [clock() for clock in CLOCK_ORDER]
            model.fit(x, y, sample_weight=weight,
                      batch_size=config.batch_size, epochs=1, verbose=0,
                      shuffle=False,
                      callbacks=[monitors[name]] if name in monitors
                      else [])
            return [clock() - start
                    for clock, start in zip(CLOCK_ORDER, clocks)]

        first = {name: fit(name) for name in ARMS}
        times = {name: [] for name in ARMS}
        monitors["timed"].seconds = 0.0
        for round_ in range(args.rounds):
            order = ARMS if round_ % 2 == 0 else ARMS[::-1]
            for name in order:
                times[name].append(fit(name))
    print(f"backend {keras.backend.backend()}, recall model, "
          f"{args.num_layers} layer(s), {args.probe_size} examples probed, "
          f"{args.steps} steps of {config.batch_size}, "
          f"steps_per_execution {args.steps_per_execution}, update_freq "
          f"{args.update_freq}, median of {args.rounds}:")
    for index, clock in enumerate(("wall", "cpu")):
        with_, without = (statistics.median(fits[index] for fits in
                                            times[name])
                          for name in ("with", "without"))
        print(f"  {clock}: fit {without:.2f} s without, {with_:.2f} s "
              f"with the callback; ratio {with_ / without:.3f} (first "
              f"fit, compiling: "
              f"{first['with'][index] / first['without'][index]:.3f})")
    wall_without = sum(fits[0] for fits in times["without"])
    print(f"  inside the callback's hooks (a third arm, whose hooks wait "
          f"for JAX's queued batches first): "
          f"{monitors['timed'].seconds / args.rounds:.3f} s a fit, "
          f"{100 * monitors['timed'].seconds / wall_without:.1f}% of a "
          f"fit without it (wall)")


# Each fit is timed on both clocks.
CLOCK_ORDER = (_bench.CLOCKS["wall"], _bench.CLOCKS["cpu"])
# The arms, interleaved (reversed every other round): without the
# callback, with it, and with it timed inside its hooks.
ARMS = ("without", "with", "timed")


if __name__ == "__main__":
    main()
