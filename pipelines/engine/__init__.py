"""The experiment engine: plans, trains, resumes and shards the grid of
runs of `compare` and `sweep` (axes over `train` settings, arms, seeds),
whose reports are functions over the finished runs.

Modules, each importing only those before it: presets, shards, plan
(`Grid`, `Run`), reuse (compiled steps kept across runs), progress, runner
(worker processes), identity (what a grid's folder holds), flags
(`plan_grid`), run (`run_grid`). None imports a report or the command line.
"""

from pipelines.engine.flags import add_grid_arguments
from pipelines.engine.flags import check_runs
from pipelines.engine.flags import parse_seeds
from pipelines.engine.flags import parse_sizes
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
    "parse_sizes", "plan_grid", "run_grid", "write_grid_experiment",
]
