"""An install killed half-way leaves its journal (and a half-written kernel) behind: it is rolled back
under the environment lock before any kernel is imported - at every install() and start-up hand-over
(hooks.install: one access(2), the same rule as `pending_journal`), at the import of a kernel that
install(kernels=...) leaves out (hooks/importer.py), and in every decision, a skipped kernel's too
(machine.py: CONTEXT, READ). Through the World (world.py), like everything the engine does outside.

The journal exists while an install runs too: taking the lock waits for that install, after which the
journal is gone (committed) or its writer is dead (rolled back here)."""

from __future__ import annotations

import os
import sys

from .. import events
from ..act.files import JOURNAL, STATE_DIR_NAME
from ..events import fitted
from . import current_world
from .lock import LockUnavailable

LABEL = "an interrupted install"   # who waits, in the lock's "waiting for another process" line


def pending_journal() -> str | None:
    """The journal hooks.install() looks for (the same rule, as a function), or None."""
    prefix = sys.prefix + os.sep
    for entry in sys.path:
        if entry.endswith("-packages") and entry.startswith(prefix):
            journal = os.path.join(entry, STATE_DIR_NAME, JOURNAL)
            if os.path.exists(journal):
                return journal
    return None


def recover_now(wait: bool = True) -> None:
    """Roll back this environment's interrupted install, if any, with the settings a decision reads.
    wait=False (install()): only when the lock is free now - an install holding it is running, not
    interrupted (in another thread or process), and whoever imports its kernel waits for it there."""
    world = current_world()
    settings, _, invalid = world.context()
    if not world.pending(settings):
        return
    if settings.mode == "report":
        events.warning(fitted("an interrupted install here is not rolled back: ", invalid or "FASTPATH_HOOKS_MODE=report",
                              "a run in install mode rolls it back"), once="interrupted-report",
                       detail=f"an install into this environment was interrupted ({world.state_dir(settings)}); it is "
                              f"not rolled back because {invalid or 'FASTPATH_HOOKS_MODE=report'}")
        return
    lock = world.lock(settings, LABEL)
    if wait:
        try:
            lock.acquire()
        except LockUnavailable as exc:
            events.error(fitted(f"{LABEL} here could not be rolled back yet: ", exc, "the next kernel import tries again"),
                         once="recover-now",
                         detail=f"{LABEL} in this environment could not be rolled back yet: {exc}; the next kernel "
                                "import tries again")
            return
    elif lock.try_acquire() is None:
        events.debug(f"an install into this environment is running ({world.state_dir(settings)}); the imports of "
                     "its kernel wait for it")
        return
    try:
        world.recover(settings)
    finally:
        lock.release()
