"""The environment lock as the engine holds it: threads of this process take turns first, then the
cross-process file lock (`state.environment_lock`: flock, or a holder file where flock is unsupported).

While it is held, the holding thread's events wait for the `on_event` callbacks
(`events.hold`/`deliver`): a callback never runs under it, so one that blocks, or that calls
fastpath-hooks itself, cannot hold up an install or deadlock with it.
"""

from __future__ import annotations

import os
import threading
import time

from .. import events
from ..act.files import environment_state_dir
from ..act.locks import environment_lock


class LockUnavailable(Exception):
    """The install lock could not be created or was held too long by another process or thread."""


HELD_BEFORE = "held-before"   # beside the lock: a process has held it in this environment


def _first_holder(directory: str) -> bool:
    """Under the lock: whether this is its first holder in the environment (a marker is made then).
    Unsure (an unwritable directory): not the first - the caller reads the world again."""
    marker = os.path.join(directory, HELD_BEFORE)
    if os.path.exists(marker):
        return False
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except OSError:
        return False
    return True


class _InProcess:
    """One per process: which thread of it holds (or is taking) the environment lock, for which kernel."""

    def __init__(self):
        self.lock = threading.Lock()
        self.owner = None       # thread id
        self.kernel = None

    def after_fork(self) -> None:   # the holder (another thread of the parent) does not exist in a child
        self.__init__()


_turns = _InProcess()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_turns.after_fork)


class EnvironmentLock:
    """Hold the environment's install lock for `kernel`; say once when another process or thread holds it.

    `acquire()`/`release()` (a run holds it across several states), or a `with` block. Once taken:
    `waited` - another process or thread held it first; `first` - no process ever held it before in
    this environment (so none changed it: fastpath-hooks changes an environment only under this lock).
    The first holder leaves a marker beside the lock, made under the lock; the state directory may
    have been made by any of the racers, which moves site-packages' mtime - the machine's stamp -
    without anything having been installed."""

    def __init__(self, settings, kernel: str, directory: str | None = None):
        self.settings, self.kernel, self.lock = settings, kernel, None
        self.directory = directory      # the environment's state directory (default: act.files')
        self.waited = self.first = False

    def acquire(self) -> "EnvironmentLock":
        """Take it, or raise LockUnavailable. The lines saying that this waits are sent while no lock of
        ours is held (their callbacks run at once); from the moment this thread has its turn, its
        events wait for `release()`."""
        import filelock


        settings = self.settings
        directory = self.directory or environment_state_dir(settings)
        try:
            lock = environment_lock(settings, directory)
        except OSError as exc:
            raise LockUnavailable(f"cannot create the install lock: {exc}") from None
        deadline = time.monotonic() + settings.lock_timeout
        waited = False
        while True:
            self._take_turn(deadline)
            try:
                lock.acquire(timeout=max(0.0, deadline - time.monotonic()) if waited else 0)
                self.lock = lock
                self.first = _first_holder(directory)
                return self
            except filelock.Timeout:
                if waited:
                    raise LockUnavailable(f"another process held the install lock for {settings.lock_timeout:.0f} s "
                                          "(FASTPATH_HOOKS_LOCK_TIMEOUT)") from None
            except OSError as exc:
                raise LockUnavailable(f"cannot take the install lock {lock.lock_file}: {exc}") from None
            finally:
                if self.lock is None:
                    self._end_turn()
            events.status(f"{self.kernel}: waiting for another process that is installing or checking kernels "
                          f"(at most {settings.lock_timeout:.0f} s, FASTPATH_HOOKS_LOCK_TIMEOUT)", self.kernel,
                          once=f"wait-{self.kernel}")
            waited = self.waited = True

    def try_acquire(self) -> "EnvironmentLock | None":
        """Take it only if it is free now: no wait and no line; None when another thread of this process
        or another process holds it (install() does not wait for a running install: the imports do)."""
        import filelock


        directory = self.directory or environment_state_dir(self.settings)
        try:
            lock = environment_lock(self.settings, directory)
        except OSError:
            return None
        if _turns.owner == threading.get_ident() or not _turns.lock.acquire(blocking=False):
            return None
        _turns.owner, _turns.kernel = threading.get_ident(), self.kernel
        events.hold()
        try:
            lock.acquire(timeout=0)
        except (filelock.Timeout, OSError):
            self._end_turn()
            return None
        self.lock = lock
        self.first = _first_holder(directory)
        return self

    def _take_turn(self, deadline: float) -> None:
        """This thread's turn among the threads of this process (said once when another kernel has it)."""
        if _turns.owner == threading.get_ident():  # a bug of ours, not a wait: say it instead of hanging
            raise LockUnavailable(f"the install lock is already held by this thread (for {_turns.kernel})")
        if not _turns.lock.acquire(blocking=False):
            self.waited = True
            events.status(f"{self.kernel}: waiting for {_turns.kernel or 'another kernel'}, which this process is "
                          f"installing or checking (at most {self.settings.lock_timeout:.0f} s, "
                          "FASTPATH_HOOKS_LOCK_TIMEOUT)", self.kernel, once=f"wait-{self.kernel}-here")
            if not _turns.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise LockUnavailable(f"this process held the install lock for {self.settings.lock_timeout:.0f} s "
                                      "(FASTPATH_HOOKS_LOCK_TIMEOUT)")
        _turns.owner, _turns.kernel = threading.get_ident(), self.kernel
        events.hold()

    def _end_turn(self) -> None:
        _turns.owner = _turns.kernel = None
        _turns.lock.release()
        events.deliver()   # the callbacks, now that no lock of ours is held

    def release(self) -> None:
        if self.lock is None:
            return
        lock, self.lock = self.lock, None
        try:
            lock.release()
        finally:
            self._end_turn()

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc_info):
        self.release()
        return False
