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
