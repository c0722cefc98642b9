"""Events: the `fastpath_hooks` logger, `on_event` callbacks, and the human line.

Every event goes to the logger at DEBUG (all ranks) and to every `on_event`
callback as a JSON-serialisable dict. Human messages go to stderr, prefixed
`fastpath-hooks:`, from local rank 0 only (`LOCAL_RANK`, else `RANK`), filtered
by FASTPATH_HOOKS_LOG.
"""

from __future__ import annotations

import logging
import os
import sys
import time

logger = logging.getLogger("fastpath_hooks")

TYPES = ("status", "warning", "error")
_LEVELS = {"debug": 0, "status": 1, "info": 1, "warning": 2, "error": 3, "off": 99}
_said: set = set()


def local_rank() -> int:
    for var in ("LOCAL_RANK", "RANK"):
        raw = os.environ.get(var)
        if raw is not None:
            try:
                return int(raw)
            except ValueError:
                return 0
    return 0


def _listeners():
    from . import hooks

    return list(hooks.listeners())


def _log_level() -> str:
    raw = os.environ.get("FASTPATH_HOOKS_LOG", "info").strip().lower()
    return raw if raw in _LEVELS else "info"


def emit(type: str, message: str, kernel: str | None = None, *, human: bool = True, once: str | None = None,
         **extra) -> dict:
    """Send one event. `once`: a key; the human line is printed once per process for it."""
    event = {"type": type, "kernel": kernel, "message": message, "ts": time.time()}
    for key, value in extra.items():
        event[key] = value
    logger.debug("%s%s: %s", type, f" [{kernel}]" if kernel else "", message)
    for callback in _listeners():
        try:
            callback(dict(event))
        except Exception as exc:  # a listener's bug must not break the import it observes
            logger.debug("on_event callback %r raised %r", callback, exc)
    if human:
        say(type, message, once=once)
    return event


def say(type: str, message: str, *, once: str | None = None) -> None:
    if once is not None:
        if once in _said:
            return
        _said.add(once)
    if local_rank() != 0:
        return
    if _LEVELS.get(type, 1) < _LEVELS[_log_level()]:
        return
    try:
        sys.stderr.write(f"fastpath-hooks: {message}\n")
        sys.stderr.flush()
    except Exception:
        pass


def status(message, kernel=None, **kw):
    return emit("status", message, kernel, **kw)


def warning(message, kernel=None, **kw):
    return emit("warning", message, kernel, **kw)


def error(message, kernel=None, **kw):
    return emit("error", message, kernel, **kw)


def debug(message, kernel=None, **kw):
    """Logged and sent to callbacks as a status event, never printed unless FASTPATH_HOOKS_LOG=debug."""
    event = emit("status", message, kernel, human=False, **kw)
    if _log_level() == "debug" and local_rank() == 0:
        say("debug", message)
    return event


def internal_error(exc) -> None:
    """A bug of ours (or a package half-upgraded under a running process) on the import path:
    one line, once per process; the import goes on as without fastpath-hooks."""
    error(f"internal error, leaving this import alone: {type(exc).__name__}: {exc}", once="internal")


def forget() -> None:
    """Forget which one-time messages were printed (uninstall() starts afresh)."""
    _said.clear()
