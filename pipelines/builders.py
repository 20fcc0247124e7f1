"""The task, the model, the optimizer and its schedule of a resolved
`TrainConfig`, built from its settings as they are (none validates again).
"""

import math
import sys

import keras

from keras_attention.models import build_sequence_model
from keras_attention.tasks import make_task


def build_task(config):
    """The `keras_attention.tasks.SequenceTask` of a resolved config."""
    return make_task(config.task, **config.task_options())


def seed_run(seed):
    """`keras.utils.set_random_seed(seed)`, without importing TensorFlow into
    a JAX or torch run."""
    # Keras seeds TensorFlow too whenever it is installed; importing it
    # cost about 3 s and printed its C++ start-up lines on stderr. Refused
    # for this call, Keras then remembers TensorFlow as absent, which a run
    # fed numpy batches never needs.
    if keras.backend.backend() == "tensorflow" or "tensorflow" in sys.modules:
        keras.utils.set_random_seed(seed)
        return
    sys.modules["tensorflow"] = None  # `import tensorflow` raises ImportError.
    try:
        keras.utils.set_random_seed(seed)
    finally:
        del sys.modules["tensorflow"]


def build_probe_batch(config, task):
    """The diagnostics probe batch `(tokens, targets, sample_weight)`: the
    first `probe_size` held-out examples, the same in every run of a seed."""
    heldout = task.heldout(config.heldout_size, config.seed)
    return tuple(array[: config.probe_size] for array in heldout)


def build_model(config, task=None):
    """The config's functional model from `tokens` to float32 `logits`: the
    task's sizes (`task` if already built), the config's `"model"` group as
    `build_sequence_model`'s keywords and its `"attention"` group as the
    `attention_options` of every attention layer. The weights come from the
    global random state (`seed_run` first for reproducible ones)."""
    task = build_task(config) if task is None else task
    return build_sequence_model(
        vocab_size=task.vocab_size,
        seq_len=task.seq_len,
        num_classes=task.num_classes,
        token_factors=task.token_factors,
        name=f"{config.task}_model",
        attention_options=config.group("attention"),
        **config.group("model"),
    )


# Kept rather than Keras' `CosineDecay(warmup_target=...)`: that warms up
# as `step / warmup_steps`, so the first update (step 0) gets rate 0 and is
# wasted. This schedule uses `(step + 1) / warmup_steps`, the fix nanoGPT
# made (dc81cb36), and reaches the peak on update `warmup_steps`.
@keras.saving.register_keras_serializable(package="keras_attention")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to `peak`, then constant or cosine decay to 0.

    The rate of update `i` (0 for the first) during warmup is
    `peak * (i + 1) / warmup_steps`.

    Args:
        peak: learning rate after warmup: a float, or a scalar variable
            (read at every step, so a compiled step can be reused with a
            new rate).
        warmup_steps: number of warmup updates (0 for none).
        total_steps: length of the run (the cosine reaches 0 there).
        decay: `"constant"` or `"cosine"`.
    """

    def __init__(self, peak, warmup_steps, total_steps, decay="constant"):
        self.peak = peak if isinstance(peak, keras.Variable) else float(peak)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.decay = decay

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        rate = keras.ops.cast(self.peak, "float32")
        if self.decay == "cosine":
            span = float(max(self.total_steps - self.warmup_steps, 1))
            progress = keras.ops.clip((step - self.warmup_steps) / span, 0, 1)
            rate = rate * 0.5 * (1.0 + keras.ops.cos(math.pi * progress))
        if self.warmup_steps > 0:
            ramp = keras.ops.minimum((step + 1.0) / self.warmup_steps, 1.0)
            rate = rate * ramp
        return rate

    def get_config(self):
        return {
            "peak": float(keras.ops.convert_to_numpy(self.peak)),
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "decay": self.decay,
        }


def build_optimizer(config, num_replicas=1, learning_rate=None):
    """`(optimizer, schedule)`: the config's Keras optimizer (a
    `LossScaleOptimizer` under `mixed_float16`) and its warmup schedule.
    `learning_rate`, when given, is a scalar variable holding the peak rate
    in place of `config.learning_rate` (a sweep assigns it between runs)."""
    schedule = WarmupSchedule(
        config.learning_rate if learning_rate is None else learning_rate,
        config.warmup_steps, config.steps, config.lr_schedule)
    # Clipping is by global norm. Under several replicas the step hands the
    # optimizer each replica's share `g / num_replicas` of the global
    # gradient (the optimizer sums the shares): the norm is scaled alike.
    clip = None
    if config.clip_norm is not None:
        clip = config.clip_norm / num_replicas
    weight_decay = config.weight_decay or None
    if config.optimizer == "sgd":
        optimizer = keras.optimizers.SGD(
            schedule, momentum=config.momentum, weight_decay=weight_decay,
            global_clipnorm=clip)
    elif config.optimizer == "adam":
        optimizer = keras.optimizers.Adam(
            schedule, weight_decay=weight_decay, global_clipnorm=clip
        )
    else:
        optimizer = keras.optimizers.AdamW(
            schedule, weight_decay=config.weight_decay, global_clipnorm=clip
        )
    if config.precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer, schedule
