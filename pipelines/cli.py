"""The `keras-attention` command line (floor 4): `train`, `compare`,
`sweep`, `variance`, `export`, each a pipeline module with
`add_arguments(parser)` and `run(args)`.

Bad flags or values exit 2 with one line on stderr, before any work starts;
an environment failure (a full disk, no Keras backend installed) exits 1
with one line.
"""

import argparse
import os
import sys

# Imports no framework: the backend is chosen below, before Keras loads.
from pipelines.backends import backend_from_argv
from pipelines.backends import set_deterministic_environment


def _choose_backend(argv):
    """Sets `KERAS_BACKEND` from `--backend`: Keras reads it once, at
    import; and, with `--deterministic`, what JAX and torch read once."""
    backend = backend_from_argv(argv)
    if backend is not None:
        os.environ["KERAS_BACKEND"] = backend
    set_deterministic_environment(argv, os.environ)


def _exit_unless_keras_can_start(argv):
    """Exits with one line when no installed backend can run Keras: 2 when
    `--backend` names one not installed, 1 when the environment is at
    fault."""
    flag = backend_from_argv(argv)
    if flag is not None and not backend_choice.installed(flag):
        print(f"keras-attention: error: --backend {flag}: {flag} is not "
              f"installed (pip install {flag})", file=sys.stderr)
        sys.exit(2)
    problem = backend_choice.choose_backend().problem
    if problem is not None:
        print(f"keras-attention: error: {problem}", file=sys.stderr)
        sys.exit(1)


def _import_keras_quietly():
    """Imports Keras and its backend, and lets it find its devices, with
    stderr muted: the frameworks' C++ start-up lines (absl warnings, CUDA
    probes) reach fd 2 before any logging setting applies. Python
    exceptions still surface. KERAS_ATTENTION_TF_LOGS=1 shows the lines.
    """
    if os.environ.get("KERAS_ATTENTION_TF_LOGS") == "1":
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        import keras

        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            tf.config.list_physical_devices()
        elif keras.backend.backend() == "jax":
            import jax

            jax.devices()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


# Before the project imports below: they import Keras, whose backend is
# fixed at import, and the backend's start-up lines would reach stderr.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_choose_backend(sys.argv[1:])
# After --backend: without TensorFlow and a named backend, importing the
# package takes JAX, else torch, and says so in one line.
from keras_attention import backend_choice  # noqa: E402

_exit_unless_keras_can_start(sys.argv[1:])
_import_keras_quietly()

from pipelines import compare  # noqa: E402
from pipelines import export  # noqa: E402
from pipelines import sweep  # noqa: E402
from pipelines import train  # noqa: E402
from pipelines import variance  # noqa: E402
from pipelines.common import EnvironmentFailure  # noqa: E402
from pipelines.common import OneLineErrorParser  # noqa: E402
from pipelines.common import UsageError  # noqa: E402

COMMANDS = {"train": train, "compare": compare, "sweep": sweep,
            "variance": variance, "export": export}


def build_parser():
    parser = OneLineErrorParser(
        prog="keras-attention",
        description="Scaled dot-product attention: train, compare, export.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name, module in COMMANDS.items():
        summary = (module.__doc__ or "").strip().splitlines()[0:1]
        subparser = subparsers.add_parser(
            name, help=summary[0] if summary else None,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(subparser)
        subparser.set_defaults(run=module.run)
    return parser


def main(argv=None):
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit:
        # `--help` (0), or a bad flag or value (2, reported on one line):
        # returned like every other status, so callers of `main` get it.
        return exit.code
    try:
        status = args.run(args)
    except (UsageError, EnvironmentFailure) as error:
        # A bad value (2), or a full disk or a busy machine (1): one line.
        print(f"keras-attention {args.command}: error: {error}",
              file=sys.stderr)
        return 2 if isinstance(error, UsageError) else 1
    return 0 if status is None else int(status)


if __name__ == "__main__":
    sys.exit(main())
