"""The checks of a training config, each naming the setting by its flag.

The checks of one setting (`positive_int`, `real(...)`, `boolean`, ...) are
what `pipelines.settings` declares for each field; `TrainConfig.validate()`
runs them, then `check_relations` (the checks across settings: warmup and
steps, held-out and probe sizes, the task's options, the outputs). Each
raises `UsageError` with the flag's name (`--key-dim must be an integer in
[1, 2147483647]; got 0`), so the command line reports one line and exits 2
before anything is written. `parse_scale` and `parse_init_std` read the
text of `--scale` and `--qk-init-std` as a mode or a number.

This module does not import `pipelines.settings` (which declares with it).
"""

import functools
import inspect
import math
import numbers
import os
import re

from keras_attention.models import QK_INIT_MODES
from keras_attention.ops import SCALE_MODES
from keras_attention.tasks import TASK_NAMES
from keras_attention.tasks import make_task
from keras_attention.tasks.corpus import describe_corpus
from keras_attention.validation import is_int
from keras_attention.validation import is_positive_real
from pipelines.common import UsageError
from pipelines.common import check_writable_directory

# Integer settings are counts and sizes of one run: past 2**31 - 1 none is
# usable (`--steps 10**20` was accepted and trained forever).
INT_LIMIT = 2**31 - 1
# The seed also seeds numpy's global generator (through Keras), which takes
# [0, 2**32): `--seed 2**32` ended in numpy's ValueError.
SEED_LIMIT = 2**32 - 1
# Keras builds a functional model, and builds it again when it loads one, by
# a graph walk that recurses once per layer
# (`keras.src.ops.function._build_map_helper`), and Python stops at 1000
# frames by default: `--num-layers 1000` ended in a RecursionError while
# building the model (987 frames of the walk; importing TensorFlow raises
# the limit to 3000, a JAX or torch process without it keeps 1000). 512
# leaves the callers' frames room: a 512-layer model builds, saves and
# loads under the default limit (tests/test_grid_identity.py).
MAX_LAYERS = 512
_LAYERS_WHY = ("Keras builds and loads a model by a walk that recurses once "
               "per layer, and Python stops at 1000 frames by default")
# Real settings reach the float32 computation (and its event files): a
# finite float64 past float32's largest value, `--learning-rate 1e308`,
# ended in an overflow when it was logged.
REAL_LIMIT = float(3.4028234663852886e38)
# Files that say a directory is something other than a run, which `train`
# must not write into (`pipelines.compare.COMPARISON_JSON`,
# `pipelines.sweep.SWEEP_JSON`, a grid's identity
# `pipelines.engine.identity.GRID_FILE`, and a SavedModel's graph;
# test_config checks the names agree).
NOT_A_RUN = {
    "grid.json": "a grid's root",
    "comparison.json": "a comparison's root",
    "sweep.json": "a sweep's root",
    "saved_model.pb": "an exported SavedModel",
}


def flag(name):
    """The command-line flag of a setting: `key_dim` -> `--key-dim`."""
    if name == "text_files":  # One file a flag, repeated.
        return "--text-file"
    return "--" + name.replace("_", "-")


def check_task_name(task):
    """Raises `UsageError` unless `task` is one of `TASK_NAMES`."""
    if task not in TASK_NAMES:
        raise UsageError(
            f"--task must be one of {', '.join(TASK_NAMES)}; got {task!r}"
        )


# ------------------------------------------------------------------ parsing
def _parse_mode(text, name, modes):
    """Text read as one of `modes` (any case) or as a number; whether the
    number is allowed is the setting's check (`mode_or_number`)."""
    if text.lower() in modes:
        return text.lower()
    try:
        return float(text)
    except ValueError:
        raise UsageError(
            f"{flag(name)} must be {', '.join(modes)} or a positive number; "
            f"got {text!r}"
        ) from None


def parse_scale(text):
    """`--scale` text: one of `SCALE_MODES`, or a number."""
    return _parse_mode(text, "scale", SCALE_MODES)


def parse_init_std(text):
    """`--qk-init-std` text: `unit`, `glorot`, or a number."""
    return _parse_mode(text, "qk_init_std", QK_INIT_MODES)


# ------------------------------------------------------------------- checks
def check_int(config, name, minimum, allow_none=False, maximum=INT_LIMIT,
              why=None):
    """Raises `UsageError` unless the setting is an integer in
    `[minimum, maximum]`; `why` says why the maximum is what it is."""
    value = getattr(config, name)
    if value is None and allow_none:
        return
    if not is_int(value) or not minimum <= value <= maximum:
        raise UsageError(
            f"{flag(name)} must be an integer in [{minimum}, {maximum}]"
            + (f" ({why})" if why and is_int(value) and value > maximum
               else "") + f"; got {value!r}"
        )


def check_choice(config, name, choices):
    """Raises `UsageError` unless the setting is one of `choices`."""
    value = getattr(config, name)
    if value not in choices:
        raise UsageError(
            f"{flag(name)} must be one of {', '.join(choices)}; got {value!r}"
        )


def check_real(config, name, low=-REAL_LIMIT, high=REAL_LIMIT, low_open=False,
               high_open=False, allow_none=False):
    """Raises `UsageError` unless the setting is a finite number in the
    interval (`low_open`/`high_open` exclude the bound; the bounds default
    to float32's range), or `None` with `allow_none`."""
    value = getattr(config, name)
    if value is None and allow_none:
        return
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
            ("(" if low_open else "[") + f"{low:g}, {high:g}"
            + (")" if high_open else "]")
        )
        raise UsageError(
            f"{flag(name)} must be a finite number in {interval}; got "
            f"{value!r}"
        )


# The checks `pipelines.settings` declares: `check(config, name)`.
positive_int = functools.partial(check_int, minimum=1)
positive_int_or_none = functools.partial(check_int, minimum=1, allow_none=True)
non_negative_int = functools.partial(check_int, minimum=0)
non_negative_int_or_none = functools.partial(check_int, minimum=0,
                                             allow_none=True)
seed_range = functools.partial(check_int, minimum=0, maximum=SEED_LIMIT)
layer_count = functools.partial(check_int, minimum=1, maximum=MAX_LAYERS,
                                why=_LAYERS_WHY)


def real(**interval):
    """The check of a real setting: `check_real` with `interval`."""
    return functools.partial(check_real, **interval)


def one_of(choices):
    """The check of a setting with a fixed set of values."""
    return functools.partial(check_choice, choices=choices)


def boolean(config, name):
    value = getattr(config, name)
    if not isinstance(value, bool):
        raise UsageError(f"{flag(name)} must be true or false; got {value!r}")


def text_or_none(config, name):
    value = getattr(config, name)
    if value is not None and not isinstance(value, str):
        raise UsageError(f"{flag(name)} must be a string; got {value!r}")


def paths_or_none(config, name):
    value = getattr(config, name)
    if value is not None and not (
            isinstance(value, list) and value
            and all(isinstance(path, str) and path for path in value)):
        raise UsageError(f"{flag(name)} must be paths; got {value!r}")


def check_mode_or_number(config, name, modes, low=0.0, high=REAL_LIMIT,
                         low_open=True):
    """Raises `UsageError` unless the setting is one of `modes` or a finite
    number in `(low, high]` (`scale`, `qk_init_std`): past float32's
    largest, `--scale 1e308` ended in a conversion error inside the
    layer."""
    value = getattr(config, name)
    if not ((isinstance(value, str) and value in modes)
            or (is_positive_real(value) and value <= high)):
        raise UsageError(
            f"{flag(name)} must be {', '.join(modes)} or a number in "
            f"({low:g}, {high:g}]; got {value!r}"
        )


def mode_or_number(modes):
    """The check of a setting that is one of `modes` or a positive finite
    number up to float32's largest (`scale`, `qk_init_std`)."""
    return functools.partial(check_mode_or_number, modes=modes)


def numeric_range(check):
    """`(low, high, low_open, high_open)`: the numbers a declared check
    accepts (`check_int`, `check_real`, `check_mode_or_number` with their
    bounds), or `None` for a check of something else."""
    func = getattr(check, "func", None)
    if func not in (check_int, check_real, check_mode_or_number):
        return None
    bounds = {name: parameter.default for name, parameter
              in inspect.signature(func).parameters.items()}
    bounds.update(check.keywords)
    if func is check_int:
        return bounds["minimum"], bounds["maximum"], False, False
    return (bounds["low"], bounds["high"], bounds["low_open"],
            bounds.get("high_open", False))


def build_task_or_usage_error(config, task_options):
    """Builds the config's task, turning the task's `ValueError` into a
    `UsageError` that names the flag.

    Args:
        config: a `TrainConfig`.
        task_options: the names of every task option (`TASK_OPTIONS`), whose
            names in the task's messages become flags.

    Returns:
        A `keras_attention.tasks.SequenceTask`.
    """
    check_task_name(config.task)
    try:
        return make_task(config.task, **config.task_options())
    except ValueError as error:
        message = str(error)
        for name in tuple(task_options) + ("batch_size",):
            message = message.replace(f"`{name}`", flag(name))
        # "Unknown option(s) ['seq_len'] for task 'recall'" names options
        # the task does not take.
        for name in task_options:
            message = message.replace(f"'{name}'", flag(name))
        # "must be an integer >= num_pairs (4)" names a bound's setting.
        for name in task_options:
            message = re.sub(rf"\b{name}\b", flag(name), message)
        raise UsageError(f"--task {config.task}: {message}") from None


def text_corpus(values, sources):
    """The text task's corpus, `describe_corpus(values["text_files"])`; a
    bad file is a `UsageError` naming it, and so is a `corpus` a layer gave
    (a run's config.json) that is not the text read now."""
    try:
        corpus = describe_corpus(values["text_files"])
    except ValueError as error:
        raise UsageError(str(error).replace("`text_files`:", "--text-file")
                         .replace("`text_files`", "--text-file")
                         .rstrip(".")) from None
    if values["corpus"] is not None and values["corpus"] != corpus:
        given = values["corpus"]
        raise UsageError(
            f"{sources['corpus']}: its corpus (sha256 "
            f"{given.get('sha256') if isinstance(given, dict) else given!r}) "
            f"is not the text read now (sha256 {corpus['sha256']}); leave "
            "corpus out to train on the text as it is"
        )
    return corpus


def check_relations(config, task_options):
    """The checks across settings of `config`, after each setting's own;
    raises `UsageError` naming the flags.

    Touches nothing on disk: the log directory is only checked for
    writability.

    Args:
        config: a resolved `TrainConfig`.
        task_options: the names of every task option.
    """
    if config.warmup_steps > config.steps:
        raise UsageError(
            f"--warmup-steps ({config.warmup_steps}) must not exceed "
            f"--steps ({config.steps})"
        )
    build_task_or_usage_error(config, task_options)
    _check_sizes(config)
    _check_outputs(config)


def _check_sizes(config):
    if config.heldout_size < config.probe_size:
        raise UsageError(
            f"--heldout-size ({config.heldout_size}) must be at least "
            f"--probe-size ({config.probe_size})"
        )
    if config.train_size is not None and config.train_size < config.batch_size:
        raise UsageError(
            f"--train-size ({config.train_size}) must be at least "
            f"--batch-size ({config.batch_size})"
        )


def _check_outputs(config):
    if not isinstance(config.logdir, str) or not config.logdir:
        raise UsageError(f"--logdir must be a directory; got {config.logdir!r}")
    check_writable_directory(config.logdir, "--logdir")
    for marker, what in NOT_A_RUN.items():
        if os.path.exists(os.path.join(config.logdir, marker)):
            raise UsageError(
                f"--logdir {config.logdir} is {what} ({marker}); train into "
                "a directory of its own"
            )
    if config.export is not None and (
        not isinstance(config.export, str) or not config.export
    ):
        raise UsageError(f"--export must be a path; got {config.export!r}")
    if config.export is not None:
        run_dir = os.path.abspath(config.logdir)
        export = os.path.abspath(config.export)
        if os.path.commonpath([run_dir, export]) == run_dir:
            # Checked now: the export would otherwise fail (or replace the
            # run's own files) only once training is done.
            raise UsageError(
                f"--export {config.export} is inside the run directory "
                f"--logdir {config.logdir}; export to a path outside it"
            )


def check_setting_names(values, source, names):
    """Raises `UsageError` unless `values` is a dict whose keys are among
    `names` (the settings).

    Args:
        values: the settings one source gave.
        source: the source, for the message (`"--config run.json"`).
        names: every setting's name.
    """
    if not isinstance(values, dict):
        raise UsageError(
            f"{source} must hold a JSON object of settings; got "
            f"{type(values).__name__}"
        )
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise UsageError(f"{source}: unknown setting(s) {', '.join(unknown)}")
