"""Scaled vs unscaled attention, side by side: the lesson's claims, measured.

    keras-attention compare
    keras-attention compare --task recall --key-dims 16,256,1024 \\
        --arms scaled,unscaled --seeds 3 --steps 1000 --logdir runs/compare

Trains the same model on the same data from the same initial weights with
and without the 1/sqrt(d_k) score scale (and, on request, with control
arms), and measures the three claims of the lesson:

1. if q and k have independent unit-variance components, Var(q.k) = d_k,
   and dividing by sqrt(d_k) brings it back to 1;
2. unscaled scores grow with d_k and push the softmax into saturation
   (nearly one-hot rows, low entropy);
3. in saturation the gradient at the softmax input vanishes and learning
   slows or stops, while the scaled model keeps learning.

Every (arm, key_dim, seed) is a training run of `keras-attention train` in
`LOGDIR/<arm>-dk<key_dim>-seed<seed>/`. Runs of the same key_dim and seed get
the same data stream and the same initial weights (the arms add or rescale
nothing but what defines them), and the same optimizer. A run that is
already complete is not trained again, so an interrupted comparison resumes
where it stopped. Key dims listed in `--key-dims` but not in
`--train-key-dims` are measured at initialization only (claims 1 and 2 need
no training), which keeps the default demo within a few minutes on a CPU.

Outputs, all under `--logdir`:

    comparison.json    every run's final accuracy, steps to target and the
                       diagnostics at init and at the end
    comparison.md      tables per key_dim (arms side by side, mean ± sd over
                       seeds), the ratios that test each claim, a verdict
                       per claim, the variance table, the figures and the
                       heat maps
    comparison.html    the same report as one self-contained page, figures
                       inline as SVG (opens offline)
    figures/*.png      held-out accuracy over steps (mean ± sd per arm);
                       entropy, score std and gradient ratios at init over
                       d_k; the probe example's labelled attention, both
                       arms and their difference, at init and at the end
    heatmaps/*.png     labelled probe attention at init and at the end, per
                       arm, at the largest trained key_dim
    <run>/...          each run's TensorBoard logs; <run>/compare/ adds the
                       HParams metrics (final accuracy, steps to target,
                       initial entropy and score std)
    claims/<arm>/      TensorBoard scalars over d_k (the "step" axis is d_k)
    curves/<arm>-dk<d>/  the arm's held-out curves, mean and ± sd over seeds,
                       with a custom-scalars layout (one margin chart per
                       metric, every arm in it)
    events.*           the HParams experiment (arm, key_dim, seed)

`tensorboard --logdir LOGDIR` then overlays the runs' curves and compares
them in the HParams dashboard.

The package (floor 3, pipelines): arms, plan, runner, claims, series,
tensorboard, measure, formats, verdicts, report, figures and page, each
importing only those before it;
they may import keras_attention and the pipelines below them (common,
config, flags, builders, devices, run_dir, locks, failures, tensorboard,
train, variance), never pipelines.cli.
"""

import json
import os
import time

from pipelines.common import write_json_atomic
from pipelines.common import write_text_atomic
from pipelines.compare.arms import ARMS
from pipelines.compare.arms import PRESETS
from pipelines.compare.arms import Arm
from pipelines.compare.arms import Preset
from pipelines.compare.claims import evaluate_claims
from pipelines.compare.figures import write_figures
from pipelines.compare.measure import collect
from pipelines.compare.measure import probe_at_init
from pipelines.compare.measure import probe_trained
from pipelines.compare.page import render_page
from pipelines.compare.plan import ComparisonPlan
from pipelines.compare.plan import RunSpec
from pipelines.compare.plan import plan_from_args
from pipelines.compare.report import build_comparison
from pipelines.compare.report import key_dim_table
from pipelines.compare.report import render_report
from pipelines.compare.runner import check_run_directory
from pipelines.compare.runner import train_one
from pipelines.compare.runner import train_runs
from pipelines.compare.series import collect_curves
from pipelines.compare.series import figure_data
from pipelines.compare.tensorboard import write_claim_scalars
from pipelines.compare.tensorboard import write_curve_scalars
from pipelines.compare.tensorboard import write_experiment
from pipelines.compare.verdicts import status_word
from pipelines.flags import add_train_arguments
from pipelines.locks import owning_logdir
from pipelines.variance import variance_table

COMPARISON_JSON = "comparison.json"
COMPARISON_MD = "comparison.md"
COMPARISON_HTML = "comparison.html"

__all__ = [
    "ARMS", "PRESETS", "Arm", "Preset", "ComparisonPlan", "RunSpec",
    "plan_from_args", "probe_at_init", "probe_trained", "train_one",
    "compare", "evaluate_claims", "render_report", "summary_text",
    "add_arguments", "run",
]


def compare(plan, log=print):
    """Runs a comparison: trains what is missing, measures, writes the
    report.

    Args:
        plan: a `ComparisonPlan` (see `plan_from_args`).
        log: a function receiving progress lines.

    Returns:
        The `comparison.json` document (a dict).

    Raises:
        RunDirectoryBusy: when another process holds `plan.logdir`.
        EnvironmentFailure: when a write is refused.
    """
    # Refused before the lock is taken: a refused rerun leaves `.lock` (and
    # the pid in it) as it was.
    for spec in plan.runs():
        if spec.trained:
            check_run_directory(spec)
    with owning_logdir(plan.logdir):
        return _compare(plan, log)


def _compare(plan, log):
    started = time.time()
    os.makedirs(plan.logdir, exist_ok=True)
    trained_now = train_runs(plan, log=log)
    results = collect(plan, log=log)
    variance_rows = (
        variance_table(plan.key_dims, plan.variance_samples, seed=0)
        if plan.variance_samples
        else []
    )
    claims = evaluate_claims(plan, results, variance_rows)
    curves = collect_curves(plan)
    write_experiment(plan.logdir, plan)
    write_claim_scalars(plan.logdir, results)
    write_curve_scalars(plan.logdir, curves)
    wall_time_s = time.time() - started
    document = build_comparison(plan, results, variance_rows, claims,
                                wall_time_s)
    document["trained_now"] = trained_now
    document["curves"] = curves
    document["figures"] = figure_data(plan, results)
    json_path = os.path.join(plan.logdir, COMPARISON_JSON)
    write_json_atomic(json_path, document)
    # The figures are drawn from the file just written: one source for the
    # pictures and the numbers.
    with open(json_path, encoding="utf-8") as handle:
        figures = write_figures(plan.logdir, json.load(handle))
    report = render_report(plan, results, variance_rows, claims, wall_time_s,
                           trained_now, figures, COMPARISON_HTML)
    write_text_atomic(os.path.join(plan.logdir, COMPARISON_MD), report)
    write_text_atomic(
        os.path.join(plan.logdir, COMPARISON_HTML),
        render_page(plan.logdir, report, figures,
                    f"Scaled vs unscaled attention on {plan.base.task}"),
    )
    return document


def summary_text(plan, document):
    """What the command prints: per-key_dim tables and the verdicts."""
    results = {
        "runs": document["runs"],
        "init_only": document["init_only"],
        "heatmaps": document["heatmaps"],
    }
    claims = document["claims"]
    lines = []
    for key_dim in reversed(plan.key_dims):
        trained = key_dim in plan.train_key_dims
        lines += [
            f"d_k = {key_dim}" + ("" if trained else " (init only)"),
            *key_dim_table(plan, results, key_dim),
            "",
        ]
    for number in ("1", "2", "3"):
        lines.append(f"Claim {number}: {status_word(claims[number]['holds'])}")
    return "\n".join(lines)


# ---------------------------------------------------------- command line
def add_arguments(parser):
    """Adds the `compare` flags, and every `train` flag, to a parser."""
    group = parser.add_argument_group("comparison")
    group.add_argument(
        "--preset", default="default", metavar="{" + ",".join(PRESETS) + "}",
        help="default: init statistics at d_k 16,64,256,1024 and scaled vs "
        f"unscaled trained at 1024 with 3 seeds ({PRESETS['default'].expected});"
        " full: every arm trained at d_k 16..4096 with 5 seeds "
        f"({PRESETS['full'].expected})",
    )
    group.add_argument("--key-dims", metavar="D1,D2,...",
                       help="d_k values (given: all are trained unless "
                       "--train-key-dims says otherwise)")
    group.add_argument("--train-key-dims", metavar="D1,D2,...|all",
                       help="d_k values to train; the others are measured at "
                       "init only")
    group.add_argument("--arms", metavar="A1,A2,...",
                       help="arms to compare, from: " + ", ".join(ARMS)
                       + " (default: scaled,unscaled)")
    group.add_argument("--seeds", metavar="N|S1,S2,...",
                       help="number of seeds (0..N-1) or a list of seeds")
    group.add_argument("--jobs", metavar="N",
                       help="runs trained at once, each in its own process "
                       "(default: 1, in this process)")
    group.add_argument("--variance-samples", default="20000", metavar="N",
                       help="random (q, k) pairs per d_k for the variance "
                       "table (0: none; default: %(default)s)")
    add_train_arguments(parser)
    return parser


def run(args):
    """Runs `keras-attention compare`; prints the tables and verdicts."""
    plan = plan_from_args(args)
    trained = sum(spec.trained for spec in plan.runs())
    print(
        f"Comparing {', '.join(plan.arms)} on {plan.base.task}: {trained} "
        f"training runs of {plan.base.steps} steps (d_k "
        f"{', '.join(map(str, plan.train_key_dims))}; seeds "
        f"{', '.join(map(str, plan.seeds))}), init statistics at d_k "
        f"{', '.join(map(str, plan.key_dims))}; logs in {plan.logdir}",
        flush=True,
    )
    document = compare(plan, log=lambda line: print(line, flush=True))
    print()
    print(summary_text(plan, document))
    print()
    print(f"Report: {os.path.join(plan.logdir, COMPARISON_MD)} "
          f"({document['wall_time_s']:.0f} s); with its figures, offline: "
          f"{os.path.join(plan.logdir, COMPARISON_HTML)}")
    print(f"TensorBoard: tensorboard --logdir {plan.logdir}")
    return 0
