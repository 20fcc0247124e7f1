"""Fixtures shared by the test modules."""

import atexit
import contextlib
import gc
import io
import json
import os
import shutil
import tempfile
from typing import NamedTuple

from _xla_flags import xla_flags

# As the command line does before it imports Keras: importing Keras imports
# JAX when it is installed, which sets TF_CPP_MIN_LOG_LEVEL=1 when unset, and
# the commands these tests start inherit it (TensorFlow's C++ warnings would
# then reach stderr beside the commands' own lines).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# XLA (JAX's, and TensorFlow's with jit_compile) compiles every new shape of
# the tests' tiny programs, and LLVM's optimisation of that code is most of
# the cost: without it the JAX child run took 125 CPU-s against 185. The
# programs are the same (XLA's own passes run at every level); only the last
# bits of some float32 results move, as with another thread count (a 60-step
# run's weights, on JAX and on TensorFlow with XLA: up to 3e-7 relative).
# Every test compares within one setting or within a tolerance. Set here,
# before Keras is imported, it reaches every command the tests start.
NO_LLVM_OPTIMISATION = "--xla_backend_optimization_level=0"
# One thread per kernel in every process of the run. The default run keeps
# two pytest workers, the JAX and torch child runs and the commands they
# start (often five processes) on 2 cores, and each process's thread pools
# were sized for both cores: their threads spin while waiting for a core
# the other processes hold. Measured on the whole run, back to back on 2
# idle cores (2026-12-03, with the collector's freeze below): 7 min 56 s
# and 900 CPU-s without, 7 min 12 s and 814 CPU-s with; the torch child
# run (OpenMP) took 19-20 CPU-s with it and 33.6 without. Every process the
# tests start inherits the setting, the pipelines' `--jobs` workers too, so
# the results a test compares come from one setting.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1",
              "TF_NUM_INTEROP_THREADS": "1"}
for _name, _value in ONE_THREAD.items():
    os.environ.setdefault(_name, _value)
os.environ["XLA_FLAGS"] = xla_flags(
    os.environ.get("XLA_FLAGS"), NO_LLVM_OPTIMISATION,
    "--xla_cpu_multi_thread_eigen=false", keep=True)

# The JAX commands the tests start (kill and resume, export, the runs
# without TensorFlow, the GPU check's smoke, the JAX child run) compile the
# same tiny steps again and again. One compilation cache for the whole run,
# made here by the first process (pytest-xdist's workers and the commands
# inherit it) and removed at its exit, saved 88 of 969 CPU-s. A cache entry
# that cannot be read or written (a command killed mid-write, a write limit
# under test) only means compiling again, so JAX's warning about it is
# silenced: it must not reach the stderr the tests read.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="keras-attention-tests-jax-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ.update({
        "JAX_COMPILATION_CACHE_DIR": _cache,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
        "PYTHONWARNINGS": ",".join(filter(None, [
            os.environ.get("PYTHONWARNINGS"),
            "ignore:Error reading persistent compilation cache entry",
            "ignore:Error writing persistent compilation cache entry"])),
    })

import pytest  # noqa: E402

from _backends import MARKED_MODULES  # noqa: E402
from _backends import OTHER_BACKENDS  # noqa: E402
from pipelines import cli  # noqa: E402
from pipelines.settings import Layer  # noqa: E402
from pipelines.settings import flag  # noqa: E402
from pipelines.settings import resolve_config  # noqa: E402

# Task settings that make a run take seconds on a 2-core CPU.
TINY_TASKS = {
    "recall": dict(num_pairs=4, num_keys=8, num_values=4, d_model=16,
                   key_dim=16),
    "reverse": dict(seq_len=6, vocab_size=8, d_model=16, key_dim=8),
}
TINY_LOOP = dict(batch_size=16, heldout_size=64, probe_size=8, verbose=0,
                 strategy="default")


def make_tiny_config(task="recall", **settings):
    """A resolved `TrainConfig` of a tiny, fast run of `task` ("recall" or
    "reverse"); `settings` are given on top (as a `tests` layer)."""
    values = {"task": task, **TINY_TASKS[task], **TINY_LOOP, **settings}
    return resolve_config([Layer("tests", values)])


def train_tiny(tmp_path, **settings):
    """`keras-attention train --quiet` of a 2-step tiny recall run in
    `tmp_path/run`, `settings` given as flags (a bool as a switch):
    `(exit status, non-blank stderr lines)`."""
    values = {"task": "recall", **TINY_TASKS["recall"],
              **{k: v for k, v in TINY_LOOP.items() if k != "verbose"},
              "steps": 2, "logdir": str(tmp_path / "run"), **settings}
    argv = ["train", "--quiet"]
    for name, value in values.items():
        if isinstance(value, bool):  # a switch: --name or --no-name
            argv.append(flag(name) if value
                        else flag(name).replace("--", "--no-", 1))
        else:
            argv += [flag(name), repr(value) if isinstance(value, float)
                     else str(value)]
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        status = cli.main(argv)
    return status, [line for line in stderr.getvalue().splitlines()
                    if line.strip()]


@pytest.fixture
def spy(monkeypatch):
    """`spy(module, name)`: `module.name` wrapped for this test so each
    call's keyword arguments are recorded; returns the list of them."""

    def watch(module, name):
        calls, original = [], getattr(module, name)

        def recorded(*args, **kwargs):
            calls.append(kwargs)
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, recorded)
        return calls

    return watch


@pytest.fixture(scope="session")
def tiny_config():
    """`tiny_config(task="recall", **settings)`: a resolved config of a tiny
    run (see `make_tiny_config`)."""
    return make_tiny_config


# --------------------------------------------------- the tiny comparison
# One comparison serves tests/test_compare.py and tests/test_compare_figures.py
# (both in xdist group "compare", so one worker builds it once): scaled vs
# unscaled, d_k 4 measured at init only and 16 trained, 2 seeds of 20
# steps. Held-out evaluation every 5 steps gives the curves points between
# the diagnostics (every 10); a checkpoint every 10 steps.
TINY_COMPARISON_FLAGS = (
    "--arms", "scaled,unscaled",
    "--key-dims", "4,16",
    "--train-key-dims", "16",
    "--seeds", "2",
    "--steps", "20",
    "--d-model", "16",
    "--num-pairs", "4",
    "--num-keys", "8",
    "--num-values", "4",
    "--eval-every", "5",
    "--diagnostics-every", "10",
    "--checkpoint-every", "10",
    "--heldout-size", "64",
    "--probe-size", "8",
    "--variance-samples", "2000",
    "--jit-compile", "off",  # compiling would cost more than 20 steps
)


class TinyComparison(NamedTuple):
    """What `tiny_comparison` made: its log directory (read only: a test
    that writes there works on a copy), the command's stdout, the
    comparison.json document and the flags it was made with (a list, for
    a test to run the command again)."""

    logdir: str
    stdout: str
    document: dict
    flags: list


@pytest.fixture(scope="session")
def tiny_comparison(tmp_path_factory):
    """Runs `keras-attention compare` with `TINY_COMPARISON_FLAGS` once per
    test run; a `TinyComparison`."""
    logdir = str(tmp_path_factory.mktemp("compare") / "runs")
    # capsys is function-scoped; a session fixture captures by hand.
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli.main(["compare", *TINY_COMPARISON_FLAGS,
                           "--logdir", logdir])
    assert status == 0
    with open(os.path.join(logdir, "comparison.json")) as handle:
        document = json.load(handle)
    return TinyComparison(logdir, out.getvalue(), document,
                          list(TINY_COMPARISON_FLAGS))


# ------------------------------------------------- the other backends' runs
# `@pytest.mark.backends("jax", "torch")` on a test (or `pytestmark` on a
# module) says the test must also pass under those Keras backends;
# `cases=[...]` limits it to those parametrized cases (their ids). Below,
# each such case gets the marker of each backend it names, so that
# `tests/test_backends.py::test_marked_cases_pass_under` runs `-m jax` and
# `-m torch` in one child pytest per backend.


@pytest.hookimpl(tryfirst=True)  # before `-m`/`-k` deselect anything
def pytest_collection_modifyitems(config, items):
    _group_by_module(items)
    modules = {backend: set() for backend in OTHER_BACKENDS}
    wanted, found = {}, {}
    for item in items:
        case = getattr(getattr(item, "callspec", None), "id", None)
        test = item.nodeid.split("[")[0]
        for mark in item.iter_markers("backends"):
            unknown = set(mark.args) - set(OTHER_BACKENDS)
            if unknown:
                raise pytest.UsageError(
                    f"{test}: backends() takes {OTHER_BACKENDS}, not "
                    f"{sorted(unknown)}")
            cases = mark.kwargs.get("cases")
            if cases is not None:
                key = (test, tuple(cases))
                wanted[key] = set(cases)
                if case not in cases:
                    continue
                found.setdefault(key, set()).add(case)
            for backend in mark.args:
                item.add_marker(backend)
                modules[backend].add(item.path.name)
    # A case id that names no case is a typo that would silently drop the
    # case from the other backends' runs; checked when whole modules are
    # collected (a node id on the command line collects only some cases).
    if not any("::" in str(arg) for arg in config.args):
        for (test, _), cases in wanted.items():
            missing = cases - found.get((test, _), set())
            if missing:
                raise pytest.UsageError(
                    f"{test}: backends(cases=...) names no case "
                    f"{sorted(missing)}")
    config.stash[MARKED_MODULES] = {
        backend: sorted(names) for backend, names in modules.items()}


# ------------------------------------------------------ the collector
@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """What is imported by the end of collection (TensorFlow, Keras, JAX,
    the test modules) lives for the whole run: frozen, it is left out of
    every later garbage collection, Keras's `clear_session()` between runs
    included. Measured on six pipeline modules in one process: the full
    (generation 2) collections took 5.9 CPU-s instead of 10.5, of about
    140 CPU-s in all."""
    gc.freeze()


# ------------------------------------------------ two worker processes
# The default run is `-n 2 --dist loadgroup` (pyproject.toml): two pytest
# workers, each taking whole groups. A test's group is its module unless it
# names one with `@pytest.mark.xdist_group(...)` (the modules sharing a
# session fixture name the same group, so one worker builds it once); whole
# modules keep their module fixtures built once. Runs before xdist's own
# hook reads the marks (tryfirst, above).


def _group_by_module(items):
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
