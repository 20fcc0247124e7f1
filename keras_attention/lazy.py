"""Re-exports that load on first use (PEP 562), so a package imports no
Keras until one of its Keras names is used.

Floor 0 (the core). TensorBoard imports the Attention dashboard's plugin
(`keras_attention.viz.tensorboard_plugin`) at start-up, which runs
`keras_attention/__init__.py` and `keras_attention/viz/__init__.py`; their
re-exports go through `lazy_exports`, so TensorBoard starts whatever Keras
backend is installed, or none.

Example (a package's `__init__.py`):

```python
_LAZY_EXPORTS = {"ScaledDotProductAttention": "keras_attention.layer"}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY_EXPORTS)
```

The import contracts (pyproject.toml) do not see a `_LAZY_EXPORTS` table
as imports, so `tests/test_house.py` checks that it names only modules
inside its own package: a re-export then only reaches down.
"""

import importlib
import sys

from keras_attention.backend_choice import require_backend


def lazy_exports(package, exports):
    """The module `__getattr__` and `__dir__` of `package`.

    Args:
        package: the package's `__name__` (it must be in `sys.modules`).
        exports: `{name: module}`: `package.name` is `module.name`, imported
            when first asked for and then kept as the package's attribute.

    Returns:
        `(__getattr__, __dir__)`. `__getattr__` raises `AttributeError` for
        other names (so `from package import submodule` still imports the
        submodule); when an import fails because Keras has no backend here,
        a one-line `ImportError` saying how to get one
        (`keras_attention.backend_choice.require_backend`).
    """
    module = sys.modules[package]

    def __getattr__(name):
        target = exports.get(name)
        if target is None:
            raise AttributeError(
                f"module {package!r} has no attribute {name!r}")
        try:
            value = getattr(importlib.import_module(target), name)
        except ImportError:
            # Checked only when the import fails: names that need no Keras
            # (`decode_summary`) load without a backend.
            require_backend()
            raise
        setattr(module, name, value)  # Later lookups skip __getattr__.
        return value

    def __dir__():
        return sorted(set(vars(module)) | set(exports))

    return __getattr__, __dir__
