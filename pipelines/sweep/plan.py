"""The plan of a sweep: the grid of runs, checked before anything runs.

`plan_from_args` turns the parsed `sweep` flags into a `SweepPlan`: the
comparison's preset settings (`pipelines.compare.arms.PRESETS`) under the
config file and the flags, and one `SweepRun` (with its own `TrainConfig`)
per (arm, optimizer, learning rate, d_k, seed).
"""

import dataclasses
import math
import os

from pipelines.common import UsageError
from pipelines.common import check_writable_directory
from pipelines.common import parse_count
from pipelines.common import parse_int_list
from pipelines.compare.arms import ARMS
from pipelines.compare.arms import PRESETS as COMPARE_PRESETS
from pipelines.compare.plan import check_per_run_flags
from pipelines.compare.plan import preset_settings
from pipelines.compare.plan import parse_arms
from pipelines.compare.plan import parse_seeds
from pipelines.config import OPTIMIZERS
from pipelines.config import Layer
from pipelines.config import resolve_config

DEFAULT_LOGDIR = os.path.join("runs", "sweep")

# Flags of `train` that the sweep sets per run, and the sweep flag to use.
_PER_RUN_FLAGS = {
    "key_dim": "--key-dims", "seed": "--seeds", "scale": "--arms",
    "qk_norm": "--arms", "arm": "--arms", "optimizer": "--optimizers",
    "learning_rate": "--learning-rates", "export": None,
}


@dataclasses.dataclass(frozen=True)
class SweepPreset:
    """A ready-made sweep: its grid, and the comparison preset whose model,
    task and schedule every run uses (`train` overrides a few of them).

    Attributes:
        compare: the name of the `pipelines.compare.arms.PRESETS` entry.
        arms, optimizers, learning_rates, key_dims, seeds: the grid.
        init_key_dims, init_seeds: the d_k picture at initialisation.
        train: `TrainConfig` fields laid over the comparison preset's.
        jobs: runs trained at once by default.
        expected: the expected wall time.
    """

    compare: str
    arms: tuple
    optimizers: tuple
    learning_rates: tuple
    key_dims: tuple
    seeds: int
    init_key_dims: tuple
    init_seeds: int
    train: dict
    jobs: int
    expected: str

    @property
    def settings(self):
        """The `TrainConfig` fields of every run, before the flags."""
        return {**COMPARE_PRESETS[self.compare].train, **self.train}


PRESETS = {
    # The question at d_k 1024 within minutes on 2 CPU cores: both
    # optimizers, five learning rates from 1e-4 to 3e-1, and 1000 steps, the
    # budget of the comparison. Measured on the first grid (3e-4 .. 3e-1):
    # the scaled model reaches the target with Adam at 3e-4 and 3e-3 and
    # with SGD (momentum 0.9) at 3e-2 only, and fails at 3e-1 with both, so
    # its working range is bracketed on both sides for SGD; unscaled
    # attention reached the target on one seed with Adam at 3e-4, the edge
    # of that grid, so 1e-4 brackets the Adam side too. Two seeds give a
    # spread. Diagnostics every 500 steps (a sweep reads only the end ones)
    # and evaluations every 100: measured on this grid at the comparison's
    # every 50 steps, the per-run overhead was 21% of the training time.
    "quick": SweepPreset(
        compare="default",
        arms=("scaled", "unscaled"),
        optimizers=("sgd", "adam"),
        learning_rates=(1e-4, 3e-4, 3e-3, 3e-2, 3e-1),
        key_dims=(1024,),
        seeds=2,
        init_key_dims=(16, 64, 256, 1024, 4096),
        init_seeds=3,
        train=dict(steps=1000, eval_every=100, diagnostics_every=500),
        jobs=2,
        expected="40 runs of 1000 steps at d_k 1024, about 7 minutes on "
        "2 idle CPU cores",
    ),
    # The grid of the question as a paper would run it: for a GPU.
    "full": SweepPreset(
        compare="full",
        arms=("scaled", "unscaled", "qk_norm", "inverse"),
        optimizers=("sgd", "adam"),
        learning_rates=(1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1),
        key_dims=(256, 1024),
        seeds=3,
        init_key_dims=(16, 64, 256, 1024, 4096),
        init_seeds=5,
        train=dict(steps=1000, diagnostics_every=500),
        jobs=2,
        expected="336 runs of 1000 steps: an hour or two on one GPU",
    ),
}


@dataclasses.dataclass
class SweepRun:
    """One (arm, optimizer, learning rate, key_dim, seed) of the sweep."""

    arm: str
    optimizer: str
    learning_rate: float
    key_dim: int
    seed: int
    config: object

    @property
    def name(self):
        return run_name(self.arm, self.optimizer, self.learning_rate,
                        self.key_dim, self.seed)


def run_name(arm, optimizer, learning_rate, key_dim, seed):
    """`<arm>-<optimizer>-lr<lr>-dk<key_dim>-seed<seed>`."""
    # repr, not :g: the shortest text that reads back as the same float, so
    # 0.1 and 0.1000001 (both "0.1" under :g, the second run landing in the
    # first one's folder) get a folder each; the usual rates read alike.
    rate = repr(float(learning_rate))
    return f"{arm}-{optimizer}-lr{rate}-dk{key_dim}-seed{seed}"


@dataclasses.dataclass
class SweepPlan:
    """Everything a sweep will do, checked before anything runs."""

    logdir: str
    base: object
    arms: list
    optimizers: list
    learning_rates: list
    key_dims: list
    seeds: list
    init_key_dims: list
    init_seeds: list
    jobs: int = 1
    preset: str = "quick"

    def runs(self):
        """Every `SweepRun`; runs sharing compiled shapes are adjacent."""
        return [
            self._run(arm, optimizer, rate, key_dim, seed)
            for key_dim in self.key_dims
            for arm in self.arms
            for optimizer in self.optimizers
            for rate in self.learning_rates
            for seed in self.seeds
        ]

    def _run(self, arm, optimizer, rate, key_dim, seed):
        overrides = ARMS[arm].overrides(key_dim, self.base.qk_init_gain)
        config = self.base.replace(
            key_dim=key_dim, seed=seed, optimizer=optimizer,
            learning_rate=rate,
            logdir=os.path.join(
                self.logdir, run_name(arm, optimizer, rate, key_dim, seed)
            ),
            **overrides,
        )
        return SweepRun(arm, optimizer, rate, key_dim, seed, config)


def parse_learning_rates(text):
    """`"1e-3,3e-3"` -> `[0.001, 0.003]` (sorted), or `UsageError`."""
    try:
        rates = [float(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        rates = []
    if not rates or any(not math.isfinite(r) or r <= 0 for r in rates) or (
        len(set(rates)) != len(rates)
    ):
        raise UsageError(
            "--learning-rates must be a comma-separated list of distinct "
            f"positive numbers; got {text!r}"
        )
    return sorted(rates)


def parse_optimizers(text):
    """`"sgd,adam"` -> `["sgd", "adam"]`, or `UsageError`."""
    names = [part.strip() for part in str(text).split(",") if part.strip()]
    unknown = [name for name in names if name not in OPTIMIZERS]
    if not names or unknown or len(set(names)) != len(names):
        raise UsageError(
            f"--optimizers must be distinct names from {', '.join(OPTIMIZERS)}"
            f"; got {text!r}"
        )
    return names


def plan_from_args(args):
    """Builds and checks the `SweepPlan` of parsed `sweep` flags.

    Raises:
        UsageError: on any bad flag, before anything is written.
    """
    if args.preset not in PRESETS:
        raise UsageError(
            f"--preset must be one of {', '.join(PRESETS)}; got {args.preset!r}"
        )
    preset = PRESETS[args.preset]
    check_per_run_flags(args, _PER_RUN_FLAGS, "sweep")

    def given(value, parse, default):
        return parse(value) if value is not None else list(default)

    arms = given(args.arms, parse_arms, preset.arms)
    optimizers = given(args.optimizers, parse_optimizers, preset.optimizers)
    rates = given(args.learning_rates, parse_learning_rates,
                  preset.learning_rates)
    key_dims = sorted(given(args.key_dims,
                            lambda t: parse_int_list(t, "--key-dims"),
                            preset.key_dims))
    seeds = parse_seeds(args.seeds) if args.seeds else list(range(preset.seeds))
    init_key_dims = sorted(given(
        args.init_key_dims,
        lambda t: [] if t.strip() == "none" else parse_int_list(
            t, "--init-key-dims"),
        preset.init_key_dims))
    init_seeds = (parse_seeds(args.init_seeds) if args.init_seeds
                  else list(range(preset.init_seeds)))
    jobs = parse_count(args.jobs, "--jobs", 1) if args.jobs else preset.jobs
    logdir = args.logdir or DEFAULT_LOGDIR
    check_writable_directory(logdir, "--logdir")
    # The comparison's layering (preset < --config < flags), with the
    # sweep's preset in place of the comparison's.
    layers = preset_settings(args, f"sweep {args.preset}",
                              _SettingsOf(preset.settings))
    base = resolve_config(
        [*layers, Layer("sweep", {"logdir": logdir, "key_dim": key_dims[-1]})]
    )
    plan = SweepPlan(logdir, base, arms, optimizers, rates, key_dims, seeds,
                     init_key_dims, init_seeds, jobs, args.preset)
    for run in plan.runs():
        run.config.validate()
    return plan


@dataclasses.dataclass(frozen=True)
class _SettingsOf:
    """A preset as `pipelines.compare.plan` layers it: its `train` dict."""

    train: dict
