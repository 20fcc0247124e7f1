"""What of `scripts/gpu_check.sh` no other script does.

    python scripts/gpu_check.py layer JSON [--smoke]
    python scripts/gpu_check.py summary LOGDIR OUT [--smoke]

`layer`: each path of `ScaledDotProductAttention` (and explicit
returning its weights) in float32 and `mixed_bfloat16`, with a padding and
a causal mask, on JAX: the output and every gradient of sum(output *
cotangent) against a float32 explicit layer of the same weights (a second
code path, which tests/test_layer.py checks against numpy), at a length
that leaves the memory-efficient path's 512-row chunks ragged. `summary`:
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

# "auto" is one of these at any size, so it adds no case.
PATHS = ("explicit", "fused", "memory_efficient", "explicit_weights")
# bfloat16 keeps 8 bits of mantissa: a relative error of a few 1e-3 per
# rounding, compounded over the projections, two products and a softmax.
TOLERANCE = {"float32": 2e-4, "mixed_bfloat16": 5e-2}
# Each grid's report, and the start of its output's verdict lines.
GRIDS = {"compare-default": ("comparison.md", r"Claim \d"),
         "compare-full": ("comparison.md", r"Claim \d"),
         "sweep": ("sweep.md", r"\w+, d_k \d+: ")}
CUT = (124, 137)  # `timeout`'s exit status (137: killed 10 s later)


def outputs_and_gradients(path, policy, weights, x, call, cotangent):
    """A layer's output, input gradient and weight gradients (float32), and
    its weights (set to `weights` when given)."""
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
    (_, output), (d_values, d_x) = jax.jit(gradients)(values, x)
    return layer.get_weights(), [np.asarray(a, "float32")
                                 for a in (output, d_x, *d_values)]


def layer_check(json_path, smoke):
    rng = np.random.default_rng(0)
    length = 600 if smoke else 1100
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
            for policy, tolerance in TOLERANCE.items():
                case = dict(path=path, dtype=policy, mask=mask,
                            tolerance=tolerance, error=None)
                try:
                    _, got = outputs_and_gradients(path, policy, weights, x,
                                                   call, cotangent)
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


def _read(*parts):  # "": a stage that did not run
    path = pathlib.Path(*parts)
    return path.read_text(errors="replace") if path.exists() else ""


def bench_layer_rows(log):
    """The table of bench_layer.py's output, as dicts of its columns."""
    head = bench_layer.format_table([], [])  # its header and rule
    lines = [line for line in log.split(head)[-1].splitlines()
             if head in log and len(line.split()) == len(bench_layer.COLUMNS)]
    return ([dict(zip(bench_layer.COLUMNS, line.split()[:4] + [
        float(cell) if re.match(r"[\d.]+$", cell) else None  # failed, n/a
        for cell in line.split()[4:]])) for line in lines],
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
    document = dict(run=dict(date=datetime.date.today().isoformat(),
                             smoke=smoke, logdir=logdir), stages=stages,
                    layer=layer, bench_layer=rows, bench_train=train)
    grids, verdicts = {}, []
    for name, (report, pattern) in GRIDS.items():
        source = os.path.join(logdir, name, report)
        copied = f"{name}.md".replace("compare-", "comparison-")
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

    tables = [f"gpu_check {document['run']['date']}"
              f"{' smoke' if smoke else ''}: {layer.get('device', '-')}",
              text_table(["stage", "outcome", "seconds", "limit s"], [
                  [s["name"], s["outcome"], s["seconds"], s["limit_s"]]
                  for s in stages], header_justify="left")]
    if layer.get("cases"):
        tables.append(f"layer at T {layer['seq_len']}, against float32 "
                      "explicit:\n" + text_table(
                          ["path", "dtype", "mask", "rel. error", "tol.", ""],
                          [[c["path"], c["dtype"], c["mask"], "-" if c[
                              "error"] is None else f"{c['error']:.2e}",
                            c["tolerance"], "ok" if c["ok"] else
                            "FAIL " + c.get("failure", "")]
                           for c in layer["cases"]]))
    tables += [bench_table, train_tables, text_table(
        ["grid", "runs finished", "report"],
        [[name, grid["runs_finished"], grid["report"] or "-"]
         for name, grid in grids.items()]), "\n".join(verdicts)]
    text = "\n\n".join(table for table in tables if table) + "\n"
    write_text_atomic(os.path.join(out, "gpu_check.txt"), text)
    print(text, end="")
    cases_ok = all(case["ok"] for case in layer.get("cases", []))
    return int(not cases_ok or any(s["exit"] not in (0, *CUT) for s in stages))


def main(argv):
    if argv[:1] == ["layer"] and len(argv) in (2, 3):
        return layer_check(argv[1], "--smoke" in argv)
    if argv[:1] == ["summary"] and len(argv) in (3, 4):
        return summary(argv[1], argv[2], "--smoke" in argv)
    _bench.fail("gpu_check.py", "usage: gpu_check.py layer JSON [--smoke] "
                "| summary LOGDIR OUT [--smoke]", status=2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
