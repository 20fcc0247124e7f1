"""The benchmark scripts as a user runs them: bad flags exit 2 with one error
line, bench_layer's smallest case prints its table, and gpu_check's smoke run
is checked against facts of its own: a numpy attention written here, the
run directories' own files, and a child process in which an import of
TensorFlow is recorded and refused.

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
    ("bench_callback.py", ["--update-freq", "0"], "--update-freq"),
    ("gpu_check.py", ["--stages", "layer,tpu"], "--stages"),
    ("gpu_check.py", ["--smoke", "--budget-s", "0"], "--budget-s"),
    ("gpu_check.py", [], "JAX sees no GPU"),  # this machine has none
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
    assert [row[:4] for row in rows] == [
        ["8", "1", "off", "explicit"], ["8", "1", "off", "fused"]
    ]
    for row in rows:
        assert all(float(cell) > 0 for cell in row[4:])
    notes = [line for line in completed.stderr.splitlines()
             if line.startswith("# seq_len=8 heads=1 jit=off")]
    assert len(notes) == 2



# --------------------------------------------------------------- gpu_check
# Every Python process of the check (the check, its layer worker, the
# keras-attention commands and their workers) starts with this on its path:
# an import of TensorFlow is written down and refused, even one that the
# code would survive (the GPU machine has no TensorFlow).
_SITECUSTOMIZE = textwrap.dedent("""
    import importlib.abc
    import os
    import sys

    class BlockTensorFlow(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "tensorflow" or name.startswith("tensorflow."):
                with open(os.environ["TENSORFLOW_IMPORTS"], "a") as log:
                    log.write(f"{os.getpid()} {name}\\n")
                raise ImportError(f"{name} is blocked in this test")
            return None

    sys.meta_path.insert(0, BlockTensorFlow())
""")


def _gpu_check(tmp_path, *argv, timeout=600):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    env = dict(os.environ, TENSORFLOW_IMPORTS=str(tmp_path / "tf.log"),
               PYTHONPATH=os.pathsep.join(
                   [str(site), str(SCRIPTS.parent)]
                   + [p for p in os.environ.get("PYTHONPATH", "").split(
                       os.pathsep) if p]))
    env.pop("KERAS_BACKEND", None)
    out, runs = tmp_path / "out", tmp_path / "runs"
    completed = subprocess.run(
        [sys.executable, str(SCRIPTS / "gpu_check.py"), "--smoke", "--out",
         str(out), "--logdir", str(runs), *argv],
        capture_output=True, text=True, timeout=timeout, env=env)
    assert completed.returncode == 0, (completed.stdout[-3000:]
                                       + completed.stderr[-3000:])
    tf_log = tmp_path / "tf.log"
    assert not tf_log.exists(), tf_log.read_text()[:2000]
    document = json.loads((out / "gpu_check.json").read_text())
    # The printed tables are the saved ones.
    assert (out / "gpu_check.txt").read_text() in completed.stdout
    return document, out, runs


def _attention_reference(x, weights, allowed, cotangent):
    """Self-attention with Q, K, V and output projections in float64 numpy,
    and the gradients of sum(output * cotangent) by hand: the output, the
    input gradient and the kernels' gradients."""
    wq, wk, wv, wo = (np.asarray(w, np.float64) for w in weights)
    x = np.asarray(x, np.float64)
    q, k, v = (np.einsum("btd,dhk->bthk", x, w) for w in (wq, wk, wv))
    scale = 1.0 / np.sqrt(wq.shape[-1])
    allowed = allowed[:, None]  # (B, 1, T, S)
    scores = np.where(allowed, np.einsum("bthk,bshk->bhts", q, k) * scale,
                      -np.inf)
    top = np.max(scores, axis=-1, keepdims=True)
    exp = np.where(allowed, np.exp(scores - np.where(np.isfinite(top), top,
                                                     0.0)), 0.0)
    total = exp.sum(-1, keepdims=True)
    # A row that may attend nowhere outputs zeros.
    p = np.where(total > 0, exp / np.where(total > 0, total, 1.0), 0.0)
    attended = np.einsum("bhts,bshk->bthk", p, v)
    out = np.einsum("bthk,hko->bto", attended, wo)
    g = np.asarray(cotangent, np.float64)
    d_wo = np.einsum("bthk,bto->hko", attended, g)
    d_attended = np.einsum("bto,hko->bthk", g, wo)
    d_p = np.einsum("bthk,bshk->bhts", d_attended, v)
    d_v = np.einsum("bhts,bthk->bshk", p, d_attended)
    d_scores = p * (d_p - np.sum(d_p * p, axis=-1, keepdims=True))
    d_q = np.einsum("bhts,bshk->bthk", d_scores, k) * scale
    d_k = np.einsum("bhts,bthk->bshk", d_scores, q) * scale
    d_x = sum(np.einsum("bthk,dhk->btd", d, w)
              for d, w in ((d_q, wq), (d_k, wk), (d_v, wv)))
    d_w = [np.einsum("btd,bthk->dhk", x, d) for d in (d_q, d_k, d_v)]
    return [out, d_x, *d_w, d_wo]


def test_gpu_check_smoke_layer_and_training(tmp_path):
    # A budget no stage reaches on a busy machine: every case runs.
    document, out, runs = _gpu_check(
        tmp_path, "--stages", "layer,train", "--budget-s", "3000",
        "--arrays", str(tmp_path / "cases.npz"))
    layer = document["stages"]["layer"]
    assert layer["status"] == "done" and layer["tensorflow_modules"] == []

    # Correctness: every path, dtype and mask, against numpy here.
    rows = layer["correctness"]
    paths = ("explicit", "explicit_weights", "fused", "memory_efficient")
    assert {(r["path"], r["dtype"], r["mask"]) for r in rows} == {
        (p, d, m) for p in paths for d in ("float32", "bfloat16")
        for m in ("padding", "causal")}
    cases = np.load(tmp_path / "cases.npz")
    x, cotangent, valid = cases["x"], cases["cotangent"], cases["valid"]
    length = x.shape[1]
    assert length % 512 != 0  # ragged memory-efficient blocks
    allowed = {
        "padding": valid[:, :, None] & valid[:, None, :],
        "causal": np.broadcast_to(np.tril(np.ones((length, length), bool)),
                                  (x.shape[0], length, length)),
    }
    for mask, mask_allowed in allowed.items():
        names = [str(cases[f"{mask}/weight_name/{i}"]) for i in range(4)]
        assert names == ["query_kernel", "key_kernel", "value_kernel",
                         "output_kernel"]
        want = _attention_reference(
            x, [cases[f"{mask}/weight/{i}"] for i in range(4)], mask_allowed,
            cotangent)
        for row in (r for r in rows if r["mask"] == mask):
            got = [cases[f"{row['path']}/{row['dtype']}/{mask}/{i}"]
                   for i in range(6)]
            error = max(np.max(np.abs(g - w)) / np.max(np.abs(w))
                        for g, w in zip(got, want))
            assert error <= row["tolerance"], (row, error)
            assert row["ok"]
    # The padded query rows output zeros on every path.
    for row in (r for r in rows if r["mask"] == "padding"):
        output = cases[f"{row['path']}/{row['dtype']}/padding/0"]
        assert np.all(output[~valid] == 0.0), row

    # Speed: every peer timed at the smoke length; FLOPs counted here.
    sizes = layer["sizes"]
    speed = layer["speed"]
    assert [c["peer"] for c in speed] == [
        "native", "ours_explicit", "ours_fused", "ours_memory_efficient",
        "mha"] * len(sizes["seq_lens"])
    width = sizes["heads"] * sizes["key_dim"]
    for case in speed:
        b, t = case["batch"], case["seq_len"]
        flops = 3 * (8 * b * t * width**2
                     + 4 * b * sizes["heads"] * t * t * sizes["key_dim"])
        assert case["flops"] == flops
        assert case["tflops"] == pytest.approx(flops / case["ms"] / 1e9)
        assert case["peak_fraction"] == pytest.approx(
            case["tflops"] / layer["peak"]["tflops"])
    native = [c for c in speed if c["peer"] == "native"]
    assert all(c["implementation"] == "xla" for c in native)  # on a CPU

    # Training: each figure from the run directory's own files.
    train = document["stages"]["train"]
    assert train["status"] == "done"
    assert train["peak_tflops"] == layer["peak"]["tflops"]
    assert [run["name"] for run in train["runs"]] == ["recall-default",
                                                     "recall-large"]
    for run in train["runs"]:
        run_dir = runs / f"train-{run['name']}"
        metrics = json.loads((run_dir / "metrics.json").read_text())
        config = json.loads((run_dir / "config.json").read_text())
        assert metrics["backend"] == "jax"
        seq_len = config["num_pairs"] + 1  # recall: the pairs and the query
        tokens = (metrics["steps"] - 1) * config["batch_size"] * seq_len
        seconds = metrics["train_time_s"] - metrics["first_step_time_s"]
        assert run["tokens_counted"] == tokens
        assert run["tokens_per_s"] == pytest.approx(tokens / seconds)
        assert run["tokens_per_s"] == pytest.approx(
            metrics["steps_per_s"] * config["batch_size"] * seq_len)
        assert run["mfu"] == pytest.approx(
            run["model_tflops"] / train["peak_tflops"])
        steady = seconds / (metrics["steps"] - 1)
        assert run["compile_s"] == pytest.approx(
            metrics["first_step_time_s"] - steady)
        # Diagnostics run at step 0 and at the last step (the interval,
        # 250, is past 8 steps); they are within the time not training.
        diagnostics = run["diagnostics"]
        assert metrics["steps"] == 8 and diagnostics["calls"] == 2
        assert 0 < diagnostics["seconds"] <= (metrics["wall_time_s"]
                                              - metrics["train_time_s"])
        assert diagnostics["share_of_wall"] == pytest.approx(
            diagnostics["seconds"] / metrics["wall_time_s"])
    assert train["runs"][1]["precision"] == "mixed_bfloat16"


@pytest.mark.slow
def test_gpu_check_smoke_whole_command(tmp_path):
    document, out, runs = _gpu_check(tmp_path, "--budget-s", "3000",
                                     timeout=3000)
    stages = document["stages"]
    assert [stages[name]["status"] for name in
            ("layer", "train", "compare", "sweep")] == ["done"] * 4
    compare, sweep = stages["compare"], stages["sweep"]
    for stage, part, report in ((compare, "default", "comparison-default.md"),
                                (compare, "full", "comparison-full.md"),
                                (sweep, "full", "sweep.md")):
        record = stage[part]
        logdir = pathlib.Path(record["argv"][record["argv"].index(
            "--logdir") + 1])
        finished = sorted(path.parent.name
                          for path in logdir.glob("*/metrics.json"))
        assert record["outcome"] == "done"
        assert record["runs_done"] == record["runs_planned"] == len(finished)
        assert sorted(run["name"] for run in record["runs"]) == finished
        source = logdir / ("sweep.md" if stage is sweep else "comparison.md")
        assert (out / report).read_text() == source.read_text()
    assert [line.split(" (")[0] for line in compare["default"]["verdicts"]] \
        == ["Claim 1", "Claim 2", "Claim 3"]
    assert sweep["full"]["verdicts"]
    assert all(re.match(r"^\w+, d_k 8: ", line)
               for line in sweep["full"]["verdicts"])
    # The chosen grids are the largest predicted to fit the time left.
    for record in (compare["full"], sweep["full"]):
        fitting = [row["grid"] for row in record["predictions"]
                   if row["predicted_s"] <= 0.9 * record["available_s"]]
        assert record["grid"] == fitting[-1]
        assert record["predicted_s"] == next(
            row["predicted_s"] for row in record["predictions"]
            if row["grid"] == record["grid"])
    assert compare["parallel"]["jobs"] in (1, 2)
    assert sweep["full"]["jobs"] == compare["parallel"]["jobs"]
