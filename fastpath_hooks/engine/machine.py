"""One kernel's decision as an explicit state machine: `run(kernel)` loops `state, run = STEP[state](run)`
over small transition functions until DONE, carrying an immutable `Run` (each step returns a new one).

    CONTEXT -> RECOVER -> PROBE -> PLAN -> NEEDS -> CACHED -> LOCK -> REPLAN -> VERIFY / INSTALL -> RECORD -> DONE
                                               \\-> REPORT (report mode: say what would be done)

- CONTEXT: settings and pins (bad ones: report mode, said once).
- RECOVER: an install killed half-way left a journal: rolled back under the lock before anything is trusted
  (recovery.py); then a kernel in FASTPATH_HOOKS_SKIP ends here.
- PROBE, PLAN: the environment, then the pure policy's decision (variables it asks for are set here).
- NEEDS: the kernels this one needs first (fla on Hopper: tilelang), each through `ensure()`, while this
  thread holds no lock: a dependency is decided once, by whoever asks first.
- CACHED: the verdict cache under the fingerprint of the facts this kernel depends on: a kernel verified
  before is not verified again; a failed attempt is not retried for FASTPATH_HOOKS_RETRY_AFTER seconds.
- LOCK, REPLAN: the environment lock (one process - and one thread - installs or verifies at a time), then
  the world is read again: another process may have done it (or failed) meanwhile.
- VERIFY: an installed kernel imported in a child process; a failure with a repair on offer re-plans as
  that repair (back to LOCK, or REPLAN when the lock is held) instead of recursing.
- INSTALL: the plan's steps in a transaction (verified in a child process before commit).
- RECORD: every verdict is written here (under the fingerprint of what is on disk now).
The lock is released by the loop, whatever state it ends in.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from .. import events
from .._names import MODULE_OF
from .outcome import GOOD, Outcome, OutcomeState, apply_env
from .context import complete, fingerprint, load
from .lock import EnvironmentLock, LockUnavailable
from ..decide.plan import OnFailure, StepKind

GLOBAL_SKIPS = ("skip.no-accelerator", "skip.no-torch")
# rule families (the part after "<kernel>.") whose skip is a warning: the user can and should act on it
WARNING_SKIPS = ("hazard", "no-nvcc", "no-wheel")


class State(enum.Enum):
    CONTEXT = "context"
    RECOVER = "recover"
    PROBE = "probe"
    PLAN = "plan"
    NEEDS = "needs"
    CACHED = "cached"
    REPORT = "report"
    LOCK = "lock"
    REPLAN = "replan"
    VERIFY = "verify"
    INSTALL = "install"
    RECORD = "record"
    DONE = "done"


@dataclass(frozen=True)
class Run:
    """Where one kernel's decision stands. Immutable: every step returns a new one."""
    kernel: str
    needs: object = None              # kernel -> Outcome: how a kernel needed first is decided (ensure)
    settings: object = None
    pins: object = None
    invalid: str | None = None        # why report mode although nobody asked for it (a bad variable/pins file)
    env: object = None                # the probed Environment (read again under the lock and after an install)
    plan: object = None
    decision: object = None           # this kernel's decision (a repair replaces it)
    planned: str | None = None        # the action decided before the lock: another process may have done it
    repairing: bool = False           # `decision` is the repair of a failed verification
    cache: object = None              # the VerdictCache
    fingerprint: str | None = None    # of the facts this kernel's verdict depends on
    lock: EnvironmentLock | None = None   # held from LOCK until the loop ends
    verdict: tuple | None = None      # (good, detail) for RECORD to write
    installed: object = None          # the installer's result, when INSTALL ran
    outcome: Outcome | None = None

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


def run(kernel: str, needs) -> Run:
    """Decide `kernel` (the registry makes sure this runs once per process); the final Run.
    `needs(other)` -> Outcome decides a kernel this one needs first (the engine's `ensure`)."""
    state, current = State.CONTEXT, Run(kernel, needs=needs)
    try:
        while state is not State.DONE:
            before = state
            state, current = STEP[state](current)
            events.logger.debug("%s: %s -> %s", kernel, before.value, state.value)
    finally:
        if current.lock is not None:
            current.lock.release()
    return current


# -- the steps ------------------------------------------------------------------------------

def _context(run: Run):
    settings, pins, invalid = load()
    return State.RECOVER, replace(run, settings=settings, pins=pins, invalid=invalid)


def _recover(run: Run):
    """An install killed half-way is rolled back first (recovery.py) - for a kernel in FASTPATH_HOOKS_SKIP
    too, whose import would otherwise run on the half-written tree."""
    from .recovery import recover_interrupted

    failed = recover_interrupted(run.settings, invalid=run.invalid, kernel=run.kernel)
    if failed is not None:
        events.error(f"{run.kernel}: {failed}; leaving it as it is", run.kernel, once=f"fail-{run.kernel}")
        return run.done(Outcome(run.kernel, OutcomeState.FAILED, failed))
    if run.kernel in run.settings.skip:
        events.debug(f"{run.kernel}: skipped by FASTPATH_HOOKS_SKIP", run.kernel)
        return run.done(Outcome(run.kernel, OutcomeState.SKIPPED, "skipped by FASTPATH_HOOKS_SKIP"))
    return State.PROBE, run


def _probe(run: Run):
    from ..facts.probe import probe

    return State.PLAN, replace(run, env=probe(run.settings, pins=run.pins))


def _plan(run: Run):
    from ..decide.plan import BLOCK, SKIP
    from ..decide.policy import decide

    env, plan = complete(run.env, decide(run.env, run.settings, run.pins), run.settings, run.pins)
    decision = plan[run.kernel]
    run = replace(run, env=env, plan=plan, decision=decision, planned=decision.action)
    apply_env(run.kernel, decision.env, decision.reason if decision.action == SKIP else "for this accelerator")
    if decision.action == SKIP:
        return run.done(_skipped(decision, plan, quiet=run.invalid is not None))
    if decision.action == BLOCK:
        return run.done(_blocked(decision, decision.reason, decision.fix))
    return State.NEEDS, run


def _needs(run: Run):
    decision = run.decision
    for dep in decision.needs:
        dep_outcome = run.needs(dep)   # no lock of ours is held here: it may be decided by another thread
        if dep_outcome.state == OutcomeState.REPORTED:
            continue   # report mode: the dependency would be installed, so would this kernel (said below)
        if dep_outcome.state not in GOOD:
            why = f"{run.kernel} needs {dep} here and {dep} is not usable ({dep_outcome.reason})"
            if decision.on_failure == OnFailure.BLOCK:
                return run.done(_blocked(decision, why, decision.fix or _hazard_fix(run.pins, run.kernel)))
            say = events.debug if run.invalid is not None else events.warning
            say(f"{why}; {run.kernel} is not installed, transformers keeps its torch path", run.kernel)
            return run.done(Outcome(run.kernel, OutcomeState.SKIPPED, why))
    return State.CACHED, run


def _cached(run: Run):
    from ..act.state import VerdictCache
    from ..decide.plan import OK

    decision, settings = run.decision, run.settings
    run = replace(run, cache=VerdictCache(settings), fingerprint=fingerprint(run.env, settings, run.pins, run.kernel))
    if decision.action == OK:
        if not decision.verify:
            events.debug(f"{run.kernel}: {decision.reason}", run.kernel)
            return run.done(Outcome(run.kernel, OutcomeState.OK, decision.reason))
        known = _known(run)
        if known is not None:
            return run.done(known)
        # report mode takes no lock; a verdict is all it writes
        return (State.VERIFY if settings.mode == "report" else State.LOCK), run
    if settings.mode == "report":
        return State.REPORT, run
    failed = _remembered_failure(run)
    return (State.DONE, replace(run, outcome=failed)) if failed is not None else (State.LOCK, run)


def _report(run: Run):
    decision, kernel = run.decision, run.kernel
    why = run.invalid or "FASTPATH_HOOKS_MODE=report"
    message = f"{kernel}: would {decision.action} {_describe(decision)}; nothing is installed: {why}"
    if run.invalid is not None:   # the one line about the bad variable said it: nothing is installed
        events.debug(message, kernel)
    else:
        events.warning(message, kernel, once=f"report-{kernel}", persist=f"{decision.rule}:report:{why}:{decision.reason}")
    if decision.on_failure == OnFailure.BLOCK and decision.installed:
        return run.done(_blocked(decision, decision.reason + " (report mode: not repaired)", decision.fix))
    return run.done(Outcome(kernel, OutcomeState.REPORTED, decision.reason))


def _lock(run: Run):
    from ..decide.plan import OK

    try:
        lock = EnvironmentLock(run.settings, run.kernel).acquire()
    except LockUnavailable as exc:
        if run.decision.action == OK and not run.repairing:  # verifying unlocked is what the lock only saves repeating
            events.debug(f"{run.kernel}: {exc}; verifying without it", run.kernel)
            return State.VERIFY, run
        return run.done(_failed(run.decision, str(exc)))
    return State.REPLAN, replace(run, lock=lock)


def _replan(run: Run):
    """Under the lock: roll back an interrupted install, then read the world again - another process
    may have installed, verified or failed while this one waited. A repair keeps its decision."""
    from ..act.installer import recover
    from ..act.state import environment_state_dir
    from ..decide.plan import BLOCK, OK, SKIP
    from .context import snapshot

    recover(environment_state_dir(run.settings))
    env, plan = snapshot(run.settings, run.pins)
    current = run.decision if run.repairing else plan[run.kernel]
    run = replace(run, env=env, plan=plan, decision=current,
                  fingerprint=fingerprint(env, run.settings, run.pins, run.kernel))
    kernel = run.kernel
    if not run.repairing:
        if current.action == OK:
            known = None if current.verify else Outcome(kernel, OutcomeState.OK, current.reason)
            if known is None:
                known = _known(run)
            if known is None:
                return State.VERIFY, run
            if known.state == OutcomeState.OK and run.planned != OK:  # this process was about to install it
                events.status(f"{kernel}: ready - done by another process while this one waited: {current.reason}",
                              kernel, once=f"done-{kernel}")
            return run.done(known)
        if current.action == SKIP:
            return run.done(_skipped(current, plan, quiet=run.invalid is not None))
        if current.action == BLOCK:
            return run.done(_blocked(current, current.reason, current.fix))
    failed = _remembered_failure(run)  # another process failed while we waited: its verdict, not a second attempt
    return (State.DONE, replace(run, outcome=failed)) if failed is not None else (State.INSTALL, run)


def _verify(run: Run):
    from ..act.verify import verify
    from ..decide.plan import REPAIR

    decision, settings, kernel = run.decision, run.settings, run.kernel
    result = verify(run.pins.kernel(kernel), timeout=settings.timeout, env_extra=decision.env)
    if result.ok:
        return State.RECORD, replace(run, verdict=(True, result.detail))
    if decision.repair_steps and settings.mode == "install":
        events.warning(f"{kernel}: {result.detail}; repairing", kernel)
        repair = replace(decision, action=REPAIR, steps=decision.repair_steps,
                         reason=f"{result.detail}; repairing", rule=decision.rule + ".repair",
                         target=_target_of(decision.repair_steps))
        return (State.REPLAN if run.lock is not None else State.LOCK), replace(run, decision=repair, repairing=True)
    return State.RECORD, replace(run, verdict=(False, result.detail))


def _install(run: Run):
    from ..act.installer import InstallError, run_steps
    from ..act.state import environment_state_dir
    from ..decide.commands import installer_choice
    from ..decide.plan import REPAIR

    current, settings, kernel = run.decision, run.settings, run.kernel
    installer, why = installer_choice(settings, run.env)
    if installer is None:  # not remembered as a failed attempt: fixing it takes effect at the next start
        events.warning(f"{kernel}: not installed - {why}", kernel, once=f"fail-{kernel}",
                       persist=f"{current.rule}:no-installer:{why}")
        return run.done(Outcome(kernel, OutcomeState.FAILED, why))
    verb = "repairing" if current.action == REPAIR else "installing"
    events.status(f"{kernel}: {verb} {_describe(current)} ({current.reason})", kernel)
    try:
        result = run_steps(current, settings=settings, env=run.env, pins=run.pins,
                           state_dir=environment_state_dir(settings), verify_specs=(run.pins.kernel(kernel),),
                           kernel_env=current.env)
    except InstallError as exc:
        return State.RECORD, replace(run, verdict=(False, str(exc)))
    return State.RECORD, replace(run, verdict=(True, f"{verb[:-3]}ed in {result.seconds:.1f} s"), installed=result)


def _record(run: Run):
    """Write the verdict - after an install under the fingerprint of what is on disk now (the warm
    verdict is earned under it too) - and say the outcome."""
    from ..act.state import FAILED
    from ..act.state import GOOD as VERIFIED
    from ..decide.plan import REPAIR
    from .context import snapshot

    good, detail = run.verdict
    decision, kernel = run.decision, run.kernel
    if run.installed is not None:
        env, _ = snapshot(run.settings, run.pins)
        run = replace(run, env=env, fingerprint=fingerprint(env, run.settings, run.pins, kernel))
    run.cache.put(kernel, run.fingerprint, VERIFIED if good else FAILED, detail)
    if not good:
        return run.done(_failed(decision, detail))
    result = run.installed
    if result is None:
        events.debug(f"{kernel}: {detail}", kernel)
        return run.done(Outcome(kernel, OutcomeState.OK, decision.reason))
    repaired = decision.action == REPAIR
    done = ", ".join(f"{k} {v}" for k, v in sorted(result.installed.items())) or _describe(decision)
    events.status(f"{kernel}: {'repaired' if repaired else 'installed'} {done} in {result.seconds:.1f} s with "
                  f"{result.installer}; verified in a child process", kernel)
    if result.restart_advised:
        events.warning(f"this process had already imported {', '.join(result.restart_advised)} before it changed on "
                       "disk; restart it to avoid running mixed versions", kernel)
    return run.done(Outcome(kernel, OutcomeState.REPAIRED if repaired else OutcomeState.INSTALLED, decision.reason))


STEP = {
    State.CONTEXT: _context,
    State.RECOVER: _recover,
    State.PROBE: _probe,
    State.PLAN: _plan,
    State.NEEDS: _needs,
    State.CACHED: _cached,
    State.REPORT: _report,
    State.LOCK: _lock,
    State.REPLAN: _replan,
    State.VERIFY: _verify,
    State.INSTALL: _install,
    State.RECORD: _record,
}


# -- outcomes and the lines that say them ---------------------------------------------------

def _known(run: Run) -> Outcome | None:
    """The cached verdict of an installed kernel: good, or a failure remembered for
    FASTPATH_HOOKS_RETRY_AFTER (not verified again, whatever repair the plan offers)."""
    from ..act.state import GOOD as VERIFIED

    decision = run.decision
    cached = run.cache.get(run.kernel, run.fingerprint)
    if cached is None:
        return None
    if cached["state"] == VERIFIED:
        events.debug(f"{run.kernel}: verified earlier ({cached['reason']})", run.kernel)
        return Outcome(run.kernel, OutcomeState.OK, decision.reason)
    return _failed(decision, cached["reason"], remembered=cached, settings=run.settings)


def _remembered_failure(run: Run) -> Outcome | None:
    from ..act.state import FAILED

    cached = run.cache.get(run.kernel, run.fingerprint)
    if cached is not None and cached["state"] == FAILED:
        return _failed(run.decision, cached["reason"], remembered=cached, settings=run.settings)
    return None


def _skipped(decision, plan, quiet: bool = False) -> Outcome:
    """quiet: settings are invalid - the one line about them was said; the skip goes to the debug log."""
    if quiet:
        events.debug(f"{decision.kernel}: not installed - {decision.reason}", decision.kernel)
        return Outcome(decision.kernel, OutcomeState.SKIPPED, decision.reason)
    if decision.rule in GLOBAL_SKIPS:
        kernels = ", ".join(plan.decisions)
        why = plan.notes[0] if plan.notes else decision.reason
        events.emit(events.Severity.STATUS, f"{why}; nothing to install, transformers keeps its torch path ({kernels})",
                    decision.kernel, once="global-skip", persist=f"{decision.rule}:{why}")
    else:
        tail = f" ({decision.fix})" if decision.fix else ""
        family = decision.rule.split(".")[1] if "." in decision.rule else ""
        kind = events.Severity.WARNING if family in WARNING_SKIPS else events.Severity.STATUS
        events.emit(kind, f"{decision.kernel}: not installed - {decision.reason}{tail}", decision.kernel,
                    once=f"skip-{decision.kernel}", persist=f"{decision.rule}:{decision.reason}")
    return Outcome(decision.kernel, OutcomeState.SKIPPED, decision.reason)


def _blocked(decision, reason: str, fix: str) -> Outcome:
    message = (f"fastpath-hooks blocked `import {MODULE_OF[decision.kernel]}`: {reason}; "
               f"using transformers' torch path." + (f" Fix: {fix}." if fix else ""))
    events.warning(f"{decision.kernel}: blocked - {reason}" + (f" (fix: {fix})" if fix else ""), decision.kernel,
                   once=f"block-{decision.kernel}")
    return Outcome(decision.kernel, OutcomeState.BLOCKED, reason, block=message)


def _failed(decision, reason: str, remembered: dict | None = None, settings=None) -> Outcome:
    """remembered: the cached verdict of an earlier failed attempt (not retried until it expires)."""
    if remembered is not None:
        reason = remembered["reason"]
    if decision.on_failure == OnFailure.BLOCK:
        return _blocked(decision, reason, decision.fix or "")
    persist = None
    if remembered is not None:
        retry = _retry_in(remembered, settings)
        message = f"{decision.kernel}: failed, retry in {retry} (FASTPATH_HOOKS_RETRY_AFTER): {reason}"
        # said once per failure: it would repeat at every start until FASTPATH_HOOKS_RETRY_AFTER expires
        persist = f"{decision.rule}:failed:{remembered.get('ts')}"
    else:
        message = f"{decision.kernel}: could not {decision.action} - {reason}"   # the torch path stays
    events.error(message, decision.kernel, once=f"fail-{decision.kernel}", persist=persist)
    return Outcome(decision.kernel, OutcomeState.FAILED, reason)


def _retry_in(entry: dict, settings) -> str:
    import time

    left = max(0.0, float(entry.get("ts", 0)) + (settings.retry_after if settings else 0) - time.time())
    return f"{left / 60:.0f} min" if left >= 120 else f"{left:.0f} s"


def _describe(decision) -> str:
    if decision.target:
        return " + ".join(f"{k} {v}" for k, v in decision.target.items())
    return ", ".join(r for s in decision.steps for r in s.requirements)


def _target_of(steps) -> dict:
    """dist -> version the kernel/replace steps pin (read from the steps' parsed requirements)."""
    out = {}
    for step in steps:
        if step.kind in (StepKind.KERNEL, StepKind.REPLACE):
            out.update(step.exact)
    return out


def _hazard_fix(pins, kernel: str) -> str:
    for hz in pins.hazards:
        if hz.kernel == kernel:
            return hz.fix
    return ""
