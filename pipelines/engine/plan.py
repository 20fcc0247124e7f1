"""The plan of a grid: every run it will train or probe, checked before
anything runs.

A grid is the product of its axes (settings with several values: `key_dim`,
`learning_rate`, `num_layers`, ...), its arms and its seeds. Each run is one
`TrainConfig`: the grid's base config with the run's axis values and its
arm's overrides, in `LOGDIR/<name>/`, where the name spells the arm and
the values (`scaled-dk1024-seed0`, `unscaled-sgd-lr0.03-dk1024-seed1`).

Pairing: runs that differ only by arm share the seed, hence the data stream
and the initial weights of every weight they share (the arms rescale or
normalize nothing else), so a difference between arms is the arm's.
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
    """An axis value in a run name. Floats as `repr`: the shortest text
    that reads back as the same float, so 0.1 and 0.1000001 (both "0.1"
    under `:g`) get a folder each; the usual rates read alike."""
    return repr(float(value)) if isinstance(value, float) else str(value)


def run_name(arm, values):
    """`<arm>-<tag><value>-...` over the axis values in order."""
    parts = [arm]
    for name, value in values.items():
        tag = NAME_TAGS.get(name, f"{name}=")
        parts.append(f"{tag}{value_text(value)}")
    return "-".join(parts)


@dataclasses.dataclass
class Run:
    """One run of a grid.

    Attributes:
        arm: the arm's name.
        values: `{setting: value}` of the run's axes, in the grid's order
            (the seed last).
        config: the run's `TrainConfig`.
        trained: False for a run measured at initialization only.
    """

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
        command: the subcommand (`compare`, `sweep`), for messages.
        logdir: the grid's root directory.
        base: the resolved `TrainConfig` every run starts from.
        arms: arm names.
        axes: `{setting: [values]}` in name order, the seed last.
        trained: `{setting: [values]}`: a run whose value of the setting is
            not listed is measured at init only.
        preset: the preset's name.
        jobs: runs trained at once (worker processes when > 1).
        shard: which share of the trained runs this process trains.
        report_only: build the report from the finished runs, train none.
        options: the report's own options (`variance_samples`, ...).
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
        a report measured over `over` alone reads (the shallowest stack,
        the shortest sequence), so that runs of different depths are never
        pooled. Empty when the grid has no other axis."""
        return {name: values[0] for name, values in self.axes.items()
                if name not in over}

    def in_slice(self, values, free=None):
        """Whether a run's axis values (its `values`, or a record holding
        them) lie in `slice()`; the axis `free` may take any value."""
        return all(values.get(name) == value
                   for name, value in self.slice().items() if name != free)

    def _run(self, arm, values):
        key_dim = values.get("key_dim", self.base.key_dim)
        run = Run(arm, values, None)
        config = self.base.replace(
            **values,
            logdir=os.path.join(self.logdir, run.name),
            **ARMS[arm].overrides(key_dim, self.base.qk_init_gain),
        )
        trained = all(values[name] in allowed
                      for name, allowed in self.trained.items())
        return Run(arm, values, config, trained)

    def without(self, names):
        """A copy in which the runs named in `names` are not trained (a
        report over the finished runs measures those at init only)."""
        names = set(names)
        copy = dataclasses.replace(self, _runs=None)
        copy._runs = [dataclasses.replace(run, trained=False)
                      if run.name in names else run for run in self.runs()]
        return copy
