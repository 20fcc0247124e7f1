"""The plan of a comparison: every run it will train or probe, checked
before anything runs.

`plan_from_args` turns the parsed `compare` flags into a `ComparisonPlan`:
the preset's settings under the config file and the flags, the key dims,
arms and seeds, and one `RunSpec` (with its own `TrainConfig`) per
(arm, key_dim, seed).
"""

import dataclasses
import os

from pipelines.common import UsageError
from pipelines.common import check_writable_directory
from pipelines.common import parse_count
from pipelines.common import parse_int_list
from pipelines.compare.arms import ARMS
from pipelines.compare.arms import PRESETS
from pipelines.compare.arms import SCHEDULE_FIELDS
from pipelines.config import Layer
from pipelines.config import TrainConfig
from pipelines.config import resolve_config
from pipelines.config_checks import SEED_LIMIT
from pipelines.flags import settings_from_args

DEFAULT_LOGDIR = os.path.join("runs", "compare")

# Flags of `train` that the comparison sets itself, per run.
_PER_RUN_FLAGS = {
    "key_dim": "--key-dims",
    "seed": "--seeds",
    "scale": "--arms",
    "qk_norm": "--arms",
    "arm": "--arms",
    "export": None,
}


@dataclasses.dataclass
class RunSpec:
    """One (arm, key_dim, seed) of the comparison."""

    arm: str
    key_dim: int
    seed: int
    trained: bool
    config: TrainConfig

    @property
    def name(self):
        return run_name(self.arm, self.key_dim, self.seed)


def run_name(arm, key_dim, seed):
    """The run directory name `<arm>-dk<key_dim>-seed<seed>`."""
    return f"{arm}-dk{key_dim}-seed{seed}"


@dataclasses.dataclass
class ComparisonPlan:
    """Everything a comparison will do, checked before anything runs.

    Attributes:
        logdir: the comparison directory.
        base: the resolved `TrainConfig` shared by every run (its `key_dim`,
            `seed`, `scale`, `qk_norm` and `arm` are set per run).
        arms: arm names.
        key_dims: d_k values measured (sorted).
        train_key_dims: d_k values trained (sorted, a subset of key_dims).
        seeds: seed values.
        jobs: runs trained at once (subprocesses when > 1).
        variance_samples: samples per d_k of the variance table (0: none).
        preset: the preset's name.
    """

    logdir: str
    base: TrainConfig
    arms: list
    key_dims: list
    train_key_dims: list
    seeds: list
    jobs: int = 1
    variance_samples: int = 20000
    preset: str = "default"

    def runs(self):
        """Every `RunSpec`, trained ones first, in a fixed order."""
        specs = []
        for key_dim in self.key_dims:
            for seed in self.seeds:
                for arm in self.arms:
                    specs.append(self._spec(arm, key_dim, seed))
        return sorted(specs, key=lambda spec: not spec.trained)

    def _spec(self, arm, key_dim, seed):
        overrides = ARMS[arm].overrides(key_dim, self.base.qk_init_gain)
        config = self.base.replace(
            key_dim=key_dim,
            seed=seed,
            logdir=os.path.join(self.logdir, run_name(arm, key_dim, seed)),
            **overrides,
        )
        return RunSpec(arm, key_dim, seed, key_dim in self.train_key_dims,
                       config)


def parse_arms(text):
    """`"scaled,unscaled"` -> `["scaled", "unscaled"]`, or `UsageError`
    listing the known arms."""
    arms = [part.strip() for part in str(text).split(",") if part.strip()]
    unknown = [arm for arm in arms if arm not in ARMS]
    if not arms or unknown:
        raise UsageError(
            f"--arms: unknown arm(s) {', '.join(unknown) or repr(text)}; "
            f"known arms: {', '.join(ARMS)}"
        )
    if len(set(arms)) != len(arms):
        raise UsageError(f"--arms lists an arm twice: {text!r}")
    return arms


# A count of seeds past this is a typo, not a grid (`--seeds 10**12` ended
# in a MemoryError building the list).
MAX_SEEDS = 1000


def parse_seeds(text):
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
                f"--seeds must be a count or a list of distinct integers in "
                f"[0, {SEED_LIMIT}]; got {text!r}"
            )
        return seeds
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_SEEDS:
        raise UsageError(
            f"--seeds must be a count in [1, {MAX_SEEDS}] or a "
            f"comma-separated list of seeds; got {text!r}"
        )
    return list(range(count))


def check_per_run_flags(args, per_run_flags, command):
    """`UsageError` for a `train` flag that `command` (compare, sweep) sets
    per run.

    Args:
        args: the parsed flags.
        per_run_flags: `{setting: the command's flag to use instead}`; `None`
            for a setting the command does not take at all.
        command: the command's name, for the message.
    """
    for field, flag in per_run_flags.items():
        if getattr(args, field, None) is None:
            continue
        if flag is None:
            raise UsageError(
                f"--{field} is not supported by {command}; export a finished "
                "run with keras-attention export"
            )
        raise UsageError(
            f"--{field.replace('_', '-')} is set per run by {command}; use "
            f"{flag}"
        )


def preset_settings(args, preset_name, preset):
    """The layers of settings of every run, in increasing priority: the
    preset (with the comparison's own default of a quiet run), then the
    config file and the flags (`pipelines.flags.settings_from_args`).

    What the user gave is what their layers hold, whatever it equals; the
    preset fills the rest.
    """
    user = settings_from_args(args)
    task = preset.train["task"]
    for layer in user:
        task = layer.values.get("task", task)
    if task == preset.train["task"]:
        # The preset's model and optimizer suit its task; other tasks keep
        # their own defaults (see pipelines.config.TASK_DEFAULTS).
        preset_values = dict(preset.train)
    else:
        preset_values = {name: preset.train[name] for name in SCHEDULE_FIELDS}
    preset_values["verbose"] = 0
    return [Layer(f"preset {preset_name}", preset_values), *user]


def _key_dims(args, preset):
    """`(key_dims, train_key_dims)`, both sorted; trained ones are also
    measured."""
    if args.key_dims is not None:
        key_dims = parse_int_list(args.key_dims, "--key-dims")
    else:
        key_dims = list(preset.key_dims)
    if args.train_key_dims is not None:
        train_key_dims = (
            list(key_dims)
            if args.train_key_dims == "all"
            else parse_int_list(args.train_key_dims, "--train-key-dims")
        )
    elif args.key_dims is not None or preset.train_key_dims is None:
        train_key_dims = list(key_dims)
    else:
        train_key_dims = list(preset.train_key_dims)
    return (sorted(set(key_dims) | set(train_key_dims)),
            sorted(set(train_key_dims)))


def plan_from_args(args):
    """Builds and checks the `ComparisonPlan` of parsed `compare` flags.

    Raises:
        UsageError: on any bad flag, before anything is written.
    """
    if args.preset not in PRESETS:
        raise UsageError(
            f"--preset must be one of {', '.join(PRESETS)}; got "
            f"{args.preset!r}"
        )
    preset = PRESETS[args.preset]
    check_per_run_flags(args, _PER_RUN_FLAGS, "compare")
    layers = preset_settings(args, args.preset, preset)
    key_dims, train_key_dims = _key_dims(args, preset)
    arms = parse_arms(args.arms) if args.arms else list(preset.arms)
    seeds = parse_seeds(args.seeds) if args.seeds else list(
        range(preset.seeds)
    )
    jobs = parse_count(args.jobs, "--jobs", minimum=1) if args.jobs else 1
    samples = parse_count(args.variance_samples, "--variance-samples",
                          minimum=0)
    if samples == 1:
        raise UsageError("--variance-samples must be 0 (none) or at least 2")

    logdir = args.logdir or DEFAULT_LOGDIR
    check_writable_directory(logdir, "--logdir")
    base = resolve_config(
        [*layers, Layer("compare", {"logdir": logdir, "key_dim": key_dims[-1]})]
    )
    # Every per-run value is checked through the run's own config.
    plan = ComparisonPlan(
        logdir=logdir,
        base=base,
        arms=arms,
        key_dims=key_dims,
        train_key_dims=train_key_dims,
        seeds=seeds,
        jobs=jobs,
        variance_samples=samples,
        preset=args.preset,
    )
    for spec in plan.runs():
        spec.config.validate()
    return plan
