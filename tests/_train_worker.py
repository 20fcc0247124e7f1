"""Subprocess entry point for tests/test_distributed.py (not a test module).

TensorFlow fixes its logical devices and its multi-worker context when it
first initialises, so distributed runs need a fresh process:

    python tests/_train_worker.py mirrored ARGV_JSON
        Splits the CPU into two logical devices, then runs
        `keras-attention <argv>` for each argv list in ARGV_JSON (a JSON list
        of lists) in this process; prints the exit statuses as a JSON list
        on the last line of stdout.

    python tests/_train_worker.py multiworker WEIGHTS_NPZ ARG...
        Runs `keras-attention train ARG...` as one worker of the cluster in
        TF_CONFIG and saves the worker's final weights to WEIGHTS_NPZ.

    python tests/_train_worker.py jax DEVICES ARGV_JSON
        Runs Keras on JAX on DEVICES host (CPU) devices
        (`XLA_FLAGS=--xla_force_host_platform_device_count=DEVICES`, which
        JAX reads once, when it starts), then `keras-attention <argv>` for
        each argv list in ARGV_JSON in this process; prints
        `{"statuses": [...], "devices": <JAX's device count>}` as JSON on
        the last line of stdout.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _xla_flags import xla_flags  # noqa: E402  (beside this file)


def run_mirrored(argv_lists):
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu,
        [tf.config.LogicalDeviceConfiguration()] * 2,
    )
    from pipelines.cli import main

    statuses = [main(argv) for argv in argv_lists]
    print(json.dumps(statuses))


def run_multiworker(weights_path, args):
    import numpy as np

    from pipelines.flags import add_train_arguments
    from pipelines.flags import config_from_args
    from pipelines.train import train

    parser = add_train_arguments(argparse.ArgumentParser())
    config = config_from_args(parser.parse_args(args))
    metrics, model = train(config, return_model=True)
    np.savez(weights_path, *model.get_weights())
    print(json.dumps({"num_replicas": metrics["num_replicas"]}))


def run_jax(device_count, argv_lists):
    os.environ["KERAS_BACKEND"] = "jax"
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = xla_flags(
        os.environ.get("XLA_FLAGS"),
        f"--xla_force_host_platform_device_count={device_count}")
    from pipelines.cli import main

    import jax

    statuses = [main(argv) for argv in argv_lists]
    print(json.dumps({"statuses": statuses, "devices": len(jax.devices())}))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    mode = sys.argv[1]
    if mode == "mirrored":
        run_mirrored(json.loads(sys.argv[2]))
    elif mode == "multiworker":
        run_multiworker(sys.argv[2], sys.argv[3:])
    elif mode == "jax":
        run_jax(int(sys.argv[2]), json.loads(sys.argv[3]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
