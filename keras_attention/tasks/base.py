"""`SequenceTask`: the stream, pool, held-out and sharding logic every task
shares; a task subclass only says how one batch is drawn from a key."""

import abc

import numpy as np
import tensorflow as tf

from keras_attention.tasks import _streams
from keras_attention.validation import check_int


class SequenceTask(abc.ABC):
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
    first_symbol_id = 1

    def __init__(self, **options):
        self._options = dict(options)

    def get_config(self):
        """Returns a dict with `name` and the options; `make_task(**config)`
        rebuilds an identical task."""
        return {"name": self.name, **self._options}

    def __repr__(self):
        options = ", ".join(f"{k}={v!r}" for k, v in self._options.items())
        return f"{type(self).__name__}({options})"

    def token_label(self, token_id):
        """A short readable label of one input id: `<pad>` for padding, the
        id itself for a plain symbol. Tasks with named ids override it."""
        token_id = int(token_id)
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(
                f"`token_id` must be in [0, {self.vocab_size}); received "
                f"{token_id}."
            )
        return "<pad>" if token_id == self.pad_id else str(token_id)

    def token_labels(self, ids):
        """Readable labels of token ids, for the axes of attention maps.

        Args:
            ids: an integer array (or nested list) of any shape, e.g. one
                example `(T,)` or a batch `(B, T)`.

        Returns:
            Nested lists of strings of the same shape (`token_label` of each
            id; a padded position is `<pad>`).

        Example:

        >>> make_task("copy", seq_len=5, vocab_size=8).token_labels([3, 4, 1, 2, 0])
        ['3', '4', '<sep>', '<blank>', '<pad>']
        """
        array = np.asarray(ids)
        if array.dtype.kind not in "iu":
            raise ValueError(
                f"`ids` must hold integer token ids; received dtype "
                f"{array.dtype}."
            )
        labels = np.vectorize(self.token_label, otypes=[object])(array)
        return labels.tolist() if array.ndim else str(labels)

    def target_cells(self, tokens):
        """The attention-map cells each example's targets read from.

        A cell `(row, column)` is a query position `row` whose target is the
        input token at key position `column`: for recall the query row and
        the pair holding the query's key; for reverse row `i` reads column
        `l - 1 - i`; for copy answer position `l + 1 + i` reads column `i`;
        for sort row `i` reads every position holding the symbol of rank `i`
        (several when the symbol repeats). Positions whose target does not
        come from one input position (padding) have no cell.

        Args:
            tokens: integer ids `(seq_len,)` (one example) or
                `(batch, seq_len)`, as the task generates them.

        Returns:
            For one example, a sorted list of `(row, column)` tuples; for a
            batch, one such list per example.

        Raises:
            ValueError: if `tokens` is not an integer array whose last axis
                is `seq_len` long.

        Example:

        >>> make_task("reverse", seq_len=4, vocab_size=8).target_cells([5, 6, 7, 0])
        [(0, 2), (1, 1), (2, 0)]
        """
        array = np.asarray(tokens)
        if (array.dtype.kind not in "iu" or array.ndim not in (1, 2)
                or array.shape[-1] != self.seq_len):
            raise ValueError(
                f"`tokens` must be integer ids of shape (seq_len,) or "
                f"(batch, seq_len) with seq_len {self.seq_len}; received "
                f"dtype {array.dtype}, shape {array.shape}."
            )
        if array.ndim == 1:
            return sorted(self._example_target_cells(array))
        return [sorted(self._example_target_cells(row)) for row in array]

    @abc.abstractmethod
    def _example_target_cells(self, tokens):
        """`(row, column)` pairs of one example's `(seq_len,)` tokens."""

    @abc.abstractmethod
    def _generate(self, key, batch_size):
        """Draws `(tokens, targets, weights)` for `batch_size` examples from
        the stateless RNG key `key` (int64 shape `(2,)`)."""

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
        batch_size = check_int(batch_size, "batch_size")
        seed = _streams.check_seed(seed)
        step = _streams.check_step(step)
        return self._generate(
            _streams.stream_keys(seed, _streams.TRAIN_TAG, step), batch_size
        )

    def _pool_batch_fn(self, seed, batch_size, train_size):
        """Batch function over a fixed pool of `train_size` examples.

        The stream is the pool in a fresh seeded order every epoch, epochs
        laid end to end: example `e = step * batch_size + row` is entry
        `e % train_size` of the permutation for epoch `e // train_size`.
        Computed statelessly, so any step can be regenerated.
        """
        pool = self._generate(
            _streams.stream_keys(seed, _streams.POOL_TAG, 0), train_size
        )
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
                    _streams.stream_keys(
                        seed, _streams.POOL_SHUFFLE_TAG, this_epoch
                    ),
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

        ```python
        task = make_task("sort", seq_len=6, vocab_size=10)
        ds = task.dataset(batch_size=4, seed=0, start_step=10)
        tokens, targets, weights = next(iter(ds))
        ```
        """
        batch_size = check_int(batch_size, "batch_size")
        seed = _streams.check_seed(seed)
        start_step = check_int(
            start_step,
            "start_step",
            minimum=0,
            expected="a non-negative integer",
        )
        # Validate the sharding before building anything.
        _streams.input_pipeline_layout(batch_size, input_context)

        if train_size is None:
            def global_batch(step):
                return self._generate(
                    _streams.stream_keys(seed, _streams.TRAIN_TAG, step),
                    batch_size,
                )
        else:
            train_size = check_int(
                train_size,
                "train_size",
                expected="a positive integer, or None for fresh samples",
            )
            global_batch = self._pool_batch_fn(seed, batch_size, train_size)

        steps = tf.data.Dataset.counter(start=start_step, dtype=tf.int64)
        dataset = steps.map(
            global_batch,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        dataset = _streams.shard_global_batches(
            dataset, batch_size, input_context
        )
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
        num_examples = check_int(num_examples, "num_examples")
        seed = _streams.check_seed(seed)
        tensors = self._generate(
            _streams.stream_keys(seed, _streams.HELDOUT_TAG, 0), num_examples
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
        batch_size = check_int(batch_size, "batch_size")
        num_examples = check_int(num_examples, "num_examples")
        if batch_size > num_examples:
            raise ValueError(
                f"`batch_size` must be at most num_examples ({num_examples}), "
                f"else the held-out dataset is empty; received {batch_size}."
            )
        _streams.input_pipeline_layout(batch_size, input_context)
        arrays = self.heldout(num_examples=num_examples, seed=seed)
        dataset = tf.data.Dataset.from_tensor_slices(arrays).batch(
            batch_size, drop_remainder=True
        )
        dataset = _streams.shard_global_batches(
            dataset, batch_size, input_context
        )
        return dataset.prefetch(tf.data.AUTOTUNE)

    def _symbols_and_lengths(self, key, batch_size, max_len):
        """Random content symbols `first_symbol_id .. vocab_size - 1` on
        every position, and per-example content lengths (`max_len`, or
        uniform in `[min_len, max_len]` when the task has variable length)."""
        symbol_key, length_key = _streams.split_key(key, 2)
        symbols = _streams.uniform_ints(
            symbol_key,
            [batch_size, self.seq_len],
            self.first_symbol_id,
            self.vocab_size,
        )
        if self.min_len is None:
            lengths = tf.fill([batch_size], tf.constant(max_len, tf.int32))
        else:
            lengths = _streams.uniform_ints(
                length_key, [batch_size], self.min_len, max_len + 1
            )
        return symbols, lengths
