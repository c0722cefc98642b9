"""An install killed half-way leaves its journal (and a half-written kernel) behind: it is rolled back
under the environment lock before any kernel is imported or trusted - at every install() and start-up
hand-over (hooks.install: one stat, the same as `pending_journal`) and at the start of every decision, whatever the
kernel and whatever FASTPATH_HOOKS_SKIP or install(kernels=...) leave out.

The journal exists while an install runs too: taking the lock waits for that install, after which the
journal is gone (committed) or its writer is dead (rolled back here)."""

from __future__ import annotations

import os

from .. import events
from .lock import EnvironmentLock, LockUnavailable

LABEL = "an interrupted install"


def pending_journal() -> str | None:
    """The journal path hooks.install() checks (the same rule, as a function), or None."""
    import sys

    from ..act.state import JOURNAL, STATE_DIR_NAME

    prefix = sys.prefix + os.sep
    for entry in sys.path:
        if entry.endswith("-packages") and entry.startswith(prefix):
            journal = os.path.join(entry, STATE_DIR_NAME, JOURNAL)
            if os.path.exists(journal):
                return journal
    return None   # who waits, in the lock's "waiting for another process" line


def recover_interrupted(settings, *, invalid: str | None = None, kernel: str | None = None,
                        wait: bool = True) -> str | None:
    """Roll back this environment's interrupted install, if any. None when there was none, it is rolled
    back, or report mode keeps it (said once); else why it could not be (the lock). wait=False: only if
    the lock is free now - an install that holds it is running, not interrupted, and whoever imports its
    kernel waits for it there."""
    from ..act.state import JOURNAL, environment_state_dir

    state_dir = environment_state_dir(settings)
    if not os.path.exists(os.path.join(state_dir, JOURNAL)):
        return None
    if settings.mode == "report":
        events.warning(f"an install into this environment was interrupted ({state_dir}); it is not rolled back "
                       f"because {invalid or 'FASTPATH_HOOKS_MODE=report'}", kernel, once="interrupted-report")
        return None
    from ..act.installer import recover

    if not wait:
        lock = EnvironmentLock(settings, kernel or LABEL).try_acquire()
        if lock is None:
            events.debug(f"an install into this environment is running ({state_dir}); the imports of its kernel "
                         "wait for it", kernel)
            return None
        try:
            recover(state_dir)
        finally:
            lock.release()
        return None
    try:
        with EnvironmentLock(settings, kernel or LABEL):
            recover(state_dir)
    except LockUnavailable as exc:
        return str(exc)
    return None


def recover_now(wait: bool = True) -> None:
    """When the one stat found a journal: the settings as a decision reads them, then the rollback.
    install() (wait=False) rolls back a dead install's leftovers before it returns, so before the script
    imports any kernel; an install running now (in another thread or process) is not waited for there."""
    from .context import load

    settings, _, invalid = load()
    why = recover_interrupted(settings, invalid=invalid, wait=wait)
    if why:
        events.error(f"{LABEL} in this environment could not be rolled back yet: {why}; the next kernel import "
                     "tries again", once="recover-now")
