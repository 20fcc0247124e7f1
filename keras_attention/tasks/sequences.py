"""Tasks over padded random symbols: `ReverseTask`, `SortTask`, `CopyTask`."""

import abc

import numpy as np

from keras_attention.tasks.base import SequenceTask
from keras_attention.validation import check_int
from keras_attention.validation import is_int


def _check_min_len(min_len, max_len, max_name):
    """None (fixed length) or an int in `[1, max_len]`."""
    if min_len is None:
        return None
    if not is_int(min_len) or not 1 <= min_len <= max_len:
        raise ValueError(
            f"`min_len` must be an integer between 1 and `{max_name}` = "
            f"{max_len}, or None for fixed length; received {min_len!r}."
        )
    return int(min_len)


class _PaddedSymbolsTask(SequenceTask):
    """Shared input of `ReverseTask` and `SortTask`: random content symbols
    `1 .. vocab_size - 1` on a prefix of length `l`, padding id 0 after."""

    def __init__(self, seq_len=16, vocab_size=16, min_len=None):
        super().__init__(
            seq_len=seq_len, vocab_size=vocab_size, min_len=min_len
        )
        self.seq_len = check_int(seq_len, "seq_len", minimum=2)
        self.vocab_size = check_int(
            vocab_size,
            "vocab_size",
            minimum=3,
            expected="an integer >= 3 (padding id 0 plus at least 2 content "
            "symbols)",
        )
        self.min_len = _check_min_len(min_len, self.seq_len, "seq_len")
        self.num_classes = self.vocab_size

    def _generate(self, rng, batch_size):
        # Random symbols on the first `length` positions, padding after.
        symbols, lengths = self._symbols_and_lengths(
            rng, batch_size, self.seq_len
        )
        valid = np.arange(self.seq_len)[None, :] < lengths[:, None]
        tokens = np.where(valid, symbols, self.pad_id)
        targets = self._targets(tokens, lengths, valid)
        return self._finish(tokens, targets, valid, batch_size)

    @abc.abstractmethod
    def _targets(self, tokens, lengths, valid):
        """The targets of padded `tokens` with content `lengths`."""

    def _content(self, tokens):
        """The content symbols of one example (the prefix before padding)."""
        return tokens[: int(np.sum(tokens != self.pad_id))]


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

    ```python
    task = ReverseTask(seq_len=8, vocab_size=10, min_len=3)
    tokens, targets, weights = task.batch(seed=0, step=0, batch_size=16)
    ```
    """

    name = "reverse"

    def _targets(self, tokens, lengths, valid):
        # Position i < length reads position length - 1 - i; padding reads
        # itself, so it stays in place.
        positions = np.arange(self.seq_len)[None, :]
        source = np.where(valid, lengths[:, None] - 1 - positions, positions)
        return np.take_along_axis(tokens, source, axis=1)

    def _example_target_cells(self, tokens):
        length = len(self._content(tokens))
        return [(row, length - 1 - row) for row in range(length)]


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

    ```python
    task = SortTask(seq_len=8, vocab_size=10)
    tokens, targets, weights = task.batch(seed=0, step=0, batch_size=16)
    ```
    """

    name = "sort"

    def _targets(self, tokens, lengths, valid):
        # Padding is lifted above every symbol so it sorts to the end.
        sorted_tokens = np.sort(
            np.where(valid, tokens, self.vocab_size), axis=1
        )
        return np.where(valid, sorted_tokens, 0)

    def _example_target_cells(self, tokens):
        # A repeated symbol sits at several positions; each is a source.
        content = self._content(tokens)
        return [(row, int(column))
                for row, symbol in enumerate(np.sort(content))
                for column in np.flatnonzero(content == symbol)]


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

    def token_label(self, token_id):
        """`<pad>`, `<sep>` (the delimiter), `<blank>`, or the symbol id."""
        names = {self.delimiter_id: "<sep>", self.blank_id: "<blank>"}
        return names.get(int(token_id)) or super().token_label(token_id)

    def __init__(self, seq_len=21, vocab_size=16, min_len=None):
        super().__init__(
            seq_len=seq_len, vocab_size=vocab_size, min_len=min_len
        )
        self.seq_len = check_int(
            seq_len,
            "seq_len",
            minimum=3,
            expected="an integer >= 3 (2 * copy_len + 1 with copy_len >= 1)",
        )
        self.vocab_size = check_int(
            vocab_size,
            "vocab_size",
            minimum=5,
            expected="an integer >= 5 (padding, delimiter, blank plus at "
            "least 2 content symbols)",
        )
        self.copy_len = (self.seq_len - 1) // 2
        self.min_len = _check_min_len(
            min_len, self.copy_len, "copy_len = (seq_len - 1) // 2"
        )
        self.num_classes = self.vocab_size

    def _example_target_cells(self, tokens):
        # Answer position l + 1 + i copies content position i.
        delimiters = np.flatnonzero(tokens == self.delimiter_id)
        if len(delimiters) == 0:
            return []
        length = int(delimiters[0])
        return [(length + 1 + column, column) for column in range(length)]

    def _generate(self, rng, batch_size):
        symbols, lengths = self._symbols_and_lengths(
            rng, batch_size, self.copy_len
        )
        lengths = lengths[:, None]
        positions = np.arange(self.seq_len)[None, :]
        is_content = positions < lengths
        is_answer = (positions > lengths) & (positions <= 2 * lengths)
        tokens = np.where(
            is_content,
            symbols,
            np.where(
                positions == lengths,
                self.delimiter_id,
                np.where(is_answer, self.blank_id, self.pad_id),
            ),
        )
        # Answer position l + 1 + i holds symbol i.
        source = np.clip(positions - lengths - 1, 0, self.seq_len - 1)
        copied = np.take_along_axis(
            symbols, np.broadcast_to(source, symbols.shape), axis=1
        )
        targets = np.where(is_answer, copied, 0)
        return self._finish(tokens, targets, is_answer, batch_size)
