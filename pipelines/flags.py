"""The command-line flags of every command that trains (`train`, `compare`).

`add_train_arguments(parser)` adds one flag per `TrainConfig` setting;
`settings_from_args(args)` turns the parsed flags into the layers they give
(a `--config FILE` layer holding exactly the file's keys, then a `flags`
layer holding exactly the flags given); `config_from_args(args)` resolves
them into a `TrainConfig`.

Every flag defaults to `None`, which means "not given": a config file can set
a boolean that `--no-...` then overrides. Numbers are converted by argparse
(`type=` from the dataclass's annotations), so a bad value exits 2 with one
line naming the flag. Defaults in the help come from the dataclass and
`TASK_DEFAULTS`, so they cannot drift from what a run uses.
"""

import argparse
import json
import typing

from keras_attention.ops import SCALE_MODES
from keras_attention.tasks import TASK_NAMES
from pipelines.config import CHOICES
from pipelines.config import SETTINGS
from pipelines.config import TASK_DEFAULTS
from pipelines.config import Layer
from pipelines.config import TrainConfig
from pipelines.common import UsageError
from pipelines.config_checks import check_setting_names
from pipelines.config import resolve_config

_HINTS = typing.get_type_hints(TrainConfig)
_DEFAULTS = TrainConfig()


def _converter(kind, expected):
    """An argparse `type=`: `kind(text)`, or a one-line error saying what
    was expected (argparse names the flag)."""

    def convert(text):
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be {expected}; got {text!r}"
            ) from None

    return convert


_integer = _converter(int, "an integer")
_number = _converter(float, "a number")


def _flag_type(name):
    """The argparse `type=` of a setting: from its annotation, `None` (text)
    for strings and for `scale`/`qk_init_std`, which resolving parses."""
    hint = _HINTS[name]
    kinds = [kind for kind in typing.get_args(hint) if kind is not type(None)]
    kinds = kinds or [hint]
    if kinds == [int]:
        return _integer
    if kinds == [float]:
        return _number
    return None


def default_text(name):
    """The default of a setting as the help states it: the dataclass
    default, or `recall 1000, reverse 600, ...` where the tasks' differ."""
    texts = {
        task: _text(defaults.get(name, getattr(_DEFAULTS, name)))
        for task, defaults in TASK_DEFAULTS.items()
    }
    if len(set(texts.values())) == 1:
        return texts[TASK_NAMES[0]]
    return ", ".join(f"{task} {text}" for task, text in texts.items())


def _text(value):
    return f"{value:g}" if isinstance(value, float) else str(value)


def _choices(values):
    return "{" + ",".join(values) + "}"


def _add(group, name, *aliases, help=None, metavar="N"):
    """Adds the flag of setting `name`; `{default}` in `help` becomes the
    default's text."""
    if help is not None:
        help = help.replace("{default}", default_text(name))
    option = "--" + name.replace("_", "-")
    if _HINTS[name] is bool:
        group.add_argument(option, *aliases, dest=name, default=None,
                           action=argparse.BooleanOptionalAction, help=help)
        return
    if name in CHOICES:
        metavar = _choices(CHOICES[name])
    group.add_argument(option, *aliases, dest=name, default=None,
                       type=_flag_type(name), metavar=metavar, help=help)


def add_train_arguments(parser):
    """Adds every `TrainConfig` flag, and `--config`, `--quiet`, to a parser.

    Args:
        parser: an `argparse.ArgumentParser`.

    Returns:
        The parser.
    """
    task = parser.add_argument_group("task")
    _add(task, "task", metavar=_choices(TASK_NAMES),
         help="task (default: {default})")
    _add(task, "seq_len", help="sequence length (recall: num-pairs + 1)")
    _add(task, "vocab_size", "--vocab",
         help="token ids incl. padding (reverse, sort, copy)")
    _add(task, "min_len", help="shortest content length (default: fixed "
         "length)")
    _add(task, "num_pairs", help="recall: key-value pairs per example")
    _add(task, "num_keys", help="recall: size of the key alphabet")
    _add(task, "num_values", help="recall: size of the value alphabet "
         "(classes)")
    _add(task, "train_size", help="fixed training pool (default: fresh "
         "samples every step)")
    task.add_argument("--text-file", dest="text_files", action="append",
                      default=None, metavar="PATH",
                      help="text: a UTF-8 file, or a directory of .txt files, "
                      "to train on (repeatable); without it, this Python's "
                      "standard-library source")

    model = parser.add_argument_group("model")
    _add(model, "d_model", "--width", help="residual stream width "
         "(default: {default})")
    _add(model, "num_layers", "--layers", help="attention blocks (default: "
         "{default})")
    _add(model, "key_dim", help="d_k, per-head query/key size (default: "
         "{default})")
    _add(model, "num_heads", help="attention heads (default: {default})")
    _add(model, "value_dim", help="per-head value size (default: key-dim)")
    _add(model, "scale", metavar=_choices(SCALE_MODES + ("FLOAT",)),
         help="score scale: sqrt 1/sqrt(d_k), none 1, inverse 1/d_k (muP), "
         "learned a trainable scalar, or a fixed number (default: {default})")
    _add(model, "qk_norm", help="layer-normalize queries and keys")
    _add(model, "causal", help="causal attention mask")
    _add(model, "norm", help="pre- or post-layer-norm blocks (default: {default})")
    _add(model, "ff_dim", help="feed-forward width (default: 4 * d-model; "
         "0: none)")
    _add(model, "dropout", metavar="RATE", help="(default: {default})")
    _add(model, "qk_init_std", metavar="{unit,glorot,FLOAT}",
         help="init of W_Q, W_K (unit: N(0, 1/d_model); default: {default})")
    _add(model, "qk_init_gain", metavar="GAIN",
         help="factor applied to W_Q, W_K after init (default: {default})")
    _add(model, "implementation", help="attention kernel (default: "
         "{default})")

    optim = parser.add_argument_group("optimizer")
    _add(optim, "optimizer", help="(default: {default})")
    _add(optim, "learning_rate", "--lr", metavar="LR",
         help="peak learning rate (default: {default})")
    _add(optim, "momentum", metavar="M", help="SGD momentum (default: "
         "{default})")
    _add(optim, "warmup_steps", "--warmup", help="linear learning-rate "
         "warmup (default: {default}; at most steps/10)")
    _add(optim, "weight_decay", metavar="WD",
         help="(default: {default}; 0.01 for adamw)")
    _add(optim, "clip_norm", metavar="NORM",
         help="clip the global gradient norm")
    _add(optim, "lr_schedule", help="after warmup (default: {default})")

    loop = parser.add_argument_group("training loop")
    _add(loop, "batch_size", help="global batch size (default: {default})")
    _add(loop, "steps", help="optimizer steps (default: {default})")
    _add(loop, "seed", metavar="S", help="seed of weights and data "
         "(default: {default})")
    _add(loop, "eval_every", help="held-out evaluation interval (default: "
         "{default})")
    _add(loop, "diagnostics_every", help="attention diagnostics interval "
         "(default: {default})")
    _add(loop, "heatmap_every", help="interval of the heat-map images among "
         "the diagnostics (default: {default})")
    _add(loop, "checkpoint_every", help="checkpoint interval (default: "
         "{default})")
    _add(loop, "log_every", help="train scalars and progress interval "
         "(default: {default})")
    _add(loop, "heldout_size", help="held-out examples (default: {default})")
    _add(loop, "probe_size", help="held-out examples in the diagnostics "
         "batch (default: {default})")
    _add(loop, "target_accuracy", metavar="ACC",
         help="held-out accuracy for steps_to_target (default: {default})")

    devices = parser.add_argument_group("devices")
    _add(devices, "backend", help="Keras backend, set before Keras is "
         "imported (default: the running Keras backend; KERAS_BACKEND or "
         "~/.keras/keras.json choose it, as for any Keras program, and "
         "tensorflow without them)")
    _add(devices, "strategy", help="distribution strategy (default: "
         "{default})")
    _add(devices, "precision", help="dtype policy (default: {default})")
    _add(devices, "jit_compile", help="XLA for the train step (default: "
         "{default})")
    _add(devices, "deterministic", help="deterministic kernels "
         "(TensorFlow op determinism, torch deterministic algorithms)")

    output = parser.add_argument_group("output")
    _add(output, "logdir", metavar="DIR", help="run directory (default: "
         "runs/<task>); a run with checkpoints there is resumed")
    _add(output, "export", metavar="PATH",
         help="export the trained model to PATH")
    _add(output, "arm", metavar="LABEL",
         help="label of this run in a comparison")
    output.add_argument("--config", metavar="FILE",
                        help="JSON file of settings; flags override it")
    output.add_argument("--quiet", "-q", action="store_true", default=None,
                        help="no progress bar")
    return parser


def settings_from_args(args):
    """The layers of settings that parsed flags give.

    Args:
        args: the `argparse.Namespace` of a parser set up with
            `add_train_arguments`.

    Returns:
        A list of `Layer`s in increasing priority: `Layer("--config FILE",
        {every key of the file})` when `--config` is given, then
        `Layer("flags", {every flag given})` (`--quiet` gives `verbose=0`).

    Raises:
        UsageError: when the config file cannot be read or has unknown keys.
    """
    layers = []
    path = getattr(args, "config", None)
    if path is not None:  # `--config ''` is a file that cannot be read.
        layers.append(Layer(f"--config {path}", load_config_file(path)))
    given = {
        name: getattr(args, name)
        for name in SETTINGS
        if getattr(args, name, None) is not None
    }
    if getattr(args, "quiet", None):
        given["verbose"] = 0
    layers.append(Layer("flags", given))
    return layers


def config_from_args(args):
    """The resolved `TrainConfig` of parsed flags: `resolve_config` over
    `settings_from_args(args)`, whose errors (and an unknown task or
    unparsable `--scale`) it raises as `UsageError`s naming the flag."""
    return resolve_config(settings_from_args(args))


def load_config_file(path):
    """Reads a JSON config file: the settings it gives, as a dict.

    The file holds an object whose keys are `TrainConfig` settings, for
    example `{"task": "sort", "steps": 500, "learning_rate": 0.003}`. A
    run's `config.json` is such a file. Lay it over the defaults with
    `resolve_config([Layer(f"--config {path}", values), ...])`.

    Raises:
        UsageError: if the file cannot be read, is not JSON, is not an
            object, or has unknown keys.
    """
    try:
        with open(path) as handle:
            values = json.load(handle)
    except OSError as error:
        raise UsageError(
            f"--config {path}: cannot read ({error.strerror})"
        ) from None
    except UnicodeDecodeError:
        raise UsageError(f"--config {path}: not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise UsageError(f"--config {path}: not valid JSON ({error})") from None
    except RecursionError:
        raise UsageError(f"--config {path}: nested too deeply") from None
    check_setting_names(values, f"--config {path}", SETTINGS)
    return values
