"""Which Keras backend this process can run on, decided before Keras loads.

Floor 0 (the core); imports nothing but the standard library, so the
command line and the package's `__init__` use it before Keras is imported:
Keras reads its backend once, at import, from `KERAS_BACKEND`, else from the
`"backend"` of `keras.json` in its home (`$KERAS_HOME`, else `~/.keras`),
else TensorFlow, and fails with a long `ModuleNotFoundError` when that
backend is not installed.

The order, first that applies:

1. `KERAS_BACKEND`, when set: the user's choice.
2. `keras.json`'s backend when it is not `"tensorflow"`: a choice too.
   Keras writes `"tensorflow"` there itself on its first import (even under
   `KERAS_BACKEND=jax`), so that value says nothing about the user.
3. TensorFlow, Keras's default, when installed.
4. Else the first installed of `FALLBACKS` (JAX, then torch), set as
   `KERAS_BACKEND` by `use_installed_backend` with one line saying so.

Example:

```python
choice = choose_backend()
if choice.problem:
    raise SystemExit(choice.problem)
```
"""

import importlib.util
import json
import os
import sys
from typing import NamedTuple, Optional

KERAS_DEFAULT = "tensorflow"
# The backends taken, in this order, when TensorFlow is missing: JAX first
# (Keras's fastest on CPU, GPU and TPU alike), then torch.
FALLBACKS = ("jax", "torch")
HOW_TO_CHOOSE = "set KERAS_BACKEND to jax, torch or tensorflow to choose"


class BackendChoice(NamedTuple):
    """What `choose_backend` decided.

    Attributes:
        backend: the backend Keras will run on, or `None` when none can.
        source: what named it: `"KERAS_BACKEND"`, the path of `keras.json`,
            `"default"` (TensorFlow) or `"fallback"`.
        message: one line for the user when this module picked a fallback
            (else `None`).
        problem: one line saying why Keras cannot start and how to fix it
            (else `None`).
    """

    backend: Optional[str]
    source: str
    message: Optional[str] = None
    problem: Optional[str] = None


def installed(backend):
    """Whether the framework of `backend` (a module of the same name:
    `"jax"`, `"torch"`, `"tensorflow"`, `"numpy"`, ...) can be found, without
    importing it."""
    try:
        return importlib.util.find_spec(backend) is not None
    except (ImportError, ValueError):
        # A finder refused it, or a broken entry in sys.modules.
        return False


def keras_config_path(environ=None):
    """The `keras.json` Keras reads: in `$KERAS_HOME`, else in `~/.keras`
    (`/tmp/.keras` when the home directory is not writable), as Keras's own
    `keras/src/backend/config.py` finds it."""
    environ = os.environ if environ is None else environ
    if "KERAS_HOME" in environ:
        directory = environ["KERAS_HOME"]
    else:
        home = os.path.expanduser("~")
        base = home if os.access(home, os.W_OK) else "/tmp"
        directory = os.path.join(base, ".keras")
    return os.path.expanduser(os.path.join(directory, "keras.json"))


def keras_config_backend(environ=None):
    """The `"backend"` of `keras.json`, or `None` when there is no readable
    file or no such entry."""
    try:
        with open(keras_config_path(environ)) as file:
            backend = json.load(file).get("backend")
    except (OSError, ValueError, AttributeError):
        return None
    return backend if isinstance(backend, str) and backend else None


def choose_backend(environ=None):
    """The backend Keras can start on in this environment (reads only).

    Args:
        environ: the environment variables (default `os.environ`).

    Returns:
        A `BackendChoice`. Its `problem` is set when the backend named by
        `KERAS_BACKEND` or `keras.json` is not installed, or when none of
        TensorFlow, JAX and torch is.
    """
    environ = os.environ if environ is None else environ
    named, source = environ.get("KERAS_BACKEND") or None, "KERAS_BACKEND"
    if named is None:
        configured = keras_config_backend(environ)
        if configured not in (None, KERAS_DEFAULT):
            named, source = configured, keras_config_path(environ)
    if named is not None:
        if installed(named):
            return BackendChoice(named, source)
        where = ("KERAS_BACKEND" if source == "KERAS_BACKEND"
                 else f"{source} (its \"backend\")")
        return BackendChoice(None, source, problem=(
            f"{where} names {named}, which is not installed: "
            f"pip install {named}, or {HOW_TO_CHOOSE}"))
    if installed(KERAS_DEFAULT):
        return BackendChoice(KERAS_DEFAULT, "default")
    for backend in FALLBACKS:
        if installed(backend):
            return BackendChoice(backend, "fallback", message=(
                f"TensorFlow, Keras's default backend, is not installed; "
                f"Keras runs on {backend} ({HOW_TO_CHOOSE})"))
    return BackendChoice(None, "default", problem=(
        "Keras needs a backend and none is installed: pip install jax "
        "(or torch, or tensorflow)"))


def use_installed_backend(environ=None, stream=None):
    """Sets `KERAS_BACKEND` to the fallback `choose_backend` picks when
    TensorFlow is missing, and writes its one line to `stream`.

    Does nothing once Keras is imported (its backend is fixed), nor when
    the environment already names a backend or TensorFlow is installed; a
    `problem` is only returned, for the caller to report when it needs
    Keras.

    Args:
        environ: the environment to read and set (default `os.environ`).
        stream: where the line goes (default `sys.stderr`).

    Returns:
        The `BackendChoice`, or `None` when Keras was already imported.
    """
    if sys.modules.get("keras") is not None:
        return None
    environ = os.environ if environ is None else environ
    choice = choose_backend(environ)
    if choice.source == "fallback":
        environ["KERAS_BACKEND"] = choice.backend
        print(f"keras-attention: warning: {choice.message}",
              file=sys.stderr if stream is None else stream, flush=True)
    return choice


def require_backend(environ=None):
    """Raises a one-line `ImportError` when Keras cannot start here.

    Raises:
        ImportError: with `choose_backend`'s `problem`, when there is one.
    """
    problem = choose_backend(environ).problem
    if problem is not None:
        raise ImportError(f"keras-attention: {problem}") from None
