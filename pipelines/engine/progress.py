"""The progress of a grid: runs done, the current runs' steps, the time left.

Finished runs are logged as lines; the status line is rewritten in place on
a terminal, else printed every `every_s` seconds as plain lines.

The time left is calibrated on the steps trained since every worker's
first step report, not since the start: the first run's build and compile
took as long as 100 of its steps (2 CPU cores), and counting it made the
default comparison's first estimate "about 1 h 00 min" for a 4-minute job.
Each build still to come adds the first one's start-up time.
"""

import sys
import time

from pipelines.step_display import duration_text


class Progress:
    """The progress of the runs one process trains.

    Args:
        steps: `{run name: steps to train}` of the runs to train now.
        total: how many trained runs the grid has (with those already done).
        log: receives the finished-run lines.
        stream: where the status line goes (default: stdout; stderr is
            kept for errors).
        every_s: seconds between status lines off a terminal.
        builds: the runs that build and compile anew (the first of each
            shape); default: the first run only.
        workers: processes training side by side (sharing the builds).
        calibrate_s: the shortest time the step rate is measured over.
    """

    def __init__(self, steps, total, log=print, stream=None, every_s=30.0,
                 clock=time.monotonic, builds=None, workers=1,
                 calibrate_s=5.0):
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
        self.builds = set(list(self.steps)[:1] if builds is None else builds)
        self.workers = max(1, workers)
        # The shortest time a rate is measured over (the first steps after
        # a compile run slower).
        self.calibrate_s = calibrate_s
        self._started = set()
        # (time, steps trained) at the first step report, and the start-up
        # time it measured.
        self._anchor = None
        self._startup = 0.0
        self._estimated = False

    def begin(self):
        """Says what happens before the first step report."""
        if self.steps:
            print(f"runs {self.done}/{self.total} done · building and "
                  f"compiling {next(iter(self.steps))}", file=self.stream,
                  flush=True)

    def step(self, name, step):
        """Run `name` has reached `step`."""
        self.current[name] = step
        self._started.add(name)
        # The rate is measured from when every worker trains: anchored at
        # the first worker's report, the second's start-up counted as its
        # steps' time (the default comparison at --jobs 2 said "about 6 min"
        # for 2).
        if self._anchor is None and (
                len(self.current) >= min(self.workers, len(self.steps))
                or self.trained):
            self._anchor = (self.clock(), self._trained_now())
        self._show()

    def finished(self, name, outcome, seconds):
        """Run `name` ended (`outcome`: its one-line result)."""
        self.current.pop(name, None)
        self._started.add(name)
        self.trained += self.steps.get(name, 0)
        self.done += 1
        self._clear()
        self.log(f"[{self.done}/{self.total}] {name}: {outcome} "
                 f"({seconds:.0f} s)")

    def _trained_now(self):
        return self.trained + sum(self.current.values())

    def seconds_left(self):
        """The time left, or None until the step rate of every worker has
        been measured over `calibrate_s` seconds."""
        if self._anchor is None:
            return None
        anchor_time, anchor_trained = self._anchor
        trained = self._trained_now()
        elapsed = self.clock() - anchor_time
        if trained <= anchor_trained or elapsed < self.calibrate_s:
            return None
        rate = (trained - anchor_trained) / elapsed
        if not self._estimated:
            # The first run's start-up: the time to its first report less
            # the steps it had trained by then.
            self._startup = max(
                anchor_time - self.start - anchor_trained / rate, 0.0)
            self._estimated = True
        remaining = sum(self.steps.values()) - trained
        builds_left = len(self.builds - self._started)
        return remaining / rate + builds_left * self._startup / self.workers

    def line(self):
        """The status line."""
        parts = [f"runs {self.done}/{self.total} done"]
        parts += [f"{name} at step {step}/{self.steps.get(name, '?')}"
                  for name, step in self.current.items()]
        left = self.seconds_left()
        parts.append("estimating the time left" if left is None
                     else f"about {duration_text(left)} left")
        return " · ".join(parts)

    def _terminal(self):
        return getattr(self.stream, "isatty", lambda: False)()

    def _show(self):
        now = self.clock()
        first_estimate = (not self._estimated
                          and self.seconds_left() is not None)
        if self._terminal():
            self.stream.write("\r\033[K" + self.line())
            self.stream.flush()
        elif (self._shown is None or now - self._shown >= self.every_s
              or first_estimate):
            print(self.line(), file=self.stream, flush=True)
        else:
            return
        self._shown = now

    def _clear(self):
        if self._terminal():
            self.stream.write("\r\033[K")
            self.stream.flush()
