"""The variance of q.k against theory: why scores are scaled by 1/sqrt(d_k).

    keras-attention variance --key-dims 16,64,256,1024 --samples 100000

If the components of q and k are independent with mean 0 and variance 1,
each product q_i k_i has mean 0 and variance 1, so their sum q.k over d_k
components has variance d_k: unscaled scores spread like sqrt(d_k).
Dividing by sqrt(d_k) brings the variance back to 1 whatever d_k is.

This command draws `--samples` independent unit-normal pairs (q, k) for each
d_k, computes the scores with the library's own score function
(`keras_attention.ops.attention_scores`, scale 1 and 1/sqrt(d_k)) and prints
the empirical variances beside the theoretical ones, with the standard error
of a variance estimated from that many samples.
"""

import math
import os

import numpy as np

from keras_attention.ops import attention_scores
from keras_attention.ops import resolve_scale
from pipelines.common import UsageError
from pipelines.common import markdown_table
from pipelines.common import parse_int_list
from pipelines.common import write_json_atomic

DEFAULT_KEY_DIMS = (16, 64, 256, 1024)
DEFAULT_SAMPLES = 100_000

# Pairs per call of the score function; bounds memory at large d_k.
_CHUNK_ELEMENTS = 1 << 22


def variance_standard_error(key_dim, num_samples):
    """The standard error of the sample variance of q.k over `num_samples`
    pairs, relative to d_k (scaled or not): `sqrt((2 + 6 / d_k) / n)`.

    q.k is a sum of d_k independent products of variance 1 and fourth
    moment 9, so its fourth central moment is `3 d_k^2 + 6 d_k` and the
    sample variance of n draws has variance `(2 d_k^2 + 6 d_k) / n` (to
    first order in 1/n).
    """
    return math.sqrt((2.0 + 6.0 / key_dim) / num_samples)


def sample_scores(key_dim, num_samples, seed=0):
    """`q.k` and `q.k / sqrt(d_k)` (float64, `(num_samples,)`) of random
    unit-normal pairs, computed by `keras_attention.ops.attention_scores`.
    """
    rng = np.random.default_rng([seed, key_dim])
    scale = resolve_scale("sqrt", key_dim)
    chunk = max(1, _CHUNK_ELEMENTS // key_dim)
    unscaled, scaled = [], []
    for start in range(0, num_samples, chunk):
        size = min(chunk, num_samples - start)
        # One query and one key per example, laid out (B, T=1, H=1, d_k).
        query = rng.standard_normal((size, 1, 1, key_dim)).astype(np.float32)
        key = rng.standard_normal((size, 1, 1, key_dim)).astype(np.float32)
        for scores, factor in ((unscaled, 1.0), (scaled, scale)):
            values = np.asarray(attention_scores(query, key, factor))
            scores.append(values.reshape(-1).astype(np.float64))
    return np.concatenate(unscaled), np.concatenate(scaled)


def variance_table(key_dims=DEFAULT_KEY_DIMS, num_samples=DEFAULT_SAMPLES,
                   seed=0):
    """Empirical and theoretical Var(q.k), unscaled and scaled, per d_k.

    Args:
        num_samples: random (q, k) pairs per d_k (at least 2).

    Returns:
        One dict per d_k: `key_dim`, `samples`, `var_unscaled`,
        `theory_unscaled` (= d_k), `var_scaled`, `theory_scaled` (= 1),
        `std_unscaled`, `std_scaled`, `relative_standard_error`.

    Example:

    >>> rows = variance_table([64], num_samples=10000)
    >>> round(rows[0]["var_scaled"], 1)
    1.0
    """
    key_dims = _check_key_dims(key_dims)
    if (isinstance(num_samples, bool) or not isinstance(num_samples, int)
            or num_samples < 2):
        raise ValueError(
            "`num_samples` must be an integer >= 2; received "
            f"{num_samples!r}.")
    rows = []
    for key_dim in key_dims:
        unscaled, scaled = sample_scores(key_dim, num_samples, seed)
        rows.append({
            "key_dim": key_dim, "samples": num_samples,
            "var_unscaled": float(np.var(unscaled, ddof=1)),
            "theory_unscaled": float(key_dim),
            "var_scaled": float(np.var(scaled, ddof=1)),
            "theory_scaled": 1.0,
            "std_unscaled": float(np.std(unscaled, ddof=1)),
            "std_scaled": float(np.std(scaled, ddof=1)),
            "relative_standard_error": variance_standard_error(
                key_dim, num_samples)})
    return rows


def variance_markdown(rows):
    """The rows of `variance_table` as a Markdown table (a list of lines)."""
    return markdown_table(
        ["d_k", "Var(q·k) measured", "theory (d_k)", "Var(q·k/√d_k) measured",
         "theory", "std q·k", "√d_k", "rel. std. error"],
        [[str(row["key_dim"]), f"{row['var_unscaled']:.2f}",
          f"{row['theory_unscaled']:.0f}", f"{row['var_scaled']:.4f}",
          f"{row['theory_scaled']:.0f}", f"{row['std_unscaled']:.2f}",
          f"{math.sqrt(row['key_dim']):.2f}",
          f"{row['relative_standard_error']:.2%}"] for row in rows])


def _check_key_dims(key_dims):
    key_dims = list(key_dims)
    if not key_dims or any(isinstance(d, bool) or not isinstance(d, int)
                           or d < 1 for d in key_dims):
        raise ValueError(
            f"`key_dims` must be a non-empty list of positive integers; "
            f"received {key_dims!r}.")
    return key_dims


# ---------------------------------------------------------- command line
def add_arguments(parser):
    """Adds the `variance` flags to an `argparse` parser."""
    parser.add_argument("--key-dims", metavar="D1,D2,...",
                        default=",".join(str(d) for d in DEFAULT_KEY_DIMS),
                        help="values of d_k (default: %(default)s)")
    parser.add_argument("--samples", default=str(DEFAULT_SAMPLES),
                        metavar="N", help="random (q, k) pairs per d_k "
                        "(default: %(default)s)")
    parser.add_argument("--seed", default="0", metavar="S",
                        help="seed of the draws (default: 0)")
    parser.add_argument("--output", metavar="FILE",
                        help="also write the rows as JSON to FILE")
    return parser


def _check_output(path):
    """`UsageError` unless `path` names a file that can be written."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"--output {path} is a directory; give a file path")
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(
            f"--output {path}: its folder {folder} does not exist or is not "
            "writable")


def run(args):
    """Runs `keras-attention variance`; prints the table."""
    key_dims = parse_int_list(args.key_dims, "--key-dims")
    try:
        samples = int(args.samples)
        seed = int(args.seed)
    except ValueError:
        raise UsageError(
            f"--samples and --seed must be integers; got {args.samples!r}, "
            f"{args.seed!r}") from None
    if samples < 2:
        raise UsageError(f"--samples must be at least 2; got {samples}")
    if seed < 0:
        raise UsageError(f"--seed must be non-negative; got {seed}")
    if args.output:
        _check_output(args.output)  # Now, not after the computation.
    rows = variance_table(key_dims, samples, seed)
    print("Var(q·k) for q, k with independent N(0, 1) components "
          f"({samples} pairs per d_k):")
    print("\n".join(variance_markdown(rows)))
    if args.output:
        write_json_atomic(args.output, {"rows": rows})
    return 0
