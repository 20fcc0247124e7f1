"""The settings of a training run: the task defaults, layers, and resolving.

`TrainConfig` (declared in `pipelines.settings`, and importable from here
with the names derived from its declaration) holds every setting of
`keras-attention train`; its field defaults are the common defaults. The
settings of one run are resolved once, at the edge, from layers in this
order (later wins):

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

import os
from typing import NamedTuple

import keras

from keras_attention.validation import is_int
from pipelines.config_checks import check_setting_names
from pipelines.config_checks import check_task_name
from pipelines.config_checks import text_corpus
from pipelines.settings import CHOICES
from pipelines.settings import DECLARED
from pipelines.settings import HPARAMS
from pipelines.settings import OPTIMIZERS
from pipelines.settings import PER_RUN
from pipelines.settings import RUNTIME_FIELDS
from pipelines.settings import SETTINGS
from pipelines.settings import TASK_OPTIONS
from pipelines.settings import TrainConfig

# The declaration's names are re-exported: users import them from here.
__all__ = [
    "CHOICES", "HPARAMS", "OPTIMIZERS", "PER_RUN", "RUNTIME_FIELDS",
    "SETTINGS", "TASK_DEFAULTS", "TASK_OPTIONS", "Layer", "TrainConfig",
    "default_logdir", "resolve_config",
]

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
    # Causal, by character: 2.39 bits/char (unigram 4.56) in 600 steps; docs/results.md.
    "text": dict(seq_len=128, d_model=128, num_layers=4, num_heads=4,
                 key_dim=32, causal=True, learning_rate=3e-3, steps=600,
                 warmup_steps=60, batch_size=32, probe_size=32),
}

_DEFAULTS = TrainConfig()


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
    runs/<task>`. Text of a setting declared with a `parse` (`--scale`,
    `--qk-init-std`) is parsed.

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
    for name, declared in DECLARED.items():
        if declared.parse is not None and isinstance(values[name], str):
            values[name] = declared.parse(values[name])
    return TrainConfig(**values, sources=sources)
