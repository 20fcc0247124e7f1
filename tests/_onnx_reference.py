"""What the ONNX export tests share with their backend child processes:
the token batches and the Keras references, imported without TensorFlow or
ONNX (the children run Keras on JAX or torch)."""

import keras
import numpy as np

from keras_attention.recording import record_attention

VOCAB = 8
# A variable-length model: its position table holds 12 positions.
VARIABLE = dict(vocab_size=VOCAB, seq_len=None, max_len=12, d_model=16,
                key_dim=8, num_heads=2, ff_dim=16, num_layers=1)
LENGTHS = (3, 12)  # 12: the whole position table


def padded_tokens(seed, batch, length):
    """Token ids in [1, VOCAB) with padding (id 0) at the end of two rows."""
    tokens = np.random.default_rng(seed).integers(1, VOCAB, (batch, length))
    tokens[1, length // 2:] = 0
    tokens[-1, 1:] = 0  # a row of one token
    return tokens.astype("int32")


def keras_reference(model, tokens):
    """The model's logits (its default attention path) and each attention
    layer's weights, as numpy."""
    logits = keras.ops.convert_to_numpy(model(tokens, training=False))
    with record_attention(model) as records:
        model(tokens, training=False)
    weights = {name: keras.ops.convert_to_numpy(record["weights"])
               for name, record in records.items()}
    return {"logits": logits, **weights}
