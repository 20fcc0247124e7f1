"""The whole project on one GPU, on Keras's JAX backend, in one command.

    python scripts/gpu_check.py --out DIR          # on a GPU (8 minutes)
    python scripts/gpu_check.py --smoke --out DIR  # tiny sizes, on a CPU
    bash scripts/gpu_check.sh ...                  # the same with Keras
                                                   # installed from wheels

Four stages, each under a share of `--budget-s` (its deadline; time one
stage leaves over goes to the next):

1. layer (`_gpu_layer.py`, its own process): correctness of every path in
   bf16 and float32 with masks; forward + backward TFLOP/s of ours against
   `keras.layers.MultiHeadAttention` and `jax.nn.dot_product_attention`
   (cuDNN on a GPU) at 1k/4k/16k tokens; peak memory; and the measured
   bf16 matmul peak that the MFU figures refer to;
2. train: `keras-attention train --backend jax` with the default recall
   model and a larger one (d_model 512, 8 heads, 4 layers, T 1024, bf16):
   tokens/s, MFU, compile time (first step against a steady one) and the
   share of the wall time spent in diagnostics (each call timed);
3. compare: `keras-attention compare --backend jax` (the default), then
   the largest part of `--preset full` that the measured runs predict to
   fit, with `--jobs`;
4. sweep: the largest part of `keras-attention sweep --preset full` that
   fits the rest, on as many workers as stage 3 measured worth running.

Stages 2-4 run the `keras-attention` command line in child processes, as
a user runs it; a deadline ends a child's whole process group. Every
measurement is saved at once to `DIR/gpu_check.json` (atomic writes), the
tables to `DIR/gpu_check.txt` after each stage, and the reports'
`comparison.md` and `sweep.md` are copied beside them; the run
directories stay in `--logdir` (default: a new temporary directory).
This process never uses the accelerator (its JAX sees the CPU only): the
children get it whole, one at a time. Nothing here imports TensorFlow.

Exit status: 0 when every stage ran (a stage cut by its deadline counts:
it says so), 1 when one failed or a correctness case was out of
tolerance, 2 on bad flags or, without `--smoke`, no GPU.
"""

import os
import sys

# Before Keras is imported (by the modules below): the JAX backend, and
# this process kept off the accelerator.
CHILD_PLATFORMS = os.environ.get("JAX_PLATFORMS")
os.environ["KERAS_BACKEND"] = "jax"
os.environ["JAX_PLATFORMS"] = "cpu"

import datetime  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import _bench  # noqa: E402
import _gpu_plan  # noqa: E402
import _gpu_results  # noqa: E402
import _gpu_runs  # noqa: E402
from pipelines.common import EnvironmentFailure  # noqa: E402
from pipelines.common import write_text_atomic  # noqa: E402

PROG = "gpu_check.py"
HERE = os.path.dirname(os.path.abspath(__file__))
# Each stage's share of the budget (of the stages chosen); 3% is left for
# the tables at the end.
STAGE_SHARES = {"layer": 0.22, "train": 0.28, "compare": 0.30, "sweep": 0.17}
# Whole command in 8 minutes: 450 s of stages, the rest start-up.
DEFAULT_BUDGET_S = {False: 450.0, True: 300.0}


def parse_args(argv=None):
    parser = _bench.parser(PROG, "The layer, training, the comparison and "
                           "the sweep on one GPU, on the JAX backend.")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes and few steps; runs on a CPU")
    parser.add_argument("--out", default=None,
                        help="results directory (default: "
                        "scripts/results/<date>-gpu-check; smoke: "
                        "LOGDIR/results)")
    parser.add_argument("--logdir", default=None,
                        help="run directories, new or empty (default: a new "
                        "temporary directory)")
    _bench.add_flag(parser, "--budget-s", None,
                    "seconds for all stages (default 450; smoke 300)",
                    lambda flag: _bench.positive(float, flag,
                                                 "a positive number"))
    _bench.add_flag(parser, "--jobs", None,
                    "runs at once in the full comparison, and the sweep's "
                    "workers when that measured worth it (default 4; smoke 2)")
    _bench.add_flag(parser, "--stages", list(_gpu_results.STAGES),
                    "comma-separated subset of layer,train,compare,sweep",
                    lambda flag: _bench.subset_list(flag,
                                                    _gpu_results.STAGES))
    parser.add_argument("--arrays", help="also save the layer's correctness "
                        "cases to this .npz")
    args = parser.parse_args(argv)
    args.budget_s = args.budget_s or DEFAULT_BUDGET_S[args.smoke]
    args.jobs = args.jobs or (2 if args.smoke else 4)
    if args.arrays:  # the layer's worker runs in the checkout's root
        args.arrays = os.path.abspath(args.arrays)
    if args.logdir and os.path.isdir(args.logdir) and os.listdir(args.logdir):
        parser.error(f"--logdir {args.logdir} is not empty; give a new one")
    return args


class Check:
    """One run of the check: its settings, clock, results and children."""

    def __init__(self, args):
        self.args = args
        self.settings = _gpu_plan.settings(args.smoke)
        self.started = time.time()
        self.logdir = os.path.abspath(
            args.logdir or tempfile.mkdtemp(prefix="gpu-check-"))
        default_out = os.path.join(self.logdir, "results") if args.smoke \
            else os.path.join(HERE, "results",
                              f"{datetime.date.today()}-gpu-check")
        self.out = os.path.abspath(args.out or default_out)
        os.makedirs(self.out, exist_ok=True)
        os.makedirs(self.logdir, exist_ok=True)
        self.results = _gpu_results.Results(
            os.path.join(self.out, _gpu_results.JSON_NAME))
        self.results.document["run"] = dict(
            date=datetime.date.today().isoformat(), smoke=args.smoke,
            budget_s=args.budget_s, jobs=args.jobs, stages=args.stages,
            argv=sys.argv[1:], logdir=self.logdir, out=self.out,
            started=self.started, elapsed_s=0.0)

    def deadline(self, stage):
        """When `stage` must end: the chosen stages' shares, in order."""
        stages = self.args.stages
        before = sum(STAGE_SHARES[name]
                     for name in stages[:stages.index(stage) + 1])
        whole = sum(STAGE_SHARES[name] for name in stages)
        return self.started + 0.97 * self.args.budget_s * before / whole

    def save(self):
        run = self.results.document["run"]
        run["elapsed_s"] = time.time() - self.started
        self.results.save()
        from_json = _gpu_results.tables(self.results.document)
        write_text_atomic(os.path.join(self.out, _gpu_results.TABLES_NAME),
                          from_json)
        return from_json

    def copy_report(self, source, name):
        """Copies a report's text into the results directory."""
        if os.path.isfile(source):
            shutil.copyfile(source, os.path.join(self.out, name))
            return name
        return None


def child_env(jobs=1, memory_fraction=None):
    """The children's environment: the accelerator is theirs. Parallel runs
    share it, so none takes JAX's default 75% of its memory."""
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONUNBUFFERED="1",
               TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("JAX_PLATFORMS")
    if CHILD_PLATFORMS is not None:
        env["JAX_PLATFORMS"] = CHILD_PLATFORMS
    env["PYTHONPATH"] = os.pathsep.join(
        [_bench.REPO_ROOT] + [p for p in env.get("PYTHONPATH", "")
                              .split(os.pathsep) if p])
    if jobs > 1:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if memory_fraction is not None:
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(memory_fraction)
    return env


def accelerator():
    """The platform JAX gives a child process ('gpu', 'cpu', ...)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", "import jax; print(jax.default_backend())"],
            env=child_env(), capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "none (no answer in 120 s)"
    return done.stdout.strip() or "none"


def stage_layer(check):
    command = [sys.executable, os.path.join(HERE, "_gpu_layer.py"),
               "--json", check.results.path,
               "--deadline", str(check.deadline("layer"))]
    command += ["--smoke"] if check.args.smoke else []
    command += ["--arrays", check.args.arrays] if check.args.arrays else []
    check.save()
    done = _gpu_runs.Command(
        command, child_env(memory_fraction=0.9),
        os.path.join(check.logdir, "layer.log"),
    ).run(check.deadline("layer") + 30)
    section = check.results.load().stage("layer")
    if done["timed_out"]:  # a case ran 30 s past the deadline
        section.update(note="stopped in a case past the deadline",
                       tail=done["tail"])
        return "cut"
    if done["returncode"] != 0:
        section.update(error=_outcome(done), tail=done["tail"])
        return "failed"
    if not all(case["ok"] for case in section["correctness"]):
        section["error"] = "a correctness case is out of tolerance"
        return "failed"
    return section["status"]


def stage_train(check):
    section = check.results.stage("train")
    section["runs"] = []
    peak = (check.results.stage("layer").get("peak") or {}).get("tflops")
    section["peak_tflops"] = peak
    for name, flags in check.settings["train"]:
        run_dir = os.path.join(check.logdir, f"train-{name}")
        timing = run_dir + ".diagnostics.json"
        argv = ["train", "--backend", "jax", "--quiet", "--logdir", run_dir,
                *flags]
        done = _gpu_runs.Command(
            _gpu_runs.timed_train_command(timing, argv), child_env(),
            run_dir + ".log").run(check.deadline("train"))
        record = dict(argv=argv, outcome=_outcome(done))
        if done["returncode"] != 0:
            record["tail"] = done["tail"]
        if done["returncode"] == 0 or (
                done["timed_out"] and os.path.exists(timing)
                and os.path.exists(os.path.join(run_dir, "config.json"))):
            record.update(_gpu_runs.train_record(
                run_dir, _gpu_runs.read_json(timing)["diagnostics_s"], peak))
        record["name"] = name
        section["runs"].append(record)
        check.save()
        if done["timed_out"]:
            section["note"] = f"{name} stopped at the deadline"
            return "cut"
        if done["returncode"] != 0:
            section["error"] = f"{name}: {record['outcome']}"
            return "failed"
    return "done"


def _outcome(done):
    if done["timed_out"]:
        return "stopped at the deadline"
    return "done" if done["returncode"] == 0 else (
        f"exit status {done['returncode']}")


def run_grid(check, stage, part, grid, jobs, report, copy_as):
    """Runs one `compare` / `sweep` command line; records it in the
    stage's section under `part` and returns the record."""
    section = check.results.stage(stage)
    logdir = os.path.join(check.logdir, f"{stage}-{part}")
    argv = [stage, "--backend", "jax", "--logdir", logdir, "--jobs",
            str(jobs), *grid["flags"], *check.settings["tiny"]]
    record = section.setdefault(part, {})
    record.update(grid=grid["name"], jobs=jobs, argv=argv,
                  runs_planned=grid["runs"])
    check.save()
    done = _gpu_runs.Command(_gpu_runs.cli_command(argv), child_env(jobs),
                             logdir + ".log").run(check.deadline(stage))
    runs = _gpu_runs.grid_runs(logdir)
    record.update(
        outcome=_outcome(done), seconds=done["seconds"], runs_done=len(runs),
        training_window_s=_gpu_runs.training_window(runs), runs=runs,
        verdicts=_gpu_runs.verdict_lines(done["tail"], check.settings[
            "verdict_pattern"][stage]),
        report=check.copy_report(os.path.join(logdir, report), copy_as),
        tail=done["tail"][-12:])
    if done["returncode"] not in (0, None):
        section["error"] = f"{part}: {record['outcome']}"
    check.save()
    return record


def _grid_status(check, stage, parts):
    """A stage's status from its parts' outcomes."""
    section = check.results.stage(stage)
    if section.get("error"):
        return "failed"
    outcomes = [section[part].get("outcome", "") for part in parts
                if part in section]
    return "done" if all(o == "done" for o in outcomes) else "cut"


def run_chosen(check, stage, chosen, choice, jobs, report, copy_as):
    """Runs the grid `chosen` as the stage's part "full", or records why
    not (None: even the smallest was predicted not to fit)."""
    if chosen is None:
        check.results.stage(stage)["full"] = dict(choice, outcome=(
            "skipped: the smallest grid is predicted to take longer than "
            "the time left"))
        return None
    record = run_grid(check, stage, "full", chosen, jobs, report, copy_as)
    record.update(choice, predicted_s=next(
        (row["predicted_s"] for row in choice.get("predictions", [])
         if row["grid"] == chosen["name"]), None))
    check.save()
    return record


def stage_compare(check):
    settings = check.settings
    default = run_grid(check, "compare", "default",
                       settings["compare_default"], 1, "comparison.md",
                       "comparison-default.md")
    if default["outcome"] != "done":
        return _grid_status(check, "compare", ["default"])
    chosen, choice = _gpu_plan.choose(
        settings["compare_full"], check.deadline("compare") - time.time(),
        lambda grid: _gpu_plan.predict_full_compare(
            default, grid, settings["steps"]["compare_full"]))
    full = run_chosen(check, "compare", chosen, choice, check.args.jobs,
                      "comparison.md", "comparison-full.md")
    if full is None:
        return "cut"
    section = check.results.stage("compare")
    section["jobs_choice"], section["parallel"] = _gpu_plan.jobs_choice(
        default["runs"], full["runs"], check.args.jobs,
        settings["ref_key_dim"])
    return _grid_status(check, "compare", ["default", "full"])


def stage_sweep(check):
    settings = check.settings
    compare = check.results.document["stages"].get("compare", {})
    default = compare.get("default") or {}
    parallel = compare.get("parallel") or {"jobs": 1, "factor": 1.0}
    if default.get("runs"):
        chosen, choice = _gpu_plan.choose(
            settings["sweep"], check.deadline("sweep") - time.time(),
            lambda grid: _gpu_plan.predict_sweep(
                default, grid, settings["steps"]["sweep"],
                parallel["factor"]))
    else:
        chosen, choice = settings["sweep"][0], {}
        check.results.stage("sweep")["note"] = (
            "no comparison runs to size from: the smallest grid")
    if run_chosen(check, "sweep", chosen, choice, parallel["jobs"],
                  "sweep.md", "sweep.md") is None:
        return "cut"
    return _grid_status(check, "sweep", ["full"])


STAGES = {"layer": stage_layer, "train": stage_train,
          "compare": stage_compare, "sweep": stage_sweep}


def main(argv=None):
    args = parse_args(argv)
    try:
        return _check(args)
    except (OSError, EnvironmentFailure) as error:  # a full disk, say
        _bench.fail(PROG, error)


def _check(args):
    if not args.smoke:
        platform = accelerator()
        if platform != "gpu":
            _bench.fail(PROG, f"JAX sees no GPU (its backend is {platform!r}); "
                        "run with --smoke for a CPU dry run", status=2)
    check = Check(args)
    print(f"{PROG}: results in {check.out}, runs in {check.logdir}",
          flush=True)
    for name in args.stages:
        print(f"== {name} (until {check.deadline(name) - check.started:.0f} "
              f"s of {args.budget_s:.0f})", flush=True)
        check.results.stage(name)
        started = time.time()
        status = STAGES[name](check)
        section = check.results.stage(name)
        section.update(status=status, seconds=time.time() - started)
        check.save()
    print(check.save(), end="")
    stages = check.results.document["stages"]
    return 1 if any(stages[name]["status"] == "failed"
                    for name in args.stages) else 0


if __name__ == "__main__":
    sys.exit(main())
