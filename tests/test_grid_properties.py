"""Property tests: random sequences of commands over a few shared folders
lose nothing.

Each sequence draws commands (`train`, `compare`, `sweep`, their
`--report-only`, `export` with and without `--overwrite`) with random
flags and folders, and runs them in this process through the command
line's `main`. Every step either succeeds (exit 0) or is refused in one
line (exit 2) with every file under the shared folders byte for byte and
mtime as it was; and every finished run's results (`config.json`,
`metrics.json`, `model.keras`) read back, at the end, as they were when
they were written. The reference is the folders' own bytes, read before
and after each step.

Hypothesis draws the sequences derandomized (the same ones on every run).
The default run is a few sequences (about a minute); `-m slow` runs more.
"""

import contextlib
import io
import json
import os
import shutil
import tempfile

import keras
import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from pipelines import cli
from pipelines.engine.identity import GRID_FILE
from test_grid_identity import COMPARE
from test_grid_identity import SWEEP
from test_grid_identity import TRAIN
from test_grid_identity import tree

FOLDERS = ("a", "b", "t")
RESULTS = ("config.json", "metrics.json", "model.keras")

_folder = st.sampled_from(FOLDERS)
COMMANDS = st.one_of(
    st.tuples(st.just("train"), _folder, st.sampled_from(["4", "6"])),
    st.tuples(st.just("compare"), _folder, st.sampled_from(["8", "8,16"]),
              st.booleans()),
    st.tuples(st.just("sweep"), _folder, st.sampled_from(["1e-2", "1e-3"]),
              st.booleans()),
    # The run to export (an index into the runs there are), where to, and
    # whether to overwrite.
    st.tuples(st.just("export"), st.integers(0, 7),
              st.sampled_from(["out/m.keras", "out/notes.keras",
                               "a/m.keras", "RUN/m.keras",
                               "RUN/model.keras"]),
              st.booleans()),
)


def _run_folders(base):
    """The folders under `base` that hold a training run, sorted."""
    return sorted(root for root, _, files in os.walk(base)
                  if "config.json" in files)


def _argv(step, base):
    """The command line of a drawn step."""
    kind = step[0]
    if kind == "train":
        _, folder, steps = step
        return [*TRAIN, "--steps", steps, "--logdir",
                os.path.join(base, folder)]
    if kind in ("compare", "sweep"):
        _, folder, value, report_only = step
        argv = ([*COMPARE, "--key-dims", value] if kind == "compare" else
                [*SWEEP, "--key-dims", "8", "--learning-rates", value])
        return argv + ["--logdir", os.path.join(base, folder)] + (
            ["--report-only"] if report_only else [])
    _, index, out, overwrite = step
    runs = _run_folders(base) or [os.path.join(base, "t")]
    run = runs[index % len(runs)]
    out = out.replace("RUN", os.path.relpath(run, base))
    return (["export", "--logdir", run, "--out", os.path.join(base, out)]
            + (["--overwrite"] if overwrite else []))


def _results(base):
    """`{path: bytes}` of every finished run's result files."""
    found = {}
    for run in _run_folders(base):
        if not os.path.isfile(os.path.join(run, "metrics.json")):
            continue
        for name in RESULTS:
            path = os.path.join(run, name)
            if os.path.isfile(path):
                with open(path, "rb") as handle:
                    found[path] = handle.read()
    return found


def _check_reports(base):
    """Each grid report lists only runs of its folder's plan."""
    for folder in FOLDERS:
        root = os.path.join(base, folder)
        for report in ("comparison.json", "sweep.json"):
            path = os.path.join(root, report)
            if not os.path.isfile(path):
                continue
            with open(os.path.join(root, GRID_FILE)) as handle:
                plan = json.load(handle)
            with open(path) as handle:
                document = json.load(handle)
            assert {record["run"] for record in document["runs"]} <= set(
                plan["trained"]), path
            assert report == {"compare": "comparison.json",
                              "sweep": "sweep.json"}[plan["command"]]


def _sequence_check(counts):
    def check(sequence):
        keras.utils.set_random_seed(0)
        base = tempfile.mkdtemp(prefix="grid-sequence-")
        try:
            os.makedirs(os.path.join(base, "out"))
            # Not a model: `--overwrite` must leave it.
            with open(os.path.join(base, "out", "notes.keras"), "w") as f:
                f.write("notes")
            written = {}
            counts["sequences"] += 1
            for step in sequence:
                argv = _argv(step, base)
                before = tree(base)
                out, err = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(out), \
                        contextlib.redirect_stderr(err):
                    status = cli.main(argv)
                lines = err.getvalue().strip().splitlines()
                counts["commands"] += 1
                assert status in (0, 2), (argv, status, lines)
                if status == 2:
                    counts["refused"] += 1
                    assert len(lines) == 1, (argv, lines)
                    assert tree(base) == before, argv
                else:
                    counts["succeeded"] += 1
                    assert lines == [], (argv, lines)
                now = _results(base)
                for path, data in written.items():
                    assert now.get(path) == data, (argv, path)
                written.update(now)
                _check_reports(base)
            assert _results(base) == written
        finally:
            shutil.rmtree(base, ignore_errors=True)

    return check


def _run(examples, length):
    counts = dict(sequences=0, commands=0, refused=0, succeeded=0)
    check = settings(
        max_examples=examples, deadline=None, derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow,
                               HealthCheck.data_too_large],
    )(given(st.lists(COMMANDS, min_size=length, max_size=length))(
        _sequence_check(counts)))
    check()
    print(f"\n{counts['sequences']} sequences, {counts['commands']} "
          f"commands: {counts['succeeded']} succeeded, {counts['refused']} "
          "refused")
    return counts


def test_random_command_sequences_lose_nothing():
    counts = _run(examples=4, length=6)
    # The draws exercise both outcomes.
    assert counts["refused"] and counts["succeeded"]


@pytest.mark.slow
def test_more_random_command_sequences_lose_nothing():
    counts = _run(examples=25, length=8)
    assert counts["refused"] and counts["succeeded"]
