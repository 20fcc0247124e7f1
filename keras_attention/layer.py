"""The `ScaledDotProductAttention` Keras layer.

The one public class of this module; what it needs beyond its weights (the
projections, the masks, the input checks, the fused path) lives in
`keras_attention._layer_utils`. Floor 1 (layer): imports keras and the
core modules (`ops`, `scales`, `memory_efficient`, `initializers`,
`validation`).
"""


import keras
from keras import ops

from keras_attention import _layer_utils as utils
from keras_attention import ops as attention_ops
from keras_attention import paths
from keras_attention import scales
from keras_attention.initializers import fresh
from keras_attention.memory_efficient import memory_efficient_attention
from keras_attention.validation import FLOAT32_MAX
from keras_attention.validation import check_bool
from keras_attention.validation import check_choice
from keras_attention.validation import check_int
from keras_attention.validation import check_rate
from keras_attention.validation import check_real

IMPLEMENTATIONS = ("auto", "explicit", "fused", "memory_efficient")


@keras.saving.register_keras_serializable(package="keras_attention")
class ScaledDotProductAttention(keras.layers.Layer):
    """Scaled dot-product attention with learned Q, K, V projections.

    Computes `softmax(Q Kᵀ · scale) V` with `Q = X W_Q`, `K = X W_K`,
    `V = X W_V`, for one or several heads. With the default
    `scale="sqrt"` the scores are divided by `sqrt(key_dim)`, which keeps
    their variance near 1 when q and k have unit-variance components;
    `scale="none"` leaves them unscaled, so they grow like `sqrt(key_dim)` and
    push the softmax towards one-hot rows; `scale="inverse"` divides by
    `key_dim` (muP's attention scale), so at initialisation they shrink like
    `1/sqrt(key_dim)`.

    Args:
        key_dim: size `d_k` of each head's queries and keys.
        num_heads: number of heads; their outputs are concatenated.
        value_dim: size of each head's values; defaults to `key_dim`.
        output_dim: `None` for no output projection (the output has
            `num_heads * value_dim` features), or the width of an output
            projection `W_O` of shape `(num_heads, value_dim, output_dim)`.
        scale: `"sqrt"` (1/sqrt(key_dim)), `"none"` (1.0), `"inverse"`
            (1/key_dim), a positive float, `"learned"` (a trainable
            scalar starting at 1/sqrt(key_dim)) or `"ssmax"` (scores times
            `s_h · log(n) / sqrt(key_dim)`, n the keys a query may attend
            to after every mask, `s_h` trainable per head, starting at
            `1/log(S)` for the key length S the layer is built with: see
            `keras_attention.scales.ssmax_initial_scale`).
        qk_norm: apply layer normalization to each head's queries and keys
            over `key_dim` before the product.
        use_bias: add biases to the projections.
        dropout: dropout rate on the attention weights, in training only.
        kernel_initializer: initializer of the projection kernels.
        bias_initializer: initializer of the biases.
        kernel_regularizer: regularizer of the kernels.
        bias_regularizer: regularizer of the biases.
        kernel_constraint: constraint on the kernels.
        bias_constraint: constraint on the biases.
        seed: seed of the dropout.
        implementation: `"auto"` (default), `"explicit"` (materialise the
            weights), `"fused"` (`keras.ops.dot_product_attention`) or
            `"memory_efficient"` (chunked keys and queries with an online
            softmax, memory linear in sequence length). `"auto"` uses the
            explicit path when weights are requested or dropout is active,
            and otherwise the path `keras_attention.paths` chooses by
            device (its table): fused on a GPU at every length; on a CPU
            the explicit path on TensorFlow and JAX and the fused one on
            torch, and the memory-efficient path for very long sequences
            (on torch: masked ones). When `key_dim`
            is at least twice each input's width (plus one with biases),
            `"auto"` also computes the scores as `X_q (W_Q W_Kᵀ) X_kᵀ`
            without forming Q and K, unless the call needs Q and K
            themselves (weights, dropout, qk-norm, ssmax, float16, the
            recorder). All paths give the same numbers.
        logit_soft_cap: `None`, or a positive number `c`: the scaled scores
            become `c * tanh(scores / c)` before masking and the softmax
            (Gemma 2's attention logit soft-capping), so none exceeds `c`.
            Computed on the explicit and memory-efficient paths ("auto"
            takes the latter for very long sequences);
            `implementation="fused"` refuses it.
        **kwargs: base layer arguments such as `name` and `dtype`.

    Call arguments:
        query: `(B, T, D_q)`.
        value: `(B, S, D_v)`; defaults to `query` (self-attention).
        key: `(B, S, D_k)`; defaults to `value`.
        query_mask: optional `(B, T)` boolean mask of valid queries; masked
            query rows attend to nothing and output zeros.
        value_mask: optional `(B, S)` boolean mask of valid keys/values.
        key_mask: optional `(B, S)` boolean mask of valid keys.
        attention_mask: optional boolean (or 0/1) mask broadcastable to
            `(B, num_heads, T, S)` from shape `(T, S)`, `(B, T, S)` or
            `(B, num_heads, T, S)`; `True` means "may attend".
        use_causal_mask: add a lower-triangular mask (query i sees keys
            j <= i). All masks combine with logical AND.
        return_attention_scores: also return the attention weights.
        training: whether dropout is active.

    Returns:
        The output `(B, T, output_dim or num_heads * value_dim)`, and with
        `return_attention_scores=True` also the float32 attention weights
        `(B, num_heads, T, S)`: softmax probabilities before dropout, each
        row that may attend somewhere summing to 1, rows that may attend
        nowhere all zero.

    Example:

    >>> layer = ScaledDotProductAttention(key_dim=16, num_heads=2)
    >>> x = keras.random.normal((4, 10, 32))
    >>> y, weights = layer(x, return_attention_scores=True)
    >>> tuple(y.shape), tuple(weights.shape)
    ((4, 10, 32), (4, 2, 10, 10))
    """

    def __init__(
        self,
        key_dim,
        num_heads=1,
        value_dim=None,
        output_dim=None,
        scale="sqrt",
        qk_norm=False,
        use_bias=False,
        dropout=0.0,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        seed=None,
        implementation="auto",
        logit_soft_cap=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.key_dim = check_int(key_dim, "key_dim")
        self.num_heads = check_int(num_heads, "num_heads")
        value_dim = check_int(value_dim, "value_dim", allow_none=True)
        self.value_dim = self.key_dim if value_dim is None else value_dim
        self.output_dim = check_int(output_dim, "output_dim", allow_none=True)
        if isinstance(scale, str) and scale in scales.TRAINABLE_SCALE_MODES:
            self._fixed_scale = None
        else:
            # Raises a ValueError naming `scale` for anything invalid.
            self._fixed_scale = attention_ops.resolve_scale(scale, key_dim)
        self.dropout = check_rate(dropout, "dropout")
        check_choice(implementation, "implementation", IMPLEMENTATIONS)
        self.logit_soft_cap = check_real(
            logit_soft_cap, "logit_soft_cap", low=0.0, high=FLOAT32_MAX,
            low_open=True, allow_none=True)
        if logit_soft_cap is not None and implementation == "fused":
            raise ValueError('`logit_soft_cap` needs `implementation` "auto", '
                             '"explicit" or "memory_efficient"; received '
                             '"fused".')
        self.scale = scale
        self.qk_norm = check_bool(qk_norm, "qk_norm")
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self.seed = seed
        self.implementation = implementation
        self.supports_masking = True
        self._recorder = None
        self._score_offset = None  # set by `record_attention` while recording

    # ------------------------------------------------------------------ build
    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        for shape, name in (
            (query_shape, "query"),
            (value_shape, "value"),
            (key_shape, "key"),
        ):
            if len(shape) != 3:
                raise ValueError(
                    f"`{name}` must be rank 3 (batch, length, features); "
                    f"received shape {tuple(shape)}."
                )
            if shape[-1] is None:
                raise ValueError(
                    f"The last dimension of `{name}` must be known; received "
                    f"shape {tuple(shape)}."
                )
        heads = self.num_heads
        for name, shape, size in (("query", query_shape, self.key_dim),
                                  ("key", key_shape, self.key_dim),
                                  ("value", value_shape, self.value_dim)):
            self._add_projection_weight(name, "kernel",
                                        (shape[-1], heads, size))
        for name, size in (("query", self.key_dim), ("key", self.key_dim),
                           ("value", self.value_dim)) if self.use_bias else ():
            self._add_projection_weight(name, "bias", (heads, size))
        if self.output_dim is not None:
            self._add_projection_weight(
                "output", "kernel", (heads, self.value_dim, self.output_dim))
            if self.use_bias:
                self._add_projection_weight("output", "bias",
                                            (self.output_dim,))
        if self._fixed_scale is None:
            # "learned": one scalar; "ssmax": one s_h per head. Kept in
            # float32 even under mixed precision: it multiplies the float32
            # scores (or the queries, in their dtype).
            name, shape, value = (
                ("ssmax_scale", (heads,),
                 scales.ssmax_initial_scale(key_shape[1]))
                if self.scale == "ssmax"
                else ("learned_scale", (),
                      scales.learned_initial_scale(self.key_dim))
            )
            setattr(self, name, self.add_weight(
                name=name, shape=shape, trainable=True, autocast=False,
                initializer=keras.initializers.Constant(value),
            ))
        if self.qk_norm:
            self.query_norm = keras.layers.LayerNormalization(
                epsilon=1e-6, dtype=self.dtype_policy, name="query_norm"
            )
            self.key_norm = keras.layers.LayerNormalization(
                epsilon=1e-6, dtype=self.dtype_policy, name="key_norm"
            )
            head_shape = (None, None, heads, self.key_dim)
            self.query_norm.build(head_shape)
            self.key_norm.build(head_shape)
        if self.dropout > 0.0:
            self.seed_generator = keras.random.SeedGenerator(self.seed)
        else:
            self.seed_generator = None

    def _add_projection_weight(self, part, kind, shape):
        """Adds `self.{part}_{kind}`: a `kind` ("kernel" or "bias") weight
        with that kind's initializer, regularizer and constraint."""
        name = f"{part}_{kind}"
        setattr(self, name, self.add_weight(
            name=name,
            shape=shape,
            initializer=fresh(getattr(self, f"{kind}_initializer")),
            regularizer=getattr(self, f"{kind}_regularizer"),
            constraint=getattr(self, f"{kind}_constraint"),
        ))

    # ------------------------------------------------------------------- call
    def __call__(self, query, value=None, key=None, **kwargs):
        # Keras fills `<arg>_mask` from upstream masks only when a layer gets
        # several tensors; in self-attention `query` is the only one, so pick
        # up its mask here (it masks both the queries and the keys).
        if value is None and kwargs.get("query_mask") is None:
            mask = utils.keras_mask(query)
            if mask is not None:
                kwargs["query_mask"] = mask
        return super().__call__(query, value=value, key=key, **kwargs)

    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
    ):
        if value is None:
            value = query
            if value_mask is None:
                value_mask = query_mask
        if key is None:
            key = value
            if key_mask is None:
                key_mask = value_mask
        utils.check_inputs(query, value, key)
        masks = utils.build_masks(
            query, key, self.num_heads, query_mask, value_mask, key_mask,
            attention_mask, use_causal_mask,
        )
        dropout_active = bool(training) and self.dropout > 0.0
        if self._factors(query, key, return_attention_scores,
                         dropout_active):
            q, k = utils.factored_query_key(
                query, key, self.query_kernel, self.key_kernel,
                *((self.query_bias, self.key_bias) if self.use_bias
                  else ()))
            v = utils.project(value, self.value_kernel)
            if self.use_bias:
                v = v + self.value_bias
        else:
            q, k, v = self._project(query, value, key)
        attended, weights = self._compute_attention(
            q, k, v, masks, return_attention_scores, dropout_active
        )
        output = utils.merge_heads(attended)
        if self.output_dim is not None:
            output = utils.flat_matmul(
                output,
                ops.reshape(
                    self.output_kernel,
                    (self.num_heads * self.value_dim, self.output_dim),
                ),
            )
            if self.use_bias:
                output = output + self.output_bias
        if return_attention_scores:
            return output, weights
        return output

    def _project(self, query, value, key):
        """Q, K and V `(B, length, H, d)`, with biases and qk-norm."""
        if query is key and key is value:
            q, k, v = utils.project_together(
                query, self.query_kernel, self.key_kernel, self.value_kernel
            )
        else:
            q = utils.project(query, self.query_kernel)
            k = utils.project(key, self.key_kernel)
            v = utils.project(value, self.value_kernel)
        if self.use_bias:
            q = q + self.query_bias
            k = k + self.key_bias
            v = v + self.value_bias
        if self.qk_norm:
            q = self.query_norm(q)
            k = self.key_norm(k)
        return q, k, v

    def _factors(self, query, key, need_weights, dropout_active):
        """Whether `"auto"` computes the scores from `M_h = W_Q,h W_K,hᵀ`
        (`utils.factored_query_key`): only where nothing needs Q and K
        themselves (the weights, dropout, the recorder, qk-norm, ssmax's
        d_k, float16's range) and `utils.factor_query_key` finds it
        cheaper."""
        return (
            self.implementation == "auto"
            and not (need_weights or dropout_active or self.qk_norm)
            and self._recorder is None
            and self.scale != "ssmax"
            and keras.backend.standardize_dtype(self.compute_dtype)
            != "float16"
            and utils.factor_query_key(query.shape, key.shape, self.key_dim,
                                       self.use_bias))

    def _compute_attention(self, q, k, v, masks, need_weights, dropout_active):
        """The heads' outputs `(B, T, H, d_v)` and the weights (or `None`)
        on the path `_choose_path` picks."""
        scale = self._fixed_scale
        if self.scale == "learned":
            scale = self.learned_scale
        elif self.scale == "ssmax":  # every path, with the queries scaled
            q, scale = utils.ssmax_queries(q, k, masks, self.ssmax_scale), 1.0
        padded = any(mask is not None
                     for mask in (masks.query, masks.key, masks.attention))
        path = self._choose_path(q, k, need_weights, dropout_active,
                                 masks.causal or padded)
        if path == "memory_efficient":
            return memory_efficient_attention(
                q, k, v, scale=scale, key_mask=masks.key,
                query_mask=masks.query, attention_mask=masks.attention,
                causal=masks.causal,
                logit_soft_cap=self.logit_soft_cap), None
        if path == "fused" and masks.causal and not padded:
            return utils.fused_attention(q, k, v, None, scale,
                                         causal=True), None
        mask = masks.combined(ops.shape(q)[1], ops.shape(k)[1])
        if path == "explicit_weights":
            return self._explicit_attention(q, k, v, mask, scale,
                                            dropout_active)
        if path == "fused":
            return utils.fused_attention(q, k, v, mask, scale), None
        return attention_ops.attend_output(q, k, v, mask, scale), None

    def _choose_path(self, query, key, need_weights, dropout_active, masked):
        """`paths.choose_path` for this call: the policy by device, and
        its table, are in `keras_attention.paths`."""
        if self.implementation == "memory_efficient" and need_weights:
            raise ValueError(
                'implementation="memory_efficient" cannot return '
                "attention weights; call with "
                "`return_attention_scores=False` or use another "
                "implementation."
            )
        return paths.choose_path(
            implementation=self.implementation, device=paths.device_kind(),
            query_length=query.shape[1], key_length=key.shape[1],
            masked=masked, logit_soft_cap=self.logit_soft_cap,
            needs_weights=(need_weights or dropout_active
                           or self._recorder is not None),
            float16=keras.backend.standardize_dtype(self.compute_dtype)
            == "float16",
            # jax's fused op needs it (factored queries have the input's
            # width)
            fused_fits=self.value_dim == query.shape[-1])

    def _explicit_attention(self, q, k, v, mask, scale, dropout_active):
        attended, weights, scores = attention_ops.attend(
            q, k, v, mask, scale, dropout_rate=self.dropout,
            training=dropout_active, seed_generator=self.seed_generator,
            score_offset=self._score_offset,
            logit_soft_cap=self.logit_soft_cap)
        if self._recorder is not None:
            self._recorder[self.name] = {
                "scores": scores,
                "weights": weights,
                "mask": mask,
            }
        return attended, weights

    # -------------------------------------------------------- shapes, config
    def compute_output_shape(self, query_shape, value_shape=None,
                             key_shape=None):
        width = (self.output_dim if self.output_dim is not None
                 else self.num_heads * self.value_dim)
        return (query_shape[0], query_shape[1], width)

    def compute_output_spec(
        self, query, value=None, key=None, return_attention_scores=False,
        **masks_and_training,
    ):
        # `__call__` takes no positional argument after `key`, so the masks
        # and `training` (which do not change the output's spec) arrive here
        # by name.
        value = query if value is None else value
        key = value if key is None else key
        utils.check_inputs(query, value, key)
        output = keras.KerasTensor(
            self.compute_output_shape(query.shape), dtype=self.compute_dtype
        )
        if not return_attention_scores:
            return output
        weights = keras.KerasTensor(
            (query.shape[0], self.num_heads, query.shape[1], key.shape[1]),
            dtype=attention_ops.softmax_dtype(self.compute_dtype),
        )
        return output, weights

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "key_dim": self.key_dim,
                "num_heads": self.num_heads,
                "value_dim": self.value_dim,
                "output_dim": self.output_dim,
                "scale": self.scale,
                "qk_norm": self.qk_norm,
                "use_bias": self.use_bias,
                "dropout": self.dropout,
                "seed": self.seed,
                "implementation": self.implementation,
                "logit_soft_cap": self.logit_soft_cap,
            }
        )
        for part, module in (("initializer", keras.initializers),
                             ("regularizer", keras.regularizers),
                             ("constraint", keras.constraints)):
            for name in (f"kernel_{part}", f"bias_{part}"):
                config[name] = module.serialize(getattr(self, name))
        return config
