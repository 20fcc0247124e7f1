"""Random streams and input-pipeline layout shared by every task.

A batch is drawn with stateless random ops keyed on `(seed, stream tag,
counter)`; this module holds the tags, the key construction and the split
of a global batch over the input pipelines of a `tf.distribute` strategy.
"""

import tensorflow as tf

from keras_attention.validation import check_int
from keras_attention.validation import is_int

# Stream tags: each tag keys an independent family of random draws, so the
# training stream, the held-out set and the finite training pool never
# reuse each other's randomness for the same seed.
TRAIN_TAG = 0
HELDOUT_TAG = 1
POOL_TAG = 2
POOL_SHUFFLE_TAG = 3

# Philox is implemented identically on every device, so a batch does not
# depend on whether it is generated on CPU (tf.data) or on an accelerator.
RNG_ALG = "philox"


def check_seed(seed):
    """Accepts a Python/numpy integer seed in int64 range, or a tensor."""
    if tf.is_tensor(seed):
        return seed
    if not is_int(seed):
        raise ValueError(
            f"`seed` must be an integer; received {seed!r} of type "
            f"{type(seed).__name__}."
        )
    seed = int(seed)
    if not -(2**63) <= seed < 2**63:
        raise ValueError(f"`seed` must fit in int64; received {seed}.")
    return seed


def check_step(step):
    """Accepts a non-negative integer step, or a tensor."""
    if tf.is_tensor(step):
        return step
    return check_int(
        step, "step", minimum=0, expected="a non-negative integer"
    )


def stream_keys(seed, tag, counter):
    """Stateless RNG keys for `counter` (scalar or vector) in stream `tag`.

    The `(seed, tag)` pair is hashed into one int64 and paired with the
    counter, the same construction as `tf.random.experimental.stateless_fold_in`
    but vectorised over `counter`. Returns int64 of shape
    `counter.shape + (2,)`.
    """
    root = tf.stack(
        [tf.cast(seed, tf.int64), tf.constant(tag, dtype=tf.int64)]
    )
    stream = tf.random.stateless_uniform(
        [], seed=root, minval=None, maxval=None, dtype=tf.int64, alg=RNG_ALG
    )
    counter = tf.cast(counter, tf.int64)
    return tf.stack(
        [tf.broadcast_to(stream, tf.shape(counter)), counter], axis=-1
    )


def split_key(key, num):
    """Splits one key into `num` independent keys (for separate draws)."""
    return tf.unstack(
        tf.random.experimental.stateless_split(key, num=num, alg=RNG_ALG),
        num=num,
    )


def uniform_ints(key, shape, low, high):
    """Uniform int32 in `[low, high)`."""
    return tf.random.stateless_uniform(
        shape, seed=key, minval=low, maxval=high, dtype=tf.int32, alg=RNG_ALG
    )


def input_pipeline_layout(batch_size, input_context):
    """Rows of the global batch owned by one input pipeline.

    Returns `(row_start, row_stop, per_replica_batch, replicas_per_pipeline)`.
    """
    if input_context is None:
        return 0, batch_size, batch_size, 1
    num_pipelines = input_context.num_input_pipelines
    num_replicas = input_context.num_replicas_in_sync
    if batch_size % num_replicas:
        raise ValueError(
            f"`batch_size` (the global batch) must be divisible by the number "
            f"of replicas in sync ({num_replicas}); received {batch_size}."
        )
    if batch_size % num_pipelines:
        raise ValueError(
            f"`batch_size` (the global batch) must be divisible by the number "
            f"of input pipelines ({num_pipelines}); received {batch_size}."
        )
    per_replica = input_context.get_per_replica_batch_size(batch_size)
    pipeline_rows = batch_size // num_pipelines
    if pipeline_rows % per_replica:
        raise ValueError(
            "`input_context` must have num_replicas_in_sync "
            f"({num_replicas}) divisible by num_input_pipelines "
            f"({num_pipelines}) so that every pipeline feeds whole replicas."
        )
    row_start = input_context.input_pipeline_id * pipeline_rows
    return (
        row_start,
        row_start + pipeline_rows,
        per_replica,
        pipeline_rows // per_replica,
    )


def shard_global_batches(dataset, batch_size, input_context):
    """Turns a dataset of global batches into this pipeline's replica batches.

    Pipeline `i` keeps rows `[i * n, (i + 1) * n)` of every global batch,
    `n = batch_size // num_input_pipelines`, and yields them as consecutive
    per-replica batches, which is the order in which
    `distribute_datasets_from_function` hands elements to the replicas it
    feeds. Every replica therefore sees the same rows whatever the strategy.
    """
    start, stop, per_replica, chunks = input_pipeline_layout(
        batch_size, input_context
    )
    if input_context is None:
        return dataset

    def take_rows(*tensors):
        return tuple(
            tf.reshape(
                tensor[start:stop], [chunks, per_replica] + tensor.shape[1:]
            )
            for tensor in tensors
        )

    return dataset.map(take_rows).unbatch()
