"""The benchmark scripts as a user runs them: bad flags exit 2 with one error
line, bench_layer's smallest case prints its table, and gpu_check.sh's smoke
run (bench_layer and bench_train on JAX among its stages) is checked against
facts of its own: the ratios recomputed from the times it printed, the run
directories' own files, the presets' arms, and child processes in which an
import of TensorFlow is recorded and refused.

Each test starts the script in a subprocess (its imports take about 3 s);
the bad flags run in one process per backend (see `_RUN_EACH`).
TensorFlow's C++ start-up lines on stderr are not the script's; the tests
count only the lines the script writes (those starting with its name).
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

SCRIPTS = pathlib.Path(__file__).resolve().parents[1] / "scripts"


def _run(script, *argv, timeout=120):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    return subprocess.run(
        [sys.executable, str(SCRIPTS / script), *argv], capture_output=True,
        text=True, timeout=timeout, env=env,
    )


def _own_lines(completed, script):
    return [line for line in completed.stderr.splitlines()
            if line.startswith(f"{script}: ")]


BAD_FLAGS = [
    ("bench_layer.py", ["--heads", "0"], "--heads"),
    ("bench_layer.py", ["--implementations", "explicit,nope"],
     "--implementations"),
    ("bench_layer.py", ["--clock", "sundial"], "--clock"),
    ("bench_memory.py", ["--seq-lens", "1024,x"], "--seq-lens"),
    ("bench_memory.py", ["--case", "explicit"], "--case needs --seq-len"),
    ("bench_train.py", ["--task", "nope"], "--task"),
    ("bench_export.py", ["--d-model", "30", "--heads", "4"], "--heads"),
    ("bench_train.py", ["--steps", "40", "--warmup", "40"], "--warmup"),
    ("bench_train.py", ["--steps", "20", "--warmup", "15"],
     "rounded up to a multiple of log_every"),
    ("bench_callback.py", ["--update-freq", "0"], "--update-freq"),
    ("gpu_check.py", ["plan"], "usage: gpu_check.py layer"),
    ("gpu_check.py", ["layer"], "usage: gpu_check.py layer"),
]


# Runs scripts one after another in one process, as `python SCRIPT ARGV...`
# would (`__main__`, its directory first on sys.path), and prints each one's
# exit status, stdout and stderr as JSON: one start of Python, Keras and the
# backend (about 6 s on 2 cores) for all the bad flags of the scripts that
# share a backend, in place of one per case.
_RUN_EACH = textwrap.dedent("""
    import contextlib, io, json, os, runpy, sys
    cases = json.loads(sys.argv[1])
    sys.path.insert(0, os.path.dirname(cases[0][0]))
    results = []
    for script, argv in cases:
        sys.argv = [script, *argv]
        out, err = io.StringIO(), io.StringIO()
        status = 0
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as exit:
                status = exit.code
        results.append([status, out.getvalue(), err.getvalue()])
    print(json.dumps(results))
""")


@pytest.fixture(scope="module")
def bad_flag_runs():
    """`{(script, argv): CompletedProcess-like}` of every BAD_FLAGS case,
    in one process for gpu_check.py (it sets the JAX backend before Keras
    is imported) and one for the others (TensorFlow)."""
    runs = {}
    for group in ([c for c in BAD_FLAGS if c[0] == "gpu_check.py"],
                  [c for c in BAD_FLAGS if c[0] != "gpu_check.py"]):
        cases = [[str(SCRIPTS / script), argv] for script, argv, _ in group]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                   KERAS_BACKEND="tensorflow")
        completed = subprocess.run(
            [sys.executable, "-c", _RUN_EACH, json.dumps(cases)],
            capture_output=True, text=True, timeout=300, env=env)
        assert completed.returncode == 0, completed.stderr[-3000:]
        results = json.loads(completed.stdout.strip().splitlines()[-1])
        for (script, argv, _), (status, out, err) in zip(group, results):
            runs[script, tuple(argv)] = subprocess.CompletedProcess(
                argv, status, out, err)
    return runs


@pytest.mark.parametrize("script, argv, expected", BAD_FLAGS)
def test_bad_flags_exit_2_with_one_line(script, argv, expected,
                                        bad_flag_runs):
    completed = bad_flag_runs[script, tuple(argv)]
    own = _own_lines(completed, script)
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert len(own) == 1 and own[0].startswith(f"{script}: error: "), own
    assert expected in own[0]
    assert completed.stdout == ""


def test_a_bad_flag_as_a_user_runs_it():
    """One bad flag through `python SCRIPT` itself: the exit status of the
    process and the one line on its stderr."""
    completed = _run("bench_layer.py", "--heads", "0")
    own = _own_lines(completed, "bench_layer.py")
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert len(own) == 1 and "--heads" in own[0], own
    assert completed.stdout == ""


def test_bench_layer_smallest_case_prints_the_table():
    completed = _run(
        "bench_layer.py", "--seq-lens", "8", "--heads", "1", "--batch", "1",
        "--width", "8", "--key-dim", "4", "--jit", "off", "--repeats", "1",
        "--warmup", "1", "--implementations", "explicit,fused",
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    lines = completed.stdout.splitlines()
    header = next(i for i, line in enumerate(lines)
                  if line.split()[:4] == ["seq_len", "heads", "jit", "impl"])
    rows = [line.split() for line in lines[header + 2:]]
    assert [row[:5] for row in rows] == [
        ["8", "1", "off", "explicit", "none"], ["8", "1", "off", "fused",
                                                "none"]
    ]
    for row in rows:
        assert all(float(cell) > 0 for cell in row[5:])
    notes = [line for line in completed.stderr.splitlines()
             if line.startswith("# seq_len=8 heads=1 jit=off")]
    assert len(notes) == 2


# --------------------------------------------------------------- gpu_check
# Every Python process of the check (its stages, the keras-attention
# commands and their workers) starts with this on its path: an import of
# TensorFlow is written down and refused, even one that the code would
# survive (the GPU machine has no TensorFlow). A probe that only looks
# for it (`importlib.util.find_spec`, as torch._dynamo does for its list
# of modules) is not an import: it is left alone.
_SITECUSTOMIZE = textwrap.dedent("""
    import importlib.abc
    import os
    import sys

    def importing():
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_filename == "<frozen importlib.util>":
                return False  # a probe, maybe within an import
            if frame.f_code.co_name == "_find_and_load":
                return True
            frame = frame.f_back
        return False

    class BlockTensorFlow(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if ((name == "tensorflow" or name.startswith("tensorflow."))
                    and importing()):
                with open(os.environ["TENSORFLOW_IMPORTS"], "a") as log:
                    log.write(f"{os.getpid()} {name}\\n")
                raise ImportError(f"{name} is blocked in this test")
            return None

    sys.meta_path.insert(0, BlockTensorFlow())
""")


def _gpu_check(tmp_path, *argv, timeout=900):
    """`bash scripts/gpu_check.sh --smoke ARGV`: its JSON, the tables, its
    log, the results folder and the runs folder."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    env = dict(os.environ, TENSORFLOW_IMPORTS=str(tmp_path / "tf.log"),
               PYTHONPATH=str(site))
    env.pop("KERAS_BACKEND", None)
    out, runs = tmp_path / "out", tmp_path / "runs"
    completed = subprocess.run(
        ["bash", str(SCRIPTS / "gpu_check.sh"), "--smoke", "--out", str(out),
         "--logdir", str(runs), *argv],
        capture_output=True, text=True, timeout=timeout, env=env)
    assert completed.returncode == 0, (completed.stdout[-3000:]
                                       + completed.stderr[-3000:])
    tf_log = tmp_path / "tf.log"
    assert not tf_log.exists(), tf_log.read_text()[:2000]
    document = json.loads((out / "gpu_check.json").read_text())
    tables = (out / "gpu_check.txt").read_text()
    log = (out / "gpu_check.log").read_text()
    # The printed tables are the saved ones, and the log is the output.
    assert tables in completed.stdout and tables in log
    return document, tables, out, runs


def _stages(document, names):
    stages = document["stages"]
    assert [stage["name"] for stage in stages] == names
    for stage in stages:
        assert stage["outcome"] == "done" and stage["exit"] == 0, stage
        assert 0 <= stage["seconds"] <= stage["limit_s"] + 15


def test_gpu_check_smoke_layer_and_benchmarks(tmp_path):
    stages = ["layer", "bench_layer", "callback", "torch-train",
              "deterministic"]
    document, tables, out, runs = _gpu_check(
        tmp_path, "--stages", ",".join(stages))
    _stages(document, stages)

    # The layer: every path, policy, matmul precision and mask against
    # float32 explicit.
    layer = document["layer"]
    paths = ("explicit", "fused", "memory_efficient", "explicit_weights")
    kinds = (("float32", "default"), ("float32", "highest"),
             ("mixed_bfloat16", "default"))
    cases = layer["cases"]
    assert sorted((c["path"], c["dtype"], c["precision"], c["mask"])
                  for c in cases) == sorted(
        (p, d, precision, m) for p in paths for d, precision in kinds
        for m in ("padding", "causal"))
    assert layer["seq_len"] % 512 != 0  # ragged memory-efficient blocks
    for case in cases:
        assert case["ok"] and np.isfinite(case["error"]), case
        if case["dtype"] == "float32":
            assert case["error"] < 1e-5, case
        else:  # bf16 really ran: its rounding shows, within the tolerance
            assert 1e-4 < case["error"] <= case["tolerance"], case
    assert "layer at T" in tables and " FAIL" not in tables

    # bench_layer on JAX: every implementation timed, with and without a
    # causal mask; the ratios are the times' (to the printed 2 decimals),
    # auto's against fused's too.
    rows = document["bench_layer"]
    implementations = ("auto", "explicit", "fused", "memory_efficient")
    assert [(r["impl"], r["mask"], r["jit"]) for r in rows] == [
        (impl, mask, "on") for mask in ("none", "causal")
        for impl in implementations]
    for row in rows:
        for peer in ("ours", "MHA", "dpa"):
            assert np.isfinite(row[f"{peer} ms"]) and row[f"{peer} ms"] > 0
        assert row["torch ms"] is None  # no torch peer on JAX
        for peer in ("MHA", "dpa"):
            assert row[f"ours/{peer}"] == pytest.approx(
                row["ours ms"] / row[f"{peer} ms"], rel=0.05, abs=0.01)
    ms = {(r["impl"], r["mask"]): r["ours ms"] for r in rows}
    assert [(r["mask"], r["ratio"]) for r in document["auto_vs_fused"]] == [
        (mask, pytest.approx(ms["auto", mask] / ms["fused", mask]))
        for mask in ("none", "causal")]
    assert "seq_len  heads  jit" in tables and "auto / fused" in tables

    # The monitor's cost: ratios of fit with it over fit without.
    callback = document["callback"]
    assert 0.5 < callback["wall_ratio"] < 5, callback
    assert 0.5 < callback["cpu_ratio"] < 5, callback
    assert 0 < callback["hooks_share"] < 1, callback
    # torch trained its steps, read from its own metrics.json.
    metrics = json.loads((runs / "torch-train" / "metrics.json").read_text())
    assert document["torch_train"]["steps"] == metrics["steps"] == 8
    assert document["torch_train"]["heldout_accuracy"] == metrics[
        "heldout_accuracy"]
    # Two deterministic runs identical, and the cost of determinism.
    deterministic = document["deterministic"]
    assert deterministic["identical"] is True
    assert deterministic["cost"] > 0
    assert {run["exit"] for run in deterministic["runs"].values()} == {0}
    assert "two runs identical: True" in tables
    # No grid ran: none reports.
    assert all(grid == dict(runs_finished=0, report=None, verdicts=[])
               for grid in document["grids"].values())
    assert sorted(os.listdir(out)) == ["gpu_check.json", "gpu_check.log",
                                       "gpu_check.txt"]


def test_gpu_check_refuses_a_bad_argument_and_a_cpu(tmp_path):
    for argv, expected in ((["--budget-s", "1"], "unknown argument"),
                           (["--out", str(tmp_path / "out")],
                            "JAX sees no GPU")):
        completed = subprocess.run(
            ["bash", str(SCRIPTS / "gpu_check.sh"), *argv],
            capture_output=True, text=True, timeout=120,
            # JAX on the CPU whatever the machine has: the refusal is the
            # point, not this machine's lack of a GPU.
            env=dict(os.environ, JAX_PLATFORMS="cpu"))
        own = _own_lines(completed, "gpu_check.sh")
        assert completed.returncode == 2, completed.stderr[-2000:]
        assert len(own) == 1 and expected in own[0], own
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_gpu_check_smoke_whole_command(tmp_path):
    from pipelines.engine.presets import COMPARE_PRESETS

    stages = ["layer", "bench_layer", "bench_train", "main-job",
              "callback", "torch-train", "deterministic", "compare-full",
              "sweep"]
    document, tables, out, runs = _gpu_check(
        tmp_path, "--stages", ",".join(stages), timeout=3000)
    _stages(document, stages)
    # One seed at d_k 8: the default preset's arms, every arm of the full
    # preset (its own list, read from the presets), one sweep rate.
    expected = {"main-job": len(COMPARE_PRESETS["default"].arms),
                "compare-full": len(COMPARE_PRESETS["full"].arms),
                "sweep": 2}
    for name, report, copied in (
            ("main-job", "comparison.md", "comparison-main-job.md"),
            ("compare-full", "comparison.md", "comparison-full.md"),
            ("sweep", "sweep.md", "sweep.md")):
        grid = document["grids"][name]
        finished = list((runs / name).glob("*/metrics.json"))
        assert grid["runs_finished"] == len(finished) == expected[name]
        assert grid["report"] == copied
        assert (out / copied).read_text() == (runs / name / report
                                              ).read_text()
    for name in ("main-job", "compare-full"):
        assert [line.split(" (")[0] for line in
                document["grids"][name]["verdicts"]] == [
            "Claim 1", "Claim 2", "Claim 3"]
    verdicts = document["grids"]["sweep"]["verdicts"]
    assert verdicts and all(re.match(r"^\w+, d_k 8: ", line)
                            for line in verdicts)
    arms = {path.parent.name.split("-dk")[0]
            for path in (runs / "compare-full").glob("*/metrics.json")}
    assert arms == set(COMPARE_PRESETS["full"].arms)
    assert "compare-full: Claim 1" in tables

    # bench_train on JAX: the trainer and fit train one model (the same
    # weights after the same steps; diagnostics change nothing), and its
    # ratios are those of the times it printed, within each round.
    train = document["bench_train"]
    # The trainer is `fit` at the steps dividing its intervals (10 here).
    per_call = {"ours": 10, "fit, 1 step/call": 1, "fit, 10 steps/call": 10,
                "fit, 10 steps/call, scanned": 10, "ours + diagnostics": 10}
    assert train["steps_per_call"] == per_call
    assert train["timed_steps"] == 10  # --steps 20, --warmup 5 rounded up
    for name in per_call:
        for clock in ("wall", "cpu"):
            times = train[f"{clock}_ms_per_step"]
            assert len(times[name]) == 1  # one round
            assert np.isfinite(times[name][0]) and times[name][0] > 0
            assert train["vs_ours"][clock][name] == pytest.approx(
                [times["ours"][0] / times[name][0]])
        assert train["start_s"][name][0] > 0
    assert train["weights_vs_ours"]["ours + diagnostics"] == [0.0]
    for name in ("fit, 1 step/call", "fit, 10 steps/call",
                 "fit, 10 steps/call, scanned"):
        assert 0 <= train["weights_vs_ours"][name][0] < 1e-5
    assert train["fit_vs_ours"] == pytest.approx(
        train["vs_ours"]["wall"]["fit, 10 steps/call"][0])
    assert 0 < train["diagnostics_overhead"] < 1
    assert train["diagnostics_call_s"] and all(
        s > 0 for s in train["diagnostics_call_s"])
    for title in ("trainer", "task.batches alone",
                  "diagnostics (every 20 steps)",
                  "goal fit, 10 steps/call >= 0.95x ours"):
        assert title in tables
