"""Argument checks shared by the library's public functions and layers.

Each raises `ValueError` naming the argument and what was expected, the
message form Keras uses (`` `key_dim` must be a positive integer; received
0. ``). The pipelines check their flags themselves (with the flag's name),
so a value is checked once at each public boundary.
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


def check_int(value, name, minimum=1, allow_none=False, expected=None):
    """Returns `value` as a Python int, or raises `ValueError` naming `name`.

    Args:
        value: the argument.
        name: its name, for the message.
        minimum: the smallest value accepted.
        allow_none: also accept (and return) `None`.
        expected: how the message describes the valid values (default: "a
            positive integer" or "an integer >= minimum").
    """
    if value is None and allow_none:
        return None
    if not is_int(value) or value < minimum:
        if expected is None:
            expected = (
                "a positive integer" if minimum == 1
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


def check_bool(value, name):
    """Returns `value` as a Python bool, or raises `ValueError`."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"`{name}` must be True or False; received {value!r}.")
    return bool(value)


def check_choice(value, name, choices):
    """Returns `value` if it is one of `choices`, else raises `ValueError`."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(
            f"`{name}` must be one of {', '.join(map(repr, choices))}; "
            f"received {value!r}."
        )
    return value


# What a summary writer offers: `keras_attention.events.SummaryWriter`, or
# anything with its methods (a non-chief worker's writer that discards).
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
