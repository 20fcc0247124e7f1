"""What the benchmark scripts share: flags, backend set-up, clocks, the
order of interleaved rounds, tables, hand-written projections and FLOPs.

Import it first: it sets the Keras backend (`--backend B` on the command
line, else KERAS_BACKEND, else tensorflow) and TensorFlow's log level before
Keras is imported, and puts the source checkout on `sys.path` so the scripts
run without installing the package. Everything here needs only the library
and `pipelines.common`; what the trainer benchmarks share lives in
`_training.py`.
"""

import argparse
import os
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

# Imports no framework: `--backend` is read before Keras is imported.
from pipelines.backends import backend_from_argv  # noqa: E402

if backend_from_argv(sys.argv[1:]) is not None:
    os.environ["KERAS_BACKEND"] = backend_from_argv(sys.argv[1:])
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# pipelines.common imports the library, hence Keras and its backend (about
# 3 s): `--help` is no faster with the framework imported lazily, so it is
# not.
import keras  # noqa: E402
import numpy as np  # noqa: E402

# TensorFlow only where the benchmark runs on it (the TF-only benchmarks
# refuse other backends in `setup_tensorflow`), JAX likewise.
if keras.backend.backend() == "tensorflow":
    import tensorflow as tf  # noqa: E402
if keras.backend.backend() == "jax":
    import jax  # noqa: E402

from pipelines.common import OneLineErrorParser  # noqa: E402

# --clock: elapsed time, or the CPU time of this process (all threads), which
# other jobs on a shared machine disturb far less.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def note(text):
    """Prints a `# ` progress or failure note on stderr at once."""
    print(f"# {text}", file=sys.stderr, flush=True)


def fail(prog, message, status=1):
    """Writes `prog: error: message` as one line on stderr and exits."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    sys.exit(status)


# ------------------------------------------------------------------ flags
def positive(kind, name, noun):
    """An argparse type accepting `kind(text) > 0`; errors name the flag."""

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not value > 0:
            raise argparse.ArgumentTypeError(
                f"{name} must be {noun}; received {text!r}"
            )
        return value

    return parse


def positive_int(name):
    """An argparse type accepting integers > 0; errors name the flag."""
    return positive(int, name, "a positive integer")


def positive_int_list(name):
    """An argparse type for a comma-separated list of integers > 0."""

    def parse(text):
        try:
            values = [int(item) for item in text.split(",") if item.strip()]
        except ValueError:
            values = []
        if not values or any(value <= 0 for value in values):
            raise argparse.ArgumentTypeError(
                f"{name} must be a comma-separated list of positive integers; "
                f"received {text!r}"
            )
        return values

    return parse


def subset_list(name, choices):
    """An argparse type for a comma-separated subset of `choices`, in the
    order given, without repeats."""

    def parse(text):
        values = [item.strip() for item in text.split(",") if item.strip()]
        if not values or any(value not in choices for value in values):
            raise argparse.ArgumentTypeError(
                f"{name} must be a comma-separated subset of "
                f"{','.join(choices)}; received {text!r}"
            )
        return list(dict.fromkeys(values))

    return parse


def parser(prog, description):
    """The scripts' argument parser: a bad flag is one line on stderr and
    exit status 2 (`pipelines.common.OneLineErrorParser`)."""
    return OneLineErrorParser(prog=prog, description=description)


def add_flag(parser, flag, default, help, parse=positive_int):
    """Adds `flag`, parsed by `parse(flag)` (so its errors name the flag)."""
    parser.add_argument(flag, type=parse(flag), default=default, help=help)


# ------------------------------------------------------------- set-up
def setup_tensorflow(prog, threads=None, backends=("tensorflow",)):
    """Checks the Keras backend; on TensorFlow sets its thread counts
    (before its first op) and silences its Python logger; sets torch's
    thread count on TensorFlow (the peer of bench_layer.py) and on torch.

    Exits with status 2 unless Keras runs on one of `backends`.
    """
    if keras.backend.backend() not in backends:
        fail(
            prog,
            f"needs the Keras backend {' or '.join(backends)}; KERAS_BACKEND "
            f"is {keras.backend.backend()!r}",
            status=2,
        )
    if threads is not None and keras.backend.backend() != "jax":
        try:  # the torch peer of bench_layer.py, when torch is installed
            import torch
        except ImportError:
            pass
        else:
            torch.set_num_threads(threads)
    if keras.backend.backend() != "tensorflow":
        return
    if threads is not None:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    # The benchmarks build fresh tf.functions per case on purpose; TF's
    # retracing warnings about functions created in a loop would only be
    # noise here.
    tf.get_logger().setLevel("ERROR")


def round_order(names, index, mode):
    """The order in which round `index` runs `names`.

    `"rotate"` shifts the order by one each round, so no peer always runs
    right after the same one; `"reverse"` runs every other round backwards,
    so a shared machine's slow spells and first-run effects spread evenly.
    """
    names = list(names)
    if mode == "rotate":
        shift = index % len(names)
        return names[shift:] + names[:shift]
    if mode == "reverse":
        return names if index % 2 == 0 else names[::-1]
    raise ValueError(
        f"`mode` must be 'rotate' or 'reverse'; received {mode!r}")


def text_table(headers, rows, widths=None, header_justify="right"):
    """A plain-text table as one string: the header, a rule, then the rows.

    Args:
        headers: the column titles.
        rows: lists of cells (`str()` is applied), one per column.
        widths: the column widths; default the widest cell of each column.
        header_justify: `"right"` or `"left"`; cells are always
            right-justified.
    """
    widths = widths or [max(len(str(h)), *(len(str(row[i])) for row in rows))
                        for i, h in enumerate(headers)]
    justify = str.rjust if header_justify == "right" else str.ljust
    lines = ["  ".join(justify(str(h), w) for h, w in zip(headers, widths))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(str(c).rjust(w) for c, w in zip(row, widths)))
    return "\n".join(lines)


# -------------------------------------------------- hand-written attention
PROJECTIONS = ("query", "key", "value", "output")


def dot_product_attention(q, k, v, scale, causal=False):
    """`keras.ops.dot_product_attention`, the fused op (its own causal
    mode with `causal`)."""
    return keras.ops.dot_product_attention(q, k, v, scale=scale,
                                           is_causal=causal)


class HandProjectedAttention(keras.layers.Layer):
    """Self-attention: Q/K/V/O einsums around `attend(q, k, v, scale)`.

    Kernel shapes and weight names match `ScaledDotProductAttention` and
    `MultiHeadAttention`: `(D, H, key_dim)` for Q, K and V and
    `(H, key_dim, D)` for the output; biases `(H, key_dim)` and `(D,)`.
    The scale is `1 / sqrt(key_dim)`; `attend` returns `(B, T, H, key_dim)`
    (default: `keras.ops.dot_product_attention`).
    """

    def __init__(self, num_heads, key_dim, use_bias=False,
                 attend=dot_product_attention, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.use_bias = use_bias
        self.attend = attend

    def build(self, input_shape):
        width, heads, key_dim = input_shape[-1], self.num_heads, self.key_dim
        for name in PROJECTIONS:
            output = name == "output"
            kernel = ((heads, key_dim, width) if output
                      else (width, heads, key_dim))
            setattr(self, f"{name}_kernel",
                    self.add_weight(name=f"{name}_kernel", shape=kernel))
            if self.use_bias:
                bias = (width,) if output else (heads, key_dim)
                setattr(self, f"{name}_bias", self.add_weight(
                    name=f"{name}_bias", shape=bias, initializer="zeros"))

    def call(self, inputs, use_causal_mask=False):
        ops = keras.ops
        q = ops.einsum("btd,dhk->bthk", inputs, self.query_kernel)
        k = ops.einsum("bsd,dhk->bshk", inputs, self.key_kernel)
        v = ops.einsum("bsd,dhk->bshk", inputs, self.value_kernel)
        if self.use_bias:
            q = q + self.query_bias
            k = k + self.key_bias
            v = v + self.value_bias
        attended = self.attend(q, k, v, 1.0 / self.key_dim**0.5,
                               **({"causal": True} if use_causal_mask
                                  else {}))
        output = ops.einsum("bthk,hko->bto", attended, self.output_kernel)
        if self.use_bias:
            output = output + self.output_bias
        return output


class TorchAttention:
    """The same self-attention in PyTorch: Q/K/V/O matmuls around
    `torch.nn.functional.scaled_dot_product_attention` (scale 1/sqrt(d_k)).

    `weights` are numpy arrays in `weights_in_order`'s order and shapes.
    Calling the peer on an array returns its output as numpy; `step(_)`
    is one training step on the input given at construction (loss =
    sum(output), gradients w.r.t. every weight and the input), returning a
    float that depends on every gradient.
    """

    def __init__(self, weights, num_heads, key_dim, use_bias, inputs):
        import torch

        self.torch = torch
        self.heads, self.key_dim, self.use_bias = num_heads, key_dim, use_bias
        self.params = [torch.tensor(w, requires_grad=True) for w in weights]
        self.inputs = torch.tensor(np.asarray(inputs), requires_grad=True)

    def forward(self, x):
        functional = self.torch.nn.functional
        batch, length, width = x.shape
        per = 2 if self.use_bias else 1
        kernels = self.params[::per]
        biases = self.params[1::per] if self.use_bias else [None] * 4
        flat = x.reshape(batch * length, width)
        heads = []
        for kernel, bias in zip(kernels[:3], biases[:3]):
            h = flat @ kernel.reshape(width, -1)
            if bias is not None:
                h = h + bias.reshape(-1)
            heads.append(h.reshape(batch, length, self.heads, self.key_dim)
                         .transpose(1, 2))
        attended = functional.scaled_dot_product_attention(*heads)
        attended = attended.transpose(1, 2).reshape(batch * length, -1)
        output = attended @ kernels[3].reshape(-1, width)
        if biases[3] is not None:
            output = output + biases[3]
        return output.reshape(batch, length, width)

    def __call__(self, x):
        with self.torch.no_grad():
            x = self.torch.tensor(np.asarray(x))
            return self.forward(x).numpy()

    def step(self, _):
        loss = self.forward(self.inputs).sum()
        gradients = self.torch.autograd.grad(loss, self.params + [self.inputs])
        return float(sum(g.sum() for g in gradients))


def jax_loss_and_gradients(layer, call, loss_of_output):
    """On JAX: `(gradients, values)`, `gradients(values, x)` giving `((loss,
    output), (d_values, d_x))` of `loss_of_output(call(layer, x))` (the first
    output of a tuple), the trainable variables set to `values`.

    Through `__call__` in a `StatelessScope`, not `stateless_call`: that one
    runs `call` directly, which skips the dtype policy's input cast and
    autocast, so a `mixed_bfloat16` layer would compute in float32.
    """
    variables = list(layer.trainable_variables)

    def loss(values, x):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            output = call(layer, x)
        if isinstance(output, (tuple, list)):  # (output, scores)
            output = output[0]
        return loss_of_output(output), output

    return (jax.value_and_grad(loss, argnums=(0, 1), has_aux=True),
            [variable.value for variable in variables])


def weights_in_order(layer, use_bias):
    """A built peer's weights in the order Q, K, V, O (kernel, then bias when
    `use_bias`): of a `MultiHeadAttention`, a `ScaledDotProductAttention` or
    a `HandProjectedAttention`."""
    weights = []
    for name in PROJECTIONS:
        if isinstance(layer, keras.layers.MultiHeadAttention):
            dense = getattr(layer, f"{name}_dense")
            pair = (dense.kernel, dense.bias if use_bias else None)
        else:
            pair = (getattr(layer, f"{name}_kernel"),
                    getattr(layer, f"{name}_bias") if use_bias else None)
        weights.extend(weight for weight in pair if weight is not None)
    return weights


# ------------------------------------------------------------------ FLOPs
def model_flops_per_token(config, task):
    """Matmul FLOPs of one training token (forward + backward = 3 x forward).

    Projections, Q K^T, A V, output projection, feed-forward and classifier;
    embeddings, norms and softmax are left out.

    Args:
        config: a resolved `TrainConfig`.
        task: its `SequenceTask`.

    Returns:
        FLOPs per token position (a float).
    """
    d_model, heads, key_dim = config.d_model, config.num_heads, config.key_dim
    value_dim = config.value_dim or key_dim
    ff_dim = 4 * d_model if config.ff_dim is None else config.ff_dim
    seq_len = task.seq_len
    per_layer = (
        2 * d_model * heads * key_dim * 2      # W_Q, W_K
        + 2 * d_model * heads * value_dim      # W_V
        + 2 * seq_len * heads * key_dim        # q . k against every key
        + 2 * seq_len * heads * value_dim      # weights @ V
        + 2 * heads * value_dim * d_model      # W_O
        + 2 * d_model * ff_dim * 2             # feed-forward in and out
    )
    forward = config.num_layers * per_layer + 2 * d_model * task.num_classes
    return 3.0 * forward


def measure_matmul_flops(size=2048, dtype="float32", seconds=2.0):
    """FLOP/s of an `size x size` matmul on the default device.

    Chains several matmuls per call so the timing is not dominated by
    dispatch; returns the best of the samples taken in `seconds`.
    """
    rng = np.random.default_rng(12)
    a = keras.ops.convert_to_tensor(
        rng.standard_normal((size, size)).astype(dtype))
    # Scaled so that chained products keep a finite magnitude.
    b = keras.ops.convert_to_tensor(
        (rng.standard_normal((size, size)) / size ** 0.5).astype(dtype))
    chain = 4

    def run(x):
        # Eager ops on the running backend: at this size the dispatch of
        # four ops is far below the matmuls' time.
        for _ in range(chain):
            x = keras.ops.matmul(x, b)
        # float32 first: numpy has no bfloat16 for the sync's one value.
        corner = keras.ops.cast(x[0, 0], "float32")
        return float(keras.ops.convert_to_numpy(corner))

    float(run(a))  # Trace and warm up.
    flops_per_call = 2.0 * size ** 3 * chain
    best = 0.0
    deadline = time.perf_counter() + seconds
    while True:
        start = time.perf_counter()
        float(run(a))
        elapsed = time.perf_counter() - start
        best = max(best, flops_per_call / elapsed)
        if time.perf_counter() > deadline:
            return best
