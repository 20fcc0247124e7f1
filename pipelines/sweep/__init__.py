"""`keras-attention sweep`: does the score scale still matter once the
learning rate is tuned?

The grid (arm, optimizer, learning rate, d_k, seed, any other axis given
as a list) is the experiment engine's (`pipelines.engine`); this package
is the report over it (docs/experiments.md): `analysis` (records, curves,
sensitivity, verdicts), `init_picture` (score std and entropy at init per
scale mode over d_k), `figures`, `report` (sweep.json, sweep.md) and
`tensorboard` (the end metrics). It never imports `pipelines.compare`.
"""

import os
import resource
import time

from pipelines.common import write_json_atomic
from pipelines.common import write_text_atomic
from pipelines.engine import SWEEP_PRESETS as PRESETS
from pipelines.engine import add_grid_arguments
from pipelines.engine import check_runs
from pipelines.engine import parse_seeds
from pipelines.engine import parse_sizes
from pipelines.engine import plan_grid
from pipelines.engine import run_grid
from pipelines.engine import write_grid_experiment
from pipelines.reports.page import render_page
from pipelines.reports.plotting import write_figures
from pipelines.sweep.analysis import run_record
from pipelines.sweep.figures import make_figures
from pipelines.sweep.init_picture import measure_init
from pipelines.sweep.report import build_document
from pipelines.sweep.report import render_markdown
from pipelines.sweep.tensorboard import EXPERIMENT_METRICS
from pipelines.sweep.tensorboard import write_run_metrics

SWEEP_JSON, SWEEP_MD, SWEEP_HTML = "sweep.json", "sweep.md", "sweep.html"
DEFAULT_LOGDIR = os.path.join("runs", "sweep")
# The runs' order in the report: per d_k, arm and optimizer, the rates.
ORDER = ("key_dim", "arm", "optimizer", "learning_rate", "seed")


def _cpu_seconds():
    """CPU time of this process and of its finished children."""
    return sum(usage.ru_utime + usage.ru_stime for usage in map(
        resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


def sweep(plan, log=print):
    """Trains what is missing and writes the report; returns the sweep.json
    document, or None when a shard leaves runs to others. Raises
    `RunDirectoryBusy` and `EnvironmentFailure` as `run_grid`."""
    started = time.time(), _cpu_seconds()
    return run_grid(plan, lambda *args: report(*args, started=started),
                    log=log)


def report(plan, missing, timing, log=print, started=None):
    """Writes the report of the finished runs of `plan` (arguments as
    `pipelines.compare.report`)."""
    wall_started, cpu_started = started or (time.time(), _cpu_seconds())
    records = []
    for run in plan.trained_runs():
        record = run_record(run)
        write_run_metrics(run.config.logdir, record)
        records.append(record)
    write_grid_experiment(plan, EXPERIMENT_METRICS)
    init_key_dims = plan.options["init_key_dims"]
    init_rows = (measure_init(plan.base, init_key_dims,
                              plan.options["init_seeds"], log)
                 if init_key_dims else [])
    timing = timing or {"trained_now": [], "skipped": len(records),
                        "workers": 0, "builds": 0, "runs": []}
    document = build_document(plan, records, init_rows, {
        "trained_now": len(timing["trained_now"]),
        "skipped": timing["skipped"], "workers": timing["workers"],
        "builds": timing["builds"], "runs_trained_now": timing["runs"],
        "wall_time_s": 0.0, "cpu_time_s": 0.0}, missing)
    # The figures come from the document's data (the same numbers).
    figures = write_figures(plan.logdir, make_figures(document))
    document["figures"] = {item["name"]: item["path"] for item in figures}
    document["timing"].update(wall_time_s=time.time() - wall_started,
                              cpu_time_s=_cpu_seconds() - cpu_started)
    write_json_atomic(os.path.join(plan.logdir, SWEEP_JSON), document)
    text = render_markdown(document, figures)
    write_text_atomic(os.path.join(plan.logdir, SWEEP_MD), text)
    write_text_atomic(os.path.join(plan.logdir, SWEEP_HTML),
                      render_page(plan.logdir, text, figures,
                                  "Learning-rate sweep"))
    return document


# ---------------------------------------------------------- command line
def add_arguments(parser):
    """Adds the `sweep` flags, the grid's and every `train` flag."""
    add_grid_arguments(parser, PRESETS, "quick",
                       f"quick: {PRESETS['quick'].expected}; full: "
                       f"{PRESETS['full'].expected}")
    group = parser.add_argument_group("sweep")
    group.add_argument("--init-key-dims", metavar="D1,D2,...|none",
                       help="d_k values of the picture at init, per scale "
                       "mode (default: 16,64,256,1024,4096)")
    group.add_argument("--init-seeds", metavar="N|S1,S2,...",
                       help="seeds of the picture at init (default: the "
                       "preset's)")
    return parser


def plan_from_args(args):
    """The checked `Grid` of parsed `sweep` flags (`UsageError` on a bad
    one, before anything is written)."""
    plan = plan_grid(args, "sweep", PRESETS, DEFAULT_LOGDIR, order=ORDER)
    if args.init_key_dims is not None:
        plan.options["init_key_dims"] = parse_sizes(args.init_key_dims,
                                                    "--init-key-dims")
    plan.options["init_seeds"] = (
        list(range(plan.options["init_seeds"])) if args.init_seeds is None
        else parse_seeds(args.init_seeds, "--init-seeds"))
    return check_runs(plan)


def run(args):
    """Runs `keras-attention sweep`; prints the verdicts."""
    plan = plan_from_args(args)
    print(f"Sweeping {len(plan.runs())} runs of {plan.base.steps} steps "
          f"({plan.jobs} worker(s)); logs in {plan.logdir}", flush=True)
    document = sweep(plan, log=lambda line: print(line, flush=True))
    if document is None:
        return 0
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
