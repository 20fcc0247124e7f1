"""`RecallTask`: one-hop associative recall over (key, value) pair tokens."""

import numpy as np

from keras_attention.tasks.base import SequenceTask
from keras_attention.validation import check_int


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
        self.num_pairs = check_int(num_pairs, "num_pairs")
        self.num_keys = check_int(
            num_keys,
            "num_keys",
            minimum=self.num_pairs,
            expected=f"an integer >= `num_pairs` ({self.num_pairs}) so that "
            "keys are distinct",
        )
        self.num_values = check_int(num_values, "num_values", minimum=2)
        if seq_len is not None and seq_len != self.num_pairs + 1:
            raise ValueError(
                f"`seq_len` for recall must be `num_pairs` + 1 = "
                f"{self.num_pairs + 1} (or None); received {seq_len!r}."
            )
        self.seq_len = self.num_pairs + 1
        self.vocab_size = 1 + self.num_keys * (self.num_values + 1)
        self.num_classes = self.num_values
        self.token_factors = (self.num_keys, self.num_values + 1)
        self.min_len = None

    def token_label(self, token_id):
        """`k12:v3` for the pair (key 12, value 3), `k12:?` for a query of
        key 12, `<pad>` for padding."""
        label = super().token_label(token_id)
        if label == "<pad>":
            return label
        key, value_slot = divmod(int(token_id) - 1, self.num_values + 1)
        value = "?" if value_slot == self.num_values else f"v{value_slot}"
        return f"k{key}:{value}"

    def _example_target_cells(self, tokens):
        # The query (last position) must find the pair with its key.
        keys = (tokens.astype(np.int64) - 1) // (self.num_values + 1)
        query = self.num_pairs
        return [(query, int(column))
                for column in np.flatnonzero(keys[:query] == keys[query])]

    def _generate(self, rng, batch_size):
        # A uniformly random order of all keys per example; its first
        # `num_pairs` entries are a uniformly random set of distinct keys in
        # random order. A shuffle (integer draws) rather than the top-k of
        # float noise, so no float rounding can differ between machines.
        all_keys = np.broadcast_to(
            np.arange(self.num_keys, dtype=np.int32),
            (batch_size, self.num_keys),
        )
        keys = rng.permuted(all_keys, axis=1)[:, : self.num_pairs]
        values = rng.integers(
            0, self.num_values, size=(batch_size, self.num_pairs),
            dtype=np.int32,
        )
        query_index = rng.integers(0, self.num_pairs, size=batch_size)
        examples = np.arange(batch_size)
        query = keys[examples, query_index]
        answer = values[examples, query_index]

        radix = self.num_values + 1
        tokens = np.empty((batch_size, self.seq_len), np.int32)
        tokens[:, :-1] = 1 + keys * radix + values
        tokens[:, -1] = 1 + query * radix + self.num_values
        targets = np.zeros((batch_size, self.seq_len), np.int32)
        targets[:, -1] = answer
        weights = np.zeros((batch_size, self.seq_len), np.float32)
        weights[:, -1] = 1.0
        return self._finish(tokens, targets, weights, batch_size)
