"""The arms of a grid and the ready-made grids (presets) of `compare` and
`sweep`, from one table.

An arm is what one run changes in the training config (the scale, q/k
normalization, the W_Q, W_K gain). A preset is a whole grid: its axes, arms,
seeds and the training settings under which the lesson's claims can be
measured. A preset's settings are laid over `TASK_DEFAULTS[task]` (see
`pipelines.settings`), so every value a preset gives is one where the
comparison deliberately differs from a plain `train`, with the reason
beside it.
"""

import dataclasses

from pipelines.settings import TASK_DEFAULTS


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm of a grid: what it changes in the training config.

    Attributes:
        name: the arm's name on the command line and in run directories.
        description: one line for the report.
        scale: the attention `scale` of the arm.
        qk_norm: whether queries and keys are layer-normalized.
        gain_exponent: W_Q and W_K are multiplied by `key_dim ** exponent`
            (on top of `--qk-init-gain`).
    """

    name: str
    description: str
    scale: str = "sqrt"
    qk_norm: bool = False
    gain_exponent: float = 0.0

    @property
    def mode(self):
        """The scale mode the arm stands for in a picture at init (`sqrt`,
        `none`, `qk_norm`, ...): its scale, or `qk_norm`; None for an arm
        that changes the initial weights."""
        if self.gain_exponent:
            return None
        return "qk_norm" if self.qk_norm else self.scale

    def overrides(self, key_dim, base_gain):
        """The `TrainConfig` fields this arm sets for `key_dim`."""
        return {
            "scale": self.scale,
            "qk_norm": self.qk_norm,
            "qk_init_gain": float(base_gain) * float(key_dim) ** self.gain_exponent,
            "arm": self.name,
        }


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

# The two arms every claim and verdict compares: the standard attention,
# then the same model without the scale.
PAIR = ("scaled", "unscaled")
# Scale mode -> the arm that stands for it (`Arm.mode`).
MODE_ARMS = {arm.mode: name for name, arm in ARMS.items() if arm.mode}

# Settings the arms set per run: a grid refuses them as flags.
ARM_SETTINGS = ("scale", "qk_norm", "arm")


@dataclasses.dataclass(frozen=True)
class Preset:
    """A ready-made grid.

    Attributes:
        task: the task whose defaults `settings` are laid over.
        settings: `TrainConfig` fields where the grid differs from
            `TASK_DEFAULTS[task]`; the config file and flags override them.
        axes: `{setting: values}`, the grid's axes besides arms and seeds.
        arms: arm names.
        seeds: number of seeds (0 .. seeds - 1).
        expected: the expected wall time, for `--help` and the report.
        trained: `{setting: values}`: runs with other values of the setting
            are measured at init only (compare's cheap init statistics).
        jobs: runs trained at once by default.
        options: the report's own options (`variance_samples`, ...; a
            compare preset may name its `claims`, by default all of
            `pipelines.compare.claims`).
    """

    task: str
    settings: dict
    axes: dict
    arms: tuple
    seeds: int
    expected: str
    trained: dict = dataclasses.field(default_factory=dict)
    jobs: int = 1
    options: dict = dataclasses.field(default_factory=dict)

    def layer_values(self, task):
        """The settings this preset gives a grid on `task`: all of them on
        its own task; on another, only the schedule (the model and optimizer
        of the preset suit its task, the others keep their own defaults)."""
        if task == self.task:
            return {"task": self.task, **self.settings}
        return {name: self.settings[name] for name in SCHEDULE_FIELDS
                if name in self.settings}


# The settings a preset keeps when the task is not its own.
SCHEDULE_FIELDS = ("steps", "eval_every", "diagnostics_every",
                   "checkpoint_every", "heldout_size")

# Where the comparison differs from `TASK_DEFAULTS["recall"]`, and why. The
# task defaults make a plain `train` at d_k 64 reach 100% from step 600; the
# comparison trains at d_k up to 4096 and measures what the scale does to
# the gradients, so:
_COMPARISON = dict(
    # A constant rate without warmup: every arm sees the same rate at every
    # step, so the curves differ by the scale alone and not by where a run
    # is in a schedule; and the first steps, where unscaled attention
    # starts saturated, are not softened by a small warm-up rate.
    learning_rate=0.01,
    warmup_steps=0,
    lr_schedule="constant",
    # The values do not enter the scores; keeping them at d_model instead of
    # d_k halves the cost of a step at large d_k.
    value_dim=64,
    # XLA: measured on one CPU core, a d_k 1024 step takes 111 ms compiled
    # against 147 ms without, which pays for the compile within a run.
    jit_compile="on",
)
assert TASK_DEFAULTS["recall"]["optimizer"] == "sgd", (
    "the comparison's claims are about raw gradients: SGD, which does not "
    "rescale them per parameter as Adam does")

_INIT_KEY_DIMS = (16, 64, 256, 1024, 4096)
# The CPU depth and length grids' times, measured 2026-12-02 on 2 cores
# that other jobs shared (load average 1.6-5 beside each; the two side by
# side at a load of 6-12 took 14.5 and 16.0 minutes).
DEPTH_EXPECTED = ("12 runs of 1000 steps, measured 7.6 minutes on 2 shared "
                  "CPU cores")
LENGTH_EXPECTED = ("16 runs of 1000 steps, measured 6.5 minutes on 2 shared "
                   "CPU cores")
# The length grids' training (see the length preset).
_LENGTH = dict(_COMPARISON, optimizer="adam", learning_rate=3e-3,
               warmup_steps=100, lr_schedule="cosine", num_keys=128,
               eval_every=100, diagnostics_every=500, checkpoint_every=500)

COMPARE_PRESETS = {
    # The demo in docs/experiments.md: init statistics at four d_k (cheap), training at
    # the largest with three seeds.
    "default": Preset(
        task="recall",
        settings=dict(
            _COMPARISON,
            # 21 points a curve (step 0 and every 50). A diagnostics call
            # (probe, dashboard summary, TensorBoard summaries) took 30-43
            # ms at d_k 1024 against 17-20 ms a step (bench_train's
            # instrument, 2 shared cores): 2.9-4.8% of training time.
            eval_every=50,
            diagnostics_every=50,
            checkpoint_every=500,
            heldout_size=512,
        ),
        axes={"key_dim": (16, 64, 256, 1024)},
        trained={"key_dim": (1024,)},
        arms=("scaled", "unscaled"),
        seeds=3,
        options={"variance_samples": 20000},
        # Six runs of 1000 steps at d_k 1024, about 16 s each with XLA on 2
        # idle cores; init probes, figures and the report take the rest.
        expected="about 2-3 minutes on 2 idle CPU cores",
    ),
    # Every arm trained at every d_k, five seeds: for a GPU, or a CPU with
    # time to spare (use --jobs N to run N runs at once).
    "full": Preset(
        task="recall",
        settings=dict(_COMPARISON, steps=2000, eval_every=100,
                      diagnostics_every=100, checkpoint_every=500,
                      heldout_size=1024),
        axes={"key_dim": _INIT_KEY_DIMS},
        arms=tuple(ARMS),
        seeds=5,
        options={"variance_samples": 20000},
        expected=(
            "200 runs of 2000 steps; roughly 35-70 minutes on one GPU with "
            "--jobs 4 (an estimate: a step of this small model is "
            "overhead-bound on a GPU), many hours on a 2-core CPU"
        ),
    ),
    # Real text (`--task text`, chosen by `compare --task text` without a
    # --preset): the recall comparison's d_k 1024 at d_model 64, on a
    # smaller text model than a plain `train --task text` so that four runs
    # fit in about 10 minutes on 2 CPU cores. The task's own optimizer
    # (Adam, 3e-3 with warmup): on text that is how the model is trained,
    # so the claim is tested where a user would meet it. XLA off: at d_k
    # 1024 and 128 characters its compile had not finished after 3 minutes
    # on the shared 2 cores; without it a step took 92 ms (64 characters,
    # batch 16, 2 layers of 1 head).
    "text": Preset(
        task="text",
        settings=dict(
            d_model=64, num_layers=2, num_heads=1, seq_len=64,
            batch_size=16, value_dim=64, steps=600, eval_every=100,
            diagnostics_every=100, checkpoint_every=300, heldout_size=256,
            jit_compile="off",
        ),
        axes={"key_dim": (16, 64, 256, 1024)},
        trained={"key_dim": (1024,)},
        arms=("scaled", "unscaled"),
        # Two seeds measured 5.5 minutes in all (62-74 s a run, 2 shared
        # cores under a load of ~10); a third fits the 10-minute budget.
        seeds=3,
        options={"variance_samples": 20000},
        expected="about 8 minutes on 2 CPU cores",
    ),
    # Text for a GPU: 256 characters, d_k up to 4096 trained, every arm,
    # four seeds, 3000 steps (an estimate, not measured here).
    "text-gpu": Preset(
        task="text",
        settings=dict(
            d_model=128, num_layers=4, num_heads=4, seq_len=256,
            batch_size=32, value_dim=64, steps=3000, eval_every=100,
            diagnostics_every=250, checkpoint_every=500, heldout_size=1024,
            jit_compile="on",
        ),
        axes={"key_dim": _INIT_KEY_DIMS},
        trained={"key_dim": (1024, 4096)},
        arms=tuple(ARMS),
        seeds=4,
        jobs=4,
        options={"variance_samples": 20000},
        expected="an estimate: about an hour on one GPU with --jobs 4",
    ),
    # Claim 4 on a CPU: scaled vs unscaled at 1, 2 and 4 layers. d_k 256:
    # measured (one seed, 1000 steps), unscaled attention trains at 1 layer
    # (0.96, target at step 900) and fails at 2 and 4 (0.38, 0.11) while
    # scaled reaches the target at every depth; at d_k 64 both arms train
    # at every depth (>= 0.99), so depth has nothing to widen there.
    "depth": Preset(
        task="recall",
        settings=dict(_COMPARISON, eval_every=100, diagnostics_every=500,
                      checkpoint_every=500, heldout_size=512),
        axes={"key_dim": (256,), "num_layers": (1, 2, 4)},
        arms=("scaled", "unscaled"),
        seeds=2,
        options={"variance_samples": 20000},
        expected=DEPTH_EXPECTED,
    ),
    # Claim 5 on a CPU: four scales trained at 16 and 64 pairs, the 16-pair
    # runs evaluated at 16 to 128 pairs (128 keys: recall's keys are
    # distinct), and the init curves at d_k 64. Adam, as the positional
    # tasks train: with the comparison's SGD (0.01, constant) no arm
    # trained at 64 pairs in 1000 steps (measured: all four at 0.05-0.06,
    # chance 0.0625), nor with the recall defaults (SGD 0.05, cosine:
    # 0.066); Adam 3e-3 reached the target at step 400. The claim is about
    # the number of keys, not the raw gradients SGD keeps.
    "length": Preset(
        task="recall",
        settings=dict(_LENGTH, heldout_size=512),
        axes={"key_dim": (64,), "num_pairs": (16, 64)},
        arms=("scaled", "unscaled", "qk_norm", "ssmax"),
        seeds=2,
        options={"variance_samples": 20000,
                 "length_multiples": (1, 2, 4, 8)},
        expected=LENGTH_EXPECTED,
    ),
    # Claims 4 and 5 as a paper would run them: for a GPU.
    "depth_full": Preset(
        task="recall",
        settings=dict(_COMPARISON, eval_every=100, diagnostics_every=500,
                      checkpoint_every=500, heldout_size=1024),
        # d_k 256, where one layer trains without the scale (at 1024 the
        # default comparison's unscaled runs end at 0.29 ± 0.35, so depth
        # has little gap left to widen); claim 4 reads one d_k.
        axes={"key_dim": (256,), "num_layers": (1, 2, 4, 8)},
        arms=("scaled", "unscaled", "qk_norm", "ssmax"),
        seeds=5,
        options={"variance_samples": 20000},
        expected="80 runs of 1000 steps, up to 8 layers at d_k 256: an "
        "estimate of 30-60 minutes on one GPU with --jobs 4 (not run yet)",
    ),
    "length_full": Preset(
        task="recall",
        settings=dict(_LENGTH, num_keys=256, heldout_size=1024),
        axes={"key_dim": (64,), "num_pairs": (16, 64, 256)},
        arms=("scaled", "unscaled", "qk_norm", "ssmax"),
        seeds=5,
        options={"variance_samples": 20000,
                 "length_multiples": (1, 2, 4, 8)},
        expected="60 runs of 1000 steps at 16, 64 and 256 pairs: an "
        "estimate of 30-60 minutes on one GPU with --jobs 4 (not run yet)",
    ),
}

SWEEP_PRESETS = {
    # The question at d_k 1024 within minutes on 2 CPU cores: both
    # optimizers, five learning rates from 1e-4 to 3e-1, and 1000 steps, the
    # budget of the comparison. Measured on the first grid (3e-4 .. 3e-1):
    # the scaled model reaches the target with Adam at 3e-4 and 3e-3 and
    # with SGD (momentum 0.9) at 3e-2 only, and fails at 3e-1 with both, so
    # its working range is bracketed on both sides for SGD; unscaled
    # attention reached the target on one seed with Adam at 3e-4, the edge
    # of that grid, so 1e-4 brackets the Adam side too. Two seeds give a
    # spread. Diagnostics every 500 steps (a sweep reads only the end ones)
    # and evaluations every 100: measured on this grid at the comparison's
    # every 50 steps, the per-run overhead was 21% of the training time.
    "quick": Preset(
        task="recall",
        settings=dict(COMPARE_PRESETS["default"].settings, steps=1000,
                      eval_every=100, diagnostics_every=500),
        axes={"optimizer": ("sgd", "adam"),
              "learning_rate": (1e-4, 3e-4, 3e-3, 3e-2, 3e-1),
              "key_dim": (1024,)},
        arms=("scaled", "unscaled"),
        seeds=2,
        jobs=2,
        options={"init_key_dims": _INIT_KEY_DIMS, "init_seeds": 3},
        expected="40 runs of 1000 steps at d_k 1024, about 7 minutes on "
        "2 idle CPU cores",
    ),
    # The grid of the question as a paper would run it: for a GPU.
    "full": Preset(
        task="recall",
        settings=dict(COMPARE_PRESETS["full"].settings, steps=1000,
                      diagnostics_every=500),
        axes={"optimizer": ("sgd", "adam"),
              "learning_rate": (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1),
              "key_dim": (256, 1024)},
        arms=("scaled", "unscaled", "qk_norm", "inverse"),
        seeds=3,
        jobs=2,
        options={"init_key_dims": _INIT_KEY_DIMS, "init_seeds": 5},
        expected="336 runs of 1000 steps: an hour or two on one GPU",
    ),
}
