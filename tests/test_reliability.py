"""Run directories under concurrency, kills, full disks and damaged files,
and the quiet stderr of normal commands.

Each case drives `keras-attention` as a user does (the command line, in this
process or in a child process) and checks the promise against the files on
disk and against an uninterrupted run of the same config on the same
backend (its weights compared with numpy). The kill and the refused write
run on TensorFlow and on JAX; a JAX command runs in a child process (the
Keras backend of this process is TensorFlow, fixed at import).

A checkpoint is one file, `checkpoints/ckpt-<step>.npz`, staged as
`.ckpt-<step>.npz.tmp-<random>.npz` beside it and renamed into place
(`pipelines.checkpoints`, `keras_attention.files.atomic_path`).
"""

import fcntl
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import zipfile

import keras
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_file_loader import (
    EventFileLoader,
)

from _kill_worker import kill_in_save_while
from pipelines.cli import main
from pipelines.run_dir import restore_model
from pipelines.tensorboard import read_event_scalars

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT_WORKER = os.path.join(REPO, "tests", "_write_limit_worker.py")
KILL_WORKER = os.path.join(REPO, "tests", "_kill_worker.py")

BACKENDS = ("tensorflow", "jax")
# 30 steps, a checkpoint every 10: ckpt-10, -20, -30. Two layers, as in
# the depth comparison: a resume must keep each layer's diagnostics. A log
# every 4 steps: ckpt-10 falls inside the window 9..12, whose mean a run
# resumed from it logs at step 12.
RUN = dict(steps=30, checkpoint_every=10, eval_every=10, log_every=4,
           diagnostics_every=10, num_layers=2, seed=5, deterministic=True)
# The steps of the training logs.
TRAIN_LOGGED = [4, 8, 12, 16, 20, 24, 28, 30]
# metrics.json's clocks, paths and start, which differ between two runs of
# one config.
RUN_SPECIFIC = ("wall_time_s", "train_time_s", "first_step_time_s",
                "steps_per_s", "examples_per_s", "logdir",
                "resumed_from_step")
# The event scalars of the throughput, which differ the same way.
CLOCK_TAGS = ("steps_per_second", "examples_per_second")
# A checkpoint file of this model is 83 KB: a save under this file size
# limit fails mid-write (see _write_limit_worker.py).
CHECKPOINT_LIMIT_BYTES = 20_000
# A checkpoint's file name, and the name `atomic_path` stages it under.
CHECKPOINT = re.compile(r"^ckpt-(\d+)\.npz$")
STAGING = re.compile(r"^\.ckpt-(\d+)\.npz\.tmp-[^/]+\.npz$")
# What every staging name of `atomic_path` holds.
TEMPORARY_MARK = ".tmp-"


@pytest.fixture(scope="module")
def config_files(tmp_path_factory, tiny_config):
    """`{backend: path}` of `--config` files of the tiny run."""
    directory = tmp_path_factory.mktemp("config")
    paths = {}
    for backend in BACKENDS:
        values = tiny_config(**RUN).to_dict()
        values["backend"] = backend
        paths[backend] = str(directory / f"tiny_{backend}.json")
        with open(paths[backend], "w") as handle:
            json.dump(values, handle)
    return paths


@pytest.fixture(scope="module")
def config_file(config_files):
    """The `--config` file of the tiny run on TensorFlow."""
    return config_files["tensorflow"]


@pytest.fixture(scope="module")
def references(tmp_path_factory, config_files):
    """`references(backend)`: the directory of an uninterrupted run of the
    tiny config on `backend` (run once, when first asked for)."""
    runs = {}

    def reference(backend):
        if backend not in runs:
            logdir = tmp_path_factory.mktemp(f"reference_{backend}") / "run"
            status, stderr = _command(
                backend, _train(config_files[backend], logdir)
            )
            assert status == 0, stderr[-3000:]
            runs[backend] = logdir
        return runs[backend]

    return reference


@pytest.fixture(scope="module")
def reference(references):
    """The uninterrupted TensorFlow run of the tiny config."""
    return references("tensorflow")


def _train(config_file, logdir, *flags):
    """`train` of a config file of `config_files`, on its backend."""
    with open(config_file) as handle:
        backend = json.load(handle)["backend"]
    return ["train", "--config", config_file, "--backend", backend,
            "--logdir", str(logdir), *flags]


def _environment():
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    # JAX on the CPU, where XLA is deterministic: the runs compared share
    # it (on a GPU, JAX would take the GPU, whose scatter-adds are not).
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def _command(backend, argv, capfd=None, timeout=300):
    """Runs `keras-attention ARGV` on `backend`: in this process on
    TensorFlow (stderr read through `capfd`, or not at all without it), in
    a child process on JAX. Returns `(exit status, stderr)`."""
    if backend == "tensorflow":
        if capfd is None:
            return main(argv), ""
        capfd.readouterr()
        status = main(argv)
        return status, capfd.readouterr().err
    result = subprocess.run(_cli(argv), env=_environment(),
                            capture_output=True, text=True, timeout=timeout)
    return result.returncode, result.stderr


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
            if TEMPORARY_MARK in os.path.basename(path)]


def _checkpoint_files(run_dir):
    directory = run_dir / "checkpoints"
    return sorted(os.listdir(directory)) if directory.exists() else []


def _whole_checkpoints(*steps):
    return sorted(f"ckpt-{step}.npz" for step in steps)


def _checkpointed_steps(run_dir):
    """The steps of the checkpoint files on disk, oldest first."""
    return sorted(int(match.group(1)) for match in
                  map(CHECKPOINT.match, _checkpoint_files(run_dir)) if match)


def _checkpoint_arrays(path):
    """A checkpoint file's arrays, without the variables' paths (their
    names carry process-wide counters) and the loop's state."""
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files
                if not name.endswith("/paths") and name != "progress"}


def _checkpoint_progress(path):
    """The loop's state a checkpoint file holds (its `progress` member,
    JSON), without the event files' extent (their names hold a time and
    a pid)."""
    with np.load(path, allow_pickle=False) as archive:
        progress = json.loads(archive["progress"].tobytes())
    del progress["logs"]
    return progress


def _assert_same_checkpoint(path, reference_path):
    got, want = _checkpoint_arrays(path), _checkpoint_arrays(reference_path)
    assert sorted(got) == sorted(want) and len(got) > 2
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6,
                                   err_msg=name)
    _assert_close(_checkpoint_progress(path),
                  _checkpoint_progress(reference_path), "progress")


def _assert_close(got, want, where):
    """`got` equals `want`, JSON documents, their floats within 1e-6 (the
    weights' tolerance) or 1e-5 relative."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), where
        for key in want:
            _assert_close(got[key], want[key], f"{where}/{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for index, (item, wanted) in enumerate(zip(got, want)):
            _assert_close(item, wanted, f"{where}[{index}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6), where
    else:
        assert got == want, where


def _steps_by_tag(directory):
    """`{tag: every step it is logged at}` under `directory`, once per
    record (across all event files: a resumed run adds its own file)."""
    steps = {}
    for name in sorted(os.listdir(directory)):
        for event in EventFileLoader(os.path.join(directory, name)).Load():
            for value in event.summary.value:
                steps.setdefault(value.tag, []).append(event.step)
    return {tag: sorted(logged) for tag, logged in steps.items()}


def _logged_steps(directory, tag):
    """Every step `tag` is logged at under `directory`, once per record."""
    return _steps_by_tag(directory).get(tag, [])


def _assert_same_run(run_dir, reference_dir):
    """`run_dir` holds what the uninterrupted `reference_dir` does: its
    metrics.json but the clocks and paths (the diagnostics records of each
    layer included), each tag at the same steps, once each, with the same
    values (the throughput's aside)."""
    got, want = (
        {name: value for name, value in json.loads(
            (directory / "metrics.json").read_text()).items()
         if name not in RUN_SPECIFIC}
        for directory in (run_dir, reference_dir))
    assert sorted(want["diagnostics"]["init"]["layers"]) == [
        "attention_0", "attention_1"]
    _assert_close(got, want, "metrics.json")
    for sub in ("train", "validation"):
        assert _steps_by_tag(run_dir / sub) == _steps_by_tag(
            reference_dir / sub), sub
        values = read_event_scalars(str(run_dir / sub))
        wanted = read_event_scalars(str(reference_dir / sub))
        for tag in set(wanted) - set(CLOCK_TAGS):
            _assert_close(values[tag], wanted[tag], f"{sub}/{tag}")


def _one_line(stderr):
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def _resume(backend, config_file, logdir, reference, capfd, from_step):
    """The same command again, with room: exit 0, nothing on stderr, and the
    uninterrupted run's weights, metrics and event steps."""
    status, stderr = _command(backend, _train(config_file, logdir), capfd)
    assert status == 0, stderr[-3000:]
    assert stderr == "", stderr[-3000:]
    metrics = json.loads((logdir / "metrics.json").read_text())
    assert metrics["backend"] == backend
    assert metrics["resumed_from_step"] == from_step
    assert metrics["steps"] == RUN["steps"]
    _assert_same_weights(logdir, reference)
    _assert_same_run(logdir, reference)
    assert _temporaries(logdir) == []
    assert _checkpoint_files(logdir) == _whole_checkpoints(10, 20, 30)
    return metrics


# ------------------------------------------------------------------ locks
def test_second_process_exits_2_and_a_killed_one_blocks_nothing(
    tmp_path, config_file, reference, capfd
):
    logdir = tmp_path / "run"
    command = _train(config_file, logdir)
    # The run holds its directory, waiting after its second save (ckpt-20),
    # while the second process starts.
    holder = subprocess.Popen(
        [sys.executable, KILL_WORKER, "after-save", "2", *command],
        env=_environment(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )
    # The second process imports everything meanwhile and runs the same
    # command when told to.
    second = subprocess.Popen(
        [sys.executable, "-c", WHEN_TOLD, *command], env=_environment(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )
    try:
        ready, _, _ = select.select([holder.stdout], [], [], 120)
        assert ready, "the run saved no checkpoint in time"
        saved = holder.stdout.readline()
        assert saved == "saved 20\n", holder.stderr.read()[-3000:]
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
        for stream in (holder.stdin, holder.stdout, holder.stderr):
            stream.close()
    assert holder.returncode == -signal.SIGKILL
    assert _checkpoint_files(logdir) == _whole_checkpoints(10, 20)

    # What a kill in the middle of a save leaves (the staging file of the
    # checkpoint; a partial one, here) is cleared by the next start.
    checkpoints = logdir / "checkpoints"
    staged = checkpoints / ".ckpt-30.npz.tmp-0123abcd.npz"
    staged.write_bytes(b"PK\x03\x04 cut short")
    # The killed holder's lock went with it: the same command runs, resumes
    # and ends where the uninterrupted run did.
    _resume("tensorflow", config_file, logdir, reference, capfd,
            from_step=20)
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


# ------------------------------------------------------------------ kills
@pytest.mark.parametrize("backend", BACKENDS)
def test_sigkill_mid_save_resumes_to_the_uninterrupted_weights(
    tmp_path, backend, config_files, references, capfd
):
    config_file = config_files[backend]
    logdir = tmp_path / "run"
    # Killed during the save of ckpt-20, its staging file written: steps
    # 11..20 are logged, ckpt-10 is the last checkpoint.
    # The uninterrupted run (the first time it is asked for) runs
    # meanwhile.
    reference = kill_in_save_while(_train(config_file, logdir),
                                   _environment(),
                                   lambda: references(backend))
    assert not (logdir / "metrics.json").exists()
    names = _checkpoint_files(logdir)
    assert len(names) == 2 and names[1] == "ckpt-10.npz", names
    assert STAGING.match(names[0]) and names[0].startswith(".ckpt-20.npz")
    assert _logged_steps(logdir / "train", "loss") == TRAIN_LOGGED[:5]

    # The resumed run reads its evaluations and initial diagnostics from
    # ckpt-10 (the losses of steps 9 and 10 among them, for the mean logged
    # at step 12), and cuts the event files back to it: steps 11..20, logged
    # by the killed run, are recomputed and logged once more (`_resume`
    # compares every metric, tag and step with the uninterrupted run's).
    metrics = _resume(backend, config_file, logdir, reference, capfd,
                      from_step=10)
    assert [step for step, _ in metrics["eval_history"]] == [0, 10, 20, 30]
    assert _logged_steps(logdir / "train", "loss") == TRAIN_LOGGED
    assert _logged_steps(logdir / "validation",
                         "attention/attention_1/score_std") == [0, 10, 20, 30]
    for step in (10, 20, 30):
        _assert_same_checkpoint(logdir / "checkpoints" / f"ckpt-{step}.npz",
                                reference / "checkpoints" / f"ckpt-{step}.npz")


# `python -c KILLED_AFTER_HEADER ARG...`: runs `keras-attention ARG...`,
# killed with SIGKILL once the run has written its step-0 header (the config
# and HParams), before its first evaluation.
KILLED_AFTER_HEADER = (
    "import os, signal, sys; from pipelines.cli import main; "
    "import pipelines.train as train; header = train.write_run_header; "
    "train.write_run_header = lambda *args: (header(*args), "
    "os.kill(os.getpid(), signal.SIGKILL)); sys.exit(main(sys.argv[1:]))"
)


def test_sigkill_before_the_first_checkpoint_starts_clean(
    tmp_path, config_file, reference, capfd
):
    logdir = tmp_path / "run"
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_HEADER,
         *_train(config_file, logdir)],
        env=_environment(), capture_output=True, text=True, timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert _checkpoint_files(logdir) == []
    logged = _steps_by_tag(logdir / "validation")
    assert logged["config"] == [0] and "accuracy" not in logged
    # The rerun starts from scratch, step 0 logged whole (the config once,
    # the evaluation and diagnostics of step 0).
    _resume("tensorflow", config_file, logdir, reference, capfd,
            from_step=0)
    logged = _steps_by_tag(logdir / "validation")
    assert logged["config"] == [0]
    assert logged["attention/attention_0/score_std"] == [0, 10, 20, 30]


def _unfinished_copy(reference, logdir):
    """A copy of the reference run as if killed after its last checkpoint
    (no metrics.json, no model.keras); `(logdir, its checkpoints dir)`."""
    shutil.copytree(reference, logdir)
    for name in ("metrics.json", "model.keras"):
        (logdir / name).unlink()
    return logdir, logdir / "checkpoints"


def test_a_checkpoint_without_the_loop_state_is_refused(
    tmp_path, config_file, reference, capfd
):
    logdir, checkpoints = _unfinished_copy(reference, tmp_path / "run")
    # As an earlier version wrote them: the variables and the step only.
    for step in (10, 20, 30):
        path = checkpoints / f"ckpt-{step}.npz"
        with np.load(path, allow_pickle=False) as archive:
            values = {name: archive[name] for name in archive.files
                      if name != "progress"}
        np.savez(path, **values)
    before = _mtimes(logdir)
    status, stderr = _command("tensorflow", _train(config_file, logdir),
                              capfd)
    assert status == 2
    assert _one_line(stderr) == (
        "keras-attention train: error: checkpoint file "
        f"{checkpoints / 'ckpt-30.npz'} holds no training progress (it was "
        f"written by an earlier version); move {checkpoints} aside to train "
        "from the start"
    )
    assert _mtimes(logdir) == before


# --------------------------------------------------------- write failures
def _assert_failed_write(status, stderr, logdir, reason):
    """A refused write: exit 1, one line naming the last checkpoint on disk
    (or none), no temporary file; returns the line and that step (0 for
    none)."""
    assert status == 1, stderr[-3000:]
    line = _one_line(stderr)
    assert line.startswith("keras-attention train: error: cannot write ")
    assert reason in line
    steps = _checkpointed_steps(logdir)
    if not steps:
        assert line.endswith(
            "no step is checkpointed yet; free space and run the same "
            "command to start again"
        )
        assert _checkpoint_files(logdir) == []
        step = 0
    else:
        step = steps[-1]
        recorded = logdir / "checkpoints" / f"ckpt-{step}.npz"
        assert line.endswith(
            f"the last step safely checkpointed is {step} ({recorded}); "
            "free space and run the same command to resume from there"
        )
        # Only whole checkpoints up to that step are left, the newest 3.
        assert _checkpoint_files(logdir) == _whole_checkpoints(
            *range(10, step + 1, 10))[-3:]
    assert _temporaries(logdir) == []
    assert not (logdir / "metrics.json").exists()
    return line, step


# The checkpoint is written from numpy arrays by the same code on every
# backend: the TensorFlow case covers it by default, JAX's under -m slow.
@pytest.mark.parametrize("backend", [
    "tensorflow", pytest.param("jax", marks=pytest.mark.slow)])
def test_write_failure_mid_checkpoint_then_resume_to_identical_weights(
    tmp_path, backend, config_files, references, capfd
):
    config_file = config_files[backend]
    logdir = tmp_path / "run"
    # ckpt-10 is saved; ckpt-20's file is cut short mid-write (EFBIG).
    result = subprocess.run(
        [sys.executable, LIMIT_WORKER, "in-save",
         str(CHECKPOINT_LIMIT_BYTES), "1", *_train(config_file, logdir)],
        env=_environment(), capture_output=True, text=True, timeout=300,
    )
    checkpoints = logdir / "checkpoints"
    line, step = _assert_failed_write(result.returncode, result.stderr,
                                      logdir, "File too large")
    assert step == 10
    assert line == (
        "keras-attention train: error: cannot write checkpoint "
        f"{checkpoints / 'ckpt-20.npz'}: File too large; the last step "
        f"safely checkpointed is 10 ({checkpoints / 'ckpt-10.npz'}); free "
        "space and run the same command to resume from there"
    )
    reference = references(backend)
    # The checkpoint left is whole: the uninterrupted run's ckpt-10.
    _assert_same_checkpoint(checkpoints / "ckpt-10.npz",
                            reference / "checkpoints" / "ckpt-10.npz")
    # "Space freed": the same command without the limit.
    _resume(backend, config_file, logdir, reference, capfd, from_step=10)


@pytest.mark.parametrize("backend", [
    "tensorflow",
    # The JAX run's refused checkpoint write is the default case above.
    pytest.param("jax", marks=pytest.mark.slow),
])
def test_write_failure_in_an_event_file_then_resume_to_identical_weights(
    tmp_path, backend, config_files, references, capfd
):
    config_file = config_files[backend]
    logdir = tmp_path / "run"
    # Once ckpt-20 is saved no file may grow past 100 bytes: the next
    # write, the train events of step 24, is refused (EFBIG).
    result = subprocess.run(
        [sys.executable, LIMIT_WORKER, "after-save", "100", "2",
         *_train(config_file, logdir)],
        env=_environment(), capture_output=True, text=True, timeout=300,
    )
    checkpoints = logdir / "checkpoints"
    line, step = _assert_failed_write(result.returncode, result.stderr,
                                      logdir, "File too large")
    assert line == (
        "keras-attention train: error: cannot write the event file in "
        f"{logdir / 'train'}: File too large; the last step safely "
        f"checkpointed is 20 ({checkpoints / 'ckpt-20.npz'}); free space "
        "and run the same command to resume from there"
    )
    assert step == 20
    assert _logged_steps(logdir / "train", "loss") == TRAIN_LOGGED[:5]
    _resume(backend, config_file, logdir, references(backend), capfd,
            from_step=20)
    assert _logged_steps(logdir / "train", "loss") == TRAIN_LOGGED


def test_full_tmpfs_then_resume_to_identical_weights(
    tmp_path, config_file, reference, capfd
):
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    # Under half of what the whole run writes (tmpfs counts whole pages):
    # the disk fills up mid-run (where depends on the sizes of the event
    # files).
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
        _, step = _assert_failed_write(result.returncode, result.stderr,
                                       logdir, "No space left on device")
        # Space freed: the same disk, made larger.
        subprocess.run(["mount", "-o", f"remount,size={4 * size}",
                        str(mount_point)], check=True)
        _resume("tensorflow", config_file, logdir, reference, capfd,
                from_step=step)
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


# ---------------------------------------------------- damaged checkpoints
def _flip_a_byte(path, member):
    """Flips one byte in the middle of `member`'s data in the zip file at
    `path` (the archive still opens; the member's CRC-32 no longer
    matches)."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member)
    with open(path, "r+b") as handle:
        handle.seek(info.header_offset)
        header = handle.read(30)
        name_length = int.from_bytes(header[26:28], "little")
        extra_length = int.from_bytes(header[28:30], "little")
        offset = (info.header_offset + 30 + name_length + extra_length
                  + info.file_size // 2)
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))


def test_a_damaged_checkpoint_is_named_and_the_one_before_exported(
    tmp_path, reference, capfd
):
    logdir, checkpoints = _unfinished_copy(reference, tmp_path / "run")
    newest = checkpoints / "ckpt-30.npz"
    # A weight's bytes changed on disk (the file's length unchanged).
    _flip_a_byte(newest, "model/00005.npy")
    capfd.readouterr()
    before = _mtimes(logdir)
    exported = tmp_path / "exported.keras"
    assert main(["export", "--logdir", str(logdir), "--out",
                 str(exported)]) == 0
    assert _one_line(capfd.readouterr().err) == (
        f"keras-attention: warning: checkpoint file {newest} is corrupt "
        "(Bad CRC-32 for file 'model/00005.npy'); exporting ckpt-20.npz, "
        "step 20"
    )
    assert _mtimes(logdir) == before
    # The exported weights are ckpt-20's: those of the reference's ckpt-20,
    # restored here by a second path (its arrays, in the model's variable
    # order).
    model = keras.saving.load_model(exported)
    stored = _checkpoint_arrays(reference / "checkpoints" / "ckpt-20.npz")
    assert len(model.variables) > 0
    for index, variable in enumerate(model.variables):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(variable.value),
            stored[f"model/{index:05d}"], err_msg=variable.path)
    final = _checkpoint_arrays(reference / "checkpoints" / "ckpt-30.npz")
    assert not np.array_equal(final["model/00005"], stored["model/00005"])


def test_a_truncated_checkpoint_falls_back_or_exits_2(
    tmp_path, config_file, reference, capfd
):
    logdir, checkpoints = _unfinished_copy(reference, tmp_path / "run")
    newest = checkpoints / "ckpt-30.npz"
    os.truncate(newest, os.path.getsize(newest) // 2)

    # export reads the run's checkpoints the same way, and changes nothing.
    capfd.readouterr()
    exported = tmp_path / "exported.keras"
    before = _mtimes(logdir)
    assert main(["export", "--logdir", str(logdir), "--out",
                 str(exported)]) == 0
    assert _one_line(capfd.readouterr().err) == (
        f"keras-attention: warning: checkpoint file {newest} is corrupt "
        "(File is not a zip file); exporting ckpt-20.npz, step 20"
    )
    assert exported.exists()
    assert _mtimes(logdir) == before

    # train resumes from ckpt-20, removing the damaged ckpt-30; here its
    # next save, ckpt-30, fails, and the damaged ckpt-30 is not called safe.
    result = subprocess.run(
        [sys.executable, LIMIT_WORKER, "in-save",
         str(CHECKPOINT_LIMIT_BYTES), "0", *_train(config_file, logdir)],
        env=_environment(), capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.splitlines() == [
        f"keras-attention: warning: checkpoint file {newest} is corrupt "
        "(File is not a zip file); resuming from ckpt-20.npz, step 20",
        "keras-attention train: error: cannot write checkpoint "
        f"{newest}: File too large; the last step safely checkpointed is "
        f"20 ({checkpoints / 'ckpt-20.npz'}); free space and run the same "
        "command to resume from there",
    ]
    assert _temporaries(logdir) == []
    assert _checkpoint_files(logdir) == _whole_checkpoints(10, 20)
    # With space, the same command resumes from ckpt-20 (the damaged
    # checkpoint is gone: no second warning) and ends where the
    # uninterrupted run did.
    _resume("tensorflow", config_file, logdir, reference, capfd,
            from_step=20)

    # No whole checkpoint at all: exit 2 naming the newest file, nothing
    # written (the lock file records the pid of each start).
    for step in (10, 20, 30):
        os.truncate(checkpoints / f"ckpt-{step}.npz", 100)
    (logdir / "metrics.json").unlink()
    before = _mtimes(logdir)
    status, stderr = _command("tensorflow", _train(config_file, logdir),
                              capfd)
    assert status == 2
    assert _one_line(stderr) == (
        f"keras-attention train: error: checkpoint file {newest} is corrupt "
        "(File is not a zip file) and no earlier checkpoint is whole; move "
        f"{checkpoints} aside to train from the start"
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
    assert (tmp_path / "saved_model" / "saved_model.pb").exists()
