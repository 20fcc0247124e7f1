"""Looking at attention: labelled maps as matplotlib figures and as
self-contained interactive HTML.

Floor 2 (beside models, tasks and diagnostics): imports the diagnostics'
drawing pieces (`keras_attention.diagnostics.drawing`) and the core
(`keras_attention.files`), never the pipelines. `plots` makes the figures,
`html` the interactive page (inline script and style, no network).

    from keras_attention.viz import plot_attention, attention_html

    plot_attention(weights, task.token_labels(tokens))   # a Figure
    attention_html(weights, task.token_labels(tokens))   # shows in Jupyter
"""

from keras_attention.viz.html import AttentionHTML
from keras_attention.viz.html import attention_html
from keras_attention.viz.plots import plot_attention
from keras_attention.viz.plots import plot_attention_pair

__all__ = [
    "AttentionHTML",
    "attention_html",
    "plot_attention",
    "plot_attention_pair",
]
