"""Running tests on every Keras backend.

The Keras backend is fixed when Keras is imported, so the cases that must
also pass on JAX or torch carry `@pytest.mark.backends("jax", "torch")`
(`cases=[...]` for some parametrized cases only; tests/conftest.py turns it
into the `jax` and `torch` markers) and run in one child pytest per backend
(`start_pytest_under(backend, modules, markers=backend)`), both started at
once from the default (TensorFlow) run by tests/test_backends.py.
`gradients_of` and `layer_gradients` differentiate on whichever backend is active, so one test body serves all
three.
"""

import importlib.util
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from keras import ops

from _xla_flags import xla_flags

BACKEND = keras.backend.backend()
BACKENDS = ("tensorflow", "jax", "torch")
# The backends a case can be marked to run under as well (see conftest.py).
OTHER_BACKENDS = ("jax", "torch")
# Per backend, the file names of the collected modules holding such cases.
MARKED_MODULES = pytest.StashKey[dict]()
# Set in the child runs, so they do not start children of their own.
INNER_VARIABLE = "KERAS_ATTENTION_INNER"
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)

# Marks the tests that start the child runs: once, from the default backend.
from_outer_run = pytest.mark.skipif(
    BACKEND != "tensorflow" or os.environ.get(INNER_VARIABLE) == "1",
    reason="starts the other backends' runs once, from the default backend",
)


def marked_modules(config, backend):
    """The file names (in tests/) of this run's collected modules that hold
    a case marked to run under `backend` as well."""
    return config.stash.get(MARKED_MODULES, {}).get(backend, [])


def start_pytest_under(backend, modules, *, markers=None):
    """Starts `modules` (file names in tests/) under KERAS_BACKEND=`backend`
    in a child pytest, the cases matching `-m markers` when given (every
    case, slow ones included, when not); `finish_pytest` waits for it.
    Returns None when `backend` is not installed."""
    if importlib.util.find_spec(backend) is None:
        return None
    env = {
        **os.environ,
        "KERAS_BACKEND": backend,
        INNER_VARIABLE: "1",
        "JAX_PLATFORMS": "cpu",
        # Two host devices: the data-parallel cases (a distributed fit in
        # test_callbacks.py) run over both; runs with the default strategy
        # still use one.
        # The other XLA flags (tests/conftest.py's) are kept.
        **({"XLA_FLAGS": xla_flags(
            os.environ.get("XLA_FLAGS"),
            "--xla_force_host_platform_device_count=2")}
           if backend == "jax" else {}),
        "PYTHONPATH": os.pathsep.join(
            filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])
        ),
    }
    command = [
        sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
        # One process, when pytest-xdist is there to run a parallel one:
        # the child is itself a case of the parent's run.
        *(["-n", "0"] if importlib.util.find_spec("xdist") else []),
        # The child runs exactly what it is given, slow cases included.
        "-m", markers or "slow or not slow",
        # Five slowest, not the 25 of addopts: the output kept on a failure
        # is its end.
        "--durations=5",
        "-W", "ignore::DeprecationWarning",
        *(os.path.join(TESTS_DIR, module) for module in modules),
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            cwd=REPO_ROOT)


def finish_pytest(backend, child, timeout=1800):
    """Waits for a child pytest of `start_pytest_under` and fails with its
    output unless every selected case passed (skips when `child` is None).

    Returns:
        The child's summary line, e.g. "52 passed in 12.3s".
    """
    if child is None:
        pytest.skip(f"{backend} is not installed")
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        stdout, stderr = child.communicate()
    output = stdout[-6000:] + stderr[-2000:]
    assert child.returncode == 0, output
    summary = stdout.strip().splitlines()[-1]
    assert " passed" in summary, output
    return summary


def run_pytest_under(backend, modules, *, markers=None, timeout=1800):
    """`start_pytest_under` and `finish_pytest` in one."""
    return finish_pytest(
        backend, start_pytest_under(backend, modules, markers=markers),
        timeout)


def to_np(x):
    return np.asarray(ops.convert_to_numpy(x))


def skip_without_float64():
    """Skips the test where Keras computes float64 in float32: on jax
    without JAX_ENABLE_X64, and on torch, whose `keras.ops.matmul` follows
    Keras's promotion rules (64-bit to 32-bit outside TensorFlow)."""
    if BACKEND == "torch":
        pytest.skip("keras.ops.matmul runs float64 in float32 on torch")
    if BACKEND == "jax":
        import jax

        if not jax.config.jax_enable_x64:
            pytest.skip("float64 needs JAX_ENABLE_X64 on the jax backend")


def gradients_of(fn, args):
    """Gradients of the scalar `fn(*args)` w.r.t. every array in `args`."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        args = [tf.convert_to_tensor(a) for a in args]
        with tf.GradientTape() as tape:
            tape.watch(args)
            loss = fn(*args)
        return [to_np(g) for g in tape.gradient(loss, args)]
    if BACKEND == "jax":
        import jax

        grads = jax.grad(fn, argnums=tuple(range(len(args))))(*args)
        return [np.asarray(g) for g in grads]
    import torch

    args = [
        ops.convert_to_tensor(a).detach().clone().requires_grad_(True)
        for a in args
    ]
    grads = torch.autograd.grad(fn(*args), args)
    return [to_np(g) for g in grads]


def layer_gradients(layer, inputs, loss_fn, **call_kwargs):
    """`(loss, gradients)` of `loss_fn(layer(*inputs, **call_kwargs))`
    w.r.t. the layer's trainable weights, in their order."""
    if not layer.built:
        layer(*inputs, **call_kwargs)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = loss_fn(layer(*inputs, **call_kwargs))
        grads = tape.gradient(loss, layer.trainable_weights)
        return to_np(loss), [to_np(g) for g in grads]
    if BACKEND == "jax":
        import jax

        trainable = [v.value for v in layer.trainable_weights]
        non_trainable = [v.value for v in layer.non_trainable_weights]

        def f(values):
            out, _ = layer.stateless_call(
                values, non_trainable, *inputs, **call_kwargs
            )
            return loss_fn(out)

        loss, grads = jax.value_and_grad(f)(trainable)
        return np.asarray(loss), [np.asarray(g) for g in grads]
    import torch

    loss = loss_fn(layer(*inputs, **call_kwargs))
    grads = torch.autograd.grad(
        loss, [v.value for v in layer.trainable_weights]
    )
    return to_np(loss), [to_np(g) for g in grads]
