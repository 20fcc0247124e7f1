"""Numbers that are not finite: refusing a model whose start is not finite,
and the line that ends a diverged run.

The settings that shape the initial scores (`--scale`, `--qk-init-std`,
`--qk-init-gain`) are each fine alone; what overflows is their product with
the model's sizes and dtype (`--qk-init-gain 1e30` and `--scale 3.4e38`
made the softmax NaN and ended in a traceback from the dashboard writer).
No bound on one flag says when: the initial model's forward pass does.
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
    """Raises `UsageError`, one line naming the init settings given (else
    all of them), when the initial `model`'s outputs on `tokens` are not
    finite."""
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
    what to lower, and the last good checkpoint kept."""
    kept = last_checkpointed_step(os.path.join(config.logdir, CHECKPOINT_DIR))
    return (
        f"the loss became non-finite at step {step}; lower --learning-rate"
        + (" or --weight-decay" if config.weight_decay else "")
        + " or set --clip-norm"
        + ("" if kept is None else f" (last good checkpoint: step {kept})")
    )
