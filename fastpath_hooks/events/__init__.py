"""Events: the `fastpath_hooks` logger, `on_event` callbacks, and the human line.

Every event goes to the logger at DEBUG (all processes) and to every `on_event` callback as a
JSON-serialisable dict (this module: the bus). Human lines go to stderr, prefixed
`fastpath-hooks:`, filtered by FASTPATH_HOOKS_LOG, at most `MAX_LINE` characters (the details
are in `fastpath-hooks doctor` and the debug log: lines.py), from one process per node
(voice.py), and a line that would repeat at every start is said once per environment
(`persist=`; said.py) - later starts say its one-line `reminder=` instead, where it has one. Those
three load at the first human line: an event nobody reads costs a log call.

Callbacks never run while the sending thread holds a lock of ours: while the engine holds the
environment's install lock (`hold()` ... `deliver()`), that thread's events are logged and their
human lines printed at once, and the callbacks get them, in order, right after the lock is
released. A callback may therefore block or call fastpath-hooks itself.
"""

from __future__ import annotations

import logging
import threading  # loaded with logging anyway
import time
from enum import Enum

from .._environ import log_level as _given_log_level
from .._names import DEFAULT_LOG

logger = logging.getLogger("fastpath_hooks")

# from the modules of the human line, loaded when first asked for (`from fastpath_hooks.events import fit`)
_LAZY = {"fit": "lines", "MAX_LINE": "lines", "PREFIX": "lines", "speaks": "voice", "worker": "voice",
         "said_dir": "said", "forget_said": "said"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class TextEnum(str, Enum):
    """A str enum (enum.StrEnum is 3.11+): members equal their strings, print and format as them,
    and JSON writes them as plain strings, so output, callbacks and comparisons with the old strings
    keep working."""

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


class Severity(TextEnum):
    """An event's `type` (what on_event callbacks and the JSON see) and a human line's level."""
    STATUS = "status"
    WARNING = "warning"
    ERROR = "error"
    DEBUG = "debug"      # printed only under FASTPATH_HOOKS_LOG=debug; sent to callbacks as status


_LEVELS = {"debug": 0, "status": 1, "info": 1, "warning": 2, "error": 3, "off": 99}
_held = threading.local()       # per thread: .depth (locks of ours held) and .queue (events for the callbacks)
_listeners_list: list = []      # install(on_event=...) callbacks, in the order given


def add_listener(callback) -> None:
    if callback not in _listeners_list:
        _listeners_list.append(callback)


def clear_listeners() -> None:
    _listeners_list.clear()


def hold() -> None:
    """This thread takes a lock of ours: its events wait for the callbacks until `deliver()`."""
    _held.depth = getattr(_held, "depth", 0) + 1
    if _held.depth == 1:
        _held.queue = []


def deliver() -> None:
    """This thread released that lock: the callbacks get the events sent meanwhile, in order
    (after the outermost lock only)."""
    _held.depth = max(0, getattr(_held, "depth", 0) - 1)
    if _held.depth:
        return
    queue, _held.queue = getattr(_held, "queue", None) or [], []
    for event in queue:
        _call(event)


def held() -> bool:
    """Whether this thread holds a lock of ours now (its callbacks wait)."""
    return getattr(_held, "depth", 0) > 0


def _call(event: dict) -> None:
    for callback in list(_listeners_list):
        try:
            callback(dict(event))
        except Exception as exc:  # a listener's bug must not break the import it observes
            logger.debug("on_event callback %r raised %r", callback, exc)


def _log_level() -> str:
    # a bad value is said by settings (install() and the CLI); the lines follow the default meanwhile
    return _given_log_level() or DEFAULT_LOG


def emit(type: Severity, message: str, kernel: str | None = None, *, human: bool = True, once: str | None = None,
         persist: str | None = None, reminder: str | None = None, detail: str | None = None, **extra) -> dict:
    """Send one event. `once`: a key; the human line is printed once per process for it.
    `persist`: a key (a decision's rule and reason); the line is printed once per environment, and
    `reminder` (one short line) at the later starts instead. `detail`: the whole text of a line that
    is short by design (paths, wheel names, full lists): logged, in the event, and printed instead of
    the line under FASTPATH_HOOKS_LOG=debug."""
    type = Severity(type)
    event = {"type": type, "kernel": kernel, "message": message, "ts": time.time()}
    if detail is not None and detail != message:
        event["detail"] = detail
    for key, value in extra.items():
        event[key] = value
    logger.debug("%s%s: %s", type, f" [{kernel}]" if kernel else "", event.get("detail", message))
    if getattr(_held, "depth", 0):
        _held.queue.append(dict(event))   # called after the lock is released (deliver)
    else:
        _call(event)
    if human:
        say(type, message, once=once, persist=persist, reminder=reminder, detail=event.get("detail"))
    return event


def say(type: Severity, message: str, *, once: str | None = None, persist: str | None = None,
        reminder: str | None = None, detail: str | None = None) -> None:
    from . import lines, said, voice

    if once is not None and not said.claim(once):
        return
    level = _log_level()
    if _LEVELS.get(type, 1) < _LEVELS[level] or not voice.speaks():
        return
    if detail and level == "debug":
        message = detail      # the details were asked for
    if persist is not None and not said.first_time(persist):
        if level == "debug":
            message = "(said before) " + message
        elif reminder:
            message = reminder    # the whole line was said at an earlier start: one short line, not nothing
        else:
            return
    lines.write(message, whole=level == "debug")


def status(message, kernel=None, **kw):
    return emit(Severity.STATUS, message, kernel, **kw)


def warning(message, kernel=None, **kw):
    return emit(Severity.WARNING, message, kernel, **kw)


def error(message, kernel=None, **kw):
    return emit(Severity.ERROR, message, kernel, **kw)


def debug(message, kernel=None, **kw):
    """Logged and sent to callbacks as a status event, never printed unless FASTPATH_HOOKS_LOG=debug."""
    event = emit(Severity.STATUS, message, kernel, human=False, **kw)
    if _log_level() == "debug":
        say(Severity.DEBUG, message)
    return event


def internal_error(exc) -> None:
    """A bug of ours (or a package half-upgraded under a running process) on the import path:
    one line, once per process; the import goes on as without fastpath-hooks."""
    error(f"internal error, leaving this import alone: {type(exc).__name__}: {exc}", once="internal")


def forget() -> None:
    """Forget which one-time messages were printed (uninstall() starts afresh)."""
    import sys

    said = sys.modules.get(f"{__name__}.said")
    if said is not None:   # nothing was said yet otherwise
        said.forget()
