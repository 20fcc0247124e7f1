"""The reports' one plotting style: matplotlib's object-oriented API on Agg
canvases (no pyplot, no global backend switch), one colour per arm, figures
saved as PNG for the Markdown and as SVG for the HTML page. Figure functions
take a report's JSON data and return a `Figure`, checkable against it."""

import io
import os

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pipelines.common import write_bytes_atomic
from pipelines.engine.presets import ARMS
from pipelines.engine.presets import MODE_ARMS

FIGURE_DIR = "figures"
_PNG_DPI = 120


def new_figure(width=6.4, height=4.0, rows=1, columns=1):
    """`(figure, axes)`: a constrained-layout figure on an Agg canvas and
    its `rows` x `columns` array of axes."""
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False)
    return figure, axes


def colour(name):
    """The colour of an arm (or scale mode, or other series), the same in
    every figure."""
    palette = matplotlib.colormaps["tab10"].colors
    names = list(ARMS)
    # A scale mode has its arm's colour (sqrt the scaled arm's, ...).
    name = MODE_ARMS.get(name, name)
    index = names.index(name) if name in names else len(names) + sum(
        map(ord, str(name)))
    return palette[index % len(palette)]


def log2_axis(ax, values, label="d_k (key dimension)"):
    """A log-2 x axis with a tick at each of `values`."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(values, [str(v) for v in values])
    ax.minorticks_off()
    ax.set_xlabel(label)


def series_panel(ax, series, spread="errorbar", marker="o"):
    """One line per `(label, name, x, mean, extent)` of `series`, in the
    colour of `name` (an arm or scale mode); `spread`: `"errorbar"` (extent:
    sd per point), `"band"` (extent: `(low, high)`, shaded) or `"none"`."""
    for label, name, x, mean, extent in series:
        if spread == "errorbar":
            ax.errorbar(x, mean, yerr=extent, color=colour(name),
                        marker=marker, capsize=3, label=label)
            continue
        if spread == "band":
            ax.fill_between(x, *extent, color=colour(name), alpha=0.2,
                            linewidth=0)
        ax.plot(x, mean, color=colour(name), marker=marker, label=label)


def finish_panel(ax, ylabel, title, unit=False, legend=True):
    """Labels, the grid and the legend of a panel; `unit`: y in [0, 1]."""
    if unit:
        ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=8)


def draw_figures(table, document):
    """`[(name, caption, Figure)]` of a figure table `[(name, caption,
    draw)]`, without those `draw(document)` has no data for (None)."""
    drawn = ((name, caption, draw(document)) for name, caption, draw in table)
    return [made for made in drawn if made[2] is not None]


def figure_svg(figure):
    """The figure as SVG markup for inlining in HTML: text kept as text, no
    XML prologue, DOCTYPE or metadata (whose namespace addresses would be
    the page's only http references)."""
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none",
                                "svg.hashsalt": "report"}):
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    start, end = text.find("<metadata>"), text.find("</metadata>")
    if start != -1:
        text = text[:start] + text[end + len("</metadata>"):]
    for attribute in (' xmlns:xlink="http://www.w3.org/1999/xlink"',
                      ' xmlns="http://www.w3.org/2000/svg"'):
        text = text.replace(attribute, "")
    return text


def write_figures(logdir, made):
    """Saves each `(name, caption, Figure)` of `made` as
    `logdir/figures/<name>.png`; returns `[{"name", "caption", "path",
    "svg"}]`, `path` relative to `logdir`."""
    os.makedirs(os.path.join(logdir, FIGURE_DIR), exist_ok=True)
    written = []
    for name, caption, figure in made:
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=_PNG_DPI)
        path = f"{FIGURE_DIR}/{name}.png"
        write_bytes_atomic(os.path.join(logdir, path), buffer.getvalue())
        written.append({"name": name, "caption": caption, "path": path,
                        "svg": figure_svg(figure)})
    return written
