"""What a decision gives its callers: the Outcome and the variables it sets in this process. The warm path
answers with these alone, so this module imports only the leaves and events (said.py says the outcomes)."""

from __future__ import annotations

import os

from .. import events
from ..events import TextEnum


class OutcomeState(TextEnum):
    """What ensure() did for a kernel (the `state` of `install` output and verdicts)."""
    OK = "ok"                  # usable as it was
    INSTALLED = "installed"    # installed and verified now
    REPAIRED = "repaired"      # a broken install replaced and verified now
    SKIPPED = "skipped"        # left alone: transformers keeps its torch path
    BLOCKED = "blocked"        # `import <kernel>` fails on purpose (it would crash or compute wrongly)
    FAILED = "failed"          # the install or its check failed; nothing is left half installed
    REPORTED = "reported"      # report mode: decided, nothing done
    ERROR = "error"            # an internal error; transformers keeps its torch path
    PENDING = "pending"        # asked for from inside its own decision (a callback)


GOOD = (OutcomeState.OK, OutcomeState.INSTALLED, OutcomeState.REPAIRED)     # the kernel is usable
CHANGED = (OutcomeState.INSTALLED, OutcomeState.REPAIRED)                   # what is on disk changed
BAD = (OutcomeState.FAILED, OutcomeState.ERROR, OutcomeState.BLOCKED)       # went wrong (not merely left alone)


class Outcome:
    """What ensure() did for a kernel. A plain class: it loads on the first kernel import, where
    dataclasses may not be loaded yet."""

    __slots__ = ("kernel", "state", "reason", "block", "first_call")

    def __init__(self, kernel: str, state: OutcomeState, reason: str, block: str | None = None, first_call=None):
        self.kernel = kernel
        self.state = OutcomeState(state)
        self.reason = reason
        self.block = block      # when set, `import <kernel>` fails with this message
        self.first_call = first_call   # engine/first_call.FirstCall: its check waits for the kernel's first call

    def __setattr__(self, name, value):
        if hasattr(self, name):  # set once, in __init__: an outcome is shared by every caller
            raise AttributeError(f"Outcome.{name} is read-only")
        object.__setattr__(self, name, value)

    def __repr__(self):
        return (f"Outcome(kernel={self.kernel!r}, state={self.state.value!r}, reason={self.reason!r}, "
                f"block={self.block!r})")


def apply_env(kernel: str, pairs, why: str) -> None:
    """Set the variables a decision asks for (FLA_TILELANG=0 ...) in this process, unless the user set them."""
    for name, value in pairs:
        if name not in os.environ:
            os.environ[name] = value
            events.status(f"set {name}={value} ({why})", kernel, human=False)
