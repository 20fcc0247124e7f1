"""The `ScaledDotProductAttention` Keras layer."""

import math
import numbers

import keras
from keras import ops

from keras_attention import ops as attention_ops
from keras_attention.initializers import fresh
from keras_attention.ops import SCALE_MODES

try:  # Where Keras keeps a tensor's propagated mask (all backends).
    from keras.src.backend.common.masking import get_keras_mask as _keras_mask
except ImportError:  # pragma: no cover - older or newer Keras layouts

    def _keras_mask(tensor):
        return getattr(tensor, "_keras_mask", None)

IMPLEMENTATIONS = ("auto", "explicit", "fused", "memory_efficient")

# Above this many query-key pairs per head, `implementation="auto"` switches
# to the chunked path, whose memory does not grow with T * S.
MEMORY_EFFICIENT_THRESHOLD = 4096 * 4096


def _check_positive_int(value, name, allow_none=False):
    if value is None and allow_none:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value <= 0
    ):
        raise ValueError(
            f"`{name}` must be a positive integer; received {value!r}."
        )


def _flat_matmul(inputs, kernel):
    """`inputs (B, T, K)` times `kernel (K, N)` -> `(B, T, N)` as one 2-D matmul.

    Flattening B and T first matters: a rank-3 by rank-2 matmul is a
    broadcast batched matmul on TensorFlow, whose kernel gradient is B
    per-example products summed afterwards (and under XLA the forward pass
    too is B small products).
    """
    shape = ops.shape(inputs)
    flat = ops.reshape(inputs, (-1, kernel.shape[0]))
    return ops.reshape(
        ops.matmul(flat, kernel), (shape[0], shape[1], kernel.shape[1])
    )


def _heads_flat(kernel):
    """A `(D, H, d)` projection kernel as the `(D, H * d)` matrix."""
    features, heads, size = kernel.shape
    return ops.reshape(kernel, (features, heads * size))


def _project(inputs, kernel):
    """`inputs (B, T, D)` times `kernel (D, H, d)` -> `(B, T, H, d)`.

    One plain matmul over the flattened heads: on TensorFlow,
    keras.ops.einsum lowers this pattern to custom ops that are about 3x
    slower under XLA.
    """
    _, heads, size = kernel.shape
    projected = _flat_matmul(inputs, _heads_flat(kernel))
    shape = ops.shape(inputs)
    return ops.reshape(projected, (shape[0], shape[1], heads, size))


@keras.saving.register_keras_serializable(package="keras_attention")
class ScaledDotProductAttention(keras.layers.Layer):
    """Scaled dot-product attention with learned Q, K, V projections.

    Computes `softmax(Q Kᵀ · scale) V` with `Q = X W_Q`, `K = X W_K`,
    `V = X W_V`, for one or several heads. With the default
    `scale="sqrt"` the scores are divided by `sqrt(key_dim)`, which keeps
    their variance near 1 when q and k have unit-variance components;
    `scale="none"` leaves them unscaled, so they grow like `sqrt(key_dim)` and
    push the softmax towards one-hot rows.

    Args:
        key_dim: size `d_k` of each head's queries and keys.
        num_heads: number of heads; their outputs are concatenated.
        value_dim: size of each head's values; defaults to `key_dim`.
        output_dim: `None` for no output projection (the output has
            `num_heads * value_dim` features), or the width of an output
            projection `W_O` of shape `(num_heads, value_dim, output_dim)`.
        scale: `"sqrt"` (1/sqrt(key_dim)), `"none"` (1.0), a positive float,
            or `"learned"` (a trainable scalar starting at 1/sqrt(key_dim)).
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
            the memory-efficient path for very long sequences, and otherwise
            the explicit path on TensorFlow (faster there) and the fused path
            on other backends. All paths give the same numbers.
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
        **kwargs,
    ):
        super().__init__(**kwargs)
        _check_positive_int(key_dim, "key_dim")
        _check_positive_int(num_heads, "num_heads")
        _check_positive_int(value_dim, "value_dim", allow_none=True)
        _check_positive_int(output_dim, "output_dim", allow_none=True)
        if isinstance(scale, str) and scale == "learned":
            self._fixed_scale = None
        else:
            # Raises a ValueError naming `scale` for anything invalid.
            self._fixed_scale = attention_ops.resolve_scale(scale, key_dim)
        if isinstance(dropout, bool) or not isinstance(
            dropout, numbers.Real
        ) or not (0.0 <= dropout < 1.0):
            raise ValueError(
                f"`dropout` must be a number in [0, 1); received {dropout!r}."
            )
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(
                f"`implementation` must be one of {IMPLEMENTATIONS}; "
                f"received {implementation!r}."
            )
        self.key_dim = int(key_dim)
        self.num_heads = int(num_heads)
        self.value_dim = int(value_dim) if value_dim is not None else self.key_dim
        self.output_dim = int(output_dim) if output_dim is not None else None
        self.scale = scale
        self.qk_norm = bool(qk_norm)
        self.use_bias = bool(use_bias)
        self.dropout = float(dropout)
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
        self.query_kernel = self._add_kernel(
            "query_kernel", (query_shape[-1], heads, self.key_dim)
        )
        self.key_kernel = self._add_kernel(
            "key_kernel", (key_shape[-1], heads, self.key_dim)
        )
        self.value_kernel = self._add_kernel(
            "value_kernel", (value_shape[-1], heads, self.value_dim)
        )
        if self.use_bias:
            self.query_bias = self._add_bias("query_bias", (heads, self.key_dim))
            self.key_bias = self._add_bias("key_bias", (heads, self.key_dim))
            self.value_bias = self._add_bias(
                "value_bias", (heads, self.value_dim)
            )
        if self.output_dim is not None:
            self.output_kernel = self._add_kernel(
                "output_kernel", (heads, self.value_dim, self.output_dim)
            )
            if self.use_bias:
                self.output_bias = self._add_bias(
                    "output_bias", (self.output_dim,)
                )
        if self._fixed_scale is None:
            # Kept in float32 even under mixed precision: it multiplies the
            # float32 scores.
            self.learned_scale = self.add_weight(
                name="learned_scale",
                shape=(),
                initializer=keras.initializers.Constant(
                    1.0 / math.sqrt(self.key_dim)
                ),
                trainable=True,
                autocast=False,
            )
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

    def _add_kernel(self, name, shape):
        return self.add_weight(
            name=name,
            shape=shape,
            initializer=fresh(self.kernel_initializer),
            regularizer=self.kernel_regularizer,
            constraint=self.kernel_constraint,
        )

    def _add_bias(self, name, shape):
        return self.add_weight(
            name=name,
            shape=shape,
            initializer=fresh(self.bias_initializer),
            regularizer=self.bias_regularizer,
            constraint=self.bias_constraint,
        )

    # ------------------------------------------------------------------- call
    def __call__(self, query, value=None, key=None, **kwargs):
        # Keras fills `<arg>_mask` from upstream masks only when a layer gets
        # several tensors; in self-attention `query` is the only one, so pick
        # up its mask here (it masks both the queries and the keys).
        if value is None and kwargs.get("query_mask") is None:
            mask = _keras_mask(query)
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
        self._check_inputs(query, value, key)

        if query is key and key is value:
            q, k, v = self._project_together(query)
        else:
            q = _project(query, self.query_kernel)
            k = _project(key, self.key_kernel)
            v = _project(value, self.value_kernel)
        if self.use_bias:
            q = q + self.query_bias
            k = k + self.key_bias
            v = v + self.value_bias
        if self.qk_norm:
            q = self.query_norm(q)
            k = self.key_norm(k)

        scale = (
            self._fixed_scale
            if self._fixed_scale is not None
            else self.learned_scale
        )
        if attention_mask is not None:
            attention_mask = self._expand_attention_mask(
                attention_mask, query, key
            )
        dropout_active = bool(training) and self.dropout > 0.0
        path = self._choose_path(
            query, key, return_attention_scores, dropout_active
        )
        weights = None
        if path == "memory_efficient":
            from keras_attention.memory_efficient import (
                memory_efficient_attention,
            )

            attended = memory_efficient_attention(
                q,
                k,
                v,
                scale=scale,
                key_mask=attention_ops.combine_masks(value_mask, key_mask),
                query_mask=query_mask,
                attention_mask=attention_mask,
                causal=use_causal_mask,
            )
        else:
            mask = self._combined_mask(
                query,
                key,
                query_mask,
                value_mask,
                key_mask,
                attention_mask,
                use_causal_mask,
            )
            if path == "fused":
                attended = self._fused_attention(q, k, v, mask, scale)
            elif path == "explicit_weights":
                attended, weights = self._explicit_attention(
                    q, k, v, mask, scale, dropout_active
                )
            else:
                attended = attention_ops.attend_output(q, k, v, mask, scale)

        if self.output_dim is not None:
            shape = ops.shape(attended)
            flat = ops.reshape(
                attended, (shape[0], shape[1], self.num_heads * self.value_dim)
            )
            output = _flat_matmul(
                flat,
                ops.reshape(
                    self.output_kernel,
                    (self.num_heads * self.value_dim, self.output_dim),
                ),
            )
            if self.use_bias:
                output = output + self.output_bias
        else:
            shape = ops.shape(attended)
            output = ops.reshape(
                attended,
                (shape[0], shape[1], self.num_heads * self.value_dim),
            )
        if return_attention_scores:
            return output, weights
        return output

    def _project_together(self, inputs):
        """Self-attention's Q, K and V from one matmul with the kernels side
        by side: one pass over the inputs, and one matmul (instead of three
        plus two sums) for the inputs' gradient. Measured up to 15% faster
        for a whole layer step under XLA by scripts/bench_layer.py."""
        heads, key_dim, value_dim = self.num_heads, self.key_dim, self.value_dim
        kernel = ops.concatenate(
            [
                _heads_flat(self.query_kernel),
                _heads_flat(self.key_kernel),
                _heads_flat(self.value_kernel),
            ],
            axis=-1,
        )
        projected = _flat_matmul(inputs, kernel)
        q, k, v = ops.split(
            projected, [heads * key_dim, 2 * heads * key_dim], axis=-1
        )
        shape = ops.shape(inputs)
        return (
            ops.reshape(q, (shape[0], shape[1], heads, key_dim)),
            ops.reshape(k, (shape[0], shape[1], heads, key_dim)),
            ops.reshape(v, (shape[0], shape[1], heads, value_dim)),
        )

    def _choose_path(self, query, key, need_weights, dropout_active):
        """One of "memory_efficient", "fused", "explicit" (output only, with
        the hand-written backward pass) and "explicit_weights" (the weights
        materialised for the caller, dropout or the recorder)."""
        if need_weights or dropout_active or self._recorder is not None:
            if self.implementation == "memory_efficient" and need_weights:
                raise ValueError(
                    'implementation="memory_efficient" cannot return '
                    "attention weights; call with "
                    "`return_attention_scores=False` or use another "
                    "implementation."
                )
            return "explicit_weights"
        fused_ok = self.value_dim == self.key_dim  # jax's fused op needs it
        if self.implementation == "fused" and not fused_ok:
            return "explicit"
        if self.implementation != "auto":
            return self.implementation
        query_length, key_length = query.shape[1], key.shape[1]
        if (
            query_length is not None
            and key_length is not None
            and query_length * key_length >= MEMORY_EFFICIENT_THRESHOLD
            and keras.backend.backend() in ("tensorflow", "jax")
        ):
            return "memory_efficient"
        if keras.backend.standardize_dtype(self.compute_dtype) == "float16":
            # The fused op takes the score product in float16.
            return "explicit"
        if keras.backend.backend() == "tensorflow":
            # TensorFlow has no fused kernel: its dot_product_attention is two
            # tf.einsum calls whose gradients transpose (B, H, T, S) tensors,
            # while the explicit path's batched matmuls read transposed
            # operands in place (measured by scripts/bench_layer.py).
            return "explicit"
        return "fused" if fused_ok else "explicit"

    def _explicit_attention(self, q, k, v, mask, scale, dropout_active):
        attended, weights, scores = attention_ops.attend(
            q, k, v, mask, scale,
            dropout_rate=self.dropout,
            training=dropout_active,
            seed_generator=self.seed_generator,
        )
        if self._recorder is not None:
            self._recorder[self.name] = {
                "scores": scores,
                "weights": weights,
                "mask": mask,
            }
        return attended, weights

    def _fused_attention(self, q, k, v, mask, scale):
        attended = ops.dot_product_attention(
            q,
            k,
            v,
            mask=mask,
            scale=(
                scale
                if isinstance(scale, float)
                else ops.cast(scale, attention_ops.softmax_dtype(q.dtype))
            ),
        )
        if mask is None:
            return attended
        # The fused op averages over all keys when a row has none left;
        # the layer's contract is a zero output.
        full = ops.broadcast_to(
            mask,
            (
                ops.shape(q)[0],
                self.num_heads,
                ops.shape(q)[1],
                ops.shape(k)[1],
            ),
        )
        row_has_key = ops.any(full, axis=-1)  # (B, H, T)
        row_has_key = ops.expand_dims(ops.transpose(row_has_key, (0, 2, 1)), -1)
        return ops.where(row_has_key, attended, ops.zeros_like(attended))

    # ------------------------------------------------------------ validation
    def _check_inputs(self, query, value, key):
        for tensor, name in ((query, "query"), (value, "value"), (key, "key")):
            if len(tensor.shape) != 3:
                raise ValueError(
                    f"`{name}` must be rank 3 (batch, length, features); "
                    f"received shape {tuple(tensor.shape)}."
                )
        if (
            key.shape[1] is not None
            and value.shape[1] is not None
            and key.shape[1] != value.shape[1]
        ):
            raise ValueError(
                "`key` and `value` must have the same length; received "
                f"key shape {tuple(key.shape)} and value shape "
                f"{tuple(value.shape)}."
            )
        batches = {
            name: tensor.shape[0]
            for tensor, name in ((query, "query"), (value, "value"), (key, "key"))
            if tensor.shape[0] is not None
        }
        if len(set(batches.values())) > 1:
            raise ValueError(
                "`query`, `value` and `key` must have the same batch size; "
                f"received {batches}."
            )

    def _expand_attention_mask(self, attention_mask, query, key):
        attention_mask = ops.convert_to_tensor(attention_mask)
        expected = (
            query.shape[0],
            self.num_heads,
            query.shape[1],
            key.shape[1],
        )
        rank = len(attention_mask.shape)
        if rank == 2:
            attention_mask = attention_mask[None, None, :, :]
        elif rank == 3:
            attention_mask = attention_mask[:, None, :, :]
        elif rank != 4:
            raise ValueError(
                "`attention_mask` must have shape (T, S), (B, T, S) or "
                f"(B, num_heads, T, S) broadcastable to {expected}; received "
                f"shape {tuple(attention_mask.shape)}."
            )
        for got, want in zip(attention_mask.shape, expected):
            if got is not None and want is not None and got not in (1, want):
                raise ValueError(
                    f"`attention_mask` of shape "
                    f"{tuple(attention_mask.shape)} does not broadcast to "
                    f"(B, num_heads, T, S) = {expected}."
                )
        return ops.cast(attention_mask, "bool")

    def _combined_mask(
        self,
        query,
        key,
        query_mask,
        value_mask,
        key_mask,
        attention_mask,
        use_causal_mask,
    ):
        masks = []
        if query_mask is not None:
            masks.append(ops.cast(query_mask, "bool")[:, None, :, None])
        for mask in (value_mask, key_mask):
            if mask is not None:
                masks.append(ops.cast(mask, "bool")[:, None, None, :])
        if attention_mask is not None:
            masks.append(attention_mask)
        if use_causal_mask:
            causal = attention_ops.causal_mask(
                ops.shape(query)[1], ops.shape(key)[1]
            )
            masks.append(causal[None, None, :, :])
        return attention_ops.combine_masks(*masks)

    # -------------------------------------------------------- shapes, config
    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        width = (
            self.output_dim
            if self.output_dim is not None
            else self.num_heads * self.value_dim
        )
        return (query_shape[0], query_shape[1], width)

    def compute_output_spec(
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
        value = query if value is None else value
        key = value if key is None else key
        self._check_inputs(query, value, key)
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
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
                "kernel_regularizer": keras.regularizers.serialize(
                    self.kernel_regularizer
                ),
                "bias_regularizer": keras.regularizers.serialize(
                    self.bias_regularizer
                ),
                "kernel_constraint": keras.constraints.serialize(
                    self.kernel_constraint
                ),
                "bias_constraint": keras.constraints.serialize(
                    self.bias_constraint
                ),
                "seed": self.seed,
                "implementation": self.implementation,
            }
        )
        return config
