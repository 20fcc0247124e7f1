"""Argument helpers shared by the benchmark scripts: a bad flag is one line
on stderr and exit status 2."""

import argparse
import sys


class OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def positive_int(name):
    """An argparse type accepting integers > 0; errors name the flag."""

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise argparse.ArgumentTypeError(
                f"{name} must be a positive integer; received {text!r}"
            )
        return value

    return parse


def positive_int_list(name):
    """An argparse type for a comma-separated list of integers > 0."""

    def parse(text):
        try:
            values = [int(item) for item in text.split(",") if item.strip()]
        except ValueError:
            values = []
        if not values or any(value <= 0 for value in values):
            raise argparse.ArgumentTypeError(
                f"{name} must be a comma-separated list of positive integers; "
                f"received {text!r}"
            )
        return values

    return parse


def subset_list(name, choices):
    """An argparse type for a comma-separated subset of `choices`, in the
    order given, without repeats."""

    def parse(text):
        values = [item.strip() for item in text.split(",") if item.strip()]
        if not values or any(value not in choices for value in values):
            raise argparse.ArgumentTypeError(
                f"{name} must be a comma-separated subset of "
                f"{','.join(choices)}; received {text!r}"
            )
        return list(dict.fromkeys(values))

    return parse
