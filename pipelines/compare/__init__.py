"""`keras-attention compare`: the lesson's claims measured over a grid of
runs, scaled vs unscaled attention side by side.

The grid is the experiment engine's (`pipelines.engine`); this package is
the report over it (docs/experiments.md): `measure` (the records, probes
and heat maps), `series` (curves over steps, init statistics over d_k),
`claims/` (one module per claim), `report` (comparison.md and .json, the
figures) and `tensorboard`.
"""

import json
import os
import time

from pipelines.common import parse_count
from pipelines.common import parse_int_list
from pipelines.common import UsageError
from pipelines.common import write_json_atomic
from pipelines.common import write_text_atomic
from pipelines.compare.claims import CLAIMS
from pipelines.compare.claims.length_measures import check_multiples
from pipelines.compare.measure import collect
from pipelines.compare.measure import sliced
from pipelines.compare.measure import write_heatmaps
from pipelines.compare.report import build_comparison
from pipelines.compare.report import key_dim_tables
from pipelines.compare.report import make_figures
from pipelines.compare.report import render_report
from pipelines.compare.report import verdict_line
from pipelines.compare.series import collect_curves
from pipelines.compare.series import figure_data
from pipelines.compare.tensorboard import EXPERIMENT_METRICS
from pipelines.compare.tensorboard import write_claim_scalars
from pipelines.compare.tensorboard import write_curve_scalars
from pipelines.compare.tensorboard import write_run_hparams_metrics
from pipelines.engine import COMPARE_PRESETS as PRESETS
from pipelines.engine import add_grid_arguments
from pipelines.engine import check_runs
from pipelines.engine import parse_sizes
from pipelines.engine import plan_grid
from pipelines.engine import run_grid
from pipelines.engine import write_grid_experiment
from pipelines.reports.page import render_page
from pipelines.reports.plotting import write_figures
from pipelines.reports.probes import probe_at_init
from pipelines.variance import variance_table

COMPARISON_JSON, COMPARISON_MD, COMPARISON_HTML = (
    "comparison.json", "comparison.md", "comparison.html")
DEFAULT_LOGDIR = os.path.join("runs", "compare")

__all__ = [
    "PRESETS", "plan_from_args", "probe_at_init", "compare", "report",
    "evaluate_claims", "render_report", "summary_text", "add_arguments",
    "run",
]


def compare(plan, log=print):
    """Trains what is missing and writes the report; returns the
    comparison.json document, or None when a shard leaves runs to others.
    Raises `RunDirectoryBusy` and `EnvironmentFailure` as `run_grid`."""
    started = time.time()
    return run_grid(
        plan, lambda *args: report(*args, started=started), log=log)


def report(plan, missing, timing, log=print, started=None):
    """Measures the finished runs of `plan`, decides its claims and writes
    the documents, figures, heat maps and TensorBoard summaries; `missing`:
    the runs not finished (`--report-only`), `timing`: the engine's record
    of what it trained now (None: nothing), `started`: for the wall time."""
    started = time.time() if started is None else started
    claims = grid_claims(plan)
    results = collect(plan)
    samples = plan.options.get("variance_samples", 0)
    results["variance"] = (variance_table(plan.axis("key_dim"), samples,
                                          seed=0) if samples else [])
    measured = evaluate_claims(plan, results, log)
    curves = collect_curves(plan)
    write_grid_experiment(plan, EXPERIMENT_METRICS)
    for record in results["runs"]:
        write_run_hparams_metrics(os.path.join(plan.logdir, record["run"]),
                                  record)
    write_heatmaps(plan.logdir, results["heatmaps"])
    points = {run: [] for claim in claims for run in claim.SCALAR_RUNS}
    for claim in claims:
        if claim.NUMBER in measured:
            for run, run_points in claim.scalars(
                    plan, measured[claim.NUMBER], results).items():
                points[run] += run_points
    write_claim_scalars(plan.logdir, points)
    write_curve_scalars(plan.logdir, curves)
    wall_time_s = time.time() - started
    trained_now = timing["trained_now"] if timing else []
    document = build_comparison(plan, results, measured, wall_time_s)
    document.update(trained_now=trained_now, missing=list(missing),
                    curves=curves,
                    figures=figure_data(plan, sliced(plan, results)))
    json_path = os.path.join(plan.logdir, COMPARISON_JSON)
    write_json_atomic(json_path, document)
    # The figures are drawn from the file just written: one source for the
    # pictures and the numbers.
    with open(json_path, encoding="utf-8") as handle:
        figures = write_figures(plan.logdir,
                                make_figures(json.load(handle), claims))
    text = render_report(plan, results, claims, measured, wall_time_s,
                         trained_now, figures, COMPARISON_HTML, missing)
    write_text_atomic(os.path.join(plan.logdir, COMPARISON_MD), text)
    write_text_atomic(
        os.path.join(plan.logdir, COMPARISON_HTML),
        render_page(plan.logdir, text, figures,
                    f"Scaled vs unscaled attention on {plan.base.task}"),
    )
    return document


def grid_claims(plan):
    """The claim modules the grid's preset names, in order (default: all);
    KeyError for no claim."""
    return [CLAIMS[name] for name in plan.options.get("claims", CLAIMS)]


def evaluate_claims(plan, results, log=print):
    """`{number: evidence}` of the grid's claims that apply to it, measured
    from `results` (`measure.collect`, with `"variance"`)."""
    return {claim.NUMBER: claim.measure(plan, results, log)
            for claim in grid_claims(plan) if claim.applies(plan)}


def summary_text(plan, document):
    """What the command prints: per-key_dim tables and the verdicts."""
    results = sliced(plan, {key: document[key]
                            for key in ("runs", "init_only", "heatmaps")})
    lines = key_dim_tables(plan, results)
    lines += [verdict_line(plan, claim, document["claims"][claim.NUMBER])
              for claim in grid_claims(plan)
              if claim.NUMBER in document["claims"]]
    return "\n".join(lines)


# ---------------------------------------------------------- command line
def add_arguments(parser):
    """Adds the `compare` flags, the grid's and every `train` flag."""
    default, full = PRESETS["default"], PRESETS["full"]
    add_grid_arguments(
        parser, PRESETS, None,
        "default: init statistics at d_k 16,64,256,1024 and scaled vs "
        f"unscaled trained at 1024 with 3 seeds ({default.expected}); full: "
        f"every arm trained at d_k 16..4096 with 5 seeds ({full.expected}); "
        "text (the choice for --task text): scaled vs unscaled on real "
        f"text at d_k 1024, 3 seeds ({PRESETS['text'].expected}); text-gpu:"
        " every arm on text at d_k up to 4096, 4 seeds; "
        "depth: scaled vs unscaled at 1, 2, 4 layers, d_k 256 "
        f"({PRESETS['depth'].expected}); length: sqrt, none, qk_norm, "
        "ssmax at 16 and 64 recall pairs, the 16-pair runs evaluated at "
        f"1-8x ({PRESETS['length'].expected}); depth_full, length_full: "
        "the same for a GPU")
    group = parser.add_argument_group("comparison")
    group.add_argument("--train-key-dims", metavar="D1,D2,...|all",
                       help="d_k values to train; the others are measured at "
                       "init only (default: the preset's, or every given "
                       "--key-dims)")
    group.add_argument("--variance-samples", default="20000", metavar="N",
                       help="random (q, k) pairs per d_k for the variance "
                       "table (0: none; default: %(default)s)")
    group.add_argument("--length-multiples", metavar="M1,M2,...|none",
                       help="recall: evaluate the runs trained at the "
                       "shortest --num-pairs held-out at these multiples of "
                       "it (claim 5; default: the preset's, 1,2,4,8 for "
                       "--preset length)")
    return parser


def plan_from_args(args):
    """The checked `Grid` of parsed `compare` flags (`UsageError` on a bad
    one, before anything is written)."""
    if args.preset is None:
        # Real text has its own grid; every other task the toy default.
        args.preset = "text" if getattr(args, "task", None) == "text" \
            else "default"
    train = args.train_key_dims
    if train is not None and train != "all":
        train = parse_int_list(train, "--train-key-dims")
        # A trained d_k is measured at init too.
        preset = PRESETS.get(args.preset, PRESETS["default"])
        given = args.key_dim or list(preset.axes["key_dim"])
        args.key_dim = sorted(set(given) | set(train))
    samples = parse_count(args.variance_samples, "--variance-samples",
                          minimum=0)
    if samples == 1:
        raise UsageError("--variance-samples must be 0 (none) or at least 2")
    plan = plan_grid(args, "compare", PRESETS, DEFAULT_LOGDIR)
    if "key_dim" not in plan.axes:
        raise UsageError("compare measures over d_k: give --key-dims")
    if train == "all":
        plan.trained.pop("key_dim", None)
    elif train is not None:
        plan.trained["key_dim"] = sorted(train)
    plan.options["variance_samples"] = samples
    _length_multiples(args.length_multiples, plan)
    return check_runs(plan)


def _length_multiples(text, plan):
    """Sets and checks `plan.options["length_multiples"]` (default: the
    preset's)."""
    if text is not None:
        plan.options["length_multiples"] = parse_sizes(
            text, "--length-multiples")
    multiples = plan.options.get("length_multiples") or []
    if multiples:
        axis = "num_pairs" if "num_pairs" in plan.axes else None
        shortest = plan.base if axis is None else plan.base.replace(
            num_pairs=plan.trained_axis(axis)[0])
        check_multiples(shortest, multiples)


def run(args):
    """Runs `keras-attention compare`; prints the tables and verdicts."""
    plan = plan_from_args(args)
    trained = plan.trained_runs()
    others = list(plan.slice())
    print(
        f"Comparing {', '.join(plan.arms)} on {plan.base.task}: "
        f"{len(trained)} training runs of {plan.base.steps} steps (d_k "
        f"{', '.join(map(str, plan.trained_axis('key_dim')))}; seeds "
        f"{', '.join(map(str, plan.seeds))}"
        + "".join(f"; {name} {', '.join(map(str, plan.axis(name)))}"
                  for name in others)
        + f"), init statistics at d_k "
        f"{', '.join(map(str, plan.axis('key_dim')))}; logs in {plan.logdir}"
        + ("" if plan.shard.source is None else
           f"; shard {plan.shard.index}/{plan.shard.count} "
           f"({plan.shard.source})"),
        flush=True,
    )
    document = compare(plan, log=lambda line: print(line, flush=True))
    if document is None:
        return 0
    print()
    print(summary_text(plan, document))
    print()
    print(f"Report: {os.path.join(plan.logdir, COMPARISON_MD)} "
          f"({document['wall_time_s']:.0f} s); with its figures, offline: "
          f"{os.path.join(plan.logdir, COMPARISON_HTML)}")
    print(f"TensorBoard: tensorboard --logdir {plan.logdir}")
    return 0
