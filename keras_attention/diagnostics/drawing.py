"""Labelled attention maps drawn with matplotlib: the argument checks, the
drawing of one map on an `Axes`, and `LabelledHeatmaps`, the renderer of the
TensorBoard Images-tab tiles.

Matplotlib's object API only (`matplotlib.figure.Figure` on the Agg canvas),
never `pyplot`: no global figure state, no GUI backend, safe in threads and
in servers. `keras_attention.viz` composes its figures from these pieces.
"""

import collections
import math

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from keras_attention.diagnostics.heatmaps import COLORMAP

# At most this many tick labels per axis; beyond it every k-th is shown. At
# 7 pt a label needs about 10 pt of axis, and a panel is 3-6 inches
# (216-432 pt) high, so 40 labels stay legible without overlapping.
MAX_LABELS = 40
LABEL_FONT_SIZE = 7


# ---------------------------------------------------------------- checks
def attention_maps(weights, name="weights"):
    """`weights` as a float64 array `(heads, T, S)`.

    Accepts one map `(T, S)`, one example's heads `(H, T, S)`, or a batch of
    one example `(1, H, T, S)`. Raises `ValueError` naming `name` for other
    shapes, empty maps and values that are not finite.
    """
    array = np.asarray(weights, dtype=np.float64)
    if array.ndim == 4 and array.shape[0] == 1:
        array = array[0]
    if array.ndim == 2:
        array = array[None]
    if array.ndim != 3 or 0 in array.shape:
        raise ValueError(
            f"`{name}` must have shape (T, S), (heads, T, S) or "
            f"(1, heads, T, S) with no empty axis; received shape "
            f"{np.shape(weights)} (select one example of a batch)."
        )
    if not np.all(np.isfinite(array)):
        raise ValueError(f"`{name}` must be finite; it holds NaN or inf.")
    return array


def axis_labels(labels, length, name):
    """`labels` as a list of `length` strings; `None` gives the positions
    `"0" ... "length-1"`. Raises `ValueError` naming `name` otherwise."""
    if labels is None:
        return [str(index) for index in range(length)]
    if isinstance(labels, (str, bytes)) or not hasattr(labels, "__len__"):
        raise ValueError(
            f"`{name}` must be a sequence of {length} labels; received "
            f"{labels!r}."
        )
    labels = [str(label) for label in np.asarray(labels, dtype=object).ravel()]
    if len(labels) != length:
        raise ValueError(
            f"`{name}` must hold {length} labels (one per position); "
            f"received {len(labels)}."
        )
    return labels


def map_labels(query_labels, key_labels, queries, keys):
    """Both axes' labels of `(T, S)` maps as lists of strings; the key labels
    default to the query labels (self-attention, `T == S`)."""
    if key_labels is None and query_labels is not None and keys != queries:
        raise ValueError(
            f"`key_labels` is needed when the maps are not square "
            f"({queries} queries, {keys} keys)."
        )
    query = axis_labels(query_labels, queries, "query_labels")
    if key_labels is None and query_labels is not None:
        return query, query
    return query, axis_labels(key_labels, keys, "key_labels")


def head_indices(heads, num_heads):
    """The heads to show: `None` is all, an int one, a sequence several."""
    if heads is None:
        return list(range(num_heads))
    chosen = [heads] if np.ndim(heads) == 0 else list(heads)
    if not chosen or any(
        isinstance(h, (bool, np.bool_)) or not isinstance(h, (int, np.integer))
        or not 0 <= h < num_heads for h in chosen
    ):
        raise ValueError(
            f"`heads` must be None or head indices in [0, {num_heads}); "
            f"received {heads!r}."
        )
    return [int(h) for h in chosen]


def colour_top(vmax, arrays):
    """The top of a shared colour scale starting at 0: `vmax` (finite,
    positive), by default the largest value of `arrays` (1 if none is
    positive)."""
    if vmax is None:
        top = max(float(np.max(a)) for a in arrays)
        return top if top > 0 else 1.0
    if (isinstance(vmax, (bool, np.bool_))
            or not isinstance(vmax, (int, float, np.floating))
            or not math.isfinite(vmax) or vmax <= 0):
        raise ValueError(
            f"`vmax` must be a finite positive number; received {vmax!r}."
        )
    return float(vmax)


def prepare_maps(weights, query_labels, key_labels, heads, vmax):
    """Checks one example's maps and their options, for the figures and
    pages that draw them.

    Returns:
        `(maps (H, T, S), query labels, key labels, chosen heads, top of the
        colour scale)`.
    """
    maps = attention_maps(weights)
    num_heads, queries, keys = maps.shape
    query_labels, key_labels = map_labels(query_labels, key_labels, queries,
                                          keys)
    chosen = head_indices(heads, num_heads)
    top = colour_top(vmax, [maps[h] for h in chosen])
    return maps, query_labels, key_labels, chosen, top


# --------------------------------------------------------------- drawing
def tick_positions(count, max_labels=MAX_LABELS):
    """Indices of the labels shown on an axis of `count` positions: all of
    them up to `max_labels`, else every k-th (k the smallest that fits)."""
    stride = max(1, math.ceil(count / max_labels))
    return list(range(0, count, stride))


def draw_attention(ax, weights, query_labels, key_labels, norm,
                   cmap=COLORMAP):
    """Draws one map `(T, S)` on `ax`: queries down the side, keys along the
    bottom (rotated), one cell per weight, labels thinned to `MAX_LABELS`.

    Returns:
        The `AxesImage`; its array is `weights`.
    """
    image = ax.imshow(weights, cmap=cmap, norm=norm, interpolation="nearest",
                      aspect="equal")
    rows = tick_positions(len(query_labels))
    columns = tick_positions(len(key_labels))
    ax.set_yticks(rows, [query_labels[i] for i in rows],
                  fontsize=LABEL_FONT_SIZE)
    ax.set_xticks(columns, [key_labels[i] for i in columns],
                  fontsize=LABEL_FONT_SIZE, rotation=90)
    ax.tick_params(length=2, pad=1)
    return image


def figure_rgb(figure):
    """The figure drawn on an Agg canvas, as uint8 RGB `(height, width, 3)`."""
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def _tile_geometry(queries, keys, label_chars):
    """Figure size and axes boxes of a tile, in inches then fractions: about
    0.16 inch a cell and at most 5 inches a map, with room for the labels (a
    7 pt character is about 0.06 inch wide), the title and the colour bar.
    Fixed, not constrained layout: that costs 60 ms more a first draw."""
    cell = min(0.16, 5.0 / max(queries, keys))
    label = 0.35 + 0.06 * label_chars
    width, height = keys * cell, queries * cell
    size = (label + width + 0.75, label + height + 0.3)
    box = (label / size[0], label / size[1], width / size[0],
           height / size[1])
    bar = ((label + width + 0.12) / size[0], box[1], 0.12 / size[0], box[3])
    return size, box, bar


class LabelledHeatmaps:
    """Renders labelled attention maps `(T, S)` as RGB images, fast enough to
    run at every diagnostics step.

    Each distinct (shape, labels, title) gets a figure drawn once with the
    axes, labels, title and colour bar; later maps of that key are blitted
    into it (only the image is redrawn). Measured on the recall task's 17×17
    map with other jobs sharing the 2 cores: 130 ms for the first draw, 3 ms
    a map after it.

    Args:
        vmax: the top of the colour scale (the bottom is 0). 1 by default, so
            maps of every step and head share one scale.
        cache_size: figures kept (least recently used ones are dropped).
    """

    def __init__(self, vmax=1.0, cache_size=32):
        self.norm = Normalize(0.0, vmax)
        self.cache_size = cache_size
        self._figures = collections.OrderedDict()

    def render(self, weights, query_labels, key_labels=None, title=""):
        """One map `(T, S)` as uint8 RGB; key labels default to the query
        labels (self-attention)."""
        weights = attention_maps(weights)[0]
        queries, keys = weights.shape
        query_labels, key_labels = map_labels(query_labels, key_labels,
                                              queries, keys)
        key = (queries, keys, tuple(query_labels), tuple(key_labels), title)
        if key not in self._figures:
            self._figures[key] = self._draw_static(
                queries, keys, query_labels, key_labels, title
            )
            while len(self._figures) > self.cache_size:
                self._figures.popitem(last=False)
        self._figures.move_to_end(key)
        canvas, image, background = self._figures[key]
        canvas.restore_region(background)
        image.set_data(weights)
        image.set_visible(True)
        image.axes.draw_artist(image)
        return np.asarray(canvas.buffer_rgba())[..., :3].copy()

    def _draw_static(self, queries, keys, query_labels, key_labels, title):
        chars = max(len(label) for label in query_labels + key_labels)
        size, box, bar_box = _tile_geometry(queries, keys, chars)
        figure = Figure(figsize=size, dpi=100)
        canvas = FigureCanvasAgg(figure)
        ax = figure.add_axes(box)
        image = draw_attention(ax, np.zeros((queries, keys)), query_labels,
                               key_labels, self.norm)
        ax.set_xlabel("key", fontsize=LABEL_FONT_SIZE)
        ax.set_ylabel("query", fontsize=LABEL_FONT_SIZE)
        if title:
            ax.set_title(title, fontsize=LABEL_FONT_SIZE + 1)
        bar = figure.colorbar(image, cax=figure.add_axes(bar_box))
        bar.ax.tick_params(labelsize=LABEL_FONT_SIZE)
        # The colour bar draws from the image's colour map, not its pixels,
        # so hiding the image leaves a background to blit maps into.
        image.set_visible(False)
        canvas.draw()
        return canvas, image, canvas.copy_from_bbox(ax.bbox)
