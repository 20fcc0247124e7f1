"""Every numeric setting of `train` at the extremes of its valid range.

Each numeric setting's valid range comes from its declaration
(`pipelines.settings.DECLARED`: a `keras_attention.validation` check and its
bounds, read by `numeric_range`); the cases are
its lowest and highest valid values and the values just outside, run
in-process through the command line on the tiniest run. A valid extreme
either trains (exit 0), stops before the first step with one line naming
its flag (exit 2, nothing written), or, for the optimizer's rates, diverges
and stops with one line naming the step (exit 1). Never a traceback.
"""

import json
import math
import os

import numpy as np
import pytest

from keras_attention import validation
from pipelines.checkpoints import CHECKPOINT_DIR
from pipelines.settings import flag
from pipelines.settings import DECLARED
from pipelines.settings import value_types
from tests.conftest import train_tiny

# Valid extremes that train, too long for a test: `--steps 2147483647` runs
# its steps one by one; `--num-layers 512` trained 2 steps in 781 s on two
# shared cores (its build, save and load: tests/test_grid_identity.py).
TOO_LONG = {("steps", "high"), ("num_layers", "high")}
# Each trained case costs about 1.2 s of CPU. By default the settings below
# train at their extremes together, in `TOGETHER`'s runs; each alone is slow.
COUNTS_AT_ONE = dict(d_model=1, key_dim=1, num_heads=1, value_dim=1,
                     num_layers=1, ff_dim=0, batch_size=1, steps=1,
                     probe_size=1, num_pairs=1, warmup_steps=0)
_INTERVALS = ("eval_every", "diagnostics_every", "heatmap_every",
              "checkpoint_every", "log_every")
TOGETHER = {
    "counts-low": COUNTS_AT_ONE,
    "reporting-low": {**dict.fromkeys(_INTERVALS, 1), "target_accuracy": 0.0,
                      "seed": 0},
    "reporting-high": {**dict.fromkeys(_INTERVALS, 2**31 - 1),
                       "target_accuracy": 1.0, "seed": 2**32 - 1},
}
_ALONE_SLOW = {(name, end) for group in TOGETHER.values() for name in group
               for end in ("low", "high")} - {("num_pairs", "high"),
                                               ("probe_size", "high"),
                                               ("batch_size", "high"),
                                               ("d_model", "high"),
                                               ("key_dim", "high"),
                                               ("num_heads", "high"),
                                               ("value_dim", "high"),
                                               ("ff_dim", "high"),
                                               ("warmup_steps", "high")}
# Valid extremes that diverge in the first steps: exit 1, one line.
DIVERGE = {("learning_rate", "high"), ("weight_decay", "high")}


def numeric_range(check):
    """`(low, high, low_open, high_open)`: the numbers a declared check
    accepts, or `None` for a check of something else."""
    func, bounds = getattr(check, "func", None), getattr(check, "keywords", {})
    if func is validation.check_int:
        return bounds["minimum"], bounds["maximum"], False, False
    if func is validation.check_real:
        return (bounds["low"], bounds["high"], bounds.get("low_open", False),
                bounds.get("high_open", False))
    if func is validation.check_mode_or_real:
        return 0.0, bounds["high"], True, False
    return None


def _numeric_settings():
    for name, declared in DECLARED.items():
        bounds = numeric_range(declared.check)
        if declared.flag and bounds is not None:
            yield name, bounds


def _cases():
    """`(name, end, value, valid)` for each end of each numeric range."""
    for name, (low, high, low_open, high_open) in _numeric_settings():
        integer = int in value_types(name)

        def inside(bound, toward, is_open):
            if not is_open:
                return bound
            return bound + toward if integer else math.nextafter(
                bound, toward * math.inf)

        def outside(bound, away, is_open):
            if is_open:
                return bound
            return bound + away if integer else math.nextafter(
                bound, away * math.inf)

        yield name, "low", inside(low, 1, low_open), True
        yield name, "high", inside(high, -1, high_open), True
        yield name, "below", outside(low, -1, low_open), False
        yield name, "above", outside(high, 1, high_open), False


def _params():
    for name, end, value, valid in _cases():
        marks = ()
        if (name, end) in _ALONE_SLOW:
            marks = (pytest.mark.slow,)
        if (name, end) in TOO_LONG:
            continue
        yield pytest.param(name, end, value, valid, marks=marks,
                           id=f"{name}-{end}")


def test_every_numeric_setting_is_covered():
    names = {name for name, _ in _numeric_settings()}
    numeric = {name for name, declared in DECLARED.items()
               if declared.flag and set(value_types(name)) & {int, float}}
    assert names == numeric
    assert {"qk_init_gain", "scale", "qk_init_std", "num_layers",
            "learning_rate", "seed"} <= names


@pytest.mark.parametrize("name,end,value,valid", list(_params()))
def test_an_extreme_trains_or_stops_in_one_line(tmp_path, name, end, value,
                                                valid):
    status, lines = train_tiny(tmp_path, **{name: value})
    run = tmp_path / "run"
    written = sorted(os.listdir(run)) if run.exists() else []
    if status == 0:
        assert valid, f"{flag(name)} {value!r} is outside its range"
        assert lines == []
        assert "model.keras" in written and "metrics.json" in written
        return
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    if status == 1:
        assert (name, end) in DIVERGE, lines
        assert "non-finite at step" in lines[0] and flag(name) in lines[0]
        assert "model.keras" not in written
        return
    assert status == 2, lines
    assert flag(name) in lines[0], lines
    # Refused before the first step: nothing of the run is written (the
    # directory's lock file aside).
    assert set(written) <= {".lock"}, written


@pytest.mark.parametrize("group", sorted(TOGETHER))
def test_extremes_that_train_together(tmp_path, group):
    status, lines = train_tiny(tmp_path, **TOGETHER[group])
    assert (status, lines) == (0, [])
    with open(tmp_path / "run" / "config.json") as handle:
        config = json.load(handle)
    assert {name: config[name] for name in TOGETHER[group]} == TOGETHER[group]
    assert (tmp_path / "run" / "model.keras").exists()


def _finite_checkpoint(path):
    with np.load(path) as archive:
        return all(np.all(np.isfinite(archive[key])) for key in archive.files
                   if key.startswith("model/") and archive[key].dtype.kind == "f")


def test_a_run_that_diverges_keeps_its_last_good_checkpoint(tmp_path):
    # Warmup from 0: the first update is by a rate of 0, the second by 1e38,
    # which makes the weights inf; losses are logged only at the end.
    status, lines = train_tiny(tmp_path, steps=4, warmup_steps=2,
                           learning_rate=1e38, optimizer="sgd",
                           checkpoint_every=1, log_every=100, eval_every=100,
                           diagnostics_every=1)
    assert status == 1
    assert len(lines) == 1 and "non-finite at step" in lines[0], lines
    directory = tmp_path / "run" / CHECKPOINT_DIR
    kept = sorted(os.listdir(directory))
    assert kept == ["ckpt-1.npz"]
    assert _finite_checkpoint(directory / "ckpt-1.npz")
    assert "last good checkpoint: step 1" in lines[0]
    assert not (tmp_path / "run" / "model.keras").exists()
