"""Tests for keras_attention.tasks: targets are re-derived in numpy from the
tokens alone, following the id layouts documented in the module."""

import numpy as np
import pytest
import tensorflow as tf

from keras_attention import tasks
from keras_attention.tasks import TASK_NAMES, make_task

SMALL_OPTIONS = {
    "recall": dict(num_pairs=6, num_keys=10, num_values=4),
    "reverse": dict(seq_len=7, vocab_size=6),
    "sort": dict(seq_len=7, vocab_size=6),
    "copy": dict(seq_len=11, vocab_size=7),
}


def as_numpy(batch):
    return tuple(np.asarray(tensor) for tensor in batch)


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


CHECKERS = {
    "recall": check_recall,
    "reverse": check_reverse,
    "sort": check_sort,
    "copy": check_copy,
}


# --------------------------------------------------------------------------
# Task semantics.


@pytest.mark.parametrize("name", TASK_NAMES)
def test_targets_match_numpy_reference(name):
    task = make_task(name, **SMALL_OPTIONS[name])
    batch = task.batch(seed=3, step=5, batch_size=64)
    tokens, targets, weights = as_numpy(batch)
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
    CHECKERS[name](task, *as_numpy(task.batch(seed=0, step=0, batch_size=8)))


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
    tokens, targets, weights = as_numpy(batch)
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
    tokens, targets, weights = as_numpy(batch)
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
    tokens, targets, weights = as_numpy(batch)
    lengths = CHECKERS[name](task, tokens, targets, weights)
    max_len = task.copy_len if name == "copy" else task.seq_len
    np.testing.assert_array_equal(lengths, max_len)


def test_copy_length_from_seq_len():
    assert make_task("copy", seq_len=11).copy_len == 5
    assert make_task("copy", seq_len=12).copy_len == 5
    task = make_task("copy", seq_len=12, vocab_size=7)
    batch = task.batch(seed=0, step=0, batch_size=4)
    tokens, targets, weights = as_numpy(batch)
    np.testing.assert_array_equal(tokens[:, -1], 0)
    check_copy(task, tokens, targets, weights)


# --------------------------------------------------------------------------
# Determinism and streams.


@pytest.mark.parametrize("name", TASK_NAMES)
def test_batch_is_a_pure_function_of_seed_and_step(name):
    task = make_task(name, **SMALL_OPTIONS[name])
    first = as_numpy(task.batch(seed=7, step=11, batch_size=16))
    again = as_numpy(make_task(name, **SMALL_OPTIONS[name]).batch(7, 11, 16))
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    next_step = as_numpy(task.batch(seed=7, step=12, batch_size=16))
    other_seed = as_numpy(task.batch(seed=8, step=11, batch_size=16))
    assert not np.array_equal(first[0], next_step[0])
    assert not np.array_equal(first[0], other_seed[0])


def test_batch_in_graph_mode_matches_eager():
    task = make_task("recall", **SMALL_OPTIONS["recall"])
    graph_batch = tf.function(lambda step: task.batch(5, step, 8))
    eager = as_numpy(task.batch(5, 3, 8))
    graph = as_numpy(graph_batch(tf.constant(3, tf.int64)))
    for a, b in zip(eager, graph):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_dataset_resumes_at_start_step(name):
    task = make_task(name, **SMALL_OPTIONS[name])
    dataset = task.dataset(batch_size=8, seed=4, start_step=6)
    spec = dataset.element_spec
    assert [s.shape.as_list() for s in spec] == [[8, task.seq_len]] * 3
    assert [s.dtype for s in spec] == [tf.int32, tf.int32, tf.float32]
    elements = [as_numpy(e) for e in dataset.take(2)]
    for offset, element in enumerate(elements):
        expected = as_numpy(task.batch(seed=4, step=6 + offset, batch_size=8))
        for a, b in zip(element, expected):
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
    # (6 distinct keys of 10 with 4 values: ~10^7 possible sequences).
    heldout_rows = rows_as_set(heldout[0])
    for step in range(4):
        train_tokens = np.asarray(task.batch(0, step, batch_size=64)[0])
        assert not heldout_rows & rows_as_set(train_tokens)
    other = task.heldout(num_examples=64, seed=1)
    assert not heldout_rows & rows_as_set(other[0])


def test_heldout_dataset_batches_the_heldout_arrays():
    task = make_task("sort", **SMALL_OPTIONS["sort"])
    arrays = task.heldout(num_examples=50, seed=2)
    dataset = task.heldout_dataset(16, num_examples=50, seed=2)
    batches = [as_numpy(b) for b in dataset]
    assert len(batches) == 3  # drop_remainder: 48 of 50 examples
    for index in range(3):
        np.testing.assert_array_equal(
            np.concatenate([b[index] for b in batches]), arrays[index][:48]
        )


# --------------------------------------------------------------------------
# Input-pipeline sharding.


def test_two_input_pipelines_concatenate_to_the_global_batch():
    task = make_task("copy", **dict(SMALL_OPTIONS["copy"], min_len=1))
    slices = []
    for pipeline_id in range(2):
        context = tf.distribute.InputContext(
            num_input_pipelines=2,
            input_pipeline_id=pipeline_id,
            num_replicas_in_sync=2,
        )
        dataset = task.dataset(
            batch_size=8, seed=9, start_step=3, input_context=context
        )
        assert dataset.element_spec[0].shape.as_list() == [4, task.seq_len]
        slices.append([as_numpy(e) for e in dataset.take(2)])
    for step_offset in range(2):
        expected = as_numpy(task.batch(9, 3 + step_offset, batch_size=8))
        for index in range(3):
            np.testing.assert_array_equal(
                np.concatenate([s[step_offset][index] for s in slices]),
                expected[index],
            )


def test_one_pipeline_feeding_two_replicas_yields_consecutive_halves():
    task = make_task("reverse", **SMALL_OPTIONS["reverse"])
    context = tf.distribute.InputContext(
        num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=2
    )
    dataset = task.dataset(batch_size=8, seed=1, input_context=context)
    first, second = [as_numpy(e) for e in dataset.take(2)]
    expected = as_numpy(task.batch(seed=1, step=0, batch_size=8))
    np.testing.assert_array_equal(first[0], expected[0][:4])
    np.testing.assert_array_equal(second[0], expected[0][4:])


def test_heldout_dataset_sharding():
    task = make_task("recall", **SMALL_OPTIONS["recall"])
    arrays = task.heldout(num_examples=16, seed=0)
    parts = []
    for pipeline_id in range(2):
        context = tf.distribute.InputContext(2, pipeline_id, 2)
        parts.append(
            [as_numpy(b) for b in task.heldout_dataset(8, 16, 0, context)]
        )
    for batch_index in range(2):
        np.testing.assert_array_equal(
            np.concatenate([p[batch_index][0] for p in parts]),
            arrays[0][batch_index * 8 : (batch_index + 1) * 8],
        )


# --------------------------------------------------------------------------
# Finite training pool.


def test_train_size_pool_is_a_reshuffled_permutation_each_epoch():
    task = make_task("recall", **SMALL_OPTIONS["recall"])
    train_size, batch_size = 10, 4  # batches straddle epoch boundaries
    dataset = task.dataset(batch_size, seed=2, train_size=train_size)
    stream = np.concatenate([e[0].numpy() for e in dataset.take(10)])
    epochs = [stream[i * train_size : (i + 1) * train_size] for i in range(4)]
    pool = rows_as_set(epochs[0])
    assert len(pool) == train_size
    for epoch in epochs[1:]:
        # Every epoch visits every pool example exactly once...
        assert len(rows_as_set(epoch)) == train_size
        assert rows_as_set(epoch) == pool
    # ...in a different order.
    assert not all(np.array_equal(epochs[0], e) for e in epochs[1:])
    # The pool is not the fresh-sample stream, and resuming is exact.
    assert not pool & rows_as_set(np.asarray(task.batch(2, 0, 10)[0]))
    resumed = task.dataset(
        batch_size, seed=2, start_step=3, train_size=train_size
    )
    np.testing.assert_array_equal(
        next(iter(resumed))[0].numpy(), stream[12:16]
    )
    check_recall(task, *as_numpy(next(iter(resumed))))


def test_train_size_smaller_than_batch():
    task = make_task("recall", **SMALL_OPTIONS["recall"])
    dataset = task.dataset(batch_size=8, seed=0, train_size=3)
    tokens = np.concatenate([e[0].numpy() for e in dataset.take(3)])
    for epoch in range(8):
        assert len(rows_as_set(tokens[epoch * 3 : (epoch + 1) * 3])) == 3
    assert len(rows_as_set(tokens)) == 3


# --------------------------------------------------------------------------
# Construction and validation.


def test_make_task_and_config_round_trip():
    task = make_task("copy", seq_len=13, vocab_size=9, min_len=2)
    assert isinstance(task, tasks.CopyTask)
    rebuilt = make_task(**task.get_config())
    assert rebuilt.get_config() == task.get_config()
    np.testing.assert_array_equal(
        np.asarray(rebuilt.batch(0, 0, 4)[0]),
        np.asarray(task.batch(0, 0, 4)[0]),
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


def _context(pipelines, pipeline_id, replicas):
    return tf.distribute.InputContext(pipelines, pipeline_id, replicas)


BAD_CALLS = [
    (lambda t: t.batch(0, 0, 0), "batch_size"),
    (lambda t: t.batch(0, -1, 4), "step"),
    (lambda t: t.batch("zero", 0, 4), "seed"),
    (lambda t: t.dataset(0, seed=0), "batch_size"),
    (lambda t: t.dataset(4, seed=0, start_step=-2), "start_step"),
    (lambda t: t.dataset(4, seed=1.5), "seed"),
    (lambda t: t.dataset(4, seed=0, train_size=0), "train_size"),
    (lambda t: t.dataset(6, 0, input_context=_context(2, 0, 4)), "batch_size"),
    (lambda t: t.dataset(9, 0, input_context=_context(2, 0, 1)), "batch_size"),
    (
        lambda t: t.dataset(8, 0, input_context=_context(2, 0, 1)),
        "input_context",
    ),
    (lambda t: t.heldout(num_examples=0), "num_examples"),
    (lambda t: t.heldout_dataset(0), "batch_size"),
    (lambda t: t.heldout_dataset(64, num_examples=32), "batch_size"),
]


@pytest.mark.parametrize("call,argument", BAD_CALLS)
def test_bad_call_arguments_raise_value_error(call, argument):
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
