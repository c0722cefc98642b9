"""The engine's world: everything a decision reads or changes outside the engine, behind one object.

The state machine and the jobs touch the world only through a `World`, so tests can hand them one that
answers from tables (tests/support/worlds.py). A World keeps its last readings: kernels decided while
nothing changed (its stamp says so) share one read. While the environment lock is held, the holding
thread's events wait for the `on_event` callbacks (events.hold/deliver): a callback cannot hold up an
install or deadlock with it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from typing import NamedTuple

import filelock

from .. import events
from .._names import cache_root_from_environ
from ..act.fetch import FetchError, fetch_into
from ..act.installer import InstallError, build_to_cache, install, uninstall
from ..act.locks import environment_lock
from ..act.store import VerdictCache, environment_signature
from ..act.transaction import JOURNAL, Transaction, environment_state_dir, recover
from ..act.verify import verify
from ..decide.plan import installer_choice
from ..decide.policy import Commands, decide
from ..facts.distributions import installed_versions
from ..facts.probe import after_install, probe, with_nvcc_version
from .context import complete, fingerprint, load
from .first_call import run_check as run_first_check


def snapshot(settings, pins):
    """(env, plan) for `doctor` and `plan`: what they show is what an install decides from - after the rollback
    of an install killed half-way, which the next start does first (its files were never verified)."""
    world = World()
    env, plan = world.read(settings, pins)
    killed = interrupted(settings, world)
    if killed and killed["running"] is False:
        dists = {n: v for n, v in env.distributions.items() if n not in killed["before"]}
        dists.update((n, v) for n, v in killed["before"].items() if v is not None)
        env = replace(env, distributions=dists)
        env, plan = world.complete(env, world.decide(env, settings, pins), settings, pins)
    return env, plan


def interrupted(settings, world=None) -> dict | None:
    """The install an install journal here is about (doctor): what, by whom, since when; `running` - its
    process holds the install lock now (or the lock cannot be had here); `before` - what its
    rollback restores (distribution -> version, None: absent); `left` - what it left on disk meanwhile. None
    without a journal."""
    world = world or World()
    state_dir = world.state_dir(settings)
    if not world.pending(settings):
        return None
    lock = world.lock(settings, "doctor")
    running = lock.try_acquire() is None   # its writer holds the lock while it lives
    try:
        tx = Transaction.pending(state_dir)
    finally:
        lock.release()
    if tx is None:
        return None
    now = installed_versions(tx.names)
    return {"journal": tx.journal_path, "description": tx.description, "pid": tx.pid, "started": tx.started,
            "running": running, "before": dict(tx.before),
            "left": {n: v for n, v in now.items() if v is not None and v != tx.before.get(n)}}


class InstallFailed(Exception):
    """An install, build or download did not happen; the environment is as it was."""


class NumericFailed(InstallFailed):
    """Rolled back: the kernel's numbers differ from torch's on this GPU (blocked there)."""


class Stamp(NamedTuple):
    """Whether the world may have changed since a read, cheaply: the warm signature and the wheel
    cache's directory (another process may have built into it)."""
    signature: str
    wheels: tuple | None


class Readings(dict):
    """The last few readings of one World - (env, plan) - by (captured variables, stamp)."""

    KEEP = 4
    _lock = threading.Lock()

    def put(self, key, reading: tuple) -> None:
        with self._lock:
            self.pop(key, None)
            self[key] = reading
            while len(self) > self.KEEP:
                self.pop(next(iter(self), None), None)


class World:
    """The real world. Every method is one thing the engine does outside itself."""

    def __init__(self):
        self.readings = Readings()
        self.batched: dict = {}   # kernel -> its Outcome, installed (or not) with another kernel by this process
        self.installed: dict = {}  # kernel -> its InstallResult, of the installs of this process, in their order

    def context(self, target: str | None = None):
        """(settings, pins, invalid): see context.load."""
        return load(target)

    def stamp(self, captured: tuple, signature: str | None = None) -> Stamp | None:
        """None while an install is pending here (a journal). `signature`: already computed for `captured`."""
        signature = signature or environment_signature(captured)
        if signature is None:
            return None
        try:
            st = os.stat(os.path.join(cache_root_from_environ(dict(captured)), "wheels"))
            listed = (st.st_mtime_ns, st.st_size)
        except OSError:
            listed = None
        return Stamp(signature, listed)

    def read(self, settings, pins, kernel=None):
        """(env, plan): the environment probed now and the policy's plan for it - the one read."""
        env = self.probe(settings, pins)
        return self.complete(env, self.decide(env, settings, pins), settings, pins, kernel)

    def complete(self, env, plan, settings, pins, kernel=None):
        """(env, plan) with nvcc's CUDA release where `kernel`'s decision needs it (the same objects when not)."""
        return complete(env, plan, settings, pins, decide=self.decide, kernel=kernel)

    def probe(self, settings, pins, *, nvcc: bool = False):
        env = probe(settings, pins=pins)
        return with_nvcc_version(env) if nvcc else env

    def decide(self, env, settings, pins, *, fresh: bool = False):
        """The policy's plan; `fresh`: as if no kernel were installed (a wheelhouse for another machine)."""
        return decide(env, settings, pins, fresh=fresh)

    def settle(self, env, settings, pins, result):
        """`env` after this process's own install, from the installer's last scan: no probe, no policy."""
        return after_install(env, settings, pins, result.scan) if result.scan else self.read(settings, pins)[0]

    def fingerprint(self, env, settings, pins, kernel: str) -> str:
        return fingerprint(env, settings, pins, kernel)

    def pending(self, settings) -> bool:
        """An install's journal is there (running in another process, or killed half-way)."""
        return os.path.exists(os.path.join(self.state_dir(settings), JOURNAL))

    def state_dir(self, settings) -> str:
        return environment_state_dir(settings)

    def lock(self, settings, kernel: str):
        return EnvironmentLock(settings, kernel, self.state_dir(settings))

    def recover(self, settings) -> None:
        """Roll back an install killed half-way and remove what killed runs left (lock held)."""
        recover(self.state_dir(settings))

    def cache(self, settings):
        return VerdictCache(settings)

    def verify(self, spec, *, timeout: float, env_extra=(), numeric=None, check=None, root=None, gpus=(), keyed=()):
        """The kernel imported in a child process, then its numbers (`numeric`) and its `check`."""
        return verify(spec, timeout=timeout, env_extra=env_extra, numeric=numeric, check=check, root=root, gpus=gpus,
                      keyed=keyed)

    def first_check(self, payload: dict, check: dict, *, started=None):
        """A kernel's check at its first call (engine/first_call.py): remembered, else run in the check child."""
        return run_first_check(payload, check, started=started)

    def installer(self, settings, env) -> tuple:
        """(installer name or None, why)."""
        return installer_choice(settings, env)

    def install(self, decision, *, settings, env, pins):
        """A lone kernel, as a batch of one: its InstallResult, or InstallFailed (NumericFailed), rolled back."""
        done = self.install_batch((decision,), settings=settings, env=env, pins=pins)
        if decision.kernel in done.results:
            return done.results[decision.kernel]
        why = done.failed.get(decision.kernel, "not installed")
        raise (NumericFailed if decision.kernel in done.numeric else InstallFailed)(why)

    def install_batch(self, decisions, *, settings, env, pins):
        """The kernels of one request in one transaction, checked in one child (lock held): its Installed."""
        try:
            done = install(decisions, settings=settings, env=env, pins=pins, commands=Commands.of(settings, env, pins),
                           state_dir=self.state_dir(settings))
        except InstallError as exc:
            raise InstallFailed(str(exc)) from None
        for kernel, result in done.results.items():
            self.installed.pop(kernel, None)
            self.installed[kernel] = result
        return done

    def uninstall(self, kernel: str, *, settings, why: str) -> list:
        """Remove what this process's install of `kernel` added (lock held): what was done, or InstallFailed
        (restored)."""
        result = self.installed[kernel]
        try:
            done = uninstall(result.added, state_dir=self.state_dir(settings), description=f"removal of {kernel} ({why})")
        except InstallError as exc:
            raise InstallFailed(str(exc)) from None
        del self.installed[kernel]
        return done

    def download(self, dest: str, *, env, settings, binary, wheels) -> list:
        """`fastpath-hooks download`: requirements and wheel files for `env`'s machine into `dest`."""
        try:
            return fetch_into(dest, env=env, settings=settings, binary=binary, wheels=wheels)
        except FetchError as exc:
            raise InstallFailed(str(exc)) from None

    def build(self, decision, *, settings, env, pins) -> list:
        """`fastpath-hooks build`: the decision's source builds into the wheel cache (lock held)."""
        try:
            return build_to_cache(decision, settings=settings, env=env, pins=pins,
                                  commands=Commands.of(settings, env, pins), state_dir=self.state_dir(settings))
        except InstallError as exc:
            raise InstallFailed(str(exc)) from None


class LockUnavailable(InstallFailed):
    """The install lock could not be created or was held too long by another process or thread."""


HELD_BEFORE = "held-before"   # beside the lock: a process has held it in this environment


class _Turns:
    """Which thread of this process holds (or is taking) the environment lock, for which kernel."""

    def __init__(self):
        self.lock = threading.Lock()
        self.owner = self.kernel = None


_turns = _Turns()
if hasattr(os, "register_at_fork"):   # the holder (another thread of the parent) does not exist in a child
    os.register_at_fork(after_in_child=_turns.__init__)


class EnvironmentLock:
    """The environment's install lock for `kernel`: the threads of this process take turns, then the
    cross-process file lock (act/locks.py). Once taken: `waited` - another held it first; `first` - no
    process held it before in this environment, so none changed it (the state directory the racers made
    moved site-packages' mtime, the stamp, with nothing installed). Its first holder leaves a marker."""

    def __init__(self, settings, kernel: str, directory: str):
        self.settings, self.kernel, self.directory = settings, kernel, directory
        self.lock, self.waited, self.first = None, False, False

    def acquire(self) -> "EnvironmentLock":
        """Take it, or raise LockUnavailable. The waiting lines are sent while no lock of ours is held;
        from this thread's turn on, its events wait for `release()`."""
        settings = self.settings
        try:
            lock = environment_lock(settings, self.directory)
        except OSError as exc:
            raise LockUnavailable(f"cannot create the install lock: {exc}") from None
        deadline = time.monotonic() + settings.lock_timeout
        waited = False
        while True:
            self._take_turn(deadline)
            try:
                lock.acquire(timeout=max(0.0, deadline - time.monotonic()) if waited else 0)
                return self._hold(lock)
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
        """Take it only if it is free now, without a line; None when another thread or process holds it
        (install() does not wait for a running install: the imports do)."""
        try:
            lock = environment_lock(self.settings, self.directory)
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
        return self._hold(lock)

    def _hold(self, lock) -> "EnvironmentLock":
        """Held: the first holder in this environment makes the marker (unsure, unwritable: not the first)."""
        self.lock = lock
        marker = os.path.join(self.directory, HELD_BEFORE)
        if not os.path.exists(marker):
            try:
                os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                self.first = True
            except OSError:
                pass
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

    __enter__ = acquire

    def __exit__(self, *exc_info):
        self.release()
