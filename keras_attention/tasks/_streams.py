"""Random streams and shard layout shared by every task, in numpy only.

A batch is drawn from a `numpy.random.Generator` keyed on `(seed, stream
tag, counter)`; this module holds the tags, the generator construction, the
per-epoch permutation of a finite training pool and the rows of a global
batch that one shard (one input pipeline, one process) owns.
"""

import numpy as np

from keras_attention.validation import check_int
from keras_attention.validation import is_int

# Stream tags: each tag keys an independent family of random draws, so the
# training stream, the held-out set, the finite training pool and the
# pool's per-epoch shuffles never reuse each other's randomness for the
# same seed.
TRAIN_TAG = 0
HELDOUT_TAG = 1
POOL_TAG = 2
POOL_SHUFFLE_TAG = 3

# Seeds and steps are int64-sized, the range trainers and checkpoints hold.
SEED_LIMIT = 2**63
STEP_LIMIT = 2**63
# A Philox counter is 256 bits; the stream counter sits in its top 128.
_COUNTER_LIMIT = 2**128


def check_seed(seed):
    """Returns `seed` as an int in `[0, 2**63)`, or raises `ValueError`."""
    if not is_int(seed) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(
            f"`seed` must be an integer in [0, 2**63); received {seed!r}."
        )
    return int(seed)


def check_step(step, name="step"):
    """Returns `step` as an int in `[0, 2**63)`, or raises `ValueError`."""
    step = check_int(
        step, name, minimum=0, expected="a non-negative integer"
    )
    if step >= STEP_LIMIT:
        raise ValueError(f"`{name}` must be below 2**63; received {step}.")
    return step


def generator(seed, tag, counter):
    """The random generator of draw `counter` in stream `tag` of `seed`.

    Philox is a counter-based generator: its output is a fixed function (a
    block cipher made of 64-bit integer multiplies and xors) of a 128-bit
    key and a 256-bit counter, so the state is built directly from
    `(seed, tag, counter)` with no hashing and no hidden state. The key is
    `(seed, tag)`: a different tag is a different cipher, hence an
    independent stream. The counter goes in the top 128 bits and a draw
    advances the low ones, so the draws for `counter` and `counter + 1`
    are 2**128 blocks apart and never overlap.

    It is platform-stable because the tasks draw only integers
    (`Generator.integers`, `permutation`, `permuted`), computed from those
    bits with integer arithmetic: no floating-point rounding that could
    differ between CPUs, and no accelerator or Keras backend is involved.
    numpy's policy (NEP 19) keeps such a stream identical on every machine
    for one numpy version; a numpy release may change a `Generator`
    method's algorithm, and with it the exact data.

    Args:
        seed: int in `[0, 2**63)` (checked by `check_seed`).
        tag: one of the stream tags.
        counter: non-negative int below 2**128 (a step, an epoch, 0).

    Returns:
        A fresh `numpy.random.Generator`.
    """
    if not 0 <= counter < _COUNTER_LIMIT:
        raise ValueError(
            f"Stream counter must be in [0, 2**128); received {counter}."
        )
    bits = np.random.Philox(key=seed | (tag << 64), counter=counter << 128)
    return np.random.Generator(bits)


def epoch_permutation(seed, epoch, train_size):
    """The order, for one epoch, of a finite pool of `train_size` examples:
    a uniformly random permutation of `range(train_size)` (int64), a pure
    function of `(seed, epoch)`."""
    return generator(seed, POOL_SHUFFLE_TAG, epoch).permutation(train_size)


def pool_indices(seed, step, batch_size, train_size, rows, permutations):
    """Pool entries of rows `rows.start .. rows.stop - 1` of the pooled
    global batch of `step`.

    The stream is the pool in a fresh seeded order every epoch, epochs laid
    end to end: example `e = step * batch_size + row` is entry
    `e % train_size` of the permutation of epoch `e // train_size`. Any step
    is computed directly, without replaying the earlier ones.

    Args:
        seed, step, batch_size, train_size: checked ints.
        rows: a `range` of row numbers in the global batch.
        permutations: a dict `epoch -> permutation` reused between calls
            (the permutation of an epoch is drawn once); entries of epochs
            before this batch are dropped, as a stream never goes back.

    Returns:
        int64 indices into the pool, one per row.
    """
    # Python ints: `step * batch_size` may exceed int64.
    first_epoch, offset = divmod(step * batch_size + rows.start, train_size)
    epoch_offset, position = np.divmod(
        offset + np.arange(len(rows), dtype=np.int64), train_size
    )
    for epoch in [e for e in permutations if e < first_epoch]:
        del permutations[epoch]
    index = np.empty_like(position)
    # One vectorised pass per epoch the rows span (at most
    # len(rows) // train_size + 2; many only for a pool smaller than the
    # batch, whose permutations are then tiny).
    for k in range(int(epoch_offset[-1]) + 1):
        epoch = first_epoch + k
        if epoch not in permutations:
            permutations[epoch] = epoch_permutation(seed, epoch, train_size)
        in_epoch = epoch_offset == k
        index[in_epoch] = permutations[epoch][position[in_epoch]]
    return index


def shard_rows(batch_size, shard_index, num_shards):
    """The rows of the global batch that shard `shard_index` owns.

    Shard `i` of `num_shards` owns rows `[i * n, (i + 1) * n)`,
    `n = batch_size // num_shards`, so concatenating the shards of a step in
    order gives the global batch, whatever the number of shards.

    Returns:
        A `range` of row numbers.

    Raises:
        ValueError: for a bad `num_shards` or `shard_index`, or a
            `batch_size` that `num_shards` does not divide.
    """
    num_shards = check_int(num_shards, "num_shards")
    shard_index = check_int(
        shard_index,
        "shard_index",
        minimum=0,
        expected=f"an integer in [0, num_shards = {num_shards})",
    )
    if shard_index >= num_shards:
        raise ValueError(
            f"`shard_index` must be an integer in [0, num_shards = "
            f"{num_shards}); received {shard_index}."
        )
    if batch_size % num_shards:
        raise ValueError(
            f"`batch_size` (the global batch) must be divisible by "
            f"num_shards ({num_shards}); received {batch_size}."
        )
    rows = batch_size // num_shards
    return range(shard_index * rows, (shard_index + 1) * rows)
