"""Why attention divides by sqrt(d_k), in your own training script.

If the components of q and k have mean 0 and variance 1, q.k has variance
d_k: unscaled scores grow with the key size and the softmax saturates into
nearly one-hot rows. Here the same model is trained twice with
`keras_attention.ScaledDotProductAttention`, once with `scale="sqrt"` (the
default, scores / sqrt(d_k)) and once with `scale="none"`, from the same
seed (so the same initial weights and batches) on the same data, with
`AttentionMonitor` logging both into one directory. At step 0 the unscaled
run's score std is sqrt(d_k) times the scaled one's and its entropy is far
lower.

    python examples/scale_vs_no_scale.py     # 20 s on TensorFlow, 2 CPU cores
    tensorboard --logdir logs/scale_vs_no_scale

In the ATTENTION tab the orange button "scaled vs unscaled, d_k 64, seed 0"
shows the two runs side by side with their difference (the dashboard offers
it for runs named `<arm>-dk<d_k>-seed<seed>`); the SCALARS tab has both
runs' loss and per-head entropy.
"""

import argparse
import os

# keras_attention before Keras: where TensorFlow is missing and KERAS_BACKEND
# is unset, it picks JAX (else torch) and says so, where Keras alone would
# fail to import.
from keras_attention import AttentionMonitor
from keras_attention import ScaledDotProductAttention
from keras_attention import attention_entropy
import keras
import numpy as np


def reversal_data(num_sequences, seq_len, vocab_size, seed):
    """Random digit sequences and their reversals."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, vocab_size, size=(num_sequences, seq_len))
    return x.astype("int32"), x[:, ::-1].astype("int32")


class PositionEmbedding(keras.layers.Layer):
    """Adds a learned vector per position (attention alone is order-blind)."""

    def build(self, input_shape):
        self.table = self.add_weight(shape=input_shape[1:], name="table",
                                     initializer="random_normal")

    def call(self, x):
        return x + self.table


def build_models(scale, seq_len, vocab_size, key_dim, d_model=32,
                 num_heads=2):
    """The model, and a second one sharing its layers that returns the
    attention weights `(batch, heads, T, T)`."""
    tokens = keras.Input((seq_len,), dtype="int32")
    x = keras.layers.Embedding(vocab_size, d_model)(tokens)
    x = PositionEmbedding()(x)
    # Unit-variance features and W_Q, W_K ~ N(0, 1/d_model) give q and k
    # unit-variance components at the start: the lesson's assumption.
    x = keras.layers.LayerNormalization()(x)
    x, weights = ScaledDotProductAttention(
        key_dim=key_dim, num_heads=num_heads, output_dim=d_model,
        scale=scale, name="attention",
        kernel_initializer=keras.initializers.RandomNormal(
            stddev=d_model ** -0.5),
    )(x, return_attention_scores=True)
    logits = keras.layers.Dense(vocab_size)(x)
    return keras.Model(tokens, logits), keras.Model(tokens, weights)


def positive_int(text):
    """An integer flag's value, refused (exit status 2) unless it is >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f"must be a positive integer; received {text!r}")
    return int(text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--logdir", default="logs/scale_vs_no_scale")
    parser.add_argument("--epochs", type=positive_int, default=4)
    parser.add_argument("--sequences", type=positive_int, default=4096,
                        help="training sequences per epoch")
    parser.add_argument("--batch-size", type=positive_int, default=64)
    parser.add_argument("--seq-len", type=positive_int, default=8)
    parser.add_argument("--key-dim", type=positive_int, default=64)
    parser.add_argument("--update-freq", type=positive_int, default=20,
                        help="log attention every this many batches")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    vocab_size = 10  # the digits 0-9
    x, y = reversal_data(args.sequences, args.seq_len, vocab_size, args.seed)
    examples = reversal_data(4, args.seq_len, vocab_size, seed=args.seed + 1)
    labels = [[str(digit) for digit in row] for row in examples[0]]

    for arm, scale in (("scaled", "sqrt"), ("unscaled", "none")):
        # The same seed for both runs: the same initial weights and batches.
        keras.utils.set_random_seed(args.seed)
        model, attention = build_models(scale, args.seq_len, vocab_size,
                                        args.key_dim)
        model.compile(optimizer=keras.optimizers.Adam(3e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(
                          from_logits=True))
        run_dir = os.path.join(args.logdir,
                               f"{arm}-dk{args.key_dim}-seed{args.seed}")
        callbacks = [AttentionMonitor(run_dir, examples,
                                      update_freq=args.update_freq,
                                      labels=labels)]
        history = model.fit(x, y, batch_size=args.batch_size,
                            epochs=args.epochs, callbacks=callbacks,
                            verbose=0)
        entropy = attention_entropy(attention.predict(examples[0], verbose=0),
                                    normalize=True)
        print(f"{arm:>8} (scale={scale!r}): final loss "
              f"{history.history['loss'][-1]:.3g}, attention entropy "
              f"{float(keras.ops.mean(entropy)):.3f} (1 = uniform, "
              f"0 = one-hot)")
    print(f"tensorboard --logdir {args.logdir}")


if __name__ == "__main__":
    main()
