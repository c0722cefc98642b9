r"""One kernel's decision as an explicit state machine: `run(kernel, ...)` loops `state, run = STEP[state](run)`
over small transition functions until DONE, carrying an immutable `Run` (each step returns a new one).
Everything outside the engine is reached through `run.world` (world.py): the machine decides
nothing itself - the policy's Decision says what to do, repairs included - and only executes.

    CONTEXT -> READ -> NEEDS -> CACHED -> LOCK -> CHECK -> VERIFY / INSTALL -> RECORD -> DONE
                                     \-> REPORT (report mode: say what would be done)

- CONTEXT: settings and pins (bad ones: report mode, said once); a kernel in FASTPATH_HOOKS_SKIP ends here -
  after an install killed half-way is rolled back (its half-written tree must not be imported either).
- READ: the world read once - the cheap stamp, then probe + policy, unless the world's last reading
  was made under the same stamp (the kernels of one request share it). A pending journal (an
  install running, or killed half-way) is waited for and rolled back under the lock first.
- NEEDS: the kernels this one needs first (fla on Hopper: tilelang), each through `needs` (the
  engine's `ensure`), while this thread holds no lock: a dependency is decided once, by whoever asks first.
- CACHED: the verdict cache under the fingerprint of the facts this kernel depends on: a kernel verified
  before is not verified again; a failed attempt is not retried for FASTPATH_HOOKS_RETRY_AFTER seconds -
  by interpreter starts: a command the user typed (`now`: `fastpath-hooks install`) tries again at once.
- LOCK, CHECK: the environment lock (one process - and one thread - installs or verifies at a time).
  Under it the stamp is taken again: only when the environment changed meanwhile (another process
  installed, repaired or built while this one waited) is the world read again. The verdicts are
  read again either way (another process may have verified or failed without changing anything).
- VERIFY: an installed kernel imported in a child process; a failure runs the repair the policy
  decided with it (`Decision.repair`), under the lock.
- INSTALL: the decision's steps in a transaction (verified in a child process before commit).
- RECORD: the verdict and, for a good outcome, the warm verdict for the next start, in one write;
  after an install the facts are settled from the installer's own scan (no probe, no policy).
The lock is released by the loop, whatever state it ends in.

The steps decide the transitions; the lines an outcome is said in are outcome.py's.

Installing a kernel together with the others of its request (INSTALL, when decide/policy/ finds
more than this one): their builds side by side, one installer call, one check (World.install_batch).
The other members' verdicts are written here and remembered in the World for their own runs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from .. import events
from .._names import cache_root
from ..act.numeric import plan_for
from ..act.store import FAILED, GOOD as VERIFIED
from ..decide import messages as short
from ..decide.messages import lookup
from ..decide.plan import BLOCK, OK, OnFailure, REPAIR, SKIP
from ..decide.policy import batch
from ..events import first_fitting
from .outcome import (GOOD, Outcome, OutcomeState, apply_env, blocked_outcome, describe, engine_line, failed_outcome,
                      hazard_fix, installed_line, keeps_instead, line_fits, numeric_block, recorded_outcome,
                      reminder_for, skipped_outcome)
from .world import Batched, InstallFailed, LockUnavailable, NumericFailed, Reading


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
    request: object = None            # () -> world.Request: the kernels of this request (the batch at INSTALL)
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
    outcome: Outcome | None = None
    trail: tuple = ()                 # the states passed through, in order (debug log, tests)

    @property
    def posed(self) -> str | None:
        """The accelerator kind a FASTPATH_HOOKS_TARGET poses (the gates may have to simulate it)."""
        env = self.env
        if env is None or env.gpu_source != "target" or env.accelerator is None:
            return None
        return "xpu" if env.accelerator == "xpu" else "cuda"

    @property
    def env_pairs(self) -> tuple:
        return tuple(tuple(p) for p in self.decision.env) if self.decision is not None else ()

    def done(self, outcome: Outcome):
        return State.DONE, replace(self, outcome=outcome)

    def good(self, outcome: Outcome):
        """A usable kernel: RECORD remembers it for the next start (the warm verdict)."""
        return State.RECORD, replace(self, outcome=outcome)


def run(kernel: str, needs, *, world, captured: tuple, target: str | None = None, signature: str | None = None,
        request=None, now: bool = False) -> Run:
    """Decide `kernel` (the engine makes sure this runs once per process); the final Run.
    `needs(other)` -> Outcome decides a kernel this one needs first (the engine's `ensure`);
    `signature`: the warm signature of `captured` the engine just computed (the first stamp uses it);
    `request()` -> world.Request: the other kernels of this request, installed with it where they can be;
    `now`: a command the user typed - a failure remembered from an earlier attempt is not replayed."""
    state, current = State.CONTEXT, Run(kernel, world=world, captured=captured, target=target, needs=needs,
                                        signature=signature, request=request, now=now)
    try:
        while state is not State.DONE:
            before = state
            state, current = STEP[state](current)
            current = replace(current, trail=current.trail + (before,))
            events.logger.debug("%s: %s -> %s", kernel, before.value, state.value)
    finally:
        if current.lock is not None:
            current.lock.release()
    return current


# -- the steps ------------------------------------------------------------------------------

def _context(run: Run):
    settings, pins, invalid = run.world.context(run.target)
    run = replace(run, settings=settings, pins=pins, invalid=invalid)
    if run.kernel in settings.skip:
        if run.world.pending(settings):   # skipped, yet never imported from a half-written install
            failed = _recover(run)
            if failed is not None:
                return run.done(failed)
        events.debug(f"{run.kernel}: skipped by FASTPATH_HOOKS_SKIP", run.kernel)
        return run.done(Outcome(run.kernel, OutcomeState.SKIPPED, "skipped by FASTPATH_HOOKS_SKIP"))
    return State.READ, run


def _read(run: Run):
    world, settings = run.world, run.settings
    stamp = world.stamp(run.captured, run.signature)
    if stamp is None and world.pending(settings):
        failed = _recover(run)
        if failed is not None:
            return run.done(failed)
        stamp = world.stamp(run.captured)
    reading = world.readings.get((run.captured, stamp)) if stamp is not None else None
    if reading is None:
        env, plan = world.read(settings, run.pins, run.kernel)
    else:   # read for another kernel: nvcc's release asked for now if this kernel's decision needs it
        env, plan = world.complete(reading.env, reading.plan, settings, run.pins, run.kernel)
    if reading is None or plan is not reading.plan:
        reading = Reading(stamp, env, plan)
        if stamp is not None:
            world.readings.put((run.captured, stamp), reading)
    decision = reading.plan[run.kernel]
    run = replace(run, stamp=stamp, env=reading.env, plan=reading.plan, decision=decision, planned=decision.action)
    apply_env(run.kernel, decision.env, decision.reason if decision.action == SKIP else "for this accelerator")
    if decision.action == SKIP:
        return run.done(skipped_outcome(decision, reading.plan, run.pins, quiet=run.invalid is not None))
    if decision.action == BLOCK:
        return run.done(blocked_outcome(decision, decision.reason, decision.fix))
    return State.NEEDS, run


def _recover(run: Run) -> Outcome | None:
    """An install's journal is there: taking the lock waits for that install, after which the
    journal is gone (committed) or its writer is dead (rolled back here)."""
    settings, world = run.settings, run.world
    if settings.mode == "report":
        events.warning(f"an install into this environment was interrupted ({world.state_dir(settings)}); it is not "
                       f"rolled back because {run.invalid or 'FASTPATH_HOOKS_MODE=report'}", run.kernel,
                       once="interrupted-report")
        return None
    lock = world.lock(settings, run.kernel)
    try:
        lock.acquire()
    except LockUnavailable as exc:
        events.error(f"{run.kernel}: {exc}; leaving it as it is", run.kernel, once=f"fail-{run.kernel}")
        return Outcome(run.kernel, OutcomeState.FAILED, str(exc))
    try:
        world.recover(settings)
    finally:
        lock.release()
    return None


def _needs(run: Run):
    decision = run.decision
    for dep in decision.needs:
        dep_outcome = run.needs(dep)   # no lock of ours is held here: it may be decided by another thread
        if dep_outcome.state == OutcomeState.REPORTED:
            continue   # report mode: the dependency would be installed, so would this kernel (said below)
        if dep_outcome.state not in GOOD:
            why = f"{run.kernel} needs {dep} here and {dep} is not usable ({dep_outcome.reason})"
            fix = f"fix {dep} first: its line says how"
            # the line: why whole when it fits, else in short (the dependency's own line says its reason)
            said = (why, fix) if line_fits(f"{run.kernel}: {short.NOT_INSTALLED} - {why} ({fix})") \
                else (f"needs {dep} here, which is not usable", fix)
            if decision.on_failure == OnFailure.BLOCK:
                return run.done(blocked_outcome(decision, why, decision.fix or hazard_fix(run.pins, run.kernel),
                                         said=said))
            apply_env(run.kernel, decision.off, why)
            say = events.debug if run.invalid is not None else events.warning
            say(engine_line(f"{run.kernel}: {short.NOT_INSTALLED} - ", *said), run.kernel,
                detail=f"{why}; {run.kernel} is not installed, {keeps_instead(run.pins, run.kernel)}")
            return run.done(Outcome(run.kernel, OutcomeState.SKIPPED, why))
    return State.CACHED, run


def _cached(run: Run):
    decision, settings, world = run.decision, run.settings, run.world
    run = replace(run, cache=world.cache(settings),
                  fingerprint=world.fingerprint(run.env, settings, run.pins, run.kernel))
    if decision.action == OK:
        if not decision.verify:
            events.debug(f"{run.kernel}: {decision.reason}", run.kernel)
            return run.good(Outcome(run.kernel, OutcomeState.OK, decision.reason))
        known = _known(run)
        if known is not None:
            return run.good(known) if known.state in GOOD else run.done(known)
        # report mode takes no lock; a verdict is all it writes
        return (State.VERIFY if settings.mode == "report" else State.LOCK), run
    if settings.mode == "report":
        return State.REPORT, run
    failed = _remembered_failure(run)
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
        events.warning(message, kernel, once=f"report-{kernel}", persist=f"{decision.rule}:report:{why}:{decision.reason}",
                       detail=detail)
    if decision.on_failure == OnFailure.BLOCK and decision.installed:
        return run.done(blocked_outcome(decision, decision.reason + " (report mode: not repaired)", decision.fix,
                                 said=((decision.short_reason or decision.reason) + " (report mode: not repaired)",
                                       decision.short_fix if decision.short_reason else decision.fix)))
    return run.done(Outcome(kernel, OutcomeState.REPORTED, decision.reason))


def _lock(run: Run):
    lock = run.world.lock(run.settings, run.kernel)
    try:
        lock.acquire()
    except LockUnavailable as exc:
        if run.decision.action == OK and not run.repairing:  # verifying unlocked is what the lock only saves repeating
            events.debug(f"{run.kernel}: {exc}; verifying without it", run.kernel)
            return State.VERIFY, run
        return run.done(failed_outcome(run.decision, str(exc)))
    return State.CHECK, replace(run, lock=lock)


def _check(run: Run):
    """Under the lock: roll back an interrupted install; read the world again only when it changed
    since it was read (another process installed, repaired or built while this one waited); read
    the verdicts again. A repair keeps its decision while nothing changed."""
    world, settings, kernel = run.world, run.settings, run.kernel
    world.recover(settings)
    now = world.stamp(run.captured)
    # The lock's first holder in this environment: nothing was changed by fastpath-hooks (only the state
    # directory was made, which moves site-packages' mtime, part of the stamp)
    changed = now is None or (now != run.stamp and not run.lock.first)
    if changed:
        env, plan = world.read(settings, run.pins, kernel)
        if now is not None:
            world.readings.put((run.captured, now), Reading(now, env, plan))
        decision = plan[kernel]
        run = replace(run, env=env, plan=plan, decision=decision, repairing=False,
                      fingerprint=world.fingerprint(env, settings, run.pins, kernel))
    run = replace(run, stamp=now)
    current = run.decision
    if run.repairing:
        return State.INSTALL, run
    batched = world.batched.get(kernel)
    if batched is not None:   # installed (or not) by this process with another kernel of its request
        if batched.ok and current.action == OK:
            return run.good(Outcome(kernel, OutcomeState.INSTALLED, batched.detail))
        if not batched.ok and current.action != OK:
            decision = numeric_block(current, batched.detail, run.env.gpus) if batched.numeric else current
            return run.done(failed_outcome(decision, batched.detail))
    if current.action == OK:
        known = None if current.verify else Outcome(kernel, OutcomeState.OK, current.reason)
        if known is None:
            known = _known(run)
        if known is None:
            return State.VERIFY, run
        # this process was about to install it, or said it was waiting: it says how that ended
        if known.state == OutcomeState.OK and (run.planned != OK or getattr(run.lock, "waited", False)):
            events.status(f"{kernel}: ready - done by another process while this one waited", kernel, once=f"done-{kernel}")
        return run.good(known) if known.state in GOOD else run.done(known)
    if current.action == SKIP:
        return run.done(skipped_outcome(current, run.plan, run.pins, quiet=run.invalid is not None))
    if current.action == BLOCK:
        return run.done(blocked_outcome(current, current.reason, current.fix))
    failed = _remembered_failure(run)  # another process failed while we waited: its verdict, not a second attempt
    return run.done(failed) if failed is not None else (State.INSTALL, run)


def _verify(run: Run):
    decision, settings, kernel = run.decision, run.settings, run.kernel
    result = run.world.verify(run.pins.kernel(kernel), timeout=settings.timeout, env_extra=decision.env,
                              numeric=_numeric_plan(run), check=decision.check, root=cache_root(settings),
                              gpus=run.env.gpus)
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
    current, settings, kernel, world = run.decision, run.settings, run.kernel, run.world
    installer, why = world.installer(settings, run.env)
    if installer is None:  # not remembered as a failed attempt: fixing it takes effect at the next start
        head = f"{kernel}: {short.NOT_INSTALLED} - "
        reason, _, fix = why.partition("; ")     # `<what is missing>; <the fix>` (decide/plan.py)
        bare = reason.split(" (", 1)[0]          # a path in parentheses is detail: doctor shows it
        events.warning(first_fitting(head + why, f"{head}{bare}; {fix}", engine_line(head, bare, fix)), kernel,
                       once=f"fail-{kernel}", persist=f"{current.rule}:no-installer:{why}",
                       reminder=reminder_for(run.pins, kernel), detail=head + why)
        return run.done(Outcome(kernel, OutcomeState.FAILED, why))
    batch = batch_of(run)
    if len(batch) > 1:
        return State.RECORD, install_together(run, batch)
    verb = "repairing" if current.action == REPAIR else "installing"
    events.status(short.line(current), kernel,
                  detail=f"{kernel}: {verb} {describe(current, whole=True)} ({run.check_failed or current.reason})")
    try:
        result = world.install(current, settings=settings, env=run.env, pins=run.pins)
    except NumericFailed as exc:   # rolled back; blocked on this GPU, the measured error in the message
        return State.RECORD, replace(run, decision=numeric_block(current, str(exc), run.env.gpus),
                                     verdict=(False, str(exc)))
    except InstallFailed as exc:
        return State.RECORD, replace(run, verdict=(False, str(exc)))
    return State.RECORD, replace(run, verdict=(True, f"{verb[:-3]}ed in {result.seconds:.1f} s"), installed=result)


def _numeric_plan(run: Run):
    """What the verification checks of the kernel's numbers here (act/numeric.py; None: it has no check
    for these GPUs) - once per installed files, GPU arch and torch build."""
    return plan_for(run.kernel, run.env, run.pins, cache_root(run.settings))


def _record(run: Run):
    """Write the verdict - after an install under the fingerprint of what is on disk now (settled from
    the installer's scan) - and the warm verdict of a good outcome, in one write; say the outcome."""
    world, kernel = run.world, run.kernel
    if run.installed is not None:
        env = world.settle(run.env, run.settings, run.pins, run.installed)
        run = replace(run, env=env, fingerprint=world.fingerprint(env, run.settings, run.pins, kernel),
                      stamp=world.stamp(run.captured))
    outcome = run.outcome if run.outcome is not None else recorded_outcome(run)
    verdict = None
    if run.verdict is not None:
        verdict = (run.fingerprint, VERIFIED if run.verdict[0] else FAILED, run.verdict[1])
    warm = None
    if outcome.state in GOOD and run.invalid is None and run.stamp is not None and _warm_rule(run):
        # a bad variable must be reported at every start, not skipped by a warm hit: no warm verdict then
        warm = (run.stamp.signature, {"reason": outcome.reason, "posed": run.posed, "fingerprint": run.fingerprint,
                                      "env": [list(pair) for pair in run.env_pairs]})
    if not run.cache.record(kernel, verdict=verdict, warm=warm):
        events.debug(f"{kernel}: verdict not cached (the cache is read-only or busy)", kernel)
    return run.done(outcome)


def _warm_rule(run: Run) -> bool:
    """The decision's rule lets a good outcome be remembered for the next start (decide/messages.py: a
    build without mamba-ssm's CUDA extension is good only for the families in use now)."""
    rule = lookup(run.pins, run.decision.rule) if run.decision is not None else None
    return rule is None or rule.warm


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


# -- the verdicts cached earlier -----------------------------------------------------------

def _known(run: Run) -> Outcome | None:
    """The cached verdict of an installed kernel: good, or a failure remembered for
    FASTPATH_HOOKS_RETRY_AFTER (not verified again, whatever repair the plan offers - unless a command
    the user typed asks: `now`)."""
    decision = run.decision
    cached = run.cache.get(run.kernel, run.fingerprint)
    if cached is None or (run.now and cached["state"] == FAILED):
        return None
    if cached["state"] == VERIFIED:
        events.debug(f"{run.kernel}: verified earlier ({cached['reason']})", run.kernel)
        return Outcome(run.kernel, OutcomeState.OK, decision.reason)
    return failed_outcome(decision, cached["reason"], remembered=cached, settings=run.settings, pins=run.pins)


def _remembered_failure(run: Run) -> Outcome | None:
    """A failure remembered from an earlier attempt, said again instead of trying - at interpreter starts;
    a command the user typed (`now`) tries."""
    if run.now:
        return None
    cached = run.cache.get(run.kernel, run.fingerprint)
    if cached is not None and cached["state"] == FAILED:
        return failed_outcome(run.decision, cached["reason"], remembered=cached, settings=run.settings, pins=run.pins)
    return None


def batch_of(run) -> tuple:
    """The acting decisions installed together with this one (decide/policy/), in dependency
    order, this one among them: the compiled kernels of the same request - being ensured in this
    process now, or said to be coming (engine.expect) - whose other needs are already usable. Just
    this decision otherwise (or a repair)."""
    if run.repairing or run.request is None:
        return (run.decision,)
    request = run.request()
    return batch(run.plan, run.pins, run.kernel, request=request.kernels, good=request.good, decision=run.decision)


def install_together(run, batch: tuple):
    """This kernel and the others of its request in one batch (World.install_batch). The others'
    verdicts are written here, under the fingerprint of what is on disk now, and remembered in the
    World for their own runs (CHECK), which then neither check nor install again. Returns this kernel's
    Run for RECORD (its verdict, and its install's result when it went in)."""
    world, settings, kernel, pins = run.world, run.settings, run.kernel, run.pins
    for decision in batch:   # each member's own reason, said as one install says it
        events.status(short.line(decision), decision.kernel,
                      detail=f"{decision.kernel}: installing {describe(decision, whole=True)} ({decision.reason})")
    events.status(f"{kernel}: installing {' and '.join(d.kernel for d in batch)} together: one installer call, "
                  "one check", kernel)
    try:
        result = world.install_batch(batch, settings=settings, env=run.env, pins=pins)
        results, failed, numeric = dict(result.results), dict(result.failed), set(result.numeric)
    except InstallFailed as exc:
        results, failed, numeric = {}, {d.kernel: str(exc) for d in batch}, set()
    any_result = next(iter(results.values()), None)
    env = world.settle(run.env, settings, pins, any_result) if any_result is not None else run.env
    for decision in batch:
        other = decision.kernel
        if other == kernel:
            continue
        done = results.get(other)
        if done is not None:
            detail = installed_line(other, done, decision)
            verdict = (world.fingerprint(env, settings, pins, other), VERIFIED, f"installed with {kernel}")
            world.batched[other] = Batched(True, decision.reason, kernel)
        else:
            detail = failed.get(other, "not installed")
            verdict = (world.fingerprint(env, settings, pins, other), FAILED, detail)
            world.batched[other] = Batched(False, detail, kernel, other in numeric)
            events.error(engine_line(f"{other}: could not install - ", detail), other, once=f"fail-{other}",
                         detail=f"{other}: could not install - {detail}")
        if not run.cache.record(other, verdict=verdict):
            events.debug(f"{other}: verdict not cached (the cache is read-only or busy)", other)
        events.debug(f"{other}: {detail}", other)
    mine = results.get(kernel)
    if mine is None:
        why = failed.get(kernel, "not installed")
        decision = numeric_block(run.decision, why, run.env.gpus) if kernel in numeric else run.decision   # as _install
        return replace(run, decision=decision, verdict=(False, why))
    return replace(run, verdict=(True, f"installed in {mine.seconds:.1f} s"), installed=mine)
