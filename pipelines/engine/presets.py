"""The arms of a grid (what one run changes: scale, q/k norm, W_Q, W_K
gain) and the ready-made grids (presets) of `compare` and `sweep`.

A preset's settings are laid over `TASK_DEFAULTS[task]`: each value it gives
is where the comparison differs from a plain `train`, with the reason.
"""

import dataclasses

from pipelines.settings import TASK_DEFAULTS


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm of a grid: what it changes in the training config.

    `gain_exponent`: W_Q and W_K are multiplied by `key_dim ** exponent`
    (on top of `--qk-init-gain`).
    """

    name: str
    description: str
    scale: str = "sqrt"
    qk_norm: bool = False
    gain_exponent: float = 0.0

    @property
    def mode(self):
        """The scale mode the arm stands for at init (its scale, or
        `qk_norm`); None for an arm that changes the initial weights."""
        if self.gain_exponent:
            return None
        return "qk_norm" if self.qk_norm else self.scale

    def overrides(self, key_dim, base_gain):
        """The `TrainConfig` fields this arm sets for `key_dim`."""
        gain = float(base_gain) * float(key_dim) ** self.gain_exponent
        return {"scale": self.scale, "qk_norm": self.qk_norm,
                "qk_init_gain": gain, "arm": self.name}


ARMS = {
    arm.name: arm
    for arm in (
        Arm("scaled", "softmax(QKᵀ/√d_k)V, the standard attention"),
        Arm("unscaled", "softmax(QKᵀ)V: the same model without the scale",
            scale="none"),
        Arm("learned", "a learned scalar scale, starting at 1/√d_k",
            scale="learned"),
        Arm("inverse", "softmax(QKᵀ/d_k)V: μP's attention scale",
            scale="inverse"),
        Arm("qk_norm", "scaled, with layer-normalized queries and keys",
            qk_norm=True),
        Arm("saturated_init",
            "scaled, with W_Q, W_K × d_k^¼: the scaled model started from "
            "the unscaled model's saturated scores", gain_exponent=0.25),
        Arm("compensated_init",
            "unscaled, with W_Q, W_K × d_k^−¼: the unscaled model started "
            "from the scaled model's unsaturated scores", scale="none",
            gain_exponent=-0.25),
        Arm("ssmax",
            "softmax(s_h·log(n)·QKᵀ/√d_k)V: Scalable-Softmax, n the keys a "
            "query sees, s_h learned per head from 1/log(training length)",
            scale="ssmax"),
    )
}

# The two arms every claim and verdict compares.
PAIR = ("scaled", "unscaled")
# Scale mode -> the arm that stands for it (`Arm.mode`).
MODE_ARMS = {arm.mode: name for name, arm in ARMS.items() if arm.mode}

# Settings the arms set per run: a grid refuses them as flags.
ARM_SETTINGS = ("scale", "qk_norm", "arm")


@dataclasses.dataclass(frozen=True)
class Preset:
    """A ready-made grid.

    Attributes:
        settings: `TrainConfig` fields where the grid differs from
            `TASK_DEFAULTS[task]`; the config file and flags override them.
        axes: `{setting: values}`, the axes besides arms and seeds.
        seeds: number of seeds (0 .. seeds - 1).
        expected: the expected wall time, for `--help` and the report.
        trained: `{setting: values}`: runs with other values of the setting
            are measured at init only.
        options: the report's own options (a compare preset's `claims` and
            `length_multiples`, a sweep's `init_key_dims`, ...).
    """

    task: str
    settings: dict
    axes: dict
    arms: tuple
    seeds: int
    expected: str
    trained: dict = dataclasses.field(default_factory=dict)
    # 0: "auto" (`pipelines.engine.runner.resolve_jobs`).
    jobs: int = 1
    options: dict = dataclasses.field(default_factory=dict)

    def layer_values(self, task):
        """The settings this preset gives a grid on `task`: all on its own
        task, only the schedule on another (its model and optimizer suit
        its own task)."""
        if task == self.task:
            return {"task": self.task, **self.settings}
        return {name: self.settings[name] for name in SCHEDULE_FIELDS
                if name in self.settings}


# The settings a preset keeps when the task is not its own.
SCHEDULE_FIELDS = ("steps", "eval_every", "diagnostics_every",
                   "checkpoint_every", "heldout_size")

# Where the comparison differs from `TASK_DEFAULTS["recall"]` (whose plain
# `train` at d_k 64 reaches 100% from step 600): it trains at d_k up to 4096
# and measures what the scale does to the gradients.
_COMPARISON = dict(
    # A constant rate without warmup: the curves differ by the scale alone,
    # and the first, saturated unscaled steps are not softened by warmup.
    learning_rate=0.01,
    warmup_steps=0,
    lr_schedule="constant",
    # The values do not enter the scores; d_model instead of d_k halves the
    # cost of a step at large d_k.
    value_dim=64,
    # XLA: a d_k 1024 step took 111 ms compiled against 147 ms without (one
    # CPU core), which pays for the compile within a run.
    jit_compile="on",
)
assert TASK_DEFAULTS["recall"]["optimizer"] == "sgd", (
    "the comparison's claims are about raw gradients: SGD, which does not "
    "rescale them per parameter as Adam does")

_INIT_KEY_DIMS = (16, 64, 256, 1024, 4096)
_FOUR_ARMS = ("scaled", "unscaled", "qk_norm", "ssmax")
# The length grids' training (see the length preset).
_LENGTH = dict(_COMPARISON, optimizer="adam", learning_rate=3e-3,
               warmup_steps=100, lr_schedule="cosine", num_keys=128,
               eval_every=100, diagnostics_every=500, checkpoint_every=500)

COMPARE_PRESETS = {
    # The demo in docs/experiments.md: init statistics at four d_k,
    # training at the largest with three seeds.
    "default": Preset(
        task="recall", arms=PAIR, seeds=3,
        # 21 points a curve. A diagnostics call took 30-43 ms at d_k 1024
        # against 17-20 ms a step (bench_train, 2 shared cores): 2.9-4.8%
        # of training time.
        settings=dict(_COMPARISON, eval_every=50, diagnostics_every=50,
                      checkpoint_every=500, heldout_size=512),
        axes={"key_dim": (16, 64, 256, 1024)}, trained={"key_dim": (1024,)},
        # Six runs of 1000 steps at d_k 1024; two workers ("auto",
        # `runner.resolve_jobs`) train three each: 78 s in all on 2 idle
        # cores (2026-12-04; 12-25 s a run), with the layer's factored
        # scores (d_k 1024 over width 64); 152 s before them. Init probes,
        # figures and the report take about 12 s of it.
        jobs=0, expected="about 1 to 2 minutes on 2 idle CPU cores"),
    # Every arm trained at every d_k, five seeds: for a GPU.
    "full": Preset(
        task="recall", arms=tuple(ARMS), seeds=5,
        settings=dict(_COMPARISON, steps=2000, eval_every=100,
                      diagnostics_every=100, checkpoint_every=500,
                      heldout_size=1024),
        axes={"key_dim": _INIT_KEY_DIMS},
        expected="200 runs of 2000 steps; roughly 35-70 minutes on one GPU "
        "with --jobs 4 (an estimate: a step of this small model is "
        "overhead-bound on a GPU), many hours on a 2-core CPU"),
    # Real text (`compare --task text` picks it): d_k 1024 at d_model 64, a
    # smaller model than `train --task text` so four runs fit in about 10
    # minutes on 2 CPU cores. The task's own optimizer (Adam 3e-3, warmup):
    # the claim tested where a user meets it. XLA off: at d_k 1024 and 128
    # characters its compile had not finished after 3 minutes on 2 shared
    # cores; without it a step took 92 ms (64 characters, batch 16, 2
    # layers of 1 head). Two seeds measured 5.5 minutes in all (62-74 s a
    # run, 2 shared cores under a load of ~10); a third fits the 10-minute
    # budget.
    "text": Preset(
        task="text", arms=PAIR, seeds=3,
        settings=dict(d_model=64, num_layers=2, num_heads=1, seq_len=64,
                      batch_size=16, value_dim=64, steps=600, eval_every=100,
                      diagnostics_every=100, checkpoint_every=300,
                      heldout_size=256, jit_compile="off"),
        axes={"key_dim": (16, 64, 256, 1024)}, trained={"key_dim": (1024,)},
        expected="about 8 minutes on 2 CPU cores"),
    # Text for a GPU: 256 characters, d_k up to 4096 trained, every arm.
    "text-gpu": Preset(
        task="text", arms=tuple(ARMS), seeds=4, jobs=4,
        settings=dict(d_model=128, num_layers=4, num_heads=4, seq_len=256,
                      batch_size=32, value_dim=64, steps=3000, eval_every=100,
                      diagnostics_every=250, checkpoint_every=500,
                      heldout_size=1024, jit_compile="on"),
        axes={"key_dim": _INIT_KEY_DIMS}, trained={"key_dim": (1024, 4096)},
        expected="an estimate: about an hour on one GPU with --jobs 4"),
    # Claim 4 on a CPU. d_k 256, measured (one seed, 1000 steps): unscaled
    # trains at 1 layer (0.96, target at step 900) and fails at 2 and 4
    # (0.38, 0.11), scaled reaches the target at every depth; at d_k 64 both
    # train at every depth (>= 0.99): nothing to widen.
    "depth": Preset(
        task="recall", arms=PAIR, seeds=2,
        settings=dict(_COMPARISON, eval_every=100, diagnostics_every=500,
                      checkpoint_every=500, heldout_size=512),
        axes={"key_dim": (256,), "num_layers": (1, 2, 4)},
        # Measured 2026-12-02 on 2 shared cores (load 1.6-5 beside it; with
        # the length grid beside it at a load of 6-12: 14.5 minutes).
        expected="12 runs of 1000 steps, measured 7.6 minutes on 2 shared "
        "CPU cores"),
    # Claim 5 on a CPU: the 16-pair runs evaluated at 16 to 128 pairs (128
    # keys: recall's keys are distinct). Adam: with the comparison's SGD
    # (0.01, constant) no arm trained at 64 pairs in 1000 steps (all four
    # at 0.05-0.06, chance 0.0625), nor with recall's SGD 0.05 cosine
    # (0.066); Adam 3e-3 reached the target at step 400. The claim is about
    # the number of keys, not raw gradients.
    "length": Preset(
        task="recall", arms=_FOUR_ARMS, seeds=2,
        settings=dict(_LENGTH, heldout_size=512),
        axes={"key_dim": (64,), "num_pairs": (16, 64)},
        options={"length_multiples": (1, 2, 4, 8)},
        # Measured as the depth grid was (beside it: 16.0 minutes).
        expected="16 runs of 1000 steps, measured 6.5 minutes on 2 shared "
        "CPU cores"),
}
# Claims 4 and 5 as a paper would run them, for a GPU: the CPU grids with
# more seeds, the four arms and longer axes. Depth stays at d_k 256, where
# one layer trains unscaled (at 1024 the default comparison's unscaled runs
# end at 0.29 ± 0.35: little to widen).
COMPARE_PRESETS["depth_full"] = dataclasses.replace(
    COMPARE_PRESETS["depth"], arms=_FOUR_ARMS, seeds=5,
    settings=dict(COMPARE_PRESETS["depth"].settings, heldout_size=1024),
    axes={"key_dim": (256,), "num_layers": (1, 2, 4, 8)},
    expected="80 runs of 1000 steps, up to 8 layers at d_k 256: an "
    "estimate of 30-60 minutes on one GPU with --jobs 4 (not run yet)")
COMPARE_PRESETS["length_full"] = dataclasses.replace(
    COMPARE_PRESETS["length"], seeds=5,
    settings=dict(_LENGTH, num_keys=256, heldout_size=1024),
    axes={"key_dim": (64,), "num_pairs": (16, 64, 256)},
    expected="60 runs of 1000 steps at 16, 64 and 256 pairs: an "
    "estimate of 30-60 minutes on one GPU with --jobs 4 (not run yet)")

SWEEP_PRESETS = {
    # The question at d_k 1024 in minutes on 2 CPU cores. Measured on the
    # first grid (3e-4 .. 3e-1): scaled reaches the target with Adam at 3e-4
    # and 3e-3, with SGD (momentum 0.9) at 3e-2 only, and fails at 3e-1
    # with both; unscaled reached it on one seed with Adam at 3e-4, that
    # grid's edge, so 1e-4 brackets the Adam side. Diagnostics every 500
    # steps (a sweep reads the end ones), evaluations every 100: at the
    # comparison's 50, the per-run overhead was 21% of the training time.
    "quick": Preset(
        task="recall", arms=PAIR, seeds=2, jobs=2,
        settings=dict(COMPARE_PRESETS["default"].settings, steps=1000,
                      eval_every=100, diagnostics_every=500),
        axes={"optimizer": ("sgd", "adam"),
              "learning_rate": (1e-4, 3e-4, 3e-3, 3e-2, 3e-1),
              "key_dim": (1024,)},
        options={"init_key_dims": _INIT_KEY_DIMS, "init_seeds": 3},
        expected="40 runs of 1000 steps at d_k 1024, about 7 minutes on "
        "2 idle CPU cores"),
    # As a paper would run it: for a GPU.
    "full": Preset(
        task="recall", arms=("scaled", "unscaled", "qk_norm", "inverse"),
        seeds=3, jobs=2,
        settings=dict(COMPARE_PRESETS["full"].settings, steps=1000,
                      diagnostics_every=500),
        axes={"optimizer": ("sgd", "adam"),
              "learning_rate": (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1),
              "key_dim": (256, 1024)},
        options={"init_key_dims": _INIT_KEY_DIMS, "init_seeds": 5},
        expected="336 runs of 1000 steps: an hour or two on one GPU"),
}
