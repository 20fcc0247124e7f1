"""Training the runs of a comparison: resume checks, then one run after
another in this process, or `--jobs N` at once, each in its own process
(`python -m pipelines.compare CONFIG.json`, see `__main__.py`).
"""

import concurrent.futures
import os
import shutil
import subprocess
import sys
import time

import keras

from pipelines.common import EnvironmentFailure
from pipelines.common import UsageError
from pipelines.common import write_json_atomic
from pipelines.run_dir import completed_metrics
from pipelines.run_dir import config_mismatch
from pipelines.run_dir import read_metrics
from pipelines.train import train

# How much of a failed run's log the error quotes.
_LOG_TAIL_CHARS = 2000


# ---------------------------------------------------------- run status
def check_run_directory(spec):
    """Raises `UsageError` when the spec's directory holds another run."""
    mismatch = config_mismatch(spec.config.logdir, spec.config)
    if mismatch is not None:
        raise UsageError(
            f"{spec.config.logdir} holds a run with a different config "
            f"({mismatch}); use a new --logdir"
        )


def is_complete(spec):
    """Whether the run has finished all its steps (or stopped on a
    non-finite loss, which training again would only repeat)."""
    return completed_metrics(spec.config) is not None


# ------------------------------------------------------------ training
def train_one(config):
    """Trains one run of a comparison in this process and returns its
    metrics. The run declares no HParams experiment of its own: the
    comparison declares one at its root, and TensorBoard reads one per
    logdir."""
    try:
        return train(config, hparams_experiment=False)
    finally:
        # Many models in one process: drop Keras' global graph state.
        keras.backend.clear_session()


def _subprocess_command(config_path):
    return [sys.executable, "-m", "pipelines.compare", config_path]


def _subprocess_env():
    env = dict(os.environ)
    # Every run trains on this process's backend (the runs' configs say
    # so, and a child on another backend would refuse them).
    env["KERAS_BACKEND"] = keras.backend.backend()
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Several processes share the accelerator: none may take all its memory.
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    return env


def _train_in_subprocess(spec, pending_dir, env):
    """Trains `spec` in a child process (its output in a log file beside
    its config); returns `(returncode, log_path, seconds)`."""
    config_path = os.path.join(pending_dir, spec.name + ".json")
    write_json_atomic(config_path, spec.config.to_dict())
    log_path = os.path.join(pending_dir, spec.name + ".log")
    started = time.time()
    with open(log_path, "w") as log:
        completed = subprocess.run(
            _subprocess_command(config_path),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            check=False,
        )
    return completed.returncode, log_path, time.time() - started


def _train_in_subprocesses(specs, jobs, logdir, report):
    """Trains `specs`, at most `jobs` at a time, each in its own process;
    `report` hears of each run as it ends, in this thread."""
    pending_dir = os.path.join(logdir, ".pending")
    os.makedirs(pending_dir, exist_ok=True)
    env = _subprocess_env()
    failures = []
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        # The pool starts the runs in this order, `jobs` at a time.
        futures = {
            pool.submit(_train_in_subprocess, spec, pending_dir, env): spec
            for spec in specs
        }
        for future in concurrent.futures.as_completed(futures):
            spec = futures[future]
            returncode, log_path, seconds = future.result()
            metrics = read_metrics(spec.config.logdir)
            if returncode != 0 and metrics is None:
                with open(log_path) as handle:
                    failures.append(
                        (spec.name, log_path, handle.read()[-_LOG_TAIL_CHARS:])
                    )
            report(spec, metrics, seconds)
    if failures:
        # One line: the run's own last line (its error, see `__main__`);
        # the whole output stays in its log.
        name, log_path, tail = failures[0]
        last = (tail.strip().splitlines() or ["no output"])[-1]
        raise EnvironmentFailure(
            f"{len(failures)} run(s) failed; the first, {name}, ended with: "
            f"{last} (its output: {log_path})"
        )
    shutil.rmtree(pending_dir, ignore_errors=True)


def _status(metrics):
    """One run's outcome, for the progress line."""
    if metrics is None:
        return "failed"
    target = metrics.get("steps_to_target")
    return (
        f"held-out accuracy {metrics['heldout_accuracy']:.3f}, "
        + (f"target at step {target}" if target is not None
           else "target not reached")
    )


def train_runs(plan, log=print):
    """Trains every trained run of `plan` that is not complete yet.

    Returns:
        The names of the runs trained now (runs found complete are skipped).
    """
    # Each run directory was checked before the logdir's lock was taken.
    specs = [spec for spec in plan.runs() if spec.trained]
    todo = [spec for spec in specs if not is_complete(spec)]
    skipped = len(specs) - len(todo)
    if skipped:
        log(f"{skipped} of {len(specs)} runs already complete; skipped")
    done = []

    def report(spec, metrics, seconds):
        done.append(spec.name)
        log(f"[{len(done)}/{len(todo)}] {spec.name}: {_status(metrics)} "
            f"({seconds:.0f} s)")

    if plan.jobs > 1 and len(todo) > 1:
        _train_in_subprocesses(todo, plan.jobs, plan.logdir, report)
    else:
        for spec in todo:
            started = time.time()
            metrics = train_one(spec.config)
            report(spec, metrics, time.time() - started)
    return [spec.name for spec in todo]
