"""What `keras-attention train` shows of its loop: on a terminal, Keras's
`Progbar`; otherwise (a file, a pipe, a scheduler's log) a plain line every
`every` steps, free of the carriage returns, backspaces and colour codes
that `Progbar` writes whatever its output is.
"""

import math
import sys
import time

import keras

# About this many plain lines per run (and always one at the last step).
PLAIN_LINES = 20


def duration_text(seconds):
    """`"45 s"`, `"3 min 20 s"`, `"2 h 05 min"`."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds // 60 % 60:02d} min"


class StepDisplay:
    """The loop's progress display.

    Args:
        steps: the run's steps.
        verbose: 0 shows nothing.
        log_every: the steps between the loop's log windows (lines fall on
            them).
        stream: where the display goes (default: stdout).
        clock: the time source of the time left (seconds).

    Example:

    ```python
    display = StepDisplay(300, verbose=1, log_every=10)
    display.update(10, [("loss", 1.2), ("accuracy", 0.4)])
    ```
    """

    def __init__(self, steps, verbose, log_every, stream=None,
                 clock=time.monotonic):
        self.steps, self.verbose = steps, verbose
        self.stream = sys.stdout if stream is None else stream
        self.terminal = getattr(self.stream, "isatty", lambda: False)()
        windows = math.ceil(steps / PLAIN_LINES / log_every)
        self.every = max(1, windows) * log_every
        self.values = {}
        self._printed = None
        # The time left is timed from the first update past the start, so
        # tracing and compiling the first step (as long as 100 steps on 2
        # CPU cores) do not count as a step's time.
        self.clock, self._anchor = clock, None
        self.progbar = keras.utils.Progbar(
            steps, verbose=verbose if self.terminal else 0,
            stateful_metrics=["loss", "accuracy", "heldout_accuracy",
                              "steps/s"],
            unit_name="step")

    def update(self, step, values=()):
        """The loop reached `step`; `values` are `(name, number)` pairs."""
        self.progbar.update(step, values=list(values))
        if values and self._anchor is None:
            self._anchor = (self.clock(), step)
        if not (self.verbose and not self.terminal and values):
            return
        if step == self._printed:  # More of a step already shown.
            shown = dict(values)
        elif step % self.every == 0 or step == self.steps:
            shown = {**self.values, **dict(values)}
        else:
            self.values.update(values)
            return
        self.values.update(values)
        left = self._seconds_left(step) if step != self._printed else None
        self._printed = step
        print(f"step {step}/{self.steps}: " + ", ".join(
            f"{name} {value:g}" for name, value in shown.items())
            + ("" if left is None else f"; about {duration_text(left)} left"),
            file=self.stream, flush=True)

    def _seconds_left(self, step):
        now = self.clock()
        start, first = self._anchor
        if step <= first or now <= start or step >= self.steps:
            return None
        return (self.steps - step) * (now - start) / (step - first)
