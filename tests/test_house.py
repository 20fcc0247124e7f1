"""The house rules, checked by reading the source, not by importing it:

* the floors: imports point down only (core -> layer -> what is built on
  it -> pipelines -> command line), every library module is placed on a
  floor, no import cycle, and a framework only where the job is that
  framework's: the import contracts of `[tool.importlinter]` in
  pyproject.toml, run by `lint-imports`;
* what import-linter cannot say: no function-local import of a project
  module in the library or the pipelines (they only dodge cycles); a
  framework imported at module level only by its backend's training module
  (so the rest loads without TensorFlow); a lazy re-export table
  (`keras_attention.lazy`, PEP 562, which import-linter does not see as
  imports) naming only modules of its own package;
* the size of a module in keras_attention/, pipelines/ and scripts/ is a
  reason rule, not a cap: over 400 lines it is reported (a
  `LongModuleWarning` in the run's warnings summary: does it still have one
  job?), over 600 the test fails (split it by reason to change); every line
  of those modules is at most 79 columns;
* each package's `__init__.py` has a docstring.

Each checker is tested first on a small fake tree, or on a copy of the real
one with one rule broken, so none of them can pass by finding nothing.
"""

import ast
import os
import pathlib
import shutil
import subprocess
import sys
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROJECT_PACKAGES = ("keras_attention", "pipelines")
# A module over REVIEW_LINES is looked at again, over SPLIT_LINES it is
# split by reason to change: the count alone is no reason to move code (a
# cap of 400 had commits move code out only for the count). LINE_WIDTH is
# the house's width (PEP 8's 79 columns).
REVIEW_LINES, SPLIT_LINES, LINE_WIDTH = 400, 600, 79
LINE_CHECKED_DIRECTORIES = ("keras_attention", "pipelines", "scripts")
# Only a backend's own training module imports its framework at its top;
# everything else imports it inside the function that uses it (the export,
# the TensorFlow kernels, the per-backend gradients), so the library and the
# pipelines load without TensorFlow.
FRAMEWORKS = ("tensorflow", "jax", "torch")
FRAMEWORK_MODULES = {f"pipelines.backends._{name}": name
                     for name in FRAMEWORKS}
# The module-level table of a lazy package (`keras_attention.lazy`).
LAZY_TABLE = "_LAZY_EXPORTS"


# ------------------------------------------------------------ the checkers
def lint_imports(root):
    """Runs the import contracts of `root`/pyproject.toml on the packages
    under `root`; returns `(passed, report)`."""
    # A child process: `lint_imports` puts its working directory first on
    # sys.path, so it reads the tree at `root`, not an installed copy.
    # Wide: one line per contract, its name and KEPT or BROKEN.
    env = dict(os.environ, COLUMNS="1000")
    child = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import "
         "lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300)
    return child.returncode == 0, child.stdout + child.stderr


def modules(root, packages=PROJECT_PACKAGES):
    """Dotted module name -> path of every .py file under `packages`."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported_names(node):
    """The modules an import statement names (a relative one with its
    leading dots)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return ["." * node.level + (node.module or "")]


def _is_project(name):
    return name.startswith(".") or name.split(".")[0] in PROJECT_PACKAGES


def local_project_imports(root):
    """Function-local imports of a project module, as readable lines."""
    problems = []
    for module, path in modules(root).items():
        stack = [(ast.parse(path.read_text()), False)]
        while stack:
            node, local = stack.pop()
            for child in ast.iter_child_nodes(node):
                inside = local or isinstance(child, (
                    ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if local and isinstance(child, (ast.Import, ast.ImportFrom)):
                    problems += [
                        f"{path.relative_to(root)}:{child.lineno}: {module} "
                        f"imports {name} inside a function"
                        for name in _imported_names(child)
                        if _is_project(name)]
                stack.append((child, inside))
    return sorted(problems)


def top_level_framework_imports(root):
    """`(module, framework)` of every module-level import of a framework
    outside the module allowed to import it."""
    found = []
    for module, path in modules(root).items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in _imported_names(node):
                    framework = name.split(".")[0]
                    if (framework in FRAMEWORKS
                            and FRAMEWORK_MODULES.get(module) != framework):
                        found.append((module, framework))
    return found


def foreign_lazy_exports(root):
    """Modules named in a package's module-level `LAZY_TABLE` that are not
    inside that package: a lazy re-export is an import import-linter does
    not see, so it may only reach down into its own package."""
    problems = []
    for module, path in modules(root).items():
        for node in ast.parse(path.read_text()).body:
            if (isinstance(node, ast.Assign)
                    and isinstance(node.value, ast.Dict)
                    and any(isinstance(target, ast.Name)
                            and target.id == LAZY_TABLE
                            for target in node.targets)):
                problems += [
                    f"{module} re-exports from {value.value}"
                    for value in node.value.values
                    if isinstance(value, ast.Constant)
                    and not value.value.startswith(module + ".")]
    return problems


class LongModuleWarning(UserWarning):
    """A module over `REVIEW_LINES` lines: shown in the warnings summary
    that every pytest run prints, CI's included."""


def checked_modules(root, directories=LINE_CHECKED_DIRECTORIES):
    """`(relative path, lines)` of every .py file under `directories`."""
    for directory in directories:
        for path in sorted((root / directory).rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield (path.relative_to(root).as_posix(),
                       path.read_text().splitlines())


def check_module_lengths(root, directories=LINE_CHECKED_DIRECTORIES):
    """Warns a `LongModuleWarning` for each .py file over `REVIEW_LINES`
    lines; returns `(path, lines)` of those over `SPLIT_LINES`."""
    too_long = []
    for relative, lines in checked_modules(root, directories):
        if len(lines) > SPLIT_LINES:
            too_long.append((relative, len(lines)))
        elif len(lines) > REVIEW_LINES:
            # Reported at the module itself: the summary reads
            # `path:1: LongModuleWarning: 456 lines, ...`.
            warnings.warn_explicit(
                f"{len(lines)} lines, over {REVIEW_LINES}: does it still "
                "have one job?", LongModuleWarning, relative, 1)
    return too_long


def wide_lines(root, directories=LINE_CHECKED_DIRECTORIES):
    """`path:line: N columns` of every line wider than `LINE_WIDTH`."""
    return [f"{relative}:{number}: {len(line)} columns"
            for relative, lines in checked_modules(root, directories)
            for number, line in enumerate(lines, 1)
            if len(line) > LINE_WIDTH]


def packages_without_docstring(root, packages=PROJECT_PACKAGES):
    """`__init__.py` files under `packages` without a module docstring."""
    missing = []
    for package in packages:
        for path in sorted((root / package).rglob("__init__.py")):
            if ast.get_docstring(ast.parse(path.read_text())) is None:
                missing.append(path.relative_to(root).as_posix())
    return missing


# ------------------------------------------------- on a broken copy / fake
def _write(root, relative, text):
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _append(root, relative, text):
    path = root / relative
    path.write_text(path.read_text() + text)


@pytest.fixture
def tree_copy(tmp_path):
    """The packages' sources and pyproject.toml, copied."""
    for package in PROJECT_PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


# One broken rule each, and the contract that must report it.
BROKEN_FLOORS = {
    "core imports the layer": (
        "keras_attention/ops.py", "from keras_attention import layer\n",
        "The library's floors"),
    "the layer imports a task": (
        "keras_attention/layer.py",
        "from keras_attention.tasks import base\n", "The library's floors"),
    "a library module with no floor": (
        "keras_attention/extra.py", "import numpy\n", "The library's floors"),
    "the library imports the pipelines": (
        "keras_attention/tasks/base.py",
        "def f():\n    from pipelines import train\n",
        "The library never imports the pipelines"),
    "a library module imports the package's re-exports": (
        "keras_attention/models.py", "import keras_attention\n",
        "The package's re-exports"),
    "the engine imports the command line": (
        "pipelines/engine/run.py", "from pipelines import cli\n",
        "The command line is the top floor"),
    "a cycle between two pipeline modules": (
        "pipelines/common.py", "from pipelines import train\n",
        "No import cycle"),
    "the engine imports a report": (
        "pipelines/engine/plan.py", "from pipelines import compare\n",
        "The trainer and the experiment engine"),
    "a task imports a model": (
        "keras_attention/tasks/base.py",
        "from keras_attention import models\n", "Tasks, models"),
    "a task imports TensorFlow": (
        "keras_attention/tasks/base.py",
        "def f():\n    import tensorflow\n", "A framework is imported only"),
}


@pytest.mark.parametrize("broken", BROKEN_FLOORS)
def test_each_contract_reports_its_broken_rule(tree_copy, broken):
    relative, text, contract = BROKEN_FLOORS[broken]
    if (tree_copy / relative).exists():
        _append(tree_copy, relative, text)
    else:
        _write(tree_copy, relative, text)
    passed, report = lint_imports(tree_copy)
    assert not passed, report
    # Others may break too (an upward import often closes a cycle).
    assert any(line.startswith(contract) and " BROKEN" in line
               for line in report.splitlines()), report


def test_ast_checkers_on_a_fake_tree(tmp_path):
    files = {
        "keras_attention/__init__.py": '"""Library."""\n'
        f'{LAZY_TABLE} = {{"Layer": "keras_attention.layer",\n'
        '                  "train": "pipelines.train"}\n',
        "keras_attention/ops.py": "import numpy\ndef f():\n    import jax\n",
        "keras_attention/layer.py": "import tensorflow as tf\n"
        "def f():\n    from .ops import numpy\n",
        "keras_attention/tasks/__init__.py": "from .base import Task\n",
        "keras_attention/tasks/base.py": "x = 1\n" * 401,
        "pipelines/__init__.py": '"""Pipelines."""\n',
        "pipelines/backends/_jax.py": "import jax\nimport torch\n",
        "pipelines/train.py": "def f():\n    import keras_attention.tasks\n",
        "keras_attention/models.py": "x = 1\n" * 400,
        "scripts/bench.py": "x = 1\n" * 600,
        "scripts/long.py": "x = 1\n" * 601,
        "pipelines/wide.py": "x = 1\n" + "x" * 79 + "\n" + "é" * 80 + "\n",
        "pipelines/notes.txt": "x" * 100 + "\n" * 700,
    }
    for relative, text in files.items():
        _write(tmp_path, relative, text)
    assert local_project_imports(tmp_path) == [
        "keras_attention/layer.py:3: keras_attention.layer imports .ops "
        "inside a function",
        "pipelines/train.py:2: pipelines.train imports keras_attention.tasks"
        " inside a function",
    ]  # jax inside ops is not the project's
    assert sorted(top_level_framework_imports(tmp_path)) == [
        ("keras_attention.layer", "tensorflow"),
        ("pipelines.backends._jax", "torch"),
    ]
    assert foreign_lazy_exports(tmp_path) == [
        "keras_attention re-exports from pipelines.train"]
    with pytest.warns(LongModuleWarning) as reported:
        assert check_module_lengths(tmp_path) == [("scripts/long.py", 601)]
    assert [(warning.filename, str(warning.message))
            for warning in reported] == [
        ("keras_attention/tasks/base.py",
         "401 lines, over 400: does it still have one job?"),
        ("scripts/bench.py",
         "600 lines, over 400: does it still have one job?"),
    ]  # 400 lines or fewer pass quietly; a .txt file is not a module
    # Columns are characters, not bytes.
    assert wide_lines(tmp_path) == ["pipelines/wide.py:3: 80 columns"]
    assert packages_without_docstring(tmp_path) == [
        "keras_attention/tasks/__init__.py"]


# ------------------------------------------------------- on the real tree
def _listing(title, lines):
    return f"{title} ({len(lines)}):\n  " + "\n  ".join(map(str, lines))


def test_import_contracts_hold():
    passed, report = lint_imports(ROOT)
    assert passed, report


def test_no_function_local_project_imports():
    problems = local_project_imports(ROOT)
    assert not problems, _listing(
        "function-local imports of project modules", problems)


def test_frameworks_are_imported_at_module_level_only_by_their_backend():
    found = top_level_framework_imports(ROOT)
    assert not found, _listing("module-level framework imports", found)


def test_lazy_exports_stay_inside_their_package():
    problems = foreign_lazy_exports(ROOT)
    assert not problems, _listing("lazy re-exports from elsewhere", problems)


def test_module_lengths():
    # Modules over 400 lines are reported, not failed: they appear in the
    # warnings summary at the end of the run.
    too_long = check_module_lengths(ROOT)
    assert not too_long, _listing(
        f"modules over {SPLIT_LINES} lines: split them by reason to change",
        [f"{path}: {count} lines" for path, count in too_long])


def test_lines_are_at_most_79_columns():
    wide = wide_lines(ROOT)
    assert not wide, _listing(f"lines over {LINE_WIDTH} columns", wide)


def test_every_package_init_has_a_docstring():
    missing = packages_without_docstring(ROOT)
    assert not missing, _listing("package __init__.py without docstring",
                                 missing)
