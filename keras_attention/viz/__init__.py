"""Looking at attention: the summaries the Attention dashboard reads, and
its TensorBoard plugin.

Floor 2 (beside models, tasks, diagnostics and export): `summary` imports
the diagnostics' statistics and the core; `tensorboard_plugin` (loaded by
TensorBoard through the `tensorboard_plugins` entry point) imports
`summary`; nothing in the library imports the plugin.
"""

from keras_attention.viz.summary import attention_summary
from keras_attention.viz.summary import decode_summary
from keras_attention.viz.summary import head_statistics
from keras_attention.viz.summary import write_attention_summary

__all__ = [
    "attention_summary",
    "decode_summary",
    "head_statistics",
    "write_attention_summary",
]
