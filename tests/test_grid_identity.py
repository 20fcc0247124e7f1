"""A grid's folder knows what it holds, and no command writes over another's
results: each case of a refused command is one line, exit 2, and every
file under the folders it names byte for byte (and mtime) as before.

The reference for "nothing changed" is the folder tree read before and
after; for the plan, the run names spelled by hand; for the bounds, the
limits and Python's own recursion limit.
"""

import contextlib
import io
import json
import os
import shutil
import stat
import sys

import keras
import pytest

from keras_attention.models import build_sequence_model
from pipelines import cli
from pipelines.compare import COMPARISON_JSON
from pipelines.settings import MAX_LAYERS
from pipelines.engine.flags import MAX_RUNS
from pipelines.engine.identity import GRID_FILE
from pipelines.engine.identity import REPORT_FILES
from pipelines.sweep import SWEEP_JSON

# A one-run grid of the tiniest recall model: a command trains in ~3 s.
TINY = ["--steps", "4", "--d-model", "8", "--num-pairs", "2", "--num-keys",
        "4", "--num-values", "2", "--eval-every", "4", "--diagnostics-every",
        "4", "--checkpoint-every", "4", "--heldout-size", "8", "--probe-size",
        "2", "--batch-size", "8", "--jit-compile", "off", "--seeds", "1",
        "--arms", "scaled"]
COMPARE = ["compare", *TINY, "--variance-samples", "0"]
SWEEP = ["sweep", *TINY, "--optimizers", "adam", "--learning-rates", "1e-2",
         "--init-key-dims", "none", "--jobs", "1"]
TRAIN = ["train", "--task", "recall", "--steps", "4", "--d-model", "8",
         "--key-dim", "8", "--num-pairs", "2", "--num-keys", "4",
         "--num-values", "2", "--eval-every", "4", "--diagnostics-every", "4",
         "--checkpoint-every", "4", "--heldout-size", "8", "--probe-size", "2",
         "--batch-size", "8", "--jit-compile", "off", "--quiet"]


def main(argv):
    """`(status, stderr lines)` of the command line run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(argv)
    return status, err.getvalue().strip().splitlines()


def tree(path):
    """Every entry under `path`: a file's bytes (another entry's mode) and
    mtime, a folder's name; `None` when `path` does not exist."""
    if not os.path.lexists(path):
        return None
    entries = {}
    for root, folders, files in os.walk(path):
        for name in folders:
            entries[os.path.relpath(os.path.join(root, name), path) + "/"] = 0
        for name in files:
            full = os.path.join(root, name)
            status = os.lstat(full)
            data = status.st_mode  # A link or a pipe: not opened.
            if stat.S_ISREG(status.st_mode):
                with open(full, "rb") as handle:
                    data = handle.read()
            entries[os.path.relpath(full, path)] = (data,
                                                    status.st_mtime_ns)
    return entries


def refused(argv, *folders):
    """Runs `argv`; asserts exit 2, one stderr line, and `folders` as they
    were; returns the line."""
    before = [tree(folder) for folder in folders]
    status, lines = main(argv)
    assert status == 2 and len(lines) == 1, (status, lines)
    assert [tree(folder) for folder in folders] == before
    return lines[0]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished comparison at d_k 8 and a finished `train` run."""
    keras.utils.set_random_seed(0)
    root = tmp_path_factory.mktemp("grids")
    comparison, run = str(root / "cmp8"), str(root / "run")
    assert main([*COMPARE, "--key-dims", "8", "--logdir", comparison])[0] == 0
    assert main([*TRAIN, "--logdir", run])[0] == 0
    return {"root": root, "comparison": comparison, "run": run}


def test_the_names_the_engine_reads_are_the_reports():
    assert REPORT_FILES == {"compare": COMPARISON_JSON, "sweep": SWEEP_JSON}


def test_the_folder_holds_the_plan_it_was_made_with(finished):
    with open(os.path.join(finished["comparison"], GRID_FILE)) as handle:
        assert json.load(handle) == {"command": "compare", "init_only": [],
                                     "trained": ["scaled-dk8-seed0"]}


def test_another_plan_or_command_or_a_run_folder_is_refused(finished):
    comparison, run = finished["comparison"], finished["run"]
    other = [*COMPARE, "--key-dims", "16", "--logdir", comparison]
    for argv in (other, [*other, "--report-only"]):
        line = refused(argv, comparison)
        assert (f"--logdir {comparison} holds another comparison: it trains "
                "scaled-dk8-seed0, which this plan does not; this plan "
                "trains scaled-dk16-seed0, which it does not") in line
    for argv in ([*SWEEP, "--key-dims", "8", "--logdir", comparison],
                 [*SWEEP, "--key-dims", "8", "--report-only", "--logdir",
                  comparison]):
        assert (f"--logdir {comparison} holds a comparison ({GRID_FILE}), "
                "not a sweep") in refused(argv, comparison)
    line = refused([*COMPARE, "--key-dims", "8", "--report-only", "--logdir",
                    run], run)
    assert f"--logdir {run} is a training run's folder (config.json)" in line
    line = refused([*TRAIN, "--logdir", comparison], comparison)
    assert f"--logdir {comparison} is a grid's root ({GRID_FILE})" in line
    # A run of the grid changed: every difference is named.
    line = refused([*COMPARE, "--key-dims", "8", "--steps", "6",
                    "--d-model", "16", "--logdir", comparison], comparison)
    assert "(d_model: 8 there, 16 now; steps: 4 there, 6 now" in line


def test_report_only_needs_a_folder_with_a_finished_run(finished, tmp_path):
    missing, empty = str(tmp_path / "missing"), str(tmp_path / "empty")
    os.mkdir(empty)
    for command in (COMPARE, SWEEP):
        line = refused([*command, "--key-dims", "8", "--report-only",
                        "--logdir", missing], missing)
        assert f"--logdir {missing} is not a folder" in line
        line = refused([*command, "--key-dims", "8", "--report-only",
                        "--logdir", empty], empty)
        assert ("none of the 1 runs of this plan in --logdir "
                f"{empty} is finished") in line
    # The same plan reports again: its own report, rewritten.
    status, lines = main([*COMPARE, "--key-dims", "8", "--report-only",
                          "--logdir", finished["comparison"]])
    assert status == 0 and lines == []


def test_a_folder_an_earlier_version_left_is_read_from_its_report(
        finished, tmp_path):
    legacy = str(tmp_path / "legacy")
    shutil.copytree(finished["comparison"], legacy)
    os.remove(os.path.join(legacy, GRID_FILE))
    line = refused([*COMPARE, "--key-dims", "16", "--report-only",
                    "--logdir", legacy], legacy)
    assert "it trains scaled-dk8-seed0, which this plan does not" in line
    line = refused([*SWEEP, "--key-dims", "8", "--logdir", legacy], legacy)
    assert f"holds a comparison ({COMPARISON_JSON}), not a sweep" in line
    # Its own plan reports, and the folder is adopted.
    status, lines = main([*COMPARE, "--key-dims", "8", "--report-only",
                          "--logdir", legacy])
    assert status == 0 and lines == []
    with open(os.path.join(legacy, GRID_FILE)) as handle:
        assert json.load(handle)["trained"] == ["scaled-dk8-seed0"]


@pytest.mark.parametrize("argv,words", [
    (["train", "--num-layers", "1000"], "--num-layers must be an integer in "
     f"[1, {MAX_LAYERS}] (Keras builds and loads a model by a walk that "
     "recurses once per layer, and Python stops at 1000 frames by default); "
     "received 1000"),
    (["compare", "--num-layers", "1,1000"], "--num-layers must be an "
     f"integer in [1, {MAX_LAYERS}]"),
    (["train", "--vocab-size", "1000000000", "--task", "reverse"],
     "the model and its batches need about 1,907.4 GiB"),
    (["compare", "--key-dims", "8,2000000", "--train-key-dims", "2000000"],
     "the model and its batches need about"),
    (["sweep", "--seeds", "1000", "--learning-rates", "1e-3,1e-2,1e-1",
      "--key-dims", "16,32,64,128"], "the grid has 48,000 runs (2 arm(s) x "
     "--optimizers 2, --learning-rates 3, --key-dims 4, --seeds 1000), more "
     f"than {MAX_RUNS:,}"),
    (["compare", "--key-dims", "8,0"], "--key-dims must be an integer"),
    (["sweep", "--learning-rates", "1e-3,0"], "--learning-rates must be a "
     "finite number"),
])
def test_counts_past_what_the_machine_builds_are_refused_first(
        tmp_path, argv, words):
    logdir = str(tmp_path / "never")
    assert words in refused([*argv, "--logdir", logdir], logdir)
    assert not os.path.exists(logdir)


def test_a_loop_and_a_pipe_are_named_as_what_they_are(tmp_path):
    loop = tmp_path / "loop"
    os.symlink(tmp_path / "other", loop)
    os.symlink(loop, tmp_path / "other")
    pipe = tmp_path / "pipe.txt"
    os.mkfifo(pipe)
    logdir = str(tmp_path / "never")
    for option, path, what in (
            ("--text-file", loop, "a loop of symbolic links"),
            ("--text-file", pipe, "a named pipe (FIFO), not a text file"),
            ("--config", loop, "a loop of symbolic links"),
            ("--config", pipe, "a named pipe (FIFO), not a text file")):
        line = refused(["train", "--task", "text", option, str(path),
                        "--logdir", logdir], logdir)
        assert f"{option} {path}: {what}" in line


@pytest.mark.slow
def test_the_deepest_stack_allowed_builds_saves_and_loads(tmp_path):
    # Python's default limit, which the command line runs under (a test
    # process may have raised it: TensorFlow's import does).
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        model = build_sequence_model(vocab_size=4, seq_len=3, num_classes=2,
                                     d_model=4, key_dim=2,
                                     num_layers=MAX_LAYERS)
        path = str(tmp_path / "deep.keras")
        model.save(path)
        loaded = keras.saving.load_model(path)
    finally:
        sys.setrecursionlimit(limit)
    assert len(loaded.layers) == len(model.layers)
