"""What of `scripts/gpu_check.sh` no other script does.

    python scripts/gpu_check.py layer JSON [--smoke]
    python scripts/gpu_check.py deterministic LOGDIR [--smoke]
    python scripts/gpu_check.py summary LOGDIR OUT [--smoke]

`layer`: each path of `ScaledDotProductAttention` (and explicit
returning its weights) in float32 and `mixed_bfloat16`, with a padding and
a causal mask, on JAX: the output and every gradient of sum(output *
cotangent) against a float32 explicit layer of the same weights (a second
code path, which tests/test_layer.py checks against numpy), at a length
that leaves the memory-efficient path's 512-row chunks ragged; float32
at JAX's default matmul precision (TF32 on a recent GPU) and at
"highest". `deterministic`: two `--deterministic` runs and one without,
identical or not, and the cost. `summary`:
LOGDIR's stages (`stages.tsv`, their logs, `layer.json`, the grids) as
`OUT/gpu_check.json` and the tables `OUT/gpu_check.txt`, the grids' reports
copied beside them. Exit 1 when a stage failed (a stage cut by its limit
did not) or a layer case is out of tolerance.
"""

import datetime
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

os.environ["KERAS_BACKEND"] = "jax"
import _bench  # noqa: E402  (first: backend, sys.path)
import bench_layer  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from _bench import text_table  # noqa: E402

from keras_attention.layer import ScaledDotProductAttention  # noqa: E402
from pipelines.common import write_json_atomic  # noqa: E402
from pipelines.common import write_text_atomic  # noqa: E402
from pipelines.run_dir import read_metrics  # noqa: E402
from pipelines.run_dir import without_clocks  # noqa: E402

# "auto" is one of these at any size, so it adds no case.
PATHS = ("explicit", "fused", "memory_efficient", "explicit_weights")
# bfloat16 keeps 8 bits of mantissa: a relative error of a few 1e-3 per
# rounding, compounded over the projections, two products and a softmax.
# float32 runs twice: at JAX's default matmul precision, which on an
# Ampere or newer GPU is TF32 (a 10-bit mantissa: about 1e-3 relative a
# product), and at "highest" (true float32), whose error is the path's
# own. The reference is the explicit layer at "highest".
CASES = {("float32", "default"): 2e-3, ("float32", "highest"): 2e-4,
         ("mixed_bfloat16", "default"): 5e-2}
# Each grid's report, the start of its output's verdict lines, and the
# report's name in OUT.
GRIDS = {"main-job": ("comparison.md", r"Claim \d", "comparison-main-job.md"),
         "compare-full": ("comparison.md", r"Claim \d",
                          "comparison-full.md"),
         "sweep": ("sweep.md", r"\w+, d_k \d+: ", "sweep.md")}
# The deterministic stage's runs: the comparison's unscaled arm (the one
# whose seeds did not repeat on the H200), `--steps` more.
DETERMINISTIC_RUN = ("--task", "recall", "--key-dim", "1024",
                     "--value-dim", "64", "--scale", "none",
                     "--learning-rate", "0.01", "--warmup-steps", "0",
                     "--lr-schedule", "constant", "--seed", "1",
                     "--backend", "jax", "--quiet")
DETERMINISTIC_SMOKE = ("--key-dim", "8", "--d-model", "16",
                       "--num-pairs", "4", "--num-keys", "8",
                       "--num-values", "4", "--batch-size", "8",
                       "--heldout-size", "32", "--probe-size", "4")
CUT = (124, 137)  # `timeout`'s exit status (137: killed 10 s later)


def outputs_and_gradients(path, policy, weights, x, call, cotangent,
                          precision="highest"):
    """A layer's output, input gradient and weight gradients (float32) with
    matmuls at `precision`, and its weights (set to `weights` when
    given)."""
    layer = ScaledDotProductAttention(
        key_dim=16, num_heads=2, output_dim=x.shape[-1], dtype=policy,
        implementation="explicit" if path == "explicit_weights" else path)
    layer(x[:1])
    if weights is not None:
        layer.set_weights(weights)
    call = dict(call, return_attention_scores=path == "explicit_weights")
    gradients, values = _bench.jax_loss_and_gradients(
        layer, lambda layer, x: layer(x, **call),
        lambda output: (output.astype("float32") * cotangent).sum())
    with jax.default_matmul_precision(precision):
        (_, output), (d_values, d_x) = jax.jit(gradients)(values, x)
    return layer.get_weights(), [np.asarray(a, "float32")
                                 for a in (output, d_x, *d_values)]


def layer_check(json_path, smoke):
    rng = np.random.default_rng(0)
    length = 600 if smoke else 700  # ragged 512-row chunks
    x = rng.standard_normal((2, length, 32)).astype("float32")
    cotangent = rng.standard_normal(x.shape).astype("float32")
    valid = np.ones((2, length), bool)
    valid[1, length * 3 // 4:] = False
    masks = {"padding": dict(query_mask=valid, value_mask=valid),
             "causal": dict(use_causal_mask=True)}
    cases = []
    for mask, call in masks.items():
        weights, want = outputs_and_gradients("explicit", "float32", None, x,
                                              call, cotangent)
        for path in PATHS:
            for (policy, precision), tolerance in CASES.items():
                case = dict(path=path, dtype=policy, precision=precision,
                            mask=mask, tolerance=tolerance, error=None)
                try:
                    _, got = outputs_and_gradients(
                        path, policy, weights, x, call, cotangent,
                        precision)
                except Exception as error:  # noqa: BLE001 - a path missing
                    case["failure"] = " ".join(str(error).split())[:200]
                else:
                    case["error"] = max(float(np.max(np.abs(g - w))
                                              / np.max(np.abs(w)))
                                        for g, w in zip(got, want))
                error = case["error"]
                case["ok"] = error is not None and error <= tolerance
                cases.append(case)
    write_json_atomic(json_path, dict(
        device=f"{jax.default_backend()}: {jax.devices()[0].device_kind}",
        seq_len=length,
        cases=cases))
    return 0 if all(case["ok"] for case in cases) else 1


def deterministic_check(logdir, smoke):
    """Two `--deterministic` runs and one without of `DETERMINISTIC_RUN`:
    `LOGDIR.json` says whether the two are identical (metrics.json but the
    clocks) and what determinism cost (train seconds, with over without).
    Exit 1 when they differ."""
    steps = ("--steps", "8") if smoke else ("--steps", "300")
    started = {}
    for name, extra in (("deterministic-1", ("--deterministic",)),
                        ("deterministic-2", ("--deterministic",)),
                        ("default", ())):
        command = [sys.executable, "-m", "pipelines", "train",
                   *DETERMINISTIC_RUN, *steps, *extra, "--logdir",
                   os.path.join(logdir, name),
                   *(DETERMINISTIC_SMOKE if smoke else ())]
        started[name] = subprocess.Popen(command)
        if not smoke:  # one at a time: the cost compares their clocks
            started[name].wait()
    runs = {name: dict(exit=process.wait(),
                       metrics=read_metrics(os.path.join(logdir, name)))
            for name, process in started.items()}
    first, second, plain = (runs[name]["metrics"] for name in runs)
    identical = None if None in (first, second) else (
        without_clocks(first) == without_clocks(second))
    cost = None if None in (first, plain) else (
        first["train_time_s"] / plain["train_time_s"])
    result = dict(
        identical=identical, cost=cost, runs={
            name: dict(exit=run["exit"], **{key: (run["metrics"] or {}).get(
                key) for key in ("heldout_accuracy", "heldout_loss",
                                 "train_time_s", "steps_per_s")})
            for name, run in runs.items()})
    write_json_atomic(f"{logdir}.json", result)
    print(json.dumps(result))
    return 0 if identical else 1


def callback_figures(log):
    """bench_callback.py's ratios: fit with the monitor over fit without,
    on each clock, and the share of a fit inside its hooks."""
    figures = {}
    for clock in ("wall", "cpu"):
        found = re.search(rf"{clock}: fit .* ratio ([\d.]+)", log)
        figures[f"{clock}_ratio"] = float(found[1]) if found else None
    found = re.search(r"([\d.]+)% of a fit without it", log)
    figures["hooks_share"] = float(found[1]) / 100 if found else None
    return figures


def auto_vs_fused(rows):
    """`auto` over `fused` per (seq_len, heads, mask) of bench_layer's
    rows, where both were timed."""
    times = {(row["seq_len"], row["heads"], row["mask"], row["impl"]):
             row["ours ms"] for row in rows}
    return [dict(seq_len=seq_len, heads=heads, mask=mask,
                 ratio=times[seq_len, heads, mask, "auto"] / fused)
            for (seq_len, heads, mask, impl), fused in times.items()
            if impl == "fused" and fused
            and times.get((seq_len, heads, mask, "auto"))]


def _read(*parts):  # "": a stage that did not run
    path = pathlib.Path(*parts)
    return path.read_text(errors="replace") if path.exists() else ""


def bench_layer_rows(log):
    """The table of bench_layer.py's output, as dicts of its columns."""
    head = bench_layer.format_table([], [])  # its header and rule
    lines = [line for line in log.split(head)[-1].splitlines()
             if head in log and len(line.split()) == len(bench_layer.COLUMNS)]
    labels = bench_layer.LABELS
    return ([dict(zip(bench_layer.COLUMNS, line.split()[:labels] + [
        float(cell) if re.match(r"[\d.]+$", cell) else None  # failed, n/a
        for cell in line.split()[labels:]])) for line in lines],
            "\n".join([head] + lines) if lines else "")


def bench_train_results(log):
    """bench_train.py's closing JSON line, and its tables before it."""
    lines = log.splitlines()
    if not lines or not lines[-1].startswith("{"):
        return None, ""
    start = next((i for i, line in enumerate(lines)
                  if line.lstrip().startswith("trainer ")), 0)
    return json.loads(lines[-1]), "\n".join(lines[start:-1])


def summary(logdir, out, smoke):
    stages = []
    for line in _read(logdir, "stages.tsv").splitlines():
        name, status, seconds, limit = line.split("\t")
        status = int(status)
        stages.append(dict(
            name=name, exit=status, seconds=int(seconds), limit_s=int(limit),
            outcome="done" if status == 0 else "cut at its limit"
            if status in CUT else f"failed (exit {status})"))
    layer = json.loads(_read(logdir, "layer.json") or "{}")
    rows, bench_table = bench_layer_rows(_read(logdir, "bench_layer.log"))
    train, train_tables = bench_train_results(_read(logdir, "bench_train.log"))
    callback_log = _read(logdir, "callback.log")
    torch_run = read_metrics(os.path.join(logdir, "torch-train")) or {}
    document = dict(
        run=dict(date=datetime.date.today().isoformat(), smoke=smoke,
                 logdir=logdir, stages_s=sum(s["seconds"] for s in stages)),
        stages=stages, layer=layer, bench_layer=rows,
        auto_vs_fused=auto_vs_fused(rows), bench_train=train,
        callback=callback_figures(callback_log) if callback_log else None,
        torch_train={key: torch_run.get(key) for key in (
            "steps", "steps_per_s", "heldout_accuracy", "train_time_s",
            "first_step_time_s", "accelerator")} if torch_run else None,
        deterministic=json.loads(_read(logdir, "deterministic.json")
                                 or "null"))
    grids, verdicts = {}, []
    for name, (report, pattern, copied) in GRIDS.items():
        source = os.path.join(logdir, name, report)
        if os.path.exists(source):
            shutil.copyfile(source, os.path.join(out, copied))
        lines = [line.strip() for stage in (name, f"{name}-report") for line
                 in _read(logdir, f"{stage}.log").splitlines()
                 if re.match(pattern, line.strip())]
        grids[name] = dict(
            runs_finished=len(list(pathlib.Path(logdir, name).glob(
                "*/metrics.json"))),
            report=copied if os.path.exists(source) else None,
            verdicts=lines)
        verdicts += [f"{name}: {line}" for line in lines]
    document["grids"] = grids
    write_json_atomic(os.path.join(out, "gpu_check.json"), document)
    text = "\n\n".join(table for table in _tables(
        document, bench_table, train_tables, callback_log, verdicts)
        if table) + "\n"
    write_text_atomic(os.path.join(out, "gpu_check.txt"), text)
    print(text, end="")
    cases_ok = all(case["ok"] for case in layer.get("cases", []))
    return int(not cases_ok or any(s["exit"] not in (0, *CUT)
                                   for s in stages))


def _tables(document, bench_table, train_tables, callback_log, verdicts):
    """The summary's text tables, in stage order."""
    layer, stages = document["layer"], document["stages"]
    yield (f"gpu_check {document['run']['date']}"
           f"{' smoke' if document['run']['smoke'] else ''}: "
           f"{layer.get('device', '-')}; stages "
           f"{document['run']['stages_s']} s")
    yield text_table(["stage", "outcome", "seconds", "limit s"], [
        [s["name"], s["outcome"], s["seconds"], s["limit_s"]]
        for s in stages], header_justify="left")
    if layer.get("cases"):
        yield (f"layer at T {layer['seq_len']}, against float32 explicit "
               "at matmul precision highest:\n" + text_table(
                   ["path", "dtype", "matmul", "mask", "rel. error", "tol.",
                    ""],
                   [[c["path"], c["dtype"], c["precision"], c["mask"],
                     "-" if c["error"] is None else f"{c['error']:.2e}",
                     c["tolerance"], "ok" if c["ok"] else
                     "FAIL " + c.get("failure", "")]
                    for c in layer["cases"]]))
    yield bench_table
    if document["auto_vs_fused"]:
        yield "auto / fused (goal at most 1.1):\n" + text_table(
            ["seq_len", "heads", "mask", "auto/fused"],
            [[r["seq_len"], r["heads"], r["mask"], f"{r['ratio']:.3f}"]
             for r in document["auto_vs_fused"]])
    yield train_tables
    yield "\n".join(line for line in callback_log.splitlines()
                    if line.startswith(("backend ", "  ")))
    if document["torch_train"]:
        yield "torch backend, train: " + ", ".join(
            f"{key} {value}" for key, value in document[
                "torch_train"].items())
    if document["deterministic"]:
        result = document["deterministic"]
        yield (f"--deterministic: two runs identical: {result['identical']}"
               f"; train time with / without: "
               + ("-" if result["cost"] is None else f"{result['cost']:.3f}")
               + "\n" + "\n".join(f"  {name}: {run}" for name, run in
                                   result["runs"].items()))
    yield text_table(
        ["grid", "runs finished", "report"],
        [[name, grid["runs_finished"], grid["report"] or "-"]
         for name, grid in document["grids"].items()])
    yield "\n".join(verdicts)


def main(argv):
    if argv[:1] == ["layer"] and len(argv) in (2, 3):
        return layer_check(argv[1], "--smoke" in argv)
    if argv[:1] == ["summary"] and len(argv) in (3, 4):
        return summary(argv[1], argv[2], "--smoke" in argv)
    if argv[:1] == ["deterministic"] and len(argv) in (2, 3):
        return deterministic_check(argv[1], "--smoke" in argv)
    _bench.fail("gpu_check.py", "usage: gpu_check.py layer JSON [--smoke] "
                "| deterministic LOGDIR [--smoke] "
                "| summary LOGDIR OUT [--smoke]", status=2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
