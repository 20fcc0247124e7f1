"""The declaration of every setting of a training run: `TrainConfig`.

Each field of `TrainConfig` is declared once, by `setting(...)`: its type
(the annotation), default, group, flag help, check, and kind. Everything
else is derived from the declaration: the flags (`pipelines.flags`), what a
config file may hold (`SETTINGS`), the checks of `TrainConfig.validate()`,
`CHOICES`, `TASK_OPTIONS`, `RUNTIME_FIELDS`, `PER_RUN`, the HParams
(`pipelines.tensorboard.hparams_of`) and the model's keyword arguments
(`config.group("model")`). Resolving the settings of a run from their
layers lives in `pipelines.config`.

Adding a setting is one `setting(...)` line here; a model setting is also a
keyword argument of `keras_attention.models.build_sequence_model`, which
`pipelines.builders.build_model` passes the whole model group.
"""

import dataclasses
import typing
from typing import Callable, Optional, Union

import keras

from keras_attention.layer import IMPLEMENTATIONS
from keras_attention.models import FF_ACTIVATIONS
from keras_attention.models import QK_INIT_MODES
from keras_attention.ops import SCALE_MODES
from keras_attention.tasks import TASK_NAMES
from keras_attention.transformer_block import NORM_MODES
from pipelines.backends import BACKENDS
from pipelines.common import UsageError
from pipelines.config_checks import boolean
from pipelines.config_checks import layer_count
from pipelines.config_checks import check_relations
from pipelines.config_checks import check_setting_names
from pipelines.config_checks import mode_or_number
from pipelines.config_checks import non_negative_int
from pipelines.config_checks import non_negative_int_or_none
from pipelines.config_checks import one_of
from pipelines.config_checks import paths_or_none
from pipelines.config_checks import parse_init_std
from pipelines.config_checks import parse_scale
from pipelines.config_checks import positive_int
from pipelines.config_checks import positive_int_or_none
from pipelines.config_checks import real
from pipelines.config_checks import seed_range
from pipelines.config_checks import text_or_none

OPTIMIZERS = ("sgd", "adam", "adamw")
LR_SCHEDULES = ("constant", "cosine")
STRATEGIES = ("auto", "default", "mirrored", "multiworker", "tpu")
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
JIT_MODES = ("auto", "on", "off")

# The groups, in the order of `--help`, with their titles there.
GROUPS = {"task": "task", "model": "model", "optimizer": "optimizer",
          "loop": "training loop", "devices": "devices", "output": "output"}
# A setting's kind: an identity setting shapes the run's trajectory, so a
# run is resumed only with the value it started with; a runtime setting
# changes how the run is executed or reported, and may change on resume.
IDENTITY, RUNTIME = "identity", "runtime"


@dataclasses.dataclass(frozen=True)
class Setting:
    """The declaration of one `TrainConfig` field (its `metadata["setting"]`).

    Attributes:
        group: a key of `GROUPS`: the flag's section of `--help`; the
            `"model"` group is `build_sequence_model`'s keyword arguments.
        help: the flag's help; `{default}` becomes the default's text.
        check: `check(config, name)`, raising `UsageError` naming the flag
            (by default: one of `choices`); `None` for a setting that a
            cross-setting check covers (`logdir`, `export`).
        choices: the values allowed (also the flag's metavar).
        parse: turns the text a flag or a file gives into a value, when
            resolving (`"2.5"` -> 2.5); the value is checked by `check`.
        aliases: more flag names (`--lr`).
        metavar: the flag's metavar (default `N`, or the choices).
        kind: `IDENTITY` or `RUNTIME` (`RUNTIME_FIELDS`).
        per_run: may differ between runs that share a compiled step (what
            a run starts from, where it writes, how it reports; never a
            shape or a constant of the step): `PER_RUN`.
        hparam: logged as a TensorBoard HParam.
        task_option: a keyword argument of `keras_attention.tasks.make_task`
            (`TASK_OPTIONS`).
        flag: whether the setting has a flag (`verbose` has `--quiet`).
    """

    group: str
    help: Optional[str] = None
    check: Optional[Callable] = None
    choices: Optional[tuple] = None
    parse: Optional[Callable] = None
    aliases: tuple = ()
    metavar: Optional[str] = None
    kind: str = IDENTITY
    per_run: bool = False
    hparam: bool = False
    task_option: bool = False
    flag: bool = True


def setting(default, group, help=None, check=None, **declaration):
    """A `TrainConfig` field: its default and its `Setting`."""
    choices = declaration.get("choices")
    if check is None and choices is not None:
        check = one_of(choices)
    return dataclasses.field(default=default, metadata={
        "setting": Setting(group, help, check, **declaration)})


_POSITIVE_REAL = real(low=0.0, low_open=True)
_RATE = real(low=0.0, high=1.0, high_open=True)


@dataclasses.dataclass
class TrainConfig:
    """Every setting of a training run.

    The field defaults are the common defaults; `pipelines.config.
    resolve_config` lays the task's (`TASK_DEFAULTS`) and the given settings
    over them. Field names match the flags with `_` for `-` (`key_dim` is
    `--key-dim`), and each field's declaration is its documentation (the
    flag's help). `None` is kept only for settings that are genuinely
    optional. `sources` is `{setting: where its value came from}`, filled
    by `resolve_config`; not a setting, not part of `to_dict()`.
    """

    task: str = setting("recall", "task", "synthetic task (default: "
                        "{default})", choices=TASK_NAMES, hparam=True)
    seq_len: Optional[int] = setting(
        None, "task", "sequence length (recall: num-pairs + 1)",
        positive_int_or_none, task_option=True)
    vocab_size: Optional[int] = setting(
        None, "task", "token ids incl. padding (reverse, sort, copy)",
        positive_int_or_none, aliases=("--vocab",), task_option=True)
    min_len: Optional[int] = setting(
        None, "task", "shortest content length (default: fixed length)",
        positive_int_or_none, task_option=True)
    num_pairs: Optional[int] = setting(
        None, "task", "recall: key-value pairs per example",
        positive_int_or_none, task_option=True)
    num_keys: Optional[int] = setting(
        None, "task", "recall: size of the key alphabet",
        positive_int_or_none, task_option=True)
    num_values: Optional[int] = setting(
        None, "task", "recall: size of the value alphabet (classes)",
        positive_int_or_none, task_option=True)
    text_files: Optional[list] = setting(
        None, "task", "text: a UTF-8 file, or a directory of .txt files, to "
        "train on (repeatable); without it, this Python's standard-library "
        "source", paths_or_none, metavar="PATH", task_option=True)
    # The text task's corpus (Python version, files, characters, SHA-256,
    # split, vocabulary), derived from `text_files` when resolving, so that
    # config.json says what the run trained on.
    corpus: Optional[dict] = setting(None, "task", task_option=True,
                                     flag=False)
    train_size: Optional[int] = setting(
        None, "task", "fixed training pool (default: fresh samples every "
        "step)", positive_int_or_none)
    # The model: `keras_attention.models.build_sequence_model`'s arguments.
    d_model: int = setting(64, "model", "residual stream width (default: "
                           "{default})", positive_int, aliases=("--width",),
                           hparam=True)
    num_layers: int = setting(1, "model", "attention blocks (default: "
                              "{default})", layer_count,
                              aliases=("--layers",), hparam=True)
    key_dim: int = setting(64, "model", "d_k, per-head query/key size "
                           "(default: {default})", positive_int, hparam=True)
    num_heads: int = setting(1, "model", "attention heads (default: "
                             "{default})", positive_int, hparam=True)
    value_dim: Optional[int] = setting(
        None, "model", "per-head value size (default: key-dim)",
        positive_int_or_none)
    scale: Union[str, float] = setting(
        "sqrt", "model", "score scale: sqrt 1/sqrt(d_k), none 1, inverse "
        "1/d_k (muP), learned a trainable scalar, or a fixed number "
        "(default: {default})", mode_or_number(SCALE_MODES),
        parse=parse_scale, metavar="{" + ",".join(SCALE_MODES) + ",FLOAT}",
        hparam=True)
    qk_norm: bool = setting(False, "model", "layer-normalize queries and "
                            "keys", boolean, hparam=True)
    causal: bool = setting(False, "model", "causal attention mask", boolean)
    norm: str = setting("pre", "model", "pre- or post-layer-norm blocks "
                        "(default: {default})", choices=NORM_MODES)
    ff_dim: Optional[int] = setting(
        None, "model", "feed-forward width (default: 4 * d-model; 0: none)",
        non_negative_int_or_none)
    ff_activation: str = setting(
        "gelu", "model", "feed-forward activation (default: {default})",
        choices=FF_ACTIVATIONS)
    dropout: float = setting(0.0, "model", "(default: {default})", _RATE,
                             metavar="RATE")
    qk_init_std: Union[str, float] = setting(
        "unit", "model", "init of W_Q, W_K (unit: N(0, 1/d_model); "
        "default: {default})", mode_or_number(QK_INIT_MODES),
        parse=parse_init_std, metavar="{unit,glorot,FLOAT}")
    qk_init_gain: float = setting(
        1.0, "model", "factor applied to W_Q, W_K after init (default: "
        "{default})", _POSITIVE_REAL, metavar="GAIN")
    implementation: str = setting("auto", "model", "attention kernel "
                                  "(default: {default})",
                                  choices=IMPLEMENTATIONS)
    # The optimizer. The rate is the peak, after `warmup_steps` of linear
    # warmup from 0; weight decay is decoupled for adamw, else coupled.
    optimizer: str = setting("adam", "optimizer", "(default: {default})",
                             choices=OPTIMIZERS, hparam=True)
    learning_rate: float = setting(
        1e-3, "optimizer", "peak learning rate (default: {default})",
        _POSITIVE_REAL, aliases=("--lr",), metavar="LR", per_run=True,
        hparam=True)
    momentum: float = setting(0.9, "optimizer", "SGD momentum (default: "
                              "{default})", _RATE, metavar="M")
    warmup_steps: int = setting(
        0, "optimizer", "linear learning-rate warmup (default: {default}; "
        "at most steps/10)", non_negative_int, aliases=("--warmup",))
    weight_decay: float = setting(
        0.0, "optimizer", "(default: {default}; 0.01 for adamw)",
        real(low=0.0), metavar="WD")
    clip_norm: Optional[float] = setting(
        None, "optimizer", "clip the global gradient norm",
        real(low=0.0, low_open=True, allow_none=True), metavar="NORM")
    # Decaying to 0 settles the last few percent of accuracy.
    lr_schedule: str = setting("cosine", "optimizer", "after warmup "
                               "(default: {default})", choices=LR_SCHEDULES)
    # The loop. `steps` is an identity setting: it sets the length of the
    # cosine schedule (a 20-step run continued to 40 ended at held-out loss
    # 2.98989, a fresh 40-step run at 2.99765).
    batch_size: int = setting(64, "loop", "global batch size (default: "
                              "{default})", positive_int)
    steps: int = setting(2000, "loop", "optimizer steps (default: "
                         "{default})", positive_int, per_run=True)
    seed: int = setting(0, "loop", "seed of weights and data (default: "
                        "{default})", seed_range, metavar="S", per_run=True,
                        hparam=True)
    eval_every: int = setting(
        100, "loop", "held-out evaluation interval (default: {default})",
        positive_int, kind=RUNTIME, per_run=True)
    diagnostics_every: int = setting(
        250, "loop", "attention diagnostics interval (default: {default})",
        positive_int, kind=RUNTIME, per_run=True)
    # The labelled heat-map images of TensorBoard's Images tab: about 15 ms a
    # call at d_k 1024 on a CPU, a third of a diagnostics call; the Attention
    # dashboard has the maps of every diagnostics step.
    heatmap_every: int = setting(
        250, "loop", "interval of the heat-map images among the diagnostics "
        "(default: {default})", positive_int, kind=RUNTIME)
    checkpoint_every: int = setting(
        250, "loop", "checkpoint interval (default: {default})",
        positive_int, kind=RUNTIME, per_run=True)
    log_every: int = setting(
        10, "loop", "train scalars and progress interval (default: "
        "{default})", positive_int, kind=RUNTIME, per_run=True)
    heldout_size: int = setting(1024, "loop", "held-out examples (default: "
                                "{default})", positive_int)
    probe_size: int = setting(16, "loop", "held-out examples in the "
                              "diagnostics batch (default: {default})",
                              positive_int)
    target_accuracy: float = setting(
        0.9, "loop", "held-out accuracy for steps_to_target (default: "
        "{default})", real(low=0.0, high=1.0), metavar="ACC", kind=RUNTIME,
        per_run=True)
    # Devices. The backend is part of the run's identity: a run is resumed
    # on the backend it started on, never continued on another.
    backend: Optional[str] = setting(
        None, "devices", "Keras backend, set before Keras is imported "
        "(default: the running Keras backend; KERAS_BACKEND or "
        "~/.keras/keras.json choose it, as for any Keras program, and "
        "tensorflow without them, else jax, else torch, when TensorFlow is "
        "not installed)", choices=BACKENDS)
    strategy: str = setting("auto", "devices", "distribution strategy "
                            "(default: {default})", choices=STRATEGIES,
                            kind=RUNTIME)
    precision: str = setting("auto", "devices", "dtype policy (default: "
                             "{default})", choices=PRECISIONS)
    jit_compile: str = setting("auto", "devices", "XLA for the train step "
                               "(default: {default})", choices=JIT_MODES,
                               kind=RUNTIME)
    deterministic: bool = setting(
        False, "devices", "deterministic kernels (TensorFlow op "
        "determinism, torch deterministic algorithms)", boolean)
    # Output.
    logdir: Optional[str] = setting(
        None, "output", "run directory (default: runs/<task>); a run with "
        "checkpoints there is resumed", metavar="DIR", kind=RUNTIME,
        per_run=True)
    export: Optional[str] = setting(
        None, "output", "export the trained model to PATH", metavar="PATH",
        kind=RUNTIME, per_run=True)
    arm: Optional[str] = setting(
        None, "output", "label of this run in a comparison", text_or_none,
        metavar="LABEL", per_run=True, hparam=True)
    verbose: int = setting(1, "output", "1 for a progress bar, 0 for "
                           "silence (--quiet)", non_negative_int,
                           kind=RUNTIME, per_run=True, flag=False)
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

        Call on a resolved config: each setting's declared check, then the
        checks across settings (`config_checks.check_relations`). Touches
        nothing on disk: the log directory is only checked for writability.
        """
        for name, declared in DECLARED.items():
            if declared.check is not None:
                declared.check(self, name)
        check_relations(self, TASK_OPTIONS)
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

    def group(self, group):
        """`{name: value}` of the settings of `group` (a key of `GROUPS`):
        `group("model")` is `build_sequence_model`'s keyword arguments."""
        return {name: getattr(self, name) for name, declared
                in DECLARED.items() if declared.group == group}


# `{name: Setting}` of every setting, in declaration order.
DECLARED = {
    field.name: field.metadata["setting"]
    for field in dataclasses.fields(TrainConfig)
    if "setting" in field.metadata
}
SETTINGS = tuple(DECLARED)
_HINTS = typing.get_type_hints(TrainConfig)


def _declared(**wanted):
    return tuple(name for name, declared in DECLARED.items()
                 if all(getattr(declared, key) == value
                        for key, value in wanted.items()))


# The settings with a fixed set of values.
CHOICES = {name: declared.choices for name, declared in DECLARED.items()
           if declared.choices is not None}
# Options each task accepts (the others must stay None for that task).
TASK_OPTIONS = _declared(task_option=True)
# Fields that may differ between a run and its resumption.
RUNTIME_FIELDS = _declared(kind=RUNTIME)
# Fields that may differ between runs sharing a compiled step.
PER_RUN = _declared(per_run=True)
# The settings logged as HParams.
HPARAMS = _declared(hparam=True)


def value_types(name):
    """The types a setting's value may have, `None` left out: `(int,)` for
    `Optional[int]`, `(str, float)` for `scale`."""
    hint = _HINTS[name]
    return tuple(kind for kind in typing.get_args(hint)
                 if kind is not type(None)) or (hint,)
