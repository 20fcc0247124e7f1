"""The benchmark scripts as a user runs them: bad flags exit 2 with one error
line, bench_layer's smallest case prints its table, and gpu_check's smoke run
trains through the pipeline.

Each test starts the script in a subprocess (its imports take about 3 s).
TensorFlow's C++ start-up lines on stderr are not the script's; the tests
count only the lines the script writes (those starting with its name).
"""

import json
import os
import pathlib
import subprocess
import sys

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
    ("gpu_check.py", ["--peak-tflops", "-1"], "--peak-tflops"),
    ("gpu_check.py", ["--smoke", "--layers", "0"], "--layers"),
    ("gpu_layer_check.py", ["--backends", "jax,tpu"], "--backends"),
]


@pytest.mark.parametrize("script, argv, expected", BAD_FLAGS)
def test_bad_flags_exit_2_with_one_line(script, argv, expected):
    completed = _run(script, *argv)
    own = _own_lines(completed, script)
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert len(own) == 1 and own[0].startswith(f"{script}: error: "), own
    assert expected in own[0]
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
    assert [row[:4] for row in rows] == [
        ["8", "1", "off", "explicit"], ["8", "1", "off", "fused"]
    ]
    for row in rows:
        assert all(float(cell) > 0 for cell in row[4:])
    notes = [line for line in completed.stderr.splitlines()
             if line.startswith("# seq_len=8 heads=1 jit=off")]
    assert len(notes) == 2


def test_gpu_check_smoke_trains_and_reports():
    completed = _run("gpu_check.py", "--smoke", "--steps", "20",
                     "--warmup", "5", timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    out = completed.stdout
    assert "config: task reverse, seq_len 16, batch 16" in out
    assert "steady: " in out and "tokens/s" in out
    assert "held-out accuracy after 20 steps: " in out


def test_gpu_layer_check_smoke_measures_the_layer_under_jax(tmp_path):
    # The GPU check's CPU smoke mode, on the backend that has every path
    # here; its correctness rows compare each implementation with a float32
    # explicit layer of the same weights.
    output = tmp_path / "check.json"
    completed = _run("gpu_layer_check.py", "--smoke", "--backends", "jax",
                     "--output", str(output), timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(output.read_text())["backends"]["jax"]
    rows = result["correctness"]
    assert {(r["implementation"], r["dtype"], r["mask"]) for r in rows} == {
        (i, d, m) for i in ("explicit", "fused", "memory_efficient")
        for d in ("float32", "bfloat16") for m in ("padding", "causal")
    }
    assert all(r["ok"] for r in rows), rows
    float32 = [r["max_relative_error"] for r in rows if r["dtype"] == "float32"]
    assert max(float32) < 1e-4
    peers = {case["peer"] for case in result["speed"]}
    assert peers == {"ours_explicit", "ours_fused", "ours_memory_efficient",
                     "mha", "native"}
    assert all(case["ms"] > 0 for case in result["speed"])
    assert 0.0 <= result["fit"]["accuracy"] <= 1.0
    assert (tmp_path / "check.txt").read_text() in completed.stdout
