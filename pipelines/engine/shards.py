"""Splitting a grid's runs across machines. Shard I of N trains the I-th of
N contiguous blocks of the trained runs in the runner's order (runs sharing
a compiled step stay together). The shard comes from, in this order:

* `--shard I/N`;
* a SLURM job array: `SLURM_ARRAY_TASK_ID` (minus `SLURM_ARRAY_TASK_MIN`,
  so `--array=1-4` works as `--array=0-3`) of `SLURM_ARRAY_TASK_COUNT`;
* a Kubernetes Indexed Job: `JOB_COMPLETION_INDEX`, the count from
  `--shard-count N` (Kubernetes does not export `completions`).
"""

from typing import NamedTuple, Optional

from pipelines.common import UsageError


class Shard(NamedTuple):
    """Shard `index` of `count`; `source`: where it came from (None for the
    whole grid in one process)."""

    index: int
    count: int
    source: Optional[str]


def _integer(text, what):
    try:
        return int(str(text).strip())
    except ValueError:
        raise UsageError(f"{what} must be an integer; got {text!r}") from None


def parse_shard(text):
    """`"1/4"` -> `Shard(1, 4, "--shard")`, or `UsageError`."""
    index, slash, count = str(text).partition("/")
    if not slash:
        raise UsageError(f"--shard must be I/N with 0 <= I < N; got {text!r}")
    return _checked(_integer(index, "--shard I"), _integer(count, "--shard N"),
                    "--shard")


def _checked(index, count, source):
    if count < 1 or not 0 <= index < count:
        raise UsageError(
            f"{source}: shard {index} of {count} is not one of 0..count-1")
    return Shard(index, count, source)


def resolve_shard(shard_flag, count_flag, environ):
    """The shard of this process, from the `--shard` and `--shard-count`
    texts (or None) and `environ`; `UsageError` on a malformed value."""
    if shard_flag is not None:
        return parse_shard(shard_flag)
    if ("SLURM_ARRAY_TASK_ID" in environ
            and "SLURM_ARRAY_TASK_COUNT" in environ):
        task = _integer(environ["SLURM_ARRAY_TASK_ID"], "SLURM_ARRAY_TASK_ID")
        first = _integer(environ.get("SLURM_ARRAY_TASK_MIN", 0),
                         "SLURM_ARRAY_TASK_MIN")
        count = _integer(environ["SLURM_ARRAY_TASK_COUNT"],
                         "SLURM_ARRAY_TASK_COUNT")
        return _checked(task - first, count, "SLURM_ARRAY_TASK_ID")
    if "JOB_COMPLETION_INDEX" in environ:
        if count_flag is None:
            raise UsageError(
                "JOB_COMPLETION_INDEX is set (a Kubernetes Indexed Job): give "
                "the job's completions as --shard-count N")
        return _checked(
            _integer(environ["JOB_COMPLETION_INDEX"], "JOB_COMPLETION_INDEX"),
            _integer(count_flag, "--shard-count"), "JOB_COMPLETION_INDEX")
    if count_flag is not None:
        raise UsageError("--shard-count needs JOB_COMPLETION_INDEX (a "
                         "Kubernetes Indexed Job); use --shard I/N otherwise")
    return Shard(0, 1, None)


def shard_block(items, shard):
    """The shard's contiguous block of `items`.

    >>> [shard_block(list(range(5)), Shard(i, 2, None)) for i in range(2)]
    [[0, 1], [2, 3, 4]]
    """
    start = shard.index * len(items) // shard.count
    end = (shard.index + 1) * len(items) // shard.count
    return items[start:end]
