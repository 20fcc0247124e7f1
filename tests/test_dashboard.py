"""The Attention dashboard: the target cells of each task, the summary it
reads, and the ATTENTION tab itself in a real browser.

The browser tests train two tiny runs named as a comparison names them
(`scaled-dk16-seed0`, `unscaled-dk16-seed0`), add a 2048 x 2048 map written
by the summary API and a user's `fit` of a `MultiHeadAttention` model with
`AttentionMonitor` (examples/mha_fit_tensorboard.py, tiny), start one TensorBoard and one headless Chromium for the
module, and check what the page shows against the event files read here.
Screenshots of each state go to `$DASHBOARD_SCREENSHOTS` (or a temporary
directory); the path is printed.
"""

import glob
import os
import pathlib
import re
import runpy
import shutil
import sys
import time
import tomllib

import keras
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_file_loader import (
    EventFileLoader,
)
from tensorboard.compat.proto import summary_pb2
from tensorboard.util.tensor_util import make_ndarray

from keras_attention.events import SummaryWriter
from keras_attention.tasks import make_task
from keras_attention.viz import decode_summary
from keras_attention.viz import write_attention_summary
from keras_attention.viz.summary import PLUGIN_NAME
from keras_attention.viz.summary import summary_tag
from keras_attention.viz.tensorboard_plugin import AttentionLoader
from keras_attention.viz.tensorboard_plugin.plugin import static_files
from pipelines.settings import Layer
from pipelines.settings import resolve_config
from pipelines.train import train

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import _browser  # noqa: E402  (TensorBoard and Chromium, shared with the benchmark)


# ------------------------------------------------------------ target cells
def test_target_cells_hand_computed():
    recall = make_task("recall", num_pairs=3, num_keys=8, num_values=4)
    radix = 5  # num_values + 1
    # Pairs (k6, v1), (k2, v3), (k5, v0), then the query k2: the pair at 1.
    tokens = [1 + 6 * radix + 1, 1 + 2 * radix + 3, 1 + 5 * radix + 0,
              1 + 2 * radix + 4]
    assert recall.token_labels(tokens) == ["k6:v1", "k2:v3", "k5:v0", "k2:?"]
    assert recall.target_cells(tokens) == [(3, 1)]

    reverse = make_task("reverse", seq_len=5, vocab_size=8)
    assert reverse.target_cells([4, 5, 6, 0, 0]) == [(0, 2), (1, 1), (2, 0)]

    sort = make_task("sort", seq_len=5, vocab_size=8)
    # Sorted: 2 (at 3), 3 (at 1), 5, 5 (at 0 and 2): both 5s are sources.
    assert sort.target_cells([5, 3, 5, 2, 0]) == [
        (0, 3), (1, 1), (2, 0), (2, 2), (3, 0), (3, 2)]

    copy = make_task("copy", seq_len=7, vocab_size=8)
    # 5 3 <sep> <blank> <blank> <pad> <pad>: answers at 3, 4 read 0, 1.
    assert copy.target_cells([5, 3, 1, 2, 2, 0, 0]) == [(3, 0), (4, 1)]
    assert copy.target_cells([[5, 3, 1, 2, 2, 0, 0],
                              [6, 1, 2, 0, 0, 0, 0]]) == [
        [(3, 0), (4, 1)], [(2, 0)]]


@pytest.mark.parametrize("name, options", [
    ("recall", dict(num_pairs=6, num_keys=10, num_values=4)),
    ("reverse", dict(seq_len=7, vocab_size=6, min_len=2)),
    ("sort", dict(seq_len=7, vocab_size=4)),
    ("copy", dict(seq_len=11, vocab_size=7, min_len=1)),
])
def test_target_cells_read_the_target(name, options):
    """On generated batches every scored position has a cell, and the token
    at the cell's column carries the position's target."""
    task = make_task(name, **options)
    tokens, targets, weights = task.heldout(num_examples=32)
    for row_tokens, row_targets, row_weights, cells in zip(
            tokens, targets, weights, task.target_cells(tokens)):
        assert {row for row, _ in cells} == set(np.flatnonzero(row_weights))
        for row, column in cells:
            source = int(row_tokens[column])
            if name == "recall":
                source = (source - 1) % (task.num_values + 1)
            assert source == row_targets[row]


def test_target_cells_bad_input():
    task = make_task("reverse", seq_len=5, vocab_size=8)
    with pytest.raises(ValueError, match="`tokens`.*seq_len 5"):
        task.target_cells([1, 2, 3])
    with pytest.raises(ValueError, match="`tokens`"):
        task.target_cells([1.0, 2.0, 3.0, 4.0, 5.0])


# ----------------------------------------------------------------- summary
def read_summaries(directory):
    """`{tag: {step: (meta, weights)}}` of the attention summaries under
    `directory`, read straight from the event files."""
    found = {}
    for path in sorted(glob.glob(os.path.join(directory, "events.out.*"))):
        for event in EventFileLoader(path).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name != PLUGIN_NAME:
                    continue
                assert (value.metadata.data_class
                        == summary_pb2.DATA_CLASS_BLOB_SEQUENCE)
                found.setdefault(value.tag, {})[event.step] = decode_summary(
                    make_ndarray(value.tensor))
    return found


def random_record(rng, shape, masked_keys=0):
    scores = rng.normal(0.0, 2.0, shape).astype(np.float32)
    mask = np.ones(shape, bool)
    if masked_keys:
        mask[..., -masked_keys:] = False
    weights = np.exp(scores) * mask
    weights /= weights.sum(-1, keepdims=True)
    return {"weights": weights, "scores": scores, "mask": mask}


@pytest.mark.parametrize("dtype", ["float16", "uint8"])
def test_summary_round_trip(tmp_path, dtype):
    rng = np.random.default_rng(0)
    record = random_record(rng, (2, 3, 4, 6), masked_keys=2)
    queries = [[f"q{e}{t}" for t in range(4)] for e in range(2)]
    keys = [f"k{s}" for s in range(6)]
    with SummaryWriter(tmp_path) as writer:
        write_attention_summary("layer_x", record, 7, queries, keys,
                                target_cells=[[(3, 1)], []], dtype=dtype,
                                writer=writer)
    meta, weights = read_summaries(str(tmp_path))[summary_tag("layer_x")][7]
    if dtype == "uint8":
        expected = np.round(record["weights"] * 255) / 255
        np.testing.assert_allclose(weights, expected, atol=1e-6)
    else:
        np.testing.assert_allclose(weights, record["weights"], rtol=1e-3,
                                   atol=1e-4)
    assert meta["query_labels"] == queries
    assert meta["key_labels"] == [keys, keys]
    assert meta["target_cells"] == [[[3, 1]], []]

    # The statistics, in numpy here, per example and head over the keys
    # that may be attended (4 of 6).
    w = record["weights"][..., :4].astype(np.float64)
    entropy = -np.sum(w * np.log(np.maximum(w, 1e-30)), -1) / np.log(4)
    stats = meta["statistics"]
    np.testing.assert_allclose(stats["entropy_normalized"],
                               entropy.mean(-1), rtol=1e-4)
    np.testing.assert_allclose(stats["max_weight"], w.max(-1).mean(-1),
                               rtol=1e-5)
    np.testing.assert_allclose(stats["saturated_fraction"],
                               (w.max(-1) >= 0.99).mean(-1))
    np.testing.assert_allclose(
        stats["score_std"],
        record["scores"][..., :4].reshape(2, 3, -1).std(-1), rtol=1e-5)


def test_summary_bad_input(tmp_path):
    record = {"weights": np.full((1, 1, 2, 2), 0.5, np.float32)}
    writer = SummaryWriter(tmp_path)
    with pytest.raises(ValueError, match="`query_labels`"):
        write_attention_summary("l", record, 0, ["a", "b", "c"],
                                writer=writer)
    with pytest.raises(ValueError, match="`target_cells`.*outside"):
        write_attention_summary("l", record, 0, ["a", "b"],
                                target_cells=[[(2, 0)]], writer=writer)
    with pytest.raises(ValueError, match="finite"):
        write_attention_summary(
            "l", {"weights": np.full((1, 1, 2, 2), np.nan)}, 0, ["a", "b"],
            writer=writer)
    with pytest.raises(ValueError, match="`dtype`"):
        write_attention_summary("l", record, 0, ["a", "b"], dtype="int8",
                                writer=writer)
    with pytest.raises(ValueError, match="`writer`"):
        write_attention_summary("l", record, 0, ["a", "b"], writer=None)
    writer.close()
    assert read_summaries(str(tmp_path)) == {}


# ------------------------------------------------------------ installation
def test_entry_point_and_package_data():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    target = project["project"]["entry-points"]["tensorboard_plugins"][
        "attention"]
    module, name = target.split(":")
    assert getattr(__import__(module, fromlist=[name]), name) is AttentionLoader
    patterns = project["tool"]["setuptools"]["package-data"][
        "keras_attention.viz.tensorboard_plugin"]
    static = ROOT / "keras_attention/viz/tensorboard_plugin/static"
    packaged = {path.name for pattern in patterns
                for path in static.parent.glob(pattern)}
    assert packaged == set(static_files()) >= {"index.js", "style.css"}
    # Every module the frontend imports is served.
    for source in static.glob("*.js"):
        for imported in re.findall(r'from "\./([^"]+)"', source.read_text()):
            assert imported in packaged


def test_loader_keeps_every_step_unless_told():
    class Flags:
        samples_per_plugin = {}

    flags = Flags()
    AttentionLoader().fix_flags(flags)
    assert flags.samples_per_plugin == {PLUGIN_NAME: 0}
    flags.samples_per_plugin = "attention=5,images=3"
    AttentionLoader().fix_flags(flags)
    assert flags.samples_per_plugin == {PLUGIN_NAME: 5, "images": 3}


# ----------------------------------------------------------------- browser
LONG = 2048
TEXT_LEN = 256
HOT_CELL = (1000, 37)  # the one peaked weight of the long map
LONG_TARGET = (200, 1800)  # its outlined target cell


def write_long_map(directory):
    """One 2048 x 2048 head: uniform rows but one weight of 1 at HOT_CELL."""
    weights = np.full((1, 1, LONG, LONG), 1.0 / LONG, np.float32)
    weights[0, 0, HOT_CELL[0]] = 0.0
    weights[0, 0, HOT_CELL[0], HOT_CELL[1]] = 1.0
    labels = [f"t{i}" for i in range(LONG)]
    with SummaryWriter(directory) as writer:
        write_attention_summary("attention_0", {"weights": weights}, 0,
                                labels, target_cells=[[LONG_TARGET]],
                                writer=writer)


# 192 batches (3072 sequences of 8 digits, batches of 64, 4 epochs; 5.5 s),
# enough for the reversal's anti-diagonal to form, the maps logged every 64:
# at steps 0, 64, 128 and 192.
MHA_FIT_FLAGS = ["--sequences", "3072", "--epochs", "4", "--update-freq",
                 "64"]


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, tiny_config):
    root = tmp_path_factory.mktemp("dashboard")
    for arm, scale in (("scaled", "sqrt"), ("unscaled", "none")):
        train(tiny_config("recall", steps=12, diagnostics_every=4,
                          eval_every=12, checkpoint_every=12, scale=scale,
                          logdir=str(root / f"{arm}-dk16-seed0")))
    write_long_map(str(root / "long"))
    # A user's `fit` of a MultiHeadAttention model with AttentionMonitor:
    # examples/mha_fit_tensorboard.py at a tiny size.
    keras.backend.clear_session()  # the layer's own default name
    keras.utils.set_random_seed(0)
    example = runpy.run_path(str(ROOT / "examples/mha_fit_tensorboard.py"))
    example["main"](MHA_FIT_FLAGS + ["--logdir", str(root / "mha_fit")])
    # A text run of 256 characters a window, the corpus's own labels.
    train(resolve_config([Layer("tests", dict(
        task="text", seq_len=TEXT_LEN, d_model=16, key_dim=8, batch_size=2,
        steps=1, heldout_size=2, probe_size=1, eval_every=1,
        checkpoint_every=1, verbose=0, strategy="default",
        logdir=str(root / "text")))]))
    return root


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory):
    directory = os.environ.get("DASHBOARD_SCREENSHOTS") or str(
        tmp_path_factory.mktemp("screenshots"))
    os.makedirs(directory, exist_ok=True)
    print(f"\ndashboard screenshots in {directory}")
    return pathlib.Path(directory)


@pytest.fixture(scope="module")
def server(logdir, tmp_path_factory):
    with open(tmp_path_factory.mktemp("tensorboard") / "tb.log", "w") as log:
        process, base = _browser.start_tensorboard(logdir, 5, stderr=log)
        try:
            yield base
        finally:
            process.terminate()
            process.wait(10)


@pytest.fixture(scope="module")
def browser(server, tmp_path_factory):
    if not _browser.have_chromium():
        pytest.skip(f"needs {_browser.CHROMIUM} and {_browser.CHROMEDRIVER} "
                    f"(Debian packages chromium, chromium-driver; .ci/run "
                    f"installs them)")
    downloads = tmp_path_factory.mktemp("downloads")
    driver = _browser.chromium(downloads)
    driver.downloads = downloads
    try:
        yield driver
    finally:
        driver.quit()


class Page:
    """The dashboard in the browser, inside TensorBoard's plugin iframe."""

    def __init__(self, driver):
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver, self.by, self.select = driver, By, Select
        self.wait = WebDriverWait(driver, 60)
        self.ready = "0"

    def find(self, selector):
        return self.driver.find_element(self.by.CSS_SELECTOR, selector)

    def all(self, selector):
        return self.driver.find_elements(self.by.CSS_SELECTOR, selector)

    def drawn(self):
        """Waits for a new drawing of the view."""
        def new(driver):
            ready = self.find("#root").get_attribute("data-ready")
            return ready if ready and ready != self.ready else None

        self.ready = self.wait.until(new)

    def choose(self, selector, value):
        menu = self.find(selector)
        if menu.get_attribute("value") != value:
            self.select(menu).select_by_value(value)
            self.drawn()

    def hover(self, canvas, row, col):
        """Moves the mouse onto cell (row, col); returns the tooltip."""
        from selenium.webdriver import ActionChains

        unit = float(canvas.get_attribute("data-unit"))
        size = canvas.size
        ActionChains(self.driver).move_to_element_with_offset(
            canvas, int((col + 0.5) * unit - size["width"] / 2),
            int((row + 0.5) * unit - size["height"] / 2)).perform()
        tip = self.find("#tip")
        self.wait.until(lambda _: tip.is_displayed())
        return tip

    def shot(self, directory, name):
        """The window as the user sees it: TensorBoard around the tab."""
        path = directory / f"{name}.png"
        self.driver.save_screenshot(str(path))
        assert path.stat().st_size > 0


def weight_of(tip):
    return float(re.search(r"(?:weight|difference) (\S+)", tip.text).group(1))


@pytest.fixture(scope="module")
def page(browser, server, screenshots):
    from selenium.webdriver.support import expected_conditions as EC

    browser.get(server + "/#attention")
    dashboard = Page(browser)
    frame = dashboard.wait.until(EC.presence_of_element_located((
        dashboard.by.CSS_SELECTOR,
        "iframe[src*='plugin_entry.html?name=attention']")))
    dashboard.wait.until(lambda _: frame.size["height"] > 0)
    browser.switch_to.frame(frame)
    dashboard.drawn()
    browser.switch_to.default_content()
    browser.save_screenshot(str(screenshots / "0_tensorboard_tab.png"))
    browser.switch_to.frame(frame)
    return dashboard


RUN_A = "scaled-dk16-seed0/validation"
RUN_B = "unscaled-dk16-seed0/validation"
TAG = summary_tag("attention_0")


def test_labels_and_hover(page, logdir, screenshots):
    from selenium.webdriver.common.keys import Keys

    page.choose("#run", RUN_A)
    page.find("#step").send_keys(Keys.END)
    page.drawn()
    logged = read_summaries(str(logdir / RUN_A))[TAG]
    assert sorted(logged) == [0, 4, 8, 12]
    meta, weights = logged[12]
    assert "step 12 (4/4)" in page.find("#step-label").text
    # Labels are text, one per position, the task's own.
    shown = [label.text for label in page.all(".qlabels .label")]
    assert shown == meta["query_labels"][0]
    assert [label.text for label in page.all(".klabels .label")] == (
        meta["key_labels"][0])
    assert meta["query_labels"][0][-1].endswith(":?")
    # Hovering the target cell shows its labels and the logged weight.
    (row, col), = meta["target_cells"][0]
    tip = page.hover(page.find("canvas.heat[data-role='a']"), row, col)
    assert meta["query_labels"][0][row] in tip.text
    assert meta["key_labels"][0][col] in tip.text
    assert weight_of(tip) == pytest.approx(weights[0, 0, row, col], abs=6e-5)
    entropy = page.find("tr[data-stat='entropy_normalized'] td").text
    assert float(entropy) == pytest.approx(
        meta["statistics"]["entropy_normalized"][0][0], abs=6e-4)
    page.shot(screenshots, "1_single_run")


def canvas_png(page, selector):
    return page.driver.execute_script(
        "return document.querySelector(arguments[0]).toDataURL()", selector)


def test_slider_changes_the_map(page, logdir, screenshots):
    from selenium.webdriver.common.keys import Keys

    page.choose("#run", RUN_A)
    logged = read_summaries(str(logdir / RUN_A))[TAG]
    before = canvas_png(page, "canvas.heat")
    page.find("#step").send_keys(Keys.HOME)
    page.drawn()
    assert "step 0 (1/4)" in page.find("#step-label").text
    assert canvas_png(page, "canvas.heat") != before
    meta, weights = logged[0]
    (row, col), = meta["target_cells"][0]
    tip = page.hover(page.find("canvas.heat"), row, col)
    assert weight_of(tip) == pytest.approx(weights[0, 0, row, col], abs=6e-5)
    page.shot(screenshots, "2_step_0")


def test_compare_mode(page, logdir, screenshots):
    page.find("#presets .preset").click()
    page.drawn()
    assert page.find("#presets .preset").text == (
        "scaled vs unscaled, d_k 16, seed 0")
    assert page.find("#run").get_attribute("value") == RUN_A
    assert page.find("#run-b").get_attribute("value") == RUN_B
    roles = [c.get_attribute("data-role") for c in page.all("canvas.heat")]
    assert roles == ["a", "b", "diff"]
    step = int(page.find("#root").get_attribute("data-step"))
    _, a = read_summaries(str(logdir / RUN_A))[TAG][step]
    _, b = read_summaries(str(logdir / RUN_B))[TAG][step]
    assert not np.allclose(a, b)
    for row, col in [(4, 0), (4, 3), (1, 2)]:
        shown = [weight_of(page.hover(page.find(f"canvas.heat[data-role="
                                                f"'{role}']"), row, col))
                 for role in roles]
        assert shown[:2] == pytest.approx(
            [a[0, 0, row, col], b[0, 0, row, col]], abs=6e-5)
        assert shown[2] == pytest.approx(
            a[0, 0, row, col] - b[0, 0, row, col], abs=6e-5)
    page.shot(screenshots, "3_compare")
    page.find("#compare").click()
    page.drawn()


def test_long_map(page, screenshots):
    page.choose("#run", "long")
    canvas = page.find("canvas.heat")
    assert int(canvas.get_attribute("data-rows")) == LONG
    width = page.driver.execute_script("return arguments[0].width", canvas)
    assert 0 < width <= 1024 and int(canvas.get_attribute("data-pool")) > 1
    labels = page.all(".qlabels .label")
    assert 10 < len(labels) < LONG // 4
    assert labels[1].text == f"t{labels[1].get_attribute('data-index')}"
    # Max-pooling keeps the single peaked weight: its pixel has the top
    # colour of the scale (viridis yellow), its neighbourhood is dark.
    unit = float(canvas.get_attribute("data-unit"))

    def pixel(row, col, dx=0):
        return page.driver.execute_script(
            "const [c, x, y] = arguments; return Array.from("
            "c.getContext('2d').getImageData(x, y, 1, 1).data).slice(0, 3)",
            canvas, int((col + 0.5) * unit) + dx, int((row + 0.5) * unit))

    assert pixel(*HOT_CELL) == [253, 231, 37]
    low = pixel(HOT_CELL[0] - 40, HOT_CELL[1])
    assert low[2] > low[1] and low[0] < 100  # the low, violet end
    # The target cell is outlined (in red) even at a quarter pixel a cell.
    outline = pixel(*LONG_TARGET, dx=-2)
    assert outline[0] > 200 and outline[1] < 100
    # The page stays responsive: a hover answers at once.
    start = time.perf_counter()
    page.hover(canvas, 0, 0)
    assert time.perf_counter() - start < 5
    page.shot(screenshots, "4_long_map")


def test_text_run_shows_the_characters(page, logdir, screenshots):
    page.choose("#run", "text/validation")
    logged = read_summaries(str(logdir / "text/validation"))[TAG]
    meta, _ = logged[max(logged)]
    canvas = page.find("canvas.heat")
    assert int(canvas.get_attribute("data-rows")) == TEXT_LEN
    # Thinned to what fits, each shown label the character at its index,
    # whitespace as its stand-in.
    labels = page.all(".qlabels .label")
    assert 10 < len(labels) < TEXT_LEN
    for label in labels:
        index = int(label.get_attribute("data-index"))
        assert label.text == meta["query_labels"][0][index]
    characters = set(meta["query_labels"][0])
    assert "\u2423" in characters and " " not in characters
    page.shot(screenshots, "5_text")


MHA_RUN = "mha_fit/train"


def test_fit_run_of_multi_head_attention(page, logdir, screenshots):
    """A Keras MultiHeadAttention model trained with `fit` and
    AttentionMonitor: its layer, both heads, the digit labels and every
    logged step, as read from the event files here."""
    from selenium.webdriver.common.keys import Keys

    page.choose("#run", MHA_RUN)
    assert [option.text for option in page.all("#layer option")] == [
        "multi_head_attention"]
    logged = read_summaries(str(logdir / MHA_RUN))[
        summary_tag("multi_head_attention")]
    steps = sorted(logged)
    assert steps == [0, 64, 128, 192]
    # The slider covers every logged step, first to last.
    slider = page.find("#step")
    assert int(slider.get_attribute("max")) == len(steps) - 1
    for key, index in ((Keys.HOME, 0), (Keys.END, len(steps) - 1)):
        if int(slider.get_attribute("value")) != index:
            slider.send_keys(key)
            page.drawn()
        assert (f"step {steps[index]} ({index + 1}/{len(steps)})"
                in page.find("#step-label").text)
    meta, weights = logged[192]
    assert weights.shape == (4, 2, 8, 8)
    # One panel per head, each an 8 x 8 map labelled with the example's
    # digits down the side and along the top.
    panels = page.all(".panel")
    assert [p.get_attribute("data-head") for p in panels] == ["0", "1"]
    assert [p.find_element(page.by.CSS_SELECTOR, ".ptitle").text
            for p in panels] == [f"{MHA_RUN} · head {h}" for h in (0, 1)]
    digits = meta["query_labels"][0]
    assert len(digits) == 8 and all(d in "0123456789" for d in digits)
    for panel in panels:
        canvas = panel.find_element(page.by.CSS_SELECTOR, "canvas.heat")
        assert (canvas.get_attribute("data-rows"),
                canvas.get_attribute("data-cols")) == ("8", "8")
        for axis in (".qlabels .label", ".klabels .label"):
            shown = panel.find_elements(page.by.CSS_SELECTOR, axis)
            assert [label.text for label in shown] == digits
    # Hovering a cell of head 1 shows its digits and its logged weight; the
    # trained model reverses, so query 0 reads key 7 most.
    tip = page.hover(panels[1].find_element(page.by.CSS_SELECTOR,
                                            "canvas.heat"), 0, 7)
    assert f"query 0: {digits[0]}" in tip.text
    assert f"key 7: {digits[7]}" in tip.text
    assert weight_of(tip) == pytest.approx(weights[0, 1, 0, 7], abs=6e-5)
    assert np.argmax(weights[0, 1, 0]) == 7
    page.shot(screenshots, "7_mha_fit")


def test_exports(page, browser, screenshots):
    page.choose("#run", RUN_A)

    def download(button, pattern):
        page.find(button).click()
        deadline = time.time() + 30
        while not glob.glob(str(browser.downloads / pattern)):
            assert time.time() < deadline, os.listdir(browser.downloads)
            time.sleep(0.2)
        found, = glob.glob(str(browser.downloads / pattern))
        return found

    png = download("#export-png", "*.png")
    html = download("#export-html", "*.html")
    assert pathlib.Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = pathlib.Path(html).read_text()
    assert not re.search(r"(src|href)=\"?(https?:)?//", text)
    assert "<script" not in text and "data:image/png;base64," in text
    assert all(label.text in text for label in page.all(".qlabels .label"))
    shutil.copy(png, screenshots / "5_export.png")
    # The exported file shows in a browser with no server at all.
    page.driver.get(pathlib.Path(html).as_uri())
    page.driver.save_screenshot(str(screenshots / "6_export_html.png"))
    assert page.driver.find_elements(page.by.CSS_SELECTOR, "img.heat")
