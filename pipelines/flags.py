"""The command-line flags of every command that trains (`train`, `compare`,
`sweep`): one per `TrainConfig` setting, from its declaration.

Every flag defaults to `None`, "not given": a config file can set a boolean
that `--no-...` then overrides. argparse converts numbers (by the setting's
type), so a bad value exits 2 with one line naming the flag. Defaults in the
help come from the dataclass and `TASK_DEFAULTS`, so they cannot drift.
"""

import argparse
import json

from keras_attention.files import path_problem
from keras_attention.tasks import TASK_NAMES
from pipelines.common import UsageError
from pipelines.settings import DECLARED
from pipelines.settings import GROUPS
from pipelines.settings import SETTINGS
from pipelines.settings import TASK_DEFAULTS
from pipelines.settings import Layer
from pipelines.settings import TrainConfig
from pipelines.settings import check_names
from pipelines.settings import flag
from pipelines.settings import resolve_config
from pipelines.settings import value_types

_DEFAULTS = TrainConfig()


def _converter(kind, expected):
    """An argparse `type=`: `kind(text)`, or an error saying `expected`."""

    def convert(text):
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be {expected}; got {text!r}") from None

    return convert


_TYPES = {(int,): _converter(int, "an integer"),
          (float,): _converter(float, "a number")}


def default_text(name):
    """A setting's default in its help: `64`, or `recall 1000, reverse 600,
    ...` where the tasks' differ."""
    texts = {task: _text(defaults.get(name, getattr(_DEFAULTS, name)))
             for task, defaults in TASK_DEFAULTS.items()}
    if len(set(texts.values())) == 1:
        return texts[TASK_NAMES[0]]
    return ", ".join(f"{task} {text}" for task, text in texts.items())


def _text(value):
    return f"{value:g}" if isinstance(value, float) else str(value)


def _add(group, name, declared, axis=None, as_list=None):
    """Adds the flag of setting `name`. Text and choices stay text, checked
    by `validate()`. With `axis` (more option names, maybe none) a plain
    value takes a list: `as_list(convert)` parses it, item by item."""
    help = declared.help
    if help is not None and "default" not in help and value_types(name) != (
            bool,) and getattr(_DEFAULTS, name) is not None:
        help = (help + " (default: {default})").strip()
    if help is not None:
        help = help.replace("{default}", default_text(name))
    names = (flag(name), *declared.aliases)
    if value_types(name) == (list,):  # One value a flag, repeated.
        group.add_argument(*names, dest=name, default=None, action="append",
                           metavar=declared.metavar, help=help)
        return
    if value_types(name) == (bool,):
        group.add_argument(*names, dest=name, default=None,
                           action=argparse.BooleanOptionalAction, help=help)
        return
    metavar = declared.metavar or "N"
    if declared.choices is not None:
        metavar = "{" + ",".join(declared.choices) + "}"
    convert = _TYPES.get(value_types(name))
    if axis is not None:
        # The axis's own name first: argparse names a bad item by it.
        convert, names = as_list(convert), (*axis, *names)
        help = (help or "") + "; a list V1,V2,... is an axis"
    group.add_argument(*names, dest=name, default=None,
                       type=convert, metavar=metavar, help=help)


def add_train_arguments(parser, axes=None, as_list=None):
    """Adds every `TrainConfig` flag, `--config` and `--quiet` to `parser`
    and returns it. `axes`: `{setting: more option names}` of the settings
    whose plain value may be a list (a grid's axes), each parsed by the
    `type=` `as_list(convert)`."""
    groups = {key: parser.add_argument_group(title)
              for key, title in GROUPS.items()}
    for name, declared in DECLARED.items():
        if declared.flag:
            _add(groups[declared.group], name, declared,
                 (axes or {}).get(name), as_list)
    groups["output"].add_argument(
        "--config", metavar="FILE",
        help="JSON file of settings; flags override it")
    groups["output"].add_argument("--quiet", "-q", action="store_true",
                                  default=None, help="no progress bar")
    return parser


def settings_from_args(args):
    """The `Layer`s of parsed flags, in increasing priority:
    `Layer("--config FILE", {every key of the file})` when `--config` is
    given, then `Layer("flags", {every flag given})` (`--quiet`:
    `verbose=0`). `UsageError` when the file is unreadable or wrong."""
    layers = []
    path = getattr(args, "config", None)
    if path is not None:  # `--config ''` is a file that cannot be read.
        layers.append(Layer(f"--config {path}", load_config_file(path)))
    given = {name: getattr(args, name) for name in SETTINGS
             if getattr(args, name, None) is not None}
    if getattr(args, "quiet", None):
        given["verbose"] = 0
    layers.append(Layer("flags", given))
    return layers


def config_from_args(args):
    """The resolved `TrainConfig` of parsed flags."""
    return resolve_config(settings_from_args(args))


def load_config_file(path):
    """The settings of a JSON config file (such as a run's `config.json`),
    `{"task": "sort", "steps": 500}`, as a dict; `UsageError` if the file
    cannot be read, is not a JSON object, or has unknown keys."""
    problem = path_problem(path) if path else None
    if problem is not None:  # A pipe's `open` would wait for a writer.
        raise UsageError(f"--config {path}: {problem}")
    try:
        with open(path) as handle:
            values = json.load(handle)
    except OSError as error:
        raise UsageError(
            f"--config {path}: cannot read ({error.strerror})") from None
    except UnicodeDecodeError:
        raise UsageError(f"--config {path}: not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise UsageError(
            f"--config {path}: not valid JSON ({error})") from None
    except RecursionError:
        raise UsageError(f"--config {path}: nested too deeply") from None
    check_names(values, f"--config {path}")
    return values
