"""Training a grid's runs: in this process, or in `--jobs N` worker
processes, each training its share of the runs one after another with
`CompiledRuns`, so a run whose shapes match the previous one's pays no new
process, build or compile.

A worker is `python -m pipelines.engine WORKLIST.json`; it prints one line
per step report and per finished run, which this process relays to the
`Progress` display as they arrive.
"""

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import keras

from pipelines.common import EnvironmentFailure
from pipelines.common import UsageError
from pipelines.common import write_json_atomic
from pipelines.settings import TrainConfig
from pipelines.engine.reuse import CompiledRuns
from pipelines.engine.reuse import shape_key
from pipelines.locks import RunDirectoryBusy
from pipelines.run_dir import read_metrics
from pipelines.train import train

PENDING_DIR = ".pending"
# What a worker prints before each JSON line: a finished run, a step.
RESULT_PREFIX = "grid-run "
STEP_PREFIX = "grid-step "
# A worker reports a run's step at most this often.
STEP_REPORT_S = 1.0
_LOG_TAIL_CHARS = 2000


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


def train_configs(configs, emit, on_step=lambda logdir, step: None):
    """Trains `configs` in order in this process, reusing compiled parts.

    `emit(record)` hears of each run as it ends, `on_step(logdir, step)` of
    its steps. A run refused with a one-line error (`UsageError`,
    `EnvironmentFailure`), or busy in another process, is recorded and the
    next one goes on; any other exception is a fault and propagates.
    """
    reuse = CompiledRuns()
    for config in configs:
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
        emit({"logdir": config.logdir, "seconds": time.time() - started,
              "cpu_seconds": time.process_time() - cpu_started,
              "error": error, "kind": kind,
              "outcome": ("trained by another process" if kind == "busy"
                          else outcome(metrics)),
              "reused": reuse.reuses > reuses})


def in_runner_order(runs):
    """`runs` with those sharing a compiled step adjacent (stable)."""
    keys = {}
    for run in runs:
        keys.setdefault(shape_key(run.config), len(keys))
    return sorted(runs, key=lambda run: keys[shape_key(run.config)])


def shares(configs, jobs):
    """`configs` split into at most `jobs` lists, whole shape groups
    together where there are enough groups, balanced by their steps."""
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


def worker_env(threads):
    """The environment of a worker process with `threads` CPU threads."""
    env = dict(os.environ)
    # Every run trains on this process's backend (the runs' configs say
    # so, and a worker on another backend would refuse them).
    env["KERAS_BACKEND"] = keras.backend.backend()
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Several processes share the accelerator: none may take all its memory.
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # One core's share each: N processes of all cores each oversubscribe
    # them (measured on 2 cores: two 1-thread workers train 1.45x the
    # steps per second of one 2-thread process at d_k 1024).
    env.setdefault("TF_NUM_INTRAOP_THREADS", str(threads))
    env.setdefault("TF_NUM_INTEROP_THREADS", str(threads))
    # torch's and XLA's CPU thread pools read these.
    env.setdefault("OMP_NUM_THREADS", str(threads))
    if threads == 1 and "xla_cpu_multi_thread_eigen" not in env.get(
            "XLA_FLAGS", ""):
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "")
                            + " --xla_cpu_multi_thread_eigen=false").strip()
    return env


def _run_worker(index, configs, pending, env, relay, on_step):
    """One worker process over `configs`; returns (returncode, log path)."""
    worklist = os.path.join(pending, f"worker{index}.json")
    write_json_atomic(worklist, [config.to_dict() for config in configs])
    log_path = os.path.join(pending, f"worker{index}.log")
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipelines.engine", worklist],
            stdout=subprocess.PIPE, stderr=log, text=True, env=env,
        )
        for line in process.stdout:
            if line.startswith(RESULT_PREFIX):
                relay(json.loads(line[len(RESULT_PREFIX):]))
            elif line.startswith(STEP_PREFIX):
                on_step(*json.loads(line[len(STEP_PREFIX):]))
            else:
                log.write(line)
        process.wait()
    return process.returncode, log_path


def _last_line(path):
    with open(path) as handle:
        tail = handle.read()[-_LOG_TAIL_CHARS:].strip().splitlines()
    return (tail or ["no output"])[-1]


def train_runs(runs, jobs, pending, progress):
    """Trains `runs` (none complete yet): in this process, or in `jobs`
    worker processes whose worklists and output go to `pending`.

    Returns:
        `{"trained_now": [names], "busy": [names], "workers": n, "builds": n
        (runs that built their compiled parts), "runs": [per-run timing
        records]}`.

    Raises:
        UsageError: when every failed run was refused with a usage error;
        EnvironmentFailure: otherwise, when runs failed (after the others
            are done). Either names the first failure in one line.
    """
    names = {run.config.logdir: run.name for run in runs}
    records, lock = [], threading.Lock()

    def relay(record):
        with lock:
            records.append(record)
            progress.finished(names.get(record["logdir"], record["logdir"]),
                              record["outcome"] if not record["error"]
                              else f"failed: {record['error']}",
                              record["seconds"])

    def on_step(logdir, step):
        with lock:
            progress.step(names.get(logdir, logdir), step)

    configs = [run.config for run in runs]
    worker_shares = shares(configs, jobs) if configs else []
    crashed = []
    if len(worker_shares) <= 1:
        train_configs(configs, relay, on_step)
    else:
        os.makedirs(pending, exist_ok=True)
        threads = max(1, (os.cpu_count() or 1) // len(worker_shares))
        env = worker_env(threads)
        with concurrent.futures.ThreadPoolExecutor(len(worker_shares)) as pool:
            futures = [
                pool.submit(_run_worker, index, share, pending, env, relay,
                            on_step)
                for index, share in enumerate(worker_shares)
            ]
            for future in futures:
                returncode, log_path = future.result()
                if returncode != 0:
                    crashed.append(f"{_last_line(log_path)} (its output: "
                                   f"{log_path})")
        if not crashed:
            shutil.rmtree(pending, ignore_errors=True)
    failed = [r for r in records if r["error"] and r["kind"] != "busy"
              or not r["error"] and read_metrics(r["logdir"]) is None]
    missing = len(runs) - len(records)
    if crashed or failed or missing:
        first = failed[0] if failed else None
        detail = (f"the first, {names[first['logdir']]}, ended with: "
                  f"{first['error'] or 'no metrics.json'}" if first
                  else f"a worker stopped: {crashed[0]}" if crashed
                  else "a worker stopped early")
        error = (UsageError if failed and not crashed and not missing
                 and all(r["kind"] == "usage" for r in failed)
                 else EnvironmentFailure)
        raise error(f"{len(failed) + missing} run(s) failed; {detail}")
    busy = [names[r["logdir"]] for r in records if r["kind"] == "busy"]
    return {"trained_now": [names[c.logdir] for c in configs
                            if names[c.logdir] not in busy],
            "busy": busy, "workers": max(len(worker_shares), 1),
            "builds": sum(not r["reused"] for r in records if not r["error"]),
            "runs": records}


def worker_main(argv):
    """`python -m pipelines.engine WORKLIST.json`: trains the listed configs
    and prints a `STEP_PREFIX` line per step report and a `RESULT_PREFIX`
    JSON line per run."""
    with open(argv[1]) as handle:
        configs = [TrainConfig.from_dict(values, source=argv[1])
                   for values in json.load(handle)]
    last = {}

    def on_step(logdir, step):
        now = time.monotonic()
        if now - last.get(logdir, -STEP_REPORT_S) >= STEP_REPORT_S:
            last[logdir] = now
            print(STEP_PREFIX + json.dumps([logdir, step]), flush=True)

    def emit(record):
        print(RESULT_PREFIX + json.dumps(record), flush=True)

    train_configs(configs, emit, on_step)
    return 0
