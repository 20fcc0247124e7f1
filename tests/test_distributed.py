"""Distributed training: MirroredStrategy on two logical CPU devices and
MultiWorkerMirroredStrategy as two worker processes on localhost, each
checked against a single-device run of the same command.

TensorFlow can configure logical devices and a multi-worker cluster only
before it initialises, so the distributed runs happen in subprocesses
(tests/_train_worker.py). The single-device reference runs in this process.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

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
    # The clip really bit: clipped and unclipped runs differ.
    assert not np.allclose(
        _train_curve(single_device_run), _train_curve(reference), rtol=1e-4
    )
