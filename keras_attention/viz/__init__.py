"""Looking at attention: labelled maps as matplotlib figures and as
self-contained interactive HTML, and the summaries that the Attention
dashboard (a TensorBoard plugin) reads.

Floor 2 (beside models, tasks, diagnostics and export): imports the
diagnostics (`keras_attention.diagnostics`: statistics and drawing) and the
core (`keras_attention.files`), never the pipelines. `plots` makes the
figures, `html` the interactive page (inline script and style, no network),
`summary` the dashboard's TensorBoard summaries, `summary_format` their
plugin name, metadata and blob encoding (numpy and TensorBoard's protos
only); `tensorboard_plugin` (loaded by TensorBoard through the
`tensorboard_plugins` entry point) imports `summary_format` and no Keras,
and nothing in the library imports the plugin. The names below are imported
when first used (`keras_attention.lazy`).

    from keras_attention.viz import plot_attention, attention_html

    plot_attention(weights, task.token_labels(tokens))   # a Figure
    attention_html(weights, task.token_labels(tokens))   # shows in Jupyter
"""

from keras_attention.lazy import lazy_exports

# Imported when first used: the plugin (under this package) is loaded by
# TensorBoard, which must start without Keras.
_LAZY_EXPORTS = {
    "AttentionHTML": "keras_attention.viz.html",
    "attention_html": "keras_attention.viz.html",
    "attention_summary": "keras_attention.viz.summary",
    "decode_summary": "keras_attention.viz.summary_format",
    "head_statistics": "keras_attention.viz.summary",
    "plot_attention": "keras_attention.viz.plots",
    "plot_attention_pair": "keras_attention.viz.plots",
    "write_attention_summary": "keras_attention.viz.summary",
}

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

__getattr__, __dir__ = lazy_exports(__name__, _LAZY_EXPORTS)
