"""The configuration of a training run: one dataclass, its flags and checks.

`TrainConfig` holds every setting of `keras-attention train`. Settings left at
`None` are filled per task by `TrainConfig.resolve()` (see `TASK_DEFAULTS`),
so `keras-attention train --task sort` gets settings that suit sorting and
`--task recall` ones that suit recall. A run stores its resolved config in
`config.json`; `TrainConfig.from_dict(json.load(...))` rebuilds it.

The same flags serve every command that trains (`train`, `compare`):
`add_train_arguments(parser)` adds them and `config_from_args(args)` turns the
parsed flags, on top of an optional `--config FILE`, into a `TrainConfig`.

Example:

```python
config = TrainConfig(task="recall", steps=200, logdir="runs/demo")
config = config.resolve()   # per-task defaults filled in
config.validate()           # raises UsageError naming the bad flag
```
"""

import argparse
import dataclasses
import json
import math
import numbers
import os
from typing import Optional, Union

from keras_attention.tasks import TASK_NAMES
from keras_attention.tasks import make_task
from pipelines.common import UsageError
from pipelines.common import check_writable_directory

OPTIMIZERS = ("sgd", "adam", "adamw")
LR_SCHEDULES = ("constant", "cosine")
STRATEGIES = ("auto", "default", "mirrored", "multiworker", "tpu")
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
JIT_MODES = ("auto", "on", "off")
NORM_MODES = ("pre", "post")
SCALE_MODES = ("sqrt", "none", "learned")
QK_INIT_MODES = ("unit", "glorot")
IMPLEMENTATIONS = ("auto", "explicit", "fused", "memory_efficient")

# Options each task accepts (the others must stay None for that task).
TASK_OPTIONS = ("seq_len", "vocab_size", "min_len", "num_pairs", "num_keys",
                "num_values")

# Settings that suit each task: with them a default run reaches >= 99%
# held-out accuracy on a 2-core CPU in a few minutes (measured: recall 100%
# from step 600, reverse 100% from step 200, sort 99.4% at step 400). Anything
# not listed here comes from `COMMON_DEFAULTS`.
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
}

COMMON_DEFAULTS = dict(
    d_model=64,
    num_layers=1,
    key_dim=64,
    num_heads=1,
    scale="sqrt",
    qk_norm=False,
    causal=False,
    norm="pre",
    dropout=0.0,
    qk_init_std="unit",
    qk_init_gain=1.0,
    optimizer="adam",
    learning_rate=1e-3,
    momentum=0.9,
    warmup_steps=0,
    weight_decay=0.0,
    # Decaying to 0 settles the last few percent of accuracy.
    lr_schedule="cosine",
    batch_size=64,
    steps=2000,
)

# Fields that may differ between a run and its resumption: they change how
# the run is executed or reported, not what it computes.
RUNTIME_FIELDS = (
    "steps",
    "eval_every",
    "diagnostics_every",
    "checkpoint_every",
    "log_every",
    "target_accuracy",
    "strategy",
    "jit_compile",
    "logdir",
    "export",
    "verbose",
)


@dataclasses.dataclass
class TrainConfig:
    """Every setting of a training run.

    `None` means "the task's default" (see `TASK_DEFAULTS`); `resolve()`
    fills those in. Field names match the command-line flags with `_` for
    `-` (`key_dim` is `--key-dim`).

    Attributes:
        task: one of `TASK_NAMES`.
        seq_len, vocab_size, min_len, num_pairs, num_keys, num_values: task
            options (see `keras_attention.tasks`); options a task does not
            take stay `None`.
        train_size: `None` for a fresh sample every step, else the size of a
            fixed training pool.
        d_model, num_layers, key_dim, num_heads, value_dim, scale, qk_norm,
            causal, norm, ff_dim, dropout, qk_init_std, qk_init_gain,
            implementation: model options (see
            `keras_attention.models.build_sequence_model`). `scale` is
            `"sqrt"`, `"none"`, `"learned"` or a positive float.
        optimizer: `"sgd"`, `"adam"` or `"adamw"`.
        learning_rate: peak learning rate, reached after `warmup_steps` of
            linear warmup.
        momentum: SGD momentum.
        warmup_steps: steps of linear learning-rate warmup from 0.
        weight_decay: decoupled weight decay (`"adamw"`) or coupled decay
            (`"sgd"`, `"adam"`); 0 for none.
        clip_norm: clip the global gradient norm to this value; `None` for
            no clipping.
        lr_schedule: `"constant"` after warmup, or `"cosine"` decay to 0 at
            `steps`.
        batch_size: global batch size (all replicas together).
        steps: number of optimizer steps.
        seed: seed of the weights and the data.
        eval_every: held-out evaluation interval in steps.
        diagnostics_every: attention diagnostics interval in steps (also at
            step 0).
        checkpoint_every: checkpoint interval in steps.
        log_every: interval of the train scalars and the progress bar.
        heldout_size: number of held-out examples.
        probe_size: number of held-out examples in the diagnostics probe
            batch.
        target_accuracy: `steps_to_target` in `metrics.json` is the first
            evaluated step with held-out accuracy at least this.
        strategy: `"auto"`, `"default"`, `"mirrored"`, `"multiworker"` or
            `"tpu"`.
        precision: `"auto"` (bfloat16 on TPUs, float16 on GPUs, float32
            otherwise), `"float32"`, `"mixed_float16"` or `"mixed_bfloat16"`.
        jit_compile: `"auto"` (XLA on accelerators), `"on"` or `"off"`.
        deterministic: enable TensorFlow op determinism.
        logdir: directory of the run.
        export: path to export the trained model to, or `None`.
        arm: optional label of this run in a comparison.
        verbose: 1 for a progress bar, 0 for silence.
    """

    task: str = "recall"
    # Task options.
    seq_len: Optional[int] = None
    vocab_size: Optional[int] = None
    min_len: Optional[int] = None
    num_pairs: Optional[int] = None
    num_keys: Optional[int] = None
    num_values: Optional[int] = None
    train_size: Optional[int] = None
    # Model.
    d_model: Optional[int] = None
    num_layers: Optional[int] = None
    key_dim: Optional[int] = None
    num_heads: Optional[int] = None
    value_dim: Optional[int] = None
    scale: Optional[Union[str, float]] = None
    qk_norm: Optional[bool] = None
    causal: Optional[bool] = None
    norm: Optional[str] = None
    ff_dim: Optional[int] = None
    dropout: Optional[float] = None
    qk_init_std: Optional[Union[str, float]] = None
    qk_init_gain: Optional[float] = None
    implementation: str = "auto"
    # Optimizer.
    optimizer: Optional[str] = None
    learning_rate: Optional[float] = None
    momentum: Optional[float] = None
    warmup_steps: Optional[int] = None
    weight_decay: Optional[float] = None
    clip_norm: Optional[float] = None
    lr_schedule: Optional[str] = None
    # Loop.
    batch_size: Optional[int] = None
    steps: Optional[int] = None
    seed: int = 0
    eval_every: int = 100
    diagnostics_every: int = 250
    checkpoint_every: int = 250
    log_every: int = 10
    heldout_size: int = 1024
    probe_size: int = 16
    target_accuracy: float = 0.9
    # Devices.
    strategy: str = "auto"
    precision: str = "auto"
    jit_compile: str = "auto"
    deterministic: bool = False
    # Output.
    logdir: Optional[str] = None
    export: Optional[str] = None
    arm: Optional[str] = None
    verbose: int = 1

    # ---------------------------------------------------------- conversion
    def to_dict(self):
        """Returns the config as a JSON-serialisable dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values, source="config"):
        """Builds a config from a dict such as `to_dict()` or `config.json`.

        Args:
            values: mapping of field name to value.
            source: what the dict came from, for error messages.

        Raises:
            UsageError: on a key that is not a field.
        """
        if not isinstance(values, dict):
            raise UsageError(
                f"{source} must hold a JSON object of settings; got "
                f"{type(values).__name__}"
            )
        names = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise UsageError(
                f"{source}: unknown setting(s) {', '.join(unknown)}"
            )
        return cls(**values)

    def replace(self, **changes):
        """Returns a copy with `changes` applied."""
        return dataclasses.replace(self, **changes)

    # ----------------------------------------------------------- defaults
    def resolve(self):
        """Returns a copy with every `None` default filled in for the task.

        Task options the task does not take stay `None`; `logdir` defaults to
        `runs/<task>`. Resolving twice changes nothing.
        """
        if self.task not in TASK_DEFAULTS:
            raise UsageError(
                f"--task must be one of {', '.join(TASK_NAMES)}; got "
                f"{self.task!r}"
            )
        defaults = {**COMMON_DEFAULTS, **TASK_DEFAULTS[self.task]}
        changes = {}
        for name, value in defaults.items():
            if getattr(self, name) is None:
                changes[name] = value
        if self.warmup_steps is None and isinstance(
            changes.get("steps", self.steps), int
        ):
            # A short run gets a proportionally short default warmup.
            steps = changes.get("steps", self.steps)
            changes["warmup_steps"] = min(
                defaults["warmup_steps"], max(steps // 10, 0)
            )
        if self.weight_decay is None and changes.get(
            "optimizer", self.optimizer
        ) == "adamw":
            changes["weight_decay"] = 0.01
        if self.logdir is None:
            changes["logdir"] = os.path.join("runs", self.task)
        config = self.replace(**changes)
        if isinstance(config.scale, str) and config.scale not in SCALE_MODES:
            changes = {"scale": _parse_scale(config.scale)}
            config = config.replace(**changes)
        if isinstance(config.qk_init_std, str):
            config = config.replace(
                qk_init_std=_parse_init_std(config.qk_init_std)
            )
        return config

    # --------------------------------------------------------- validation
    def validate(self):
        """Checks every setting; raises `UsageError` naming the bad flag.

        Call on a resolved config. Touches nothing on disk: the log
        directory is only checked for writability.
        """
        if self.task not in TASK_NAMES:
            raise UsageError(
                f"--task must be one of {', '.join(TASK_NAMES)}; got "
                f"{self.task!r}"
            )
        unresolved = [
            name for name in {**COMMON_DEFAULTS, **TASK_DEFAULTS[self.task]}
            if getattr(self, name) is None
        ]
        if unresolved:
            raise UsageError(
                f"the config is not resolved: {', '.join(unresolved)} unset "
                "(call TrainConfig.resolve() first)"
            )
        for name in (
            "d_model", "num_layers", "key_dim", "num_heads", "batch_size",
            "steps", "eval_every", "diagnostics_every", "checkpoint_every",
            "log_every", "heldout_size", "probe_size",
        ):
            _check_int(self, name, minimum=1)
        for name in ("seq_len", "vocab_size", "min_len", "num_pairs",
                     "num_keys", "num_values", "train_size", "value_dim"):
            _check_int(self, name, minimum=1, allow_none=True)
        _check_int(self, "ff_dim", minimum=0, allow_none=True)
        _check_int(self, "warmup_steps", minimum=0)
        _check_int(self, "seed", minimum=0)
        _check_int(self, "verbose", minimum=0)
        _check_choice(self, "optimizer", OPTIMIZERS)
        _check_choice(self, "lr_schedule", LR_SCHEDULES)
        _check_choice(self, "norm", NORM_MODES)
        _check_choice(self, "strategy", STRATEGIES)
        _check_choice(self, "precision", PRECISIONS)
        _check_choice(self, "jit_compile", JIT_MODES)
        _check_choice(self, "implementation", IMPLEMENTATIONS)
        for name in ("qk_norm", "causal", "deterministic"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(
                    f"{_flag(name)} must be true or false; got "
                    f"{getattr(self, name)!r}"
                )
        _check_real(self, "learning_rate", low=0.0, low_open=True)
        _check_real(self, "momentum", low=0.0, high=1.0, high_open=True)
        _check_real(self, "weight_decay", low=0.0)
        _check_real(self, "dropout", low=0.0, high=1.0, high_open=True)
        _check_real(self, "qk_init_gain", low=0.0, low_open=True)
        _check_real(self, "target_accuracy", low=0.0, high=1.0)
        if self.clip_norm is not None:
            _check_real(self, "clip_norm", low=0.0, low_open=True)
        if not (
            (isinstance(self.scale, str) and self.scale in SCALE_MODES)
            or _is_positive_real(self.scale)
        ):
            raise UsageError(
                f"--scale must be sqrt, none, learned or a positive number; "
                f"got {self.scale!r}"
            )
        if not (
            (isinstance(self.qk_init_std, str)
             and self.qk_init_std in QK_INIT_MODES)
            or _is_positive_real(self.qk_init_std)
        ):
            raise UsageError(
                f"--qk-init-std must be unit, glorot or a positive number; "
                f"got {self.qk_init_std!r}"
            )
        if self.warmup_steps > self.steps:
            raise UsageError(
                f"--warmup-steps ({self.warmup_steps}) must not exceed "
                f"--steps ({self.steps})"
            )
        task = build_task_or_usage_error(self)
        if self.heldout_size < self.probe_size:
            raise UsageError(
                f"--heldout-size ({self.heldout_size}) must be at least "
                f"--probe-size ({self.probe_size})"
            )
        if self.train_size is not None and self.train_size < self.batch_size:
            raise UsageError(
                f"--train-size ({self.train_size}) must be at least "
                f"--batch-size ({self.batch_size})"
            )
        if not isinstance(self.logdir, str) or not self.logdir:
            raise UsageError(f"--logdir must be a directory; got {self.logdir!r}")
        check_writable_directory(self.logdir, "--logdir")
        if self.export is not None:
            if not isinstance(self.export, str) or not self.export:
                raise UsageError(
                    f"--export must be a path; got {self.export!r}"
                )
        if self.arm is not None and not isinstance(self.arm, str):
            raise UsageError(f"--arm must be a string; got {self.arm!r}")
        return task

    def task_options(self):
        """The task options that are set, as keyword arguments of
        `keras_attention.tasks.make_task`."""
        return {
            name: getattr(self, name)
            for name in TASK_OPTIONS
            if getattr(self, name) is not None
        }


# ------------------------------------------------------------------ checks
def _flag(name):
    return "--" + name.replace("_", "-")


def _is_positive_real(value):
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _check_int(config, name, minimum, allow_none=False):
    value = getattr(config, name)
    if value is None and allow_none:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < minimum
    ):
        expected = "a positive integer" if minimum == 1 else (
            f"an integer >= {minimum}"
        )
        raise UsageError(f"{_flag(name)} must be {expected}; got {value!r}")


def _check_choice(config, name, choices):
    value = getattr(config, name)
    if value not in choices:
        raise UsageError(
            f"{_flag(name)} must be one of {', '.join(choices)}; got {value!r}"
        )


def _check_real(config, name, low=None, high=None, low_open=False,
                high_open=False):
    value = getattr(config, name)
    ok = (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
    )
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        interval = (
            ("(" if low_open else "[")
            + ("-inf" if low is None else f"{low:g}")
            + ", "
            + ("inf" if high is None else f"{high:g}")
            + (")" if high_open else "]")
        )
        raise UsageError(
            f"{_flag(name)} must be a finite number in {interval}; got "
            f"{value!r}"
        )


def build_task_or_usage_error(config):
    """Builds the config's task, turning the task's `ValueError` into a
    `UsageError` that names the flag.

    Args:
        config: a `TrainConfig` (resolved or not).

    Returns:
        A `keras_attention.tasks.SequenceTask`.
    """
    if config.task not in TASK_NAMES:
        raise UsageError(
            f"--task must be one of {', '.join(TASK_NAMES)}; got "
            f"{config.task!r}"
        )
    try:
        return make_task(config.task, **config.task_options())
    except ValueError as error:
        message = str(error)
        for name in TASK_OPTIONS + ("batch_size",):
            message = message.replace(f"`{name}`", _flag(name))
        # "Unknown option(s) ['seq_len'] for task 'recall'" names options
        # the task does not take.
        for name in TASK_OPTIONS:
            message = message.replace(f"'{name}'", _flag(name))
        raise UsageError(f"--task {config.task}: {message}") from None


# ------------------------------------------------------------------ parsing
def _parse_scale(text):
    """`sqrt`, `none`, `learned` or a positive float."""
    if isinstance(text, str) and text.lower() in SCALE_MODES:
        return text.lower()
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise UsageError(
            f"--scale must be sqrt, none, learned or a positive number; got "
            f"{text!r}"
        ) from None
    if not _is_positive_real(value):
        raise UsageError(
            f"--scale must be a positive finite number; got {text!r}"
        )
    return value


def _parse_init_std(text):
    """`unit`, `glorot` or a positive float."""
    if isinstance(text, str) and text.lower() in QK_INIT_MODES:
        return text.lower()
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise UsageError(
            f"--qk-init-std must be unit, glorot or a positive number; got "
            f"{text!r}"
        ) from None
    if not _is_positive_real(value):
        raise UsageError(
            f"--qk-init-std must be a positive finite number; got {text!r}"
        )
    return value


def load_config_file(path):
    """Reads a JSON config file into a `TrainConfig` (unresolved).

    The file holds an object whose keys are `TrainConfig` field names, for
    example `{"task": "sort", "steps": 500, "learning_rate": 0.003}`. A
    run's `config.json` is such a file.

    Raises:
        UsageError: if the file cannot be read, is not JSON, or has unknown
            keys.
    """
    try:
        with open(path) as handle:
            values = json.load(handle)
    except OSError as error:
        raise UsageError(
            f"--config {path}: cannot read ({error.strerror})"
        ) from None
    except json.JSONDecodeError as error:
        raise UsageError(f"--config {path}: not valid JSON ({error})") from None
    return TrainConfig.from_dict(values, source=f"--config {path}")


class _StoreFlag(argparse.Action):
    """`--flag` / `--no-flag` for a boolean setting whose default is None
    (unset), so a config file can set it and the command line override it."""

    def __init__(self, option_strings, dest, help=None, **kwargs):
        names = []
        for option in option_strings:
            names.append(option)
            if option.startswith("--"):
                names.append("--no-" + option[2:])
        super().__init__(names, dest, nargs=0, default=None, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, not option_string.startswith("--no-"))


# Flags are parsed as text and converted by `config_from_args`, so that a bad
# value ends in one `UsageError` line naming the flag rather than argparse's
# usage dump.
_INT_FIELDS = (
    "seq_len", "vocab_size", "min_len", "num_pairs", "num_keys",
    "num_values", "train_size", "d_model", "num_layers", "key_dim",
    "num_heads", "value_dim", "ff_dim", "warmup_steps", "batch_size",
    "steps", "seed", "eval_every", "diagnostics_every", "checkpoint_every",
    "log_every", "heldout_size", "probe_size",
)
_FLOAT_FIELDS = (
    "dropout", "qk_init_gain", "learning_rate", "momentum", "weight_decay",
    "clip_norm", "target_accuracy",
)


def _convert_flag(name, text):
    if name in _INT_FIELDS:
        try:
            return int(text)
        except (TypeError, ValueError):
            raise UsageError(
                f"{_flag(name)} must be an integer; got {text!r}"
            ) from None
    if name in _FLOAT_FIELDS:
        try:
            return float(text)
        except (TypeError, ValueError):
            raise UsageError(
                f"{_flag(name)} must be a number; got {text!r}"
            ) from None
    if name == "scale":
        return _parse_scale(text)
    if name == "qk_init_std":
        return _parse_init_std(text)
    return text


def _choices(values):
    return "{" + ",".join(values) + "}"


def add_train_arguments(parser):
    """Adds every `TrainConfig` flag to an `argparse` parser.

    All flags default to `None` ("not given") so that `config_from_args` can
    layer them over a `--config` file and the per-task defaults. Values are
    checked by `config_from_args` and `TrainConfig.validate`, which raise
    `UsageError` naming the flag.

    Args:
        parser: an `argparse.ArgumentParser`.

    Returns:
        The parser.
    """
    task = parser.add_argument_group("task")
    task.add_argument("--task", metavar=_choices(TASK_NAMES),
                      help="synthetic task (default: recall)")
    task.add_argument("--seq-len", metavar="N",
                      help="sequence length (recall: num-pairs + 1)")
    task.add_argument("--vocab-size", "--vocab", dest="vocab_size",
                      metavar="N", help="token ids incl. padding (reverse, "
                      "sort, copy)")
    task.add_argument("--min-len", metavar="N",
                      help="shortest content length (default: fixed length)")
    task.add_argument("--num-pairs", metavar="N",
                      help="recall: key-value pairs per example")
    task.add_argument("--num-keys", metavar="N",
                      help="recall: size of the key alphabet")
    task.add_argument("--num-values", metavar="N",
                      help="recall: size of the value alphabet (classes)")
    task.add_argument("--train-size", metavar="N",
                      help="fixed training pool (default: fresh samples "
                      "every step)")

    model = parser.add_argument_group("model")
    model.add_argument("--d-model", "--width", dest="d_model", metavar="N",
                       help="residual stream width")
    model.add_argument("--num-layers", "--layers", dest="num_layers",
                       metavar="N", help="attention blocks")
    model.add_argument("--key-dim", metavar="N",
                       help="d_k, per-head query/key size")
    model.add_argument("--num-heads", metavar="N", help="attention heads")
    model.add_argument("--value-dim", metavar="N",
                       help="per-head value size (default: key-dim)")
    model.add_argument("--scale", metavar="{sqrt,none,learned,FLOAT}",
                       help="score scale: 1/sqrt(d_k), 1, a learned scalar "
                       "or a fixed number (default: sqrt)")
    model.add_argument("--qk-norm", action=_StoreFlag,
                       help="layer-normalize queries and keys")
    model.add_argument("--causal", action=_StoreFlag,
                       help="causal attention mask")
    model.add_argument("--norm", metavar=_choices(NORM_MODES),
                       help="pre- or post-layer-norm blocks (default: pre)")
    model.add_argument("--ff-dim", metavar="N",
                       help="feed-forward width (default: 4 * d-model; 0: "
                       "none)")
    model.add_argument("--dropout", metavar="RATE")
    model.add_argument("--qk-init-std", metavar="{unit,glorot,FLOAT}",
                       help="init of W_Q, W_K (unit: N(0, 1/d_model))")
    model.add_argument("--qk-init-gain", metavar="GAIN",
                       help="factor applied to W_Q, W_K after init")
    model.add_argument("--implementation",
                       metavar=_choices(IMPLEMENTATIONS),
                       help="attention kernel (default: auto)")

    optim = parser.add_argument_group("optimizer")
    optim.add_argument("--optimizer", metavar=_choices(OPTIMIZERS))
    optim.add_argument("--learning-rate", "--lr", dest="learning_rate",
                       metavar="LR", help="peak learning rate")
    optim.add_argument("--momentum", metavar="M", help="SGD momentum")
    optim.add_argument("--warmup-steps", "--warmup", dest="warmup_steps",
                       metavar="N", help="linear learning-rate warmup")
    optim.add_argument("--weight-decay", metavar="WD")
    optim.add_argument("--clip-norm", metavar="NORM",
                       help="clip the global gradient norm")
    optim.add_argument("--lr-schedule", metavar=_choices(LR_SCHEDULES),
                       help="after warmup (default: constant)")

    loop = parser.add_argument_group("training loop")
    loop.add_argument("--batch-size", metavar="N", help="global batch size")
    loop.add_argument("--steps", metavar="N", help="optimizer steps")
    loop.add_argument("--seed", metavar="S", help="seed of weights and data")
    loop.add_argument("--eval-every", metavar="N",
                      help="held-out evaluation interval (default: 100)")
    loop.add_argument("--diagnostics-every", metavar="N",
                      help="attention diagnostics interval (default: 250)")
    loop.add_argument("--checkpoint-every", metavar="N",
                      help="checkpoint interval (default: 250)")
    loop.add_argument("--log-every", metavar="N",
                      help="train scalars and progress interval (default: "
                      "10)")
    loop.add_argument("--heldout-size", metavar="N",
                      help="held-out examples (default: 1024)")
    loop.add_argument("--probe-size", metavar="N",
                      help="held-out examples in the diagnostics batch")
    loop.add_argument("--target-accuracy", metavar="ACC",
                      help="held-out accuracy for steps_to_target "
                      "(default: 0.9)")

    devices = parser.add_argument_group("devices")
    devices.add_argument("--strategy", metavar=_choices(STRATEGIES),
                         help="distribution strategy (default: auto)")
    devices.add_argument("--precision", metavar=_choices(PRECISIONS),
                         help="dtype policy (default: auto)")
    devices.add_argument("--jit-compile", metavar=_choices(JIT_MODES),
                         help="XLA for the train step (default: auto)")
    devices.add_argument("--deterministic", action=_StoreFlag,
                         help="TensorFlow op determinism")

    output = parser.add_argument_group("output")
    output.add_argument("--logdir", metavar="DIR",
                        help="run directory (default: runs/<task>); a run "
                        "with checkpoints there is resumed")
    output.add_argument("--export", metavar="PATH",
                        help="export the trained model to PATH")
    output.add_argument("--arm", metavar="LABEL",
                        help="label of this run in a comparison")
    output.add_argument("--config", metavar="FILE",
                        help="JSON file of settings; flags override it")
    output.add_argument("--quiet", "-q", action="store_true", default=None,
                        help="no progress bar")
    return parser


def config_from_args(args):
    """Builds the (unresolved) `TrainConfig` from parsed flags.

    Values from `--config FILE` come first; every flag given on the command
    line overrides them.

    Args:
        args: the `argparse.Namespace` of a parser set up with
            `add_train_arguments`.

    Returns:
        A `TrainConfig`; call `.resolve()` for the per-task defaults.

    Raises:
        UsageError: on a value that does not parse, naming the flag.
    """
    config_path = getattr(args, "config", None)
    config = load_config_file(config_path) if config_path else TrainConfig()
    changes = {}
    for field in dataclasses.fields(TrainConfig):
        value = getattr(args, field.name, None)
        if value is not None:
            changes[field.name] = _convert_flag(field.name, value)
    if getattr(args, "quiet", None):
        changes["verbose"] = 0
    return config.replace(**changes)
