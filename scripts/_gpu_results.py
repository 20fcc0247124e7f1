"""The results of `gpu_check.py`: one JSON, saved after every measurement,
and the tables printed from it.

`Results` holds the document `{"run": {...}, "stages": {name: {...}}}`;
each stage (and the layer's worker process, between the parent's saves)
writes its section and `save()`s at once, through the library's atomic
writer, so a run cut short keeps everything measured before the cut.
`tables(document)` renders what a document holds, stage by stage; a stage
that never ran, or stopped early, says so in its table's heading.
"""

import json
import os

import _bench  # noqa: F401  (first: backend, sys.path)
from _bench import text_table
from pipelines.common import write_json_atomic

STAGES = ("layer", "train", "compare", "sweep")
JSON_NAME = "gpu_check.json"
TABLES_NAME = "gpu_check.txt"


class Results:
    """The one JSON of a check, at `path` (re-read from disk by `load`)."""

    def __init__(self, path):
        self.path = path
        self.document = {"run": {}, "stages": {}}

    def load(self):
        """Reads the file back (after another process wrote a section)."""
        if os.path.exists(self.path):
            with open(self.path) as handle:
                self.document = json.load(handle)
        return self

    def stage(self, name):
        """The section of stage `name`, created empty on first use."""
        return self.document["stages"].setdefault(name, {"status": "running"})

    def save(self):
        write_json_atomic(self.path, self.document)


def _number(value, spec):
    return "-" if value is None else format(value, spec)


def _heading(name, section):
    status = section.get("status", "not run")
    note = section.get("note")
    return f"== {name}: {status}" + (f" ({note})" if note else "")


def layer_tables(section):
    lines = []
    peak = section.get("peak") or {}
    if peak:
        lines.append(f"device {section.get('device')}: bf16 matmul "
                     f"{peak['size']}^3 at {peak['tflops']:.1f} TFLOP/s "
                     f"(the peak of every fraction below)")
    cases = section.get("correctness", [])
    if cases:
        rows = [[c["path"], c["dtype"], c["mask"],
                 c.get("error") or _number(c["max_relative_error"], ".2e"),
                 _number(c["tolerance"], ".0e"), "ok" if c["ok"] else "FAIL"]
                for c in cases]
        lines.append(text_table(
            ["path", "dtype", "mask", "rel. error", "tolerance", ""], rows))
    speed = sorted(section.get("speed", []), key=lambda c: c["seq_len"])
    native = {c["seq_len"]: c.get("ms") for c in speed
              if c["peer"] == "native"}
    rows = []
    for case in speed:
        if "error" in case:
            rows.append([case["seq_len"], case["batch"], case["peer"],
                         "error: " + case["error"][:48], "", "", "", "", ""])
            continue
        against = native.get(case["seq_len"])
        rows.append([
            case["seq_len"], case["batch"], case["peer"],
            _number(case["ms"], ".2f"), _number(case["tflops"], ".1f"),
            _number(100 * case["peak_fraction"], ".1f"),
            "-" if not against else f"{against / case['ms']:.2f}x",
            _number(case["xla_mib"], ".0f"),
            _number(case["device_peak_mib"], ".0f"),
        ])
    if rows:
        lines.append(text_table(
            ["T", "B", "peer", "ms", "TFLOP/s", "% peak", "vs native",
             "XLA MiB", "dev. peak MiB"], rows))
    return lines


def train_tables(section):
    rows = []
    for run in section.get("runs", []):
        mfu = run.get("mfu")
        steady = run.get("steady_step_s")
        rows.append([
            run["name"] + (" (cut)" if run.get("partial") else ""),
            run.get("steps", run.get("logged_steps", "-")),
            _number(run.get("tokens_per_s"), ",.0f"),
            _number(run.get("model_tflops"), ".2f"),
            _number(None if mfu is None else 100 * mfu, ".1f"),
            _number(run.get("first_step_s"), ".2f"),
            _number(None if steady is None else 1e3 * steady, ".2f"),
            _number(run.get("compile_s"), ".2f"),
            _number(run.get("diagnostics", {}).get("calls"), "d"),
            _number(100 * run["diagnostics"]["share_of_wall"]
                    if "share_of_wall" in run.get("diagnostics", {})
                    else None, ".1f"),
            _number(run.get("wall_time_s"), ".1f"), run["outcome"]])
    if not rows:
        return []
    return [text_table(
        ["model", "steps", "tokens/s", "TFLOP/s", "MFU %", "first step s",
         "steady ms", "compile s", "diag. calls", "diag. % wall", "wall s",
         "outcome"], rows)]


def grid_tables(section, parts):
    rows = []
    for part in parts:
        run = section.get(part)
        if not run:
            continue
        rows.append([
            part, run.get("grid", "-"), run.get("jobs", "-"),
            f"{run.get('runs_done', 0)}/{run.get('runs_planned', '-')}",
            _number(run.get("predicted_s"), ".0f"),
            _number(run.get("seconds"), ".0f"), run.get("outcome", "-"),
        ])
    lines = [text_table(["part", "grid", "jobs", "runs", "predicted s",
                         "seconds", "outcome"], rows)] if rows else []
    notes = [f"{part}: {line}" for part in parts
             for line in (section.get(part) or {}).get("verdicts", [])]
    if section.get("jobs_choice"):
        notes.append(f"jobs: {section['jobs_choice']}")
    return lines + (["\n".join(notes)] if notes else [])


def tables(document):
    """Every stage's tables, as one printable string."""
    out = []
    run = document.get("run", {})
    if run:
        out.append(f"gpu_check {run.get('date')} "
                   f"{'smoke ' if run.get('smoke') else ''}budget "
                   f"{run.get('budget_s')} s, {run.get('elapsed_s', 0):.0f} s "
                   f"used")
    render = {
        "layer": layer_tables, "train": train_tables,
        "compare": lambda s: grid_tables(s, ("default", "full")),
        "sweep": lambda s: grid_tables(s, ("full",)),
    }
    for name in STAGES:
        section = document.get("stages", {}).get(name)
        if section is None:
            continue
        out.append(_heading(name, section))
        out.extend(render[name](section))
        if section.get("error"):
            out.append(f"error: {section['error']}")
    return "\n\n".join(out) + "\n"
