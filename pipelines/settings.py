"""The settings of a training run.

Each `TrainConfig` field is declared once, by `setting(...)` (type, default,
group, help, check, kind), whence the flags, the names below and the model's
arguments; then the task defaults; `resolve_config` (with provenance,
`config.sources`), in order

    dataclass defaults < TASK_DEFAULTS[task] < preset < --config file < flags

and `config.validate()`, which says a library `ValueError` in flags
(`--key-dim must be ...`).
"""

import dataclasses
import functools
import os
import typing
from typing import Callable, NamedTuple, Optional, Union

import keras

from keras_attention import validation
from keras_attention.layer import IMPLEMENTATIONS
from keras_attention.layer import ScaledDotProductAttention
from keras_attention.models import FF_ACTIVATIONS
from keras_attention.models import QK_INIT_MODES
from keras_attention.ops import SCALE_MODES
from keras_attention.tasks import TASK_NAMES
from keras_attention.tasks import make_task
from keras_attention.tasks.corpus import check_text_files
from keras_attention.tasks.corpus import describe_corpus
from keras_attention.transformer_block import NORM_MODES
from pipelines.backends import BACKENDS
from pipelines.common import UsageError
from pipelines.common import check_run_outputs
from pipelines.common import usage_error

OPTIMIZERS, LR_SCHEDULES = ("sgd", "adam", "adamw"), ("constant", "cosine")
JIT_MODES = ("auto", "on", "off")
STRATEGIES = ("auto", "default", "mirrored", "multiworker", "tpu")
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
# The groups' titles, as in --help.
GROUPS = {"task": "task", "model": "model", "attention": "attention",
          "optimizer": "optimizer", "loop": "training loop",
          "devices": "devices", "output": "output"}
# An identity setting shapes a run's trajectory (a run resumes only with
# it); a runtime one not.
IDENTITY, RUNTIME = "identity", "runtime"
# Counts and sizes past 2**31 - 1 are unusable (`--steps 10**20` trained
# forever); the seed also seeds numpy's global generator, [0, 2**32)
# (`--seed 2**32` ended in its ValueError).
INT_LIMIT, SEED_LIMIT = 2**31 - 1, 2**32 - 1
# `--num-layers 1000` ended in a RecursionError
# (`keras.src.ops.function._build_map_helper`); 512 layers build, save and
# load (tests/test_grid_identity.py).
MAX_LAYERS = 512
_LAYERS_WHY = ("Keras builds and loads a model by a walk that recurses once "
               "per layer, and Python stops at 1000 frames by default")
# Real settings reach float32 (`validation.FLOAT32_MAX`).
REAL_LIMIT = validation.FLOAT32_MAX


@dataclasses.dataclass(frozen=True)
class Setting:
    """The declaration of one `TrainConfig` field (its
    `metadata["setting"]`)."""

    group: str  # A key of `GROUPS`: its section of `--help`.
    help: Optional[str] = None  # `{default}` becomes the default's text.
    # `check(value, name)` raises `ValueError` naming `name`; default:
    # `choices`, or by type.
    check: Optional[Callable] = None
    choices: Optional[tuple] = None  # The values allowed (and the metavar).
    parse: Optional[Callable] = None  # `parse(text, name)`: "2.5" -> 2.5.
    aliases: tuple = ()  # More flag names (`--lr`).
    metavar: Optional[str] = None  # Default `N`, or the choices.
    kind: str = IDENTITY  # Or `RUNTIME` (`RUNTIME_FIELDS`).
    # May differ under one compiled step (never a shape): `PER_RUN`.
    per_run: bool = False
    hparam: bool = False  # Logged as a TensorBoard HParam.
    task_option: bool = False  # A keyword argument of `make_task`.
    # The option (default `--key-dim` for `key_dim`), or False.
    flag: Union[str, bool] = True


def setting(default, group, help=None, check=None, **declaration):
    """A `TrainConfig` field: its default and its `Setting`."""
    if check is None and declaration.get("choices") is not None:
        check = functools.partial(validation.check_choice,
                                  choices=declaration["choices"])
    return dataclasses.field(default=default, metadata={
        "setting": Setting(group, help, check, **declaration)})


def _int(minimum=1, maximum=INT_LIMIT, **options):
    return functools.partial(validation.check_int, minimum=minimum,
                             maximum=maximum, **options)


def _real(low=-REAL_LIMIT, high=REAL_LIMIT, **options):
    return functools.partial(validation.check_real, low=low, high=high,
                             **options)


def _mode(modes):
    return functools.partial(validation.check_mode_or_real, modes=modes,
                             high=REAL_LIMIT)


def _parse_mode(text, name):
    """One of the setting's modes (any case), or a number."""
    modes = DECLARED[name].check.keywords["modes"]
    try:
        return text.lower() if text.lower() in modes else float(text)
    except ValueError:
        return DECLARED[name].check(text, name)  # Refused, naming it.


_OPTIONAL, _RATE = _int(allow_none=True), _real(0.0, 1.0, high_open=True)
_POSITIVE = _real(0.0, low_open=True)
_POSITIVE_OR_NONE = _real(0.0, low_open=True, allow_none=True)
_TEXT = functools.partial(validation.check_text, allow_none=True)
_TASK = dict(check=_OPTIONAL, task_option=True)
_REPORTING = dict(kind=RUNTIME, per_run=True)
# A check by the setting's type.
_BY_TYPE = {(int,): _int(), (bool,): validation.check_bool}
# `corpus`: the task checks it.
_TASKS_CHECK = lambda value, name: value  # noqa: E731


@dataclasses.dataclass
class TrainConfig:
    """Every setting of a training run (a field is its flag with `_` for
    `-`; `flags` adds "(default: X)" to a help without one), and `sources`:
    `{setting: its value's source}`."""

    task: str = setting("recall", "task", "synthetic task",
                        choices=TASK_NAMES, hparam=True)
    seq_len: Optional[int] = setting(
        None, "task", "sequence length (recall: num-pairs + 1)", **_TASK)
    vocab_size: Optional[int] = setting(
        None, "task", "token ids incl. padding (reverse, sort, copy)",
        aliases=("--vocab",), **_TASK)
    min_len: Optional[int] = setting(
        None, "task", "shortest content length (default: fixed length)",
        **_TASK)
    num_pairs: Optional[int] = setting(
        None, "task", "recall: key-value pairs per example", **_TASK)
    num_keys: Optional[int] = setting(
        None, "task", "recall: size of the key alphabet", **_TASK)
    num_values: Optional[int] = setting(
        None, "task", "recall: size of the value alphabet (classes)",
        **_TASK)
    text_files: Optional[list] = setting(
        None, "task", "text: a UTF-8 file, or a directory of .txt files, to "
        "train on (repeatable); without it, this Python's standard-library "
        "source", lambda value, name: check_text_files(value),
        metavar="PATH", task_option=True, flag="--text-file")
    # The text's corpus (Python version, files, SHA-256, split, vocabulary),
    # derived from `text_files`, so that config.json says what the run
    # trained on.
    corpus: Optional[dict] = setting(None, "task", task_option=True,
                                     flag=False)
    train_size: Optional[int] = setting(
        None, "task", "fixed training pool (default: fresh samples every "
        "step)", _OPTIONAL)
    # The model: `keras_attention.models.build_sequence_model`'s arguments.
    d_model: int = setting(64, "model", "residual stream width",
                           aliases=("--width",), hparam=True)
    num_layers: int = setting(
        1, "model", "attention blocks",
        _int(1, MAX_LAYERS, expected=(
            f"an integer in [1, {MAX_LAYERS}] ({_LAYERS_WHY})")),
        aliases=("--layers",), hparam=True)
    key_dim: int = setting(64, "model", "d_k, per-head query/key size",
                           hparam=True)
    num_heads: int = setting(1, "model", "attention heads", hparam=True)
    value_dim: Optional[int] = setting(
        None, "model", "per-head value size (default: key-dim)", _OPTIONAL)
    causal: bool = setting(False, "model", "causal attention mask")
    norm: str = setting("pre", "model", "pre- or post-layer-norm blocks",
                        choices=NORM_MODES)
    ff_dim: Optional[int] = setting(
        None, "model", "feed-forward width (default: 4 * d-model; 0: none)",
        _int(0, allow_none=True))
    ff_activation: str = setting("gelu", "model", "feed-forward activation",
                                 choices=FF_ACTIVATIONS)
    dropout: float = setting(0.0, "model", "", _RATE, metavar="RATE")
    qk_init_std: Union[str, float] = setting(
        "unit", "model",
        "init of W_Q, W_K (unit: N(0, 1/d_model); default: {default})",
        _mode(QK_INIT_MODES), parse=_parse_mode,
        metavar="{unit,glorot,FLOAT}")
    qk_init_gain: float = setting(
        1.0, "model", "factor applied to W_Q, W_K after init", _POSITIVE,
        metavar="GAIN")
    # The attention: `build_sequence_model`'s `attention_options`.
    scale: Union[str, float] = setting(
        "sqrt", "attention", "score scale: sqrt 1/sqrt(d_k), none 1, inverse "
        "1/d_k (muP), learned a trainable scalar, or a fixed number",
        _mode(SCALE_MODES), parse=_parse_mode,
        metavar="{" + ",".join(SCALE_MODES) + ",FLOAT}", hparam=True)
    qk_norm: bool = setting(False, "attention",
                            "layer-normalize queries and keys", hparam=True)
    implementation: str = setting("auto", "attention", "attention kernel",
                                  choices=IMPLEMENTATIONS)
    logit_soft_cap: Optional[float] = setting(
        None, "attention", "soft cap C of the scores: C * tanh(s / C)",
        _POSITIVE_OR_NONE, metavar="C")
    # The optimizer: the rate is the peak, after `warmup_steps` of linear
    # warmup from 0; weight decay is decoupled for adamw, else coupled.
    optimizer: str = setting("adam", "optimizer", "", choices=OPTIMIZERS,
                             hparam=True)
    learning_rate: float = setting(
        1e-3, "optimizer", "peak learning rate", _POSITIVE,
        aliases=("--lr",), metavar="LR", per_run=True, hparam=True)
    momentum: float = setting(0.9, "optimizer", "SGD momentum", _RATE,
                              metavar="M")
    warmup_steps: int = setting(
        0, "optimizer",
        "linear learning-rate warmup (default: {default}; at most steps/10)",
        _int(0), aliases=("--warmup",))
    weight_decay: float = setting(
        0.0, "optimizer", "(default: {default}; 0.01 for adamw)", _real(0.0),
        metavar="WD")
    clip_norm: Optional[float] = setting(
        None, "optimizer", "clip the global gradient norm",
        _POSITIVE_OR_NONE, metavar="NORM")
    # Decaying to 0 settles the last few percent of accuracy.
    lr_schedule: str = setting("cosine", "optimizer", "after warmup",
                               choices=LR_SCHEDULES)
    # The loop. `steps` is an identity setting: it sets the length of the
    # cosine schedule (a 20-step run continued to 40 ended at held-out loss
    # 2.98989, a fresh 40-step one 2.99765).
    batch_size: int = setting(64, "loop", "global batch size")
    steps: int = setting(2000, "loop", "optimizer steps", per_run=True)
    seed: int = setting(0, "loop", "seed of weights and data",
                        _int(0, SEED_LIMIT), metavar="S", per_run=True,
                        hparam=True)
    eval_every: int = setting(100, "loop", "held-out evaluation interval",
                              **_REPORTING)
    diagnostics_every: int = setting(
        250, "loop", "attention diagnostics interval", **_REPORTING)
    # The Images tab's heat maps: 15 ms a call at d_k 1024 on a CPU, a third
    # of a diagnostics.
    heatmap_every: int = setting(
        250, "loop", "interval of the heat-map images among the diagnostics",
        kind=RUNTIME)
    checkpoint_every: int = setting(250, "loop", "checkpoint interval",
                                    **_REPORTING)
    log_every: int = setting(
        10, "loop", "train scalars and progress interval", **_REPORTING)
    heldout_size: int = setting(1024, "loop", "held-out examples")
    probe_size: int = setting(
        16, "loop", "held-out examples in the diagnostics batch")
    target_accuracy: float = setting(
        0.9, "loop", "held-out accuracy for steps_to_target",
        _real(0.0, 1.0), metavar="ACC", **_REPORTING)
    # Devices. The backend is part of the run's identity: a run is resumed
    # on the backend it started on, never continued on another.
    backend: Optional[str] = setting(
        None, "devices", "Keras backend, set before Keras is imported "
        "(default: the running Keras backend; KERAS_BACKEND or "
        "~/.keras/keras.json choose it, as for any Keras program, else "
        "tensorflow, jax, torch, the first installed)", choices=BACKENDS)
    strategy: str = setting("auto", "devices", "distribution strategy",
                            choices=STRATEGIES, kind=RUNTIME)
    precision: str = setting("auto", "devices", "dtype policy",
                             choices=PRECISIONS)
    jit_compile: str = setting(
        "auto", "devices", "compile the train step (XLA; torch.compile on "
        "torch, only when on)", choices=JIT_MODES, kind=RUNTIME)
    deterministic: bool = setting(
        False, "devices", "repeatable runs: deterministic kernels on every "
        "backend (TensorFlow's op determinism, XLA's deterministic GPU "
        "ops on JAX, torch's deterministic algorithms, which fail rather "
        "than fall back)", hparam=True)
    logdir: Optional[str] = setting(
        None, "output", "run directory (default: runs/<task>); a run with "
        "checkpoints there is resumed", _TEXT, metavar="DIR", **_REPORTING)
    export: Optional[str] = setting(
        None, "output", "export the trained model to PATH", _TEXT,
        metavar="PATH", **_REPORTING)
    arm: Optional[str] = setting(
        None, "output", "label of this run in a comparison", _TEXT,
        metavar="LABEL", per_run=True, hparam=True)
    verbose: int = setting(
        1, "output", "1 for a progress bar, 0 for silence (--quiet)",
        _int(0), flag=False, **_REPORTING)
    sources: dict = dataclasses.field(default_factory=dict, compare=False,
                                      repr=False)

    def to_dict(self):
        """The settings as a JSON-serialisable dict (no `sources`)."""
        return {name: getattr(self, name) for name in SETTINGS}

    @classmethod
    def from_dict(cls, values, source="config"):
        """The config of a dict such as `to_dict()` or a run's config.json,
        as it is (nothing resolved); `UsageError` naming `source` on an
        unknown key."""
        check_names(values, source)
        return cls(**values, sources=dict.fromkeys(values, source))

    def replace(self, **changes):
        """A copy with `changes` (their source: `"replace()"`)."""
        sources = {**self.sources, **dict.fromkeys(changes, "replace()")}
        return dataclasses.replace(self, **changes, sources=sources)

    def validate(self):
        """Checks each setting, then the settings together (the task's
        options, sizes, outputs, backend); raises `UsageError` naming the
        flag. Writes nothing."""
        try:
            for name, declared in DECLARED.items():
                declared.check(getattr(self, name), name)
            if self.warmup_steps > self.steps:
                raise UsageError(
                    f"--warmup-steps ({self.warmup_steps}) must not exceed "
                    f"--steps ({self.steps})")
            make_task(self.task, **self.task_options())
            # Its own checks.
            ScaledDotProductAttention(self.key_dim, **self.group("attention"))
        except ValueError as error:
            raise usage_error(error, FLAGS) from None
        for small, large in (("probe_size", "heldout_size"),
                             ("batch_size", "train_size")):
            if (getattr(self, large) is not None
                    and getattr(self, large) < getattr(self, small)):
                raise UsageError(
                    f"{FLAGS[large]} ({getattr(self, large)}) must be at "
                    f"least {FLAGS[small]} ({getattr(self, small)})")
        check_run_outputs(self.logdir, self.export)
        if self.backend != keras.backend.backend():
            raise UsageError(
                f"--backend {self.backend}: this process runs Keras on "
                f"{keras.backend.backend()}, and Keras's backend is chosen "
                "once, before it is imported; give --backend on the command "
                "line or set KERAS_BACKEND")

    def task_options(self):
        """The task options that are set: `make_task`'s keyword
        arguments."""
        return {name: getattr(self, name) for name in TASK_OPTIONS
                if getattr(self, name) is not None}

    def group(self, group):
        """`{name: value}` of a group: `"model"` is `build_sequence_model`'s
        keyword arguments, `"attention"` its `attention_options`."""
        return {name: getattr(self, name)
                for name, declared in DECLARED.items()
                if declared.group == group}


_HINTS = typing.get_type_hints(TrainConfig)


def value_types(name):
    """A setting's value types, `None` left out: `(str, float)` for
    `scale`."""
    return tuple(kind for kind in typing.get_args(_HINTS[name])
                 if kind is not type(None)) or (_HINTS[name],)


# `{name: Setting}` of every setting in order (checked by type if declared
# without), its flag.
DECLARED = {
    field.name: dataclasses.replace(
        field.metadata["setting"],
        check=(field.metadata["setting"].check
               or _BY_TYPE.get(value_types(field.name), _TASKS_CHECK)))
    for field in dataclasses.fields(TrainConfig)
    if "setting" in field.metadata}
SETTINGS = tuple(DECLARED)
FLAGS = {name: declared.flag if isinstance(declared.flag, str)
         else "--" + name.replace("_", "-")
         for name, declared in DECLARED.items()}
# The command-line flag of a setting: `key_dim` -> `--key-dim`.
flag = FLAGS.__getitem__


def _declared(**wanted):
    return tuple(name for name, declared in DECLARED.items()
                 if all(getattr(declared, key) == value
                        for key, value in wanted.items()))


CHOICES = {name: declared.choices for name, declared in DECLARED.items()
           if declared.choices}
TASK_OPTIONS = _declared(task_option=True)  # None unless the task takes it.
RUNTIME_FIELDS = _declared(kind=RUNTIME)  # May differ on resume.
PER_RUN = _declared(per_run=True)  # May differ under one compiled step.
HPARAMS = _declared(hparam=True)  # Logged as HParams.


# Settings that suit each task: a default run reaches >= 99% held-out
# accuracy on a 2-core CPU in minutes (recall 100% from step 600, reverse
# 100% from step 200, sort 99.4% at step 400).
TASK_DEFAULTS = {
    # One-hop recall: the query finds its key by content, what the q.k
    # score measures. SGD does not rescale updates per parameter (Adam
    # would): scales show their raw effect on gradients.
    "recall": dict(num_pairs=16, num_keys=64, num_values=16, d_model=64,
                   num_layers=1, key_dim=64, optimizer="sgd",
                   learning_rate=0.05, momentum=0.9, warmup_steps=100,
                   steps=1000),
    # Reversal is positional: position i reads position T-1-i.
    "reverse": dict(seq_len=16, vocab_size=16, d_model=64, num_layers=1,
                    key_dim=32, optimizer="adam", learning_rate=3e-3,
                    warmup_steps=50, steps=600),
    # Sorting finds the token of each rank, which takes counting over the
    # input: two layers.
    "sort": dict(seq_len=16, vocab_size=16, d_model=64, num_layers=2,
                 key_dim=32, optimizer="adam", learning_rate=3e-3,
                 warmup_steps=100, steps=1000),
    # Copying: one layer finds each symbol by position, a second lines the
    # halves up.
    "copy": dict(seq_len=21, vocab_size=16, d_model=64, num_layers=2,
                 key_dim=32, optimizer="adam", learning_rate=3e-3,
                 warmup_steps=100, steps=1000),
    # Causal, by character: 2.39 bits/char (unigram 4.56) in 600 steps;
    # docs/results.md.
    "text": dict(seq_len=128, d_model=128, num_layers=4, num_heads=4,
                 key_dim=32, causal=True, learning_rate=3e-3, steps=600,
                 warmup_steps=60, batch_size=32, probe_size=32),
}
_DEFAULTS = TrainConfig()


class Layer(NamedTuple):
    """The settings one source gave (`"flags"`): a value in `values` was
    given, whatever it is."""

    source: str
    values: dict


def resolve_config(layers):
    """One `TrainConfig` of `Layer`s in increasing priority, over the
    defaults of the task the last layer naming one names. What no layer gave
    is derived (`warmup_steps` from `steps`, `weight_decay` from
    `optimizer`, `logdir` from `task`, `corpus` from `text_files`);
    `sources[name]` says so, or names the layer, `"task defaults"` or
    `"default"`."""
    layers = list(layers)
    task = _DEFAULTS.task
    for layer in layers:
        check_names(layer.values, layer.source)
        task = layer.values.get("task", task)
    try:
        validation.check_choice(task, "task", TASK_NAMES)
        values = {**_DEFAULTS.to_dict(), **TASK_DEFAULTS[task]}
        sources = {name: "task defaults" if name in TASK_DEFAULTS[task]
                   else "default" for name in values}
        for layer in layers:
            values.update(layer.values)
            sources.update(dict.fromkeys(layer.values, layer.source))
        given = {name for layer in layers for name in layer.values}
        derived = {}
        if "warmup_steps" not in given and validation.is_int(values["steps"]):
            # A short run gets a proportionally short default warmup.
            warmup = TASK_DEFAULTS[task].get("warmup_steps",
                                             _DEFAULTS.warmup_steps)
            derived["warmup_steps"] = (
                min(warmup, max(values["steps"] // 10, 0)), "steps")
        if "weight_decay" not in given and values["optimizer"] == "adamw":
            derived["weight_decay"] = (0.01, "optimizer")
        if values["logdir"] is None:
            derived["logdir"] = (os.path.join("runs", task), "task")
        if values["backend"] is None:
            derived["backend"] = (keras.backend.backend(),
                                  "the Keras backend")
        if task == "text":
            derived["corpus"] = (_text_corpus(values, sources), "text_files")
        for name, (value, origin) in derived.items():
            values[name], sources[name] = value, f"derived from {origin}"
        for name, declared in DECLARED.items():
            if (declared.parse is not None
                    and isinstance(values[name], str)):
                values[name] = declared.parse(values[name], name)
    except ValueError as error:
        raise usage_error(error, FLAGS) from None
    return TrainConfig(**values, sources=sources)


def _text_corpus(values, sources):
    """The text's corpus; one a layer gave (config.json) must be the text
    read now."""
    corpus, given = describe_corpus(values["text_files"]), values["corpus"]
    if given is not None and given != corpus:
        given_sha = given.get("sha256") if isinstance(given, dict) else given
        raise UsageError(
            f"{sources['corpus']}: its corpus (sha256 {given_sha!r}) is not "
            f"the text read now (sha256 {corpus['sha256']}); leave corpus "
            "out to train on the text as it is")
    return corpus


def check_names(values, source):
    """`UsageError` unless `values` is a dict of settings."""
    if not isinstance(values, dict):
        raise UsageError(f"{source} must hold a JSON object of settings; "
                         f"got {type(values).__name__}")
    unknown = ", ".join(sorted(set(values) - set(SETTINGS)))
    if unknown:
        raise UsageError(f"{source}: unknown setting(s) {unknown}")
