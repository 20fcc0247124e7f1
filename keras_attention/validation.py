"""Argument checks shared by the library's public functions and layers.

Each raises `ValueError` naming the argument and what was expected, the
message form Keras uses (`` `key_dim` must be a positive integer; received
0. ``). The pipelines declare their settings' checks with these functions
and say `` `key_dim` `` as the flag `--key-dim` (`pipelines.settings.
usage_error`), so a value is checked once at each public boundary.
"""

import math
import numbers

import numpy as np


def is_int(value):
    """A Python or numpy integer, not a bool."""
    return not isinstance(value, (bool, np.bool_)) and isinstance(
        value, numbers.Integral
    )


def is_positive_real(value):
    """A finite real number > 0, not a bool."""
    return (
        not isinstance(value, (bool, np.bool_))
        and isinstance(value, numbers.Real)
        and math.isfinite(value)
        and value > 0
    )


def check_int(value, name, minimum=1, allow_none=False, expected=None,
              maximum=None):
    """Returns `value` as a Python int, or raises `ValueError` naming `name`.

    Args:
        value: the argument.
        name: its name, for the message.
        minimum: the smallest value accepted.
        allow_none: also accept (and return) `None`.
        expected: how the message describes the valid values (default: "a
            positive integer", "an integer >= minimum" or "an integer in
            [minimum, maximum]").
        maximum: `None`, or the largest value accepted.
    """
    if value is None and allow_none:
        return None
    if not is_int(value) or value < minimum or (
            maximum is not None and value > maximum):
        if expected is None:
            expected = (
                f"an integer in [{minimum}, {maximum}]" if maximum is not None
                else "a positive integer" if minimum == 1
                else f"an integer >= {minimum}"
            )
            if allow_none:
                expected += " or None"
        raise ValueError(f"`{name}` must be {expected}; received {value!r}.")
    return int(value)


def check_rate(value, name):
    """Returns `value` as a float in [0, 1) (a dropout rate), or raises
    `ValueError`."""
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, numbers.Real)
        or not 0.0 <= value < 1.0
    ):
        raise ValueError(
            f"`{name}` must be a number in [0, 1); received {value!r}."
        )
    return float(value)


def check_positive_real(value, name):
    """Returns `value` as a float if it is finite and > 0, else raises
    `ValueError`."""
    if not is_positive_real(value):
        raise ValueError(
            f"`{name}` must be a positive finite number; received {value!r}."
        )
    return float(value)


def check_real(value, name, low=None, high=None, low_open=False,
               high_open=False, allow_none=False):
    """Returns `value` as a float if it is a finite number in the interval
    from `low` to `high` (`None`: unbounded; `low_open`/`high_open` exclude
    the bound), or `None` with `allow_none`; else raises `ValueError`."""
    if value is None and allow_none:
        return None
    ok = (not isinstance(value, (bool, np.bool_))
          and isinstance(value, numbers.Real) and math.isfinite(value))
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        interval = ("(" if low_open or low is None else "[") + (
            f"{-math.inf if low is None else low:g}, "
            f"{math.inf if high is None else high:g}"
        ) + (")" if high_open or high is None else "]")
        raise ValueError(
            f"`{name}` must be a finite number in {interval}"
            + (" or None" if allow_none else "") + f"; received {value!r}."
        )
    return float(value)


def check_mode_or_real(value, name, modes, high=None):
    """Returns `value` if it is one of `modes` (strings), or a finite number
    in `(0, high]` (as a float); else raises `ValueError`."""
    if isinstance(value, str) and value in modes:
        return value
    if is_positive_real(value) and (high is None or value <= high):
        return float(value)
    raise ValueError(
        f"`{name}` must be one of {', '.join(modes)} or a number in (0, "
        f"{math.inf if high is None else high:g}]; received {value!r}."
    )


def check_text(value, name, allow_none=False):
    """Returns `value` if it is a string (or `None` with `allow_none`),
    else raises `ValueError`."""
    if not isinstance(value, str) and not (value is None and allow_none):
        raise ValueError(f"`{name}` must be a string; received {value!r}.")
    return value


def check_bool(value, name):
    """Returns `value` as a Python bool, or raises `ValueError`."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(
            f"`{name}` must be True or False; received {value!r}.")
    return bool(value)


def check_choice(value, name, choices):
    """Returns `value` if it is one of `choices`, else raises `ValueError`."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(
            f"`{name}` must be one of {', '.join(choices)}; "
            f"received {value!r}."
        )
    return value


# What a summary writer offers: `keras_attention.events.SummaryWriter`, or
# anything with its methods (a non-chief worker's writer that discards).
# The largest float32: the bound of a real setting that reaches float32
# scores or summaries (`--learning-rate 1e308` overflowed when logged).
FLOAT32_MAX = float(np.finfo(np.float32).max)

WRITER_METHODS = ("scalar", "histogram", "image", "text", "tensor",
                  "write_summary", "flush")


def check_writer(writer, name="writer"):
    """Returns `writer` if it has `SummaryWriter`'s methods, else raises
    `ValueError`."""
    missing = [method for method in WRITER_METHODS
               if not callable(getattr(writer, method, None))]
    if missing:
        raise ValueError(
            f"`{name}` must be a keras_attention.events.SummaryWriter; "
            f"received {type(writer).__name__} (without "
            f"{', '.join(missing)})."
        )
    return writer
