"""The plan of a grid: the product of its axes, arms and seeds, each run a
`TrainConfig` in `LOGDIR/<name>/` (`unscaled-sgd-lr0.03-dk1024-seed1`).

Runs that differ only by arm share the seed, hence the data and every
initial weight they share, so a difference between arms is the arm's.
"""

import dataclasses
import itertools
import os
from typing import Optional

from pipelines.settings import TrainConfig
from pipelines.engine.presets import ARMS
from pipelines.engine.shards import Shard

# How a run's name spells an axis value (`dk1024`, `lr0.03`, `sgd`); an
# axis not listed here is spelled `<setting>=<value>`.
NAME_TAGS = {
    "key_dim": "dk", "learning_rate": "lr", "seed": "seed", "optimizer": "",
    "num_layers": "layers", "num_pairs": "pairs", "seq_len": "len",
    "num_heads": "heads", "d_model": "width", "batch_size": "batch",
}


def value_text(value):
    """An axis value in a run name. Floats as `repr`, the shortest text
    that reads back as the same float: 0.1 and 0.1000001 (both "0.1" under
    `:g`) get a folder each."""
    return repr(float(value)) if isinstance(value, float) else str(value)


def run_name(arm, values):
    """`<arm>-<tag><value>-...` over the axis values in order."""
    return "-".join([arm] + [NAME_TAGS.get(name, f"{name}=") + value_text(
        value) for name, value in values.items()])


@dataclasses.dataclass
class Run:
    """One run of a grid: its arm, `{axis: value}` in the grid's order,
    its `TrainConfig`, and False for a run measured at init only."""

    arm: str
    values: dict
    config: TrainConfig
    trained: bool = True

    @property
    def name(self):
        return run_name(self.arm, self.values)


@dataclasses.dataclass
class Grid:
    """Everything a grid will do, checked before anything runs.

    Attributes:
        base: the resolved `TrainConfig` every run starts from.
        axes: `{setting: [values]}` in name order, the seed last.
        trained: `{setting: [values]}`: a run whose value of the setting is
            not listed is measured at init only.
        jobs: runs trained at once (worker processes when > 1; 0: two
            when the machine and the grid are big enough).
        order: the order the runs are listed in (axis names and `"arm"`,
            outermost first); default: the axes, then the arm.
    """

    command: str
    logdir: str
    base: TrainConfig
    arms: list
    axes: dict
    trained: dict = dataclasses.field(default_factory=dict)
    preset: str = "default"
    jobs: int = 1
    shard: Shard = Shard(0, 1, None)
    report_only: bool = False
    options: dict = dataclasses.field(default_factory=dict)
    order: tuple = ()
    _runs: Optional[list] = dataclasses.field(default=None, repr=False)

    @property
    def seeds(self):
        return list(self.axes["seed"])

    def axis(self, name):
        """The values of axis `name` (sorted where numeric)."""
        return list(self.axes[name])

    def trained_axis(self, name):
        """The values of axis `name` that are trained."""
        return list(self.trained.get(name, self.axes[name]))

    def runs(self):
        """Every `Run`, trained ones first, in the grid's product order."""
        if self._runs is None:
            choices = {**self.axes, "arm": self.arms}
            order = self.order or (*self.axes, "arm")
            runs = []
            for values in itertools.product(*(choices[n] for n in order)):
                chosen = dict(zip(order, values))
                runs.append(self._run(chosen.pop("arm"), {
                    name: chosen[name] for name in self.axes}))
            self._runs = sorted(runs, key=lambda run: not run.trained)
        return self._runs

    def trained_runs(self):
        return [run for run in self.runs() if run.trained]

    def slice(self, over=("key_dim", "seed")):
        """`{axis: its first value}` over the axes besides `over`: the runs
        a report over `over` alone reads, so runs of different depths (or
        lengths, ...) are never pooled."""
        return {name: values[0] for name, values in self.axes.items()
                if name not in over}

    def in_slice(self, values, free=None):
        """Whether a run's axis values (or a record holding them) lie in
        `slice()`; the axis `free` may take any value."""
        return all(values.get(name) == value
                   for name, value in self.slice().items() if name != free)

    def _run(self, arm, values):
        key_dim = values.get("key_dim", self.base.key_dim)
        config = self.base.replace(
            **values, logdir=os.path.join(self.logdir, run_name(arm, values)),
            **ARMS[arm].overrides(key_dim, self.base.qk_init_gain))
        trained = all(values[name] in allowed
                      for name, allowed in self.trained.items())
        return Run(arm, values, config, trained)

    def without(self, names):
        """A copy in which the runs named in `names` are not trained."""
        names = set(names)
        copy = dataclasses.replace(self, _runs=None)
        copy._runs = [dataclasses.replace(run, trained=False)
                      if run.name in names else run for run in self.runs()]
        return copy
