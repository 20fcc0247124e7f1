"""What `gpu_check.py` runs: the training runs, the grids of the
comparison and the sweep (in growing order, the last the whole preset),
and the two decisions taken from measurements during the run: which grid
fits the time left, and whether parallel runs pay on this device.

Every grid is passed to the command line as its own flags (`--arms`,
`--key-dims`, `--seeds`, ...), so the number of runs it plans is known
here rather than read from a preset.
"""

import statistics

# The arms of `keras-attention compare --arms` (its help lists them).
ARMS = ("scaled", "unscaled", "learned", "inverse", "qk_norm",
        "saturated_init", "compensated_init")
TWO_ARMS = ("scaled", "unscaled")
SWEEP_ARMS = ("scaled", "unscaled", "qk_norm", "inverse")
LEARNING_RATES = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
FULL_KEY_DIMS = (16, 64, 256, 1024, 4096)
# Parallel runs are used in the sweep only when they train at least this
# many times the steps/s of one run.
PARALLEL_WORTH = 1.25
# Share of the time left that a chosen grid's prediction may fill.
FILL = 0.9


def _csv(values):
    return ",".join(str(value) for value in values)


def compare_grid(name, preset, arms, key_dims, train_key_dims, seeds,
                 extra=()):
    """A `compare` grid: arms x trained d_k x seeds runs."""
    return dict(
        name=name, arms=len(arms), key_dims=list(train_key_dims),
        runs_per_key_dim=len(arms) * seeds, groups_per_key_dim=len(arms),
        runs=len(arms) * len(train_key_dims) * seeds,
        flags=["--preset", preset, "--arms", _csv(arms), "--key-dims",
               _csv(key_dims), "--train-key-dims", _csv(train_key_dims),
               "--seeds", str(seeds), *extra])


def sweep_grid(name, arms, optimizers, learning_rates, key_dims, seeds,
               extra=()):
    """A `sweep --preset full` grid: arms x optimizers x rates x d_k x
    seeds runs; the runs of one (arm, optimizer, d_k) share compiled steps
    within a worker."""
    per_key_dim = len(arms) * len(optimizers) * len(learning_rates) * seeds
    return dict(
        name=name, arms=len(arms), key_dims=list(key_dims),
        runs_per_key_dim=per_key_dim,
        groups_per_key_dim=len(arms) * len(optimizers),
        runs=per_key_dim * len(key_dims),
        flags=["--preset", "full", "--arms", _csv(arms), "--optimizers",
               _csv(optimizers), "--learning-rates", _csv(learning_rates),
               "--key-dims", _csv(key_dims), "--seeds", str(seeds), *extra])


# The larger model of the issue: d_model 512, 8 heads of 64, 4 layers,
# 1024 tokens (recall: 1023 pairs and the query), bf16. One probe example:
# a diagnostics call draws a labelled heat map per layer, head and probe
# example (up to 3), each a new figure with 1024 tick labels a side,
# measured at 1.7-2.5 s to draw on this project's shared 2-core CPU; with
# the default 16 probe examples that is 96 figures a call, minutes per
# call. 200 steps: diagnostics at step 0 and at the end only.
LARGE = ["--d-model", "512", "--num-heads", "8", "--key-dim", "64",
         "--num-layers", "4", "--num-pairs", "1023", "--num-keys", "1024",
         "--precision", "mixed_bfloat16", "--probe-size", "1",
         "--steps", "200"]

FULL = dict(
    train=[("recall-default", []), ("recall-large", LARGE)],
    tiny=[],
    steps={"compare_full": 2000, "sweep": 1000},
    ref_key_dim=1024,
    compare_default=compare_grid("default", "default", TWO_ARMS,
                                 (16, 64, 256, 1024), (1024,), 3),
    compare_full=[
        compare_grid("2 arms, d_k 1024/4096, 1 seed", "full", TWO_ARMS,
                     FULL_KEY_DIMS, (1024, 4096), 1),
        compare_grid("2 arms, d_k 1024/4096, 3 seeds", "full", TWO_ARMS,
                     FULL_KEY_DIMS, (1024, 4096), 3),
        compare_grid("7 arms, d_k 1024/4096, 3 seeds", "full", ARMS,
                     FULL_KEY_DIMS, (1024, 4096), 3),
        compare_grid("7 arms, every d_k, 3 seeds", "full", ARMS,
                     FULL_KEY_DIMS, FULL_KEY_DIMS, 3),
        compare_grid("the whole preset", "full", ARMS, FULL_KEY_DIMS,
                     FULL_KEY_DIMS, 5),
    ],
    sweep=[
        sweep_grid("2 arms, adam, 7 rates, d_k 1024, 1 seed", TWO_ARMS,
                   ("adam",), LEARNING_RATES, (1024,), 1),
        sweep_grid("2 arms, sgd+adam, d_k 1024, 1 seed", TWO_ARMS,
                   ("sgd", "adam"), LEARNING_RATES, (1024,), 1),
        sweep_grid("2 arms, sgd+adam, d_k 1024, 3 seeds", TWO_ARMS,
                   ("sgd", "adam"), LEARNING_RATES, (1024,), 3),
        sweep_grid("4 arms, sgd+adam, d_k 1024, 3 seeds", SWEEP_ARMS,
                   ("sgd", "adam"), LEARNING_RATES, (1024,), 3),
        sweep_grid("the whole preset", SWEEP_ARMS, ("sgd", "adam"),
                   LEARNING_RATES, (256, 1024), 3),
    ],
    verdict_pattern={"compare": r"^Claim \d", "sweep": r"^\w+, d_k \d+: "},
)

# Tiny models and 8 steps: every stage's code path on a CPU.
_TINY_RUN = ["--d-model", "16", "--batch-size", "8", "--heldout-size", "32",
             "--probe-size", "4", "--steps", "8"]
_TINY_TASK = ["--num-pairs", "4", "--num-keys", "8", "--num-values", "4"]
_VARIANCE = ["--variance-samples", "100"]
SMOKE = dict(
    FULL,
    train=[("recall-default", ["--key-dim", "8", *_TINY_RUN, *_TINY_TASK]),
           # Labels of one width (a recall probe whose examples' labels
           # differ in width fails to stack its heat maps).
           ("recall-large", ["--d-model", "32", "--num-heads", "2",
                             "--key-dim", "16", "--num-layers", "2",
                             "--num-pairs", "7", "--num-keys", "8",
                             "--num-values", "4",
                             "--precision", "mixed_bfloat16",
                             *_TINY_RUN[2:]])],
    tiny=_TINY_RUN + _TINY_TASK,
    steps={"compare_full": 8, "sweep": 8},
    ref_key_dim=8,
    compare_default=compare_grid("default", "default", TWO_ARMS, (8,), (8,),
                                 1, _VARIANCE),
    compare_full=[
        compare_grid("2 arms, d_k 8, 1 seed", "full", TWO_ARMS, (8,), (8,),
                     1, _VARIANCE),
        compare_grid("7 arms, d_k 8, 1 seed", "full", ARMS, (8,), (8,), 1,
                     _VARIANCE),
    ],
    sweep=[
        sweep_grid("2 arms, sgd, 1 rate, d_k 8", TWO_ARMS, ("sgd",),
                   (0.1,), (8,), 1, ["--init-key-dims", "none"]),
        sweep_grid("2 arms, sgd, 2 rates, d_k 8", TWO_ARMS, ("sgd",),
                   (0.01, 0.1), (8,), 1, ["--init-key-dims", "none"]),
    ],
)


def settings(smoke):
    return SMOKE if smoke else FULL


def predict_seconds(measured, grid, steps, speedup, overhead_s,
                    pause_scale=1.0, compile_every_run=True):
    """Predicted seconds of a grid of runs from `measured` runs' facts.

    A run costs its first step (once per shape group when the steps are
    reused), `steps` steady steps at the measured rate, scaled up by d_k
    past the measured one (a conservative reading: small models are
    overhead-bound on a GPU), and the measured pauses times `pause_scale`;
    `speedup` is what parallel runs gain, `overhead_s` the command's own.
    """
    first = statistics.median(run["first_step_s"] for run in measured)
    per_step = statistics.median(
        (run["train_time_s"] - run["first_step_s"]) / max(run["steps"] - 1, 1)
        for run in measured)
    pause = statistics.median(run["wall_time_s"] - run["train_time_s"]
                              for run in measured)
    measured_dk = max(run["key_dim"] for run in measured)
    total = 0.0
    for key_dim in grid["key_dims"]:
        scale = max(1.0, key_dim / measured_dk)
        runs = grid["runs_per_key_dim"]
        compiles = runs if compile_every_run else grid["groups_per_key_dim"]
        total += (runs * (steps * per_step * scale + pause * pause_scale)
                  + compiles * first)
    return total / speedup + overhead_s


# How the runs measured in the default comparison (1000 steps at d_k 1024,
# held-out set 512, evaluation and diagnostics every 50 steps, each run
# compiling its own steps) predict the other grids:
# - the full comparison's runs: 2000 steps, the same 21 evaluations and
#   diagnostics on twice the held-out set (pauses x 1.5); its own overhead
#   (initial statistics and report) grows with the arms;
# - the sweep's: 1000 steps, 11 evaluations and 3 diagnostics (pauses x
#   0.6), compiled steps reused within a worker; its overhead (the picture
#   at init over 5 d_k and 5 seeds, figures) about 1.5 comparisons'.
def predict_full_compare(default, grid, steps):
    overhead = default["seconds"] - default["training_window_s"]
    return predict_seconds(default["runs"], grid, steps, speedup=1.0,
                           overhead_s=overhead * grid["arms"] / 2,
                           pause_scale=1.5)


def predict_sweep(default, grid, steps, speedup):
    overhead = default["seconds"] - default["training_window_s"]
    return predict_seconds(default["runs"], grid, steps, speedup=speedup,
                           overhead_s=1.5 * overhead, pause_scale=0.6,
                           compile_every_run=False)


def choose(grids, available_s, predict):
    """The largest of `grids` (in growing order) whose `predict(grid)`
    seconds fit in `FILL * available_s` (or None), and the record of the
    choice: every grid's prediction, in order, and the time left."""
    predictions = [dict(grid=grid["name"], runs=grid["runs"],
                        predicted_s=predict(grid)) for grid in grids]
    fitting = [grid for grid, row in zip(grids, predictions)
               if row["predicted_s"] <= FILL * available_s]
    return (fitting[-1] if fitting else None), dict(
        predictions=predictions, available_s=available_s)


def jobs_choice(one_at_a_time, parallel, jobs, key_dim):
    """Whether `jobs` runs at once train enough faster than one.

    Compares the median steady steps/s of the runs at `key_dim` trained
    one at a time (`one_at_a_time`) and `jobs` at a time (`parallel`), the
    same model either way. Returns a sentence and `{"jobs", "factor"}`:
    the sweep's workers and the speed-up its prediction assumes.
    """
    def rate(runs):
        rates = [run["steps_per_s"] for run in runs
                 if run["key_dim"] == key_dim]
        return statistics.median(rates) if rates else None

    alone, together = rate(one_at_a_time), rate(parallel)
    if jobs == 1 or alone is None or together is None:
        return (f"no measurement of parallel runs at d_k {key_dim}: one "
                "worker", {"jobs": 1, "factor": 1.0})
    factor = jobs * together / alone
    chosen = jobs if factor >= PARALLEL_WORTH else 1
    return (f"{jobs} runs at once trained {factor:.2f}x the steps/s of one "
            f"(d_k {key_dim}: {together:.1f} steps/s each against "
            f"{alone:.1f} alone); the sweep uses {chosen} worker(s)",
            {"jobs": chosen, "factor": factor if chosen > 1 else 1.0,
             "measured_factor": factor})
