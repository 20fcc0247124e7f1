"""The experiment engine (floor 3, pipelines): one way to plan, train,
resume, shard and collect a grid of training runs, for every command that
trains many runs (`compare`, `sweep`).

A grid is the product of axes over `train` settings (every setting given as
a list: `--key-dims`, `--learning-rates`, `--num-layers`, ...), named arms
that set several settings at once, and seeds. Runs that differ only by arm
share data and initial weights. Its modules, each importing only those
before it: presets (arms and ready-made grids, over the task defaults),
shards, plan (`Grid`, `Run`), reuse (compiled steps kept across runs),
progress, runner (worker processes), flags (the grid flags and
`plan_grid`), run (`run_grid`: train, then the report under the root's
lock). A report (`pipelines.compare`, `pipelines.sweep`) is a function
over the finished runs. They import keras_attention and the pipelines below
them (common, config, flags, builders, steps, train, run_dir, locks,
tensorboard), never a report or pipelines.cli.
"""

from pipelines.engine.flags import add_grid_arguments
from pipelines.engine.flags import check_runs
from pipelines.engine.flags import parse_seeds
from pipelines.engine.flags import plan_grid
from pipelines.engine.plan import Grid
from pipelines.engine.plan import Run
from pipelines.engine.presets import ARMS
from pipelines.engine.presets import COMPARE_PRESETS
from pipelines.engine.presets import SWEEP_PRESETS
from pipelines.engine.presets import Arm
from pipelines.engine.presets import Preset
from pipelines.engine.run import run_grid
from pipelines.engine.run import write_grid_experiment
from pipelines.engine.shards import Shard

__all__ = [
    "ARMS", "COMPARE_PRESETS", "SWEEP_PRESETS", "Arm", "Grid", "Preset",
    "Run", "Shard", "add_grid_arguments", "check_runs", "parse_seeds",
    "plan_grid", "run_grid", "write_grid_experiment",
]
