"""Training a sweep's runs: resume checks, then one worker (this process)
or `--jobs N` worker processes, each training a share of the runs one after
another with `CompiledRuns`, so a run whose shapes match the previous one's
pays no new process, build or compile.

A worker process is `python -m pipelines.sweep WORKLIST.json`; it prints
one line per finished run, which this process relays as it arrives.
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

from pipelines.common import write_json_atomic
from pipelines.compare.runner import is_complete
from pipelines.config import TrainConfig
from pipelines.run_dir import read_metrics
from pipelines.sweep.reuse import CompiledRuns
from pipelines.sweep.reuse import shape_key
from pipelines.train import train

PENDING_DIR = ".pending"
# What a worker prints before each finished run's JSON line.
RESULT_PREFIX = "sweep-run "
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


def train_configs(configs, emit):
    """Trains `configs` in order in this process, reusing compiled parts;
    `emit(record)` hears of each run as it ends."""
    reuse = CompiledRuns()
    for config in configs:
        started, cpu_started = time.time(), time.process_time()
        reuses = reuse.reuses
        try:
            metrics = train(config, hparams_experiment=False, reuse=reuse)
            error = None
        except Exception as exception:  # reported, and the next run goes on
            metrics, error = None, f"{type(exception).__name__}: {exception}"
            reuse = CompiledRuns()
        emit({"logdir": config.logdir, "seconds": time.time() - started,
              "cpu_seconds": time.process_time() - cpu_started,
              "error": error, "outcome": outcome(metrics),
              "reused": reuse.reuses > reuses})


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


def _worker_env(threads):
    env = dict(os.environ)
    # Every run trains on this process's backend (the runs' configs say
    # so, and a worker on another backend would refuse them).
    env["KERAS_BACKEND"] = keras.backend.backend()
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
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


def _run_worker(index, configs, pending, env, relay):
    """One worker process over `configs`; returns (returncode, log path)."""
    worklist = os.path.join(pending, f"worker{index}.json")
    write_json_atomic(worklist, [config.to_dict() for config in configs])
    log_path = os.path.join(pending, f"worker{index}.log")
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipelines.sweep", worklist],
            stdout=subprocess.PIPE, stderr=log, text=True, env=env,
        )
        for line in process.stdout:
            if line.startswith(RESULT_PREFIX):
                relay(json.loads(line[len(RESULT_PREFIX):]))
            else:
                log.write(line)
        process.wait()
    return process.returncode, log_path


def train_runs(plan, log=print):
    """Trains every run of `plan` that is not complete yet.

    Returns:
        `{"trained_now": [names], "skipped": n, "workers": n,
        "builds": n (runs that built their compiled parts), "runs": [per-run
        timing records]}`.

    Raises:
        UsageError: when a run's directory holds another run.
        RuntimeError: when runs failed (after the others are done).
    """
    runs = plan.runs()  # Checked before the logdir's lock was taken.
    todo = [run for run in runs if not is_complete(run)]
    if len(runs) > len(todo):
        log(f"{len(runs) - len(todo)} of {len(runs)} runs already complete; "
            "skipped")
    names = {run.config.logdir: run.name for run in todo}
    records, lock = [], threading.Lock()

    def relay(record):
        with lock:
            records.append(record)
            name = names.get(record["logdir"], record["logdir"])
            log(f"[{len(records)}/{len(todo)}] {name}: {record['outcome']} "
                f"({record['seconds']:.0f} s)")

    configs = [run.config for run in todo]
    worker_shares = shares(configs, plan.jobs) if configs else []
    failures = []
    if len(worker_shares) <= 1:
        train_configs(configs, relay)
    else:
        pending = os.path.join(plan.logdir, PENDING_DIR)
        os.makedirs(pending, exist_ok=True)
        threads = max(1, (os.cpu_count() or 1) // len(worker_shares))
        env = _worker_env(threads)
        with concurrent.futures.ThreadPoolExecutor(len(worker_shares)) as pool:
            futures = [
                pool.submit(_run_worker, index, share, pending, env, relay)
                for index, share in enumerate(worker_shares)
            ]
            for future in futures:
                returncode, log_path = future.result()
                if returncode != 0:
                    with open(log_path) as handle:
                        failures.append(handle.read()[-_LOG_TAIL_CHARS:])
        if not failures:
            shutil.rmtree(pending, ignore_errors=True)
    failed = [r for r in records
              if r["error"] or read_metrics(r["logdir"]) is None]
    missing = len(todo) - len(records)
    if failures or failed or missing:
        detail = (failed[0]["error"] if failed and failed[0]["error"]
                  else failures[0] if failures else "a worker stopped early")
        raise RuntimeError(
            f"{len(failed) + missing} run(s) failed; the first ended "
            f"with:\n{detail}"
        )
    return {"trained_now": [names[c.logdir] for c in configs],
            "skipped": len(runs) - len(todo), "workers": len(worker_shares),
            "builds": sum(not r["reused"] for r in records), "runs": records}


def worker_main(argv):
    """`python -m pipelines.sweep WORKLIST.json`: trains the listed configs
    and prints one `RESULT_PREFIX` JSON line per run."""
    with open(argv[1]) as handle:
        configs = [TrainConfig.from_dict(values, source=argv[1])
                   for values in json.load(handle)]

    def emit(record):
        print(RESULT_PREFIX + json.dumps(record), flush=True)

    train_configs(configs, emit)
    return 0
