"""Bad input on the command line (issue 23): exit 2, one line on stderr
naming the setting, and nothing written, before any work starts.

A property test draws bad values for every declared setting (out of range,
of the wrong type, finite numbers a float32 run cannot hold) through a
`--config` file, which reaches the checks without argparse's conversions;
the cases the issue reported have a test each.
"""

import json
import os
import pathlib
import tempfile
import typing

import numpy as np
import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_attention import paths
from keras_attention.layer import ScaledDotProductAttention
from pipelines.backends import BACKENDS
from pipelines.backends import Devices
from pipelines.cli import main
from pipelines.compare import COMPARISON_JSON
from pipelines.settings import CHOICES
from pipelines.settings import SETTINGS
from pipelines.settings import TrainConfig
from pipelines.common import UsageError
from pipelines.common import NOT_A_RUN
from pipelines.settings import flag as flag_of
from pipelines.devices import attention_bytes
from pipelines.devices import check_memory
from pipelines.devices import resolve_jit
from pipelines.sweep import SWEEP_JSON
from pipelines.engine.plan import run_name

_HINTS = typing.get_type_hints(TrainConfig)
# Free text, checked only for being text: no value of the right type is bad.
_FREE = {"logdir", "export", "arm", "scale", "qk_init_std"}
_TOO_BIG_FOR_FLOAT32 = st.floats(min_value=3.5e38, max_value=1e308)
_NOT_A_NUMBER = st.one_of(st.text(max_size=5), st.lists(st.integers(),
                                                        max_size=2))


def _bad_values(name):
    """A strategy of values that setting `name` must refuse."""
    hint = _HINTS[name]
    kinds = [kind for kind in typing.get_args(hint) if kind is not type(None)]
    kind = (kinds or [hint])[0]
    if name in CHOICES or name == "task":
        allowed = CHOICES.get(name, ("recall", "reverse", "sort", "copy"))
        return st.one_of(st.text(max_size=8).filter(
            lambda text: text not in allowed), st.integers())
    if kind is bool:
        return st.one_of(st.integers(), st.text(max_size=5))
    if kind is int:
        return st.one_of(
            st.integers(max_value=-1), st.integers(min_value=2**32),
            st.sampled_from([0.5, -2.5, 1e-3, 3.7, float("inf")]),
            _NOT_A_NUMBER, st.booleans(),
        )
    return st.one_of(_TOO_BIG_FOR_FLOAT32, st.just(float("inf")),
                     st.just(float("nan")), _NOT_A_NUMBER, st.booleans())


_CHECKED = [name for name in SETTINGS if name not in _FREE]


def _tree(path):
    return sorted(
        os.path.relpath(os.path.join(root, name), path)
        for root, dirs, names in os.walk(path) for name in dirs + names
    )


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_setting_refuses_bad_values_in_one_line(data, tmp_path,
                                                      capsys):
    name = data.draw(st.sampled_from(_CHECKED), label="setting")
    value = data.draw(_bad_values(name), label="value")
    # A folder per example: hypothesis runs them all in one test call.
    tmp_path = pathlib.Path(tempfile.mkdtemp(dir=tmp_path))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({name: value}))
    logdir = tmp_path / "run"
    before = _tree(tmp_path)
    capsys.readouterr()
    # No other flag: a flag would override the file's bad value.
    assert main(["train", "--config", str(config), "--logdir",
                 str(logdir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert flag_of(name) in err[0], err[0]
    assert _tree(tmp_path) == before


def _refused(argv, capsys, where):
    before = _tree(where)
    capsys.readouterr()
    status = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1, (status, err)
    assert _tree(where) == before
    return err[0]


@pytest.mark.parametrize("flag, value, named", [
    ("--seed", "4294967296", "--seed"),              # numpy's seed range
    ("--steps", str(10**20), "--steps"),            # trained forever
    ("--learning-rate", "1e308", "--learning-rate"),  # overflowed when logged
])
def test_numbers_a_run_cannot_use_are_refused(tmp_path, capsys, flag, value,
                                              named):
    line = _refused(["train", flag, value, "--logdir", str(tmp_path / "r")],
                    capsys, tmp_path)
    assert named in line


def test_config_files_that_cannot_be_read_are_one_line(tmp_path, capsys):
    not_utf8 = tmp_path / "latin1.json"
    not_utf8.write_bytes('{"task": "r\xe9verse"}'.encode("latin-1"))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    for path, words in ((not_utf8, "not UTF-8"), (deep, "nested too deeply"),
                        ("", "cannot read")):
        line = _refused(["train", "--config", str(path), "--logdir",
                         str(tmp_path / "r")], capsys, tmp_path)
        assert f"--config {path}: {words}" in line, line


def test_export_into_the_run_and_runs_into_other_folders_are_refused(
        tmp_path, capsys):
    run = tmp_path / "run"
    for export in (run, run / "model.keras"):
        line = _refused(["train", "--logdir", str(run), "--export",
                         str(export)], capsys, tmp_path)
        assert line == (
            f"keras-attention train: error: --export {export} is inside the "
            f"run directory --logdir {run}; export to a path outside it")
    assert NOT_A_RUN.keys() >= {COMPARISON_JSON, SWEEP_JSON}
    for marker in NOT_A_RUN:
        folder = tmp_path / marker.replace(".", "_")
        folder.mkdir()
        (folder / marker).write_text("{}")
        line = _refused(["train", "--logdir", str(folder)], capsys, tmp_path)
        assert f"--logdir {folder} is {NOT_A_RUN[marker]}" in line


def test_grids_too_large_or_with_clashing_names_are_refused(tmp_path,
                                                            capsys):
    line = _refused(["compare", "--seeds", str(10**12), "--logdir",
                     str(tmp_path / "c")], capsys, tmp_path)
    assert "--seeds must be a count in [1, 1000]" in line
    # Two rates that :g printed alike got one folder; repr tells them apart.
    def name(rate):
        return run_name("scaled", {"optimizer": "sgd", "learning_rate": rate,
                                   "key_dim": 64, "seed": 0})

    assert name(0.1) != name(0.1000001)
    assert name(3e-4) == "scaled-sgd-lr0.0003-dk64-seed0"


def test_backends_are_the_command_lines_choices(capsys):
    line = _refused(["train", "--backend", "numpy"], capsys, os.getcwd())
    assert f"--backend must be one of {', '.join(BACKENDS)}" in line


def test_attention_that_cannot_fit_is_refused_before_the_first_step(
        tmp_path, capsys, tiny_config):
    # By hand: the probe's 16 maps of one head at T = 100000, float32, four
    # score-sized tensors a layer (scores, weights, their gradients).
    config = tiny_config(probe_size=16, num_heads=1, num_layers=1,
                         batch_size=64, implementation="auto")
    assert attention_bytes(config, 100_000) == 16 * 1 * 100_000**2 * 4 * 4
    # Below the layer's chunking threshold the training batch's maps count.
    assert attention_bytes(config, 1000) == 64 * 1000**2 * 4 * 4
    assert attention_bytes(config.replace(implementation="memory_efficient"),
                           1000) == 16 * 1000**2 * 4 * 4
    # Past the chunking threshold a capped layer is chunked too (the
    # memory-efficient path caps), unless its path is named outright.
    assert attention_bytes(config, 4096) == 16 * 4096**2 * 4 * 4
    assert attention_bytes(config.replace(logit_soft_cap=30.0), 4096) == (
        16 * 4096**2 * 4 * 4)
    assert attention_bytes(config.replace(logit_soft_cap=30.0,
                                          implementation="explicit"),
                           4096) == 64 * 4096**2 * 4 * 4
    # A path named outright is taken at any length.
    for implementation in ("explicit", "fused"):
        assert attention_bytes(config.replace(implementation=implementation),
                               4096) == 64 * 4096**2 * 4 * 4
    assert attention_bytes(config.replace(implementation="memory_efficient"),
                           4096) == 16 * 4096**2 * 4 * 4
    with pytest.raises(UsageError, match="memory_efficient"):
        check_memory(config, 1000, memory=64 * 1000**2 * 16 - 1)
    check_memory(config, 1000, memory=64 * 1000**2 * 16)
    line = _refused(["train", "--task", "reverse", "--seq-len", "100000",
                     "--logdir", str(tmp_path / "r")], capsys, tmp_path)
    assert "sequences of 100000 need about 2,384.2 GiB" in line
    assert "--implementation memory_efficient" in line


@pytest.mark.parametrize("implementation,cap", [
    ("auto", None), ("auto", 30.0), ("explicit", None), ("explicit", 30.0),
    ("fused", None), ("memory_efficient", None), ("memory_efficient", 30.0)])
def test_the_memory_estimate_takes_the_layers_path(
        tiny_config, implementation, cap):
    # The estimate counts the training batch's maps exactly when the layer,
    # built from the same attention options, materialises its scores: both
    # ask `attention_path`, and this keeps the layer's choice on inputs of
    # that length from gaining a rule of its own (the numbers are checked
    # by hand above).
    config = tiny_config(probe_size=1, num_heads=1, num_layers=1,
                         batch_size=8, implementation=implementation,
                         logit_soft_cap=cap)
    layer = ScaledDotProductAttention(key_dim=2, **config.group("attention"))
    for length in (64, 4096):
        heads = np.zeros((1, length, 1, 2), "float32")
        chunked = layer._choose_path(heads, heads, False, False,
                                     True) == "memory_efficient"
        one_map = 4 * length * length * 4
        assert attention_bytes(config, length) == (
            one_map if chunked else 8 * one_map), (length, chunked)


def test_on_a_gpu_the_fused_path_keeps_no_maps_in_the_estimate(
        tiny_config, monkeypatch):
    # A faked GPU: "auto" is fused at every length there (cuDNN keeps the
    # maps on chip), so only the probe's maps count, at 64 tokens as at
    # 8192; a path named explicit still counts the training batch's.
    monkeypatch.setattr(paths, "device_kind", lambda: "gpu")
    config = tiny_config(probe_size=2, num_heads=1, num_layers=1,
                         batch_size=8, implementation="auto")
    for length in (64, 8192):
        one_map = 4 * length * length * 4
        assert attention_bytes(config, length) == 2 * one_map
    assert attention_bytes(config.replace(implementation="explicit"),
                           64) == 8 * 4 * 64 * 64 * 4
    assert paths.materialises("fused", "cpu")
    assert not paths.materialises("fused", "gpu")
    assert not paths.materialises("memory_efficient", "cpu")


def test_variance_output_is_checked_before_the_computation(tmp_path, capsys):
    for path, words in ((tmp_path, "is a directory"),
                        (tmp_path / "missing" / "rows.json",
                         "does not exist or is not writable")):
        capsys.readouterr()
        assert main(["variance", "--key-dims", "4", "--samples", "2",
                     "--output", str(path)]) == 2
        out, err = capsys.readouterr()
        assert f"--output {path}" in err and words in err
        # The table is printed after the draws: none were made.
        assert out == ""
    assert os.listdir(tmp_path) == []


def test_torch_compiles_only_when_the_user_asks():
    """compare's presets ask for XLA ("on") wherever a backend has it; on
    torch, where `torch.compile` cost more than it gave on a CPU, that is
    off, while a user's own --jit-compile on compiles."""
    torch = Devices(backend="torch", num_replicas=1, accelerator="cpu",
                    strategy="default", chief=True, shard=(0, 1),
                    scope=None, device_count=1, handle=None)
    assert resolve_jit("on", torch, source="preset default") is False
    assert resolve_jit("on", torch, source="flags") is True
    assert resolve_jit("auto", torch, source="flags") is False
    jax = torch._replace(backend="jax")
    assert resolve_jit("auto", jax) is True and resolve_jit("off", jax) is False
