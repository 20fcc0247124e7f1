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
  without TensorFlow);
- 1, the layer: `layer` (and its private helpers), `recording` (with
  `_keras_layers`, its one seam into Keras's own attention layers);
- 2, built on the layer: `transformer_block`, `embeddings`, `models`,
  `tasks`, `diagnostics`, `viz`, `dashboard` (probing a model and writing
  what TensorBoard shows), `callbacks` (`AttentionMonitor` for
  `model.fit`), `serving` (what an export serves), `export_onnx`, `export`.

The pipelines (`pipelines/`) sit above the package and are never imported
by it. This module re-exports the names most users need.
"""

from keras_attention.callbacks import AttentionMonitor
from keras_attention.embeddings import FactoredEmbedding
from keras_attention.layer import ScaledDotProductAttention
from keras_attention.models import build_sequence_model
from keras_attention.ops import attention_entropy
from keras_attention.ops import causal_mask
from keras_attention.ops import masked_softmax
from keras_attention.ops import scaled_dot_product_attention
from keras_attention.recording import attention_layers
from keras_attention.recording import record_attention
from keras_attention.transformer_block import TransformerBlock

__version__ = "0.1.0"

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
]
