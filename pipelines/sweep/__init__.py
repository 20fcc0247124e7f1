"""A learning-rate sweep: does the score scale still matter once the
learning rate is tuned?

    keras-attention sweep                         # the quick default, CPU
    keras-attention sweep --arms scaled,unscaled,qk_norm,inverse \\
        --optimizers sgd,adam --learning-rates 1e-4,3e-4,1e-3,3e-3,1e-2,3e-2,1e-1 \\
        --key-dims 256,1024 --seeds 3 --steps 1000 --logdir runs/sweep

Trains the comparison's model on its task (`pipelines.compare`'s arms and
preset settings) over a grid of (arm, optimizer, learning rate, d_k, seed),
each run a directory `LOGDIR/<arm>-<optimizer>-lr<lr>-dk<d_k>-seed<seed>/`
as `train` writes it. Finished runs are skipped, so an interrupted sweep
resumes. `--jobs N` trains in N worker processes; each worker trains its
runs one after another and reuses the compiled step of the previous run
when the shapes match (`reuse`), so a run pays for no new process, build or
compile. Then, under `LOGDIR`:

    sweep.json, sweep.md, sweep.html   the document, the report, the same
                                       report self-contained (figures inline)
    figures/*.png                      loss and accuracy against the learning
                                       rate, LR sensitivity, max logit and
                                       entropy, the d_k picture at init
    events.*                           the HParams experiment (arm, optimizer,
                                       learning rate, d_k, seed; end metrics
                                       in each <run>/sweep/)

The package (floor 3, pipelines): reuse, plan, runner, analysis,
init_picture, figures, tensorboard and report; they import keras_attention,
pipelines.common, config, builders, steps, train, tensorboard, run_dir and
compare, never pipelines.cli.
"""

import os
import resource
import time

from pipelines.common import write_bytes_atomic
from pipelines.common import write_json_atomic
from pipelines.common import write_text_atomic
from pipelines.compare.arms import ARMS
from pipelines.compare.runner import check_run_directory
from pipelines.flags import add_train_arguments
from pipelines.locks import owning_logdir
from pipelines.sweep import figures
from pipelines.sweep.analysis import run_record
from pipelines.sweep.init_picture import measure_init
from pipelines.sweep.plan import PRESETS
from pipelines.sweep.plan import plan_from_args
from pipelines.sweep.report import FIGURES
from pipelines.sweep.report import build_document
from pipelines.sweep.report import render_html
from pipelines.sweep.report import render_markdown
from pipelines.sweep.runner import train_runs
from pipelines.sweep.tensorboard import write_run_metrics
from pipelines.sweep.tensorboard import write_sweep_experiment

SWEEP_JSON, SWEEP_MD, SWEEP_HTML = "sweep.json", "sweep.md", "sweep.html"
FIGURE_DIR = "figures"


def _cpu_seconds():
    """CPU time of this process and of its finished children."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def sweep(plan, log=print):
    """Runs a sweep: trains what is missing, measures, writes the report.

    Returns:
        The `sweep.json` document (a dict).

    Raises:
        RunDirectoryBusy: when another process holds `plan.logdir`.
        EnvironmentFailure: when a write is refused.
    """
    # Refused before the lock is taken: a refused rerun leaves `.lock` (and
    # the pid in it) as it was.
    for run in plan.runs():
        check_run_directory(run)
    with owning_logdir(plan.logdir):
        return _sweep(plan, log)


def _sweep(plan, log):
    started, cpu_started = time.time(), _cpu_seconds()
    os.makedirs(plan.logdir, exist_ok=True)
    trained = train_runs(plan, log=log)
    records = []
    for run in plan.runs():
        record = run_record(run)
        write_run_metrics(run.config.logdir, record)
        records.append(record)
    write_sweep_experiment(plan.logdir, plan)
    init_rows = (measure_init(plan.base, plan.init_key_dims, plan.init_seeds,
                              log) if plan.init_key_dims else [])
    timing = {"trained_now": len(trained["trained_now"]),
              "skipped": trained["skipped"], "workers": trained["workers"],
              "builds": trained["builds"], "runs_trained_now": trained["runs"]}
    # The figures come from the document's data (the same numbers).
    document = build_document(plan, records, init_rows, dict(
        timing, wall_time_s=0.0, cpu_time_s=0.0))
    pngs = {
        "lr": figures.png_bytes(figures.lr_figure(document["curves"])),
        "sensitivity": figures.png_bytes(
            figures.sensitivity_figure(document["sensitivity"])),
        "diagnostics": figures.png_bytes(
            figures.diagnostics_figure(document["curves"])),
    }
    if init_rows:
        pngs["init"] = figures.png_bytes(figures.init_figure(init_rows))
    os.makedirs(os.path.join(plan.logdir, FIGURE_DIR), exist_ok=True)
    for key, data in pngs.items():
        write_bytes_atomic(
            os.path.join(plan.logdir, FIGURE_DIR, FIGURES[key][0]), data)
    document["figures"] = {key: path for key, path in document["figures"].items()
                           if key in pngs}
    document["timing"].update(wall_time_s=time.time() - started,
                              cpu_time_s=_cpu_seconds() - cpu_started)
    write_json_atomic(os.path.join(plan.logdir, SWEEP_JSON), document)
    write_text_atomic(os.path.join(plan.logdir, SWEEP_MD),
                      render_markdown(document))
    write_text_atomic(os.path.join(plan.logdir, SWEEP_HTML),
                      render_html(document, pngs))
    return document


# ---------------------------------------------------------- command line
def add_arguments(parser):
    """Adds the `sweep` flags, and every `train` flag, to a parser."""
    group = parser.add_argument_group("sweep")
    group.add_argument(
        "--preset", default="quick", metavar="{" + ",".join(PRESETS) + "}",
        help=f"quick: {PRESETS['quick'].expected}; full: "
        f"{PRESETS['full'].expected}")
    group.add_argument("--arms", metavar="A1,A2,...",
                       help="arms, from: " + ", ".join(ARMS))
    group.add_argument("--optimizers", metavar="O1,O2,...",
                       help="optimizers, from: sgd, adam, adamw")
    group.add_argument("--learning-rates", metavar="LR1,LR2,...",
                       help="peak learning rates")
    group.add_argument("--key-dims", metavar="D1,D2,...", help="d_k values")
    group.add_argument("--seeds", metavar="N|S1,S2,...",
                       help="number of seeds (0..N-1) or a list of seeds")
    group.add_argument("--jobs", metavar="N",
                       help="worker processes (default: the preset's, 2)")
    group.add_argument("--init-key-dims", metavar="D1,D2,...|none",
                       help="d_k values of the picture at init, per scale "
                       "mode (default: 16,64,256,1024,4096)")
    group.add_argument("--init-seeds", metavar="N|S1,S2,...",
                       help="seeds of the picture at init (default: the "
                       "preset's)")
    add_train_arguments(parser)
    return parser


def run(args):
    """Runs `keras-attention sweep`; prints the verdicts."""
    plan = plan_from_args(args)
    print(f"Sweeping {len(plan.runs())} runs of {plan.base.steps} steps "
          f"({plan.jobs} worker(s)); logs in {plan.logdir}", flush=True)
    document = sweep(plan, log=lambda line: print(line, flush=True))
    print()
    for verdict in document["verdicts"]:
        print(f"{verdict['optimizer']}, d_k {verdict['key_dim']}: "
              f"{verdict['headline']}")
        for line in verdict["lines"]:
            print(f"  {line}")
    timing = document["timing"]
    print(f"\nReport: {os.path.join(plan.logdir, SWEEP_MD)} (wall "
          f"{timing['wall_time_s']:.0f} s, CPU {timing['cpu_time_s']:.0f} s)")
    print(f"TensorBoard: tensorboard --logdir {plan.logdir}")
    return 0
