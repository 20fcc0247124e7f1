"""`TextTask`: next-character prediction on real text (a causal language
model), on the standard library's source or a user's own files."""

import math

import numpy as np

from keras_attention.tasks import corpus as corpus_lib
from keras_attention.tasks import text_patterns
from keras_attention.tasks import _streams
from keras_attention.tasks.base import SequenceTask
from keras_attention.validation import check_int

# The keys a corpus description must hold (see `corpus.describe_corpus`).
_DESCRIPTION_KEYS = ("sha256", "vocabulary", "training_characters",
                     "heldout_characters", "training_files", "heldout_files")


def _check_description(corpus):
    if not isinstance(corpus, dict) or any(
            key not in corpus for key in _DESCRIPTION_KEYS):
        raise ValueError(
            "`corpus` must be a corpus description (corpus.describe_corpus) "
            f"with the keys {list(_DESCRIPTION_KEYS)}, or None to read the "
            f"text; received {corpus!r:.200}."
        )
    return dict(corpus)


def _spread_order(count):
    """For each of `count` windows, which of `count` evenly spaced places
    it takes: the rank of its bit-reversed index (van der Corput order:
    window 0 the first place, window 1 the middle one, then the quarters)."""
    bits = max(int(count - 1).bit_length(), 1)
    reversed_index = [int(format(k, f"0{bits}b")[::-1], 2)
                      for k in range(count)]
    return np.argsort(np.argsort(reversed_index))


class TextTask(SequenceTask):
    """Predict the next character of real text, every position scored.

    An example is a window of `seq_len + 1` consecutive characters of the
    training text (the files laid end to end, an end-of-file symbol after
    each): the first `seq_len` are the tokens, the last `seq_len` the
    targets, weight 1 everywhere. A training window starts at a uniformly
    random position drawn from `(seed, step)`, like every task's batch.
    The held-out windows (`heldout`) are spread evenly over the held-out
    text, each moved to the next line start, and are the same for every
    seed, so every run is measured on the same text.

    The corpus, split and vocabulary follow the rules of
    `keras_attention.tasks.corpus`. The ids are `0` padding (never drawn),
    `1` an unknown (rare) character, `2` the end of a file, then the
    vocabulary's characters. `target_cells` are the opening brackets that
    the query before a closing bracket would match (what a
    bracket-matching head reads); `attention_patterns` gives every
    pattern of `text_patterns`.

    Args:
        seq_len: Context length in characters, at least 2 and shorter than
            each split.
        text_files: None for the running Python's standard-library source,
            else a list of UTF-8 files and directories of `.txt` files.
        corpus: Optional description of the corpus (as a run recorded it,
            `corpus.describe_corpus`): its vocabulary is used without
            reading the text, which is read (and checked to be the one
            described) only when a batch is first drawn. None reads it now.

    Example:

    ```python
    task = TextTask(seq_len=128)              # the standard library
    tokens, targets, weights = task.batch(seed=0, step=0, batch_size=8)
    "".join(task.token_labels(tokens[0]))     # ␣␣␣␣return␣self._...
    ```
    """

    name = "text"
    unknown_id = corpus_lib.UNKNOWN_ID
    end_of_file_id = corpus_lib.END_OF_FILE_ID
    first_symbol_id = corpus_lib.FIRST_CHARACTER_ID

    def __init__(self, seq_len=256, text_files=None, corpus=None):
        super().__init__(seq_len=seq_len, text_files=text_files,
                         corpus=corpus)
        self.seq_len = check_int(seq_len, "seq_len", minimum=2)
        self.text_files = corpus_lib.check_text_files(text_files)
        self._corpus = None
        if corpus is None:
            self._corpus = corpus_lib.load_corpus(self.text_files)
            corpus = self._corpus.description
        self.corpus = _check_description(corpus)
        self.vocabulary = self.corpus["vocabulary"]
        self.vocab_size = self.first_symbol_id + len(self.vocabulary)
        self.num_classes = self.vocab_size
        self.min_len = None
        self._ids = {char: index for index, char in
                     enumerate(self.vocabulary, self.first_symbol_id)}
        for split in ("training", "heldout"):
            # Each file's part is followed by an end-of-file symbol.
            length = (self.corpus[f"{split}_characters"]
                      + self.corpus[f"{split}_files"])
            if length < self.seq_len + 1:
                raise ValueError(
                    f"`seq_len` must be below the length of the {split} "
                    f"text ({length} symbols), so that a window of seq_len "
                    f"+ 1 fits; received {self.seq_len}."
                )
        self._heldout = {}

    # ------------------------------------------------------------- data
    def _loaded(self):
        """The loaded corpus, checked to be the one described."""
        if self._corpus is None:
            loaded = corpus_lib.load_corpus(self.text_files)
            if loaded.description != self.corpus:
                raise ValueError(
                    "`corpus` describes another text than the one read now "
                    f"(sha256 {self.corpus['sha256']} described, "
                    f"{loaded.description['sha256']} now)."
                )
            self._corpus = loaded
        return self._corpus

    def _windows(self, ids, starts):
        index = np.asarray(starts, np.int64)[:, None] + np.arange(
            self.seq_len + 1)
        windows = ids[index]
        tokens, targets = windows[:, :-1], windows[:, 1:]
        return self._finish(tokens, targets, np.ones(tokens.shape),
                            len(index))

    def _generate(self, rng, batch_size):
        ids = self._loaded().training_ids
        starts = rng.integers(0, len(ids) - self.seq_len,
                              size=batch_size, dtype=np.int64)
        return self._windows(ids, starts)

    def heldout(self, num_examples=512, seed=0):
        """The held-out windows: `num_examples` starts spread evenly over
        the held-out text, each moved forward to the next line start when
        one is near (within a window's length), in van der Corput order
        (the first window at the start, the second in the middle, then the
        quarters...), so the diagnostics probe, the first few, samples the
        whole held-out text. The same for every `seed` (which is checked,
        for the common signature).

        Returns:
            `(tokens, targets, weights)`, shapes `(num_examples, seq_len)`.
        """
        num_examples = check_int(num_examples, "num_examples")
        _streams.check_seed(seed)
        if num_examples not in self._heldout:
            ids = self._loaded().heldout_ids
            last = len(ids) - self.seq_len - 1
            starts = np.floor(np.linspace(0, last, num_examples)).astype(
                np.int64)[_spread_order(num_examples)]
            line_starts = np.flatnonzero(
                ids[:last] == self._ids.get("\n", -1)) + 1
            if len(line_starts):
                following = np.searchsorted(line_starts, starts)
                found = line_starts[
                    np.minimum(following, len(line_starts) - 1)]
                near = ((following < len(line_starts))
                        & (found - starts < self.seq_len))
                starts = np.where(near, found, starts)
            self._heldout[num_examples] = self._windows(ids, starts)
        return tuple(array.copy() for array in self._heldout[num_examples])

    # ---------------------------------------------------------- metrics
    def heldout_scalars(self, loss, accuracy):
        """`bits_per_character` (the held-out loss, in bits) and, beside it,
        `unigram_bits_per_character`: the entropy of the held-out text's
        symbol distribution, what the best model that ignores context
        would reach."""
        bits = None if loss is None else loss / math.log(2.0)
        return {
            "bits_per_character": bits,
            "unigram_bits_per_character": corpus_lib.unigram_bits(
                self._loaded().heldout_ids),
        }

    def vocabulary_file(self):
        """The vocabulary as a run saves it (`vocab.json`): every id's
        character (None for the special ids) and label."""
        characters = [None] * self.first_symbol_id + list(self.vocabulary)
        return {
            "pad_id": self.pad_id,
            "unknown_id": self.unknown_id,
            "end_of_file_id": self.end_of_file_id,
            "characters": characters,
            "labels": [self.token_label(index)
                       for index in range(self.vocab_size)],
        }

    # ----------------------------------------------------------- text
    def encode(self, text):
        """int32 ids of `text`; characters outside the vocabulary are the
        unknown id."""
        return np.array([self._ids.get(char, self.unknown_id)
                         for char in str(text)], np.int32)

    def decode(self, ids, unknown="\ufffd"):
        """The text of `ids`: `unknown` for the unknown id, `"\\n"` for an
        end of file, nothing for padding."""
        special = {self.pad_id: "", self.unknown_id: unknown,
                   self.end_of_file_id: "\n"}
        return "".join(
            special[i] if i in special else self.vocabulary[
                i - self.first_symbol_id]
            for i in (int(value) for value in np.asarray(ids).ravel())
        )

    def token_label(self, token_id):
        """The character, with `␣`, `⏎`, `⇥` (and the control pictures)
        for whitespace; `<pad>`, `\ufffd` (unknown) and `∎` (end of file)
        for the special ids."""
        label = super().token_label(token_id)
        token_id = int(token_id)
        if token_id == self.unknown_id:
            return "\ufffd"
        if token_id == self.end_of_file_id:
            return "\u220e"
        if token_id >= self.first_symbol_id:
            return corpus_lib.character_label(
                self.vocabulary[token_id - self.first_symbol_id])
        return label

    # ------------------------------------------------------- attention
    def attention_patterns(self, tokens):
        """`{pattern: cells}` of `text_patterns.PATTERNS` for a batch of
        `(batch, seq_len)` tokens, each `text_patterns.flatten_cells`."""
        tokens = np.asarray(tokens)
        per_example = [text_patterns.pattern_cells(self._window_text(row))
                       for row in tokens]
        return {
            name: text_patterns.flatten_cells(
                [cells[name] for cells in per_example])
            for name in text_patterns.PATTERNS
        }

    def _window_text(self, tokens):
        """One character per position (`\\0` for the special ids, `\\n` at
        an end of file), so positions line up with the tokens."""
        return "".join(
            self.vocabulary[i - self.first_symbol_id]
            if i >= self.first_symbol_id
            else ("\n" if i == self.end_of_file_id else "\0")
            for i in (int(value) for value in tokens)
        )

    def _example_target_cells(self, tokens):
        return [(query, keys[0]) for query, keys in
                text_patterns.pattern_cells(
                    self._window_text(tokens))["bracket"]]
