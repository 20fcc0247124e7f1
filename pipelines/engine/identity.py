"""A grid folder's identity, as a run's folder holds its config:

    LOGDIR/grid.json    {"command": "compare" | "sweep",
                         "trained": [run names], "init_only": [run names]}

Written first at the root; a later grid on that root with another command
or other runs is refused in one line, before anything is written (shared
settings are checked per run, against its `config.json`). A root left
without `grid.json` (by a shard or an older version) is read from its
report and its run folders.
"""

import json
import os

from pipelines.common import UsageError
from pipelines.common import one_line
from pipelines.common import write_json_atomic
from pipelines.run_dir import CONFIG_FILE
from pipelines.run_dir import METRICS_FILE

GRID_FILE = "grid.json"
# The report each command writes at its root (test_grid_identity checks
# the names agree).
REPORT_FILES = {"compare": "comparison.json", "sweep": "sweep.json"}
_NOUN = {"compare": "comparison", "sweep": "sweep"}
# How many run names a message lists before it says how many more.
_NAMES_SHOWN = 3


def plan_identity(grid):
    """The identity of `grid`'s folder: its command and its runs."""
    runs = grid.runs()
    return {"command": grid.command,
            "trained": sorted(run.name for run in runs if run.trained),
            "init_only": sorted(run.name for run in runs if not run.trained)}


def write_identity(grid):
    """Writes `grid.json` (creating the root) unless it holds this identity
    already."""
    identity = plan_identity(grid)
    if os.path.isdir(grid.logdir) and stored_identity(grid.logdir) == identity:
        return
    os.makedirs(grid.logdir, exist_ok=True)
    write_json_atomic(os.path.join(grid.logdir, GRID_FILE), identity)


def _read_json(path, logdir):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError, RecursionError) as error:
        raise UsageError(
            f"--logdir {logdir}: cannot read {os.path.basename(path)} "
            f"({type(error).__name__}: {one_line(error)})") from None


def _names(items):
    """Run names from a report's list of records or names."""
    return {item["run"] if isinstance(item, dict) else item
            for item in items if isinstance(item, (dict, str))}


def _run_folders(logdir):
    """The sub-folders of `logdir` holding a training run."""
    try:
        entries = sorted(os.listdir(logdir))
    except OSError:
        return set()
    return {name for name in entries
            if os.path.isfile(os.path.join(logdir, name, CONFIG_FILE))}


def stored_identity(logdir):
    """The identity of the grid folder `logdir`: its `grid.json`, or what a
    folder without one shows (`"derived": True`, `command` and `init_only`
    None when unknown); None when `logdir` holds no grid."""
    path = os.path.join(logdir, GRID_FILE)
    if os.path.lexists(path):
        stored = _read_json(path, logdir)
        if not (isinstance(stored, dict)
                and stored.get("command") in REPORT_FILES
                and isinstance(stored.get("trained"), list)
                and isinstance(stored.get("init_only"), list)):
            raise UsageError(f"--logdir {logdir}: {GRID_FILE} is not a grid's "
                             "identity; use a new --logdir")
        return stored
    command, trained, init_only = None, _run_folders(logdir), None
    for name, report in REPORT_FILES.items():
        path = os.path.join(logdir, report)
        if not os.path.lexists(path):
            continue
        command = name
        document = _read_json(path, logdir)
        if isinstance(document, dict) and isinstance(
                document.get("runs"), list):
            trained |= _names(document["runs"])
            trained |= _names(document.get("missing") or [])
            if isinstance(document.get("init_only"), list):
                init_only = sorted(_names(document["init_only"]))
        break
    if command is None and not trained:
        return None
    return {"command": command, "trained": sorted(trained),
            "init_only": init_only, "derived": True}


def _listed(names):
    names = sorted(names)
    shown = ", ".join(names[:_NAMES_SHOWN])
    more = len(names) - _NAMES_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def _differences(stored, wanted):
    """How the stored plan differs from the wanted one (texts)."""
    differences = []
    theirs, ours = set(stored["trained"]), set(wanted["trained"])
    # A derived plan is only what the folder shows: its missing runs may
    # still come.
    extra = theirs - ours
    lacking = set() if stored.get("derived") else ours - theirs
    if extra:
        differences.append(f"it trains {_listed(extra)}, which this plan "
                           "does not")
    if lacking:
        differences.append(f"this plan trains {_listed(lacking)}, which it "
                           "does not")
    if stored.get("init_only") is not None and not extra and not lacking:
        theirs, ours = set(stored["init_only"]), set(wanted["init_only"])
        if theirs != ours:
            differences.append(
                "its runs measured at init only are "
                f"{_listed(theirs) or 'none'}, this plan's "
                f"{_listed(ours) or 'none'}")
    return differences


def check_grid_folder(grid):
    """`UsageError` unless `grid.logdir` (not a training run's) holds no
    grid or this one. Reads only."""
    logdir = grid.logdir
    for marker in (CONFIG_FILE, METRICS_FILE):
        if os.path.lexists(os.path.join(logdir, marker)):
            raise UsageError(
                f"--logdir {logdir} is a training run's folder ({marker}); "
                f"{grid.command} needs a folder of its own")
    stored = stored_identity(logdir)
    if stored is None:
        return
    command = stored["command"]
    if command not in (None, grid.command):
        source = REPORT_FILES[command] if stored.get("derived") else GRID_FILE
        raise UsageError(
            f"--logdir {logdir} holds a {_NOUN[command]} ({source}), not a "
            f"{_NOUN[grid.command]}; use a new --logdir")
    differences = _differences(stored, plan_identity(grid))
    if differences:
        raise UsageError(
            f"--logdir {logdir} holds another {_NOUN[grid.command]}: "
            + "; ".join(differences)
            + "; use a new --logdir, or the flags it was made with")
