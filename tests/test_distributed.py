"""Distributed training: on TensorFlow, MirroredStrategy on two logical CPU
devices and MultiWorkerMirroredStrategy as two worker processes on
localhost; on JAX, `keras.distribution.DataParallel` over two host devices.
Each is checked against a single-device run of the same command.

TensorFlow can configure logical devices and a multi-worker cluster only
before it initialises, and JAX its host devices only when it starts, so
the distributed runs happen in subprocesses (tests/_train_worker.py). The
single-device TensorFlow reference runs in this process; the JAX one in a
child process that sees one device.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from _xla_flags import xla_flags
from pipelines.run_dir import restore_model
from pipelines.tensorboard import read_event_scalars
from pipelines.train import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "tests", "_train_worker.py")

# A tiny recall run; every train step is logged so the curves can be
# compared step by step.
TINY = [
    "--task", "recall", "--num-pairs", "4", "--num-keys", "8",
    "--num-values", "4", "--d-model", "16", "--key-dim", "16",
    "--batch-size", "16", "--steps", "12", "--log-every", "1",
    "--eval-every", "12", "--diagnostics-every", "12",
    "--checkpoint-every", "5", "--heldout-size", "64", "--probe-size", "8",
    "--seed", "3", "--deterministic", "--quiet",
]


def _config(tiny_config, logdir, **changes):
    """TINY as a config (tests/conftest.py's tiny recall run)."""
    return tiny_config(
        steps=12, log_every=1, eval_every=12, diagnostics_every=12,
        checkpoint_every=5, seed=3, deterministic=True, logdir=str(logdir),
        **changes,
    )


def _environment():
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.pop("TF_CONFIG", None)
    return env


def _train_curve(logdir):
    losses = read_event_scalars(os.path.join(logdir, "train"))["loss"]
    return np.array([losses[step] for step in sorted(losses)])


def _weights(run_dir):
    return restore_model(str(run_dir)).get_weights()


def _checkpoint_arrays(path):
    """A checkpoint file's arrays (model and optimizer variables, step),
    without the variables' paths (their names carry process-wide
    counters) and the loop's progress (it names the run's event files)."""
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files
                if not name.endswith("/paths") and name != "progress"}


def _assert_same_checkpoints(run_dir, reference_dir, rtol):
    """The run's checkpoint files (the steps of TINY's --checkpoint-every 5
    and its last step) hold the reference run's state."""
    names = sorted(os.listdir(run_dir / "checkpoints"))
    assert names == sorted(os.listdir(reference_dir / "checkpoints")) == [
        "ckpt-10.npz", "ckpt-12.npz", "ckpt-5.npz"]
    for name in names:
        got = _checkpoint_arrays(run_dir / "checkpoints" / name)
        want = _checkpoint_arrays(reference_dir / "checkpoints" / name)
        assert sorted(got) == sorted(want) and len(want) > 2
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=rtol,
                                       atol=1e-6, err_msg=f"{name} {key}")


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("localhost", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


@pytest.fixture(scope="module")
def single_device_run(tmp_path_factory, tiny_config):
    """The single-device reference run of TINY (default strategy)."""
    logdir = tmp_path_factory.mktemp("single") / "run"
    train(_config(tiny_config, logdir))
    return logdir


def test_mirrored_matches_single_device(tmp_path, single_device_run):
    bad_dir = tmp_path / "bad"
    run_dir = tmp_path / "mirrored"
    argv_lists = [
        ["train", *TINY, "--strategy", "mirrored", "--batch-size", "15",
         "--logdir", str(bad_dir)],
        ["train", *TINY, "--strategy", "mirrored", "--logdir", str(run_dir)],
    ]
    result = subprocess.run(
        [sys.executable, WORKER, "mirrored", json.dumps(argv_lists)],
        capture_output=True, text=True, env=_environment(), timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    statuses = json.loads(result.stdout.strip().splitlines()[-1])
    # A global batch of 15 does not split over 2 replicas: usage error,
    # nothing written.
    assert statuses == [2, 0]
    assert "divisible by the number of replicas (2)" in result.stderr
    assert not bad_dir.exists()

    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["backend"] == "tensorflow"
    assert metrics["num_replicas"] == 2
    assert metrics["strategy"] == "mirrored"
    final = metrics["diagnostics"]["final"]["summary"]
    # Diagnostics see the trained weights and their gradients.
    assert final["grad_norm_query"] > 0 and final["grad_norm_key"] > 0

    mirrored_curve = _train_curve(run_dir)
    single_curve = _train_curve(single_device_run)
    assert len(mirrored_curve) == len(single_curve) == 12
    np.testing.assert_allclose(mirrored_curve, single_curve, rtol=1e-4)
    for got, want in zip(_weights(run_dir), _weights(single_device_run)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    _assert_same_checkpoints(run_dir, single_device_run, rtol=1e-4)


def test_multiworker_matches_single_device(
    tmp_path, single_device_run, tiny_config
):
    # With gradient clipping the step all-reduces the gradients itself
    # (the optimizer must clip the global gradient): that path runs here,
    # the optimizer's own all-reduce in the mirrored test.
    clip = ["--clip-norm", "0.05"]
    logdir = tmp_path / "multi"
    ports = _free_ports(2)
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    workers = []
    for index in range(2):
        env = _environment()
        env["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}}
        )
        command = [
            sys.executable, WORKER, "multiworker",
            str(tmp_path / f"weights_{index}.npz"),
            *TINY, *clip, "--strategy", "multiworker", "--logdir", str(logdir),
        ]
        workers.append(subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        ))
    outputs = []
    try:
        # The single-device reference runs while the workers start.
        reference = tmp_path / "single_clip"
        train(_config(tiny_config, reference, clip_norm=0.05))
        for worker in workers:
            outputs.append(worker.communicate(timeout=300))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    for worker, (out, err) in zip(workers, outputs):
        assert worker.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1]) == {"num_replicas": 2}

    weights = [
        np.load(tmp_path / f"weights_{index}.npz") for index in range(2)
    ]
    assert len(weights[0].files) == len(weights[1].files) > 0
    for key in weights[0].files:
        np.testing.assert_array_equal(weights[0][key], weights[1][key])

    # Only the chief (worker 0) wrote the run directory.
    assert len(os.listdir(logdir / "train")) == 1
    metrics = json.loads((logdir / "metrics.json").read_text())
    assert metrics["backend"] == "tensorflow"
    assert metrics["num_replicas"] == 2
    assert metrics["strategy"] == "multiworker"

    np.testing.assert_allclose(
        _train_curve(logdir), _train_curve(reference), rtol=1e-4
    )
    single_weights = _weights(reference)
    for index, key in enumerate(weights[0].files):
        np.testing.assert_allclose(
            weights[0][key], single_weights[index], rtol=1e-4, atol=1e-5
        )
    # The chief's saved model holds the same weights as its memory.
    for got, want in zip(_weights(logdir), single_weights):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # Its checkpoints too; the other worker wrote none (they share the
    # directory).
    _assert_same_checkpoints(logdir, reference, rtol=1e-4)
    # The clip really bit: clipped and unclipped runs differ.
    assert not np.allclose(
        _train_curve(single_device_run), _train_curve(reference), rtol=1e-4
    )


def test_jax_data_parallel_matches_one_device(tmp_path):
    jax_tiny = [*TINY, "--backend", "jax"]
    bad_dir, two_dir, one_dir = (tmp_path / name
                                 for name in ("bad", "two", "one"))
    runs = {
        # Two host devices: `--strategy auto` shards the global batch over
        # both (keras.distribution.DataParallel).
        "two": [
            ["train", *jax_tiny, "--strategy", "auto", "--batch-size", "15",
             "--logdir", str(bad_dir)],
            ["train", *jax_tiny, "--strategy", "auto", "--logdir",
             str(two_dir)],
        ],
        # The reference: a process that sees one device.
        "one": [["train", *jax_tiny, "--strategy", "default", "--logdir",
                 str(one_dir)]],
    }
    processes = {
        name: subprocess.Popen(
            [sys.executable, WORKER, "jax", str(2 if name == "two" else 1),
             json.dumps(argv_lists)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=_environment(),
        )
        for name, argv_lists in runs.items()
    }
    outputs = {}
    try:
        for name, process in processes.items():
            outputs[name] = process.communicate(timeout=300)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
    for name, process in processes.items():
        assert process.returncode == 0, outputs[name][1][-3000:]
    two = json.loads(outputs["two"][0].strip().splitlines()[-1])
    one = json.loads(outputs["one"][0].strip().splitlines()[-1])
    assert two == {"statuses": [2, 0], "devices": 2}
    assert one == {"statuses": [0], "devices": 1}
    # A global batch of 15 does not split over 2 devices: usage error,
    # nothing written.
    assert ("keras-attention train: error: --batch-size (15) must be "
            "divisible by the number of replicas (2)") in outputs["two"][1]
    assert not bad_dir.exists()

    metrics = json.loads((two_dir / "metrics.json").read_text())
    single = json.loads((one_dir / "metrics.json").read_text())
    assert metrics["backend"] == single["backend"] == "jax"
    assert metrics["device_count"] == 2 and metrics["num_replicas"] == 2
    assert metrics["strategy"] == "mirrored"
    assert single["device_count"] == 1 and single["num_replicas"] == 1
    assert single["strategy"] == "default"

    two_curve, one_curve = _train_curve(two_dir), _train_curve(one_dir)
    assert len(two_curve) == len(one_curve) == 12
    np.testing.assert_allclose(two_curve, one_curve, rtol=1e-5)
    weights, single_weights = _weights(two_dir), _weights(one_dir)
    assert len(weights) == len(single_weights) > 0
    for got, want in zip(weights, single_weights):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # The checkpoints hold the replicated state, written back from the
    # devices.
    _assert_same_checkpoints(two_dir, one_dir, rtol=1e-5)
    assert metrics["heldout_loss"] == pytest.approx(single["heldout_loss"],
                                                    rel=1e-5)
    # The diagnostics see the trained, replicated weights: those of the
    # one-device run.
    final = metrics["diagnostics"]["final"]["summary"]
    want = single["diagnostics"]["final"]["summary"]
    assert final["grad_norm_query"] > 0 and final["grad_norm_key"] > 0
    assert sorted(final) == sorted(want)
    for key, value in want.items():
        assert final[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_xla_flags_replace_or_keep_a_flag_of_the_same_name():
    # The JAX processes get their device count this way (tests/_backends.py,
    # tests/_train_worker.py) and conftest its defaults (`keep`).
    count = "--xla_force_host_platform_device_count"
    assert xla_flags(f"--a=5 {count}=5", f"{count}=2") == f"--a=5 {count}=2"
    assert xla_flags("--a=5 --c=3", "--a=1", "--b=2", keep=True) == (
        "--a=5 --c=3 --b=2")
    assert xla_flags(None, "--a=1", keep=True) == "--a=1"
    assert xla_flags("", f"{count}=1") == f"{count}=1"
