"""Token and position embeddings of the sequence models.

`FactoredEmbedding` embeds a token whose id encodes several factors (a
recall (key, value) pair, say) as a sum of one embedding per factor;
`PositionEmbedding` adds a learned embedding of each position.
"""

import keras
import numpy as np
from keras import ops

from keras_attention.initializers import PerCallInitializer
from keras_attention.validation import check_bool
from keras_attention.validation import check_int
from keras_attention.validation import is_int


def check_factors(factors, name="token_factors"):
    """Returns `factors` as a tuple of ints, or raises `ValueError`.

    Args:
        factors: a non-empty tuple or list of positive integer radices.
        name: the argument's name, for the message.

    Returns:
        The radices as a tuple of Python ints.

    Raises:
        ValueError: if `factors` is not a non-empty sequence of positive
            integers.
    """
    if (
        isinstance(factors, (str, bytes))
        or not isinstance(factors, (tuple, list))
        or not factors
        or not all(is_int(r) and r >= 1 for r in factors)
    ):
        raise ValueError(
            f"`{name}` must be a non-empty tuple of positive integers "
            f"(radices); received {factors!r}."
        )
    return tuple(int(r) for r in factors)


@keras.saving.register_keras_serializable(package="keras_attention")
class FactoredEmbedding(keras.layers.Layer):
    """Embeds a token whose id encodes several factors as a sum of embeddings.

    Token id `t > 0` stands for the mixed-radix digits
    `(d_1, ..., d_n)` of `t - 1` with radices `factors = (r_1, ..., r_n)`,
    most significant first: `t - 1 = d_1 r_2 ... r_n + ... + d_{n-1} r_n
    + d_n`. Its embedding is `E_1[d_1] + ... + E_n[d_n]`, one table
    `E_i` of shape `(r_i, output_dim)` per factor. Id `0` is padding: its
    embedding is zero and, with `mask_zero=True`, it is masked. Valid ids
    are `0 .. prod(factors)`.

    A (key, value) pair token is thus embedded as key embedding + value
    embedding, and a query token that shares the key shares that part of its
    embedding.

    Args:
        factors: tuple of radices `(r_1, ..., r_n)`, positive integers.
        output_dim: embedding width.
        mask_zero: whether id 0 produces a `False` mask entry.
        embeddings_initializer: initializer of the tables.
        **kwargs: base layer arguments such as `name` and `dtype`.

    Example:

    >>> layer = FactoredEmbedding((8, 5), output_dim=16)
    >>> tokens = keras.ops.array([[1, 7, 40, 0]], dtype="int32")
    >>> tuple(layer(tokens).shape)
    (1, 4, 16)
    """

    def __init__(
        self,
        factors,
        output_dim,
        mask_zero=True,
        embeddings_initializer="uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.factors = check_factors(factors, "factors")
        self.output_dim = check_int(output_dim, "output_dim")
        self.mask_zero = check_bool(mask_zero, "mask_zero")
        self.embeddings_initializer = keras.initializers.get(
            embeddings_initializer
        )
        # Place value of each digit: the product of the radices after it.
        self._strides = tuple(
            int(np.prod(self.factors[i + 1 :], dtype=np.int64))
            for i in range(len(self.factors))
        )
        self.supports_masking = mask_zero

    @property
    def input_dim(self):
        """Number of ids, padding included: `1 + prod(factors)`."""
        return 1 + int(np.prod(self.factors, dtype=np.int64))

    def build(self, input_shape=None):
        # One initializer instance would give tables of equal shape equal
        # values; draw each table anew.
        initializer = PerCallInitializer(self.embeddings_initializer)
        self.tables = [
            self.add_weight(
                name=f"embeddings_{i}",
                shape=(radix, self.output_dim),
                initializer=initializer,
            )
            for i, radix in enumerate(self.factors)
        ]

    def call(self, inputs):
        inputs = ops.cast(inputs, "int32")
        is_token = ops.greater(inputs, 0)
        # Padding maps to digit 0 of every table, then to a zero vector.
        offset = ops.maximum(inputs - 1, 0)
        embedding = None
        for table, radix, stride in zip(
            self.tables, self.factors, self._strides
        ):
            digit = ops.mod(ops.floor_divide(offset, stride), radix)
            rows = ops.take(table, digit, axis=0)
            embedding = rows if embedding is None else embedding + rows
        return ops.where(
            ops.expand_dims(is_token, -1), embedding, ops.zeros_like(embedding)
        )

    def compute_mask(self, inputs, mask=None):
        if not self.mask_zero:
            return None
        return ops.not_equal(inputs, 0)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.output_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "factors": list(self.factors),
                "output_dim": self.output_dim,
                "mask_zero": self.mask_zero,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_attention")
class PositionEmbedding(keras.layers.Layer):
    """Adds a learned embedding of each position to a `(B, T, D)` input.

    The table has `max_len` rows; a call uses the first `T`. The input's
    mask passes through unchanged.

    Args:
        max_len: the longest sequence the layer accepts.
        embeddings_initializer: initializer of the `(max_len, D)` table.
        **kwargs: base layer arguments such as `name` and `dtype`.

    Example:

    >>> layer = PositionEmbedding(max_len=16)
    >>> tuple(layer(keras.ops.zeros((2, 10, 8))).shape)
    (2, 10, 8)
    """

    def __init__(self, max_len, embeddings_initializer="uniform", **kwargs):
        super().__init__(**kwargs)
        self.max_len = check_int(max_len, "max_len")
        self.embeddings_initializer = keras.initializers.get(
            embeddings_initializer
        )
        self.supports_masking = True

    def build(self, input_shape):
        if input_shape[-1] is None:
            raise ValueError(
                "The last dimension of the input of PositionEmbedding must be "
                f"known; received shape {tuple(input_shape)}."
            )
        if input_shape[1] is not None and input_shape[1] > self.max_len:
            raise ValueError(
                f"Sequence length {input_shape[1]} exceeds `max_len` "
                f"{self.max_len}."
            )
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.max_len, input_shape[-1]),
            initializer=self.embeddings_initializer,
        )

    def call(self, inputs):
        length = ops.shape(inputs)[1]
        # The variable's tensor, not the variable: JAX 0.10 refuses to trace
        # through a Keras variable handed to lax.dynamic_slice.
        table = ops.convert_to_tensor(self.embeddings)
        positions = ops.slice(table, (0, 0), (length, ops.shape(table)[1]))
        return inputs + ops.cast(positions, inputs.dtype)[None, :, :]

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_len": self.max_len,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config
