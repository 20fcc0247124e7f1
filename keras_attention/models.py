"""Small Transformer-style sequence models built around the attention layer.

`build_sequence_model` returns a functional Keras model mapping int32 token
ids `(B, T)` to per-token float32 logits `(B, T, num_classes)`: token and
learned position embeddings (`keras_attention.embeddings`), `num_layers`
`TransformerBlock`s (attention plus a feed-forward network, each with a
residual connection and layer normalization), and a per-token classifier.

Models that differ only in the attention `scale` (or `qk_norm`) start from
identical values of every weight they share, so a comparison between them
measures the scale and nothing else.
"""

import math

import keras
import numpy as np

from keras_attention.embeddings import FactoredEmbedding
from keras_attention.embeddings import PositionEmbedding
from keras_attention.embeddings import check_factors
from keras_attention.initializers import PerCallInitializer
from keras_attention.transformer_block import LAYER_NORM_EPSILON
from keras_attention.transformer_block import TransformerBlock
from keras_attention.validation import check_bool
from keras_attention.validation import check_choice
from keras_attention.validation import check_int
from keras_attention.validation import check_positive_real
from keras_attention.validation import check_rate
from keras_attention.validation import is_positive_real

QK_INIT_MODES = ("unit", "glorot")
# GELU is the toy model's default (GPT-2's and BERT's); ReLU is the
# original Transformer's.
FF_ACTIVATIONS = ("gelu", "relu")


# ------------------------------------------------------------ initializers
def _normal(stddev):
    return PerCallInitializer(keras.initializers.RandomNormal(0.0, stddev))


def _query_key_initializer(qk_init_std, d_model):
    if isinstance(qk_init_std, str) and qk_init_std == "unit":
        return _normal(1.0 / math.sqrt(d_model))
    if isinstance(qk_init_std, str) and qk_init_std == "glorot":
        return PerCallInitializer("glorot_uniform")
    return _normal(float(qk_init_std))


# ------------------------------------------------------------------- model
def build_sequence_model(
    vocab_size,
    seq_len,
    num_classes=None,
    d_model=64,
    num_layers=1,
    key_dim=64,
    num_heads=1,
    value_dim=None,
    attention_options=None,
    causal=False,
    norm="pre",
    ff_dim=None,
    ff_activation="gelu",
    dropout=0.0,
    token_factors=None,
    qk_init_std="unit",
    qk_init_gain=1.0,
    mask_padding=True,
    name="sequence_model",
    max_len=None,
):
    """Builds a small Transformer-style per-token classifier.

    Architecture: token embedding (optionally factored) + learned position
    embedding, then `num_layers` `TransformerBlock`s named `block_0`,
    `block_1`, ... (self-attention and a feed-forward network
    `Dense(ff_dim, ff_activation)`, `Dense(d_model)`, each wrapped in a
    residual connection and a layer normalization), then a per-token
    `Dense(num_classes)` named `"logits"`.

    - `norm="pre"` (default): `x + Attn(LN(x))`, `x + FF(LN(x))`, and a final
      LN before the classifier.
    - `norm="post"`: `LN(x + Attn(x))`, `LN(x + FF(x))`.

    Pre-norm is the default because it makes the model match the assumption
    behind the 1/sqrt(d_k) scale: the attention input is layer-normalized,
    so its components have zero mean and unit variance whatever the scale of
    the residual stream, and with `W_Q, W_K ~ N(0, 1/d_model)`
    (`qk_init_std="unit"`) the components of q and k have unit variance at
    initialization. Then `q . k` has variance `d_k` and the scaled score
    has variance 1, in every layer. In a post-norm model the first
    attention sees the raw embeddings; the embeddings are initialized so
    that their sum also has unit-variance components (each of the `n`
    summed tables, tokens factors and positions, is drawn from
    `N(0, 1/n)`), but deeper residual streams are not normalized.

    Initialization: every random weight gets its own draw from the global
    random state in a fixed build order, so after
    `keras.utils.set_random_seed(s)` the build is reproducible, and models
    that differ only in attention options such as `scale` or `qk_norm`
    (which add only deterministically initialized weights) get identical
    values for every weight they share. W_V and W_O are Glorot-uniform (the
    Keras default); W_Q and W_K follow `qk_init_std` and are then
    multiplied by `qk_init_gain`.

    Padding: with `mask_padding=True` id 0 is padding; its mask hides padded
    keys (and queries) in every attention layer and travels to the logits,
    so Keras losses and metrics ignore padded positions.

    Args:
        vocab_size: number of input ids including the padding id 0; at
            least 2.
        seq_len: sequence length, or `None` for variable length (then
            `max_len` is required).
        num_classes: number of output classes; defaults to `vocab_size`.
        d_model: width of the residual stream.
        num_layers: number of attention blocks.
        key_dim: `d_k`, the size of each head's queries and keys.
        num_heads: number of attention heads.
        value_dim: size of each head's values; defaults to `key_dim`.
        attention_options: `None`, or a dict of keyword arguments of every
            `ScaledDotProductAttention` (see
            `TransformerBlock`'s `attention_options`), passed whole: `scale`
            (`"sqrt"` by default, `"none"`, `"inverse"`, `"learned"`,
            `"ssmax"` or a positive number), `qk_norm`, `implementation`
            (`"auto"`, `"explicit"`, `"fused"`, `"memory_efficient"`),
            `logit_soft_cap`, ...
        causal: let position i attend only to positions j <= i.
        norm: `"pre"` or `"post"` (see above).
        ff_dim: hidden width of the feed-forward networks; `None` for
            `4 * d_model`, `0` for blocks without a feed-forward network.
        ff_activation: activation of the feed-forward hidden layer, one of
            `FF_ACTIVATIONS` (`"gelu"`, `"relu"`).
        dropout: rate of dropout on the attention weights and on each
            sub-layer's output before its residual addition (training only).
        token_factors: `None`, or a tuple of radices for a
            `FactoredEmbedding`; then `vocab_size` must equal
            `1 + prod(token_factors)`.
        qk_init_std: initialization of W_Q and W_K: `"unit"` for
            `N(0, 1/d_model)`, `"glorot"` for Keras' Glorot-uniform, or a
            positive float standard deviation of a zero-mean normal.
        qk_init_gain: positive factor applied to W_Q and W_K after
            initialization (`key_dim**0.25` saturates a scaled model at
            init; `key_dim**-0.25` un-saturates an unscaled one).
        mask_padding: treat id 0 as padding and mask it.
        name: name of the model.
        max_len: length of the position table; defaults to `seq_len` and
            must be at least `seq_len`.

    Returns:
        A functional `keras.Model` with input `"tokens"` (int32 `(B, T)`)
        and output `"logits"` (float32 `(B, T, num_classes)`, float32 also
        under a mixed precision policy). The attention layers of its blocks
        are named `attention_0`, `attention_1`, ... (see
        `attention_layers`).

    Example:

    >>> keras.utils.set_random_seed(0)
    >>> model = build_sequence_model(vocab_size=41, seq_len=5, num_classes=4,
    ...                              token_factors=(8, 5))
    >>> tuple(model(keras.ops.ones((2, 5), dtype="int32")).shape)
    (2, 5, 4)
    """
    vocab_size = check_int(vocab_size, "vocab_size", minimum=2)
    seq_len = check_int(seq_len, "seq_len", allow_none=True)
    max_len = check_int(max_len, "max_len", allow_none=True)
    if seq_len is None and max_len is None:
        raise ValueError(
            "`max_len` is required when `seq_len` is None (variable length): "
            "it sizes the position embedding."
        )
    if seq_len is not None and max_len is not None and max_len < seq_len:
        raise ValueError(
            f"`max_len` must be at least `seq_len` ({seq_len}); received "
            f"{max_len}."
        )
    num_classes = check_int(num_classes, "num_classes", allow_none=True)
    num_classes = vocab_size if num_classes is None else num_classes
    d_model = check_int(d_model, "d_model")
    num_layers = check_int(num_layers, "num_layers")
    causal = check_bool(causal, "causal")
    mask_padding = check_bool(mask_padding, "mask_padding")
    # The block checks its own arguments; these are the model's names.
    ff_dim = check_int(ff_dim, "ff_dim", minimum=0, allow_none=True)
    check_choice(ff_activation, "ff_activation", FF_ACTIVATIONS)
    dropout = check_rate(dropout, "dropout")
    qk_init_gain = check_positive_real(qk_init_gain, "qk_init_gain")
    if token_factors is not None:
        token_factors = check_factors(token_factors)
        expected_vocab = 1 + int(np.prod(token_factors, dtype=np.int64))
        if vocab_size != expected_vocab:
            raise ValueError(
                f"`token_factors` {token_factors} encode ids "
                f"0 .. {expected_vocab - 1}, so `vocab_size` must be "
                f"1 + prod(token_factors) = {expected_vocab}; received "
                f"vocab_size={vocab_size}."
            )
    if not (
        (isinstance(qk_init_std, str) and qk_init_std in QK_INIT_MODES)
        or is_positive_real(qk_init_std)
    ):
        raise ValueError(
            f"`qk_init_std` must be one of {QK_INIT_MODES} or a positive "
            f"number; received {qk_init_std!r}."
        )
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"`name` must be a non-empty string; received {name!r}."
        )

    # The summed input embedding gets unit-variance components.
    num_tables = (len(token_factors) if token_factors else 1) + 1
    embedding_init = _normal(1.0 / math.sqrt(num_tables))
    # The settings of every block, in one place.
    block = dict(
        key_dim=key_dim,
        num_heads=num_heads,
        intermediate_dim=ff_dim,
        activation=ff_activation,
        value_dim=value_dim,
        attention_options=attention_options,
        norm=norm,
        dropout=dropout,
        query_key_initializer=_query_key_initializer(qk_init_std, d_model),
        query_key_gain=qk_init_gain,
    )

    tokens = keras.Input(shape=(seq_len,), dtype="int32", name="tokens")
    if token_factors is not None:
        embed = FactoredEmbedding(
            token_factors,
            d_model,
            mask_zero=mask_padding,
            embeddings_initializer=embedding_init,
            name="token_embedding",
        )
    else:
        embed = keras.layers.Embedding(
            vocab_size,
            d_model,
            embeddings_initializer=embedding_init,
            mask_zero=mask_padding,
            name="token_embedding",
        )
    x = embed(tokens)
    x = PositionEmbedding(
        max_len or seq_len,
        embeddings_initializer=embedding_init,
        name="position_embedding",
    )(x)
    if dropout > 0.0:
        x = keras.layers.Dropout(dropout, name="embedding_dropout")(x)
    for i in range(num_layers):
        x = TransformerBlock(
            **block, name=f"block_{i}", attention_name=f"attention_{i}"
        )(x, use_causal_mask=causal)
    if norm == "pre":
        x = keras.layers.LayerNormalization(
            epsilon=LAYER_NORM_EPSILON, name="final_norm"
        )(x)
    logits = keras.layers.Dense(
        num_classes,
        kernel_initializer=PerCallInitializer("glorot_uniform"),
        dtype="float32",
        name="logits",
    )(x)
    return keras.Model(tokens, logits, name=name)
