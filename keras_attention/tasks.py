"""Synthetic sequence tasks for attention experiments, as `tf.data` pipelines.

Every task produces batches `(tokens, targets, weights)`:

- `tokens`: int32 `(batch, seq_len)` input ids, `0` is padding.
- `targets`: int32 `(batch, seq_len)` class ids, one per position.
- `weights`: float32 `(batch, seq_len)`, `1.0` on positions that are scored
  and `0.0` everywhere else (padding, inputs that need no prediction).

A batch is a pure function of `(seed, step)`: it is drawn with stateless
random ops keyed on `(seed, stream tag, step)`, so any step's batch can be
regenerated and a resumed run continues the same stream. Held-out data comes
from a different stream tag and therefore never shares random draws with the
training stream.

Tasks (`TASK_NAMES`):

- `"recall"`: one-hop associative recall, the query must match a key by
  content. See `RecallTask`.
- `"reverse"`: predict the input sequence reversed. See `ReverseTask`.
- `"sort"`: predict the input tokens in ascending order. See `SortTask`.
- `"copy"`: read a sequence, then write it out again after a delimiter.
  See `CopyTask`.

Example:

```python
task = make_task("recall", num_pairs=16, num_keys=64, num_values=16)
train = task.dataset(batch_size=64, seed=0)
tokens, targets, weights = task.batch(seed=0, step=0, batch_size=64)
eval_tokens, eval_targets, eval_weights = task.heldout(num_examples=512)
```
"""

import inspect
import numbers

import numpy as np
import tensorflow as tf

TASK_NAMES = ("recall", "reverse", "sort", "copy")

# Stream tags: each tag keys an independent family of random draws, so the
# training stream, the held-out set and the finite training pool never
# reuse each other's randomness for the same seed.
_TRAIN_TAG = 0
_HELDOUT_TAG = 1
_POOL_TAG = 2
_POOL_SHUFFLE_TAG = 3

# Philox is implemented identically on every device, so a batch does not
# depend on whether it is generated on CPU (tf.data) or on an accelerator.
_RNG_ALG = "philox"


def _check_int(name, value, minimum, expected=None):
    """Returns `value` as a Python int, or raises `ValueError` naming `name`.

    `expected` describes the valid values in the message; by default
    "an integer >= minimum".
    """
    expected = expected or f"an integer >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(
            f"`{name}` must be {expected}; got {value!r} of type "
            f"{type(value).__name__}."
        )
    value = int(value)
    if value < minimum:
        raise ValueError(f"`{name}` must be {expected}; got {value}.")
    return value


def _check_seed(seed):
    """Accepts a Python/numpy integer seed in int64 range, or a tensor."""
    if tf.is_tensor(seed):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(
            f"`seed` must be an integer; got {seed!r} of type "
            f"{type(seed).__name__}."
        )
    seed = int(seed)
    if not -(2**63) <= seed < 2**63:
        raise ValueError(f"`seed` must fit in int64; got {seed}.")
    return seed


def _check_step(name, step):
    if tf.is_tensor(step):
        return step
    return _check_int(name, step, 0, expected="a non-negative integer")


def _stream_keys(seed, tag, counter):
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
        [], seed=root, minval=None, maxval=None, dtype=tf.int64, alg=_RNG_ALG
    )
    counter = tf.cast(counter, tf.int64)
    return tf.stack(
        [tf.broadcast_to(stream, tf.shape(counter)), counter], axis=-1
    )


def _split_key(key, num):
    """Splits one key into `num` independent keys (for separate draws)."""
    return tf.unstack(
        tf.random.experimental.stateless_split(key, num=num, alg=_RNG_ALG),
        num=num,
    )


def _uniform_ints(key, shape, low, high):
    """Uniform int32 in `[low, high)`."""
    return tf.random.stateless_uniform(
        shape, seed=key, minval=low, maxval=high, dtype=tf.int32, alg=_RNG_ALG
    )


def _check_min_len(min_len, max_len, max_name):
    """None (fixed length) or an int in `[1, max_len]`."""
    if min_len is None:
        return None
    if (
        isinstance(min_len, bool)
        or not isinstance(min_len, numbers.Integral)
        or not 1 <= min_len <= max_len
    ):
        raise ValueError(
            f"`min_len` must be an integer between 1 and {max_name} = "
            f"{max_len}, or None for fixed length; got {min_len!r}."
        )
    return int(min_len)


def _input_pipeline_layout(batch_size, input_context):
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
            f"of replicas in sync ({num_replicas}); got {batch_size}."
        )
    if batch_size % num_pipelines:
        raise ValueError(
            f"`batch_size` (the global batch) must be divisible by the number "
            f"of input pipelines ({num_pipelines}); got {batch_size}."
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


def _shard_global_batches(dataset, batch_size, input_context):
    """Turns a dataset of global batches into this pipeline's replica batches.

    Pipeline `i` keeps rows `[i * n, (i + 1) * n)` of every global batch,
    `n = batch_size // num_input_pipelines`, and yields them as consecutive
    per-replica batches, which is the order in which
    `distribute_datasets_from_function` hands elements to the replicas it
    feeds. Every replica therefore sees the same rows whatever the strategy.
    """
    start, stop, per_replica, chunks = _input_pipeline_layout(
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


class SequenceTask:
    """Base class of the synthetic sequence tasks.

    Subclasses set the attributes below and implement `_generate`.

    Attributes:
        name: Task name, one of `TASK_NAMES`.
        vocab_size: Number of input token ids (embedding input dimension);
            ids are in `[0, vocab_size)`.
        num_classes: Number of target classes (output layer width).
        seq_len: Static sequence length of every batch.
        token_factors: For tasks whose ids (minus the padding id) are a mixed
            radix number, the radices from most to least significant digit, so
            that an embedding can be a sum of per-factor embeddings; else None.
        pad_id: Input id used for padding (always 0).
    """

    name = None
    pad_id = 0
    token_factors = None

    def __init__(self, **options):
        self._options = dict(options)

    def get_config(self):
        """Returns a dict with `name` and the options; `make_task(**config)`
        rebuilds an identical task."""
        return {"name": self.name, **self._options}

    def __repr__(self):
        options = ", ".join(f"{k}={v!r}" for k, v in self._options.items())
        return f"{type(self).__name__}({options})"

    def _generate(self, key, batch_size):
        """Draws `(tokens, targets, weights)` for `batch_size` examples from
        the stateless RNG key `key` (int64 shape `(2,)`)."""
        raise NotImplementedError

    def _finish(self, tokens, targets, weights, batch_size):
        """Fixes dtypes and static shapes of a generated batch."""
        shape = [batch_size, self.seq_len]
        tokens = tf.ensure_shape(tf.cast(tokens, tf.int32), shape)
        targets = tf.ensure_shape(tf.cast(targets, tf.int32), shape)
        weights = tf.ensure_shape(tf.cast(weights, tf.float32), shape)
        return tokens, targets, weights

    def batch(self, seed, step, batch_size):
        """Returns the training batch for `(seed, step)`.

        Args:
            seed: Integer run seed (or scalar integer tensor).
            step: Non-negative integer step (or scalar integer tensor).
            batch_size: Positive integer number of examples (global batch).

        Returns:
            Tuple of tensors `(tokens, targets, weights)`, shapes
            `(batch_size, seq_len)`, dtypes int32, int32, float32. The same
            arguments always give the same batch.

        Example:

        >>> task = make_task("reverse", seq_len=4, vocab_size=8)
        >>> tokens, targets, weights = task.batch(seed=1, step=0, batch_size=2)
        >>> tokens.shape
        TensorShape([2, 4])
        """
        batch_size = _check_int("batch_size", batch_size, 1)
        seed = _check_seed(seed)
        step = _check_step("step", step)
        return self._generate(
            _stream_keys(seed, _TRAIN_TAG, step), batch_size
        )

    def _pool_batch_fn(self, seed, batch_size, train_size):
        """Batch function over a fixed pool of `train_size` examples.

        The stream is the pool in a fresh seeded order every epoch, epochs
        laid end to end: example `e = step * batch_size + row` is entry
        `e % train_size` of the permutation for epoch `e // train_size`.
        Computed statelessly, so any step can be regenerated.
        """
        pool = self._generate(_stream_keys(seed, _POOL_TAG, 0), train_size)
        # A batch spans at most this many epochs (a static bound).
        max_epochs_per_batch = (batch_size - 1) // train_size + 2
        rows = tf.range(batch_size, dtype=tf.int64)

        def pool_batch(step):
            example = tf.cast(step, tf.int64) * batch_size + rows
            epoch = example // train_size
            position = example % train_size
            first_epoch = tf.reduce_min(epoch)
            index = tf.zeros_like(position)
            for offset in range(max_epochs_per_batch):
                this_epoch = first_epoch + offset
                shuffled = tf.random.experimental.index_shuffle(
                    position,
                    _stream_keys(seed, _POOL_SHUFFLE_TAG, this_epoch),
                    tf.constant(train_size - 1, tf.int64),
                )
                index = tf.where(epoch == this_epoch, shuffled, index)
            return tuple(tf.gather(tensor, index) for tensor in pool)

        return pool_batch

    def dataset(
        self,
        batch_size,
        seed,
        start_step=0,
        input_context=None,
        train_size=None,
    ):
        """Infinite training stream of `(tokens, targets, weights)` batches.

        Element `k` of the stream (without `input_context`) is
        `batch(seed, start_step + k, batch_size)`.

        Args:
            batch_size: Positive integer, the GLOBAL batch size.
            seed: Integer run seed.
            start_step: Non-negative integer, first step of the stream (to
                resume a run where it stopped).
            input_context: Optional `tf.distribute.InputContext` (as passed by
                `strategy.distribute_datasets_from_function`). Pipeline `i`
                yields rows `[i * n, (i + 1) * n)` of each global batch,
                `n = batch_size // num_input_pipelines`, as consecutive batches
                of `input_context.get_per_replica_batch_size(batch_size)`
                rows, so the data is the same whatever the strategy.
            train_size: None (default) draws fresh examples at every step.
                A positive integer instead trains on a fixed pool of that many
                examples, reshuffled (seeded) every epoch and repeated.

        Returns:
            An infinite `tf.data.Dataset` with static shapes, prefetched.

        Example:

        >>> task = make_task("sort", seq_len=6, vocab_size=10)
        >>> ds = task.dataset(batch_size=4, seed=0, start_step=10)
        >>> tokens, targets, weights = next(iter(ds))
        """
        batch_size = _check_int("batch_size", batch_size, 1)
        seed = _check_seed(seed)
        start_step = _check_int(
            "start_step", start_step, 0, expected="a non-negative integer"
        )
        # Validate the sharding before building anything.
        _input_pipeline_layout(batch_size, input_context)

        if train_size is None:
            def global_batch(step):
                return self._generate(
                    _stream_keys(seed, _TRAIN_TAG, step), batch_size
                )
        else:
            train_size = _check_int(
                "train_size",
                train_size,
                1,
                expected="a positive integer, or None for fresh samples",
            )
            global_batch = self._pool_batch_fn(seed, batch_size, train_size)

        steps = tf.data.Dataset.counter(start=start_step, dtype=tf.int64)
        dataset = steps.map(
            global_batch,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        dataset = _shard_global_batches(dataset, batch_size, input_context)
        return dataset.prefetch(tf.data.AUTOTUNE)

    def heldout(self, num_examples=512, seed=0):
        """Fixed held-out examples, from a stream disjoint from training.

        Args:
            num_examples: Positive integer number of examples.
            seed: Integer seed; the held-out stream is keyed on a different
                tag than `batch`/`dataset`, so it never reuses their draws,
                even for the same seed.

        Returns:
            Tuple of numpy arrays `(tokens, targets, weights)`, shapes
            `(num_examples, seq_len)`, dtypes int32, int32, float32.
        """
        num_examples = _check_int("num_examples", num_examples, 1)
        seed = _check_seed(seed)
        tensors = self._generate(
            _stream_keys(seed, _HELDOUT_TAG, 0), num_examples
        )
        return tuple(np.asarray(tensor) for tensor in tensors)

    def heldout_dataset(
        self, batch_size, num_examples=512, seed=0, input_context=None
    ):
        """Finite dataset over `heldout(num_examples, seed)`.

        Args:
            batch_size: Positive integer global batch size, at most
                `num_examples`; a last partial batch is dropped.
            num_examples: Positive integer number of held-out examples.
            seed: Integer seed of the held-out set.
            input_context: Optional `tf.distribute.InputContext`, sharded as
                in `dataset`.

        Returns:
            A finite `tf.data.Dataset` of `(tokens, targets, weights)`.
        """
        batch_size = _check_int("batch_size", batch_size, 1)
        num_examples = _check_int("num_examples", num_examples, 1)
        if batch_size > num_examples:
            raise ValueError(
                f"`batch_size` must be at most num_examples ({num_examples}), "
                f"else the held-out dataset is empty; got {batch_size}."
            )
        _input_pipeline_layout(batch_size, input_context)
        arrays = self.heldout(num_examples=num_examples, seed=seed)
        dataset = tf.data.Dataset.from_tensor_slices(arrays).batch(
            batch_size, drop_remainder=True
        )
        dataset = _shard_global_batches(dataset, batch_size, input_context)
        return dataset.prefetch(tf.data.AUTOTUNE)

    def _lengths(self, key, batch_size, max_len):
        """Per-example content lengths: `max_len`, or uniform in
        `[min_len, max_len]` when the task has variable length."""
        if self.min_len is None:
            return tf.fill([batch_size], tf.constant(max_len, tf.int32))
        return _uniform_ints(key, [batch_size], self.min_len, max_len + 1)


class _PaddedSymbolsTask(SequenceTask):
    """Shared input of `ReverseTask` and `SortTask`: random content symbols
    `1 .. vocab_size - 1` on a prefix of length `l`, padding id 0 after."""

    first_symbol_id = 1

    def __init__(self, seq_len=16, vocab_size=16, min_len=None):
        super().__init__(
            seq_len=seq_len, vocab_size=vocab_size, min_len=min_len
        )
        self.seq_len = _check_int("seq_len", seq_len, 2)
        self.vocab_size = _check_int(
            "vocab_size",
            vocab_size,
            3,
            expected="an integer >= 3 (padding id 0 plus at least 2 content "
            "symbols)",
        )
        self.min_len = _check_min_len(min_len, self.seq_len, "seq_len")
        self.num_classes = self.vocab_size

    def _content(self, key, batch_size):
        """Random symbols on the first `length` positions, padding after."""
        symbol_key, length_key = _split_key(key, 2)
        symbols = _uniform_ints(
            symbol_key,
            [batch_size, self.seq_len],
            self.first_symbol_id,
            self.vocab_size,
        )
        lengths = self._lengths(length_key, batch_size, self.seq_len)
        valid = tf.range(self.seq_len)[None, :] < lengths[:, None]
        tokens = tf.where(valid, symbols, self.pad_id)
        return tokens, lengths, valid


class ReverseTask(_PaddedSymbolsTask):
    """Reverse a sequence of random symbols.

    Id layout: `0` padding, `1 .. vocab_size - 1` content symbols. Targets are
    token ids, `num_classes = vocab_size`.

    With length `l` (`seq_len`, or uniform in `[min_len, seq_len]`), tokens are
    `[x_1 .. x_l, 0 ... 0]` and targets `[x_l .. x_1, 0 ... 0]`, weight 1 on
    the first `l` positions and 0 on padding.

    Args:
        seq_len: Sequence length, at least 2.
        vocab_size: Total number of ids including padding, at least 3 (two
            content symbols).
        min_len: None for fixed length `seq_len`, else the shortest length of
            variable-length examples, in `[1, seq_len]`.

    Example:

    >>> task = ReverseTask(seq_len=8, vocab_size=10, min_len=3)
    >>> tokens, targets, weights = task.batch(seed=0, step=0, batch_size=16)
    """

    name = "reverse"

    def _generate(self, key, batch_size):
        tokens, lengths, valid = self._content(key, batch_size)
        # Reverses only the first `length` entries; padding stays in place.
        targets = tf.reverse_sequence(
            tokens, lengths, seq_axis=1, batch_axis=0
        )
        return self._finish(tokens, targets, valid, batch_size)


class SortTask(_PaddedSymbolsTask):
    """Sort a sequence of random symbols in ascending order.

    Id layout: `0` padding, `1 .. vocab_size - 1` content symbols, ordered by
    id. Targets are token ids, `num_classes = vocab_size`.

    With length `l`, tokens are `[x_1 .. x_l, 0 ... 0]` and targets are
    `sorted(x_1 .. x_l)` followed by zeros; weight 1 on the first `l`
    positions, 0 on padding.

    Args:
        seq_len: Sequence length, at least 2.
        vocab_size: Total number of ids including padding, at least 3.
        min_len: None for fixed length, else shortest length in `[1, seq_len]`.

    Example:

    >>> task = SortTask(seq_len=8, vocab_size=10)
    >>> tokens, targets, weights = task.batch(seed=0, step=0, batch_size=16)
    """

    name = "sort"

    def _generate(self, key, batch_size):
        tokens, _, valid = self._content(key, batch_size)
        # Padding is lifted above every symbol so it sorts to the end.
        sorted_tokens = tf.sort(
            tf.where(valid, tokens, self.vocab_size), axis=1
        )
        targets = tf.where(valid, sorted_tokens, 0)
        return self._finish(tokens, targets, valid, batch_size)


class CopyTask(SequenceTask):
    """Copy a sequence after a delimiter.

    Id layout: `0` padding, `1` delimiter, `2` blank, `3 .. vocab_size - 1`
    content symbols. Targets are token ids, `num_classes = vocab_size`.

    With content length `l` (`copy_len = (seq_len - 1) // 2`, or uniform in
    `[min_len, copy_len]`), tokens are
    `[x_1 .. x_l, DELIM, BLANK x l, 0 ...]` and the targets on the `l` blank
    positions are `x_1 .. x_l` (weight 1 only there). The blanks carry no
    information, so the model has to fetch each symbol by attending back to
    the first half of the sequence.

    Args:
        seq_len: Sequence length, at least 3 (`2 * copy_len + 1`).
        vocab_size: Total number of ids, at least 5 (three reserved ids plus
            at least 2 content symbols).
        min_len: None for fixed content length `copy_len`, else the shortest
            content length, in `[1, copy_len]`.

    Example:

    >>> task = CopyTask(seq_len=21, vocab_size=12)
    >>> task.copy_len
    10
    """

    name = "copy"
    delimiter_id = 1
    blank_id = 2
    first_symbol_id = 3

    def __init__(self, seq_len=21, vocab_size=16, min_len=None):
        super().__init__(
            seq_len=seq_len, vocab_size=vocab_size, min_len=min_len
        )
        self.seq_len = _check_int(
            "seq_len",
            seq_len,
            3,
            expected="an integer >= 3 (2 * copy_len + 1 with copy_len >= 1)",
        )
        self.vocab_size = _check_int(
            "vocab_size",
            vocab_size,
            5,
            expected="an integer >= 5 (padding, delimiter, blank plus at "
            "least 2 content symbols)",
        )
        self.copy_len = (self.seq_len - 1) // 2
        self.min_len = _check_min_len(
            min_len, self.copy_len, "copy_len = (seq_len - 1) // 2"
        )
        self.num_classes = self.vocab_size

    def _generate(self, key, batch_size):
        symbol_key, length_key = _split_key(key, 2)
        symbols = _uniform_ints(
            symbol_key,
            [batch_size, self.seq_len],
            self.first_symbol_id,
            self.vocab_size,
        )
        lengths = self._lengths(length_key, batch_size, self.copy_len)[:, None]
        positions = tf.range(self.seq_len)[None, :]
        is_content = positions < lengths
        is_answer = (positions > lengths) & (positions <= 2 * lengths)
        tokens = tf.where(
            is_content,
            symbols,
            tf.where(
                positions == lengths,
                self.delimiter_id,
                tf.where(is_answer, self.blank_id, self.pad_id),
            ),
        )
        # Answer position l + 1 + i holds symbol i.
        source = tf.clip_by_value(positions - lengths - 1, 0, self.seq_len - 1)
        copied = tf.gather(
            symbols, tf.broadcast_to(source, tf.shape(symbols)), batch_dims=1
        )
        targets = tf.where(is_answer, copied, 0)
        return self._finish(tokens, targets, is_answer, batch_size)


class RecallTask(SequenceTask):
    """One-hop associative recall: the query must match a key by content.

    Each example holds `num_pairs` (key, value) pairs, one per position, keys
    distinct and drawn from `num_keys`, values drawn (with repetition) from
    `num_values`; the last position holds a query key taken from the pairs.
    The target at the query position is the value paired with that key
    (weight 1 only there); chance accuracy is `1 / num_values`.

    Id layout: every position is one pair token,
    `id = 1 + key * (num_values + 1) + value_slot`, with
    `value_slot = value` on pair positions and `value_slot = num_values`
    ("no value") on the query position; `0` is padding (unused here). So
    `vocab_size = 1 + num_keys * (num_values + 1)` and
    `token_factors = (num_keys, num_values + 1)`: `id - 1` written in that
    mixed radix is `(key, value_slot)`, letting a model embed a token as
    key embedding + value embedding. Targets are values,
    `num_classes = num_values`; `seq_len = num_pairs + 1`.

    Args:
        num_pairs: Number of (key, value) pairs, at least 1.
        num_keys: Size of the key alphabet, at least `num_pairs`.
        num_values: Size of the value alphabet, at least 2.
        seq_len: Optional; if given it must equal `num_pairs + 1`.

    Example:

    >>> task = RecallTask(num_pairs=4, num_keys=8, num_values=4)
    >>> task.seq_len, task.vocab_size, task.token_factors
    (5, 41, (8, 5))
    """

    name = "recall"

    def __init__(self, num_pairs=16, num_keys=64, num_values=16, seq_len=None):
        super().__init__(
            num_pairs=num_pairs,
            num_keys=num_keys,
            num_values=num_values,
            seq_len=seq_len,
        )
        self.num_pairs = _check_int("num_pairs", num_pairs, 1)
        self.num_keys = _check_int(
            "num_keys",
            num_keys,
            self.num_pairs,
            expected=f"an integer >= num_pairs ({self.num_pairs}) so that "
            "keys are distinct",
        )
        self.num_values = _check_int("num_values", num_values, 2)
        if seq_len is not None and seq_len != self.num_pairs + 1:
            raise ValueError(
                f"`seq_len` for recall must be num_pairs + 1 = "
                f"{self.num_pairs + 1} (or None); got {seq_len!r}."
            )
        self.seq_len = self.num_pairs + 1
        self.vocab_size = 1 + self.num_keys * (self.num_values + 1)
        self.num_classes = self.num_values
        self.token_factors = (self.num_keys, self.num_values + 1)
        self.min_len = None

    def _generate(self, key, batch_size):
        key_key, value_key, query_key = _split_key(key, 3)
        # The indices of the top `num_pairs` of i.i.d. noise are a uniformly
        # random set of distinct keys in random order.
        noise = tf.random.stateless_uniform(
            [batch_size, self.num_keys], seed=key_key, alg=_RNG_ALG
        )
        keys = tf.math.top_k(noise, k=self.num_pairs, sorted=True).indices
        values = _uniform_ints(
            value_key, [batch_size, self.num_pairs], 0, self.num_values
        )
        query_index = _uniform_ints(query_key, [batch_size], 0, self.num_pairs)
        query = tf.gather(keys, query_index, batch_dims=1)
        answer = tf.gather(values, query_index, batch_dims=1)

        radix = self.num_values + 1
        pair_ids = 1 + keys * radix + values
        query_ids = 1 + query * radix + self.num_values
        tokens = tf.concat([pair_ids, query_ids[:, None]], axis=1)
        no_target = tf.zeros([batch_size, self.num_pairs], tf.int32)
        targets = tf.concat([no_target, answer[:, None]], axis=1)
        weights = tf.concat(
            [tf.zeros([batch_size, self.num_pairs]), tf.ones([batch_size, 1])],
            axis=1,
        )
        return self._finish(tokens, targets, weights, batch_size)


_TASKS = {
    "recall": RecallTask,
    "reverse": ReverseTask,
    "sort": SortTask,
    "copy": CopyTask,
}


def make_task(name, **options):
    """Builds a task by name.

    Args:
        name: One of `TASK_NAMES`.
        **options: Constructor options of that task (see `RecallTask`,
            `ReverseTask`, `SortTask`, `CopyTask`). An option the task does not
            take raises `ValueError`, except when its value is None (unset),
            so callers can pass one set of options for every task.

    Returns:
        A `SequenceTask`.

    Example:

    >>> task = make_task("copy", seq_len=11, vocab_size=8, min_len=2)
    >>> task.name, task.num_classes
    ('copy', 8)
    """
    if name not in _TASKS:
        raise ValueError(
            f"`name` must be one of {TASK_NAMES}; got {name!r}."
        )
    task_class = _TASKS[name]
    accepted = [
        parameter
        for parameter in inspect.signature(task_class.__init__).parameters
        if parameter != "self"
    ]
    unknown = sorted(
        option
        for option, value in options.items()
        if option not in accepted and value is not None
    )
    if unknown:
        raise ValueError(
            f"Unknown option(s) {unknown} for task {name!r}; "
            f"accepted options: {accepted}."
        )
    return task_class(
        **{option: value for option, value in options.items()
           if option in accepted}
    )
