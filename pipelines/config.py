"""The settings of a training run: one dataclass, its layers, and resolving.

`TrainConfig` holds every setting of `keras-attention train`; its field
defaults are the common defaults. The settings of one run are resolved once,
at the edge, from layers in this order (later wins):

    dataclass defaults < TASK_DEFAULTS[task] < preset (compare only)
        < --config file < flags

Each `Layer(source, values)` holds the settings one source gave explicitly;
a value present in a layer was given, whatever it equals. `resolve_config`
merges them, derives what no layer gave (`warmup_steps` from `steps`,
`weight_decay` from `optimizer`, `logdir` from `task`) and records where each
setting came from in `config.sources`. A run stores its config in
`config.json`; `TrainConfig.from_dict(json.load(...))` rebuilds it.

Example:

```python
config = resolve_config([Layer("flags", {"task": "sort", "steps": 200})])
config.sources["key_dim"]        # "task defaults"
config.sources["warmup_steps"]   # "derived from steps"
config.validate()                # raises UsageError naming the bad flag
```
"""

import dataclasses
import os
from typing import NamedTuple, Optional, Union

import keras

from keras_attention.layer import IMPLEMENTATIONS
from keras_attention.models import NORM_MODES
from keras_attention.validation import is_int
from pipelines.backends import BACKENDS
from pipelines.common import UsageError
from pipelines.config_checks import check_setting_names
from pipelines.config_checks import check_settings
from pipelines.config_checks import check_task_name
from pipelines.config_checks import parse_init_std
from pipelines.config_checks import parse_scale
from pipelines.config_checks import text_corpus

OPTIMIZERS = ("sgd", "adam", "adamw")
LR_SCHEDULES = ("constant", "cosine")
STRATEGIES = ("auto", "default", "mirrored", "multiworker", "tpu")
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
JIT_MODES = ("auto", "on", "off")

# Options each task accepts (the others must stay None for that task).
TASK_OPTIONS = ("seq_len", "vocab_size", "min_len", "num_pairs", "num_keys",
                "num_values", "text_files", "corpus")

# Settings that suit each task: with them a default run reaches >= 99%
# held-out accuracy on a 2-core CPU in a few minutes (measured: recall 100%
# from step 600, reverse 100% from step 200, sort 99.4% at step 400). Anything
# not listed here is the dataclass default.
TASK_DEFAULTS = {
    # One-hop associative recall: the query must find its key by content,
    # which is exactly what the q.k score measures. Plain SGD with momentum
    # does not rescale updates per parameter (as Adam would), so a
    # comparison of score scales sees their raw effect on the gradients.
    "recall": dict(
        num_pairs=16,
        num_keys=64,
        num_values=16,
        d_model=64,
        num_layers=1,
        key_dim=64,
        optimizer="sgd",
        learning_rate=0.05,
        momentum=0.9,
        warmup_steps=100,
        steps=1000,
    ),
    # Reversal is positional: position i reads position T-1-i.
    "reverse": dict(
        seq_len=16,
        vocab_size=16,
        d_model=64,
        num_layers=1,
        key_dim=32,
        optimizer="adam",
        learning_rate=3e-3,
        warmup_steps=50,
        steps=600,
    ),
    # Sorting needs each output position to find the token of a given rank,
    # which takes counting over the input: two layers.
    "sort": dict(
        seq_len=16,
        vocab_size=16,
        d_model=64,
        num_layers=2,
        key_dim=32,
        optimizer="adam",
        learning_rate=3e-3,
        warmup_steps=100,
        steps=1000,
    ),
    # Copying fetches each symbol from the first half: one layer finds it
    # by position, a second helps to line the halves up.
    "copy": dict(
        seq_len=21,
        vocab_size=16,
        d_model=64,
        num_layers=2,
        key_dim=32,
        optimizer="adam",
        learning_rate=3e-3,
        warmup_steps=100,
        steps=1000,
    ),
    # Causal, by character: 2.39 bits/char (unigram 4.56) in 600 steps; README.
    "text": dict(seq_len=128, d_model=128, num_layers=4, num_heads=4,
                 key_dim=32, causal=True, learning_rate=3e-3, steps=600,
                 warmup_steps=60, batch_size=32, probe_size=32),
}

# Fields that may differ between a run and its resumption: they change how
# the run is executed or reported, never its trajectory. `steps` is not one
# of them: it sets the length of the cosine schedule (a 20-step run
# continued to 40 ended at held-out loss 2.98989, a fresh 40-step run at
# 2.99765), so a run keeps the steps it started with.
RUNTIME_FIELDS = (
    "eval_every", "diagnostics_every", "heatmap_every",
    "checkpoint_every", "log_every", "target_accuracy", "strategy",
    "jit_compile", "logdir", "export", "verbose",
)


# The settings with a fixed set of values, in the order they are checked.
CHOICES = {
    "optimizer": OPTIMIZERS,
    "lr_schedule": LR_SCHEDULES,
    "norm": NORM_MODES,
    "backend": BACKENDS,
    "strategy": STRATEGIES,
    "precision": PRECISIONS,
    "jit_compile": JIT_MODES,
    "implementation": IMPLEMENTATIONS,
}


@dataclasses.dataclass
class TrainConfig:
    """Every setting of a training run.

    The defaults here are the common ones; `resolve_config` lays the task's
    (`TASK_DEFAULTS`) and the given settings over them. Field names match the
    command-line flags with `_` for `-` (`key_dim` is `--key-dim`). `None`
    is kept only for settings that are genuinely optional.

    Attributes:
        task: one of `keras_attention.tasks.TASK_NAMES`.
        seq_len, vocab_size, min_len, num_pairs, num_keys, num_values,
            text_files, corpus: task options (see `keras_attention.tasks`);
            `None` for an option the task does not take.
        train_size: the size of a fixed training pool; `None` for a fresh
            sample every step.
        d_model ... implementation: model options (see
            `keras_attention.models.build_sequence_model`). `scale` is
            one of `keras_attention.ops.SCALE_MODES` or a positive float.
        optimizer, learning_rate (the peak, after `warmup_steps` of linear
            warmup from 0), momentum (SGD), weight_decay (decoupled for
            `"adamw"`, else coupled), clip_norm (global gradient norm; `None`
            for none), lr_schedule (`"constant"` after warmup, or `"cosine"`
            decay to 0 at `steps`).
        batch_size: global batch size (all replicas together).
        steps, seed: optimizer steps; seed of the weights and the data.
        eval_every, diagnostics_every, checkpoint_every, log_every:
            intervals of held-out evaluation, attention diagnostics (also at
            step 0), checkpoints and train scalars, in steps.
        heatmap_every: interval of the heat-map images among the
            diagnostics steps (also at step 0 and the last step).
        heldout_size, probe_size: held-out examples, and how many of them
            the diagnostics probe.
        target_accuracy: `steps_to_target` in `metrics.json` is the first
            evaluated step with held-out accuracy at least this.
        backend: the Keras backend the run trains on; resolving takes the
            one Keras runs on (`KERAS_BACKEND`, `~/.keras/keras.json`, or
            `--backend`, which the command line sets before Keras is
            imported). Part of the run's identity: a run is resumed on the
            backend it started on, never continued on another.
        strategy, precision, jit_compile: devices (`"auto"`: a TPU or
            several GPUs when found; bfloat16 on TPUs, float16 on GPUs;
            XLA on accelerators). deterministic: TensorFlow op determinism.
        logdir: directory of the run (resolving derives `runs/<task>`).
        export: path to export the trained model to, or `None`.
        arm: optional label of this run in a comparison.
        verbose: 1 for a progress bar, 0 for silence.
        sources: `{setting: where its value came from}`, filled by
            `resolve_config`; not a setting, not part of `to_dict()`.
    """

    task: str = "recall"
    # Task options.
    seq_len: Optional[int] = None
    vocab_size: Optional[int] = None
    min_len: Optional[int] = None
    num_pairs: Optional[int] = None
    num_keys: Optional[int] = None
    num_values: Optional[int] = None
    text_files: Optional[list] = None
    corpus: Optional[dict] = None
    train_size: Optional[int] = None
    # Model.
    d_model: int = 64
    num_layers: int = 1
    key_dim: int = 64
    num_heads: int = 1
    value_dim: Optional[int] = None
    scale: Union[str, float] = "sqrt"
    qk_norm: bool = False
    causal: bool = False
    norm: str = "pre"
    ff_dim: Optional[int] = None
    dropout: float = 0.0
    qk_init_std: Union[str, float] = "unit"
    qk_init_gain: float = 1.0
    implementation: str = "auto"
    # Optimizer.
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    momentum: float = 0.9
    warmup_steps: int = 0
    weight_decay: float = 0.0
    clip_norm: Optional[float] = None
    # Decaying to 0 settles the last few percent of accuracy.
    lr_schedule: str = "cosine"
    # Loop.
    batch_size: int = 64
    steps: int = 2000
    seed: int = 0
    eval_every: int = 100
    diagnostics_every: int = 250
    # The labelled heat-map images of TensorBoard's Images tab: about 15 ms a
    # call at d_k 1024 on a CPU, a third of a diagnostics call; the Attention
    # dashboard has the maps of every diagnostics step.
    heatmap_every: int = 250
    checkpoint_every: int = 250
    log_every: int = 10
    heldout_size: int = 1024
    probe_size: int = 16
    target_accuracy: float = 0.9
    # Devices.
    backend: Optional[str] = None
    strategy: str = "auto"
    precision: str = "auto"
    jit_compile: str = "auto"
    deterministic: bool = False
    # Output.
    logdir: Optional[str] = None
    export: Optional[str] = None
    arm: Optional[str] = None
    verbose: int = 1
    # Provenance, not a setting.
    sources: dict = dataclasses.field(
        default_factory=dict, compare=False, repr=False
    )

    def to_dict(self):
        """Returns the settings as a JSON-serialisable dict (no `sources`)."""
        return {name: getattr(self, name) for name in SETTINGS}

    @classmethod
    def from_dict(cls, values, source="config"):
        """Builds a config from a dict such as `to_dict()` or `config.json`.

        The settings are taken as they are; nothing is resolved.

        Args:
            values: mapping of setting name to value.
            source: what the dict came from, for error messages.

        Raises:
            UsageError: on a key that is not a setting.
        """
        check_setting_names(values, source, SETTINGS)
        return cls(**values, sources=dict.fromkeys(values, source))

    def replace(self, **changes):
        """Returns a copy with `changes` applied (their source:
        `"replace()"`)."""
        sources = {**self.sources, **dict.fromkeys(changes, "replace()")}
        return dataclasses.replace(self, **changes, sources=sources)

    def validate(self):
        """Checks every setting; raises `UsageError` naming the bad flag.

        Call on a resolved config. Touches nothing on disk: the log
        directory is only checked for writability.
        """
        check_settings(self, CHOICES, TASK_OPTIONS)
        running = keras.backend.backend()
        if self.backend != running:
            raise UsageError(
                f"--backend {self.backend}: this process runs Keras on "
                f"{running}, and Keras's backend is chosen once, before it "
                "is imported; give --backend on the command line or set "
                "KERAS_BACKEND"
            )

    def task_options(self):
        """The task options that are set, as keyword arguments of
        `keras_attention.tasks.make_task`."""
        return {
            name: getattr(self, name)
            for name in TASK_OPTIONS
            if getattr(self, name) is not None
        }


SETTINGS = tuple(
    field.name for field in dataclasses.fields(TrainConfig)
    if field.name != "sources"
)
_DEFAULTS = TrainConfig()
# Settings given as text (flags, JSON strings) that resolving parses.
_PARSED = {"scale": parse_scale, "qk_init_std": parse_init_std}


def default_logdir(task):
    """The run directory of a task when no layer gives one."""
    return os.path.join("runs", task)


class Layer(NamedTuple):
    """The settings one source gave explicitly.

    A value present in `values` was given, whatever it equals; a setting
    absent from it was not.

    Attributes:
        source: where the settings came from, as messages name it:
            `"flags"`, `"--config run.json"`, `"preset default"`.
        values: `{setting: value}`.
    """

    source: str
    values: dict


def resolve_config(layers):
    """Resolves layers of settings into one `TrainConfig`.

    The task is the one the last layer that gives `task` names (else the
    dataclass default). Then, later winning: dataclass defaults, the task's
    `TASK_DEFAULTS`, each layer in turn. A setting no layer gave is derived
    where the defaults ask for it: `warmup_steps = min(task default,
    steps // 10)`, `weight_decay = 0.01` for `adamw`, `logdir =
    runs/<task>`. `--scale` and `--qk-init-std` text is parsed.

    Args:
        layers: `Layer`s in increasing priority.

    Returns:
        A `TrainConfig` whose `sources[name]` is `"default"`,
        `"task defaults"`, a layer's source, or `"derived from steps"` /
        `"derived from optimizer"` / `"derived from task"`.

    Raises:
        UsageError: on an unknown setting or task, or unparsable text.
    """
    layers = list(layers)
    task = _DEFAULTS.task
    for layer in layers:
        check_setting_names(layer.values, layer.source, SETTINGS)
        task = layer.values.get("task", task)
    check_task_name(task)
    values = _DEFAULTS.to_dict()
    sources = dict.fromkeys(values, "default")
    values.update(TASK_DEFAULTS[task])
    sources.update(dict.fromkeys(TASK_DEFAULTS[task], "task defaults"))
    for layer in layers:
        values.update(layer.values)
        sources.update(dict.fromkeys(layer.values, layer.source))
    given = {name for layer in layers for name in layer.values}
    derived = {}
    if "warmup_steps" not in given and is_int(values["steps"]):
        # A short run gets a proportionally short default warmup.
        warmup = TASK_DEFAULTS[task].get("warmup_steps", _DEFAULTS.warmup_steps)
        derived["warmup_steps"] = (min(warmup, max(values["steps"] // 10, 0)),
                                   "steps")
    if "weight_decay" not in given and values["optimizer"] == "adamw":
        derived["weight_decay"] = (0.01, "optimizer")
    if values["logdir"] is None:
        derived["logdir"] = (default_logdir(task), "task")
    if values["backend"] is None:
        derived["backend"] = (keras.backend.backend(), "the Keras backend")
    if task == "text":
        derived["corpus"] = (text_corpus(values, sources), "text_files")
    for name, (value, origin) in derived.items():
        values[name] = value
        sources[name] = f"derived from {origin}"
    for name, parse in _PARSED.items():
        if isinstance(values[name], str):
            values[name] = parse(values[name])
    return TrainConfig(**values, sources=sources)
