"""`pipelines.checkpoints` on its own: a checkpoint file that reads whole
but does not fit the run is damaged like a truncated one, and no variable
changes before the whole file is checked."""

import json
import os

import keras
import numpy as np
import pytest

from pipelines.checkpoints import Checkpoints
from pipelines.checkpoints import DamagedCheckpoints
from pipelines.checkpoints import checkpoint_path
from pipelines.checkpoints import load_newest
from pipelines.checkpoints import read_checkpoint


def _model(units=3):
    inputs = keras.Input((2,))
    hidden = keras.layers.Dense(4, name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(units, name="out")(hidden))


def _values(model):
    return [np.array(keras.ops.convert_to_numpy(v)) for v in model.variables]


def test_a_checkpoint_of_another_model_falls_back_without_touching_weights(
        tmp_path, capsys):
    model = _model()
    Checkpoints(str(tmp_path), model, None, chief=True).save(10, [])
    directory = tmp_path / "checkpoints"
    # ckpt-20 reads whole (a valid zip) but holds a wider output layer: the
    # shape check fails on its last variables, after the first ones match.
    other_run = tmp_path / "other"
    Checkpoints(str(other_run), _model(units=5), None, chief=True).save(20, [])
    os.replace(checkpoint_path(str(other_run / "checkpoints"), 20),
               checkpoint_path(str(directory), 20))
    stored = read_checkpoint(checkpoint_path(str(directory), 10))
    assert json.loads(str(stored["model/paths"])) == [
        v.path for v in model.variables]

    fresh = _model()
    before = _values(fresh)
    assert load_newest(str(directory), fresh) == 10
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ckpt-20.npz is corrupt" in err[0], err
    assert "has shape (4, 5)" in err[0] and "resuming from ckpt-10.npz" in err[0]
    assert not all(np.array_equal(a, b)
                   for a, b in zip(before, _values(model)))
    for got, want in zip(_values(fresh), _values(model)):
        np.testing.assert_array_equal(got, want)

    # Only the misfit left: refused in one line, and nothing assigned.
    os.remove(checkpoint_path(str(directory), 10))
    fresh = _model()
    before = _values(fresh)
    with pytest.raises(DamagedCheckpoints, match="no earlier checkpoint"):
        load_newest(str(directory), fresh)
    for got, want in zip(_values(fresh), before):
        np.testing.assert_array_equal(got, want)
