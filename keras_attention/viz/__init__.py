"""Looking at attention: labelled maps as matplotlib figures and as
self-contained interactive HTML, and the summaries that the Attention
dashboard (a TensorBoard plugin) reads.

Floor 2 (beside models, tasks, diagnostics and export): imports the
diagnostics (`keras_attention.diagnostics`: statistics and drawing) and the
core (`keras_attention.files`), never the pipelines. `plots` makes the
figures, `html` the interactive page (inline script and style, no network),
`summary` the dashboard's TensorBoard summaries; `tensorboard_plugin`
(loaded by TensorBoard through the `tensorboard_plugins` entry point)
imports `summary`, and nothing in the library imports the plugin.

    from keras_attention.viz import plot_attention, attention_html

    plot_attention(weights, task.token_labels(tokens))   # a Figure
    attention_html(weights, task.token_labels(tokens))   # shows in Jupyter
"""

from keras_attention.viz.html import AttentionHTML
from keras_attention.viz.html import attention_html
from keras_attention.viz.plots import plot_attention
from keras_attention.viz.plots import plot_attention_pair
from keras_attention.viz.summary import attention_summary
from keras_attention.viz.summary import decode_summary
from keras_attention.viz.summary import head_statistics
from keras_attention.viz.summary import write_attention_summary

__all__ = [
    "AttentionHTML",
    "attention_html",
    "attention_summary",
    "decode_summary",
    "head_statistics",
    "plot_attention",
    "plot_attention_pair",
    "write_attention_summary",
]
