"""Training a grid's runs: in this process, or in `--jobs N` worker
processes, each training its share in order with `CompiledRuns` (a run of
the previous one's shapes pays no new process, build or compile).

A share is a `ProcessPoolExecutor` of one spawned process (a fork would
copy this process's initialised backend and its threads): a worker that
dies breaks its own share only. Steps come back through one queue; the
workers' stderr goes to a file in `pending`.
"""

import concurrent.futures
import contextlib
import multiprocessing
import os
import queue
import shutil
import sys
import time

import keras

from pipelines.common import EnvironmentFailure
from pipelines.common import UsageError
from pipelines.engine.reuse import CompiledRuns
from pipelines.engine.reuse import shape_key
from pipelines.locks import RunDirectoryBusy
from pipelines.run_dir import read_metrics
from pipelines.train import train

PENDING_DIR = ".pending"
# A worker reports a run's step at most this often.
STEP_REPORT_S = 1.0
# How often the progress display hears of steps while runs train.
_POLL_S = 0.2
# `jobs=0`, a preset's "auto": two workers on a machine of two or more
# cores, for a grid that trains at least this many steps in all; one
# process below it, where a worker's start (imports and compile, about
# 14 s on 2 cores) costs more than it saves.
AUTO_JOBS_STEPS = 2000
_DIED = ("its worker process died during the run (killed, or out of "
         "memory); the rest of its share was not started; the workers' "
         "output: {}")
# A worker's state between tasks: `CompiledRuns`, the step queue, and when
# it last reported each run's step.
_WORKER = {}


def outcome(metrics):
    """One run's outcome, for its progress line."""
    if metrics is None:
        return "failed"
    if metrics.get("diverged_at_step") is not None:
        return f"diverged at step {metrics['diverged_at_step']}"
    target = metrics.get("steps_to_target")
    return (f"held-out accuracy {metrics['heldout_accuracy']:.3f}, "
            + (f"target at step {target}" if target is not None
               else "target not reached"))


def train_one(config, reuse, on_step=lambda logdir, step: None):
    """Trains `config` with `reuse`; returns `(record, CompiledRuns for the
    next run)`. A one-line refusal, or a run busy in another process, is
    recorded; any other exception propagates."""
    started, cpu_started = time.time(), time.process_time()
    reuses, error, kind = reuse.reuses, None, None
    try:
        metrics = train(config, hparams_experiment=False, reuse=reuse,
                        progress=lambda step: on_step(config.logdir, step))
    except (UsageError, EnvironmentFailure) as exception:
        metrics, error = None, str(exception)
        kind = ("busy" if isinstance(exception, RunDirectoryBusy)
                else "usage" if isinstance(exception, UsageError)
                else "environment")
        reuse = CompiledRuns()
    return {"logdir": config.logdir, "seconds": time.time() - started,
            "cpu_seconds": time.process_time() - cpu_started,
            "error": error, "kind": kind,
            "outcome": ("trained by another process" if kind == "busy"
                        else outcome(metrics)),
            "reused": reuse.reuses > reuses}, reuse


def in_runner_order(runs):
    """`runs` with those sharing a compiled step adjacent (stable)."""
    keys = {}
    for run in runs:
        keys.setdefault(shape_key(run.config), len(keys))
    return sorted(runs, key=lambda run: keys[shape_key(run.config)])


def shares(configs, jobs):
    """`configs` in at most `jobs` lists, whole shape groups together where
    there are enough groups, balanced by their steps."""
    groups = {}
    for config in configs:
        groups.setdefault(shape_key(config), []).append(config)
    groups = list(groups.values())
    while len(groups) < jobs and max(len(group) for group in groups) > 1:
        groups.sort(key=len)
        largest = groups.pop()
        half = len(largest) // 2
        groups += [largest[:half], largest[half:]]
    loads = [[0, []] for _ in range(min(jobs, len(groups)))]
    for group in sorted(groups, key=lambda g: -sum(c.steps for c in g)):
        lightest = min(loads, key=lambda load: load[0])
        lightest[0] += sum(config.steps for config in group)
        lightest[1].extend(group)
    return [share for _, share in loads]


@contextlib.contextmanager
def worker_environment(stderr):
    """Inside, `os.environ` is a worker's, and fd
    2 is the file `stderr`, for the processes spawned there (backends read
    the environment as they load, before any initializer runs)."""
    saved, saved_stderr = dict(os.environ), os.dup(2)
    sys.stderr.flush()
    os.dup2(stderr.fileno(), 2)
    env = os.environ
    # The runs' configs name this process's backend.
    env["KERAS_BACKEND"] = keras.backend.backend()
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Several processes share the accelerator: none may take all its memory.
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # The thread pools stay the size one process would have, so a grid's
    # numbers do not depend on --jobs: XLA splits its sums by pool size.
    # Measured on 2 cores, the default comparison at --jobs 2: the same
    # comparison.json as in one process, 147 s against 181 s; 1-thread
    # workers took 149 s and ended the unscaled runs elsewhere.
    try:
        yield
    finally:
        env.clear()
        env.update(saved)
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)


def _start_worker(steps):
    _WORKER.update(reuse=CompiledRuns(), steps=steps, last={})


def _report_step(logdir, step):
    now = time.monotonic()
    if now - _WORKER["last"].get(logdir, -STEP_REPORT_S) >= STEP_REPORT_S:
        _WORKER["last"][logdir] = now
        _WORKER["steps"].put((logdir, step))


def _train_in_worker(config):
    """A worker's task: one run, after the previous one of its share."""
    record, _WORKER["reuse"] = train_one(config, _WORKER["reuse"],
                                         _report_step)
    return record


def _train_in_workers(worker_shares, pending, finished, on_step,
                      task=_train_in_worker):
    """Trains each share in its own worker; `finished(record)` as each run
    ends, `on_step(logdir, step)` as steps come. A run whose worker died is
    recorded as failed, and the rest of its share is not started. Returns
    the first fault a run raised, or None; `pending` is removed when there
    was neither. `task(config)` trains one run (a test's stand-in)."""
    context = multiprocessing.get_context("spawn")
    steps = context.Queue()
    pools = [concurrent.futures.ProcessPoolExecutor(
        1, mp_context=context, initializer=_start_worker, initargs=(steps,))
        for _ in worker_shares]
    fault, ended, broken, clean = None, set(), set(), False
    os.makedirs(pending, exist_ok=True)
    output = os.path.join(pending, "workers.log")
    try:
        with open(output, "w") as log, worker_environment(log):
            # `submit` spawns the pool's process.
            futures = {pool.submit(task, config): (pool, config)
                       for pool, share in zip(pools, worker_shares)
                       for config in share}
        started = dict.fromkeys(pools, time.time())
        waiting = set(futures)
        while waiting:
            done, waiting = concurrent.futures.wait(
                waiting, _POLL_S, concurrent.futures.FIRST_COMPLETED)
            _relay_steps(steps, ended, on_step)
            # In submission order: within a share, the run that was
            # training when its worker died comes first.
            for future in sorted(done, key=list(futures).index):
                pool, config = futures[future]
                ended.add(config.logdir)
                seconds = time.time() - started[pool]
                started[pool] = time.time()
                try:
                    record = future.result()
                except concurrent.futures.process.BrokenProcessPool:
                    if pool in broken:
                        continue  # Never started: counted as missing.
                    broken.add(pool)
                    record = {"logdir": config.logdir, "kind": "crash",
                              "seconds": seconds,
                              "error": _DIED.format(output)}
                except Exception as exception:  # A fault: raised at the end.
                    fault = fault or exception
                    continue
                finished(record)
        clean = fault is None and not broken
    finally:
        # After a clean end the workers exit while the caller goes on (the
        # default comparison's report: waiting took 3.3 s there); the
        # interpreter's exit waits for them.
        for pool in pools:
            pool.shutdown(wait=not clean, cancel_futures=True)
    if clean:
        shutil.rmtree(pending, ignore_errors=True)
    return fault


def _relay_steps(steps, ended, on_step):
    while True:
        try:
            logdir, step = steps.get_nowait()
        except queue.Empty:
            return
        if logdir not in ended:  # A late report of a run that has ended.
            on_step(logdir, step)


def resolve_jobs(jobs, runs):
    """The worker count for `runs`: `jobs`, or the auto rule when 0."""
    if jobs:
        return jobs
    steps = sum(run.config.steps for run in runs)
    return 2 if (os.cpu_count() or 1) >= 2 and steps >= AUTO_JOBS_STEPS else 1


def train_runs(runs, jobs, pending, progress):
    """Trains `runs` (none complete yet): here, or in `jobs` workers whose
    output goes to `pending`.

    Returns:
        `{"trained_now": [names], "busy": [names], "workers": n, "builds": n
        (runs that built their compiled parts), "runs": [records]}`.

    Raises:
        UsageError: every failed run was refused with a usage error.
        EnvironmentFailure: runs failed otherwise. Both come after the
            other runs end and name the first failure; a worker's fault is
            raised as it was there.
    """
    names = {run.config.logdir: run.name for run in runs}
    records = []

    def finished(record):
        records.append(record)
        progress.finished(names[record["logdir"]],
                          record["outcome"] if not record["error"]
                          else f"failed: {record['error']}",
                          record["seconds"])

    def on_step(logdir, step):
        progress.step(names[logdir], step)

    configs = [run.config for run in runs]
    worker_shares = shares(configs, jobs) if configs else []
    if len(worker_shares) <= 1:
        reuse = CompiledRuns()
        for config in configs:
            record, reuse = train_one(config, reuse, on_step)
            finished(record)
    else:
        fault = _train_in_workers(worker_shares, pending, finished,
                                  on_step)
        if fault is not None:
            raise fault
    failed = [r for r in records if r["error"] and r["kind"] != "busy"
              or not r["error"] and read_metrics(r["logdir"]) is None]
    missing = len(runs) - len(records)
    if failed or missing:
        first = failed[0] if failed else None
        detail = (f"the first, {names[first['logdir']]}, ended with: "
                  f"{first['error'] or 'no metrics.json'}" if first
                  else "a worker stopped early")
        error = (UsageError if failed and not missing
                 and all(r["kind"] == "usage" for r in failed)
                 else EnvironmentFailure)
        raise error(f"{len(failed) + missing} run(s) failed; {detail}")
    busy = [names[r["logdir"]] for r in records if r["kind"] == "busy"]
    return {"trained_now": [names[c.logdir] for c in configs
                            if names[c.logdir] not in busy],
            "busy": busy, "workers": max(len(worker_shares), 1),
            "builds": sum(not r["reused"] for r in records if not r["error"]),
            "runs": records}
