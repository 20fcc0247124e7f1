"""Tests of the experiment engine (`pipelines.engine`): the plan of a grid
and its axes, the shards, the progress display, the compiled steps kept
across runs, and sharded grids against one process.

Every expectation is worked out here: the shard blocks by hand, the time
left from a fake clock, the reused runs against runs built afresh, and the
sharded report against the report of the same grid in one process.
"""

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import types

import keras
import numpy as np
import pytest

from pipelines import cli
from pipelines import compare
from pipelines.builders import build_task
from pipelines.common import UsageError
from pipelines.devices import open_run_devices
from pipelines.engine import Shard
from pipelines.engine.presets import ARMS
from pipelines.engine.presets import MODE_ARMS
from pipelines.engine.presets import PAIR
from pipelines.engine.progress import Progress
from pipelines.engine.progress import duration_text
from pipelines.engine.reuse import CompiledRuns
from pipelines.engine import runner
from pipelines.engine.runner import shares
from pipelines.engine.shards import resolve_shard
from pipelines.engine.shards import shard_block
from pipelines.train import train

import _engine_tasks  # noqa: E402  (beside this file; the workers import it)

GRID_FLAGS = [
    "--arms", "scaled,unscaled", "--key-dims", "8", "--seeds", "1",
    "--steps", "8", "--d-model", "16", "--num-pairs", "4", "--num-keys", "8",
    "--num-values", "4", "--eval-every", "4", "--diagnostics-every", "4",
    "--checkpoint-every", "4", "--heldout-size", "32", "--probe-size", "4",
    "--variance-samples", "0", "--jit-compile", "off",
]


def _main(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(argv)
    return status, out.getvalue(), err.getvalue()


def _plan(argv, command="compare"):
    parser = cli.build_parser()
    args = parser.parse_args([command, *argv, "--logdir", "unused"])
    return getattr(cli, command).plan_from_args(args)


# ------------------------------------------------------------------ axes
def test_each_scale_mode_names_the_arm_that_trains_with_it():
    # Against what the arm sets in a run's config (a second code path).
    for mode, arm in MODE_ARMS.items():
        overrides = ARMS[arm].overrides(64, 1.0)
        assert overrides["qk_init_gain"] == 1.0
        assert (overrides["scale"], overrides["qk_norm"]) == (
            ("sqrt", True) if mode == "qk_norm" else (mode, False))
    assert (MODE_ARMS["sqrt"], MODE_ARMS["none"]) == PAIR
    assert "saturated_init" not in MODE_ARMS.values()


def test_the_slice_is_the_first_value_of_every_other_axis():
    plan = _plan(["--num-layers", "2,1", "--num-pairs", "3,6",
                  "--key-dims", "8,16", "--seeds", "2"])
    assert plan.slice() == {"num_layers": 1, "num_pairs": 3}
    assert plan.slice(over=("seed",)) == {"key_dim": 8, "num_layers": 1,
                                          "num_pairs": 3}
    inside = [run for run in plan.runs() if plan.in_slice(run.values)]
    # Every arm, d_k and seed at one layer and three pairs.
    assert len(inside) == 2 * 2 * 2
    assert {(r.values["num_layers"], r.values["num_pairs"])
            for r in inside} == {(1, 3)}
    free = [run for run in plan.runs()
            if plan.in_slice(run.values, free="num_pairs")]
    assert {r.values["num_pairs"] for r in free} == {3, 6}
    assert {r.values["num_layers"] for r in free} == {1}


def test_a_list_flag_is_an_axis_and_a_single_value_a_setting():
    plan = _plan(["--num-layers", "1,2", "--key-dims", "16", "--seeds", "2",
                  "--learning-rate", "0.02"])
    runs = plan.runs()
    assert plan.axes == {"num_layers": [1, 2], "key_dim": [16],
                         "seed": [0, 1]}
    assert len(runs) == 2 * 1 * 2 * 2  # layers x d_k x seeds x arms
    names = {run.name for run in runs}
    assert "unscaled-layers2-dk16-seed1" in names and len(names) == 8
    for run in runs:
        assert run.config.num_layers == run.values["num_layers"]
        assert run.config.learning_rate == 0.02  # one value: every run
        assert run.config.logdir == os.path.join("unused", run.name)
    # Pairing: runs that differ only by arm differ only in what the arm sets.
    by_pair = {}
    for run in runs:
        values = run.config.to_dict()
        for name in ("scale", "qk_norm", "qk_init_gain", "arm", "logdir"):
            values.pop(name)
        by_pair.setdefault((run.values["num_layers"], run.values["seed"]),
                           []).append(values)
    assert all(len(group) == 2 and group[0] == group[1]
               for group in by_pair.values())


def test_an_axis_item_is_checked_like_the_train_flag(capsys):
    status = cli.main(["compare", "--num-layers", "1,x", "--logdir",
                       "unused"])
    err = capsys.readouterr().err
    assert status == 2 and "--num-layers" in err and "'x'" in err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(UsageError, match="--num-layers must be an integer"):
        _plan(["--num-layers", "1,0"])


# ---------------------------------------------------------------- shards
@pytest.mark.parametrize("size, count", [(0, 1), (5, 2), (7, 3), (3, 5),
                                         (12, 4)])
def test_shard_blocks_cover_the_runs_once_and_in_order(size, count):
    items = list(range(size))
    blocks = [shard_block(items, Shard(i, count, "--shard"))
              for i in range(count)]
    assert [item for block in blocks for item in block] == items
    sizes = [len(block) for block in blocks]
    assert max(sizes) - min(sizes) <= 1


def test_the_shard_comes_from_the_flag_slurm_or_kubernetes():
    assert resolve_shard("2/5", None, {}) == Shard(2, 5, "--shard")
    slurm = {"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_MIN": "1",
             "SLURM_ARRAY_TASK_COUNT": "4"}
    assert resolve_shard(None, None, slurm) == Shard(3, 4,
                                                     "SLURM_ARRAY_TASK_ID")
    # The flag wins over the scheduler's variables.
    assert resolve_shard("0/2", None, slurm).source == "--shard"
    kubernetes = {"JOB_COMPLETION_INDEX": "1"}
    assert resolve_shard(None, "3", kubernetes) == Shard(
        1, 3, "JOB_COMPLETION_INDEX")
    assert resolve_shard(None, None, {}) == Shard(0, 1, None)
    for flag, count, environ, message in (
            ("3/3", None, {}, "not one of"), ("1", None, {}, "I/N"),
            ("a/2", None, {}, "integer"), (None, None, kubernetes,
                                           "--shard-count"),
            (None, "2", {}, "JOB_COMPLETION_INDEX")):
        with pytest.raises(UsageError, match=message):
            resolve_shard(flag, count, environ)


# -------------------------------------------------------------- progress
class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_progress_says_runs_done_the_current_step_and_the_time_left():
    clock, stream, lines = _Clock(), io.StringIO(), []
    progress = Progress({"a": 100, "b": 100}, total=3, log=lines.append,
                        stream=stream, every_s=30, clock=clock)
    # One was complete before.
    assert progress.line() == "runs 1/3 done · estimating the time left"
    clock.now += 10
    progress.step("a", 50)  # the first report: no rate measured yet
    assert progress.seconds_left() is None
    assert stream.getvalue().strip() == (
        "runs 1/3 done · a at step 50/100 · estimating the time left")
    clock.now += 5
    # 25 steps in 5 s: 125 left at 5 steps/s, and b builds nothing new.
    progress.step("a", 75)  # the first estimate is shown at once
    assert progress.seconds_left() == pytest.approx(25.0)
    assert stream.getvalue().strip().splitlines()[-1] == (
        "runs 1/3 done · a at step 75/100 · about 25 s left")
    clock.now += 5
    progress.step("a", 90)  # within every_s of the last line: not shown
    assert len(stream.getvalue().strip().splitlines()) == 2
    progress.finished("a", "held-out accuracy 1.000", 20.0)
    assert lines == ["[2/3] a: held-out accuracy 1.000 (20 s)"]
    assert progress.seconds_left() == pytest.approx(100 / (50 / 10))
    assert [duration_text(s) for s in (44.6, 200, 7500)] == [
        "45 s", "3 min 20 s", "2 h 05 min"]



def test_two_workers_estimate_from_when_both_train():
    # Shaped like the default comparison at --jobs 2 (measured: 30 steps/s
    # a worker once both train): worker b reports 1 s after a, and both
    # train at 30 steps/s, so 61 s are left at t = 36. Anchored at a's
    # first report, the old estimate read 10 steps in b's first second as
    # the rate: about 6 min 30 s.
    clock, stream = _Clock(), io.StringIO()
    progress = Progress({name: 1000 for name in "abcd"}, total=4,
                        log=lambda line: None, stream=stream, every_s=30,
                        clock=clock, workers=2)
    clock.now = 30.0
    progress.step("a", 10)
    clock.now = 31.0
    progress.step("b", 10)
    assert progress.seconds_left() is None  # nothing measured yet
    clock.now = 33.0
    progress.step("a", 70)
    progress.step("b", 70)
    assert progress.seconds_left() is None  # 2 s: under calibrate_s
    clock.now = 36.0
    progress.step("a", 160)
    progress.step("b", 160)
    # 300 steps in 5 s; 4000 - 320 left.
    assert progress.seconds_left() == pytest.approx(3680 / 60)
    # The line shown at a's report (b still at 70): within 2x of the 61 s.
    shown = stream.getvalue().splitlines()[-1]
    minutes, seconds = re.findall(r"about (\d+) min (\d+) s left", shown)[0]
    assert 0.5 <= (60 * int(minutes) + int(seconds)) / 61 <= 2.0, shown


def _simulated_grid(runs, compile_s, startup_s, step_s, report_every,
                    eval_every, eval_s):
    """Replays a grid on a fake clock: `runs` is `[(name, shape, steps)]`,
    trained one after another; the first run of each shape compiles
    (`compile_s`), the others only reset (`startup_s`). Returns the status
    lines and the real time left at each, and the total time."""
    clock, stream = _Clock(), io.StringIO()
    shapes, builds = set(), []
    for name, shape, _ in runs:
        if shape not in shapes:
            shapes.add(shape)
            builds.append(name)
    progress = Progress({name: steps for name, _, steps in runs},
                        total=len(runs), log=lambda line: None,
                        stream=stream, every_s=30, clock=clock, builds=builds)
    shown_at, seen = [], set()
    for name, shape, steps in runs:
        clock.now += compile_s if name in builds else startup_s
        for step in range(1, steps + 1):
            clock.now += step_s + (eval_s if step % eval_every == 0 else 0)
            if step % report_every == 0:
                progress.step(name, step)
                count = len(stream.getvalue().splitlines())
                if count > len(seen):
                    seen.add(count)
                    shown_at.append(clock.now)
        progress.finished(name, "done", 0.0)
    lines = stream.getvalue().splitlines()
    return lines, [clock.now - time for time in shown_at]


def test_first_estimate_is_within_twice_the_time_really_left():
    # Shaped like the default comparison on 2 CPU cores: three key dims
    # (each compiles: 20 s, as long as 100 steps), two arms each, 300 steps,
    # evaluation every 100. Dividing all steps by the time since the start
    # said 15 times too much here.
    runs = [(f"{arm}-dk{key_dim}", key_dim, 300)
            for key_dim in (16, 64, 256) for arm in ("scaled", "unscaled")]
    lines, really_left = _simulated_grid(
        runs, compile_s=20.0, startup_s=1.0, step_s=0.2, report_every=10,
        eval_every=100, eval_s=2.0)
    assert "estimating" in lines[0]
    estimates = [line for line in lines if "left" in line
                 and "estimating" not in line]
    first = estimates[0]
    shown = [i for i, line in enumerate(lines) if line == first][0]
    minutes, seconds = (int(n) for n in re.findall(r"(\d+) min (\d+) s",
                                                     first)[0])
    estimate = 60 * minutes + seconds
    assert 0.5 <= estimate / really_left[shown] <= 2.0, (first,
                                                         really_left[shown])


# ----------------------------------------------------------------- reuse
def test_reused_compiled_step_trains_like_a_fresh_run(tiny_config, tmp_path):
    configs = [
        tiny_config(steps=15, seed=seed, learning_rate=rate, optimizer="adam",
                    lr_schedule="constant", warmup_steps=0, jit_compile="off",
                    logdir=str(tmp_path / f"fresh{seed}"))
        for seed, rate in ((0, 3e-2), (1, 1e-3))
    ]
    # The second run, built afresh; the reused sequence builds only the first.
    fresh = train(configs[1], hparams_experiment=False)["heldout_loss"]
    keras.backend.clear_session()
    reuse = CompiledRuns()
    reused, functions = [], []
    for config in configs:
        reused.append(train(config.replace(logdir=config.logdir + "-reused"),
                            hparams_experiment=False,
                            reuse=reuse)["heldout_loss"])
        # `fit` made its train function once and kept it.
        functions.append(reuse._parts.model.train_function)
    keras.backend.clear_session()
    assert (reuse.builds, reuse.reuses) == (1, 1)
    assert functions[0] is functions[1] is not None
    np.testing.assert_allclose(reused[1], fresh, rtol=1e-5)
    # Different seeds and rates train differently: the reset is not a no-op.
    assert abs(reused[0] - reused[1]) > 1e-3


def test_reuse_rebuilds_when_the_shapes_change(tiny_config, tmp_path):
    reuse = CompiledRuns()
    first = tiny_config(key_dim=8)
    strategy = open_run_devices(first)[1]
    task = build_task(first)
    parts = reuse(first, strategy, task)
    assert reuse(first.replace(seed=3, learning_rate=0.5), strategy,
                 task) is parts
    other = reuse(first.replace(key_dim=16), strategy, task)
    assert other is not parts and (reuse.builds, reuse.reuses) == (2, 1)
    keras.backend.clear_session()


def test_shares_keep_shape_groups_together(tiny_config):
    configs = [tiny_config(key_dim=d, seed=s) for d in (8, 16) for s in range(3)]
    two = shares(configs, 2)
    assert sorted(len(s) for s in two) == [3, 3]
    assert all(len({c.key_dim for c in share}) == 1 for share in two)
    four = shares(configs, 4)
    assert len(four) == 4 and sum(len(s) for s in four) == 6


# ------------------------------------------------------- sharded grids
def _comparable(document):
    """What the report says, without the lines that time it."""
    runs = [{key: value for key, value in record.items()
             if key != "wall_time_s"} for record in document["runs"]]
    return {"runs": runs, "init_only": document["init_only"],
            "claims": document["claims"], "curves": document["curves"],
            "missing": document["missing"]}


def _flat(value, path=""):
    """`{path: leaf}` of a JSON document."""
    if isinstance(value, dict):
        return {key: leaf for name, item in value.items()
                for key, leaf in _flat(item, f"{path}/{name}").items()}
    if isinstance(value, list):
        return {key: leaf for index, item in enumerate(value)
                for key, leaf in _flat(item, f"{path}/{index}").items()}
    return {path: value}


def test_two_shards_on_one_logdir_report_what_one_process_does(tmp_path):
    whole = str(tmp_path / "whole")
    status, _, err = _main(["compare", *GRID_FLAGS, "--logdir", whole])
    assert status == 0, err
    reference = json.load(open(os.path.join(whole, "comparison.json")))

    sharded = str(tmp_path / "sharded")
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "compare", *GRID_FLAGS,
             "--logdir", sharded],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(env, SLURM_ARRAY_TASK_ID=str(index),
                     SLURM_ARRAY_TASK_COUNT="2"))
        for index in range(2)
    ]
    outputs = [process.communicate(timeout=300) for process in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    document = json.load(open(os.path.join(sharded, "comparison.json")))
    assert len(document["runs"]) == 2 and document["missing"] == []
    # Each shard trained one run, and together they trained both.
    trained = [json.load(open(os.path.join(sharded, r["run"],
                                           "metrics.json")))
               for r in document["runs"]]
    assert all(m["resumed_from_step"] == 0 for m in trained)
    got, want = _flat(_comparable(document)), _flat(_comparable(reference))
    assert got.keys() == want.keys()
    for path, value in want.items():
        # Two processes training at once on shared cores may sum in another
        # order than one alone: the last bits of a float can differ.
        if isinstance(value, float):
            assert got[path] == pytest.approx(value, rel=1e-5, abs=1e-7), path
        else:
            assert got[path] == value, path


def test_a_shard_leaves_the_report_to_the_last_and_report_only_writes_it(
        tmp_path):
    logdir = str(tmp_path / "runs")
    status, out, _ = _main(["compare", *GRID_FLAGS, "--shard", "0/2",
                            "--logdir", logdir])
    assert status == 0
    assert "1 of 2 runs are not finished yet" in out
    assert not os.path.exists(os.path.join(logdir, "comparison.json"))
    (done,) = [name for name in os.listdir(logdir)
               if os.path.isfile(os.path.join(logdir, name, "metrics.json"))]
    status, out, _ = _main(["compare", *GRID_FLAGS, "--report-only",
                            "--logdir", logdir])
    assert status == 0
    document = json.load(open(os.path.join(logdir, "comparison.json")))
    missing = {"scaled-dk8-seed0", "unscaled-dk8-seed0"} - {done}
    assert document["missing"] == sorted(missing)
    assert [record["run"] for record in document["runs"]] == [done]
    report = open(os.path.join(logdir, "comparison.md")).read()
    assert f"Not finished yet" in report and missing.pop() in report
    # Nothing was trained by --report-only.
    assert len([n for n in os.listdir(logdir) if n.endswith("seed0")]) == 1


def test_a_dead_worker_names_its_run_and_the_other_share_finishes(tmp_path):
    """Two shares in two spawned workers: the first's worker is killed in
    its first run, the second's raises in its second. The dead run is
    reported by name (the rest of its share never starts), the other
    share's runs still end, their steps arrive, and the fault comes back as
    the exception the worker raised."""
    configs = {name: types.SimpleNamespace(logdir=name)
               for name in ("dies", "never", "trained", "raises", "last")}
    pending = tmp_path / "pending"
    finished, steps = [], []
    fault = runner._train_in_workers(
        [[configs["dies"], configs["never"]],
         [configs["trained"], configs["raises"], configs["last"]]],
        str(pending), finished.append,
        lambda logdir, step: steps.append((logdir, step)),
        task=_engine_tasks.die_or_report)
    by_name = {record["logdir"]: record for record in finished}
    assert set(by_name) == {"dies", "trained", "last"}
    assert by_name["dies"]["kind"] == "crash"
    assert by_name["dies"]["error"].startswith(
        "its worker process died during the run")
    assert str(pending / "workers.log") in by_name["dies"]["error"]
    assert by_name["trained"]["outcome"] == by_name["last"]["outcome"] == (
        "trained")
    assert isinstance(fault, ZeroDivisionError)
    assert set(steps) <= {("trained", 1), ("last", 1)}
    assert pending.is_dir()  # The workers' output stays for a look.
    # A worker's thread pools are sized as this process's: XLA splits its
    # sums by pool size, so fewer threads would change a grid's numbers
    # with --jobs (1-thread workers ended the default comparison's unscaled
    # runs elsewhere).
    here = {name: os.environ.get(name)
            for name in _engine_tasks.THREAD_VARIABLES}
    assert by_name["trained"]["threads"] == by_name["last"]["threads"] == here
