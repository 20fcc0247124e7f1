"""The probe diagnostics of a run's weights, at init or trained."""

import keras

from keras_attention.diagnostics import probe_diagnostics
from pipelines.builders import build_model
from pipelines.builders import build_probe_batch
from pipelines.builders import build_task
from pipelines.builders import seed_run
from pipelines.devices import probe_precision
from pipelines.run_dir import restore_model


def probe_at_init(config):
    """`probe_diagnostics` of a run's initial weights, without training:
    the model rebuilt as training builds it (global seed, then build, under
    the run's dtype policy)."""
    task = build_task(config)
    previous_policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy(probe_precision(config))
    try:
        seed_run(config.seed)
        model = build_model(config, task)
        return probe_diagnostics(model, *build_probe_batch(config, task))
    finally:
        keras.config.set_dtype_policy(previous_policy)
        clear_session()


def probe_trained(config):
    """The probe diagnostics of a finished run's trained model."""
    model = restore_model(config.logdir)
    try:
        return probe_diagnostics(
            model, *build_probe_batch(config, build_task(config))
        )
    finally:
        del model
        clear_session()


def clear_session():
    """Resets Keras's global state between probed models without the full
    garbage collection: with TensorFlow one took 0.26 s of CPU, 5.9 s of
    the default comparison's 22 probes (cProfile); Python's own collector
    reclaims the dropped models."""
    keras.backend.clear_session(free_memory=False)
