"""Writing files so that a crash never leaves half of one, and saying what
a path that cannot be read as a file is.

`atomic_path(path)` is the one atomic writer of the package and of the
pipelines built on it: whatever is written to the temporary path it yields
(a file or a directory) is renamed onto `path` only once the block ends
without an error, and removed otherwise. Floor 0 (core): standard library
only.
"""

import contextlib
import errno
import os
import shutil
import stat
import tempfile

# What a path that is neither a regular file nor a directory is, by its
# `stat` type.
_SPECIAL_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO), not a text file"),
    (stat.S_ISSOCK, "a socket, not a text file"),
    (stat.S_ISCHR, "a character device, not a text file"),
    (stat.S_ISBLK, "a block device, not a text file"),
)


def path_problem(path):
    """Why `path` cannot be read as a regular file or a directory, in words
    (`"a loop of symbolic links"`, `"a named pipe (FIFO), not a text
    file"`, `"no such file or directory"`), or `None` when it can.

    Opens nothing: a named pipe's `open` would wait for a writer.

    Example:

    >>> path_problem("/no/such/path")
    'no such file or directory'
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "a loop of symbolic links"
        if error.errno == errno.ENOENT:
            return ("a symbolic link to a missing file"
                    if os.path.islink(path) else "no such file or directory")
        return error.strerror or str(error)
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    for test, kind in _SPECIAL_KINDS:
        if test(mode):
            return kind
    return "not a regular file"


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


@contextlib.contextmanager
def atomic_path(path, directory=False, replace=None):
    """Yields a temporary path beside `path`, renamed onto `path` at the end.

    The temporary name starts with `path`'s name and keeps its suffix
    (`model.keras` is staged as `.model.keras.tmp-<random>.keras`), because
    some writers choose the format by it. It lies in the same directory, so
    the final `os.replace` is atomic.

    Args:
        path: the file (or, with `directory=True`, the directory) to write.
            Its parent directory must exist.
        directory: stage an (empty, created) directory instead of a file
            name that does not exist yet. It gets the permissions of any new
            directory (not `mkdtemp`'s private ones).
        replace: the last step, `replace(temporary, path)`, instead of
            `os.replace` (which first deletes an existing directory at
            `path` when a directory replaces it: not atomic). See
            `keras_attention.export` for an exchange that is.

    Yields:
        The temporary path to write to.

    Raises:
        OSError: when the temporary path cannot be created; errors of the
            block propagate after the temporary path is removed.
    """
    parent = os.path.dirname(os.path.abspath(path))
    prefix = f".{os.path.basename(path)}.tmp-"
    if directory:
        temporary = tempfile.mkdtemp(prefix=prefix, dir=parent)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o777 & ~umask)
    else:
        suffix = os.path.splitext(path)[1]
        handle, temporary = tempfile.mkstemp(prefix=prefix, suffix=suffix,
                                             dir=parent)
        os.close(handle)
        os.remove(temporary)  # Writers such as model.save expect no file.
    try:
        yield temporary
        if replace is not None:
            replace(temporary, path)
        else:
            if directory and os.path.isdir(path):
                shutil.rmtree(path)
            os.replace(temporary, path)
    except BaseException:
        _remove(temporary)
        raise
