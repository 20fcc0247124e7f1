"""The Attention dashboard: a TensorBoard plugin (the ATTENTION tab).

Part of floor 2 (`keras_attention.viz`): `plugin` reads the summaries that
`keras_attention.viz.summary` writes, through TensorBoard's data provider,
and serves the frontend in `static/` (ES modules and CSS, no build step, no
URL outside the TensorBoard server). TensorBoard finds `AttentionLoader`
through the `tensorboard_plugins` entry point of the installed package;
`python -m keras_attention.viz.tensorboard_plugin --logdir DIR` starts
TensorBoard with it from a source tree whose entry point is not installed.
Nothing here imports Keras or a backend (TensorBoard starts without them);
when the dashboard cannot load, `UnavailablePlugin` says why in the tab.
"""

from keras_attention.viz.tensorboard_plugin.plugin import AttentionLoader
from keras_attention.viz.tensorboard_plugin.plugin import AttentionPlugin
from keras_attention.viz.tensorboard_plugin.plugin import UnavailablePlugin

__all__ = ["AttentionLoader", "AttentionPlugin", "UnavailablePlugin"]
