"""What a decision gives its callers: the Outcome, and the variables it sets in this process."""

from __future__ import annotations

import os

from .. import events

GOOD = ("ok", "installed", "repaired")


class Outcome:
    """What ensure() did for a kernel. (A plain class: this module loads on the first kernel
    import, where typing/dataclasses may not be loaded yet.)"""

    __slots__ = ("kernel", "state", "reason", "block")

    def __init__(self, kernel: str, state: str, reason: str, block: str | None = None):
        self.kernel = kernel
        self.state = state      # ok installed repaired skipped blocked failed reported error pending
        self.reason = reason
        self.block = block      # when set, `import <kernel>` fails with this message

    def __setattr__(self, name, value):
        if hasattr(self, name):  # set once, in __init__: an outcome is shared by every caller
            raise AttributeError(f"Outcome.{name} is read-only")
        object.__setattr__(self, name, value)

    def __repr__(self):
        return f"Outcome(kernel={self.kernel!r}, state={self.state!r}, reason={self.reason!r}, block={self.block!r})"


def apply_env(kernel: str, pairs, why: str) -> None:
    """Set the variables a decision asks for (FLA_TILELANG=0 ...) in this process, unless the user set them."""
    for name, value in pairs:
        if name not in os.environ:
            os.environ[name] = value
            events.status(f"set {name}={value} ({why})", kernel, human=False)
