"""Tests for keras_attention.tasks: targets are re-derived in numpy from the
tokens alone, following the id layouts documented in the module; streams,
pooling and sharding are checked against references written here; the loss
sums run on the current Keras backend against a numpy reference."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _backends import BACKEND, REPO_ROOT, to_np
from keras_attention import tasks
from keras_attention.tasks import TASK_NAMES, _streams, corpus, make_task

SMALL_OPTIONS = {
    "recall": dict(num_pairs=6, num_keys=10, num_values=4),
    "reverse": dict(seq_len=7, vocab_size=6),
    "sort": dict(seq_len=7, vocab_size=6),
    "copy": dict(seq_len=11, vocab_size=7),
    "text": dict(seq_len=16),  # the standard library's source
}


def rows_as_set(tokens):
    return {tuple(row) for row in tokens.tolist()}


# --------------------------------------------------------------------------
# Independent numpy checkers, one per task.


def prefix_length(tokens_row):
    """Content length of a padded row; asserts padding is one suffix of 0s."""
    length = int(np.count_nonzero(tokens_row))
    assert np.all(tokens_row[:length] != 0)
    assert np.all(tokens_row[length:] == 0)
    return length


def check_reverse(task, tokens, targets, weights):
    lengths = []
    for row_tokens, row_targets, row_weights in zip(tokens, targets, weights):
        length = prefix_length(row_tokens)
        content = row_tokens[:length]
        assert np.all((content >= 1) & (content < task.vocab_size))
        np.testing.assert_array_equal(row_targets[:length], content[::-1])
        np.testing.assert_array_equal(row_targets[length:], 0)
        np.testing.assert_array_equal(
            row_weights, (np.arange(task.seq_len) < length).astype(np.float32)
        )
        lengths.append(length)
    return np.array(lengths)


def check_sort(task, tokens, targets, weights):
    lengths = []
    for row_tokens, row_targets, row_weights in zip(tokens, targets, weights):
        length = prefix_length(row_tokens)
        content = row_tokens[:length]
        assert np.all((content >= 1) & (content < task.vocab_size))
        np.testing.assert_array_equal(row_targets[:length], np.sort(content))
        np.testing.assert_array_equal(row_targets[length:], 0)
        np.testing.assert_array_equal(
            row_weights, (np.arange(task.seq_len) < length).astype(np.float32)
        )
        lengths.append(length)
    return np.array(lengths)


def check_copy(task, tokens, targets, weights):
    delimiter, blank, pad = 1, 2, 0
    lengths = []
    for row_tokens, row_targets, row_weights in zip(tokens, targets, weights):
        delimiter_positions = np.flatnonzero(row_tokens == delimiter)
        assert delimiter_positions.size == 1
        length = int(delimiter_positions[0])
        content = row_tokens[:length]
        assert length >= 1
        assert np.all((content >= 3) & (content < task.vocab_size))
        answer = slice(length + 1, 2 * length + 1)
        np.testing.assert_array_equal(row_tokens[answer], blank)
        np.testing.assert_array_equal(row_tokens[2 * length + 1 :], pad)
        np.testing.assert_array_equal(row_targets[answer], content)
        expected_weights = np.zeros(task.seq_len, np.float32)
        expected_weights[answer] = 1.0
        np.testing.assert_array_equal(row_weights, expected_weights)
        np.testing.assert_array_equal(row_targets[row_weights == 0], 0)
        lengths.append(length)
    return np.array(lengths)


def decode_recall(task, tokens):
    """Splits ids into (key, value_slot) with the documented mixed radix."""
    radix = task.num_values + 1
    return (tokens - 1) // radix, (tokens - 1) % radix


def check_recall(task, tokens, targets, weights):
    assert np.all((tokens >= 1) & (tokens < task.vocab_size))
    keys, slots = decode_recall(task, tokens)
    pair_keys, pair_values = keys[:, :-1], slots[:, :-1]
    query_keys, query_slots = keys[:, -1], slots[:, -1]
    assert np.all(pair_keys < task.num_keys)
    assert np.all(pair_values < task.num_values)
    np.testing.assert_array_equal(query_slots, task.num_values)
    query_positions = []
    for row in range(tokens.shape[0]):
        assert len(set(pair_keys[row].tolist())) == task.num_pairs
        matches = np.flatnonzero(pair_keys[row] == query_keys[row])
        assert matches.size == 1
        assert targets[row, -1] == pair_values[row, matches[0]]
        query_positions.append(int(matches[0]))
    np.testing.assert_array_equal(targets[:, :-1], 0)
    expected_weights = np.zeros_like(weights)
    expected_weights[:, -1] = 1.0
    np.testing.assert_array_equal(weights, expected_weights)
    return np.array(query_positions)


def training_text(task):
    """The text task's training text, rare characters as U+FFFD and each
    file's end as NUL, read and split here from the corpus rule's files."""
    training, _, _ = corpus.split_texts(corpus.read_stdlib())
    kept = set(task.vocabulary)
    return "".join(
        "".join(char if char in kept else "\ufffd" for char in text) + "\0"
        for _, text in training)


def check_text(task, tokens, targets, weights):
    # Every position predicts the next character of one window of the
    # training text.
    np.testing.assert_array_equal(targets[:, :-1], tokens[:, 1:])
    np.testing.assert_array_equal(weights, 1.0)
    assert np.all((tokens >= 1) & (tokens < task.vocab_size))
    symbols = {1: "\ufffd", 2: "\0"}
    text = training_text(task)
    for row_tokens, row_targets in zip(tokens, targets):
        window = "".join(
            symbols[i] if i < 3 else task.vocabulary[i - 3]
            for i in [*row_tokens.tolist(), int(row_targets[-1])])
        assert window in text, window


CHECKERS = {
    "recall": check_recall,
    "reverse": check_reverse,
    "sort": check_sort,
    "copy": check_copy,
    "text": check_text,
}


# --------------------------------------------------------------------------
# Task semantics.


@pytest.mark.parametrize("name", TASK_NAMES)
def test_targets_match_numpy_reference(name):
    task = make_task(name, **SMALL_OPTIONS[name])
    batch = task.batch(seed=3, step=5, batch_size=64)
    tokens, targets, weights = batch
    assert tokens.shape == targets.shape == weights.shape == (64, task.seq_len)
    assert tokens.dtype == np.int32 and targets.dtype == np.int32
    assert weights.dtype == np.float32
    assert np.all((targets >= 0) & (targets < task.num_classes))
    CHECKERS[name](task, tokens, targets, weights)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_default_options_are_valid(name):
    task = make_task(name)
    assert task.name == name
    assert task.pad_id == 0
    CHECKERS[name](task, *task.batch(seed=0, step=0, batch_size=8))


def test_recall_layout_and_default_sizes():
    task = make_task("recall")
    assert (task.num_pairs, task.num_keys, task.num_values) == (16, 64, 16)
    assert task.seq_len == 17
    assert task.num_classes == 16
    assert task.token_factors == (64, 17)
    assert task.vocab_size == 1 + 64 * 17
    for name in ("reverse", "sort", "copy"):
        other = make_task(name)
        assert other.token_factors is None
        assert other.num_classes == other.vocab_size


def test_recall_draws_cover_keys_values_and_query_positions():
    task = make_task("recall", num_pairs=8, num_keys=12, num_values=4)
    batch = task.batch(seed=0, step=0, batch_size=800)
    tokens, targets, weights = batch
    query_positions = check_recall(task, tokens, targets, weights)
    keys, slots = decode_recall(task, tokens)
    assert set(keys.ravel().tolist()) == set(range(12))
    assert set(slots[:, :-1].ravel().tolist()) == set(range(4))
    # The answer must not be guessable from where the query points: every
    # pair position is queried about 1/8 of the time (expected 100 each).
    counts = np.bincount(query_positions, minlength=8)
    assert counts.min() > 50 and counts.max() < 150
    answer_counts = np.bincount(targets[:, -1], minlength=4)
    assert answer_counts.min() > 140  # expected 200 each


@pytest.mark.parametrize("name", ["reverse", "sort", "copy"])
def test_variable_length_padding_is_masked(name):
    options = dict(SMALL_OPTIONS[name], min_len=2)
    task = make_task(name, **options)
    batch = task.batch(seed=1, step=0, batch_size=200)
    tokens, targets, weights = batch
    lengths = CHECKERS[name](task, tokens, targets, weights)
    max_len = task.copy_len if name == "copy" else task.seq_len
    assert lengths.min() == 2 and lengths.max() == max_len
    # Padded positions: pad id and zero weight.
    padded = tokens == 0
    assert padded.any()
    np.testing.assert_array_equal(weights[padded], 0.0)
    np.testing.assert_array_equal(targets[padded], 0)


@pytest.mark.parametrize("name", ["reverse", "sort", "copy"])
def test_fixed_length_has_no_padding(name):
    task = make_task(name, **SMALL_OPTIONS[name])
    batch = task.batch(seed=1, step=0, batch_size=32)
    tokens, targets, weights = batch
    lengths = CHECKERS[name](task, tokens, targets, weights)
    max_len = task.copy_len if name == "copy" else task.seq_len
    np.testing.assert_array_equal(lengths, max_len)


def test_copy_length_from_seq_len():
    assert make_task("copy", seq_len=11).copy_len == 5
    assert make_task("copy", seq_len=12).copy_len == 5
    task = make_task("copy", seq_len=12, vocab_size=7)
    batch = task.batch(seed=0, step=0, batch_size=4)
    tokens, targets, weights = batch
    np.testing.assert_array_equal(tokens[:, -1], 0)
    check_copy(task, tokens, targets, weights)


# --------------------------------------------------------------------------
# Random streams: construction, determinism, independence.


def test_generator_state_is_built_from_seed_tag_and_counter():
    # Hand-computed Philox state: key (seed, tag), the counter in the top
    # 128 of the 256 counter bits (words 2 and 3, little-endian).
    rng = _streams.generator(5, _streams.HELDOUT_TAG, 2**64 + 7)
    state = rng.bit_generator.state
    assert state["bit_generator"] == "Philox"
    np.testing.assert_array_equal(state["state"]["key"], [5, 1])
    np.testing.assert_array_equal(state["state"]["counter"], [0, 0, 7, 1])
    # A stream is the same Generator every time it is built.
    np.testing.assert_array_equal(
        rng.integers(0, 2**31, 8),
        _streams.generator(5, 1, 2**64 + 7).integers(0, 2**31, 8),
    )


def test_stream_tags_and_counters_never_share_draws():
    tags = (_streams.TRAIN_TAG, _streams.HELDOUT_TAG, _streams.POOL_TAG,
            _streams.POOL_SHUFFLE_TAG)
    assert len(set(tags)) == 4
    draws = {}
    for tag in tags:
        for counter in (0, 1):
            words = _streams.generator(3, tag, counter).bit_generator
            draws[tag, counter] = words.random_raw(512)
    # 64-bit words: any shared word between two streams would mean
    # overlapping draws (chance of a coincidence ~ 1e-13).
    everything = np.concatenate(list(draws.values()))
    assert np.unique(everything).size == everything.size


@pytest.mark.parametrize("name", TASK_NAMES)
def test_batch_is_a_pure_function_of_seed_and_step(name):
    task = make_task(name, **SMALL_OPTIONS[name])
    first = task.batch(seed=7, step=11, batch_size=16)
    assert all(isinstance(array, np.ndarray) for array in first)
    again = make_task(name, **SMALL_OPTIONS[name]).batch(7, 11, 16)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    next_step = task.batch(seed=7, step=12, batch_size=16)
    other_seed = task.batch(seed=8, step=11, batch_size=16)
    assert not np.array_equal(first[0], next_step[0])
    assert not np.array_equal(first[0], other_seed[0])


def test_seed_range_ends_are_accepted():
    task = make_task("reverse", **SMALL_OPTIONS["reverse"])
    for seed in (0, np.int64(2**63 - 1), np.uint64(12)):
        check_reverse(task, *task.batch(seed, 2**63 - 1, 4))
    np.testing.assert_array_equal(
        task.batch(np.int32(12), 0, 4)[0], task.batch(12, 0, 4)[0]
    )


BLOCKED_TENSORFLOW_CHILD = r"""
import json, sys

class BlockTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ImportError(f"{name} is blocked in this test")
        return None

sys.meta_path.insert(0, BlockTensorFlow())
import numpy as np
from keras_attention.tasks import make_task

task = make_task("recall", num_pairs=6, num_keys=10, num_values=4)
batch = task.batch(seed=3, step=4, batch_size=8)
pooled = next(task.batches(8, seed=3, start_step=2, train_size=5))
logits = np.asarray(json.loads(sys.argv[1]), np.float32)
sums = task.weighted_sums(batch[1], logits, batch[2])
print(json.dumps({
    "batch": [array.tolist() for array in batch],
    "pooled": [array.tolist() for array in pooled],
    "sums": [float(np.asarray(value)) for value in sums],
    "tensorflow": sorted(m for m in sys.modules if m.startswith("tensorflow")),
}))
"""


def test_tasks_work_without_tensorflow_and_match_this_process():
    # jax: torch's import probes `find_spec("tensorflow")` itself, which a
    # raising finder breaks before the tasks are reached.
    pytest.importorskip("jax")
    task = make_task("recall", **SMALL_OPTIONS["recall"])
    logits = np.random.default_rng(0).normal(
        size=(8, task.seq_len, task.num_classes)
    ).astype(np.float32)
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join(
               filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-c", BLOCKED_TENSORFLOW_CHILD,
         json.dumps(logits.tolist())],
        capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    child = json.loads(result.stdout.strip().splitlines()[-1])
    assert child["tensorflow"] == []
    # The same data on another backend, in another process.
    batch = task.batch(seed=3, step=4, batch_size=8)
    pooled = next(task.batches(8, seed=3, start_step=2, train_size=5))
    for expected, got in zip(batch + pooled, child["batch"] + child["pooled"]):
        np.testing.assert_array_equal(expected, np.asarray(got))
    np.testing.assert_allclose(
        child["sums"], reference_weighted_sums(batch[1], logits, batch[2]),
        rtol=1e-5,
    )


# --------------------------------------------------------------------------
# The training stream, held-out batches and sharding.


@pytest.mark.parametrize("name", TASK_NAMES)
def test_batches_resume_at_start_step(name):
    task = make_task(name, **SMALL_OPTIONS[name])
    stream = task.batches(batch_size=8, seed=4, start_step=6)
    for offset in range(3):
        element = next(stream)
        assert [a.shape for a in element] == [(8, task.seq_len)] * 3
        assert [a.dtype for a in element] == [np.int32, np.int32, np.float32]
        for a, b in zip(element, task.batch(seed=4, step=6 + offset,
                                            batch_size=8)):
            np.testing.assert_array_equal(a, b)


def test_heldout_is_fixed_and_disjoint_from_training_stream():
    task = make_task("recall", **SMALL_OPTIONS["recall"])
    heldout = task.heldout(num_examples=64, seed=0)
    assert all(isinstance(array, np.ndarray) for array in heldout)
    assert heldout[0].shape == (64, task.seq_len)
    check_recall(task, *heldout)
    for a, b in zip(heldout, task.heldout(num_examples=64, seed=0)):
        np.testing.assert_array_equal(a, b)
    # Same seed, yet no example is shared with the first training steps
    # (6 distinct keys of 10 with 4 values: ~10^8 possible sequences).
    heldout_rows = rows_as_set(heldout[0])
    for step in range(4):
        assert not heldout_rows & rows_as_set(task.batch(0, step, 64)[0])
    other = task.heldout(num_examples=64, seed=1)
    assert not heldout_rows & rows_as_set(other[0])


def test_heldout_batches_batch_the_heldout_arrays():
    task = make_task("sort", **SMALL_OPTIONS["sort"])
    arrays = task.heldout(num_examples=50, seed=2)
    batches = list(task.heldout_batches(16, num_examples=50, seed=2))
    assert len(batches) == 3  # the last partial batch is dropped: 48 of 50
    for index in range(3):
        np.testing.assert_array_equal(
            np.concatenate([b[index] for b in batches]), arrays[index][:48]
        )


def concatenated_shards(make_stream, num_shards, count):
    """`count` elements of every shard's stream, concatenated per step."""
    shards = [make_stream(index) for index in range(num_shards)]
    elements = [[next(shard) for _ in range(count)] for shard in shards]
    return [
        tuple(np.concatenate([shard[k][part] for shard in elements])
              for part in range(3))
        for k in range(count)
    ]


@pytest.mark.parametrize("num_shards", [2, 4])
def test_shards_concatenate_to_the_global_batch(num_shards):
    task = make_task("copy", **dict(SMALL_OPTIONS["copy"], min_len=1))
    first = next(task.batches(8, 9, shard_index=1, num_shards=num_shards))
    assert first[0].shape == (8 // num_shards, task.seq_len)
    joined = concatenated_shards(
        lambda i: task.batches(8, 9, start_step=3, shard_index=i,
                               num_shards=num_shards), num_shards, 2)
    for offset, element in enumerate(joined):
        for a, b in zip(element, task.batch(9, 3 + offset, batch_size=8)):
            np.testing.assert_array_equal(a, b)
    # The pooled stream too, with batches straddling epochs.
    joined = concatenated_shards(
        lambda i: task.batches(8, 9, start_step=1, train_size=5,
                               shard_index=i, num_shards=num_shards),
        num_shards, 3)
    stream = task.batches(8, 9, start_step=1, train_size=5)
    for element in joined:
        for a, b in zip(element, next(stream)):
            np.testing.assert_array_equal(a, b)


def test_heldout_batches_sharding():
    task = make_task("recall", **SMALL_OPTIONS["recall"])
    arrays = task.heldout(num_examples=20, seed=0)
    parts = [list(task.heldout_batches(8, 20, 0, shard_index=i, num_shards=2))
             for i in range(2)]
    assert [len(p) for p in parts] == [2, 2]
    assert parts[0][0][0].shape == (4, task.seq_len)
    for batch_index in range(2):
        for index in range(3):
            np.testing.assert_array_equal(
                np.concatenate([p[batch_index][index] for p in parts]),
                arrays[index][batch_index * 8 : (batch_index + 1) * 8],
            )


# --------------------------------------------------------------------------
# Finite training pool.


def test_train_size_pool_is_a_reshuffled_permutation_each_epoch():
    task = make_task("recall", **SMALL_OPTIONS["recall"])
    train_size, batch_size = 10, 4  # batches straddle epoch boundaries
    dataset = task.batches(batch_size, seed=2, train_size=train_size)
    stream = np.concatenate([next(dataset)[0] for _ in range(10)])
    epochs = [stream[i * train_size : (i + 1) * train_size] for i in range(4)]
    pool = rows_as_set(epochs[0])
    assert len(pool) == train_size
    for epoch in epochs[1:]:
        # Every epoch visits every pool example exactly once...
        assert len(rows_as_set(epoch)) == train_size
        assert rows_as_set(epoch) == pool
    # ...in a different order.
    assert not all(np.array_equal(epochs[0], e) for e in epochs[1:])
    # The pool is neither the fresh-sample stream nor the held-out set.
    assert not pool & rows_as_set(task.batch(2, 0, 10)[0])
    assert not pool & rows_as_set(task.heldout(64, 2)[0])
    # Resuming is exact.
    resumed = task.batches(batch_size, 2, start_step=3, train_size=train_size)
    element = next(resumed)
    np.testing.assert_array_equal(element[0], stream[12:16])
    check_recall(task, *element)


def test_train_size_smaller_than_batch():
    task = make_task("recall", **SMALL_OPTIONS["recall"])
    dataset = task.batches(batch_size=8, seed=0, train_size=3)
    tokens = np.concatenate([next(dataset)[0] for _ in range(3)])
    for epoch in range(8):
        assert len(rows_as_set(tokens[epoch * 3 : (epoch + 1) * 3])) == 3
    assert len(rows_as_set(tokens)) == 3


@settings(max_examples=40, deadline=None)
@given(
    train_size=st.integers(1, 12),
    batch_size=st.integers(1, 16),
    step=st.one_of(st.integers(0, 40), st.integers(2**40, 2**62)),
    seed=st.integers(0, 2**63 - 1),
)
def test_pool_indices_follow_the_epoch_permutations(
    train_size, batch_size, step, seed
):
    # Reference: example e = step * batch_size + row, one at a time.
    expected = []
    for example in range(step * batch_size, (step + 1) * batch_size):
        epoch, position = divmod(example, train_size)
        order = _streams.epoch_permutation(seed, epoch, train_size)
        assert sorted(order.tolist()) == list(range(train_size))
        expected.append(order[position])
    index = _streams.pool_indices(
        seed, step, batch_size, train_size, range(batch_size), {}
    )
    np.testing.assert_array_equal(index, expected)


def test_a_far_pooled_step_needs_no_replay():
    task = make_task("reverse", **SMALL_OPTIONS["reverse"])
    step = 10**15  # replaying this many steps would never finish
    far = task.batches(6, seed=1, start_step=step, train_size=4)
    next(far)
    second = next(far)
    np.testing.assert_array_equal(
        second[0],
        next(task.batches(6, seed=1, start_step=step + 1, train_size=4))[0],
    )
    # With batch_size == train_size, the first batch is the whole pool.
    pool = rows_as_set(next(task.batches(4, seed=1, train_size=4))[0])
    assert rows_as_set(second[0]) <= pool
    check_reverse(task, *second)


# --------------------------------------------------------------------------
# The task's loss and metric sums.


def reference_weighted_sums(targets, logits, weights):
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    cross_entropy = -np.take_along_axis(log_probs, targets[..., None], -1)
    correct = logits.argmax(-1) == targets
    return (
        float((cross_entropy[..., 0] * weights).sum()),
        float((correct * weights).sum()),
    )


def compiled(fn):
    """`fn` compiled the way a trainer on the current backend would."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=False)
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    return fn


def test_weighted_sums_match_a_numpy_reference():
    task = make_task("copy", **dict(SMALL_OPTIONS["copy"], min_len=1))
    tokens, targets, weights = task.batch(0, 0, 16)
    logits = np.random.default_rng(1).normal(
        size=(16, task.seq_len, task.num_classes)
    ).astype(np.float32)
    # Make about half the scored positions right, so accuracy is not 0.
    right = np.random.default_rng(2).random(targets.shape) < 0.5
    rows, columns = np.nonzero(right)
    logits[rows, columns, targets[rows, columns]] += 10.0
    expected = reference_weighted_sums(targets, logits, weights)
    assert 0 < expected[1] < weights.sum()
    for fn in (task.weighted_sums, compiled(task.weighted_sums)):
        loss_sum, correct = fn(targets, logits, weights)
        for value in (loss_sum, correct):
            assert tuple(value.shape) == ()
            assert keras.backend.standardize_dtype(value.dtype) == "float32"
        np.testing.assert_allclose(
            [to_np(loss_sum), to_np(correct)], expected, rtol=1e-5
        )


def test_weighted_sums_hand_computed_case():
    task = make_task("reverse", seq_len=2, vocab_size=3)
    # Equal logits over 3 classes: each position costs log 3; argmax picks
    # class 0 (the first maximum), right only where the target is 0.
    logits = np.zeros((1, 2, 3), np.float16)  # cast to float32 inside
    targets = np.array([[0, 2]], np.int32)
    weights = np.array([[0.5, 2.0]], np.float32)
    loss_sum, correct = task.weighted_sums(targets, logits, weights)
    np.testing.assert_allclose(to_np(loss_sum), 2.5 * np.log(3), rtol=1e-6)
    np.testing.assert_allclose(to_np(correct), 0.5)


# --------------------------------------------------------------------------
# Construction and validation.


def test_make_task_and_config_round_trip():
    task = make_task("copy", seq_len=13, vocab_size=9, min_len=2)
    assert isinstance(task, tasks.CopyTask)
    rebuilt = make_task(**task.get_config())
    assert rebuilt.get_config() == task.get_config()
    np.testing.assert_array_equal(
        rebuilt.batch(0, 0, 4)[0], task.batch(0, 0, 4)[0]
    )
    # An unset (None) option a task does not take is ignored.
    assert make_task("recall", min_len=None).name == "recall"
    assert make_task("recall", num_pairs=4, seq_len=5).seq_len == 5


def test_unknown_task_name_lists_known_names():
    with pytest.raises(ValueError, match="name") as info:
        make_task("translate")
    for name in TASK_NAMES:
        assert name in str(info.value)


BAD_CONSTRUCTIONS = [
    ("reverse", dict(seq_len=1), "seq_len"),
    ("reverse", dict(seq_len=0), "seq_len"),
    ("reverse", dict(seq_len=4.0), "seq_len"),
    ("reverse", dict(vocab_size=2), "vocab_size"),
    ("reverse", dict(seq_len=5, min_len=6), "min_len"),
    ("reverse", dict(min_len=0), "min_len"),
    ("sort", dict(vocab_size=2), "vocab_size"),
    ("sort", dict(seq_len=-3), "seq_len"),
    ("copy", dict(seq_len=2), "seq_len"),
    ("copy", dict(vocab_size=4), "vocab_size"),
    ("copy", dict(seq_len=9, min_len=5), "min_len"),
    ("recall", dict(num_pairs=8, num_keys=7), "num_keys"),
    ("recall", dict(num_pairs=0), "num_pairs"),
    ("recall", dict(num_values=1), "num_values"),
    ("recall", dict(num_keys=True), "num_keys"),
    ("recall", dict(num_pairs=4, seq_len=8), "seq_len"),
    ("recall", dict(min_len=3), "min_len"),
    ("sort", dict(num_pairs=3), "num_pairs"),
]


@pytest.mark.parametrize("name,options,argument", BAD_CONSTRUCTIONS)
def test_bad_task_options_raise_value_error(name, options, argument):
    with pytest.raises(ValueError, match=argument):
        make_task(name, **options)


BAD_CALLS = [
    (lambda t: t.batch(0, 0, 0), "batch_size"),
    (lambda t: t.batch(0, -1, 4), "step"),
    (lambda t: t.batch(0, 2**63, 4), "step"),
    (lambda t: t.batch(0, 1.0, 4), "step"),
    (lambda t: t.batch("zero", 0, 4), "seed"),
    (lambda t: t.batch(-1, 0, 4), r"`seed`.*\[0, 2\*\*63\)"),
    (lambda t: t.batch(2**63, 0, 4), r"`seed`.*\[0, 2\*\*63\)"),
    (lambda t: t.batch(True, 0, 4), "seed"),
    (lambda t: t.batches(0, seed=0), "batch_size"),
    (lambda t: t.batches(4, seed=0, start_step=-2), "start_step"),
    (lambda t: t.batches(4, seed=1.5), "seed"),
    (lambda t: t.batches(4, seed=0, train_size=0), "train_size"),
    (lambda t: t.batches(6, 0, num_shards=4), "batch_size"),
    (lambda t: t.batches(8, 0, num_shards=0), "num_shards"),
    (lambda t: t.batches(8, 0, shard_index=2, num_shards=2), "shard_index"),
    (lambda t: t.batches(8, 0, shard_index=-1, num_shards=2), "shard_index"),
    (lambda t: t.heldout(num_examples=0), "num_examples"),
    (lambda t: t.heldout(8, seed=-3), "seed"),
    (lambda t: t.heldout_batches(0), "batch_size"),
    (lambda t: t.heldout_batches(64, num_examples=32), "batch_size"),
    (lambda t: t.heldout_batches(6, 16, num_shards=4), "batch_size"),
    (lambda t: t.heldout_batches(8, 16, shard_index=1), "shard_index"),
]


@pytest.mark.parametrize("call,argument", BAD_CALLS)
def test_bad_call_arguments_raise_value_error(call, argument):
    # Raised when called: a stream's arguments are checked before any next.
    task = make_task("recall", **SMALL_OPTIONS["recall"])
    with pytest.raises(ValueError, match=argument):
        call(task)


# ------------------------------------------------------------ token labels
def test_recall_token_labels_decode_the_id_layout():
    task = make_task("recall", num_pairs=4, num_keys=8, num_values=4)
    radix = task.num_values + 1
    # Hand-built ids: pairs (k2, v3), (k7, v0), then a query for key 2.
    ids = np.array([1 + 2 * radix + 3, 1 + 7 * radix + 0, 0,
                    1 + 5 * radix + 1, 1 + 2 * radix + task.num_values])
    assert task.token_labels(ids) == ["k2:v3", "k7:v0", "<pad>", "k5:v1",
                                      "k2:?"]
    tokens, targets, weights = task.heldout(8, seed=0)
    labels = task.token_labels(tokens)
    assert np.shape(labels) == tokens.shape
    for row, label_row, target_row in zip(tokens, labels, targets):
        query = label_row[-1]
        assert query.endswith(":?")
        # The pair the query must find carries the target value.
        matches = [label for label in label_row[:-1]
                   if label.split(":")[0] == query.split(":")[0]]
        assert matches == [f"{query.split(':')[0]}:v{target_row[-1]}"]


def test_symbol_tasks_name_padding_and_separators():
    copy = make_task("copy", seq_len=7, vocab_size=8)
    assert copy.token_labels([[3, 7, 1, 2, 2, 0, 0]]) == [
        ["3", "7", "<sep>", "<blank>", "<blank>", "<pad>", "<pad>"]
    ]
    for name in ("reverse", "sort"):
        task = make_task(name, seq_len=6, vocab_size=8, min_len=2)
        tokens, _, _ = task.heldout(16, seed=1)
        labels = task.token_labels(tokens)
        for row, label_row in zip(tokens, labels):
            for token, label in zip(row, label_row):
                assert label == ("<pad>" if token == 0 else str(token))


def test_token_labels_refuse_ids_outside_the_vocabulary():
    task = make_task("reverse", seq_len=4, vocab_size=8)
    with pytest.raises(ValueError, match="token_id"):
        task.token_labels([1, 8])
    with pytest.raises(ValueError, match="ids"):
        task.token_labels([1.5])
