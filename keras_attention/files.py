"""Writing files so that a crash never leaves half of one.

`atomic_path(path)` is the one atomic writer of the package and of the
pipelines built on it: whatever is written to the temporary path it yields
(a file or a directory) is renamed onto `path` only once the block ends
without an error, and removed otherwise.
"""

import contextlib
import os
import shutil
import tempfile


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


@contextlib.contextmanager
def atomic_path(path, directory=False):
    """Yields a temporary path beside `path`; renames it onto `path` at the end.

    The temporary name keeps `path`'s suffix (`model.keras` is staged as
    `.tmp-XXXX.keras`), because some writers choose the format by it. It
    lies in the same directory, so the final `os.replace` is atomic.

    Args:
        path: the file (or, with `directory=True`, the directory) to write.
            Replacing an existing directory is not atomic; see
            `keras_attention.export` for the exchange that makes it so.
        directory: stage an (empty, created) directory instead of a file
            name that does not exist yet.

    Yields:
        The temporary path to write to.
    """
    parent = os.path.dirname(os.path.abspath(path))
    suffix = "" if directory else os.path.splitext(path)[1]
    if directory:
        temporary = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
    else:
        handle, temporary = tempfile.mkstemp(prefix=".tmp-", suffix=suffix,
                                             dir=parent)
        os.close(handle)
        os.remove(temporary)  # Writers such as model.save expect no file.
    try:
        yield temporary
        if directory and os.path.isdir(path):
            shutil.rmtree(path)
        os.replace(temporary, path)
    except BaseException:
        _remove(temporary)
        raise
