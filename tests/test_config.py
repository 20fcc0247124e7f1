"""Tests for the settings: layering, provenance, flags, and issue 10's bugs.

The order is dataclass defaults < task defaults < preset < config file <
flags; a setting a layer holds was given, whatever it equals.
"""

import argparse
import inspect
import json
import re

import pytest

from keras_attention.models import build_sequence_model
from keras_attention.transformer_block import ATTENTION_OPTIONS
from pipelines.cli import main
from pipelines.common import OneLineErrorParser
from pipelines.common import UsageError
from pipelines.settings import TASK_DEFAULTS
from pipelines.settings import Layer
from pipelines.settings import TrainConfig
from pipelines.flags import load_config_file
from pipelines.settings import resolve_config
from pipelines.flags import add_train_arguments
from pipelines.flags import config_from_args
from pipelines.flags import settings_from_args
from pipelines.run_dir import config_mismatch
from pipelines.tensorboard import hparams_of

TINY_FLAGS = [
    "--task", "recall", "--num-pairs", "4", "--num-keys", "8",
    "--num-values", "4", "--d-model", "16", "--key-dim", "16",
    "--batch-size", "16", "--heldout-size", "64", "--probe-size", "8",
    "--strategy", "default", "--quiet",
]


def parse_args(argv):
    return add_train_arguments(OneLineErrorParser(prog="t")).parse_args(argv)


def write_json(path, values):
    path.write_text(json.dumps(values))
    return str(path)


def tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# ------------------------------------------------------------ layering
def test_layers_resolve_in_order_with_provenance(tmp_path):
    file_values = {"steps": 300, "learning_rate": 0.02, "seed": 4}
    path = write_json(tmp_path / "run.json", file_values)
    layers = [
        Layer("preset default", {"steps": 500, "learning_rate": 0.01,
                                 "seed": 2, "batch_size": 32}),
        *settings_from_args(parse_args(["--config", path, "--seed", "7"])),
    ]
    config = resolve_config(layers)
    # flags > file > preset > task defaults > dataclass defaults.
    assert config.seed == 7 and config.sources["seed"] == "flags"
    assert config.steps == 300
    assert config.sources["steps"] == f"--config {path}"
    assert config.learning_rate == 0.02
    assert config.batch_size == 32
    assert config.sources["batch_size"] == "preset default"
    assert config.optimizer == TASK_DEFAULTS["recall"]["optimizer"] == "sgd"
    assert config.sources["optimizer"] == "task defaults"
    assert config.num_heads == TrainConfig().num_heads
    assert config.sources["num_heads"] == "default"
    # Derived settings say what they follow.
    assert config.warmup_steps == min(TASK_DEFAULTS["recall"]["warmup_steps"],
                                      300 // 10)
    assert config.sources["warmup_steps"] == "derived from steps"
    assert config.logdir == "runs/recall"
    assert config.sources["logdir"] == "derived from task"
    adamw = resolve_config([Layer("flags", {"optimizer": "adamw"})])
    assert adamw.weight_decay == 0.01
    assert adamw.sources["weight_decay"] == "derived from optimizer"
    # Provenance is not a setting: config.json and equality ignore it.
    assert "sources" not in config.to_dict()
    assert TrainConfig.from_dict(config.to_dict()) == config


def test_the_task_comes_from_the_last_layer_that_gives_it():
    config = resolve_config([
        Layer("preset", {"task": "recall"}),
        Layer("flags", {"task": "sort"}),
    ])
    assert config.task == "sort"
    assert config.key_dim == TASK_DEFAULTS["sort"]["key_dim"]
    assert config.num_pairs is None  # A recall option sort does not take.
    assert resolve_config([]).task == TrainConfig().task


def test_bad_layers_raise_usage_errors_naming_the_source(tmp_path):
    with pytest.raises(UsageError, match="preset x: unknown setting"):
        resolve_config([Layer("preset x", {"stepz": 1})])
    with pytest.raises(UsageError, match="--task must be one of"):
        resolve_config([Layer("flags", {"task": "nope"})])
    with pytest.raises(UsageError, match="--scale"):
        resolve_config([Layer("flags", {"scale": "bogus"})])
    path = write_json(tmp_path / "list.json", [1, 2])
    with pytest.raises(UsageError, match="JSON object"):
        load_config_file(path)


def test_flags_layer_holds_exactly_the_flags_given(tmp_path):
    assert settings_from_args(parse_args([])) == [Layer("flags", {})]
    layers = settings_from_args(parse_args(
        ["--steps", "9", "--no-qk-norm", "--scale", "2.5", "--quiet"]
    ))
    assert layers == [Layer("flags", {
        "steps": 9, "qk_norm": False, "scale": "2.5", "verbose": 0,
    })]
    config = config_from_args(parse_args(["--scale", "2.5", "--lr", "0.1"]))
    assert config.scale == 2.5 and config.learning_rate == 0.1


@pytest.mark.parametrize("argv, flag", [
    (["--steps", "ten"], "--steps"),
    (["--learning-rate", "fast"], "--learning-rate"),
    (["--vocab", "x"], "--vocab-size"),
])
def test_unparsable_numbers_exit_2_with_one_line_naming_the_flag(
    argv, flag, tmp_path, capsys
):
    assert main(["train", *argv, "--logdir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0], err
    assert err[0].startswith("keras-attention train: error: ")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------ bug 1: --export
@pytest.mark.parametrize("case", ["existing", "unwritable"])
def test_train_export_path_is_checked_before_the_first_step(
    case, tmp_path, capsys
):
    logdir = tmp_path / "run"
    if case == "existing":
        export = tmp_path / "model.keras"
        export.write_bytes(b"an older model")
        needle = "already exists"
    else:
        blocker = tmp_path / "blocker"
        blocker.write_text("")
        export = blocker / "model.keras"
        needle = "not writable"
    before = tree(tmp_path)
    status = main(["train", *TINY_FLAGS, "--steps", "2", "--logdir",
                   str(logdir), "--export", str(export)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and "--export" in err[0] and needle in err[0], err
    assert "overwrite" not in err[0]  # train has no --overwrite to offer.
    assert not logdir.exists()  # Nothing trained, nothing written.
    assert tree(tmp_path) == before
    if case == "existing":
        assert export.read_bytes() == b"an older model"


# ---------------------------------- bug 2: a file value equal to a default
def test_a_file_value_equal_to_the_default_is_given(tmp_path):
    assert TrainConfig().diagnostics_every == 250
    path = write_json(tmp_path / "run.json", {"diagnostics_every": 250})
    layers = settings_from_args(parse_args(["--config", path]))
    assert layers == [
        Layer(f"--config {path}", {"diagnostics_every": 250}),
        Layer("flags", {}),
    ]
    # A preset below the file does not override it.
    config = resolve_config(
        [Layer("preset default", {"diagnostics_every": 500}), *layers]
    )
    assert config.diagnostics_every == 250
    assert config.sources["diagnostics_every"] == f"--config {path}"
    # The same for a flag equal to the default.
    flags = settings_from_args(parse_args(["--diagnostics-every", "250"]))
    config = resolve_config(
        [Layer("preset default", {"diagnostics_every": 500}), *flags]
    )
    assert config.diagnostics_every == 250


# ------------------------------------------- bug 3: defaults in the help
def test_help_states_the_defaults_a_run_uses():
    parser = add_train_arguments(argparse.ArgumentParser())
    helps = {
        action.dest: " ".join(action.help.split())
        for action in parser._actions if action.help
    }
    assert "(default: cosine)" in helps["lr_schedule"]
    assert resolve_config([]).lr_schedule == "cosine"
    configs = {task: resolve_config([Layer("t", {"task": task})])
               for task in TASK_DEFAULTS}
    checked = 0
    for name, text in helps.items():
        stated = re.search(r"default: ([^;)]+)", text)
        if stated is None or name not in TrainConfig.__dataclass_fields__:
            continue
        if name == "task":
            assert stated.group(1) == resolve_config([]).task
            continue
        stated = stated.group(1)
        if stated in ("runs/<task>", "key-dim", "fixed length",
                      "fresh samples every step", "4 * d-model",
                      "the running Keras backend"):
            continue  # Defaults described in words.
        per_task = dict(
            part.split(" ", 1) for part in stated.split(", ")
        ) if ", " in stated else dict.fromkeys(configs, stated)
        for task, config in configs.items():
            value = getattr(config, name)
            if name == "warmup_steps":  # Stated before the steps/10 cap.
                value = TASK_DEFAULTS[task]["warmup_steps"]
            text_value = f"{value:g}" if isinstance(value, float) else str(
                value
            )
            assert text_value == per_task[task], (name, task, stated)
        checked += 1
    assert checked >= 20, helps


# ------------------------------ bug 4: the setting the user changed, named
def test_changing_steps_names_steps_not_only_the_derived_warmup(
    tmp_path, capsys
):
    logdir = tmp_path / "run"
    logdir.mkdir()
    argv = ["train", *TINY_FLAGS, "--logdir", str(logdir)]
    stored = config_from_args(parse_args([*argv[1:], "--steps", "20"]))
    stored = stored.replace(precision="float32", jit_compile="off")
    assert stored.warmup_steps == 2
    (logdir / "config.json").write_text(json.dumps(stored.to_dict()))
    before = tree(logdir)

    wanted = config_from_args(parse_args([*argv[1:], "--steps", "30"]))
    mismatch = config_mismatch(str(logdir), wanted)
    assert (mismatch.name, mismatch.stored, mismatch.wanted) == ("steps", 20,
                                                                 30)
    assert mismatch.derived == (("warmup_steps", 2, 3),)

    assert main([*argv, "--steps", "30"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "steps: 20 there, 30 now" in err[0]
    assert "warmup_steps, derived from steps: 2 there, 3 now" in err[0]
    assert tree(logdir) == before

    # A given setting that differs is named as before.
    other = wanted.replace(key_dim=32)
    assert config_mismatch(str(logdir), other)[:3] == ("key_dim", 16, 32)
    # With --warmup-steps given, only steps differs, and it is refused too:
    # it sets the length of the cosine schedule, so the run would not be
    # the 30-step run it would be recorded as.
    same = config_from_args(parse_args(
        [*argv[1:], "--steps", "30", "--warmup-steps", "2"]
    )).replace(precision="float32")
    mismatch = config_mismatch(str(logdir), same)
    assert (mismatch.name, mismatch.stored, mismatch.wanted,
            mismatch.derived) == ("steps", 20, 30, ())
    assert config_mismatch(str(logdir), stored) is None


# -------------------------------------------- derived from the declaration
def test_the_model_group_is_build_sequence_models_keyword_arguments():
    parameters = inspect.signature(build_sequence_model).parameters
    model_settings = resolve_config([]).group("model")
    assert model_settings and set(model_settings) <= set(parameters)
    # The rest come from the task (and the model's name); the attention
    # group is forwarded whole, as `attention_options`, to the layer.
    assert set(parameters) - set(model_settings) == {
        "vocab_size", "seq_len", "num_classes", "token_factors",
        "mask_padding", "max_len", "name", "attention_options",
    }
    attention = resolve_config([]).group("attention")
    assert attention and set(attention) <= set(ATTENTION_OPTIONS)


def test_hparams_are_the_declared_settings_one_type_per_name():
    config = resolve_config([Layer("t", {"scale": 2.5, "learning_rate": 1})])
    hparams = hparams_of(config)
    assert hparams["scale"] == "2.5" and hparams["learning_rate"] == 1.0
    assert isinstance(hparams["learning_rate"], float)
    assert hparams["key_dim"] == config.key_dim and hparams["seed"] == 0
    assert "arm" not in hparams  # None: not logged.
    assert hparams_of(config.replace(arm="a"))["arm"] == "a"
    assert "steps" not in hparams


def test_a_stored_config_without_a_newer_setting_matches_its_default(
    tmp_path
):
    # A run made before a setting existed ran as its default does.
    config = resolve_config([Layer("t", {"logdir": str(tmp_path)})])
    stored = config.to_dict()
    del stored["norm"]
    (tmp_path / "config.json").write_text(json.dumps(stored))
    assert config.norm == TrainConfig().norm == "pre"
    assert config_mismatch(str(tmp_path), config) is None
    mismatch = config_mismatch(str(tmp_path), config.replace(norm="post"))
    assert mismatch[:3] == ("norm", "pre", "post")
