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

# 30 steps, a checkpoint every 10: ckpt-10, -20, -30.
RUN = dict(steps=30, checkpoint_every=10, eval_every=10, log_every=5,
           diagnostics_every=30, seed=5, deterministic=True)
# A checkpoint data file of this model is 34 KB: a save under this file
# size limit fails mid-write (see _write_limit_worker.py).
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


# `python -c WHEN_TOLD ARG...`: imports the command line, waits for a line
# on stdin, then runs `keras-attention ARG...`.
WHEN_TOLD = (
    "import sys; from pipelines.cli import main; sys.stdin.readline(); "
    "sys.exit(main(sys.argv[1:]))"
)
# `python -c IN_TURN ARGV_LISTS_JSON`: runs each command in one process;
# prints their exit statuses.
IN_TURN = (
    "import json, sys; from pipelines.cli import main; "
    "print(json.dumps([main(argv) for argv in json.loads(sys.argv[1])]))"
)


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


def _mtimes(root):
    """`{path: mtime}` under `root`, but the lock file (each start records
    its pid there)."""
    return {path: os.stat(os.path.join(root, path)).st_mtime_ns
            for path in _files(root) if path != ".lock"}


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
    # The second process imports everything meanwhile and runs the same
    # command when told to.
    second = subprocess.Popen(
        [sys.executable, "-c", WHEN_TOLD, *long_run], env=_environment(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.time() + 120
        while not (logdir / "checkpoints" / "checkpoint").exists():
            assert holder.poll() is None, holder.stderr.read()[-3000:]
            assert time.time() < deadline, "no checkpoint in time"
            time.sleep(0.05)
        assert (logdir / ".lock").read_text().strip() == str(holder.pid)
        config_before = (logdir / "config.json").stat().st_mtime_ns

        _, stderr = second.communicate("go\n", timeout=120)
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
        for process in (holder, second):
            if process.poll() is None:
                process.kill()
        holder.stderr.close()
    assert holder.returncode == -signal.SIGKILL

    # The killed holder's lock went with it: the next start runs and
    # resumes (the config file fixes warmup_steps, so --steps, a runtime
    # setting, may change: ten more steps are enough).
    killed_at = int(tf.train.latest_checkpoint(
        str(logdir / "checkpoints")).rsplit("-", 1)[1])
    # What a kill in the middle of a save leaves (TensorFlow's staging
    # names) is cleared by the next start.
    staged = logdir / "checkpoints" / f"ckpt-{killed_at + 10}_temp"
    staged.mkdir()
    (staged / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"x")
    (logdir / "checkpoints" / "checkpoint.tmp0123abcd").write_text("x")
    capfd.readouterr()
    assert main(_train(config_file, logdir, "--steps",
                       str(killed_at + 10))) == 0
    assert capfd.readouterr().err == ""
    metrics = json.loads((logdir / "metrics.json").read_text())
    assert metrics["resumed_from_step"] == killed_at > 0
    assert (logdir / ".lock").read_text().strip() == str(os.getpid())
    assert _temporaries(logdir) == []


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


# --------------------------------------------------------- write failures
def _assert_failed_write(result, logdir, reason):
    """A refused write: exit 1, one line naming the last checkpoint on disk
    (or none), no temporary file; returns the line and that step (0 for
    none)."""
    assert result.returncode == 1, result.stderr[-3000:]
    line = _one_line(result.stderr)
    assert line.startswith("keras-attention train: error: cannot write ")
    assert reason in line
    recorded = tf.train.latest_checkpoint(str(logdir / "checkpoints"))
    if recorded is None:
        assert line.endswith(
            "no step is checkpointed yet; free space and run the same "
            "command to start again"
        )
        assert _checkpoint_files(logdir) == []
        step = 0
    else:
        step = int(recorded.rsplit("-", 1)[1])
        assert line.endswith(
            f"the last step safely checkpointed is {step} ({recorded}); "
            "free space and run the same command to resume from there"
        )
        # Only whole checkpoints up to that step are left.
        assert _checkpoint_files(logdir) == ["checkpoint"] + sorted(
            f"ckpt-{saved}{suffix}" for saved in range(10, step + 1, 10)
            for suffix in (".data-00000-of-00001", ".index")
        )
    assert _temporaries(logdir) == []
    assert not (logdir / "metrics.json").exists()
    return line, step


def _resume(config_file, logdir, reference, capfd, from_step):
    capfd.readouterr()
    assert main(_train(config_file, logdir)) == 0
    assert capfd.readouterr().err == ""
    metrics = json.loads((logdir / "metrics.json").read_text())
    assert metrics["resumed_from_step"] == from_step
    assert metrics["steps"] == RUN["steps"]
    _assert_same_weights(logdir, reference)


def test_write_failure_mid_checkpoint_then_resume_to_identical_weights(
    tmp_path, config_file, reference, capfd
):
    logdir = tmp_path / "run"
    # ckpt-10 is saved; ckpt-20's data file is cut short mid-write (EFBIG).
    result = subprocess.run(
        [sys.executable, LIMIT_WORKER, str(CHECKPOINT_LIMIT_BYTES), "1",
         *_train(config_file, logdir)],
        env=_environment(), capture_output=True, text=True, timeout=300,
    )
    line, step = _assert_failed_write(result, logdir, "File too large")
    assert step == 10
    assert line.startswith(
        "keras-attention train: error: cannot write checkpoint "
        f"{logdir / 'checkpoints' / 'ckpt-20'}: File too large; "
    )
    # "Space freed": the same command without the limit.
    _resume(config_file, logdir, reference, capfd, from_step=10)


def test_full_tmpfs_then_resume_to_identical_weights(
    tmp_path, config_file, reference, capfd
):
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    # Under half of what the whole run writes (tmpfs counts whole pages):
    # the disk fills up mid-run (at ckpt-20 here; where depends on the
    # sizes of the event files).
    pages = sum(
        -(-os.path.getsize(os.path.join(directory, name)) // 4096) + 1
        for directory, _, names in os.walk(reference) for name in names
    )
    size = int(pages * 0.45) * 4096
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
         str(mount_point)],
        capture_output=True, text=True,
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root or "
                    f"CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        logdir = mount_point / "run"
        result = subprocess.run(
            _cli(_train(config_file, logdir)), env=_environment(),
            capture_output=True, text=True, timeout=300,
        )
        _, step = _assert_failed_write(result, logdir,
                                       "No space left on device")
        # Space freed: the same disk, made larger.
        subprocess.run(["mount", "-o", f"remount,size={4 * size}",
                        str(mount_point)], check=True)
        _resume(config_file, logdir, reference, capfd, from_step=step)
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


# ---------------------------------------------------- damaged checkpoints
def test_a_truncated_checkpoint_falls_back_or_exits_2(
    tmp_path, config_file, reference, capfd
):
    logdir = tmp_path / "run"
    shutil.copytree(reference, logdir)
    for name in ("metrics.json", "model.keras"):
        (logdir / name).unlink()
    newest = logdir / "checkpoints" / "ckpt-30.data-00000-of-00001"
    os.truncate(newest, os.path.getsize(newest) // 2)

    # export reads the run's checkpoints the same way, and changes nothing.
    capfd.readouterr()
    exported = tmp_path / "exported.keras"
    before = _mtimes(logdir)
    assert main(["export", "--logdir", str(logdir), "--out",
                 str(exported)]) == 0
    assert _one_line(capfd.readouterr().err) == (
        f"keras-attention: warning: checkpoint file {newest} is corrupt "
        "(Read less bytes than requested); exporting ckpt-20, step 20"
    )
    assert exported.exists()
    assert _mtimes(logdir) == before

    # train resumes from ckpt-20; here its next save, ckpt-30, fails, and
    # the damaged ckpt-30 is not called safe.
    result = subprocess.run(
        [sys.executable, LIMIT_WORKER, str(CHECKPOINT_LIMIT_BYTES), "0",
         *_train(config_file, logdir)],
        env=_environment(), capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"keras-attention: warning: checkpoint file {newest} is corrupt "
        "(Read less bytes than requested); resuming from ckpt-20, step 20",
        "keras-attention train: error: cannot write checkpoint "
        f"{logdir / 'checkpoints' / 'ckpt-30'}: File too large; the last "
        "step safely checkpointed is 20 "
        f"({logdir / 'checkpoints' / 'ckpt-20'}); free space and run the "
        "same command to resume from there",
    ]
    assert _temporaries(logdir) == []
    # With space, the same command resumes from ckpt-20 (the damaged
    # checkpoint is forgotten: no second warning) and ends where the
    # uninterrupted run did.
    assert main(_train(config_file, logdir)) == 0
    assert capfd.readouterr().err == ""
    metrics = json.loads((logdir / "metrics.json").read_text())
    assert metrics["resumed_from_step"] == 20
    _assert_same_weights(logdir, reference)

    # No whole checkpoint at all: exit 2 naming the newest file, nothing
    # written (the lock file records the pid of each start).
    for step in (10, 20, 30):
        data = logdir / "checkpoints" / f"ckpt-{step}.data-00000-of-00001"
        os.truncate(data, 100)
    (logdir / "metrics.json").unlink()
    before = _mtimes(logdir)
    assert main(_train(config_file, logdir)) == 2
    line = _one_line(capfd.readouterr().err)
    assert line.startswith(
        f"keras-attention train: error: checkpoint file {newest} is corrupt ("
    )
    assert line.endswith(
        "and no earlier checkpoint is whole; move "
        f"{logdir / 'checkpoints'} aside to train from the start"
    )
    assert _mtimes(logdir) == before


# ------------------------------------------------------------ quiet stderr
def test_normal_commands_print_nothing_on_stderr(tmp_path, config_file):
    # As a user runs them: TensorFlow's log level not set beforehand.
    env = _environment()
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    env.pop("KERAS_ATTENTION_TF_LOGS", None)
    logdir = tmp_path / "run"
    commands = [
        _train(config_file, logdir),
        _train(config_file, logdir),  # A finished run: events read back.
        ["export", "--logdir", str(logdir), "--out",
         str(tmp_path / "saved_model")],
        ["compare", "--arms", "scaled", "--key-dims", "16",
         "--seeds", "1", "--steps", "10", "--d-model", "16",
         "--num-pairs", "4", "--num-keys", "8", "--num-values", "4",
         "--eval-every", "10", "--diagnostics-every", "10",
         "--checkpoint-every", "10", "--batch-size", "16",
         "--heldout-size", "64", "--probe-size", "8",
         "--variance-samples", "0", "--logdir", str(tmp_path / "compare")],
    ]
    # One process for all (TensorFlow starts once: ~5 s a process saved);
    # its start-up is the start-up of the first command.
    result = subprocess.run(
        [sys.executable, "-c", IN_TURN, json.dumps(commands)], env=env,
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == [0] * len(commands)
    assert result.stderr == "", result.stderr[-3000:]
