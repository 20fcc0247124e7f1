"""The pipelines' stages of `gpu_check.py`: `keras-attention` run as a
user runs it, in a child process with a time limit, and what its run
directories say afterwards.

- `Command.run` runs a child (`cli_command`: `python -m pipelines.cli
  ARGS`; `timed_train_command`: this file, which calls the same
  `pipelines.cli.main` with each diagnostics call timed by
  `_training.timed_diagnostics`), streams its output, and ends its whole
  process group at the deadline.
- `train_record` turns one run directory into tokens/s, model FLOPs
  utilization, compile time and the share of the wall time spent in
  diagnostics, each from the run's own `metrics.json` and `config.json`.
- `grid_runs` reads every run of a comparison or sweep (`_gpu_plan` sizes
  the next grids from them); `verdict_lines` picks the verdicts out of the
  printed output.

As a script (`python scripts/_gpu_runs.py DIAGNOSTICS.json train ...`) it is
the instrumented `keras-attention train`.
"""

import glob
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

import _bench  # noqa: F401  (first: backend, sys.path)
import _training
from pipelines import cli
from pipelines.builders import build_task
from pipelines.common import write_json_atomic
from pipelines.settings import TrainConfig
from pipelines.tensorboard import read_event_scalars

SCRIPT = os.path.abspath(__file__)
# Lines of a command's output kept in the JSON.
TAIL_LINES = 40


def cli_command(argv):
    """`keras-attention ARGV`, as the entry point runs it."""
    return [sys.executable, "-m", "pipelines.cli", *argv]


def timed_train_command(diagnostics_json, argv):
    """`keras-attention ARGV` through this file: the same `main`, with the
    seconds of each diagnostics call written to `diagnostics_json`."""
    return [sys.executable, SCRIPT, diagnostics_json, *argv]


class Command:
    """One child process, run to completion or to a deadline."""

    def __init__(self, command, env, log_path):
        self.command, self.env, self.log_path = list(command), env, log_path

    def run(self, deadline):
        """Runs until it exits or `deadline` (epoch seconds) passes.

        Returns a dict: `returncode` (None when stopped), `seconds`,
        `timed_out` and `tail` (the last lines of its output).
        """
        started = time.time()
        tail = []
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        with open(self.log_path, "w") as log:
            # Its own session, so the deadline ends its workers too.
            child = subprocess.Popen(
                self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, env=self.env, start_new_session=True,
                cwd=_bench.REPO_ROOT)
            reader = threading.Thread(
                target=_relay, args=(child.stdout, log, tail), daemon=True)
            reader.start()
            try:
                child.wait(timeout=max(1.0, deadline - time.time()))
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
                _stop(child)
            reader.join(timeout=10)
        return dict(returncode=None if timed_out else child.returncode, timed_out=timed_out,
                    seconds=time.time() - started, tail=tail[-TAIL_LINES:])


def _relay(stream, log, tail):
    for line in stream:
        log.write(line)
        log.flush()
        print(f"    | {line}", end="", flush=True)
        tail.append(line.rstrip("\n"))
        del tail[:-TAIL_LINES]


def _stop(child):
    """SIGTERM to the child's process group, SIGKILL 10 s later."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# ------------------------------------------------------------ run dirs
def read_json(path):
    with open(path) as handle:
        return json.load(handle)


def run_facts(run_dir):
    """The timing facts of one finished run directory."""
    metrics = read_json(os.path.join(run_dir, "metrics.json"))
    config = TrainConfig.from_dict(read_json(os.path.join(run_dir,
                                                      "config.json")))
    return dict(
        name=os.path.basename(run_dir), arm=metrics.get("arm"),
        key_dim=config.key_dim, steps=metrics["steps"],
        wall_time_s=metrics["wall_time_s"],
        train_time_s=metrics["train_time_s"],
        first_step_s=metrics["first_step_time_s"],
        steps_per_s=metrics["steps_per_s"],
        heldout_accuracy=metrics.get("heldout_accuracy"),
        # metrics.json is written last: its time is the run's end.
        ended=os.path.getmtime(os.path.join(run_dir, "metrics.json")),
    ), config


def _model_figures(config, tokens_per_s, peak_tflops):
    """Tokens/s as model TFLOP/s and MFU, and the run's shape."""
    task = build_task(config)
    flops_per_token = _bench.model_flops_per_token(config, task)
    model_tflops = tokens_per_s * flops_per_token / 1e12
    return dict(
        seq_len=task.seq_len, batch_size=config.batch_size,
        tokens_per_step=config.batch_size * task.seq_len,
        precision=config.precision, tokens_per_s=tokens_per_s,
        flops_per_token=flops_per_token, model_tflops=model_tflops,
        mfu=None if not peak_tflops else model_tflops / peak_tflops)


def train_record(run_dir, diagnostics_s, peak_tflops):
    """Throughput, MFU, compile time and diagnostics share of one run.

    tokens/s counts the tokens of every step after the first (which traces
    and compiles) over the trainer's training time after the first step
    (evaluation, diagnostics and checkpoints are paused out of it): the
    trainer's own `steps_per_s` times the tokens of a step.
    """
    if not os.path.exists(os.path.join(run_dir, "metrics.json")):
        return partial_train_record(run_dir, diagnostics_s, peak_tflops)
    facts, config = run_facts(run_dir)
    tokens_per_step = config.batch_size * build_task(config).seq_len
    timed_steps = facts["steps"] - 1
    timed_seconds = facts["train_time_s"] - facts["first_step_s"]
    steady = timed_seconds / timed_steps
    diagnostics = sum(diagnostics_s)
    return dict(
        facts, **_model_figures(
            config, timed_steps * tokens_per_step / timed_seconds,
            peak_tflops),
        tokens_counted=timed_steps * tokens_per_step,
        timed_seconds=timed_seconds, steady_step_s=steady,
        compile_s=facts["first_step_s"] - steady,
        diagnostics=dict(calls=len(diagnostics_s), seconds=diagnostics,
                         share_of_wall=diagnostics / facts["wall_time_s"]),
    )


def partial_train_record(run_dir, diagnostics_s, peak_tflops):
    """What a run stopped before its end says: its diagnostics calls so far
    and, once it logged a window past the first (which compiles), the
    median steps/s of those windows from its event file."""
    config = TrainConfig.from_dict(read_json(os.path.join(run_dir,
                                                          "config.json")))
    record = dict(partial=True, diagnostics=dict(
        calls=len(diagnostics_s), seconds=sum(diagnostics_s)))
    windows = read_event_scalars(os.path.join(run_dir, "train")).get(
        "steps_per_second", {})
    steady = [rate for step, rate in sorted(windows.items())
              if step > config.log_every and rate]
    if steady:
        record.update(_model_figures(
            config, statistics.median(steady) * config.batch_size
            * build_task(config).seq_len, peak_tflops),
            logged_steps=max(windows))
    return record


class SavedDurations(list):
    """A list of seconds that rewrites `path` at each append, so a run
    stopped midway leaves the calls it made."""

    def __init__(self, path):
        super().__init__()
        self.path = path

    def append(self, seconds):
        super().append(seconds)
        write_json_atomic(self.path, {"diagnostics_s": list(self)})


def grid_runs(logdir):
    """The facts of every finished run under a comparison's or sweep's
    `logdir`, in order of their end."""
    runs = [run_facts(os.path.dirname(path))[0] for path in
            glob.glob(os.path.join(logdir, "*", "metrics.json"))]
    return sorted(runs, key=lambda run: run["ended"])


def training_window(runs):
    """Seconds from the first run's start to the last run's end."""
    if not runs:
        return 0.0
    return (max(run["ended"] for run in runs)
            - min(run["ended"] - run["wall_time_s"] for run in runs))


def verdict_lines(tail, pattern):
    """The lines of `tail` that match `pattern` (the printed verdicts)."""
    return [line.strip() for line in tail if re.match(pattern, line.strip())]


def _timed_cli(diagnostics_json, argv):
    """`keras-attention ARGV` with its diagnostics calls timed."""
    durations = SavedDurations(diagnostics_json)
    write_json_atomic(diagnostics_json, {"diagnostics_s": []})
    with _training.timed_diagnostics(durations):
        return cli.main(argv)


if __name__ == "__main__":
    sys.exit(_timed_cli(sys.argv[1], sys.argv[2:]))
