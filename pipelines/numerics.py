"""Numbers that are not finite: refusing, before the first step, a model
whose start is not finite, and the line that ends a diverged run.

Every setting that shapes the attention scores at initialisation
(`--scale`, `--qk-init-std`, `--qk-init-gain`) is a positive number up to
float32's largest, and each is fine alone at ordinary values; what
overflows is their product with the model's sizes and the dtype policy
(`--qk-init-gain 1e30` and `--scale 3.4e38` make the scores inf and the
softmax NaN, which ended in a traceback from the dashboard writer). No fixed
bound on one flag says when: the forward pass of the initial model on the
probe batch does, before anything is written.
"""

import os

import keras
import numpy as np

from pipelines.checkpoints import CHECKPOINT_DIR
from pipelines.checkpoints import last_checkpointed_step
from pipelines.common import UsageError
from pipelines.settings import flag

# The settings that set the scores' magnitude at initialisation.
INIT_SETTINGS = ("scale", "qk_init_std", "qk_init_gain")


def check_finite_start(config, model, tokens):
    """Raises `UsageError` when `model`'s outputs on `tokens` are not finite.

    Args:
        config: the run's `TrainConfig`, whose init settings the message
            names (those given, else all of them).
        model: the run's model with its initial weights (a host copy).
        tokens: a batch of inputs (the probe batch's tokens).

    Raises:
        UsageError: one line naming the settings and their values.
    """
    outputs = keras.ops.convert_to_numpy(model(tokens, training=False))
    if np.all(np.isfinite(outputs)):
        return
    given = [name for name in INIT_SETTINGS
             if config.sources.get(name, "default") != "default"]
    named = ", ".join(f"{flag(name)} {getattr(config, name)}"
                      for name in given or INIT_SETTINGS)
    raise UsageError(
        f"{named}: the model's outputs at initialisation are not finite "
        f"(the attention scores overflow {config.precision}); lower "
        f"{' or '.join(flag(name) for name in given or INIT_SETTINGS)}"
    )


def diverged_line(config, step):
    """The one line of a run that stopped at `step` on a non-finite loss:
    what to lower, and the last good checkpoint it kept (checkpoints of
    non-finite weights are never saved)."""
    kept = last_checkpointed_step(os.path.join(config.logdir, CHECKPOINT_DIR))
    return (
        f"the loss became non-finite at step {step}; lower --learning-rate"
        + (" or --weight-decay" if config.weight_decay else "")
        + " or set --clip-norm"
        + ("" if kept is None else f" (last good checkpoint: step {kept})")
    )
