"""keras-attention: scaled dot-product attention for Keras 3.

    Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_k)) V

The package offers the `ScaledDotProductAttention` layer, its functional core
(`scaled_dot_product_attention`, `attention_entropy`), diagnostics, toy
sequence models and synthetic tasks.
"""

from keras_attention.layer import ScaledDotProductAttention
from keras_attention.models import FactoredEmbedding
from keras_attention.models import build_sequence_model
from keras_attention.ops import attention_entropy
from keras_attention.ops import causal_mask
from keras_attention.ops import masked_softmax
from keras_attention.ops import scaled_dot_product_attention
from keras_attention.recording import attention_layers
from keras_attention.recording import record_attention

__version__ = "0.1.0"

__all__ = [
    "FactoredEmbedding",
    "ScaledDotProductAttention",
    "attention_layers",
    "build_sequence_model",
    "attention_entropy",
    "causal_mask",
    "masked_softmax",
    "record_attention",
    "scaled_dot_product_attention",
]
