"""Without TensorFlow, with `KERAS_BACKEND` unset and a fresh Keras home.

Child processes see a `sitecustomize` that sets `sys.modules[name] = None`
for each module of `MISSING_MODULES`: what an uninstalled package looks
like (`importlib.util.find_spec` finds nothing, `import` raises
`ModuleNotFoundError`). In them:

* `import keras_attention` says in one line that Keras runs on JAX, and the
  layer then runs there; with no backend at all, importing the package is
  silent (TensorBoard imports it) and the first Keras name raises one line;
* the command line (`--help`, `train`, `export`) takes JAX and says so in
  one line, or exits with one line when it cannot;
* `tensorboard`, with TensorFlow, Keras, JAX and torch all missing, loads
  the Attention dashboard through the package's entry point and serves the
  maps the parent wrote, checked against the parent's arrays; from a copy
  of the package without the frontend's files it still starts, and the tab
  says why (read in Chromium under `-m slow`).

In this process: the backend rules (`choose_backend` against a fake
environment), the lazy names against their modules, and the loader's
fallback plugin. A `slow` test repeats the check in a real virtual
environment (it installs from the package index).
"""

import contextlib
import importlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest
from werkzeug.test import Client

from keras_attention import backend_choice
from keras_attention.events import SummaryWriter
from keras_attention.viz import write_attention_summary
from keras_attention.viz.summary import summary_tag
from keras_attention.viz.tensorboard_plugin import plugin as plugin_module
from keras_attention.viz.tensorboard_plugin import AttentionLoader
from keras_attention.viz.tensorboard_plugin import UnavailablePlugin

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import _browser  # noqa: E402  (headless Chromium, as the dashboard's tests)
FALLBACK_LINE = (
    "keras-attention: warning: TensorFlow, Keras's default backend, is not "
    "installed; Keras runs on jax (set KERAS_BACKEND to jax, torch or "
    "tensorflow to choose)")
NO_BACKEND = ("Keras needs a backend and none is installed: pip install jax "
              "(or torch, or tensorflow)")
SITECUSTOMIZE = """\
import os
import sys

# What an uninstalled package looks like to find_spec and import.
for _name in filter(None, os.environ.get("MISSING_MODULES", "").split(",")):
    sys.modules[_name] = None
"""
TINY_TRAIN = [
    "train", "--key-dim", "8", "--d-model", "16", "--batch-size", "8",
    "--heldout-size", "32", "--probe-size", "4", "--steps", "6",
    "--log-every", "3", "--eval-every", "3", "--diagnostics-every", "3",
    "--checkpoint-every", "6", "--quiet",
]


def child_env(tmp_path, missing=("tensorflow",)):
    """The environment of a child without `missing`, `KERAS_BACKEND` unset
    and a fresh `KERAS_HOME` (shared by the children of one test)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    home = tmp_path / "keras_home"
    home.mkdir(exist_ok=True)
    env = {key: value for key, value in os.environ.items()
           if key != "KERAS_BACKEND"}
    env.update(
        MISSING_MODULES=",".join(missing), KERAS_HOME=str(home),
        JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=os.pathsep.join(filter(None, [
            str(site), str(REPO), os.environ.get("PYTHONPATH")])),
    )
    return env


def run_child(args, env, cwd, timeout=300):
    return subprocess.run([sys.executable, *args], env=env, cwd=str(cwd),
                          capture_output=True, text=True, timeout=timeout)


def stderr_lines(child):
    return [line for line in child.stderr.splitlines() if line.strip()]


# ------------------------------------------------------ the library
def test_import_takes_jax_in_one_line(tmp_path):
    env = child_env(tmp_path)
    # As Keras writes it on its first import, whatever backend it ran on:
    # its own default, which names no choice.
    (tmp_path / "keras_home/keras.json").write_text(json.dumps({
        "floatx": "float32", "epsilon": 1e-07, "backend": "tensorflow",
        "image_data_format": "channels_last"}))
    child = run_child(["-c", (
        "import sys\n"
        "import keras_attention\n"
        "assert 'keras' not in sys.modules  # importing loads no Keras\n"
        "layer = keras_attention.ScaledDotProductAttention(key_dim=4)\n"
        "import keras\n"
        "import numpy as np\n"
        "x = np.random.default_rng(0).normal(size=(2, 3, 8))\n"
        "y = layer(x)\n"
        "print(keras.backend.backend(), type(y).__module__.split('.')[0],\n"
        "      bool(np.isfinite(keras.ops.convert_to_numpy(y)).all()))\n")],
        env, tmp_path)
    assert child.returncode == 0, child.stderr[-3000:]
    assert stderr_lines(child) == [FALLBACK_LINE]
    # A JAX array out of the layer.
    assert child.stdout.split() == ["jax", "jaxlib", "True"]


def test_without_any_backend_the_first_keras_name_says_so(tmp_path):
    env = child_env(tmp_path, missing=("tensorflow", "jax", "torch"))
    quiet = run_child(["-c", "import keras_attention"], env, tmp_path)
    assert quiet.returncode == 0 and stderr_lines(quiet) == []
    child = run_child(
        ["-c", "from keras_attention import ScaledDotProductAttention"],
        env, tmp_path)
    assert child.returncode == 1
    assert stderr_lines(child)[-1] == (
        f"ImportError: keras-attention: {NO_BACKEND}")
    # Not Keras's ModuleNotFoundError chained under it.
    assert "tensorflow" not in child.stderr.replace(NO_BACKEND, "")
    assert len(stderr_lines(child)) <= 8, child.stderr


# --------------------------------------------------- the command line
def test_command_line_takes_jax_says_so_and_works(tmp_path):
    logdir = tmp_path / "run"
    out = tmp_path / "exported.keras"
    # One process for the three commands (a process costs ~6 s of imports
    # here): `python -m pipelines --help`, then `main` for the others.
    child = run_child(["-c", (
        "import runpy, sys\n"
        "sys.argv = ['keras-attention', '--help']\n"
        "try:\n"
        "    runpy.run_module('pipelines', run_name='__main__')\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 0, exit.code\n"
        "from pipelines.cli import main\n"
        f"assert main({TINY_TRAIN + ['--logdir', str(logdir)]!r}) == 0\n"
        f"assert main(['export', '--logdir', {str(logdir)!r}, '--out',\n"
        f"             {str(out)!r}]) == 0\n")],
        child_env(tmp_path), tmp_path, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    assert stderr_lines(child) == [FALLBACK_LINE], child.stderr
    assert child.stdout.startswith("usage: keras-attention")
    assert json.loads((logdir / "config.json").read_text())["backend"] == "jax"
    assert json.loads((logdir / "metrics.json").read_text())["steps"] == 6
    assert out.is_file()
    # Keras wrote "tensorflow" into the fresh home's keras.json on its first
    # import (its default, though it ran on JAX), which is why that value
    # is no choice.
    keras_json = json.loads((tmp_path / "keras_home/keras.json").read_text())
    assert keras_json["backend"] == "tensorflow"


@pytest.mark.parametrize("missing, args, status, line", [
    (("tensorflow", "jax", "torch"), ["--help"], 1,
     f"keras-attention: error: {NO_BACKEND}"),
    (("tensorflow",), ["train", "--backend", "tensorflow"], 2,
     "keras-attention: error: --backend tensorflow: tensorflow is not "
     "installed (pip install tensorflow)"),
])
def test_command_line_without_its_backend_exits_in_one_line(
        tmp_path, missing, args, status, line):
    child = run_child(["-m", "pipelines", *args],
                      child_env(tmp_path, missing), tmp_path)
    assert child.returncode == status
    assert stderr_lines(child) == [line]
    assert child.stdout == ""


def test_backend_flag_is_read_before_the_package_is_imported(tmp_path):
    """`--backend` must be in `KERAS_BACKEND` before `import keras_attention`
    picks a fallback: the module that reads it imports neither."""
    child = run_child(["-c", (
        "import sys\n"
        "import pipelines.backends\n"
        "print(sorted(name for name, module in sys.modules.items()\n"
        "             if module is not None\n"
        "             and name.split('.')[0] in ('keras',\n"
        "                                        'keras_attention')))\n"
    )], child_env(tmp_path), tmp_path)
    assert child.returncode == 0, child.stderr
    assert (child.stdout.strip(), child.stderr) == ("[]", "")


# --------------------------------------------------------- TensorBoard
def write_maps(logdir):
    """Two steps of one layer's maps; `{step: weights}` as written."""
    rng = np.random.default_rng(7)
    written = {}
    with SummaryWriter(str(logdir)) as writer:
        for step in (3, 9):
            scores = rng.normal(0.0, 1.5, (2, 2, 4, 4))
            weights = np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)
            write_attention_summary("layer_x", {"weights": weights}, step,
                                    ["a", "b", "c", "d"], writer=writer)
            written[step] = weights
    return written


def get(url, timeout=30):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read(), dict(response.headers)


@contextlib.contextmanager
def tensorboard(logdir, env, log, command=(sys.executable, "-m",
                                           "tensorboard.main")):
    """Plain TensorBoard on `logdir` in a child (`--port 0`); yields its URL
    once it serves, stops it after, and fails if its log shows a
    traceback."""
    with open(log, "w") as output:
        server = subprocess.Popen(
            [*command, "--logdir", str(logdir), "--host", "127.0.0.1",
             "--port", "0"], env=env, cwd=str(log.parent), stdout=output,
            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        match = None
        while match is None and server.poll() is None:
            if time.monotonic() > deadline:
                break
            match = re.search(r"at (http://127\.0\.0\.1:\d+)/",
                              log.read_text())
            time.sleep(0.2)
        if match is None:
            pytest.fail(f"TensorBoard did not start:\n{log.read_text()}")
        yield match.group(1)
        assert server.poll() is None, log.read_text()
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert "Traceback" not in log.read_text(), log.read_text()


def test_tensorboard_serves_maps_without_keras(tmp_path):
    written = write_maps(tmp_path / "logs" / "run_a")
    env = child_env(tmp_path, ("tensorflow", "keras", "jax", "torch"))
    with tensorboard(tmp_path / "logs", env, tmp_path / "tb.log") as url:
        listing = json.loads(get(f"{url}/data/plugins_listing")[0])
        # Enabled: TensorBoard found the plugin's data in the run.
        assert listing["attention"]["enabled"] is True
        assert listing["attention"]["tab_name"] == "Attention"
        base = f"{url}/data/plugin/attention"
        tag = summary_tag("layer_x")
        assert json.loads(get(f"{base}/tags")[0]) == {
            "run_a": {tag: {"layer": "layer_x", "steps": [3, 9]}}}
        query = urllib.parse.urlencode(
            {"run": "run_a", "tag": tag, "step": 9, "example": 1})
        body, headers = get(f"{base}/weights?{query}")
        assert headers["X-Attention-Shape"] == "2,4,4"
        served = np.frombuffer(body, "<f2").reshape(2, 4, 4)
        np.testing.assert_allclose(served, written[9][1], atol=5e-4)
        meta = json.loads(get(f"{base}/meta?{query}")[0])
        assert meta["step"] == 9 and meta["query_labels"][1] == list("abcd")
        index = get(f"{base}/index.js")[0]
        assert index == (plugin_module._STATIC / "index.js").read_bytes()


@pytest.mark.parametrize("browser_check", [
    False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_broken_install_keeps_tensorboard_and_says_why(tmp_path,
                                                         browser_check):
    """A copy of the package without the frontend's files, first on the
    path: TensorBoard starts, serves its other routes, and the tab's module
    says what is missing; in Chromium (slow), the ATTENTION tab shows it."""
    if browser_check and not _browser.have_chromium():
        pytest.skip("needs /usr/bin/chromium and /usr/bin/chromedriver")
    write_maps(tmp_path / "logs" / "run_a")
    copy = tmp_path / "broken"
    shutil.copytree(REPO / "keras_attention", copy / "keras_attention",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.rmtree(copy / "keras_attention/viz/tensorboard_plugin/static")
    env = child_env(tmp_path, ("tensorflow", "keras", "jax", "torch"))
    env["PYTHONPATH"] = os.pathsep.join([str(copy), env["PYTHONPATH"]])
    with tensorboard(tmp_path / "logs", env, tmp_path / "tb.log") as url:
        listing = json.loads(get(f"{url}/data/plugins_listing")[0])
        assert listing["attention"]["enabled"] is True
        assert "scalars" in listing
        script = get(f"{url}/data/plugin/attention/index.js")[0].decode()
        shown = json.loads(re.search(r"textContent = (.*);", script).group(1))
        assert shown.startswith("The Attention dashboard could not load: ")
        assert "FileNotFoundError" in shown and "static" in shown
        if browser_check:
            assert shown == tab_text(url)


def tab_text(url):
    """The text of the ATTENTION tab's page, read in headless Chromium."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    driver = _browser.chromium()
    try:
        driver.get(f"{url}/#attention")
        wait = WebDriverWait(driver, 60)
        frame = wait.until(expected_conditions.presence_of_element_located((
            By.CSS_SELECTOR,
            "iframe[src*='plugin_entry.html?name=attention']")))
        driver.switch_to.frame(frame)
        return wait.until(expected_conditions.presence_of_element_located((
            By.ID, "unavailable"))).text
    finally:
        driver.quit()


def test_the_plugin_imports_no_backend_when_one_is_installed(tmp_path):
    child = run_child(["-c", (
        "import sys\n"
        "from keras_attention.viz.tensorboard_plugin import AttentionLoader\n"
        "print(sorted(name for name, module in sys.modules.items()\n"
        "             if module is not None and name.split('.')[0] in\n"
        "             ('keras', 'tensorflow', 'jax', 'torch')))\n")],
        child_env(tmp_path), tmp_path)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "[]"
    # The package's import picked the backend a later Keras import uses.
    assert stderr_lines(child) == [FALLBACK_LINE]


class _Context:
    data_provider = None


def test_a_dashboard_that_cannot_load_says_why_in_its_tab(monkeypatch,
                                                          tmp_path):
    monkeypatch.setattr(plugin_module, "_STATIC", tmp_path / "missing")
    loaded = AttentionLoader().load(_Context())
    assert isinstance(loaded, UnavailablePlugin)
    assert loaded.plugin_name == "attention"
    assert loaded.frontend_metadata().es_module_path == "/index.js"
    response = Client(loaded.get_plugin_apps()["/index.js"]).get("/index.js")
    assert response.status_code == 200
    assert response.mimetype == "text/javascript"
    script = response.get_data(as_text=True)
    assert "export function render()" in script
    shown = json.loads(re.search(r"textContent = (.*);", script).group(1))
    assert shown.startswith("The Attention dashboard could not load: ")
    assert str(tmp_path / "missing") in shown


def test_loader_flags_never_stop_tensorboard():
    class Flags:
        samples_per_plugin = "scalars=5"

    flags = Flags()
    AttentionLoader().fix_flags(flags)
    assert flags.samples_per_plugin == {"scalars": 5, "attention": 0}
    AttentionLoader().fix_flags(object())  # no such flag: still no raise


# ------------------------------------------------------- the rules
@pytest.fixture
def installed(monkeypatch):
    """Sets which frameworks `backend_choice` finds."""
    def set_installed(*names):
        monkeypatch.setattr(backend_choice, "installed",
                            lambda backend: backend in names)
    return set_installed


def keras_home(tmp_path, backend=None):
    if backend is not None:
        (tmp_path / "keras.json").write_text(json.dumps(
            {"floatx": "float32", "backend": backend}))
    return {"KERAS_HOME": str(tmp_path)}


def test_backend_rules(tmp_path, installed):
    choose = backend_choice.choose_backend
    installed("jax", "torch")
    home = keras_home(tmp_path)
    assert choose(home) == ("jax", "fallback", FALLBACK_LINE.split(
        "warning: ")[1], None)
    assert choose({**home, "KERAS_BACKEND": "torch"}) == (
        "torch", "KERAS_BACKEND", None, None)
    assert choose(keras_home(tmp_path, "torch")) == (
        "torch", str(tmp_path / "keras.json"), None, None)
    # Keras writes "tensorflow" itself: not a choice.
    assert choose(keras_home(tmp_path, "tensorflow")).backend == "jax"
    installed("torch")
    assert choose(keras_home(tmp_path, "tensorflow")).backend == "torch"
    installed("tensorflow", "jax")
    assert choose(keras_home(tmp_path, "tensorflow")) == (
        "tensorflow", "default", None, None)
    problem = choose({**home, "KERAS_BACKEND": "torch"}).problem
    assert problem == ("KERAS_BACKEND names torch, which is not installed: "
                       "pip install torch, or set KERAS_BACKEND to jax, "
                       "torch or tensorflow to choose")
    installed()
    assert choose(keras_home(tmp_path)) == (None, "default", None, NO_BACKEND)


def test_use_installed_backend_sets_the_variable_once(tmp_path, installed,
                                                      monkeypatch, capsys):
    installed("jax")
    environ = keras_home(tmp_path)
    # Keras is imported in this process; the choice only matters before.
    assert backend_choice.use_installed_backend(environ) is None
    monkeypatch.delitem(sys.modules, "keras")
    assert backend_choice.use_installed_backend(environ).backend == "jax"
    assert environ["KERAS_BACKEND"] == "jax"
    assert backend_choice.use_installed_backend(environ).source == (
        "KERAS_BACKEND")
    assert capsys.readouterr().err.splitlines() == [FALLBACK_LINE]


def test_keras_config_path_follows_keras(tmp_path):
    assert backend_choice.keras_config_path({"KERAS_HOME": str(tmp_path)}) \
        == str(tmp_path / "keras.json")
    (tmp_path / "keras.json").write_text("not json")
    assert backend_choice.keras_config_backend(
        {"KERAS_HOME": str(tmp_path)}) is None


# ------------------------------------------------- a real environment
# The README's "Without TensorFlow" install, less TensorFlow's packages.
VENV_PACKAGES = ("keras", "jax", "numpy", "tensorboard", "matplotlib",
                 "markdown-it-py")


@pytest.mark.slow
def test_in_a_real_venv_without_tensorflow(tmp_path):
    """A fresh virtual environment with the package installed (from a copy
    of the source, as a wheel: its entry points and static files as a user
    gets them) and no TensorFlow: import, the command line and plain
    `tensorboard`. Needs the package index (skipped without it)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                   timeout=300)
    bin_dir = venv / "bin"
    source = tmp_path / "source"
    source.mkdir()
    for name in ("keras_attention", "pipelines", "pyproject.toml",
                 "README.md"):
        subprocess.run(["cp", "-r", str(REPO / name), str(source / name)],
                       check=True)
    install = subprocess.run(
        [str(bin_dir / "pip"), "install", "-q", *VENV_PACKAGES],
        capture_output=True, text=True, timeout=1800)
    if install.returncode != 0:
        pytest.skip(f"pip could not install {VENV_PACKAGES}: "
                    f"{install.stderr.strip().splitlines()[-1:]}")
    subprocess.run([str(bin_dir / "pip"), "install", "-q", "--no-deps",
                    str(source)], check=True, timeout=600,
                   capture_output=True)
    env = {key: value for key, value in os.environ.items()
           if key not in ("KERAS_BACKEND", "PYTHONPATH")}
    env.update(KERAS_HOME=str(tmp_path / "keras_home"), JAX_PLATFORMS="cpu",
               PATH=os.pathsep.join([str(bin_dir), env.get("PATH", "")]))

    def run(*args):
        return subprocess.run(list(args), env=env, cwd=str(tmp_path),
                              capture_output=True, text=True, timeout=600)

    missing = run("python", "-c", "import tensorflow")
    assert "No module named 'tensorflow'" in missing.stderr
    for child in (run("python", "-c", "import keras_attention"),
                  run("keras-attention", "--help"),
                  run("keras-attention", *TINY_TRAIN, "--logdir",
                      str(tmp_path / "run"))):
        assert child.returncode == 0, child.stderr[-3000:]
        assert stderr_lines(child) == [FALLBACK_LINE], child.stderr
    with tensorboard(tmp_path / "run", env, tmp_path / "tb.log",
                     command=[str(bin_dir / "tensorboard")]) as url:
        tags = json.loads(get(f"{url}/data/plugin/attention/tags")[0])
        maps = tags["validation"]["attention/attention_0/maps"]
        assert maps["steps"] == [0, 3, 6]


@pytest.mark.parametrize("package", ["keras_attention", "keras_attention.viz"])
def test_lazy_names_are_their_modules_objects(package):
    module = importlib.import_module(package)
    for name in module.__all__:
        home = importlib.import_module(module._LAZY_EXPORTS[name])
        assert getattr(module, name) is getattr(home, name), name
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError, match="no_such_name"):
        module.no_such_name  # noqa: B018
    namespace = {}
    exec(f"from {package} import *", namespace)
    assert set(module.__all__) <= set(namespace)
