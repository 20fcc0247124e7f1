"""The training loop's clock: training time without the loop's pauses."""

import time


class Clock:
    """Training time, leaving out the pauses for evaluation, diagnostics and
    checkpoints, over the whole loop and over the current log window."""

    def __init__(self):
        self.start = self.window_start = time.time()
        self.paused = self.window_paused = 0.0
        self.first_step = None

    def pause(self, seconds):
        self.paused += seconds
        self.window_paused += seconds

    def window_seconds(self):
        return max(time.time() - self.window_start - self.window_paused, 1e-9)

    def new_window(self):
        self.window_start, self.window_paused = time.time(), 0.0

    def steps_per_second(self, steps_run):
        """`(steps/s, training seconds)` of the loop. Throughput leaves out
        the first step, which traces and compiles."""
        train_time = max(time.time() - self.start - self.paused, 1e-9)
        if steps_run > 1 and train_time > self.first_step:
            return (steps_run - 1) / (train_time - self.first_step), train_time
        return steps_run / train_time, train_time
