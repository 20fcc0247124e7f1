"""The arms of a comparison and the ready-made comparisons (presets).

An arm is what one run changes in the training config (the scale, q/k
normalization, the W_Q, W_K gain); a preset is a whole comparison: key dims,
arms, seeds and the training settings under which the lesson's claims can be
measured.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm of the comparison: what it changes in the training config.

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
    )
}


@dataclasses.dataclass(frozen=True)
class Preset:
    """A ready-made comparison.

    Attributes:
        key_dims: d_k values measured at init.
        train_key_dims: d_k values trained (`None`: all of `key_dims`).
        arms: arm names.
        seeds: number of seeds (0 .. seeds - 1).
        train: `TrainConfig` fields for the preset's task; flags and
            `--config` override them.
        expected: the expected wall time, for `--help` and the report.
    """

    key_dims: tuple
    train_key_dims: tuple
    arms: tuple
    seeds: int
    train: dict
    expected: str


# Settings under which the lesson's assumption holds at init (pre-LN blocks:
# unit-variance attention inputs; W_Q, W_K ~ N(0, 1/d_model): unit-variance
# q and k components) and under which SGD with momentum, which does not
# rescale gradients per parameter the way Adam does, sees the raw effect of
# the scale on the gradients.
_RECALL_SETTINGS = dict(
    task="recall",
    num_pairs=16,
    num_keys=64,
    num_values=16,
    d_model=64,
    num_layers=1,
    num_heads=1,
    # The values do not enter the scores; keeping them at d_model instead of
    # d_k halves the cost of a step at large d_k.
    value_dim=64,
    norm="pre",
    qk_init_std="unit",
    optimizer="sgd",
    learning_rate=0.01,
    momentum=0.9,
    warmup_steps=0,
    lr_schedule="constant",
    batch_size=64,
    # XLA: measured on one CPU core, a d_k 1024 step takes 111 ms compiled
    # against 147 ms without, which pays for the compile within a run.
    jit_compile="on",
)

# The settings a preset keeps when the task is not its own: the schedule of
# the comparison, not the model and optimizer that suit the preset's task.
SCHEDULE_FIELDS = ("steps", "eval_every", "diagnostics_every",
                   "checkpoint_every", "heldout_size")

PRESETS = {
    # The README's demo: init statistics at four d_k (cheap), training at
    # the largest with three seeds.
    "default": Preset(
        key_dims=(16, 64, 256, 1024),
        train_key_dims=(1024,),
        arms=("scaled", "unscaled"),
        seeds=3,
        train=dict(
            _RECALL_SETTINGS,
            steps=1000,
            # 21 points a curve (step 0 and every 50). A diagnostics call
            # (probe, dashboard summary, TensorBoard summaries) took 30-43
            # ms at d_k 1024 against 17-20 ms a step (bench_train's
            # instrument, 2 shared cores): 2.9-4.8% of training time.
            eval_every=50,
            diagnostics_every=50,
            checkpoint_every=500,
            heldout_size=512,
        ),
        # Six runs of 1000 steps at d_k 1024, about 16 s each with XLA on 2
        # idle cores; init probes, figures and the report take the rest
        # (measured: 112 s in all).
        expected="about 2 minutes on 2 idle CPU cores",
    ),
    # Every arm trained at every d_k, five seeds: for a GPU, or a CPU with
    # time to spare (use --jobs N to run N runs at once).
    "full": Preset(
        key_dims=(16, 64, 256, 1024, 4096),
        train_key_dims=None,
        arms=tuple(ARMS),
        seeds=5,
        train=dict(
            _RECALL_SETTINGS,
            steps=2000,
            # 21 points a curve, as in the default preset.
            eval_every=100,
            diagnostics_every=100,
            checkpoint_every=500,
            heldout_size=1024,
        ),
        expected=(
            "175 runs of 2000 steps; roughly 30-60 minutes on one GPU with "
            "--jobs 4 (an estimate: a step of this small model is "
            "overhead-bound on a GPU), many hours on a 2-core CPU"
        ),
    ),
}
