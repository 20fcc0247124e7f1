"""Sequence tasks for attention experiments, synthetic and on real text, as
numpy batches.

Floor 2 (beside models, diagnostics and export): the tasks import only
numpy, Keras (for `SequenceTask.weighted_sums`, in `keras.ops`) and the core
floor (`keras_attention.validation`); never TensorFlow, so they work on every
Keras backend, with or without TensorFlow installed. Nothing in the library
imports them except the pipelines above. Inside the package, `_streams`
(random streams, the training pool's order, shard rows) is imported by `base`
(`SequenceTask`), which is imported by the task families `sequences`
(reverse, sort, copy), `recall` and `text`; `text` reads its corpus through
`corpus` (files, held-out split, vocabulary) and finds attention patterns
with `text_patterns`; this module gathers the tasks by name.

Every task produces batches `(tokens, targets, weights)`:

- `tokens`: int32 `(batch, seq_len)` input ids, `0` is padding.
- `targets`: int32 `(batch, seq_len)` class ids, one per position.
- `weights`: float32 `(batch, seq_len)`, `1.0` on positions that are scored
  and `0.0` everywhere else (padding, inputs that need no prediction).

A batch is a pure function of `(seed, step)`: it is drawn from a numpy
Philox generator keyed on `(seed, stream tag, step)` with integer draws only,
so any step's batch can be regenerated, on any machine and backend, and a
resumed run continues the same stream. Held-out data, the finite training
pool (`train_size`) and the pool's per-epoch orders come from other stream
tags and therefore never share random draws with the training stream.

The task also owns its loss: `SequenceTask.weighted_sums` gives the weighted
sums of the cross-entropy and of the correct predictions, which the trainer
divides by the global weight.

Tasks (`TASK_NAMES`):

- `"recall"`: one-hop associative recall, the query must match a key by
  content. See `RecallTask`.
- `"reverse"`: predict the input sequence reversed. See `ReverseTask`.
- `"sort"`: predict the input tokens in ascending order. See `SortTask`.
- `"copy"`: read a sequence, then write it out again after a delimiter.
  See `CopyTask`.
- `"text"`: next-character prediction on real text, the standard library's
  source or the user's files. See `TextTask`.

Example:

```python
task = make_task("recall", num_pairs=16, num_keys=64, num_values=16)
train = task.batches(batch_size=64, seed=0)   # infinite numpy iterator
tokens, targets, weights = next(train)         # == task.batch(0, 0, 64)
eval_tokens, eval_targets, eval_weights = task.heldout(num_examples=512)
for tokens, targets, weights in task.heldout_batches(128, num_examples=512):
    ...
```
"""

import inspect

from keras_attention.tasks.base import SequenceTask
from keras_attention.tasks.recall import RecallTask
from keras_attention.tasks.sequences import CopyTask
from keras_attention.tasks.sequences import ReverseTask
from keras_attention.tasks.sequences import SortTask
from keras_attention.tasks.text import TextTask

_TASKS = {
    "recall": RecallTask,
    "reverse": ReverseTask,
    "sort": SortTask,
    "copy": CopyTask,
    "text": TextTask,
}

TASK_NAMES = tuple(_TASKS)


def make_task(name, **options):
    """Builds a task by name.

    Args:
        name: One of `TASK_NAMES`.
        **options: Constructor options of that task (see `RecallTask`,
            `ReverseTask`, `SortTask`, `CopyTask`, `TextTask`). An option
            the task does not take raises `ValueError`, except when its
            value is None (unset), so callers can pass one set of options
            for every task.

    Returns:
        A `SequenceTask`.

    Raises:
        ValueError: for an unknown task name, an option the task does not
            take, or an option value the task refuses.

    Example:

    >>> task = make_task("copy", seq_len=11, vocab_size=8, min_len=2)
    >>> task.name, task.num_classes
    ('copy', 8)
    """
    if name not in _TASKS:
        raise ValueError(
            f"`name` must be one of {TASK_NAMES}; received {name!r}."
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
        # Named in backticks, as arguments are (the command line says flags).
        unknown, accepted = (", ".join(f"`{option}`" for option in names)
                             for names in (unknown, accepted))
        raise ValueError(f"Unknown option(s) {unknown} for task {name!r}; "
                         f"accepted options: {accepted}.")
    return task_class(
        **{option: value for option, value in options.items()
           if option in accepted}
    )


__all__ = [
    "TASK_NAMES",
    "CopyTask",
    "RecallTask",
    "ReverseTask",
    "SequenceTask",
    "SortTask",
    "TextTask",
    "make_task",
]
