"""Training without TensorFlow: a child process in which `import tensorflow`
raises (a meta-path finder) trains a few steps on JAX through the command
line, and TensorBoard's own loader reads the event files it wrote.

So TensorFlow cannot creep back into the library or the pipelines' JAX
path: any module-level `import tensorflow` on that path fails the child.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import (
    EventAccumulator,
)
from tensorboard.util.tensor_util import make_ndarray

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = textwrap.dedent("""
    import importlib.abc
    import sys

    class BlockTensorFlow(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "tensorflow" or name.startswith("tensorflow."):
                raise ImportError(f"{name} is blocked in this test")
            return None

    sys.meta_path.insert(0, BlockTensorFlow())

    import keras_attention  # noqa: F401  the whole package, re-exports too
    from pipelines.cli import main

    status = main(sys.argv[1:])
    if status == 0:
        logdir = sys.argv[sys.argv.index("--logdir") + 1]
        # .keras needs no TensorFlow; a SavedModel does: one line, exit 2.
        # Beside the run: an export never writes among a run's files.
        assert main(["export", "--logdir", logdir, "--out",
                     logdir + "-exported.keras"]) == 0
        assert main(["export", "--logdir", logdir, "--out",
                     logdir + "-saved"]) == 2
    sys.exit(status)
""")


def test_jax_training_without_tensorflow_writes_readable_events(tmp_path):
    logdir = tmp_path / "run"
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, "train", "--backend", "jax",
         "--key-dim", "8", "--d-model", "16", "--batch-size", "8",
         "--heldout-size", "32", "--probe-size", "4", "--steps", "12",
         "--log-every", "4", "--eval-every", "6", "--diagnostics-every", "6",
         "--checkpoint-every", "6", "--quiet", "--logdir", str(logdir)],
        cwd=str(tmp_path), env=env, capture_output=True, text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    # Quiet but for the one line of the refused SavedModel export.
    assert child.stderr.strip().splitlines() == [
        "keras-attention export: error: --format saved_model needs "
        "TensorFlow, which is not installed (pip install tensorflow); "
        "--format keras exports without it"
    ], child.stderr[-3000:]
    assert (tmp_path / "run-exported.keras").is_file()
    assert not (tmp_path / "run-saved").exists()
    metrics = json.loads((logdir / "metrics.json").read_text())
    assert metrics["backend"] == "jax" and metrics["steps"] == 12
    assert json.loads((logdir / "config.json").read_text())["backend"] == "jax"

    # TensorBoard's own reader (this process may have TensorFlow; the
    # files were written without it). TF2-style summaries are tensors.
    def values(accumulator, tag):
        return {event.step: float(make_ndarray(event.tensor_proto))
                for event in accumulator.Tensors(tag)}

    train = EventAccumulator(str(logdir / "train"))
    train.Reload()
    losses = values(train, "loss")
    assert sorted(losses) == [4, 8, 12]
    assert all(np.isfinite(list(losses.values())))
    evaluation = EventAccumulator(str(logdir / "validation"),
                                  size_guidance={"tensors": 0})
    evaluation.Reload()
    held_out = values(evaluation, "accuracy")
    assert sorted(held_out) == [0, 6, 12]
    assert held_out[12] == pytest.approx(metrics["heldout_accuracy"],
                                         rel=1e-6)
    tags = evaluation.Tags()["tensors"]
    for tag in ("attention/attention_0/score_std",
                "gradients/attention_0/scores",
                "attention/attention_0/entropy_rows",
                "attention/attention_0/heatmap/head0"):
        assert tag in tags, (tag, sorted(tags))


_INSTALLED_CHILD = textwrap.dedent("""
    import sys

    from keras_attention.events import SummaryWriter
    from pipelines.builders import seed_run
    from pipelines.cli import main  # noqa: F401  every pipeline module
    from pipelines.tensorboard import read_event_scalars

    seed_run(0)  # Keras's own seeding imports TensorFlow when it can.
    with SummaryWriter(sys.argv[1]) as writer:
        writer.scalar("loss", 1.5, 3)
    assert read_event_scalars(sys.argv[1]) == {"loss": {3: 1.5}}
    loaded = sorted(name for name in sys.modules
                    if name.split(".")[0] == "tensorflow")
    assert not loaded, loaded[:5]
""")


def test_a_jax_process_leaves_an_installed_tensorflow_unimported(tmp_path):
    """With TensorFlow installed, the JAX path still never imports it: not
    through Keras's seeding (`pipelines.builders.seed_run`), nor through
    `tensorboard.compat` when events are written and read back."""
    pytest.importorskip("tensorflow")
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    child = subprocess.run(
        [sys.executable, "-c", _INSTALLED_CHILD, str(tmp_path / "events")],
        cwd=str(tmp_path), env=env, capture_output=True, text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr[-3000:]
