"""The flags of a command that trains a grid (`compare`, `sweep`), and the
plan they make.

Every `train` flag that can be an axis takes a list (`--num-layers 1,2,4`);
a single value sets every run, or replaces a preset's axis. What the arms
and `--seeds` set per run is refused as a flag. Settings are layered as for
`train`, with the preset between the task defaults and the config file:

    dataclass defaults < TASK_DEFAULTS[task] < preset < --config < flags
"""

import argparse
import math
import os
import re

from pipelines.builders import build_task
from pipelines.common import UsageError
from pipelines.common import check_writable_directory
from pipelines.common import parse_count
from pipelines.common import parse_int_list
from pipelines.devices import check_memory
from pipelines.engine.plan import Grid
from pipelines.engine.presets import ARM_SETTINGS
from pipelines.engine.presets import ARMS
from pipelines.engine.shards import resolve_shard
from pipelines.flags import add_train_arguments
from pipelines.flags import settings_from_args
from pipelines.settings import RUNTIME_FIELDS
from pipelines.settings import SEED_LIMIT
from pipelines.settings import SETTINGS
from pipelines.settings import Layer
from pipelines.settings import flag
from pipelines.settings import resolve_config
from pipelines.settings import value_types

# Never an axis: what the arms and `--seeds` set, what names the grid, how
# runs are executed and reported.
_NOT_AXES = set(RUNTIME_FIELDS) | {"task", "backend", "seed", *ARM_SETTINGS}
# The plural spellings of the usual axes (the seeds' is the grid's own).
PLURALS = {"key_dim": ("--key-dims",),
           "learning_rate": ("--learning-rates",),
           "optimizer": ("--optimizers",), "seed": ("--seeds",)}
# A count of seeds past this is a typo, not a grid (`--seeds 10**12` ended
# in a MemoryError building the list).
MAX_SEEDS = 1000
# More runs in one grid is a typo, not an experiment (at a minute a run, a
# week on one machine); planning and checking them takes time before
# anything starts (2000 runs in 0.17 s, measured).
MAX_RUNS = 10000

# The grid's own valued flags, read as text by `plan_grid`.
_GRID_FLAGS = (
    ("--arms", "A1,A2,...", "arms, from: " + ", ".join(ARMS)),
    ("--seeds", "N|S1,S2,...", "number of seeds (0..N-1) or a list of seeds"),
    ("--jobs", "N", "worker processes, each training its share of the runs "
     "one after another (default: the preset's)"),
    ("--shard", "I/N", "train only shard I of N (0 <= I < N); also read from "
     "SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT"),
    ("--shard-count", "N", "the shard count of a Kubernetes Indexed Job (its "
     "index: JOB_COMPLETION_INDEX)"),
)


def _list_of(convert):
    """An argparse `type=` for `V1,V2,...` whose items `convert` parses."""

    def parse(text):
        items = [item.strip() for item in str(text).split(",")]
        if not all(items):
            raise argparse.ArgumentTypeError(
                f"must be a value or a comma-separated list; got {text!r}")
        values = [convert(item) if convert else item for item in items]
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"lists a value twice: {text!r}")
        return values

    return parse


def add_grid_arguments(parser, presets, default, preset_help):
    """Adds the grid flags and every `train` flag (axes as lists) to
    `parser`; `presets` is the command's `{name: Preset}`."""
    group = parser.add_argument_group("grid")
    group.add_argument("--preset", default=default,
                       metavar="{" + ",".join(presets) + "}", help=preset_help)
    for name, metavar, help_text in _GRID_FLAGS:
        group.add_argument(name, metavar=metavar, help=help_text)
    group.add_argument("--report-only", action="store_true", help="train "
                       "nothing: write the report from the finished runs and "
                       "say which are missing")
    # The list types wrap the train flags' own converters, so an item is
    # parsed (and refused) exactly as the single value of `train` is.
    add_train_arguments(
        parser, axes={name: PLURALS.get(name, ()) for name in SETTINGS
                      if name not in _NOT_AXES},
        as_list=_list_of)
    return parser


def parse_arms(text):
    """`"scaled,unscaled"` -> `["scaled", "unscaled"]`, or `UsageError`."""
    arms = [part.strip() for part in str(text).split(",") if part.strip()]
    unknown = [arm for arm in arms if arm not in ARMS]
    if not arms or unknown:
        raise UsageError(
            f"--arms: unknown arm(s) {', '.join(unknown) or repr(text)}; "
            f"known arms: {', '.join(ARMS)}")
    if len(set(arms)) != len(arms):
        raise UsageError(f"--arms lists an arm twice: {text!r}")
    return arms


def parse_seeds(text, flag_name="--seeds"):
    """`"3"` -> `[0, 1, 2]`; `"0,5,7"` -> `[0, 5, 7]`."""
    text = str(text).strip()
    if "," in text:
        try:
            seeds = [int(part) for part in text.split(",") if part.strip()]
        except ValueError:
            seeds = None
        if (not seeds or min(seeds) < 0 or max(seeds) > SEED_LIMIT
                or len(set(seeds)) != len(seeds)):
            raise UsageError(
                f"{flag_name} must be a count or a list of distinct integers "
                f"in [0, {SEED_LIMIT}]; got {text!r}")
        return seeds
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_SEEDS:
        raise UsageError(
            f"{flag_name} must be a count in [1, {MAX_SEEDS}] or a "
            f"comma-separated list of seeds; got {text!r}")
    return list(range(count))


def parse_sizes(text, flag_name):
    """`"none"` -> `[]`; `"64,16"` -> `[16, 64]` (`parse_int_list`)."""
    return ([] if text.strip() == "none"
            else sorted(parse_int_list(text, flag_name)))


def _refuse_per_run_flags(args, command):
    for name in (*ARM_SETTINGS, "seed", "export"):
        if getattr(args, name, None) is None:
            continue
        if name == "export":
            raise UsageError(f"--export is not supported by {command}; export "
                             "a finished run with keras-attention export")
        raise UsageError(f"{flag(name)} is set per run by {command}; use "
                         + ("--seeds" if name == "seed" else "--arms"))


def _sorted(values):
    numeric = all(isinstance(v, (int, float)) for v in values)
    return sorted(values) if numeric else list(values)


def _axes(args, given, preset):
    """`(axes, the user's axis names, settings)` from the flags' values
    `given`: a list is an axis, a single value a setting. Axes in order:
    the user's own, the preset's, the seed."""
    user, flags = {}, dict(given)
    for name in SETTINGS:
        values = flags.get(name)
        # A setting whose value is itself a list (`--text-file`, repeated)
        # is one value for every run, not an axis.
        if not isinstance(values, list) or value_types(name) == (list,):
            continue
        if len(values) > 1 or name in preset.axes:
            user[name] = _sorted(flags.pop(name))
        else:
            flags[name] = values[0]
    axes = {name: values for name, values in user.items()
            if name not in preset.axes}
    axes.update({name: user.get(name, list(values))
                 for name, values in preset.axes.items()})
    axes["seed"] = (parse_seeds(args.seeds) if args.seeds
                    else list(range(preset.seeds)))
    return axes, set(user), flags


def axis_flag(name):
    """The flag of axis `name`: `--key-dims`, `--num-layers`, `--seeds`."""
    return PLURALS.get(name, (flag(name),))[0]


def _check_size(axes, arms):
    runs = len(arms) * math.prod(len(values) for values in axes.values())
    if runs > MAX_RUNS:
        lengths = ", ".join(f"{axis_flag(name)} {len(values)}"
                            for name, values in axes.items())
        raise UsageError(
            f"the grid has {runs:,} runs ({len(arms)} arm(s) x {lengths}), "
            f"more than {MAX_RUNS:,} (at a minute a run, a week of training); "
            "give shorter axes")


def plan_grid(args, command, presets, default_logdir, order=()):
    """The checked `Grid` of parsed grid flags; `UsageError` on any bad
    flag, before anything is written."""
    if args.preset not in presets:
        raise UsageError(f"--preset must be one of {', '.join(presets)}; got "
                         f"{args.preset!r}")
    preset = presets[args.preset]
    _refuse_per_run_flags(args, command)
    *files, given = settings_from_args(args)
    axes, given_axes, flags = _axes(args, given.values, preset)
    user = [*files, Layer(given.source, flags)]
    task = preset.task
    for layer in user:
        task = layer.values.get("task", task)
    # A grid reports its own progress: its runs are quiet.
    preset_layer = Layer(f"preset {args.preset}",
                         {**preset.layer_values(task), "verbose": 0})
    logdir = args.logdir or default_logdir
    check_writable_directory(logdir, "--logdir")
    given = {name: values[-1] for name, values in axes.items()
             if name != "seed"}
    try:
        base = resolve_config([preset_layer, *user,
                               Layer(command, {"logdir": logdir, **given})])
    except UsageError as error:
        raise _axis_wording(error, axes) from None
    arms = parse_arms(args.arms) if args.arms else list(preset.arms)
    _check_size(axes, arms)
    return Grid(
        command=command, logdir=logdir, base=base, arms=arms, axes=axes,
        preset=args.preset,
        # An axis the user gives is trained at every value.
        trained={name: values for name, values in preset.trained.items()
                 if name not in given_axes},
        jobs=parse_count(args.jobs, "--jobs", 1) if args.jobs else preset.jobs,
        shard=resolve_shard(args.shard, args.shard_count, os.environ),
        report_only=args.report_only, options=dict(preset.options),
        order=order,
    )


def _axis_wording(error, axes):
    """`error` with each axis named by its axis flag (`--key-dims`, not one
    run's `--key-dim`)."""
    message = str(error)
    for name in axes:
        if name != "seed" and axis_flag(name) != flag(name):
            message = re.sub(re.escape(flag(name)) + r"(?![\w-])",
                             axis_flag(name), message)
    return UsageError(message)


def check_runs(grid):
    """Validates every run's config, and that each trained run fits this
    machine's memory (as `train` checks: refused before the first run)."""
    tasks = {}
    try:
        for run in grid.runs():
            run.config.validate()
            if not run.trained:
                continue
            options = repr(sorted(run.config.task_options().items()))
            if options not in tasks:
                tasks[options] = build_task(run.config)
            check_memory(run.config, tasks[options])
    except UsageError as error:
        raise _axis_wording(error, grid.axes) from None
    return grid
