"""Run directories under concurrency, kills, full disks and damaged files,
and the quiet stderr of normal commands.

Each case drives `keras-attention` as a user does (the command line, in this
process or in a child process) and checks the promise against the files on
disk and against an uninterrupted run of the same config (its weights
compared with numpy).
"""

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from pipelines.cli import main
from pipelines.run_dir import restore_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT_WORKER = os.path.join(REPO, "tests", "_write_limit_worker.py")

# 30 steps, a checkpoint every 10: ckpt-10, -20, -30. One checkpoint data
# file of this model is 34 KB; config.json and every event file stay under
# 20 KB during the run (diagnostics only at steps 0 and 30).
RUN = dict(steps=30, checkpoint_every=10, eval_every=10, log_every=5,
           diagnostics_every=30, seed=5, deterministic=True)
CHECKPOINT_LIMIT_BYTES = 20_000
# Temporary names TensorFlow's and this package's writers use.
TEMPORARY_MARKS = ("_temp", ".tmp", "tempstate")


@pytest.fixture(scope="module")
def config_file(tmp_path_factory, tiny_config):
    """A `--config` file of the tiny run."""
    path = tmp_path_factory.mktemp("config") / "tiny.json"
    path.write_text(json.dumps(tiny_config(**RUN).to_dict()))
    return str(path)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, config_file):
    """An uninterrupted run of the tiny config: its directory."""
    logdir = tmp_path_factory.mktemp("reference") / "run"
    assert main(_train(config_file, logdir)) == 0
    return logdir


def _train(config_file, logdir, *flags):
    return ["train", "--config", config_file, "--logdir", str(logdir), *flags]


def _environment(**changes):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    env.update(changes)
    return env


def _cli(argv):
    return [sys.executable, "-m", "pipelines", *argv]


def _weights(run_dir):
    return restore_model(str(run_dir)).get_weights()


def _assert_same_weights(run_dir, reference_dir):
    got, want = _weights(run_dir), _weights(reference_dir)
    assert len(got) == len(want) > 0
    for got_array, want_array in zip(got, want):
        np.testing.assert_allclose(got_array, want_array, rtol=0, atol=1e-6)


def _files(root):
    """Every path under `root`, relative."""
    return sorted(
        os.path.relpath(os.path.join(directory, name), root)
        for directory, subdirectories, names in os.walk(root)
        for name in subdirectories + names
    )


def _temporaries(root):
    return [path for path in _files(root)
            if any(mark in os.path.basename(path) for mark in TEMPORARY_MARKS)]


def _checkpoint_files(run_dir):
    directory = run_dir / "checkpoints"
    return sorted(os.listdir(directory)) if directory.exists() else []


def _one_line(stderr):
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


# ------------------------------------------------------------------ locks
def test_second_process_exits_2_and_a_killed_one_blocks_nothing(
    tmp_path, config_file, reference, capfd
):
    logdir = tmp_path / "run"
    # A long run of the same config: it holds the directory while the
    # second process starts.
    long_run = _train(config_file, logdir, "--steps", "100000")
    holder = subprocess.Popen(_cli(long_run), env=_environment(),
                              stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (logdir / "checkpoints" / "checkpoint").exists():
            assert holder.poll() is None, holder.stderr.read()[-3000:]
            assert time.time() < deadline, "no checkpoint in time"
            time.sleep(0.05)
        assert (logdir / ".lock").read_text().strip() == str(holder.pid)
        config_before = (logdir / "config.json").stat().st_mtime_ns

        second = subprocess.Popen(_cli(long_run), env=_environment(),
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        _, stderr = second.communicate(timeout=120)
        assert second.returncode == 2
        line = _one_line(stderr)
        assert line == (
            f"keras-attention train: error: --logdir {logdir} is in use by "
            f"process {holder.pid} (lock {logdir / '.lock'}); wait for it to "
            "end or use another --logdir"
        )
        # It wrote nothing: no event file of its own (event file names hold
        # the writer's pid), config.json and the lock untouched.
        assert not [path for path in _files(logdir)
                    if f".{second.pid}." in path]
        assert (logdir / "config.json").stat().st_mtime_ns == config_before
        assert (logdir / ".lock").read_text().strip() == str(holder.pid)

        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.stderr.close()
    assert holder.returncode == -signal.SIGKILL

    # The killed holder's lock went with it: the next start runs and
    # resumes (the config file fixes warmup_steps, so --steps, a runtime
    # setting, may change: ten more steps are enough).
    killed_at = int(tf.train.latest_checkpoint(
        str(logdir / "checkpoints")).rsplit("-", 1)[1])
    capfd.readouterr()
    assert main(_train(config_file, logdir, "--steps",
                       str(killed_at + 10))) == 0
    assert capfd.readouterr().err == ""
    metrics = json.loads((logdir / "metrics.json").read_text())
    assert metrics["resumed_from_step"] == killed_at > 0
    assert (logdir / ".lock").read_text().strip() == str(os.getpid())


def test_a_comparison_started_twice_exits_2(tmp_path, capsys):
    logdir = tmp_path / "compare"
    logdir.mkdir()
    # The first comparison's lock, taken here as any process would.
    with open(logdir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        status = main(["compare", "--arms", "scaled", "--key-dims", "8",
                       "--seeds", "1", "--steps", "5", "--d-model", "16",
                       "--variance-samples", "0", "--logdir", str(logdir)])
    assert status == 2
    assert capsys.readouterr().err.strip() == (
        f"keras-attention compare: error: --logdir {logdir} is in use by "
        f"process {os.getpid()} (lock {logdir / '.lock'}); wait for it to "
        "end or use another --logdir"
    )
    assert _files(logdir) == [".lock"]
