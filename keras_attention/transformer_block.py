"""The `TransformerBlock` Keras layer: attention and a feed-forward network.

One public class, in the shape of keras-hub's `TransformerEncoder`, built
on `ScaledDotProductAttention`. Floor 2: imports the layer and the core
(`initializers`, `ops`, `validation`).
"""

import inspect

import keras

from keras_attention.initializers import PerCallInitializer
from keras_attention.initializers import fresh
from keras_attention.layer import ScaledDotProductAttention
from keras_attention.validation import check_choice
from keras_attention.validation import check_int
from keras_attention.validation import check_positive_real
from keras_attention.validation import check_rate

NORM_MODES = ("pre", "post")

# Keras' default epsilon (1e-3) is not small next to the variance of a
# freshly initialized residual stream and would shrink the normalized
# components below unit variance.
LAYER_NORM_EPSILON = 1e-6
# What `attention_options` may hold: the attention layer's arguments that the
# block does not set itself (it sets the sizes, dropout, kernels and name).
ATTENTION_OPTIONS = tuple(
    name for name in inspect.signature(ScaledDotProductAttention).parameters
    if name not in ("key_dim", "num_heads", "value_dim", "output_dim",
                    "dropout", "kernel_initializer", "kwargs")
)


@keras.saving.register_keras_serializable(package="keras_attention")
class TransformerBlock(keras.layers.Layer):
    """A Transformer block: self-attention, then a feed-forward network.

    Each of the two sub-layers sits in a residual connection with a layer
    normalization:

    - `norm="pre"` (default): `x + Attn(LN(x))`, then `x + FF(LN(x))`. The
      attention input is normalized whatever the scale of the residual
      stream, which is what the 1/sqrt(d_k) scale assumes (unit-variance
      query and key components at initialization). A stack of pre-norm
      blocks usually ends with a layer normalization of its own.
    - `norm="post"`: `LN(x + Attn(x))`, then `LN(x + FF(x))`.

    The attention is a `ScaledDotProductAttention` with an output projection
    back to the input's width (made, and its options checked, when the
    block is built); the feed-forward network is
    `Dense(intermediate_dim, activation)` then `Dense(width)`. Dropout (in
    training only) acts on the attention weights and on each sub-layer's
    output before its residual addition. The input's Keras mask (from
    `Embedding(mask_zero=True)`, say) masks the padded keys and queries and
    passes through to the output, so blocks stack.

    Initialization: every kernel gets its own draw from the global random
    state (`keras.utils.set_random_seed`), in a fixed order. W_Q and W_K are
    drawn by `kernel_initializer` like W_V and W_O, then drawn again by
    `query_key_initializer` when one is given, and multiplied by
    `query_key_gain`: blocks that differ only in how W_Q and W_K start, or
    in attention options such as `scale` and `qk_norm` (whose weights
    start deterministically), get identical values for every other weight.

    Args:
        key_dim: size `d_k` of each head's queries and keys.
        num_heads: number of attention heads.
        intermediate_dim: hidden width of the feed-forward network; `None`
            for 4 times the input width, `0` for a block without one.
        value_dim: size of each head's values; defaults to `key_dim`.
        attention_options: `None`, or a dict of further keyword arguments
            of the `ScaledDotProductAttention` (any of `ATTENTION_OPTIONS`:
            `scale`, `qk_norm`, `implementation`, `logit_soft_cap`, ...),
            passed to it whole and checked by it when the block is built;
            for example `{"scale": "none", "qk_norm": True}`.
        norm: `"pre"` or `"post"` (see above).
        dropout: dropout rate in `[0, 1)`.
        activation: activation of the feed-forward network's hidden layer
            (a Keras activation name or function).
        layer_norm_epsilon: epsilon of the layer normalizations.
        kernel_initializer: initializer of every kernel; each kernel gets
            its own draw (`keras_attention.initializers.PerCallInitializer`).
        query_key_initializer: `None`, or the initializer W_Q and W_K are
            drawn again with.
        query_key_gain: positive factor applied to W_Q and W_K after
            initialization.
        attention_name: name of the attention sub-layer, under which
            `keras_attention.record_attention` and the diagnostics report
            it; defaults to `"<name>_attention"`, so stacked blocks'
            attention layers have distinct names.
        **kwargs: base layer arguments such as `name` and `dtype`.

    Call arguments:
        inputs: `(B, T, D)`.
        mask: optional `(B, T)` boolean mask of valid positions; taken from
            the input's Keras mask when there is one.
        attention_mask: optional boolean mask broadcastable to
            `(B, num_heads, T, T)`; `True` means "may attend".
        use_causal_mask: let position i attend only to positions j <= i.
        training: whether dropout is active.

    Returns:
        `(B, T, D)`, of the input's shape, carrying its mask.

    Example:

    >>> tokens = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(100, 32, mask_zero=True)(tokens)
    >>> for i in range(2):
    ...     x = TransformerBlock(key_dim=16, num_heads=2, name=f"block_{i}")(
    ...         x, use_causal_mask=True)
    >>> model = keras.Model(tokens, keras.layers.Dense(100)(x))
    >>> tuple(model(keras.ops.ones((4, 10), dtype="int32")).shape)
    (4, 10, 100)
    """

    def __init__(
        self,
        key_dim,
        num_heads=1,
        intermediate_dim=None,
        value_dim=None,
        attention_options=None,
        norm="pre",
        dropout=0.0,
        activation="gelu",
        layer_norm_epsilon=LAYER_NORM_EPSILON,
        kernel_initializer="glorot_uniform",
        query_key_initializer=None,
        query_key_gain=1.0,
        attention_name=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        # The attention's own options are checked once, by the layer, when
        # the block makes it (in `build`); the block checks the rest here.
        self.key_dim = key_dim
        self.num_heads = num_heads
        self.value_dim = value_dim
        self.attention_options = _attention_options(attention_options)
        self.intermediate_dim = check_int(
            intermediate_dim, "intermediate_dim", minimum=0, allow_none=True
        )
        self.norm = check_choice(norm, "norm", NORM_MODES)
        self.dropout = check_rate(dropout, "dropout")
        try:
            self.activation = keras.activations.get(activation)
        except ValueError:
            raise ValueError(
                "`activation` must be a Keras activation name or function; "
                f"received {activation!r}."
            ) from None
        self.layer_norm_epsilon = check_positive_real(
            layer_norm_epsilon, "layer_norm_epsilon"
        )
        self.kernel_initializer = _per_call(kernel_initializer)
        self.query_key_initializer = (
            None if query_key_initializer is None
            else _per_call(query_key_initializer)
        )
        self.query_key_gain = check_positive_real(
            query_key_gain, "query_key_gain"
        )
        if attention_name is not None and (
            not isinstance(attention_name, str) or not attention_name
        ):
            raise ValueError(
                "`attention_name` must be a non-empty string or None; "
                f"received {attention_name!r}."
            )
        self.attention_name = attention_name
        self.supports_masking = True

    # ------------------------------------------------------------------ build
    def build(self, input_shape):
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(
                "The input of TransformerBlock must be (batch, length, "
                "features) with known features; received "
                f"{tuple(input_shape)}."
            )
        width = input_shape[-1]
        pre = self.norm == "pre"
        # Sub-layers are made in the order of the forward pass, which is the
        # order the block lists (and checkpoints) its variables in. Random
        # draws follow one fixed order: an initializer copy takes a seed
        # from the global state when it is made, a weight when it is built.
        # This order gives exactly the weights of the toy models from before
        # the block was a layer, so published comparisons stay reproducible.
        if pre:
            self.attention_norm = self._layer_norm("attention_norm",
                                                   input_shape)
        self.attention = ScaledDotProductAttention(
            key_dim=self.key_dim,
            num_heads=self.num_heads,
            value_dim=self.value_dim,
            output_dim=width,
            dropout=self.dropout,
            kernel_initializer=self.kernel_initializer,
            **self.attention_options,
            dtype=self.dtype_policy,
            name=self.attention_name or f"{self.name}_attention",
        )
        self.attention.build(input_shape)
        self.attention_dropout = self._dropout("attention_dropout")
        if not pre:
            self.attention_norm = self._layer_norm("attention_norm",
                                                   input_shape)
        self._redraw_query_key()
        hidden = 4 * width if self.intermediate_dim is None else (
            self.intermediate_dim
        )
        self.ff_norm = self.ff_hidden = self.ff_output = None
        self.ff_dropout = None
        if hidden == 0:
            return
        if pre:
            self.ff_norm = self._layer_norm("ff_norm", input_shape)
        # Each Dense gets its own copy of the initializer, both made before
        # either is built (the fixed order above).
        self.ff_hidden = keras.layers.Dense(
            hidden,
            activation=self.activation,
            kernel_initializer=fresh(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="ff_hidden",
        )
        self.ff_output = keras.layers.Dense(
            width,
            kernel_initializer=fresh(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="ff_output",
        )
        self.ff_hidden.build(input_shape)
        self.ff_output.build(tuple(input_shape[:-1]) + (hidden,))
        self.ff_dropout = self._dropout("ff_dropout")
        if not pre:
            self.ff_norm = self._layer_norm("ff_norm", input_shape)

    def _layer_norm(self, name, input_shape):
        layer = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name
        )
        layer.build(input_shape)
        return layer

    def _dropout(self, name):
        if self.dropout == 0.0:
            return None
        return keras.layers.Dropout(
            self.dropout, dtype=self.dtype_policy, name=name
        )

    def _redraw_query_key(self):
        if self.query_key_initializer is None and self.query_key_gain == 1.0:
            return
        for kernel in (self.attention.query_kernel, self.attention.key_kernel):
            values = (
                kernel.value if self.query_key_initializer is None
                else self.query_key_initializer(kernel.shape,
                                                dtype=kernel.dtype)
            )
            kernel.assign(values * self.query_key_gain)

    # ------------------------------------------------------------------- call
    def call(self, inputs, mask=None, attention_mask=None,
             use_causal_mask=False, training=None):
        x = self._residual(
            inputs, self.attention_norm, self.attention_dropout,
            lambda h: self.attention(
                h, query_mask=mask, attention_mask=attention_mask,
                use_causal_mask=use_causal_mask, training=training,
            ),
            training,
        )
        if self.ff_hidden is None:
            return x
        return self._residual(
            x, self.ff_norm, self.ff_dropout,
            lambda h: self.ff_output(self.ff_hidden(h)), training,
        )

    def _residual(self, x, layer_norm, dropout, sublayer, training):
        """`x + f(LN(x))` (pre-norm) or `LN(x + f(x))` (post-norm)."""
        update = sublayer(layer_norm(x) if self.norm == "pre" else x)
        if dropout is not None:
            update = dropout(update, training=training)
        x = x + update
        return layer_norm(x) if self.norm == "post" else x

    # -------------------------------------------------------- shapes, config
    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "key_dim": self.key_dim,
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "value_dim": self.value_dim,
                "attention_options": dict(self.attention_options),
                "norm": self.norm,
                "dropout": self.dropout,
                "activation": keras.activations.serialize(self.activation),
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "query_key_initializer": (
                    None if self.query_key_initializer is None
                    else keras.initializers.serialize(
                        self.query_key_initializer
                    )
                ),
                "query_key_gain": self.query_key_gain,
                "attention_name": self.attention_name,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        # Blocks saved before `attention_options` listed three of them.
        config = dict(config)
        old = {name: config.pop(name) for name in ("scale", "qk_norm",
               "implementation") if name in config}
        if old:
            config["attention_options"] = {
                **old, **(config.get("attention_options") or {})}
        return super().from_config(config)


def _attention_options(options):
    """`options` as a dict of `ATTENTION_OPTIONS`, or `ValueError`."""
    options = {} if options is None else options
    unknown = sorted(set(options) - set(ATTENTION_OPTIONS)) if isinstance(
        options, dict) else None
    if unknown is None or unknown:
        raise ValueError(
            "`attention_options` must be None or a dict whose keys are among "
            f"{', '.join(ATTENTION_OPTIONS)}; received {options!r}."
        )
    return dict(options)


def _per_call(initializer):
    """`initializer` as a `PerCallInitializer` (one draw per weight)."""
    initializer = keras.initializers.get(initializer)
    if isinstance(initializer, PerCallInitializer):
        return initializer
    return PerCallInitializer(initializer)
