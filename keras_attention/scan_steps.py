"""Many training steps in one compiled call for `Model.fit` on JAX.

With `steps_per_execution=N`, TensorFlow runs the N steps inside one graph
call; Keras 3.15.1 on JAX runs them as a Python loop over one jitted step
(`keras/src/backend/jax/trainer.py`, `JAXTrainer._make_function`): one
dispatch a step. For a model that needs microseconds a step, that dispatch
is the step: 1.70 ms a step on an H200 for the recall model (an MFU of
0.2%, `shared/gpu/2026-12-04/README.md`).

`scan_train_steps(model)` gives the model a train function that runs the N
steps of a `fit` call as one `jax.lax.scan` in one `jax.jit`: the N batches
go in together, the model's state (trainable, non-trainable, optimizer and
metric variables) is the scan's carry, and the logs are those of the last
step, as Keras's loop returns them. `fit` itself is Keras's, unchanged:
its callbacks see the same `begin_step`/`end_step` and logs.

This module goes when a Keras release has the same (keras-team/keras PR
#23527, merged after 3.15.1): `keras_scans_steps()` tells it by what that
change adds (`data_adapter_utils.super_batch_iterator`), and then
`scan_train_steps` leaves the model to Keras.

JAX is imported inside the functions: the module is imported on every
backend.
"""

import itertools

import keras
import numpy as np


def keras_scans_steps():
    """Whether the installed Keras runs `steps_per_execution` steps in one
    compiled call on JAX itself.

    Keras's own change (PR #23527) adds `super_batch_iterator` to
    `keras.src.trainers.data_adapters.data_adapter_utils` (its batches of
    batches); Keras 3.15.1 has none. Feature detection rather than a
    version number: the release that ships it is not known yet.
    """
    from keras.src.trainers.data_adapters import data_adapter_utils

    return hasattr(data_adapter_utils, "super_batch_iterator")


def scan_train_steps(model):
    """Runs `model`'s `steps_per_execution` steps of `fit` in one call.

    On JAX with `steps_per_execution > 1` and a compiled train step
    (`jit_compile` on, not `run_eagerly`), `fit`'s train function becomes
    one `jax.jit` of a `jax.lax.scan` of `model.train_step` over the
    chunk's batches, traced once per batch shape: one dispatch per chunk
    instead of one per step. The data (arrays, a generator) are read as
    Keras reads them, by its epoch iterator. A chunk
    that is short (the data ran out, or the epoch's steps are not a
    multiple of `steps_per_execution`) or whose batches differ in shape
    (a last, smaller batch) runs step by step, as Keras's own loop runs
    it, so every batch trains.

    Nothing changes on TensorFlow (whose graph already loops) or torch
    (where Keras refuses more than one step per call), with one step per
    call, with `jit_compile=False` or `run_eagerly=True`, with Flax NNX
    enabled, or with a Keras that does the same itself
    (`keras_scans_steps()`). The choice is made each time `fit` builds
    its train function, so a later `compile` (another
    `steps_per_execution`) is followed. With a `keras.distribution` set
    (`DataParallel`), the scanned call keeps the state's shardings, as
    Keras's jitted step does (`out_shardings`), over the batches Keras's
    epoch iterator distributed (tested on two host devices; a
    `ModelParallel` layout is not).

    The weights after a `fit` are those of Keras's loop (bit for bit on
    the CPU here; XLA may fuse the scanned step otherwise elsewhere, a
    float32 rounding), and so are the logs, the history and the
    callbacks' batch indices; callbacks run between chunks, as under
    Keras's loop. What it costs: a second compilation where a chunk runs
    step by step (Keras's step, beside the scan), and the chunk's
    batches stacked on the device at once.

    Measured on the 2-core CPU shared with other jobs (load average 3.3
    to 4.2), 2026-12-04, Keras 3.15.1, JAX 0.10.2: the recall model at
    the pipeline's defaults (1 layer, d_model 64, key_dim 64, batch 64 x
    17 tokens, SGD), `jit_compile=True`, 7 rounds of a 300-step `fit`
    each after a 100-step warm-up, fed pre-drawn batches: 13.3 ms a step
    at `steps_per_execution=1`, 13.2 at 10 with Keras's loop, 10.4 at 10
    scanned (medians; the rounds' wall times moved 1.5-2x with the other
    jobs); within each round the scanned fit took 0.81 of the time of
    Keras's loop at 10 (0.78-0.85; CPU time 0.84, 0.79-0.95), and the
    weights after the 2,200 steps were those of 1 step a call, bit for
    bit. On the H200 a step of this model is the dispatch (1.70 ms), the
    cost the scan takes out; not measured there yet.

    Example:

    ```python
    model = build_sequence_model(vocab_size=16, seq_len=8, num_classes=16)
    model.compile("adam", "sparse_categorical_crossentropy",
                  steps_per_execution=10)
    scan_train_steps(model).fit(x, y, batch_size=32)
    ```

    Args:
        model: a `keras.Model`, compiled or not (the train function is made
            when `fit` runs).

    Returns:
        `model`, whose `make_train_function` is replaced on the instance
        (calling this twice changes nothing more).
    """
    if not isinstance(model, keras.Model):
        raise ValueError(
            f"model must be a keras.Model; received "
            f"{type(model).__name__}")
    if keras.backend.backend() != "jax" or model.__dict__.get(
            "_scan_train_steps", False):
        return model
    keras_make = model.make_train_function

    def make_train_function(force=False):
        if model.train_function is not None and not force:
            return
        if not _scans(model):
            keras_make(force)
            return
        model.train_function = ScanTrainFunction(model)

    model.make_train_function = make_train_function
    model._scan_train_steps = True
    return model


def _scans(model):
    return (model.steps_per_execution > 1
            and model.jit_compile and not model.run_eagerly
            and not keras.config.is_nnx_enabled()
            and not keras_scans_steps())


class ScanTrainFunction:
    """`fit`'s train function for `model`: `(state, iterator) -> (logs,
    state)`, as Keras's, reading up to `model.steps_per_execution` batches
    from `iterator` and training on each.

    `traces` counts the traces of the scanned call (tests read it).
    """

    def __init__(self, model):
        import jax

        self.model = model
        self.steps = model.steps_per_execution
        self.traces = 0
        out_shardings = None
        if keras.distribution.distribution() is not None:
            # As Keras's own jitted step: the state keeps its layout.
            out_shardings = (None, model._get_state_sharding_spec())
        self._scan = jax.jit(self._scan_steps, donate_argnums=0,
                             out_shardings=out_shardings)
        # Keras's jitted step, for the chunks that are not scanned.
        self._step = jax.jit(model.train_step, donate_argnums=0,
                             out_shardings=out_shardings)

    def __call__(self, state, iterator):
        batches = list(itertools.islice(iterator, self.steps))
        if not batches:
            # As Keras's loop: its `fit` catches the end of the data.
            raise StopIteration
        if len(batches) == self.steps and _same_shapes(batches):
            return self._scan(state, tuple(batches))
        for batch in batches:
            logs, state = self._step(state, batch)
        return logs, state

    def _scan_steps(self, state, batches):
        import jax

        self.traces += 1

        def step(state, batch):
            logs, state = self.model.train_step(state, batch)
            return state, logs

        state, logs = jax.lax.scan(
            step, state, keras.tree.map_structure(_stack, *batches))
        return keras.tree.map_structure(lambda log: log[-1], logs), state


def _stack(*leaves):
    import jax

    if leaves[0] is None:
        return None
    return jax.numpy.stack(leaves)


def _same_shapes(batches):
    """Whether `batches` stack: the same structure, and arrays (numpy or
    JAX, not sparse) of the same shape and dtype at each place."""
    import jax

    def signature(batch):
        return [None if leaf is None else (leaf.shape, leaf.dtype)
                for leaf in keras.tree.flatten(batch)]

    for leaf in keras.tree.flatten(batches):
        if leaf is not None and not isinstance(leaf, (np.ndarray,
                                                      jax.Array)):
            return False
    try:
        for batch in batches[1:]:
            keras.tree.assert_same_structure(batches[0], batch)
    except (TypeError, ValueError):
        return False
    return all(signature(batch) == signature(batches[0])
               for batch in batches[1:])
