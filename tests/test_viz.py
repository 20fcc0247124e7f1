"""Tests of keras_attention.viz: the figures hold the weights and labels they
were given (read back from the artists, and from the rendered pixels), and
the HTML page is self-contained and works in a real browser with no network.
"""

import os
import re

import matplotlib
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from _pages import chromium
from keras_attention.tasks import make_task
from keras_attention.viz import AttentionHTML
from keras_attention.viz import attention_html
from keras_attention.viz import plot_attention
from keras_attention.viz import plot_attention_pair

RNG = np.random.default_rng(7)
QUERIES, KEYS, HEADS = 5, 7, 3
WEIGHTS = RNG.dirichlet(np.ones(KEYS), size=(HEADS, QUERIES))
QUERY_LABELS = [f"q{i}" for i in range(QUERIES)]
KEY_LABELS = [f"key{j}" for j in range(KEYS)]


def _tick_texts(labels):
    return [label.get_text() for label in labels]


def _panels(figure, count):
    panels = [ax for ax in figure.axes if ax.images][:count]
    assert len(panels) == count
    return panels


def test_plot_attention_holds_weights_labels_and_one_colour_bar():
    figure = plot_attention(WEIGHTS, QUERY_LABELS, KEY_LABELS)
    panels = _panels(figure, HEADS)
    for head, ax in enumerate(panels):
        (image,) = ax.images
        np.testing.assert_array_equal(image.get_array(), WEIGHTS[head])
        assert _tick_texts(ax.get_yticklabels()) == QUERY_LABELS
        assert _tick_texts(ax.get_xticklabels()) == KEY_LABELS
        np.testing.assert_array_equal(ax.get_yticks(), np.arange(QUERIES))
        np.testing.assert_array_equal(ax.get_xticks(), np.arange(KEYS))
        assert ax.get_title() == f"head {head}"
        # One shared scale: [0, the largest weight of any head].
        assert image.norm.vmin == 0.0
        assert image.norm.vmax == pytest.approx(WEIGHTS.max())
    bars = [ax for ax in figure.axes if ax not in panels]
    assert len(bars) == 1 and bars[0].get_ylabel() == "attention weight"
    assert panels[-1].images[0].colorbar.ax is bars[0]


def test_plot_attention_pixels_are_the_weights_colours():
    """Independent of the artists: the rendered cell centres have the
    colour map's colour of each weight."""
    figure = plot_attention(WEIGHTS, QUERY_LABELS, KEY_LABELS, heads=[2, 0],
                            vmax=1.0)
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    pixels = np.asarray(canvas.buffer_rgba())[..., :3].astype(int)
    height = pixels.shape[0]
    viridis = matplotlib.colormaps["viridis"]
    for head, ax in zip([2, 0], _panels(figure, 2)):
        assert ax.get_title() == f"head {head}"
        for i in range(QUERIES):
            for j in range(KEYS):
                x, y = ax.transData.transform((j, i))
                expected = np.round(255 * np.array(
                    viridis(WEIGHTS[head, i, j])[:3])).astype(int)
                actual = pixels[int(height - y), int(x)]
                assert np.abs(actual - expected).max() <= 2, (head, i, j)


def test_many_labels_are_thinned_to_every_kth():
    labels = [f"t{i}" for i in range(100)]
    weights = RNG.dirichlet(np.ones(100), size=100)
    (ax,) = _panels(plot_attention(weights, labels), 1)
    # ceil(100 / 40) = 3: every third label, at its own position.
    assert _tick_texts(ax.get_yticklabels()) == labels[::3]
    np.testing.assert_array_equal(ax.get_xticks(), np.arange(0, 100, 3))


def test_plot_attention_pair_shows_both_and_their_difference():
    a, b = WEIGHTS[0], WEIGHTS[1]
    labels = [f"s{i}" for i in range(KEYS)]
    square_a = RNG.dirichlet(np.ones(KEYS), size=KEYS)
    square_b = RNG.dirichlet(np.ones(KEYS), size=KEYS)
    figure = plot_attention_pair(square_a, square_b, labels,
                                 titles=("scaled", "unscaled"))
    first, second, difference = _panels(figure, 3)
    np.testing.assert_array_equal(first.images[0].get_array(), square_a)
    np.testing.assert_array_equal(second.images[0].get_array(), square_b)
    np.testing.assert_allclose(difference.images[0].get_array(),
                               square_b - square_a)
    assert [ax.get_title() for ax in (first, second, difference)] == [
        "scaled", "unscaled", "unscaled − scaled"]
    for ax in (first, second, difference):
        assert _tick_texts(ax.get_xticklabels()) == labels
        assert _tick_texts(ax.get_yticklabels()) == labels
    # a and b share one scale; the difference is centred on 0.
    assert first.images[0].norm.vmax == second.images[0].norm.vmax == (
        pytest.approx(max(square_a.max(), square_b.max())))
    norm = difference.images[0].norm
    limit = np.abs(square_b - square_a).max()
    assert (norm.vmin, norm.vcenter, norm.vmax) == pytest.approx(
        (-limit, 0.0, limit))
    labels_of_bars = {ax.get_ylabel() for ax in figure.axes
                      if not ax.images}
    assert labels_of_bars == {"attention weight", "difference"}
    with pytest.raises(ValueError, match="`a` and `b`"):
        plot_attention_pair(a, b[:, :3], QUERY_LABELS)


@pytest.mark.parametrize("call, message", [
    (lambda: plot_attention(np.full((2, 2), np.nan)), "`weights` must be finite"),
    (lambda: plot_attention(np.ones((2, 2, 2, 2))), "`weights` must have shape"),
    (lambda: plot_attention(WEIGHTS, QUERY_LABELS[:-1], KEY_LABELS),
     "`query_labels` must hold 5"),
    (lambda: plot_attention(WEIGHTS, QUERY_LABELS), "`key_labels` is needed"),
    (lambda: plot_attention(WEIGHTS, QUERY_LABELS, KEY_LABELS, heads=[3]),
     "`heads`"),
    (lambda: plot_attention(WEIGHTS, "abc", KEY_LABELS), "`query_labels`"),
    (lambda: plot_attention_pair(WEIGHTS, WEIGHTS, QUERY_LABELS, titles="x",
                                 key_labels=KEY_LABELS), "`titles`"),
    (lambda: attention_html(WEIGHTS, QUERY_LABELS, KEY_LABELS, vmax=-1.0),
     "`vmax`"),
    (lambda: attention_html(WEIGHTS[..., :0]), "`weights` must have shape"),
])
def test_bad_input_names_the_argument(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


# ------------------------------------------------------------------ HTML
def _recall_example():
    task = make_task("recall", num_pairs=4, num_keys=8, num_values=4)
    tokens = task.heldout(2, seed=0)[0][0]
    labels = task.token_labels(tokens)
    weights = RNG.dirichlet(np.ones(len(labels)) * 0.5,
                            size=(2, len(labels)))
    return weights, labels


def test_html_is_self_contained_and_saves_atomically(tmp_path):
    weights, labels = _recall_example()
    page = attention_html(weights, labels, title="recall <probe>")
    assert isinstance(page, AttentionHTML) and isinstance(page, str)
    assert not re.search(r"https?://", page, re.IGNORECASE)
    assert not re.search(r"""(src|href)\s*=\s*["']?(?!data:)[a-z]""", page,
                         re.IGNORECASE)
    assert page._repr_html_() == page.fragment and page.fragment in page
    assert "recall &lt;probe&gt;" in page  # text is escaped
    path = tmp_path / "attention.html"
    assert page.save(path) == path
    assert path.read_text(encoding="utf-8") == page
    assert os.listdir(tmp_path) == ["attention.html"]  # no temporary left


def test_html_in_chromium_offline_hover_and_toggles(tmp_path):
    weights, labels = _recall_example()
    path = tmp_path / "attention.html"
    attention_html(weights, labels, title="recall probe").save(path)
    with chromium() as driver:
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.by import By

        driver.get(path.as_uri())
        canvases = driver.find_elements(By.CSS_SELECTOR, "canvas")
        assert len(canvases) == 2
        # The labels are text in the page.
        query_texts = [e.text for e in driver.find_elements(
            By.CSS_SELECTOR, "figure[data-head='0'] .ka-q")]
        assert query_texts == labels
        vmax = weights.max()
        viridis = matplotlib.colormaps["viridis"]
        for head, canvas in enumerate(canvases):
            size = len(labels)
            for i, j in ((0, 0), (size - 1, 2), (size // 2, size - 1)):
                # The canvas pixel of cell (i, j) is the colour of its weight.
                drawn = driver.execute_script(
                    "return Array.from(arguments[0].getContext('2d')"
                    ".getImageData(arguments[2], arguments[1], 1, 1).data)",
                    canvas, i, j)
                index = round(min(1.0, round(weights[head, i, j], 4) / vmax)
                              * 255)
                expected = np.round(255 * np.array(
                    viridis(index / 255)[:3]))
                assert np.abs(np.array(drawn[:3]) - expected).max() <= 1
                # Hovering the cell shows its labels and weight.
                rect = canvas.rect
                x = (j + 0.5) * rect["width"] / size - rect["width"] / 2
                y = (i + 0.5) * rect["height"] / size - rect["height"] / 2
                ActionChains(driver).move_to_element_with_offset(
                    canvas, int(x), int(y)).perform()
                tip = driver.find_element(By.CSS_SELECTOR, ".ka-tooltip")
                assert tip.is_displayed()
                assert tip.text == (f"query {labels[i]} · key {labels[j]} · "
                                    f"weight {weights[head, i, j]:.4f}")
        driver.save_screenshot(str(tmp_path / "attention.png"))
        toggle = driver.find_element(
            By.CSS_SELECTOR, ".ka-toggles input[data-head='1']")
        figure = driver.find_element(By.CSS_SELECTOR,
                                     "figure[data-head='1']")
        assert figure.is_displayed()
        toggle.click()
        assert not figure.is_displayed()
        toggle.click()
        assert figure.is_displayed()
