"""The one way to take a cross-process lock (`file_lock`), and the environment's install lock.

flock where the filesystem has it (filelock cannot be left to find out: 3.12 raises or retries until the timeout,
newer releases fall back to a lock that never recovers from a dead holder). Elsewhere (Lustre without `-o flock`,
some NFS) a `HolderLock`: an O_EXCL file naming its holder, touched every REFRESH_S, broken - under a second lock,
after reading it again - when the holder is provably dead, or untouched for STALE_AFTER_S on another host.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import os
import tempfile
import threading
import time

from .. import events
from ..facts.host import boot_id, process_stat
from .transaction import environment_state_dir


def environment_lock(settings, directory: str | None = None):
    return file_lock(os.path.join(directory or environment_state_dir(settings), "install.lock"),
                     timeout=settings.lock_timeout)


def file_lock(path: str, *, timeout: float):
    """filelock.FileLock (the OS releases it if the holder dies), else a HolderLock at `path`.holder."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    if flock_works(directory):
        import filelock

        return filelock.FileLock(path, timeout=timeout)

    events.status(f"{directory} does not support flock (Lustre without -o flock?); using a lock file "
                  f"with stale-holder recovery", once=f"no-flock:{os.stat(directory).st_dev}")  # once per filesystem
    return HolderLock(path + ".holder", timeout=timeout)


REFRESH_S = 5.0          # the holder touches its lock file this often
STALE_AFTER_S = 60.0     # untouched this long (another host's holder): it is gone
_BREAK_STALE_S = 10.0    # breaking takes milliseconds; a breaker lock older than this was abandoned
_MAX_POLL_S = 1.0        # a waiter looks at least this often
_NO_FLOCK = {errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}


def flock_works(directory: str) -> bool:
    return _flock_works(os.path.realpath(directory))


@functools.lru_cache(maxsize=None)   # asked once per directory and process
def _flock_works(directory: str) -> bool:
    fd, probe = tempfile.mkstemp(prefix=".flock-probe-", dir=directory)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except OSError as exc:
        return exc.errno not in _NO_FLOCK
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)


def _start_time(pid: int) -> str | None:
    """Clock ticks since boot: with the boot id, it tells a reused pid from the holder."""
    stat = process_stat(pid)
    return str(stat[2]) if stat else None


def _machine() -> dict:
    pidns = os.readlink("/proc/self/ns/pid") if os.path.islink("/proc/self/ns/pid") else None
    return {"host": os.uname().nodename, "boot": boot_id(), "pidns": pidns}


def holder_record() -> dict:
    pid = os.getpid()
    return dict(_machine(), pid=pid, start=_start_time(pid), time=time.time())


def holder_is_dead(record: dict, mtime: float, now: float | None = None) -> bool:
    """On the same machine (host, boot, pid namespace): its pid is gone or another process's; elsewhere: not
    touched for STALE_AFTER_S."""
    now = time.time() if now is None else now
    here = _machine()
    pid = record.get("pid")
    if (isinstance(pid, int) and pid > 0 and here["host"] is not None and here["boot"] is not None
            and all(record.get(k) == here[k] for k in ("host", "boot", "pidns"))):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # another user's live process
            pass
        start = _start_time(pid)
        return start is not None and record.get("start") is not None and start != record["start"]
    return now - mtime > STALE_AFTER_S


class HolderLock:
    """filelock.FileLock's surface where the callers use it (re-entrant; not to be shared between threads)."""

    def __init__(self, lock_file: str, timeout: float = -1):
        self.lock_file = lock_file
        self.timeout = timeout
        self._fd: int | None = None
        self._count = 0
        self._stop = None
        self._guard = None

    @property
    def is_locked(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout: float | None = None, poll_interval: float = 0.05):
        import filelock

        if self._fd is not None:
            self._count += 1
            return self
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout if timeout is not None and timeout >= 0 else None
        pause = poll_interval
        while not self._create():
            if self._break_if_dead():
                continue
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise filelock.Timeout(self.lock_file)
            time.sleep(pause if left is None else min(pause, left))
            pause = min(pause * 1.5, _MAX_POLL_S)  # many waiters on one metadata server: back off
        self._count = 1
        self._start_heartbeat()
        return self

    def release(self, force: bool = False) -> None:
        if self._fd is None:
            return
        self._count = 0 if force else self._count - 1
        if self._count > 0:
            return
        fd, self._fd = self._fd, None
        if self._stop is not None:
            self._stop.set()
        with self._guard or contextlib.nullcontext():
            try:
                mine = os.fstat(fd).st_ino == os.stat(self.lock_file).st_ino
            except OSError:
                mine = False
            os.close(fd)
        if mine:  # never remove a lock someone else holds now
            with contextlib.suppress(OSError):
                os.unlink(self.lock_file)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.release(force=True)

    def _create(self) -> bool:
        try:
            fd = os.open(self.lock_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, json.dumps(holder_record()).encode())
        except OSError:
            os.close(fd)
            os.unlink(self.lock_file)
            raise
        self._fd = fd
        return True

    def _start_heartbeat(self) -> None:
        self._stop, self._guard = threading.Event(), threading.Lock()
        fd, stop, guard = self._fd, self._stop, self._guard

        def touch():
            while not stop.wait(REFRESH_S):
                with guard:
                    if stop.is_set():
                        return
                    with contextlib.suppress(OSError):
                        os.utime(fd)

        threading.Thread(target=touch, name="fastpath-hooks lock heartbeat", daemon=True).start()

    def _break_if_dead(self) -> bool:
        """True when the lock file of a dead holder was removed (under the breaker lock, after reading it again)."""
        if not self._holder_dead():
            return False
        breaker = self.lock_file + ".break"
        try:
            fd = os.open(breaker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            with contextlib.suppress(OSError):
                if time.time() - os.stat(breaker).st_mtime > _BREAK_STALE_S:
                    os.unlink(breaker)  # a breaker that died half-way
            return False
        try:
            dead = self._holder_dead()
            with contextlib.suppress(OSError):
                if dead and os.stat(self.lock_file).st_ino == dead:
                    os.unlink(self.lock_file)
            return bool(dead)
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(breaker)

    def _holder_dead(self):
        """The lock file's inode when its holder is dead, else 0 (an unreadable record: only its age tells)."""
        try:
            fd = os.open(self.lock_file, os.O_RDONLY)
        except OSError:
            return 0
        try:
            st = os.fstat(fd)  # after open(): fresh attributes on NFS (close-to-open)
            raw = os.read(fd, 4096)
        except OSError:
            return 0
        finally:
            os.close(fd)
        try:
            record = json.loads(raw.decode())
        except ValueError:
            record = None
        return st.st_ino if holder_is_dead(record if isinstance(record, dict) else {}, st.st_mtime) else 0
