"""The progress of a grid, as a person reads it: runs done out of the total,
the current run's step, and the time left.

`Progress` hears of each step (`step`) and each finished run (`finished`).
Finished runs are logged as lines; the status line is rewritten in place on
a terminal and printed every `every_s` seconds otherwise (a log file or a
scheduler's output), so a long grid always says where it is.
"""

import sys
import time


def duration_text(seconds):
    """`"45 s"`, `"3 min 20 s"`, `"2 h 05 min"`."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds // 60 % 60:02d} min"


class Progress:
    """The progress of the runs one process trains.

    Args:
        steps: `{run name: steps to train}` of the runs to train now.
        total: how many trained runs the grid has (with those already done).
        log: receives the finished-run lines.
        stream: where the status line goes (default: stdout: it is the
            command's normal output, and stderr is kept for errors).
        every_s: seconds between status lines when `stream` is not a
            terminal.
        clock: the time source (seconds).

    The time left is the steps still to train over the steps trained per
    second so far (compiling and evaluating included), so it is an estimate
    that settles after the first run.
    """

    def __init__(self, steps, total, log=print, stream=None, every_s=30.0,
                 clock=time.monotonic):
        self.steps = dict(steps)
        self.total = total
        self.done = total - len(self.steps)
        self.log = log
        self.stream = sys.stdout if stream is None else stream
        self.every_s = every_s
        self.clock = clock
        self.start = clock()
        self.current = {}
        self.trained = 0
        self._shown = None

    def step(self, name, step):
        """Run `name` has reached `step`."""
        self.current[name] = step
        self._show()

    def finished(self, name, outcome, seconds):
        """Run `name` ended (`outcome`: its one-line result)."""
        self.current.pop(name, None)
        self.trained += self.steps.get(name, 0)
        self.done += 1
        self._clear()
        self.log(f"[{self.done}/{self.total}] {name}: {outcome} "
                 f"({seconds:.0f} s)")

    def seconds_left(self):
        """The estimate of the time left, or None before any step."""
        trained = self.trained + sum(self.current.values())
        remaining = sum(self.steps.values()) - trained
        elapsed = self.clock() - self.start
        if trained <= 0 or elapsed <= 0:
            return None
        return remaining / (trained / elapsed)

    def line(self):
        """The status line."""
        parts = [f"runs {self.done}/{self.total} done"]
        parts += [f"{name} at step {step}/{self.steps.get(name, '?')}"
                  for name, step in self.current.items()]
        left = self.seconds_left()
        if left is not None:
            parts.append(f"about {duration_text(left)} left")
        return " · ".join(parts)

    def _terminal(self):
        return getattr(self.stream, "isatty", lambda: False)()

    def _show(self):
        now = self.clock()
        if self._terminal():
            self.stream.write("\r\033[K" + self.line())
            self.stream.flush()
        elif self._shown is None or now - self._shown >= self.every_s:
            print(self.line(), file=self.stream, flush=True)
        else:
            return
        self._shown = now

    def _clear(self):
        if self._terminal():
            self.stream.write("\r\033[K")
            self.stream.flush()
