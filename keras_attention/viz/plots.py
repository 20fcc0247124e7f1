"""Attention maps as matplotlib figures: `plot_attention` (one panel per
head) and `plot_attention_pair` (two models side by side and their
difference).

The figures are `matplotlib.figure.Figure` objects on the Agg canvas, made
without `pyplot`: nothing global changes, no window opens, and they work in
scripts, servers and notebooks alike (Jupyter displays a returned figure).
Save one with `figure.savefig("attention.png")` (or `.svg`, `.pdf`).
"""

import math

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from keras_attention.diagnostics.drawing import attention_maps
from keras_attention.diagnostics.drawing import colour_top
from keras_attention.diagnostics.drawing import draw_attention
from keras_attention.diagnostics.drawing import head_indices
from keras_attention.diagnostics.drawing import map_labels
from keras_attention.diagnostics.drawing import prepare_maps

# Panels per row of `plot_attention` before it wraps to a new row.
PANELS_PER_ROW = 4
# Red for more weight in the second map, blue for more in the first, white
# for none: a diverging map centred on 0 for differences.
DIFFERENCE_COLORMAP = "RdBu_r"


def _panel_inches(queries, keys):
    """A panel's size: 0.18 inch a cell, between 2.2 and 6 inches a side."""
    cell = min(0.18, 6.0 / max(queries, keys))
    return max(2.2, keys * cell), max(2.2, queries * cell)


def _figure(columns, rows, panel):
    width, height = panel
    figure = Figure(figsize=(columns * width + 1.6, rows * height + 1.0),
                    layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def plot_attention(weights, query_labels=None, key_labels=None, heads=None,
                   vmax=None, title=None, cmap="viridis"):
    """Draws attention maps, one labelled panel per head.

    Queries run down the side (their labels on the left of each row of
    panels) and keys along the bottom. All panels share one colour scale,
    shown by one colour bar. More than 40 labels on an axis are thinned to
    every k-th, so they stay readable.

    Args:
        weights: attention weights of one example: `(T, S)`, `(heads, T, S)`
            or `(1, heads, T, S)`, finite.
        query_labels: `T` labels of the query positions (for a task,
            `task.token_labels(tokens[example])`); `None` numbers them.
        key_labels: `S` labels of the key positions; by default the query
            labels (self-attention, `T == S`).
        heads: the heads to draw: `None` (all), an index, or a sequence.
        vmax: the top of the colour scale (the bottom is 0); by default the
            largest weight shown. Pass 1.0 to compare figures.
        title: a title above the panels.
        cmap: a matplotlib colour map name.

    Returns:
        A `matplotlib.figure.Figure`; `figure.axes` holds the panels in head
        order, then the colour bar.

    Raises:
        ValueError: naming the argument, for weights of another shape or
            with NaN/inf, labels of the wrong length, or unknown heads.

    Example:

    ```python
    figure = plot_attention(weights[0], task.token_labels(tokens[0]))
    figure.savefig("attention.png", dpi=150)
    ```
    """
    maps, query_labels, key_labels, chosen, top = prepare_maps(
        weights, query_labels, key_labels, heads, vmax)
    queries, keys = maps.shape[1:]
    norm = Normalize(0.0, top)
    columns = min(len(chosen), PANELS_PER_ROW)
    rows = math.ceil(len(chosen) / columns)
    figure = _figure(columns, rows, _panel_inches(queries, keys))
    grid = figure.subplots(rows, columns, squeeze=False)
    image = None
    for index, ax in enumerate(grid.ravel()):
        if index >= len(chosen):
            ax.set_visible(False)
            continue
        head = chosen[index]
        image = draw_attention(ax, maps[head], query_labels, key_labels, norm,
                               cmap)
        ax.set_title(f"head {head}", fontsize=9)
        if index % columns == 0:
            ax.set_ylabel("query", fontsize=8)
        if index // columns == rows - 1 or index + columns >= len(chosen):
            ax.set_xlabel("key", fontsize=8)
    visible = [ax for ax in grid.ravel() if ax.get_visible()]
    figure.colorbar(image, ax=visible, shrink=0.8,
                    label="attention weight")
    if title:
        figure.suptitle(title, fontsize=10)
    return figure


def plot_attention_pair(a, b, labels=None, titles=("scaled", "unscaled"),
                        key_labels=None, heads=None, vmax=None, title=None):
    """Two models' attention side by side, and their difference.

    One row per head: `a`, `b` (one shared colour scale) and `b - a` on a
    diverging scale centred on 0 (red: more weight in `b`; blue: more in
    `a`), each with its colour bar.

    Args:
        a: attention weights of the first model, `(T, S)`, `(heads, T, S)` or
            `(1, heads, T, S)`.
        b: the second model's, the same shape (the same example).
        labels: `T` query labels; also the key labels unless `key_labels` is
            given. `None` numbers the positions.
        titles: the two models' names, for the column titles.
        key_labels: `S` key labels, when they differ from `labels`.
        heads: the heads to draw (`None`: all).
        vmax: the top of the shared weight scale (default: the largest
            weight of either map).
        title: a title above the panels.

    Returns:
        A `matplotlib.figure.Figure`; `figure.axes` starts with the panels,
        row by row (`a`, `b`, `b - a` per head), then the colour bars.

    Raises:
        ValueError: naming the argument, when `a` and `b` differ in shape or
            either is not a finite attention map, or for bad labels, titles
            or heads.

    Example:

    ```python
    figure = plot_attention_pair(scaled_weights, unscaled_weights,
                                 task.token_labels(tokens[0]))
    ```
    """
    first = attention_maps(a, "a")
    second = attention_maps(b, "b")
    if first.shape != second.shape:
        raise ValueError(
            f"`a` and `b` must have the same shape; received {first.shape} "
            f"and {second.shape}."
        )
    if (isinstance(titles, str) or len(titles) != 2
            or not all(isinstance(t, str) for t in titles)):
        raise ValueError(
            f"`titles` must be two strings; received {titles!r}."
        )
    num_heads, queries, keys = first.shape
    query_labels, key_labels = map_labels(labels, key_labels, queries, keys)
    chosen = head_indices(heads, num_heads)
    norm = Normalize(0.0, colour_top(
        vmax, [first[h] for h in chosen] + [second[h] for h in chosen]))
    difference = second - first
    limit = max(float(np.max(np.abs(difference[chosen]))), 1e-12)
    difference_norm = TwoSlopeNorm(0.0, -limit, limit)
    figure = _figure(3, len(chosen), _panel_inches(queries, keys))
    grid = figure.subplots(len(chosen), 3, squeeze=False)
    column_titles = (*titles, f"{titles[1]} − {titles[0]}")
    for row, head in enumerate(chosen):
        panels = (
            (first[head], norm, "viridis"),
            (second[head], norm, "viridis"),
            (difference[head], difference_norm, DIFFERENCE_COLORMAP),
        )
        images = []
        for column, (values, scale, cmap) in enumerate(panels):
            ax = grid[row, column]
            images.append(draw_attention(ax, values, query_labels,
                                         key_labels, scale, cmap))
            name = column_titles[column]
            ax.set_title(name if num_heads == 1 else f"{name}, head {head}",
                         fontsize=9)
            if column == 0:
                ax.set_ylabel("query", fontsize=8)
            if row == len(chosen) - 1:
                ax.set_xlabel("key", fontsize=8)
    figure.colorbar(images[0], ax=grid[:, :2].ravel().tolist(), shrink=0.8,
                    label="attention weight")
    figure.colorbar(images[2], ax=grid[:, 2].ravel().tolist(), shrink=0.8,
                    label="difference")
    if title:
        figure.suptitle(title, fontsize=10)
    return figure
