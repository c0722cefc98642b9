"""The lines each outcome is said in: machine.py decides which one, this module only says it (not on the warm
path: it reads the plan's decisions and their rules' wording)."""

from __future__ import annotations

import time
from dataclasses import replace

from .. import events
from .._registry import registry
from ..decide import messages as short
from ..decide.plan import OK, OnFailure, REPAIR
from ..events import first_fitting, fitted
from .outcome import Outcome, OutcomeState, apply_env


def installed_outcome(kernel: str, result, decision, pins, check_failed: str | None = None) -> Outcome:
    """An install's line - a lone kernel's, a batch leader's or member's alike - and its Outcome: the kernel's
    own distributions (whole, then without a built wheel's local label) and how many dependencies came along."""
    repaired = decision.action == REPAIR
    listed = [_listed(kernel, result, decision, pins, whole) for whole in (True, False)]
    said = [f"{kernel}: {'repaired' if repaired else 'installed'} {what} in {result.seconds:.1f} s with "
            f"{result.installer}; {result.checked}" for what in listed]
    events.status(first_fitting(*said), kernel, detail=said[0])   # a long local label: doctor
    if result.restart_advised:   # shared by a batch's members: said once
        events.warning(f"{kernel}: this process had already imported {short.few(result.restart_advised)} before it "
                       "changed on disk; restart it to avoid running mixed versions", kernel,
                       once=f"restart-{','.join(result.restart_advised)}")
    reason = f"{check_failed}; repaired" if check_failed else decision.reason
    return Outcome(kernel, OutcomeState.REPAIRED if repaired else OutcomeState.INSTALLED, reason)


def _listed(kernel: str, result, decision, pins, whole: bool) -> str:
    """The kernel's own distributions an install put in (`whole`: with a built wheel's local label) and how many
    dependencies came along."""
    own = [(k, v) for k, v in sorted(result.installed.items()) if k in pins.kernel(kernel).distributions]
    others = len(result.installed) - len(own)
    deps = f" (+{others} dependenc{'y' if others == 1 else 'ies'})" if others else ""
    return ", ".join(f"{k} {v if whole else short.public(v)}" for k, v in own) + deps if own else describe(decision)


def said_later(kernel: str, result, decision, pins) -> str:
    """What a later start says of a kernel this process installed (its warm verdict): the decision's reason, but
    after a repair what the repair put in and when - its reason ("... is broken; repairing to ...") is no longer
    true."""
    if decision.action != REPAIR:
        return decision.reason
    listed = _listed(kernel, result, decision, pins, False)
    return f"{listed} put in by a repair on {time.strftime('%Y-%m-%d')}, checked"


def skipped_outcome(decision, plan, pins, quiet: bool = False) -> Outcome:
    """Said at the severity its rule declares (decide/messages.py); a machine-wide one once for every kernel.
    quiet: settings are invalid - the one line about them was said; the skip goes to the debug log."""
    if quiet:
        events.debug(f"{decision.kernel}: not installed - {decision.reason}", decision.kernel)
        return Outcome(decision.kernel, OutcomeState.SKIPPED, decision.reason)
    rule = short.lookup(pins, decision.rule)
    if rule is not None and rule.machine_wide:
        why = plan.notes[0] if plan.notes else decision.reason
        events.status(short.machine_line(decision), decision.kernel, once="global-skip",
                      persist=f"{decision.rule}:{why}",
                      detail=f"{why}; nothing to install, transformers keeps its torch path "
                             f"({', '.join(plan.decisions)})")
    else:
        kind = rule.severity if rule is not None else events.Severity.STATUS
        # said once per environment; a later start reminds in one line while the kernel stays missing
        missing = not decision.installed and (decision.short_fix if decision.short_reason else decision.fix)
        events.emit(kind, short.line(decision), decision.kernel, once=f"skip-{decision.kernel}",
                    persist=f"{decision.rule}:{decision.reason}",
                    reminder=reminder_for(decision.kernel) if missing else None,
                    detail=f"{decision.kernel}: {short.outcome(decision)} - {decision.reason}" +
                           (f" ({decision.fix})" if decision.fix else ""))
    return Outcome(decision.kernel, OutcomeState.SKIPPED, decision.reason)


def reminder_for(kernel: str) -> str | None:
    """A later start's line for a kernel still missing - not for one that serves another (fla's line says it)."""
    return None if (registry().get(kernel) or {}).get("serves") else short.reminder(kernel)


def keeps_instead(kernel: str, torch_path: str = "transformers keeps its torch path") -> str:
    """What runs instead of a kernel that is not installed: a backend's served kernel keeps its own path."""
    entry = registry().get(kernel) or {}
    return f"{' and '.join(entry['serves'])} keeps its own path" if entry.get("kind") == "backend" else torch_path


def blocked_outcome(decision, reason: str, fix: str, *, said: tuple | None = None) -> Outcome:
    """The import fails with the whole reason and fix; the line says `said` (reason, fix), else the
    decision's short form of its own reason, else the reason handed over (a failed check), fitted."""
    module = registry()[decision.kernel]["modules"][0]
    message = (f"fastpath-hooks blocked `import {module}`: {reason}; "
               f"using transformers' torch path." + (f" Fix: {fix}." if fix else ""))
    if said is None and decision.short_reason and reason == decision.reason:
        said = (decision.short_reason, decision.short_fix)
    elif said is None:   # a reason the engine was handed (a failed check): the decision's short fix
        said = (reason, decision.short_fix if decision.short_reason and fix == decision.fix else fix)
    head = f"{decision.kernel}: {short.BLOCKED} - "
    events.warning(engine_line(head, *said), decision.kernel, once=f"block-{decision.kernel}",
                   detail=f"{decision.kernel}: blocked - {reason}" + (f" (fix: {fix})" if fix else ""))
    return Outcome(decision.kernel, OutcomeState.BLOCKED, reason, block=message)


def failed_outcome(decision, reason: str, remembered: dict | None = None, settings=None) -> Outcome:
    """`remembered`: the cached verdict of an earlier failed attempt (not retried until it expires). A
    backend that failed is switched off in the kernel it serves (`off`): its import is never blocked."""
    if remembered is not None:
        reason = remembered["reason"]
    if decision.on_failure == OnFailure.BLOCK:
        return blocked_outcome(decision, reason, decision.fix or "")
    apply_env(decision.kernel, decision.off, "it is not usable here")
    persist, reminder = None, None
    if remembered is not None:
        # when it was seen, why, and the command that tries now (a start tries again after RETRY_AFTER)
        seen = float(remembered.get("ts", 0))
        ago = _span(max(0.0, time.time() - seen))
        retry = _span(max(0.0, seen + (settings.retry_after if settings else 0) - time.time()))
        head, now = f"{decision.kernel}: failed {ago} ago: ", f"now: fastpath-hooks install {decision.kernel}"
        message = first_fitting(f"{head}{reason} (tried again in {retry}; {now})",
                                fitted(head, reason, now, whole_at=None))
        reason_whole = (f"{reason} (seen {ago} ago; tried again in {retry}, FASTPATH_HOOKS_RETRY_AFTER, or now by "
                        f"`fastpath-hooks install {decision.kernel}`)")
        # said once per failure: it would repeat at every start until FASTPATH_HOOKS_RETRY_AFTER expires
        persist = f"{decision.rule}:failed:{remembered.get('ts')}"
        reminder = reminder_for(decision.kernel)
    else:
        verb = "verify it" if decision.action == OK else decision.action
        keeps = keeps_instead(decision.kernel, "")
        message = engine_line(f"{decision.kernel}: could not {verb} - ", reason, keeps)
        reason_whole = reason + (f"; {keeps}" if keeps else "")
    events.error(message, decision.kernel, once=f"fail-{decision.kernel}", persist=persist, reminder=reminder,
                 detail=f"{decision.kernel}: could not {decision.action} - {reason_whole}")
    return Outcome(decision.kernel, OutcomeState.FAILED, reason)


def first_call_blocked(kernel: str, detail: str, *, numeric: bool = True) -> Outcome:
    """A kernel whose check at its first call failed (`numeric`: on its numbers, remembered; else it could not
    run, tried again by the next process): blocked from now on in this process, said in one line."""
    fix = short.NUMERIC_SHORT_FIX if numeric else "tried again at the next start; fastpath-hooks doctor"
    head = f"{kernel}: {short.BLOCKED if numeric else 'not checked'} at its first call - "
    events.error(engine_line(head, detail, f"transformers' torch path runs; {fix}"), kernel, once=f"block-{kernel}",
                 detail=f"{head}{detail}; transformers' torch path runs ({fix})")
    module = registry()[kernel]["modules"][0]
    return Outcome(kernel, OutcomeState.BLOCKED, detail,
                   block=f"fastpath-hooks blocked `import {module}`: {detail}; using transformers' torch path.")


def _span(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def engine_line(head: str, detail: str, fix: str = "") -> str:
    """A line about a text handed over (a check's or installer's output): whole, or cut with the fix kept."""
    return fitted(head, detail, fix, whole_at=short.DOCTOR)


def describe(decision, whole: bool = False) -> str:
    if decision.target:
        return " + ".join(f"{k} {v if whole else short.public(v)}" for k, v in decision.target.items())
    return ", ".join(r for s in decision.steps for r in s.requirements)


def numeric_block(decision, detail: str, gpus):
    """The decision a numeric mismatch turns it into: blocked, said as the policy's `<prefix>.block.numeric` will."""
    from ..decide.common import NUMERIC_FIX, numeric_measured

    return replace(decision, on_failure=OnFailure.BLOCK, fix=NUMERIC_FIX, reason=detail,
                   short_reason=numeric_measured(decision.kernel, detail, "+".join(gpus)),
                   short_fix=short.NUMERIC_SHORT_FIX)
