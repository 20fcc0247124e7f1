"""`ScaledDotProductAttention` on Keras's own layer-test harness.

`keras.src.testing.TestCase.run_layer_test` builds the layer, checks its
weights and seed generators, `get_config`/`from_config` and a `.keras`
round trip, symbolic against eager outputs, `supports_masking`, one
`fit` step (for a single input tensor: the harness calls the layer on its
one input) and a mixed-precision instance (output dtype = the policy's
compute dtype, weights float32; the harness skips it on torch without
CUDA). The module runs on TensorFlow here and on jax and torch in the
child runs of `test_backends.py`.
"""

import keras
import numpy as np
import pytest
from keras.src import testing

from keras_attention import ScaledDotProductAttention

# Every case here passes on torch too (tests/test_backends.py runs them).
pytestmark = pytest.mark.backends("torch")

SELF_SHAPE = (2, 6, 8)
CROSS_SHAPES = {"query_shape": (2, 6, 8), "value_shape": (2, 5, 7)}


class LayerHarnessTest(testing.TestCase):
    def run_case(self, init_kwargs, trainable, seeds=0, input_shape=SELF_SHAPE,
                 output_width=None, **kwargs):
        query_shape = (
            input_shape["query_shape"] if isinstance(input_shape, dict)
            else input_shape
        )
        width = output_width or init_kwargs.get("num_heads", 1) * (
            init_kwargs.get("value_dim") or init_kwargs["key_dim"]
        )
        self.run_layer_test(
            ScaledDotProductAttention,
            init_kwargs=init_kwargs,
            input_shape=input_shape,
            expected_output_shape=query_shape[:2] + (width,),
            expected_num_trainable_weights=trainable,
            expected_num_non_trainable_weights=0,
            expected_num_seed_generators=seeds,
            expected_num_losses=0,
            supports_masking=True,
            # fit() calls the layer on one tensor: not for cross-attention.
            run_training_check=not isinstance(input_shape, dict),
            **kwargs,
        )

    def test_self_attention(self):
        self.run_case({"key_dim": 4, "num_heads": 2}, trainable=3)

    def test_self_attention_with_output_projection_and_causal_mask(self):
        self.run_case(
            {"key_dim": 4, "num_heads": 2, "output_dim": 8}, trainable=4,
            output_width=8, call_kwargs={"use_causal_mask": True},
        )

    def test_cross_attention(self):
        self.run_case(
            {"key_dim": 4, "num_heads": 2, "value_dim": 3}, trainable=3,
            input_shape=CROSS_SHAPES,
        )

    def test_bias(self):
        self.run_case(
            {"key_dim": 4, "num_heads": 2, "output_dim": 8, "use_bias": True},
            trainable=8, output_width=8,
        )

    def test_cross_attention_with_bias(self):
        self.run_case(
            {"key_dim": 4, "num_heads": 3, "use_bias": True}, trainable=6,
            input_shape=CROSS_SHAPES,
        )

    @pytest.mark.backends("jax")
    def test_dropout(self):
        self.run_case(
            {"key_dim": 4, "num_heads": 2, "dropout": 0.3, "seed": 1},
            trainable=3, seeds=1,
        )

    def test_learned_scale(self):
        self.run_case(
            {"key_dim": 4, "num_heads": 2, "scale": "learned"}, trainable=4
        )

    def test_ssmax_scale_causal(self):
        self.run_case(
            {"key_dim": 4, "num_heads": 2, "scale": "ssmax"}, trainable=4,
            call_kwargs={"use_causal_mask": True},
        )

    def test_qk_norm(self):
        # Two LayerNormalization sublayers: gamma and beta each.
        self.run_case({"key_dim": 4, "num_heads": 2, "qk_norm": True},
                      trainable=7)

    @pytest.mark.backends("jax")
    def test_learned_scale_and_qk_norm_cross_attention(self):
        self.run_case(
            {"key_dim": 4, "num_heads": 2, "scale": "learned",
             "qk_norm": True}, trainable=8, input_shape=CROSS_SHAPES,
        )

    def test_expected_output_on_given_data(self):
        # With `input_data` the harness also compares the output with a value
        # computed here: when every position holds the same vector, the keys
        # are identical, the weights uniform, and each output is that
        # vector's projected value (W_V all ones: its feature sum, per dim).
        rng = np.random.default_rng(0)
        token = rng.standard_normal((2, 1, 3)).astype("float32")
        inputs = np.repeat(token, 4, axis=1)
        expected = np.repeat(token.sum(-1, keepdims=True), 2, axis=-1)
        self.run_layer_test(
            ScaledDotProductAttention,
            init_kwargs={"key_dim": 2, "kernel_initializer": "ones"},
            input_data=inputs,
            # The harness wants the backend's tensor type here.
            expected_output=keras.ops.convert_to_tensor(
                np.repeat(expected, 4, axis=1)
            ),
            expected_num_trainable_weights=3,
            supports_masking=True,
        )
