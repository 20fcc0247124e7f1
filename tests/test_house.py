"""The house rules of issue 10, checked by reading the source (ast), not by
importing it:

* every module in keras_attention/, pipelines/ and scripts/ has at most 400
  lines; keras_attention/layer.py (one public class) at most 500;
* imports point down the floors of `FLOORS` (same floor is fine), and every
  project module has a floor there, so a new module is placed deliberately;
* no import cycle among the project modules (module-level imports);
* no function-local import of a project module in the library or the
  pipelines (they only dodge cycles);
* each package's `__init__.py` has a docstring.

A package that re-exports lazily (`keras_attention.lazy`: PEP 562, so that
TensorBoard loads the dashboard without Keras) names its modules in a
module-level `_LAZY_EXPORTS = {name: "module", ...}` table; each module it
names counts as a module-level import, so floors and cycles see through it.

Each checker is a plain function of a source root, tested first on a small
fake tree (so none of them can pass by finding nothing), then on the real
one.
"""

import ast
import dataclasses
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROJECT_PACKAGES = ("keras_attention", "pipelines")
LINE_LIMIT = 400
# Keras's rule: one documented public class, one file.
LINE_LIMIT_EXCEPTIONS = {"keras_attention/layer.py": 500}
LINE_CHECKED_DIRECTORIES = ("keras_attention", "pipelines", "scripts")

# Floors (issue 10, contract "The house rules"): a module may import its own
# floor or a lower one. A key names a module and, for a package, everything
# inside it; the longest matching key wins. The two top-level packages are
# listed by themselves only (`EXACT`), so a new module never inherits a floor
# from them: add it here.
FLOORS = {
    # 0, core: the functional maths and argument checks.
    "keras_attention.ops": 0,
    "keras_attention.scales": 0,
    "keras_attention.memory_efficient": 0,
    "keras_attention.files": 0,
    "keras_attention.validation": 0,
    "keras_attention.initializers": 0,
    "keras_attention.events": 0,
    "keras_attention.backend_choice": 0,
    "keras_attention.lazy": 0,
    # 1, the layer, its private helpers and the recording hook.
    "keras_attention.layer": 1,
    "keras_attention._layer_utils": 1,
    "keras_attention.recording": 1,
    "keras_attention._keras_layers": 1,
    # 2, what is built from layers.
    "keras_attention.transformer_block": 2,
    "keras_attention.models": 2,
    "keras_attention.embeddings": 2,
    "keras_attention.tasks": 2,
    "keras_attention.tasks.corpus": 2,
    "keras_attention.tasks.text": 2,
    "keras_attention.tasks.text_patterns": 2,
    "keras_attention.diagnostics": 2,
    "keras_attention.diagnostics.length": 2,
    "keras_attention.serving": 2,
    "keras_attention.export_onnx": 2,
    "keras_attention.export": 2,
    "keras_attention.viz": 2,
    "keras_attention.dashboard": 2,
    "keras_attention.callbacks": 2,
    "keras_attention": 2,  # the package's re-exports
    # 3, the pipelines.
    "pipelines": 3,
    "pipelines.common": 3,
    "pipelines.settings": 3,
    "pipelines.flags": 3,
    "pipelines.devices": 3,
    "pipelines.builders": 3,
    "pipelines.tensorboard": 3,
    "pipelines.run_dir": 3,
    "pipelines.locks": 3,
    "pipelines.failures": 3,
    "pipelines.numerics": 3,
    "pipelines.steps": 3,
    "pipelines.backends": 3,
    "pipelines.checkpoints": 3,
    "pipelines.clock": 3,
    "pipelines.step_display": 3,
    "pipelines.train": 3,
    "pipelines.export": 3,
    "pipelines.variance": 3,
    "pipelines.engine": 3,
    "pipelines.reports": 3,
    "pipelines.compare": 3,
    "pipelines.sweep": 3,
    # 4, the command line.
    "pipelines.cli": 4,
    "pipelines.__main__": 4,
}
EXACT = frozenset(PROJECT_PACKAGES)
# The module-level table of a lazy package (`keras_attention.lazy`).
LAZY_TABLE = "_LAZY_EXPORTS"


@dataclasses.dataclass(frozen=True)
class Import:
    """One import of a project module: who imports what, where, and whether
    the import statement sits inside a function."""

    source: str
    target: str
    path: str
    line: int
    local: bool

    def where(self):
        return f"{self.path}:{self.line}"


# ------------------------------------------------------------ the checkers
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


def _resolve(name, known):
    """The project module that `name` (maybe `package.attribute`) means: the
    longest prefix of it that is a known module, else `name` itself."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return name


def _is_project(name):
    return name.split(".")[0] in PROJECT_PACKAGES


def imports(root, packages=PROJECT_PACKAGES):
    """Every import of a project module in the modules under `packages`.

    `from pkg import name` resolves to the submodule `pkg.name` when there is
    one; relative imports are resolved against the importing module.
    """
    known = modules(root, packages)
    found = []
    for source, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        relative_path = str(path.relative_to(root))
        for node, local in sorted(_import_nodes(tree),
                                  key=lambda pair: pair[0].lineno):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    package = source if is_package else source.rpartition(".")[0]
                    up = package.split(".")
                    up = up[: len(up) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in known
                    else base
                    for alias in node.names
                ]
            for target in dict.fromkeys(targets):
                if _is_project(target):
                    found.append(Import(source, _resolve(target, known),
                                        relative_path, node.lineno, local))
        for target, line in _lazy_targets(tree):
            if _is_project(target):
                found.append(Import(source, _resolve(target, known),
                                    relative_path, line, False))
    return found


def _lazy_targets(tree):
    """`(module, line)` of every module named in a module-level
    `LAZY_TABLE` dict of the module `tree`."""
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(target, ast.Name)
                        and target.id == LAZY_TABLE
                        for target in node.targets)):
            for value in node.value.values:
                if isinstance(value, ast.Constant) and isinstance(
                        value.value, str):
                    yield value.value, value.lineno


def _import_nodes(tree):
    """`(node, local)` for every import statement; `local` when it is inside
    a function (at any depth)."""
    stack = [(tree, False)]
    while stack:
        node, local = stack.pop()
        for child in ast.iter_child_nodes(node):
            inside = local or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, local
            stack.append((child, inside))


def floor_of(name, floors=FLOORS, exact=EXACT):
    """The floor of module `name`: the longest key of `floors` that is the
    name or a package above it (keys in `exact` match only themselves);
    `None` if there is none."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        key = ".".join(parts[:end])
        if key in floors and (end == len(parts) or key not in exact):
            return floors[key]
    return None


def long_modules(root, directories=LINE_CHECKED_DIRECTORIES, limit=LINE_LIMIT,
                 exceptions=LINE_LIMIT_EXCEPTIONS):
    """`(path, lines, limit)` of every .py file over its line limit."""
    offenders = []
    for directory in directories:
        for path in sorted((root / directory).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            relative = path.relative_to(root).as_posix()
            allowed = exceptions.get(relative, limit)
            count = len(path.read_text().splitlines())
            if count > allowed:
                offenders.append((relative, count, allowed))
    return offenders


def unplaced_modules(root, floors=FLOORS, exact=EXACT):
    """Project modules without a floor."""
    return [name for name in modules(root) if floor_of(name, floors, exact) is None]


def upward_imports(root, floors=FLOORS, exact=EXACT):
    """Imports (module level or local) of a module on a higher floor, or of
    a module without a floor, as readable lines."""
    problems = []
    for item in imports(root):
        source_floor = floor_of(item.source, floors, exact)
        target_floor = floor_of(item.target, floors, exact)
        if source_floor is None:
            continue  # Reported by unplaced_modules.
        if target_floor is None:
            problems.append(f"{item.where()}: {item.source} (floor "
                            f"{source_floor}) imports {item.target}, which "
                            "has no floor")
        elif target_floor > source_floor:
            problems.append(f"{item.where()}: {item.source} (floor "
                            f"{source_floor}) imports {item.target} (floor "
                            f"{target_floor})")
    return problems


def import_cycles(root):
    """The cycles among project modules' module-level imports: one list of
    modules per strongly connected component, as a closed path
    `[a, b, ..., a]` that follows real import edges."""
    known = modules(root)
    graph = {name: set() for name in known}
    for item in imports(root):
        if not item.local and item.target in graph and item.target != item.source:
            graph[item.source].add(item.target)
    cycles = []
    for component in _strongly_connected(graph):
        if len(component) > 1:
            cycles.append(_cycle_through(graph, set(component)))
    return cycles


def _strongly_connected(graph):
    """Tarjan's algorithm, iterative; components in discovery order."""
    index, low, on_stack, stack, result = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    result.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return result


def _cycle_through(graph, component):
    """A closed import path inside `component`, from its first member back."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # Breadth first: the shortest way back to `start`.
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    return paths[node] + [start]
                if child not in paths:
                    paths[child] = paths[node] + [child]
                    following.append(child)
        frontier = following
    return sorted(component)  # Not reached for a real component.


def local_project_imports(root):
    """Function-local imports of a project module, as readable lines."""
    return [
        f"{item.where()}: {item.source} imports {item.target} inside a function"
        for item in imports(root) if item.local
    ]


def packages_without_docstring(root, packages=PROJECT_PACKAGES):
    """`__init__.py` files under `packages` without a module docstring."""
    missing = []
    for package in packages:
        for path in sorted((root / package).rglob("__init__.py")):
            if ast.get_docstring(ast.parse(path.read_text())) is None:
                missing.append(path.relative_to(root).as_posix())
    return missing


# ------------------------------------------------------- on a fake tree
def _write(root, relative, text):
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def clean_tree(tmp_path):
    """A tiny tree that keeps every rule."""
    files = {
        "keras_attention/__init__.py": '"""Library."""\nfrom keras_attention.layer import Layer\n',
        "keras_attention/ops.py": "import numpy\n",
        "keras_attention/layer.py": "from keras_attention import ops\n"
        "from .ops import numpy\n",
        "keras_attention/tasks/__init__.py": '"""Tasks."""\nfrom .base import Task\n',
        "keras_attention/tasks/base.py": "from ..layer import Layer\n",
        "pipelines/__init__.py": '"""Pipelines."""\n',
        "pipelines/train.py": "import keras_attention.tasks\n"
        "def f():\n    import jax\n",
        "pipelines/cli.py": "from pipelines import train\n",
        "scripts/bench.py": "x = 1\n",
    }
    for relative, text in files.items():
        _write(tmp_path, relative, text)
    return tmp_path


def test_checkers_pass_a_clean_tree(clean_tree):
    assert set(modules(clean_tree)) == {
        "keras_attention", "keras_attention.ops", "keras_attention.layer",
        "keras_attention.tasks", "keras_attention.tasks.base", "pipelines",
        "pipelines.train", "pipelines.cli",
    }
    edges = {(i.source, i.target) for i in imports(clean_tree)}
    assert edges == {
        ("keras_attention", "keras_attention.layer"),
        ("keras_attention.layer", "keras_attention.ops"),  # both forms
        ("keras_attention.tasks", "keras_attention.tasks.base"),
        ("keras_attention.tasks.base", "keras_attention.layer"),
        ("pipelines.train", "keras_attention.tasks"),
        ("pipelines.cli", "pipelines.train"),  # `from pkg import module`
    }
    assert long_modules(clean_tree) == []
    assert unplaced_modules(clean_tree) == []
    assert upward_imports(clean_tree) == []
    assert import_cycles(clean_tree) == []
    assert local_project_imports(clean_tree) == []  # jax is not ours
    assert packages_without_docstring(clean_tree) == []


def test_long_files_are_listed_with_their_counts(clean_tree):
    _write(clean_tree, "pipelines/train.py", "x = 1\n" * 401)
    _write(clean_tree, "scripts/bench.py", "x = 1\n" * 450)
    _write(clean_tree, "keras_attention/layer.py", "x = 1\n" * 480)
    assert long_modules(clean_tree) == [
        ("pipelines/train.py", 401, 400), ("scripts/bench.py", 450, 400),
    ]
    _write(clean_tree, "keras_attention/layer.py", "x = 1\n" * 501)
    assert ("keras_attention/layer.py", 501, 500) in long_modules(clean_tree)


def test_an_upward_import_and_an_unplaced_module_are_found(clean_tree):
    _write(clean_tree, "keras_attention/ops.py",
           "def f():\n    from pipelines.train import x\n")
    _write(clean_tree, "keras_attention/extra.py", "from . import ops\n")
    _write(clean_tree, "pipelines/train.py", "from keras_attention import extra\n")
    assert upward_imports(clean_tree) == [
        "keras_attention/ops.py:2: keras_attention.ops (floor 0) imports "
        "pipelines.train (floor 3)",
        "pipelines/train.py:1: pipelines.train (floor 3) imports "
        "keras_attention.extra, which has no floor",
    ]
    assert unplaced_modules(clean_tree) == ["keras_attention.extra"]


def test_a_lazy_table_counts_as_imports(clean_tree):
    _write(clean_tree, "keras_attention/__init__.py",
           '"""Library."""\n'
           f'{LAZY_TABLE} = {{"Layer": "keras_attention.layer",\n'
           '                  "train": "pipelines.train"}\n')
    assert {(i.source, i.target, i.line, i.local)
            for i in imports(clean_tree) if i.source == "keras_attention"} == {
        ("keras_attention", "keras_attention.layer", 2, False),
        ("keras_attention", "pipelines.train", 3, False),
    }
    assert upward_imports(clean_tree) == [
        "keras_attention/__init__.py:3: keras_attention (floor 2) imports "
        "pipelines.train (floor 3)",
    ]
    # A module-level edge: a lazy table closes a cycle like an import.
    _write(clean_tree, "keras_attention/ops.py",
           f'{LAZY_TABLE} = {{"x": "keras_attention.layer"}}\n')
    assert import_cycles(clean_tree) == [
        ["keras_attention.layer", "keras_attention.ops",
         "keras_attention.layer"]
    ]


def test_a_cycle_is_reported_as_a_path(clean_tree):
    _write(clean_tree, "pipelines/train.py", "from pipelines import export\n")
    _write(clean_tree, "pipelines/export.py",
           "if True:\n    from .train import restore\n")
    assert import_cycles(clean_tree) == [
        ["pipelines.export", "pipelines.train", "pipelines.export"]
    ]
    # A function-local import is no module-level edge, but it is reported.
    _write(clean_tree, "pipelines/export.py",
           "def f():\n    from .train import restore\n")
    assert import_cycles(clean_tree) == []
    assert local_project_imports(clean_tree) == [
        "pipelines/export.py:2: pipelines.export imports pipelines.train "
        "inside a function"
    ]


def test_a_package_without_docstring_is_found(clean_tree):
    _write(clean_tree, "keras_attention/tasks/__init__.py", "from .base import Task\n")
    assert packages_without_docstring(clean_tree) == [
        "keras_attention/tasks/__init__.py"
    ]


def test_floor_table_lookup():
    assert floor_of("keras_attention.memory_efficient._blocks") == 0
    assert floor_of("keras_attention.layer") == 1
    assert floor_of("keras_attention.tasks.recall") == 2
    assert floor_of("keras_attention") == 2
    assert floor_of("keras_attention.new_module") is None  # not inherited
    assert floor_of("keras_attention.backend_choice") == 0
    assert floor_of("keras_attention.viz.summary_format") == 2
    assert floor_of("pipelines.compare.report") == 3
    assert floor_of("pipelines.cli") == 4
    assert floor_of("pipelines.somewhere") is None


# ------------------------------------------------------- on the real tree
def _listing(title, lines):
    return f"{title} ({len(lines)}):\n  " + "\n  ".join(lines)


def test_modules_are_at_most_400_lines():
    offenders = long_modules(ROOT)
    assert not offenders, _listing(
        "modules over their line limit",
        [f"{path}: {count} lines (limit {limit})"
         for path, count, limit in offenders],
    )


def test_every_project_module_has_a_floor():
    unplaced = unplaced_modules(ROOT)
    assert not unplaced, _listing(
        "modules missing from FLOORS in tests/test_house.py (place them on "
        "a floor deliberately)", unplaced,
    )


def test_imports_point_down_the_floors():
    problems = upward_imports(ROOT)
    assert not problems, _listing("imports of a higher floor", problems)


def test_no_import_cycle():
    cycles = import_cycles(ROOT)
    assert not cycles, _listing(
        "import cycles (module-level imports)",
        [" -> ".join(cycle) for cycle in cycles],
    )


def test_no_function_local_project_imports():
    problems = local_project_imports(ROOT)
    assert not problems, _listing(
        "function-local imports of project modules", problems
    )


def test_every_package_init_has_a_docstring():
    missing = packages_without_docstring(ROOT)
    assert not missing, _listing("package __init__.py without docstring",
                                 missing)


# The framework a module may import at its top: only a backend's own
# training module (`pipelines/backends/_<name>.py`) imports its framework
# there; everything else imports it inside the function that uses it (the
# export, the TensorFlow kernels, the per-backend gradients), so the
# library and the pipelines load without TensorFlow (issue 17).
FRAMEWORKS = ("tensorflow", "jax", "torch")
FRAMEWORK_MODULES = {f"pipelines.backends._{name}": name
                     for name in FRAMEWORKS}


def top_level_framework_imports(root):
    """`(module, framework)` of every module-level import of a framework
    outside the module allowed to import it."""
    found = []
    for module, path in modules(root).items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                framework = name.split(".")[0]
                if (framework in FRAMEWORKS
                        and FRAMEWORK_MODULES.get(module) != framework):
                    found.append((module, framework))
    return found


def test_frameworks_are_imported_at_module_level_only_by_their_backend(
        tmp_path):
    # The checker sees a top-level import, and not one inside a function.
    package = tmp_path / "keras_attention"
    package.mkdir()
    (package / "__init__.py").write_text('"""Fake."""\n')
    (package / "a.py").write_text("import tensorflow as tf\n")
    (package / "b.py").write_text("def f():\n    import torch\n")
    (tmp_path / "pipelines" / "backends").mkdir(parents=True)
    (tmp_path / "pipelines" / "__init__.py").write_text('"""Fake."""\n')
    (tmp_path / "pipelines" / "backends" / "_jax.py").write_text(
        "import jax\nimport torch\n")
    assert sorted(top_level_framework_imports(tmp_path)) == [
        ("keras_attention.a", "tensorflow"),
        ("pipelines.backends._jax", "torch"),
    ]
    assert top_level_framework_imports(ROOT) == []
