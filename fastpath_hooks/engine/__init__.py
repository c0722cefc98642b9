"""The engine: `ensure(kernel)` decides a kernel once per process - the one entry point of the hooks.

It never raises into the caller: a failure ends as an Outcome that leaves the import on transformers'
torch path. The first caller of a kernel decides it; concurrent callers of it wait (a future), no lock
of ours held meanwhile; a wait that would close a circle (a callback asking for the kernel being
decided) gets a `pending` outcome. A good outcome recorded under this environment's signature
(act/store.py) answers at once, loading nothing else (the warm path); otherwise machine.run decides,
reaching the outside through this process's World (world.py: one read of the world per request).
"""

from __future__ import annotations

import os
import sys
import threading  # the futures; torch and transformers load it long before a kernel import

from .. import events
from .outcome import GOOD, Outcome, OutcomeState, apply_env

_CONTEXT = ("load_context", "check_settings", "value_once", "fingerprint")

__all__ = ("Outcome", "OutcomeState", "current_world", "ensure", "expect", "expect_from", "forget",
           "outcomes", "settle", "simulation", "snapshot", "use_world") + _CONTEXT


def __getattr__(name: str):
    """The CLI's and the hooks' context functions, loaded when first asked for: not on the warm path."""
    if name in _CONTEXT:
        from . import context

        return getattr(context, name)
    if name == "snapshot":
        from .world import snapshot

        return snapshot
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def ensure(kernel: str, *, target: str | None = None, now: bool = False) -> Outcome:
    """The kernel's outcome in this process. `target`: decide it for a posed machine (`install --target`)
    without writing FASTPATH_HOOKS_TARGET; `now`: a command the user typed - remembered failures are tried again."""
    while True:
        future, mine = _registry.claim((kernel, target))
        if not mine:
            outcome = _registry.wait(future)
            if outcome is not None:
                return outcome
            continue  # its runner gave up (an exception such as Ctrl-C went through it): claim it again
        finished = False
        try:
            outcome, wants = _decide(kernel, target, now)
            future.outcome = outcome
            future.done.set()
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


def settle(kernel: str, why: str, *, numeric: bool = True) -> None:
    """A kernel found unusable after its decision (its check at the first call failed, or could not run): blocked
    from now on in this process (a fresh import fails, the late pass rebinds to the torch path)."""
    from .said import first_call_blocked

    _registry.replace(kernel, first_call_blocked(kernel, why, numeric=numeric))


_simulated = None   # the accelerator kind a FASTPATH_HOOKS_TARGET posed and this machine lacks


def simulation() -> str | None:
    """The accelerator kind ("cuda"/"xpu") a decision of this process posed and this machine lacks:
    wrapped gates then answer as on the posed machine (dry runs, tests)."""
    return _simulated


def _pose(posed: str | None) -> None:
    global _simulated
    torch = sys.modules.get("torch")
    try:
        if posed is None or (torch is not None and (torch.xpu if posed == "xpu" else torch.cuda).is_available()):
            return
    except Exception:   # a broken torch: the posed kind is simulated
        pass
    _simulated = posed


def forget() -> None:
    """Forget every decision of this process (uninstall()): the next ensure() decides again."""
    global _simulated
    _registry.clear()
    _expected.clear()
    _simulated = None
    hub = sys.modules.get(__name__ + ".hub")
    if hub is not None:
        hub.forget()
    if _world is not None:
        _world.readings.clear()
        _world.batched.clear()
        _world.installed.clear()
    events.forget()


# -- the request: which kernels are asked for together ---------------------------------------

_expected: set = set()      # kernels said to be coming in this process (`fastpath-hooks install A B`)
_providers: list = []       # callables -> kernels about to be asked for (the hooks': a modeling import's)


def expect(kernels) -> None:
    """These kernels will be asked for in this process: the first to install takes the others along."""
    _expected.update(kernels)


def expect_from(provider) -> None:
    """`provider()` -> kernel names about to be asked for, called only when a kernel is about to be installed."""
    if provider not in _providers:
        _providers.append(provider)


def _request(target) -> tuple:
    """(the kernels of this request: being ensured now or expected, those already decided usable)."""
    kernels = set(_expected) | _registry.running(target)
    for provider in list(_providers):
        try:
            kernels.update(provider() or ())
        except Exception as exc:  # a hint only: never in the way of the install
            events.debug(f"request hint failed: {type(exc).__name__}: {exc}")
    good = {k for k, o in _registry.outcomes().items() if o.state in GOOD}
    return frozenset(kernels), frozenset(good)


# -- run once per kernel ---------------------------------------------------------------------

class _Future:
    """One kernel's decision: run by the thread that claimed it, waited for by the others."""

    __slots__ = ("key", "kernel", "owner", "done", "outcome")

    def __init__(self, key: tuple, owner: int):
        self.key, self.kernel, self.owner = key, key[0], owner
        self.done = threading.Event()
        self.outcome = None     # None once done: abandoned, to be claimed again


class _Registry:
    """The per-kernel results of this process. One short lock guards the tables; it is never held
    while a kernel is decided, while a caller waits, or while a callback runs."""

    def __init__(self):
        self._lock = threading.Lock()
        self._futures: dict = {}    # (kernel, target) -> _Future (running or done)
        self._waiting: dict = {}    # thread id -> the _Future it waits for (to refuse a circular wait)

    def claim(self, key: tuple):
        """(future, True) to run (kernel, target) in this thread, or (the existing future, False)."""
        with self._lock:
            future = self._futures.get(key)
            if future is not None:
                return future, False
            future = self._futures[key] = _Future(key, threading.get_ident())
            return future, True

    def wait(self, future: _Future) -> Outcome | None:
        """Its outcome once done; None when its runner gave up; `pending` when waiting would never end
        (this thread is, directly or through threads waiting for each other, the one running it)."""
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
            return Outcome(future.kernel, OutcomeState.PENDING,
                           "being decided by this thread (asked for from inside its own decision)")
        try:
            future.done.wait()
        finally:
            with self._lock:
                self._waiting.pop(me, None)
        return future.outcome

    def abandon(self, future: _Future) -> None:
        with self._lock:
            if self._futures.get(future.key) is future:
                del self._futures[future.key]
        future.done.set()   # its waiters claim the kernel again

    def outcomes(self) -> dict:
        with self._lock:
            futures = list(self._futures.values())
        return {f.kernel: f.outcome for f in futures if f.done.is_set() and f.outcome is not None}

    def replace(self, kernel: str, outcome: Outcome) -> None:
        with self._lock:
            for future in self._futures.values():
                if future.kernel == kernel and future.done.is_set():
                    future.outcome = outcome

    def running(self, target) -> set:
        with self._lock:
            return {f.kernel for f in self._futures.values() if f.key[1] == target and not f.done.is_set()}

    def clear(self) -> None:
        """Forget every decision (runs in flight finish for their own callers only)."""
        with self._lock:
            self._futures = {}

    def after_fork(self) -> None:
        """In a forked child a decision running in another thread of the parent never finishes: forgotten."""
        self._lock = threading.Lock()
        self._waiting = {}
        self._futures = {k: f for k, f in self._futures.items() if f.done.is_set() and f.outcome is not None}


_registry = _Registry()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_registry.after_fork)


# -- one decision: the warm verdict, else the state machine ---------------------------------

def _decide(kernel: str, target: str | None, now: bool = False):
    """(Outcome, the backends to ensure next); never raises an Exception. A warm hit ensures no backend:
    an installed one is decided when its kernel looks for it, and one that is not had its chance."""
    try:
        from ..act import store

        captured = store.signature_environ(target=target)   # before this decision sets any variable
        try:
            signature = store.environment_signature(captured)
            entry = store.get_warm(captured, kernel, signature) if signature else None
        except Exception as exc:  # e.g. a deleted working directory: only the shortcut is lost
            events.debug(f"{kernel}: no cached verdict ({type(exc).__name__}: {exc})", kernel)
            signature = entry = None
        if entry is not None:
            apply_env(kernel, entry.get("env") or (), entry.get("reason", ""))
            events.debug(f"{kernel}: {entry['reason']} (verdict cached for this environment; nothing probed)", kernel)
            _pose(entry.get("posed"))
            held = entry.get("first_call")
            if isinstance(held, dict):   # its check waits for the first call: a remembered pass answers it then
                from .first_call import FirstCall

                held = FirstCall(held, current_world().first_check)
            return Outcome(kernel, OutcomeState.OK, entry["reason"], first_call=held or None), ()
        from . import machine

        run = machine.run(kernel, needs=lambda other: ensure(other, target=target, now=now), world=current_world(),
                          captured=captured, target=target, signature=signature, request=lambda: _request(target),
                          now=now)
        _pose(run.posed)
        return run.outcome, run.decision.wants if run.decision is not None and run.outcome.state in GOOD else ()
    except Exception as exc:  # never into the user's import
        outcome = Outcome(kernel, OutcomeState.ERROR, f"internal error: {type(exc).__name__}: {exc}")
        events.error(f"{kernel}: {outcome.reason}; leaving it as it is", kernel, once="internal")
        return outcome, ()


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
    returns the World used before. The engine's one seam: tests hand it a stand-in (tests/support/worlds.py)."""
    global _world
    before, _world = _world, world
    forget()
    return before
