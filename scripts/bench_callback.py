"""The cost of `AttentionMonitor` in `model.fit`: fit with the callback over
fit without it, in one run, on the Keras backend `--backend` names.

The default model is the recall task's `build_sequence_model` at the
training pipeline's defaults (`keras-attention train --task recall`: 1
layer, 1 head, d_model 64, key_dim 64, batch 64), compiled with Adam and
sparse categorical cross-entropy from logits as the pipeline trains it, fed
the task's own batches from memory. The callback logs its default
`update_freq=100` with `(x, y)` examples (the pipeline's 16-example probe
batch, so the gradient statistics are on) and no heat-map images.

One model is fitted `--rounds` times each way, one epoch of `--steps`
batches per fit, alternating with and without the callback (in reversed
order every other round). A first fit each way, untimed, compiles the train
step and the callback's probe (the callback keeps its compiled probe for the
next fit of the same model); its ratio is printed too, as `first fit`.
Besides, the wall time spent inside the callback's hooks, per fit and as a
share of a fit without it: the callback's own work, which a busy machine
disturbs far less than the ratio. The ratio is that of the medians of the
timed fits' times, on this
process's CPU time by default (`--clock wall` for elapsed time: on a shared
machine its noise, +-50% between identical fits, hid the callback).

Measured on a 2-core CPU shared with other jobs, 1000 steps, 3 rounds, CPU
clock (the table in `keras_attention/callbacks.py`): ratio 1.016 on
TensorFlow, 1.074 on JAX (1.028 and 0.948 in earlier runs), 0.937 on torch;
inside the callback 1.4%, 1.8% and 0.5% of a fit.

Usage:

    python scripts/bench_callback.py --backend jax
    python scripts/bench_callback.py --steps 2000 --rounds 7 --clock wall

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
    _bench.add_flag(parser, "--update-freq", 100, "the callback's update_freq")
    parser.add_argument("--clock", choices=sorted(_bench.CLOCKS),
                        default="cpu",
                        help="cpu (default): this process's CPU time, which "
                        "other jobs on a shared machine disturb far less; "
                        "wall: elapsed time")
    args = parser.parse_args(argv)
    config = resolve_config([Layer(PROG, {"task": "recall"})])
    task = build_task(config)
    keras.utils.set_random_seed(config.seed)
    model = build_model(config, task)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    batches = task.batches(config.batch_size, config.seed)
    data = [next(batches) for _ in range(args.steps)]
    x, y, weight = (np.concatenate(parts) for parts in zip(*data))
    tokens, targets, _ = build_probe_batch(config, task)
    with tempfile.TemporaryDirectory() as log_dir:
        monitor = _TimedMonitor(log_dir, (tokens, targets),
                                   update_freq=args.update_freq)

        clock = _bench.CLOCKS[args.clock]

        def fit(callbacks):
            start = clock()
            model.fit(x, y, sample_weight=weight,
                      batch_size=config.batch_size, epochs=1, verbose=0,
                      shuffle=False, callbacks=callbacks)
            return clock() - start

        first = {"with": fit([monitor]), "without": fit([])}
        times = {"with": [], "without": []}
        monitor.seconds, wall = 0.0, []
        for round_ in range(args.rounds):
            order = ("with", "without") if round_ % 2 == 0 else (
                "without", "with")
            for name in order:
                start = time.perf_counter()
                times[name].append(fit([monitor] if name == "with" else []))
                if name == "without":
                    wall.append(time.perf_counter() - start)
    with_, without = (statistics.median(times[name])
                      for name in ("with", "without"))
    print(f"backend {keras.backend.backend()}, recall model, "
          f"{args.steps} steps of {config.batch_size}, update_freq "
          f"{args.update_freq}, {args.clock} clock, median of {args.rounds}: "
          f"fit {without:.2f} s without, {with_:.2f} s "
          f"with the callback; ratio {with_ / without:.3f} "
          f"(first fit, compiling: {first['with'] / first['without']:.3f}); "
          f"inside the callback {monitor.seconds / args.rounds:.3f} s a "
          f"fit, {100 * monitor.seconds / sum(wall):.1f}% of a fit without "
          f"it (wall)")


if __name__ == "__main__":
    main()
