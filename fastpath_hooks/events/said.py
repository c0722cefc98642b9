"""What was said already: once per process (`once` keys), and once per environment (`persist`
keys: a marker in the cache directory, so a line that would repeat at every start - a skip, a
remembered failure - is said once; later starts log it at debug). `fastpath-hooks doctor
--refresh` forgets the markers (`forget_said`)."""

from __future__ import annotations

import os
import threading  # loaded with logging (events) anyway

from .._environ import environment_key

_said: set = set()
_said_lock = threading.Lock()   # "once" is checked and claimed in one step (several threads decide kernels)


def claim(key: str) -> bool:
    """True the first time `key` is claimed in this process."""
    with _said_lock:
        if key in _said:
            return False
        _said.add(key)
        return True


def forget() -> None:
    """Forget which one-time lines this process said (uninstall() starts afresh)."""
    _said.clear()


def said_dir(environ=None) -> str:
    """Where the lines said once per environment are remembered (beside the verdict cache)."""
    from .._environ import cache_root_from_environ

    return os.path.join(cache_root_from_environ(os.environ if environ is None else environ), "said",
                        environment_key())


def first_time(key: str) -> bool:
    """Claim `key` for this environment (atomically: concurrent processes claim it once); True
    when no process said it before. An unwritable cache says it every time, as before."""
    import hashlib

    path = os.path.join(said_dir(), hashlib.sha256(key.encode()).hexdigest()[:24])
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    except OSError:
        return True
    return True


def forget_said(environ=None) -> bool:
    """Forget the lines said once in this environment (`doctor --refresh`)."""
    import shutil

    directory = said_dir(environ)
    existed = os.path.isdir(directory)
    shutil.rmtree(directory, ignore_errors=True)
    return existed
