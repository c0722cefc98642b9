"""The engine: `ensure(kernel)` decides a kernel once per process - the one entry point of the hooks.

It never raises into the caller: every failure ends as an Outcome that leaves the import on
transformers' working torch path, with one clear line (one process per node, see events.py).

- Run once per kernel (`_Registry`): the first caller of a kernel runs its decision in its own
  thread; concurrent callers of the same kernel wait for that result (a future); callers of
  other kernels go on. No lock of ours is held while a kernel is decided or waited for, or while
  an `on_event` callback runs. A wait that would close a circle (a callback of fla's run asking
  for fla, or two runs asking for each other) is not made: that caller gets a `pending` outcome.
- The warm path (here): a good outcome recorded under this environment's signature
  (`act/store.py`: interpreter, installed distributions, FASTPATH_HOOKS_* and GPU facts, read
  without importing anything heavy) answers at once - no settings, pins, probe or policy
  modules are imported, no subprocess starts, the state machine is not even loaded.
- Otherwise `machine.run(kernel, ...)`: the explicit state machine read -> needs -> cached? -> lock
  -> check -> verify / install -> record, which reaches everything outside the engine through
  this process's `World` (world.py: one read of the world per request, read again only when it
  changed while waiting for the lock). `context.py` holds what a decision is made from;
  `outcome.py` the Outcome and the lines it is said in; `machine.py` the states, the install of a
  kernel with the others of its request included; `jobs.py` the rollback of an install killed
  half-way and the ahead-of-time jobs (`fastpath-hooks build` and `download`). docs/architecture.md draws the whole flow.
"""

from __future__ import annotations

import os
import sys
import threading  # loaded with logging (events) anyway

from .. import events
from .outcome import Outcome, OutcomeState, apply_env

_CONTEXT = ("load_context", "bad_settings", "check_settings", "unusable_cache_dir", "value_once", "fingerprint",
            "verdict_distributions")

__all__ = ("Outcome", "OutcomeState", "before_import", "current_world", "ensure", "expect", "expect_from", "forget",
           "outcomes", "simulation", "snapshot", "use_world") + _CONTEXT


def __getattr__(name: str):
    """The context functions the CLI and the hooks use (`from fastpath_hooks.engine import snapshot`),
    loaded when first asked for: not on the warm path."""
    if name in _CONTEXT:
        from . import context

        return getattr(context, name)
    if name == "snapshot":
        from .world import snapshot

        return snapshot
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def before_import(kernel: str) -> str | None:
    return ensure(kernel).block


def ensure(kernel: str, *, target: str | None = None, now: bool = False) -> Outcome:
    """The kernel's outcome in this process: decided by the first caller, waited for by the others.
    `target`: decide it for a posed machine (`fastpath-hooks install --target`), as
    FASTPATH_HOOKS_TARGET would - a parameter, never written into the environment.
    `now`: a command the user typed (`fastpath-hooks install`) - a failure remembered from an earlier
    attempt is tried again now, for the kernels it needs too; it only spares interpreter starts."""
    while True:
        future, mine = _registry.claim((kernel, target))
        if not mine:
            outcome = _registry.wait(future)
            if outcome is not None:
                return outcome
            continue  # its runner gave up (an exception such as Ctrl-C went through it): claim it again
        finished = False
        try:
            outcome, simulated, wants = _decide(kernel, target, now)
            _registry.finish(future, outcome, simulated)
            finished = True
        finally:
            if not finished:
                _registry.abandon(future)
        for backend in wants:   # after this kernel is decided (they need it), before its import goes on
            ensure(backend, target=target, now=now)
        return outcome


def outcomes() -> dict:
    """kernel -> Outcome of every kernel decided in this process."""
    return _registry.outcomes()


def simulation(kernel: str | None = None) -> str | None:
    """The accelerator kind ("cuda"/"xpu") that FASTPATH_HOOKS_TARGET poses for `kernel`'s decision (any
    decided kernel's when None) and this machine lacks: wrapped gates then answer as on the posed machine."""
    return _registry.simulated(kernel)


def forget() -> None:
    """Forget every decision of this process (uninstall()): the next ensure() decides again."""
    _registry.clear()
    _expected.clear()
    hub = sys.modules.get(__name__ + ".hub")
    if hub is not None:
        hub.forget()
    if _world is not None:
        _world.readings.clear()
        _world.batched.clear()
    events.forget()


# -- the request: which kernels are asked for together ---------------------------------------

_expected: set = set()      # kernels said to be coming in this process (`fastpath-hooks install A B`)
_providers: list = []       # callables -> kernels about to be asked for (the hooks': a modeling import's)


def expect(kernels) -> None:
    """Say that these kernels will be asked for in this process: a kernel that installs first takes
    the others along where it can (their builds side by side, one installer call, one check)."""
    _expected.update(kernels)


def expect_from(provider) -> None:
    """Register `provider()` -> kernel names about to be asked for, called only when a kernel is about
    to be installed (the hooks register one that reads the modeling module being imported)."""
    if provider not in _providers:
        _providers.append(provider)


def _request(target):
    """The world.Request of a decision for `target`: the kernels being ensured now (in any thread)
    and those expected, and the ones already decided usable."""
    from .outcome import GOOD
    from .world import Request

    kernels = set(_expected) | _registry.running(target)
    for provider in list(_providers):
        try:
            kernels.update(provider() or ())
        except Exception as exc:  # a hint only: never in the way of the install
            events.debug(f"request hint failed: {type(exc).__name__}: {exc}")
    good = {k for k, o in _registry.outcomes().items() if o.state in GOOD}
    return Request(frozenset(kernels), frozenset(good))


# -- run once per kernel ---------------------------------------------------------------------

class _Future:
    """One kernel's decision in this process: run by the thread that claimed it, waited for by the others."""

    __slots__ = ("key", "kernel", "owner", "done", "outcome", "simulated")

    def __init__(self, key: tuple, owner: int):
        self.key, self.kernel, self.owner = key, key[0], owner
        self.done = threading.Event()
        self.outcome = None     # None once done: abandoned, to be claimed again
        self.simulated = None


class _Registry:
    """The per-kernel results of this process, owned by the engine: the only place they live.

    One short lock guards the tables; it is never held while a kernel is decided, while a
    caller waits, or while a callback runs."""

    def __init__(self):
        self._lock = threading.Lock()
        self._futures: dict = {}    # (kernel, target) -> _Future (running or done)
        self._waiting: dict = {}    # thread id -> the _Future it waits for (to refuse a circular wait)

    def claim(self, key: tuple):
        """(future, True) to run (kernel, target) in this thread, or (the existing future, False)."""
        me = threading.get_ident()
        with self._lock:
            future = self._futures.get(key)
            if future is not None:
                return future, False
            future = self._futures[key] = _Future(key, me)
            return future, True

    def wait(self, future: _Future) -> Outcome | None:
        """Its outcome - at once when done, else when its runner finishes; None when the runner gave
        up; a `pending` outcome when waiting would never end (this thread is, directly or through
        threads that wait for each other, the one running it)."""
        if future.done.is_set():
            return future.outcome
        me = threading.get_ident()
        with self._lock:
            owner, seen = future.owner, set()
            while owner != me and owner not in seen:   # follow who waits for whom, to this thread or an end
                seen.add(owner)
                awaited = self._waiting.get(owner)
                if awaited is None or awaited.done.is_set():  # running, or about to wake up
                    break
                owner = awaited.owner
            circle = owner == me
            if not circle:
                self._waiting[me] = future
        if circle:  # said outside the lock: a callback may call ensure() again
            events.debug(f"{future.kernel}: asked for from inside its own decision (an on_event callback, or "
                         "decisions that wait for each other); answered 'pending', not waited for", future.kernel)
            return Outcome(future.kernel, OutcomeState.PENDING, "being decided by this thread (asked for from inside its own "
                                                     "decision)")
        try:
            future.done.wait()
        finally:
            with self._lock:
                self._waiting.pop(me, None)
        return future.outcome

    def finish(self, future: _Future, outcome: Outcome, simulated: str | None) -> None:
        future.outcome, future.simulated = outcome, simulated
        future.done.set()

    def abandon(self, future: _Future) -> None:
        with self._lock:
            if self._futures.get(future.key) is future:
                del self._futures[future.key]
        future.done.set()   # its waiters claim the kernel again

    def outcomes(self) -> dict:
        with self._lock:
            futures = list(self._futures.values())
        return {f.kernel: f.outcome for f in futures if f.done.is_set() and f.outcome is not None}

    def running(self, target) -> set:
        """The kernels being decided for `target` now (claimed, not done)."""
        with self._lock:
            return {f.kernel for f in self._futures.values() if f.key[1] == target and not f.done.is_set()}

    def simulated(self, kernel: str | None) -> str | None:
        with self._lock:
            futures = [f for f in self._futures.values() if kernel is None or f.kernel == kernel]
        return next((f.simulated for f in futures if f.done.is_set() and f.simulated), None)

    def clear(self) -> None:
        """Forget every decision (runs in flight finish for their own callers only)."""
        with self._lock:
            self._futures = {}

    def after_fork(self) -> None:
        """In a forked child: the decisions made are kept; one running in another thread of the parent never
        finishes here (that thread is gone), so it is forgotten, to be decided again when asked."""
        self._lock = threading.Lock()
        self._waiting = {}
        self._futures = {k: f for k, f in self._futures.items() if f.done.is_set() and f.outcome is not None}


_registry = _Registry()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_registry.after_fork)


# -- one decision: the warm verdict, else the state machine ---------------------------------

def _decide(kernel: str, target: str | None, now: bool = False):
    """(Outcome, simulated accelerator kind, the backends to ensure next); never raises an Exception.
    A warm hit ensures no backend: one that is installed is decided when the kernel it serves looks
    for it (the finder watches its module), and one that is not had its chance under this signature."""
    try:
        from ..act.store import signature_environ

        captured = signature_environ(target=target)   # before this decision sets any variable
        signature, warm = _warm(kernel, captured)
        if warm is not None:
            return warm + ((),)
        from . import machine
        from .outcome import GOOD

        run = machine.run(kernel, needs=lambda other: ensure(other, target=target, now=now), world=current_world(),
                          captured=captured, target=target, signature=signature, request=lambda: _request(target),
                          now=now)
        wants = run.decision.wants if run.decision is not None and run.outcome.state in GOOD else ()
        return run.outcome, _simulated(run.posed), wants
    except Exception as exc:  # never into the user's import
        outcome = Outcome(kernel, OutcomeState.ERROR, f"internal error: {type(exc).__name__}: {exc}")
        events.error(f"{kernel}: {outcome.reason}; leaving it as it is", kernel, once="internal")
        return outcome, None, ()


def _warm(kernel: str, captured: tuple):
    """(the signature, (the recorded good Outcome, simulated kind) or None: a miss, or anything odd -
    then the machine decides)."""
    from ..act import store

    try:
        signature = store.environment_signature(captured)
        entry = store.get_warm(captured, kernel, signature) if signature else None
    except Exception as exc:  # e.g. a deleted working directory: only the shortcut is lost
        events.debug(f"{kernel}: no cached verdict ({type(exc).__name__}: {exc})", kernel)
        return None, None
    if entry is None:
        return signature, None
    apply_env(kernel, entry.get("env") or (), entry.get("reason", ""))
    events.debug(f"{kernel}: {entry['reason']} (verdict cached for this environment; nothing probed)", kernel)
    return signature, (Outcome(kernel, OutcomeState.OK, entry["reason"]), _simulated(entry.get("posed")))


_world = None


def current_world():
    """The World every decision of this process reads and changes (world.py)."""
    global _world
    if _world is None:
        from .world import World

        _world = World()
    return _world


def use_world(world):
    """Decide from now on in `world` (None: the real one again), forgetting the decisions made so far;
    returns the World used before. The engine's one seam: tests hand it a World whose installer or
    verification is a stand-in (tests/support/worlds.py)."""
    global _world
    before, _world = _world, world
    forget()
    return before


def _simulated(posed: str | None) -> str | None:
    """The posed accelerator kind when this machine does not really have it (dry runs, tests)."""
    if posed is None:
        return None
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.xpu.is_available() if posed == "xpu" else torch.cuda.is_available():
                return None
        except Exception:
            pass
    return posed
