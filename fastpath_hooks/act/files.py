"""Files written whole or not at all, and their digests: the one way the act layer replaces a
file (the verdict cache, the journal, the wheel cache and its sidecars, a wheelhouse export).

A temporary file in the target's directory, flushed and fsynced, then renamed over the target:
a reader sees the old file or the new one, never half of one; a failure (or Ctrl-C) removes the
temporary file and leaves the target as it was.

Where an environment's own state lives: the install lock and the journal of a running install.

They sit inside the environment they protect (next to site-packages), so every process and
every user of a shared environment - NFS included - sees the same ones; where site-packages
is not writable, under the cache root, keyed by the environment. (The verdicts are per user:
act/store.py; the lock itself: act/locks.py.)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

from .._names import JOURNAL, STATE_DIR_NAME, cache_root, environment_key
from ..facts.distributions import site_packages


def atomic_write(path: str, write, *, binary: bool = False, suffix: str = "") -> None:
    """Replace `path` with what `write(file)` writes (its directory made if absent)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=directory)
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_json(path: str, data) -> None:
    atomic_write(path, lambda fh: json.dump(data, fh, indent=1, sort_keys=True), suffix=".json")


def atomic_copy(src: str, dst: str) -> None:
    """Copy `src` to `dst` atomically."""
    with open(src, "rb") as source:
        atomic_write(dst, lambda out: shutil.copyfileobj(source, out, 1 << 20), binary=True,
                     suffix=os.path.splitext(dst)[1])


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


__all__ = ("JOURNAL", "STATE_DIR_NAME", "environment_state_dir")


def environment_state_dir(settings) -> str:
    """`.fastpath-hooks/` beside site-packages when writable, else under the cache root."""
    site = site_packages()
    if os.access(site, os.W_OK):
        return os.path.join(site, STATE_DIR_NAME)
    return os.path.join(cache_root(settings), "envs", environment_key())
