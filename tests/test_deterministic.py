"""`--deterministic`: repeatable runs on every backend.

Two runs with it must write the same `metrics.json` but for the clocks
(TensorFlow here, JAX and torch in their child runs); the environment the
command line sets for JAX's and torch's GPU kernels; and the refusal, in
one line, of a deterministic JAX run on a GPU whose XLA started without
them (a faked GPU).
"""

import json

import keras
import pytest

from tests.conftest import train_tiny
from pipelines.backends import XLA_DETERMINISTIC
from pipelines.backends import set_deterministic_environment
from pipelines.run_dir import without_clocks

BACKEND = keras.backend.backend()


# 20 steps, evaluated every 5 and probed every 10: enough to tell runs apart.
RUN = dict(steps=20, eval_every=5, diagnostics_every=10)


@pytest.mark.backends("jax", "torch")
def test_two_deterministic_runs_write_the_same_metrics(tmp_path):
    metrics = []
    for name in ("first", "second"):
        status, err = train_tiny(tmp_path / name, deterministic=True, **RUN)
        assert status == 0, err
        run = tmp_path / name / "run"
        config = json.loads((run / "config.json").read_text())
        assert config["deterministic"] is True
        metrics.append(json.loads((run / "metrics.json").read_text()))
    first, second = map(without_clocks, metrics)
    # Not vacuous: the runs trained and were measured.
    assert len(first["eval_history"]) == 5  # steps 0, 5, ..., 20
    assert first["diagnostics"]["final"]["summary"]
    assert first == second


def test_the_command_line_sets_what_jax_and_torch_read_at_start():
    environ = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    set_deterministic_environment(["train", "--steps", "3"], environ)
    assert environ == {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    for _ in range(2):  # once only
        set_deterministic_environment(["train", "--deterministic"], environ)
    assert environ["XLA_FLAGS"].split() == [
        "--xla_force_host_platform_device_count=2", XLA_DETERMINISTIC]
    assert environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


@pytest.mark.backends("jax")
def test_jax_on_a_gpu_started_without_the_flag_is_refused(
        tmp_path, monkeypatch):
    if BACKEND != "jax":
        pytest.skip("JAX's devices")
    import jax

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setenv("XLA_FLAGS", "")
    status, err = train_tiny(tmp_path, deterministic=True, **RUN)
    assert status == 2
    assert len(err) == 1 and "--deterministic" in err[0], err
    assert XLA_DETERMINISTIC in err[0]
