"""What the commands print when their output is a file, not a terminal."""

import contextlib
import io
import os
import re

from tensorboard.backend.event_processing import plugin_event_multiplexer

from pipelines.cli import main
from pipelines.step_display import StepDisplay

TINY_TRAIN = ["train", "--task", "recall", "--num-pairs", "4", "--num-keys",
              "8", "--num-values", "4", "--d-model", "16", "--key-dim", "8",
              "--batch-size", "16", "--heldout-size", "64", "--probe-size",
              "8", "--jit-compile", "off", "--eval-every", "30"]
# Carriage return, backspace, escape (colour codes), and the other C0
# controls but the newline.
CONTROL = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]")


def test_train_to_a_file_writes_plain_lines(tmp_path, capsys):
    log = tmp_path / "train.log"
    with open(log, "w") as handle, contextlib.redirect_stdout(handle):
        status = main([*TINY_TRAIN, "--steps", "60", "--log-every", "5",
                       "--logdir", str(tmp_path / "run")])
    assert status == 0
    data = log.read_bytes()
    assert CONTROL.search(data) is None, CONTROL.search(data)
    lines = data.decode().splitlines()
    # Said before the task, model and compile, which the first step waits on.
    assert lines[0].startswith("preparing the recall task")
    # 60 steps in log windows of 5: a line every 5 steps (at most 20 lines).
    steps = [int(m.group(1)) for m in map(re.compile(r"step (\d+)/60: loss ")
                                          .match, lines) if m]
    assert steps == list(range(5, 61, 5))
    assert lines[-2].startswith("step 60/60: heldout_accuracy ")
    assert lines[-1].startswith("held-out accuracy ")
    # TensorBoard lists the run as Keras's callback would: train and
    # validation, nothing at its root.
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(tmp_path / "run"))
    assert set(multiplexer.Runs()) == {"train", "validation"}
    # A run of the earlier layout (held-out events in eval/) is refused in
    # one line, not resumed without its held-out history.
    os.rename(tmp_path / "run" / "validation", tmp_path / "run" / "eval")
    capsys.readouterr()
    assert main([*TINY_TRAIN, "--steps", "80", "--log-every", "5",
                 "--logdir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "held-out events are in eval/" in err[0], err


class _Terminal(io.StringIO):
    def isatty(self):
        return True


class _Clock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def test_step_display_spaces_plain_lines_and_keeps_the_bar_on_a_terminal():
    plain, clock = io.StringIO(), _Clock(0.0)
    display = StepDisplay(1000, verbose=1, log_every=10, stream=plain,
                          clock=clock)
    # The first log window comes after tracing and compiling (20 s), then
    # one every second: 95 s are left at step 50.
    clock.now = 20.0
    for step in range(10, 1001, 10):
        display.update(step, [("loss", 1.0)])
        clock.now += 1.0
    shown = plain.getvalue().splitlines()
    # 1000 steps: a line every 50 (1000 / 20 lines, on a log window).
    assert shown[0] == "step 50/1000: loss 1; about 1 min 35 s left"
    assert len(shown) == 20 and shown[-1] == "step 1000/1000: loss 1"
    assert StepDisplay(1000, 0, 10, stream=plain).progbar.verbose == 0
    assert StepDisplay(1000, 1, 10, stream=_Terminal()).progbar.verbose == 1
