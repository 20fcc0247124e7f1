"""keras-attention: scaled dot-product attention for Keras 3.

    Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_k)) V

The package offers the `ScaledDotProductAttention` layer, its functional core
(`scaled_dot_product_attention`, `attention_entropy`, masks), the
`TransformerBlock` layer built on it, toy sequence models with their
embeddings, synthetic tasks, attention diagnostics for
TensorBoard and model export.

Floors (a module imports only from its own floor, without cycles, or below):

- 0, core: `ops`, `scales` (the score scales), `memory_efficient`, `files`,
  `validation`, `initializers`, `events` (TensorBoard event files written
  without TensorFlow), `backend_choice` (which Keras backend can start),
  `lazy` (re-exports imported on first use);
- 1, the layer: `layer` (and its private helpers), `recording` (with
  `_keras_layers`, its one seam into Keras's own attention layers);
- 2, built on the layer: `transformer_block`, `embeddings`, `models`,
  `tasks`, `diagnostics`, `viz`, `dashboard` (probing a model and writing
  what TensorBoard shows), `callbacks` (`AttentionMonitor` for
  `model.fit`), `scan_steps` (many training steps in one compiled call on
  JAX), `serving` (what an export serves), `export_onnx`, `export`.

The pipelines (`pipelines/`) sit above the package and are never imported
by it. This module re-exports the names most users need, each imported
when first used (`keras_attention.lazy`); `backend_choice` (floor 0) picks
the Keras backend before Keras loads.
"""

import sys

from keras_attention import backend_choice
from keras_attention.lazy import lazy_exports

__version__ = "0.1.0"

# Where each re-exported name lives. Importing the package imports none of
# them (nor Keras): TensorBoard imports this package to load the Attention
# dashboard, which needs no Keras backend.
_LAZY_EXPORTS = {
    "AttentionMonitor": "keras_attention.callbacks",
    "FactoredEmbedding": "keras_attention.embeddings",
    "ScaledDotProductAttention": "keras_attention.layer",
    "TransformerBlock": "keras_attention.transformer_block",
    "attention_entropy": "keras_attention.ops",
    "attention_layers": "keras_attention.recording",
    "build_sequence_model": "keras_attention.models",
    "causal_mask": "keras_attention.ops",
    "masked_softmax": "keras_attention.ops",
    "record_attention": "keras_attention.recording",
    "scaled_dot_product_attention": "keras_attention.ops",
    "scan_train_steps": "keras_attention.scan_steps",
}

__all__ = [
    "AttentionMonitor",
    "FactoredEmbedding",
    "ScaledDotProductAttention",
    "TransformerBlock",
    "attention_layers",
    "build_sequence_model",
    "attention_entropy",
    "causal_mask",
    "masked_softmax",
    "record_attention",
    "scaled_dot_product_attention",
    "scan_train_steps",
]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY_EXPORTS)

# Without TensorFlow and without KERAS_BACKEND, Keras would fail at import:
# take JAX (else torch) and say so in one line, before anything imports it.
backend_choice.use_installed_backend()
if sys.modules.get("keras") is not None:
    # Keras is loaded (its backend fixed), so loading the layers costs
    # little: they register with Keras's serialization now, which
    # `keras.saving.load_model` after `import keras_attention` needs.
    for _name in __all__:
        __getattr__(_name)
    del _name
