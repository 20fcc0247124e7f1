"""`SequenceTask`: the stream, pool, held-out and sharding logic every task
shares, and the task's loss; a task subclass only says how one batch is
drawn from a random generator.

Data is numpy only (no TensorFlow, no Keras backend), so any trainer on any
backend feeds the same batches; `weighted_sums` alone uses `keras.ops`, so
that it runs inside a compiled step of whichever backend is active.
"""

import abc

import keras
import numpy as np

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

        >>> task = make_task("copy", seq_len=5, vocab_size=8)
        >>> task.token_labels([3, 4, 1, 2, 0])
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

        >>> task = make_task("reverse", seq_len=4, vocab_size=8)
        >>> task.target_cells([5, 6, 7, 0])
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

    def heldout_scalars(self, loss, accuracy):
        """Further held-out numbers of the task, derived from the held-out
        `loss` and `accuracy` (`{name: float}`); none for the synthetic
        tasks (`TextTask` adds bits per character and its baseline)."""
        return {}

    def vocabulary_file(self):
        """The vocabulary a run saves beside its model (`vocab.json`), or
        None when the ids need none (the synthetic tasks)."""
        return None

    def attention_patterns(self, tokens):
        """`{pattern: cells}` of the attention patterns the diagnostics
        score each head on (see `text_patterns.pattern_scores`); none for
        the synthetic tasks, whose `target_cells` say where to look."""
        return {}

    @abc.abstractmethod
    def _example_target_cells(self, tokens):
        """`(row, column)` pairs of one example's `(seq_len,)` tokens."""

    @abc.abstractmethod
    def _generate(self, rng, batch_size):
        """Draws `(tokens, targets, weights)` for `batch_size` examples from
        the `numpy.random.Generator` `rng`, with integer draws only (see
        `_streams.generator`) and vectorised over the batch."""

    def _finish(self, tokens, targets, weights, batch_size):
        """Fixes the dtypes of a generated batch and checks its shapes."""
        shape = (batch_size, self.seq_len)
        arrays = (
            np.asarray(tokens, np.int32),
            np.asarray(targets, np.int32),
            np.asarray(weights, np.float32),
        )
        if any(array.shape != shape for array in arrays):
            raise AssertionError(
                f"{self.name} generated shapes "
                f"{[array.shape for array in arrays]}, expected {shape}."
            )
        return arrays

    def batch(self, seed, step, batch_size):
        """Returns the training batch for `(seed, step)`.

        Args:
            seed: Integer run seed in `[0, 2**63)`.
            step: Non-negative integer step, below 2**63.
            batch_size: Positive integer number of examples (global batch).

        Returns:
            Tuple of numpy arrays `(tokens, targets, weights)`, shapes
            `(batch_size, seq_len)`, dtypes int32, int32, float32. The same
            arguments give the same batch on every machine and backend.

        Example:

        >>> task = make_task("reverse", seq_len=4, vocab_size=8)
        >>> tokens, targets, weights = task.batch(seed=1, step=0, batch_size=2)
        >>> tokens.shape, tokens.dtype
        ((2, 4), dtype('int32'))
        """
        batch_size = check_int(batch_size, "batch_size")
        seed = _streams.check_seed(seed)
        step = _streams.check_step(step)
        return self._generate(
            _streams.generator(seed, _streams.TRAIN_TAG, step), batch_size
        )

    def batches(
        self,
        batch_size,
        seed,
        start_step=0,
        train_size=None,
        shard_index=0,
        num_shards=1,
    ):
        """Infinite training stream of `(tokens, targets, weights)` batches.

        Element `k` is (this shard's rows of) the global batch of step
        `start_step + k`: `batch(seed, start_step + k, batch_size)` without
        `train_size`. The arguments are checked when this is called, not at
        the first `next`.

        Args:
            batch_size: Positive integer, the GLOBAL batch size.
            seed: Integer run seed in `[0, 2**63)`.
            start_step: Non-negative integer, first step of the stream (to
                resume a run where it stopped).
            train_size: None (default) draws fresh examples at every step.
                A positive integer instead trains on a fixed pool of that many
                examples (its own stream), in a fresh seeded order every
                epoch, epochs laid end to end; each epoch's order is a pure
                function of `(seed, epoch)`, so a resumed stream is exact.
            shard_index: Integer in `[0, num_shards)`, this shard.
            num_shards: Positive integer dividing `batch_size`. Shard `i`
                yields rows `[i * n, (i + 1) * n)` of each global batch,
                `n = batch_size // num_shards`, so the data is the same
                whatever the number of shards.

        Returns:
            An infinite iterator of numpy tuples, shapes
            `(batch_size // num_shards, seq_len)`.

        Example:

        ```python
        task = make_task("sort", seq_len=6, vocab_size=10)
        stream = task.batches(batch_size=4, seed=0, start_step=10)
        tokens, targets, weights = next(stream)  # batch(0, 10, 4)
        ```
        """
        batch_size = check_int(batch_size, "batch_size")
        seed = _streams.check_seed(seed)
        start_step = _streams.check_step(start_step, "start_step")
        rows = _streams.shard_rows(batch_size, shard_index, num_shards)
        if train_size is None:
            return self._fresh_batches(seed, start_step, batch_size, rows)
        train_size = check_int(
            train_size,
            "train_size",
            expected="a positive integer, or None for fresh samples",
        )
        # Drawn now, not at the first `next`, so a pool too large for
        # memory fails here.
        pool = self._generate(
            _streams.generator(seed, _streams.POOL_TAG, 0), train_size
        )
        return self._pool_batches(
            pool, seed, start_step, batch_size, rows, train_size
        )

    def _fresh_batches(self, seed, step, batch_size, rows):
        # The whole global batch is drawn and sliced, so a shard's rows do
        # not depend on the number of shards. `batches` checked the
        # arguments once: each step draws without checking them again.
        rows = slice(rows.start, rows.stop)
        while True:
            batch = self._generate(
                _streams.generator(seed, _streams.TRAIN_TAG, step), batch_size
            )
            yield tuple(array[rows] for array in batch)
            step += 1

    def _pool_batches(self, pool, seed, step, batch_size, rows, train_size):
        permutations = {}
        while True:
            index = _streams.pool_indices(
                seed, step, batch_size, train_size, rows, permutations
            )
            yield tuple(array[index] for array in pool)
            step += 1

    def heldout(self, num_examples=512, seed=0):
        """Fixed held-out examples, from a stream disjoint from training.

        Args:
            num_examples: Positive integer number of examples.
            seed: Integer seed in `[0, 2**63)`; the held-out stream is keyed
                on a different tag than `batch`/`batches` (and their pool),
                so it never reuses their draws, even for the same seed.

        Returns:
            Tuple of numpy arrays `(tokens, targets, weights)`, shapes
            `(num_examples, seq_len)`, dtypes int32, int32, float32.
        """
        num_examples = check_int(num_examples, "num_examples")
        seed = _streams.check_seed(seed)
        return self._generate(
            _streams.generator(seed, _streams.HELDOUT_TAG, 0), num_examples
        )

    def heldout_batches(
        self, batch_size, num_examples=512, seed=0, shard_index=0,
        num_shards=1,
    ):
        """Finite stream of the batches of `heldout(num_examples, seed)`.

        Args:
            batch_size: Positive integer global batch size, at most
                `num_examples`; a last partial batch is dropped.
            num_examples: Positive integer number of held-out examples.
            seed: Integer seed of the held-out set.
            shard_index: Integer in `[0, num_shards)`, this shard.
            num_shards: Positive integer dividing `batch_size`; sharded as
                in `batches`.

        Returns:
            An iterator of `num_examples // batch_size` numpy tuples
            `(tokens, targets, weights)`, shapes
            `(batch_size // num_shards, seq_len)`.
        """
        batch_size = check_int(batch_size, "batch_size")
        num_examples = check_int(num_examples, "num_examples")
        if batch_size > num_examples:
            raise ValueError(
                f"`batch_size` must be at most num_examples ({num_examples}), "
                f"else there is no held-out batch; received {batch_size}."
            )
        rows = _streams.shard_rows(batch_size, shard_index, num_shards)
        arrays = self.heldout(num_examples=num_examples, seed=seed)
        starts = range(0, num_examples - batch_size + 1, batch_size)
        return (
            tuple(
                array[start + rows.start : start + rows.stop]
                for array in arrays
            )
            for start in starts
        )

    def weighted_sums(self, targets, logits, weights):
        """The weighted sums of the loss and of the correct predictions.

        Written in `keras.ops` only, so it runs on every Keras backend and
        inside a compiled (traced) step. The trainer divides both sums by
        the GLOBAL weight (`weights` summed over the whole global batch, all
        shards and replicas together) to get the mean loss and accuracy;
        dividing by that one number makes the shards' summed gradients the
        gradient of the global-batch mean loss.

        Args:
            targets: int `(batch, seq_len)` class ids.
            logits: float `(batch, seq_len, num_classes)`; cast to float32.
            weights: float `(batch, seq_len)` position weights.

        Returns:
            Two float32 scalars: the sum over positions of the sparse
            cross-entropy from logits times `weights`, and the sum of
            `(argmax(logits) == targets)` times `weights`.
        """
        ops = keras.ops
        logits = ops.cast(logits, "float32")
        targets = ops.cast(targets, "int32")
        weights = ops.cast(weights, "float32")
        per_position = ops.sparse_categorical_crossentropy(
            targets, logits, from_logits=True
        )
        predicted = ops.cast(ops.argmax(logits, axis=-1), "int32")
        correct = ops.cast(ops.equal(predicted, targets), "float32")
        return ops.sum(per_position * weights), ops.sum(correct * weights)

    def _symbols_and_lengths(self, rng, batch_size, max_len):
        """Random content symbols `first_symbol_id .. vocab_size - 1` on
        every position, and per-example content lengths (`max_len`, or
        uniform in `[min_len, max_len]` when the task has variable length)."""
        symbols = rng.integers(
            self.first_symbol_id,
            self.vocab_size,
            size=(batch_size, self.seq_len),
            dtype=np.int32,
        )
        if self.min_len is None:
            lengths = np.full(batch_size, max_len, np.int32)
        else:
            lengths = rng.integers(
                self.min_len, max_len + 1, size=batch_size, dtype=np.int32
            )
        return symbols, lengths
