"""Compiled models kept across the runs of a grid that share their shapes.

Built afresh, each run would trace and compile its train step, evaluation
and probe and build its optimizer: about 3.5 s a run at d_k 1024 on 2 CPU
cores (first step 2.1-2.5 s, of which tracing 0.6 s; probe 0.4 s;
evaluation 0.3 s), against 12-14 s for 1000 steps. `CompiledRuns` builds
them once per shape group; a further run resets only the model's weights
(drawn from its seed as a fresh run draws them), the optimizer's variables
(to their values after `optimizer.build`) and the peak learning rate (a
variable the schedule reads, so the step is not specialised on it). The
runs end with the weights of runs built afresh (test_engine checks it).
"""

import keras
import numpy as np

from pipelines.builders import build_model
from pipelines.builders import seed_run
from pipelines.settings import PER_RUN
from pipelines.steps import build_parts
from pipelines.steps import steps_per_call


def shape_key(config):
    """What two configs must share to train with the same compiled parts."""
    values = config.to_dict()
    return tuple((name, repr(values[name])) for name in sorted(values)
                 if name not in PER_RUN)


class CompiledRuns:
    """`reuse(config, devices, task)` for `pipelines.train.train`; counts
    its `builds` and its `reuses` (runs given an earlier run's parts)."""

    def __init__(self):
        self._key = self._parts = None
        self._learning_rate = self._optimizer_start = None
        self.builds = self.reuses = 0

    def __call__(self, config, devices, task):
        # Cosine and warmup schedules bake `steps` into the schedule: only a
        # constant schedule without warmup may change `steps` between runs.
        fixed = config.lr_schedule == "constant" and config.warmup_steps == 0
        key = shape_key(config) + (
            ("schedule_steps", None if fixed else config.steps),
            # Compiled into `fit`'s train function.
            ("steps_per_call", steps_per_call(config)))
        if config.backend == "jax":
            # jax.jit reads a variable outside the stateless state (the
            # peak rate) once, when it traces: a new rate needs a new trace.
            key += (("learning_rate", config.learning_rate),)
        if key != self._key:
            return self._build(key, config, devices, task)
        parts = self._parts
        seed_run(config.seed)
        with devices.scope():
            # The same draws, in the same order, as `build_parts` makes.
            initial = build_model(config, task)
        parts.model.set_weights(initial.get_weights())
        del initial
        for variable, value in zip(parts.optimizer.variables,
                                   self._optimizer_start):
            variable.assign(value)
        self._learning_rate.assign(float(config.learning_rate))
        # `fit` keeps the model's compiled train and test functions.
        self.reuses += 1
        return parts

    def _build(self, key, config, devices, task):
        self._parts = None
        # Drop the graph state of the previous shape group.
        keras.backend.clear_session()
        with devices.scope():
            self._learning_rate = keras.Variable(
                float(config.learning_rate), dtype="float32",
                trainable=False, name="peak_learning_rate")
        parts = build_parts(config, devices, task, self._learning_rate)
        self._optimizer_start = [
            np.array(keras.ops.convert_to_numpy(variable))
            for variable in parts.optimizer.variables]
        self._key, self._parts = key, parts
        self.builds += 1
        return parts
