r"""One kernel's decision as an explicit state machine: `run()` loops `state, run = STEP[state](run)` until
DONE over an immutable `Run`. Everything outside the engine is reached through `run.world` (world.py);
the policy's Decision says what to do (repairs included) and the machine only executes it.

    CONTEXT -> READ -> NEEDS -> CACHED -> LOCK -> CHECK -> VERIFY / INSTALL -> RECORD -> DONE
                                     \-> REPORT (report mode: say what would be done)

READ reads the world once, unless a reading under the same stamp exists (the kernels of one request
share it). NEEDS decides the kernels this one needs first through `needs` (the engine's ensure), no
lock held. CHECK, under the environment lock, reads the world again only when its stamp changed while
waiting (another process installed or built) and always reads the verdicts again. INSTALL installs
the kernel with the others of its request where decide/policy/ finds them (one installer call, one
check); RECORD writes the verdict and a good outcome's warm verdict in one write. The loop releases
the lock whatever state it ends in. docs/architecture.md draws the flow.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass, replace

from .. import events
from .._names import cache_root
from ..act.numeric import plan_for
from ..act.store import FAILED, GOOD as VERIFIED
from ..decide import messages as short
from ..decide.plan import BLOCK, OK, OnFailure, REPAIR, SKIP, StepKind
from ..decide.policy import batch, builds
from ..events import MAX_LINE, PREFIX, first_fitting, fitted
from ..facts.frozen import thaw
from ..facts.probe import model_modules
from .first_call import FirstCall, beside_build, first_call_payload
from .outcome import GOOD, Outcome, OutcomeState, apply_env
from .said import (blocked_outcome, describe, engine_line, failed_outcome, installed_outcome, said_later,
                   keeps_instead, numeric_block, reminder_for, skipped_outcome)
from .world import InstallFailed, LockUnavailable, NumericFailed


class State(enum.Enum):
    CONTEXT = "context"
    READ = "read"
    NEEDS = "needs"
    CACHED = "cached"
    REPORT = "report"
    LOCK = "lock"
    CHECK = "check"
    VERIFY = "verify"
    INSTALL = "install"
    RECORD = "record"
    DONE = "done"


@dataclass(frozen=True)
class Run:
    """Where one kernel's decision stands. Immutable: every step returns a new one."""
    kernel: str
    world: object = None              # the World (world.py): everything outside the engine
    captured: tuple = ()              # the variables the decision depends on (warm.signature_environ)
    target: str | None = None         # a FASTPATH_HOOKS_TARGET given as a parameter (`--target`)
    signature: str | None = None      # the warm signature of `captured`, computed by the engine just before
    needs: object = None              # kernel -> Outcome: how a kernel needed first is decided (ensure)
    request: object = None            # () -> (kernels of this request, those usable): the batch at INSTALL
    now: bool = False                 # asked by a command the user typed: a remembered failure is tried again
    settings: object = None
    pins: object = None
    invalid: str | None = None        # why report mode although nobody asked for it (a bad variable/pins file)
    stamp: object = None              # the world's stamp the reading was made (or checked) under
    env: object = None                # the probed Environment (settled after an install)
    plan: object = None
    decision: object = None           # this kernel's decision (its repair replaces it)
    planned: str | None = None        # the action decided before the lock: another process may have done it
    repairing: bool = False           # `decision` is the repair of a failed verification
    check_failed: str | None = None   # why that verification failed
    cache: object = None              # the VerdictCache
    fingerprint: str | None = None    # of the facts this kernel's verdict depends on
    lock: object = None               # the environment lock, held from LOCK until the loop ends
    verdict: tuple | None = None      # (good, detail) for RECORD to write
    installed: object = None          # the installer's result, when INSTALL ran
    by_another: bool = False          # another process installed or checked while this one waited: said at DONE
    fresh_needs: tuple = ()           # the kernels its NEEDS installed, for it (removed again if it fails)
    before_needs: str | None = None   # the fingerprint before NEEDS installed them
    needs_undone: bool = False        # its install failed and they were removed: its failure holds without them
    outcome: Outcome | None = None
    trail: tuple = ()                 # the states passed through, in order (debug log, tests)

    @property
    def posed(self) -> str | None:
        """The accelerator kind a FASTPATH_HOOKS_TARGET poses (the gates may have to simulate it)."""
        env = self.env
        if env is None or env.gpu_source != "target" or env.accelerator is None:
            return None
        return "xpu" if env.accelerator == "xpu" else "cuda"

    def done(self, outcome: Outcome):
        return State.DONE, replace(self, outcome=outcome)

    def known(self, outcome: Outcome):   # a usable kernel: RECORD remembers it (the warm verdict)
        return (State.RECORD if outcome.state in GOOD else State.DONE), replace(self, outcome=outcome)


def run(kernel: str, needs, *, world, captured: tuple, target: str | None = None, signature: str | None = None,
        request=None, now: bool = False) -> Run:
    """Decide `kernel` (the engine runs this once per process); the final Run. See Run for the arguments."""
    state, current = State.CONTEXT, Run(kernel, world=world, captured=captured, target=target, needs=needs,
                                        signature=signature, request=request, now=now)
    try:
        while state is not State.DONE:
            before = state
            state, current = STEP[state](current)
            current = replace(current, trail=current.trail + (before,))
            events.log("%s: %s -> %s", kernel, before.value, state.value)
    finally:
        if current.lock is not None:
            current.lock.release()
    if current.by_another and current.outcome is not None and current.outcome.state == OutcomeState.OK:
        # this process said it was waiting (or was about to install it): it says how that ended
        events.status(f"{kernel}: ready - done by another process while this one waited", kernel,
                      once=f"done-{kernel}")
    return current


def _context(run: Run):
    settings, pins, invalid = run.world.context(run.target)
    run = replace(run, settings=settings, pins=pins, invalid=invalid)
    if run.kernel in settings.skip:
        if run.world.pending(settings):   # skipped, yet never imported half-written
            failed, _ = _recover(run)
            if failed is not None:
                return run.done(failed)
        events.debug(f"{run.kernel}: skipped by FASTPATH_HOOKS_SKIP", run.kernel)
        return run.done(Outcome(run.kernel, OutcomeState.SKIPPED, "skipped by FASTPATH_HOOKS_SKIP"))
    return State.READ, run


def _read(run: Run):
    world, settings = run.world, run.settings
    stamp = world.stamp(run.captured, run.signature)
    if stamp is None and world.pending(settings):   # waits for a running install (or rolls a dead one back)
        failed, waited = _recover(run)
        if failed is not None:
            return run.done(failed)
        run = replace(run, by_another=waited)
        stamp = world.stamp(run.captured)
    key = (run.captured, stamp, model_modules())   # a model imported since changes what the policy reads
    reading = world.readings.get(key) if stamp is not None else None
    if reading is None:
        env, plan = world.read(settings, run.pins, run.kernel)
    else:   # read for another kernel: nvcc's release asked for now if this kernel's decision needs it
        env, plan = world.complete(*reading, settings, run.pins, run.kernel)
    if stamp is not None and (reading is None or plan is not reading[1]):
        world.readings.put(key, (env, plan))
    decision = plan[run.kernel]
    run = replace(run, stamp=stamp, env=env, plan=plan, decision=decision, planned=decision.action)
    apply_env(run.kernel, decision.env, decision.reason if decision.action == SKIP else "for this accelerator")
    if decision.action == SKIP:
        return run.done(skipped_outcome(decision, plan, run.pins, quiet=run.invalid is not None))
    if decision.action == BLOCK:
        return run.done(blocked_outcome(decision, decision.reason, decision.fix))
    return State.NEEDS, run


def _recover(run: Run) -> tuple:
    """(a failed Outcome or None, whether it waited for another process)."""
    failed, waited = roll_back(run.world, run.settings, run.invalid, run.kernel)
    if failed is None:
        return None, waited
    events.error(f"{run.kernel}: {failed}; leaving it as it is", run.kernel, once=f"fail-{run.kernel}")
    return Outcome(run.kernel, OutcomeState.FAILED, str(failed)), waited


def roll_back(world, settings, invalid: str | None, label: str, *, wait: bool = True) -> tuple:
    """Roll back a pending install's journal under the lock: taking it waits for a running install, after
    which the journal is gone (committed) or its writer is dead. `wait=False`: only if the lock is free now.
    Returns (what kept the lock from being taken or None, whether it waited for another process)."""
    if settings.mode == "report":
        why = invalid or "FASTPATH_HOOKS_MODE=report"
        events.warning(fitted("an interrupted install here is not rolled back: ", why,
                              "a run in install mode rolls it back"), once="interrupted-report",
                       detail=f"an install into this environment was interrupted ({world.state_dir(settings)}); "
                              f"it is not rolled back because {why}")
        return None, False
    lock = world.lock(settings, label)
    try:
        if wait:
            lock.acquire()
        elif lock.try_acquire() is None:
            events.debug(f"an install into this environment is running ({world.state_dir(settings)}); the imports "
                         "of its kernel wait for it")
            return None, False
    except LockUnavailable as exc:
        return exc, False
    try:
        world.recover(settings)
    finally:
        lock.release()
    return None, bool(getattr(lock, "waited", False))


def _needs(run: Run):
    decision = run.decision
    if decision.needs and decision.action != OK and run.settings.mode == "install":
        before = run.world.fingerprint(run.env, run.settings, run.pins, run.kernel)
        run = replace(run, cache=run.world.cache(run.settings), fingerprint=before, before_needs=before)
        failed = _known(run, failed_only=True)   # its failure, after which what it needed was removed again
        if failed is not None:
            return run.done(failed)
    fresh = []
    for dep in decision.needs:
        earlier = set(run.world.installed)
        dep_outcome = run.needs(dep)   # no lock of ours is held here: it may be decided by another thread
        if dep_outcome.state == OutcomeState.INSTALLED and dep in run.world.installed and dep not in earlier:
            fresh.append(dep)   # installed by this very call, for this kernel (not a kernel that wants it)
        if dep_outcome.state == OutcomeState.REPORTED:
            continue   # report mode: the dependency would be installed, so would this kernel (said below)
        if dep_outcome.state not in GOOD:
            why = f"{run.kernel} needs {dep} here and {dep} is not usable ({dep_outcome.reason})"
            fix = f"fix {dep} first: its line says how"
            # why whole when it fits, else in short (the dependency's own line says its reason)
            said = (why, fix) if len(f"{PREFIX}{run.kernel}: {short.NOT_INSTALLED} - {why} ({fix})") <= MAX_LINE \
                else (f"needs {dep} here, which is not usable", fix)
            if decision.on_failure == OnFailure.BLOCK:
                fix = decision.fix or next((hz.fix for hz in run.pins.hazards if hz.kernel == run.kernel), "")
                return run.done(blocked_outcome(decision, why, fix, said=said))
            apply_env(run.kernel, decision.off, why)
            say = events.debug if run.invalid is not None else events.warning
            say(engine_line(f"{run.kernel}: {short.NOT_INSTALLED} - ", *said), run.kernel,
                detail=f"{why}; {run.kernel} is not installed, {keeps_instead(run.kernel)}")
            return run.done(Outcome(run.kernel, OutcomeState.SKIPPED, why))
    return State.CACHED, replace(run, fresh_needs=tuple(fresh))


def _cached(run: Run):
    decision, settings, world = run.decision, run.settings, run.world
    run = replace(run, cache=world.cache(settings),
                  fingerprint=world.fingerprint(run.env, settings, run.pins, run.kernel))
    if decision.action == OK:
        known = _known(run)
        if known is not None:
            return run.known(known)
        # report mode takes no lock; a verdict is all it writes
        return (State.VERIFY if settings.mode == "report" else State.LOCK), run
    if settings.mode == "report":
        return State.REPORT, run
    failed = _known(run, failed_only=True)
    return run.done(failed) if failed is not None else (State.LOCK, run)


def _report(run: Run):
    decision, kernel = run.decision, run.kernel
    why = run.invalid or "FASTPATH_HOOKS_MODE=report"
    message = engine_line(f"{kernel}: would {decision.action} {describe(decision)}; nothing is installed: ", why)
    detail = (f"{kernel}: would {decision.action} {describe(decision, whole=True)}; nothing is installed: {why}; "
              f"{decision.reason}")
    if run.invalid is not None:   # the one line about the bad variable said it: nothing is installed
        events.debug(detail, kernel)
    else:
        events.warning(message, kernel, once=f"report-{kernel}", detail=detail,
                       persist=f"{decision.rule}:report:{why}:{decision.reason}")
    if decision.on_failure == OnFailure.BLOCK and decision.installed:
        said = ((decision.short_reason or decision.reason) + " (report mode: not repaired)",
                decision.short_fix if decision.short_reason else decision.fix)
        return run.done(blocked_outcome(decision, decision.reason + " (report mode: not repaired)", decision.fix,
                                        said=said))
    return run.done(Outcome(kernel, OutcomeState.REPORTED, decision.reason))


def _lock(run: Run):
    lock = run.world.lock(run.settings, run.kernel)
    try:
        lock.acquire()
    except LockUnavailable as exc:
        if run.decision.action == OK and not run.repairing:  # the lock only saves repeating a verification
            events.debug(f"{run.kernel}: {exc}; verifying without it", run.kernel)
            return State.VERIFY, run
        return run.done(failed_outcome(run.decision, str(exc)))
    return State.CHECK, replace(run, lock=lock)


def _check(run: Run):
    """Under the lock: roll back an interrupted install, read the world again only if it changed while
    this one waited, read the verdicts again. A repair keeps its decision while nothing changed."""
    world, settings, kernel = run.world, run.settings, run.kernel
    world.recover(settings)
    now = world.stamp(run.captured)
    # a first holder made the state directory, which moves site-packages' mtime (the stamp): nothing changed
    changed = now is None or (now != run.stamp and not run.lock.first)
    if changed:
        env, plan = world.read(settings, run.pins, kernel)
        if now is not None:
            world.readings.put((run.captured, now, model_modules()), (env, plan))
        decision = plan[kernel]
        run = replace(run, env=env, plan=plan, decision=decision, repairing=False,
                      fingerprint=world.fingerprint(env, settings, run.pins, kernel))
    run = replace(run, stamp=now, by_another=run.by_another or getattr(run.lock, "waited", False))
    current = run.decision
    if run.repairing:
        return State.INSTALL, run
    batched = world.batched.get(kernel)   # installed (or not) by this process with another kernel of its request
    if batched is not None and (batched.state in GOOD) == (current.action == OK):
        return run.known(batched)
    if current.action == OK:
        known = _known(run)
        if known is None:
            return State.VERIFY, run
        # this process was about to install it, or said it was waiting: it says how that ended (DONE)
        return replace(run, by_another=run.by_another or run.planned != OK).known(known)
    if current.action == SKIP:
        return run.done(skipped_outcome(current, run.plan, run.pins, quiet=run.invalid is not None))
    if current.action == BLOCK:
        return run.done(blocked_outcome(current, current.reason, current.fix))
    failed = _known(run, failed_only=True)  # another process failed while this one waited: not tried twice
    return run.done(failed) if failed is not None else (State.INSTALL, run)


def _now(decision, now: bool):
    """A command the user typed waits for no first call: its check runs now, at the decision's shapes."""
    if not now or not decision.check or not decision.check.get("first_call"):
        return decision
    return replace(decision, check={**thaw(decision.check), "first_call": False})


def _verify(run: Run):
    decision, settings, kernel = _now(run.decision, run.now), run.settings, run.kernel
    result = run.world.verify(run.pins.kernel(kernel), timeout=settings.timeout, env_extra=decision.env,
                              numeric=plan_for(kernel, run.env, run.pins, cache_root(settings)), check=decision.check,
                              root=cache_root(settings), gpus=run.env.gpus, keyed=run.pins.keyed)
    if result.ok:
        return State.RECORD, replace(run, verdict=(True, result.detail))
    if result.numeric:   # wrong numbers on this GPU: blocked there (the policy reads the remembered mismatch)
        return State.RECORD, replace(run, decision=numeric_block(decision, result.detail, run.env.gpus),
                                     verdict=(False, result.detail))
    if decision.repair is not None and settings.mode == "install":
        events.warning(engine_line(f"{kernel}: check failed - ", result.detail, "repairing"), kernel,
                       detail=f"{kernel}: {result.detail}; repairing")
        run = replace(run, decision=decision.repair, repairing=True, check_failed=result.detail)
        return (State.INSTALL if run.lock is not None else State.LOCK), run
    return State.RECORD, replace(run, verdict=(False, result.detail))


def _install(run: Run):
    """A lone kernel is a batch of one; the others of its request go in with it where decide/policy/
    finds them (engine.expect, the kernels being ensured now): one installer call, one check."""
    current, settings, kernel, world = run.decision, run.settings, run.kernel, run.world
    installer, why = world.installer(settings, run.env)
    if installer is None:  # not remembered as a failed attempt: fixing it takes effect at the next start
        head = f"{kernel}: {short.NOT_INSTALLED} - "
        reason, _, fix = why.partition("; ")     # `<what is missing>; <the fix>` (decide/plan.py)
        bare = reason.split(" (", 1)[0]          # a path in parentheses is detail: doctor shows it
        events.warning(first_fitting(head + why, f"{head}{bare}; {fix}", engine_line(head, bare, fix)), kernel,
                       once=f"fail-{kernel}", persist=f"{current.rule}:no-installer:{why}",
                       reminder=reminder_for(kernel), detail=head + why)
        return run.done(Outcome(kernel, OutcomeState.FAILED, why))
    members = (current,)
    if not run.repairing and run.request is not None:
        kernels, good = run.request()
        members = batch(run.plan, run.pins, kernel, request=kernels, good=good, decision=current)
    members = tuple(_now(d, run.now) for d in members)
    if len(members) > 1 and any(builds(d) for d in members):   # checked now, while the others build
        members = tuple(beside_build(d, run.pins.kernel(d.kernel), run.env, run.pins, sys._getframe())
                        for d in members)
    current = next(d for d in members if d.kernel == kernel)
    for d in members:
        verb = "repairing" if d.action == REPAIR else "installing"
        events.status(short.line(d), d.kernel,
                      detail=f"{d.kernel}: {verb} {describe(d, whole=True)} ({run.check_failed or d.reason})")
    if len(members) > 1:
        built = [d.kernel for d in members if builds(d)]
        beside = [d.kernel for d in members if d.kernel not in built and not any(
            s.kind == StepKind.WHEEL for s in d.steps)] if built else []
        verb = "builds" if len(built) == 1 else "build"
        events.status(f"{kernel}: installing {' and '.join(beside)} while {' and '.join(built)} {verb}" if beside
                      else f"{kernel}: installing {' and '.join(d.kernel for d in members)} together: one installer "
                      "call, one check", kernel)
    failed, numeric = {}, set()
    try:
        if len(members) == 1:
            results = {kernel: world.install(current, settings=settings, env=run.env, pins=run.pins)}
        else:
            done = world.install_batch(members, settings=settings, env=run.env, pins=run.pins)
            results, failed, numeric = dict(done.results), dict(done.failed), set(done.numeric)
    except NumericFailed as exc:   # rolled back; blocked on this GPU, the measured error in the message
        results, failed, numeric = {}, {kernel: str(exc)}, {kernel}
    except InstallFailed as exc:
        results, failed, numeric = {}, {d.kernel: str(exc) for d in members}, set()
    if len(members) > 1:
        _members(run, [d for d in members if d.kernel != kernel], results, failed, numeric)
    mine = results.get(kernel)
    if mine is None:
        why = failed.get(kernel, "not installed")
        decision = numeric_block(current, why, run.env.gpus) if kernel in numeric else current
        undone = bool(run.fresh_needs) and _undo_needs(run)
        return State.RECORD, replace(run, decision=decision, verdict=(False, why), needs_undone=undone)
    done = "repaired" if current.action == REPAIR else "installed"
    return State.RECORD, replace(run, verdict=(True, f"{done} in {mine.seconds:.1f} s"), installed=mine)


def _undo_needs(run: Run) -> bool:
    """Its install failed (lock held): the kernels NEEDS installed just now for it (fla's tilelang) are removed
    again - what their install added. One stays, said, where a kernel this process installed after it may use
    it, or where its install replaced versions that were there. True when every one was removed."""
    world, kernel = run.world, run.kernel
    order, undone = list(world.installed), True
    for dep in run.fresh_needs:
        result = world.installed.get(dep)
        if result is None:
            continue   # installed by another thread's decision without this process's installer: not ours
        since = [k for k in order[order.index(dep) + 1:] if k != kernel]
        replaced = sorted(set(result.installed) - set(result.added))
        try:
            if since or replaced:
                raise InstallFailed(f"{since[0]}, installed since, may use it" if since
                                    else f"its install replaced the {replaced[0]} that was there")
            done = world.uninstall(dep, settings=run.settings, why=f"installed for {kernel}, which failed")
        except InstallFailed as exc:
            undone = False
            events.warning(fitted(f"{kernel}: {dep}, installed for it, stays: ", exc), kernel,
                           detail=f"{kernel}: {dep}, installed for it, stays: {exc}")
            continue
        events.status(fitted(f"rolled back {dep} too, installed for {kernel}: ", "; ".join(done)), kernel,
                      detail=f"rolled back {dep} too, installed for {kernel}: {'; '.join(done)}")
    return undone


def _members(run: Run, others, results: dict, failed: dict, numeric: set) -> None:
    """The other members' verdicts, under the fingerprint of what is on disk now, and their outcomes,
    kept in the World for their own runs (CHECK), which then neither check nor install again."""
    world, settings, pins, kernel = run.world, run.settings, run.pins, run.kernel
    any_result = next(iter(results.values()), None)
    env = world.settle(run.env, settings, pins, any_result) if any_result is not None else run.env
    for decision in others:
        other = decision.kernel
        if other in results:
            world.batched[other] = installed_outcome(other, results[other], decision, pins)
            verdict = (VERIFIED, f"installed with {kernel}")
        else:
            detail = failed.get(other, "not installed")
            blocked = numeric_block(decision, detail, run.env.gpus) if other in numeric else decision
            world.batched[other] = failed_outcome(blocked, detail)
            verdict = (FAILED, detail)
        if not run.cache.record(other, verdict=(world.fingerprint(env, settings, pins, other), *verdict)):
            events.debug(f"{other}: verdict not cached (the cache is read-only or busy)", other)


def _record(run: Run):
    """Write the verdict (after an install: under the fingerprint of what is on disk now, settled from
    the installer's scan) and a good outcome's warm verdict, in one write; say the outcome."""
    world, kernel, decision = run.world, run.kernel, run.decision
    if run.installed is not None:
        env = world.settle(run.env, run.settings, run.pins, run.installed)
        run = replace(run, env=env, fingerprint=world.fingerprint(env, run.settings, run.pins, kernel),
                      stamp=world.stamp(run.captured))
    outcome, verdict = run.outcome, None
    if run.verdict is not None:
        good, detail = run.verdict
        verdict = (run.fingerprint, VERIFIED if good else FAILED, detail)
        if not good:
            outcome = failed_outcome(decision, detail)
        elif run.installed is not None:
            outcome = installed_outcome(kernel, run.installed, decision, run.pins, run.check_failed)
        else:
            events.debug(f"{kernel}: {detail}", kernel)
            outcome = Outcome(kernel, OutcomeState.OK, decision.reason)
    # a bad variable must be said at every start, not skipped by a warm hit; a rule may not let it be warm
    # (decide/messages.py: a build without mamba-ssm's CUDA extension is good only for the families in use now),
    # nor a kernel whose build is trimmed to the models in use (pins `source_build.trim`: FA3's head dims)
    rule = short.lookup(run.pins, decision.rule)
    warm = None
    if outcome.state in GOOD and run.invalid is None and run.stamp is not None and (rule is None or rule.warm) \
            and run.pins.kernel(kernel).trim is None:
        later = outcome.reason if run.installed is None else said_later(kernel, run.installed, decision, run.pins)
        warm = (run.stamp.signature, {"reason": later, "posed": run.posed, "fingerprint": run.fingerprint,
                                      "env": [list(pair) for pair in decision.env]})
    payload = _first_call(run, decision) if outcome.state in GOOD else None
    if payload is not None:   # the warm verdict waits for the check at the kernel's first call (engine/first_call.py)
        if warm is not None:
            warm[1]["first_call"] = payload
        held = FirstCall(payload, run.world.first_check, warm=warm, cache=run.cache)
        warm = None
        outcome = Outcome(kernel, outcome.state, outcome.reason, outcome.block, first_call=held)
    if not run.cache.record(kernel, verdict=verdict, warm=warm):
        events.debug(f"{kernel}: verdict not cached (the cache is read-only or busy)", kernel)
    if run.needs_undone and run.before_needs and verdict is not None:   # as the next start finds it (NEEDS)
        run.cache.record(kernel, verdict=(run.before_needs, *verdict[1:]))
    return run.done(outcome)


def _first_call(run: Run, decision) -> dict | None:
    """The FirstCall payload of a decision whose check waits for the kernel's first call (not a command typed)."""
    if run.now:
        return None
    spec = run.pins.kernel(run.kernel)
    dist = spec.distributions[0]
    return first_call_payload(decision, spec, settings_root=cache_root(run.settings), env=run.env, pins=run.pins,
                              timeout=run.settings.timeout,
                              version=decision.target.get(dist) or decision.installed.get(dist))


STEP = {
    State.CONTEXT: _context,
    State.READ: _read,
    State.NEEDS: _needs,
    State.CACHED: _cached,
    State.REPORT: _report,
    State.LOCK: _lock,
    State.CHECK: _check,
    State.VERIFY: _verify,
    State.INSTALL: _install,
    State.RECORD: _record,
}


def _known(run: Run, *, failed_only: bool = False) -> Outcome | None:
    """What is known without verifying: nothing to verify, or the cached verdict - good, or a failure
    remembered for FASTPATH_HOOKS_RETRY_AFTER and said again at interpreter starts (`now` tries again)."""
    if not failed_only and not run.decision.verify:
        events.debug(f"{run.kernel}: {run.decision.reason}", run.kernel)
        return Outcome(run.kernel, OutcomeState.OK, run.decision.reason)
    cached = run.cache.get(run.kernel, run.fingerprint)
    if cached is None or (run.now and cached["state"] == FAILED) or (failed_only and cached["state"] == VERIFIED):
        return None
    if cached["state"] == VERIFIED:
        events.debug(f"{run.kernel}: verified earlier ({cached['reason']})", run.kernel)
        return Outcome(run.kernel, OutcomeState.OK, run.decision.reason)
    return failed_outcome(run.decision, cached["reason"], remembered=cached, settings=run.settings)
