"""Running a grid: train what is missing, then write the report once every
run is finished.

A whole grid in one process holds its root's lock throughout. Shards train
side by side, each run under its own directory's lock, and take the root's
lock only to write the report: the shard that finds every run finished
writes it. `--report-only` writes it from what is finished.
"""

import glob
import os
import time

from keras_attention.events import SummaryWriter
from pipelines.common import UsageError
from pipelines.engine.identity import check_grid_folder
from pipelines.engine.identity import write_identity
from pipelines.engine.progress import Progress
from pipelines.engine.reuse import shape_key
from pipelines.engine.runner import PENDING_DIR
from pipelines.engine.runner import in_runner_order
from pipelines.engine.runner import resolve_jobs
from pipelines.engine.runner import train_runs
from pipelines.engine.shards import shard_block
from pipelines.locks import RunDirectoryBusy
from pipelines.locks import owning_logdir
from pipelines.run_dir import completed_metrics
from pipelines.run_dir import config_mismatch
from pipelines.tensorboard import write_experiment


def check_grid(grid):
    """`UsageError` unless `grid` may run on its folder as it is (and, for
    `--report-only`, the folder holds a finished run of it). Reads only."""
    if grid.report_only and not os.path.isdir(grid.logdir):
        raise UsageError(
            f"--report-only: --logdir {grid.logdir} is not a folder; it "
            "reports on the finished runs of one, and creates none")
    check_grid_folder(grid)
    for run in grid.trained_runs():
        mismatch = config_mismatch(run.config.logdir, run.config)
        if mismatch is not None:
            raise UsageError(
                f"{run.config.logdir} holds a run with a different config "
                f"({mismatch}); use a new --logdir")
    if grid.report_only and not any(
            is_complete(run) for run in grid.trained_runs()):
        raise UsageError(
            f"--report-only: none of the {len(grid.trained_runs())} runs of "
            f"this plan in --logdir {grid.logdir} is finished; train them "
            "first (without --report-only)")


def is_complete(run):
    """Whether the run finished its steps (or stopped on a non-finite loss,
    which training again would only repeat)."""
    return completed_metrics(run.config) is not None


def _train(grid, log):
    """Trains the shard's incomplete runs; returns the timing record."""
    started = time.time()
    runs = shard_block(in_runner_order(grid.trained_runs()), grid.shard)
    todo = [run for run in runs if not is_complete(run)]
    where = ("" if grid.shard.source is None else
             f" of shard {grid.shard.index}/{grid.shard.count}")
    if len(runs) > len(todo):
        log(f"{len(runs) - len(todo)} of {len(runs)} runs{where} already "
            "complete; skipped")
    os.makedirs(grid.logdir, exist_ok=True)
    pending = os.path.join(grid.logdir, PENDING_DIR)
    if grid.shard.source is not None:
        pending = os.path.join(pending, f"shard{grid.shard.index}")
    first_of_shape = {}
    for run in todo:
        first_of_shape.setdefault(shape_key(run.config), run.name)
    jobs = resolve_jobs(grid.jobs, todo)
    progress = Progress({run.name: run.config.steps for run in todo},
                        len(runs), log, builds=first_of_shape.values(),
                        workers=min(jobs, len(todo)) or 1)
    progress.begin()
    trained = train_runs(todo, jobs, pending, progress)
    trained.update(skipped=len(runs) - len(todo),
                   train_wall_time_s=time.time() - started)
    return trained


def _report(grid, report, timing, log):
    missing = [run.name for run in grid.trained_runs()
               if not is_complete(run)]
    if missing and not grid.report_only:
        log(f"{len(missing)} of {len(grid.trained_runs())} runs are not "
            "finished yet (other shards): the shard that finishes the last "
            "one writes the report, or run again with --report-only")
        return None
    if missing:
        log(f"report over the finished runs; not finished (measured at init "
            f"only): {', '.join(missing)}")
    return report(grid.without(missing), missing, timing, log)


def run_grid(grid, report, log=print):
    """Trains the checked `grid`'s missing runs (this shard's), then returns
    what `report(grid, missing, timing, log)` returns (None while other
    shards' runs are not finished).

    Raises:
        RunDirectoryBusy: another process holds the grid's root (a whole
            grid), or a run directory is another grid's.
        EnvironmentFailure: a write is refused or runs failed.
    """
    # Refused before any lock is taken: a refused rerun leaves `.lock` (and
    # the pid in it) as it was.
    check_grid(grid)
    if grid.shard.source is None and not grid.report_only:
        with owning_logdir(grid.logdir):
            # Again under the lock: another process may have begun a grid
            # here since.
            check_grid_folder(grid)
            write_identity(grid)
            return _report(grid, report, _train(grid, log), log)
    if not grid.report_only:
        write_identity(grid)
    timing = None if grid.report_only else _train(grid, log)
    try:
        with owning_logdir(grid.logdir):
            if grid.report_only:
                # A folder an older version or a shard left is adopted.
                write_identity(grid)
            return _report(grid, report, timing, log)
    except RunDirectoryBusy:
        if grid.report_only:
            raise
        log("another process is writing the report")
        return None


# The TensorBoard run of a grid's HParams experiment, under its logdir.
EXPERIMENT_DIR = "experiment"
# The HParams every grid declares besides its axes (any value): what an arm
# sets, what tells two grids apart.
_OTHER_HPARAMS = ("scale", "qk_norm", "task", "optimizer", "learning_rate",
                  "d_model")


def write_grid_experiment(grid, metrics):
    """Declares the grid's HParams experiment (the arms and every axis's
    trained values) in the TensorBoard run `EXPERIMENT_DIR` (events at the
    root would make a run named "."), replacing an earlier one; `metrics`:
    `(tag, group, display_name)` of the report's metrics."""
    directory = os.path.join(grid.logdir, EXPERIMENT_DIR)
    for path in glob.glob(os.path.join(glob.escape(directory),
                                       "events.out.tfevents.*")):
        os.remove(path)
    hparams = {"arm": list(grid.arms)}
    for name in grid.axes:
        values = grid.trained_axis(name)
        hparams[name] = ([float(v) for v in values]
                         if any(isinstance(v, float) for v in values)
                         else list(values))
    hparams.update({name: None for name in _OTHER_HPARAMS
                    if name not in hparams})
    with SummaryWriter(directory) as writer:
        write_experiment(writer, hparams, metrics)
