"""The one way fastpath-hooks takes a cross-process lock, and the environment's install lock."""

from __future__ import annotations

import os


def environment_lock(settings, directory: str | None = None):
    """One cross-process lock per environment (see file_lock), in its state directory."""
    from .state import environment_state_dir

    directory = directory or environment_state_dir(settings)
    os.makedirs(directory, exist_ok=True)
    return file_lock(os.path.join(directory, "install.lock"), timeout=settings.lock_timeout)


def file_lock(path: str, *, timeout: float):
    """flock where the filesystem supports it (filelock.FileLock: the OS releases it if the
    holder dies). Where it does not (Lustre without `-o flock`, some NFS), a lock file that
    names its holder and is recovered from a dead one (softlock.HolderLock, at `path`.holder),
    said once per filesystem. Either way: acquire(timeout=...)/release(), a context manager,
    `.lock_file`, filelock.Timeout on timeout.
    """
    from . import softlock

    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    if softlock.flock_works(directory):
        import filelock

        return filelock.FileLock(path, timeout=timeout)
    from .. import events

    events.status(f"{directory} does not support flock (Lustre without -o flock?); using a lock file "
                  f"with stale-holder recovery", once=f"no-flock:{os.stat(directory).st_dev}")  # once per filesystem
    return softlock.HolderLock(path + ".holder", timeout=timeout)
