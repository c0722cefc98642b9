"""Events: the `fastpath_hooks` logger at DEBUG, `on_event` callbacks (a JSON-serialisable dict each), and
the human line on stderr (`fastpath-hooks: ...`, filtered by FASTPATH_HOOKS_LOG, fitted to MAX_LINE characters,
from one process per node). Callbacks never run while the sending thread holds a lock of ours (`hold()` ...
`deliver()`): they get its events after the lock is released, so a callback may block or call fastpath-hooks.
"""

from __future__ import annotations

import _thread   # not threading: install() loads this module at a bare start where a posed target is said
import os
import sys
import time
from enum import Enum

from ._names import (DEFAULT_LOG, VOICE, environment_key, local_rank, log, log_level as _given_log_level, said_dir,
                     said_path)


class TextEnum(str, Enum):
    """A str enum (enum.StrEnum is 3.11+): members equal, print, format and JSON-encode as their strings."""

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
_held = _thread._local()        # per thread: .depth (locks of ours held) and .queue (events for the callbacks)
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
    """This thread released that lock: after the outermost one, the callbacks get the events sent meanwhile."""
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
            log("on_event callback %r raised %r", callback, exc)


def _log_level() -> str:
    return _given_log_level() or DEFAULT_LOG   # a bad value is said by settings; the default meanwhile


def emit(type: Severity, message: str, kernel: str | None = None, *, human: bool = True, once: str | None = None,
         persist: str | None = None, reminder: str | None = None, detail: str | None = None, **extra) -> dict:
    """Send one event. The human line is printed once per process for the key `once`, once per environment for
    the key `persist` (`reminder` at later starts instead). `detail`: the whole text of a line short by design,
    logged, in the event, and printed under FASTPATH_HOOKS_LOG=debug instead of the line."""
    type = Severity(type)
    event = {"type": type, "kernel": kernel, "message": message, "ts": time.time()}
    if detail is not None and detail != message:
        event["detail"] = detail
    event.update(extra)
    log("%s%s: %s", type, f" [{kernel}]" if kernel else "", event.get("detail", message))
    if held():
        _held.queue.append(dict(event))   # called after the lock is released (deliver)
    else:
        _call(event)
    if human:
        say(type, message, once=once, persist=persist, reminder=reminder, detail=event.get("detail"))
    return event


def say(type: Severity, message: str, *, once: str | None = None, persist: str | None = None,
        reminder: str | None = None, detail: str | None = None) -> None:
    if once is not None and not claim(once):
        return
    level = _log_level()
    if persist is not None and not reminder and level != "debug" and os.path.exists(said_path(persist)):
        return    # said at an earlier start, nothing instead: this process does not take the node's voice for it
    if _LEVELS.get(type, 1) < _LEVELS[level] or not speaks():
        return
    if detail and level == "debug":
        message = detail      # the details were asked for
    if persist is not None and not first_time(persist):
        if level == "debug":
            message = "(said before) " + message
        elif reminder:
            message = reminder    # the whole line was said at an earlier start: one short line, not nothing
        else:
            return
    write(message, whole=level == "debug")


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
    """A bug of ours (or a package half-upgraded under a running process) on the import path: one line,
    once per process; the import goes on as without fastpath-hooks."""
    error(f"internal error, leaving this import alone: {type(exc).__name__}: {exc}", once="internal")


# -- what was said already: once per process (`once`), once per environment (`persist`) --

_said: set = set()
_said_lock = _thread.allocate_lock()   # "once" is checked and claimed in one step (several threads decide kernels)


def forget() -> None:
    """Forget which one-time messages were printed (uninstall() starts afresh)."""
    _said.clear()


def claim(key: str) -> bool:
    """True the first time `key` is claimed in this process."""
    with _said_lock:
        if key in _said:
            return False
        _said.add(key)
        return True


def first_time(key: str) -> bool:
    """Claim `key` for this environment, atomically; True when no process said it before (always, where the
    cache is unwritable)."""
    path = said_path(key)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    except OSError:
        return True
    return True


def forget_said() -> bool:
    """Forget the lines said once in this environment (`doctor --refresh`)."""
    import shutil

    directory = said_dir()
    existed = os.path.isdir(directory)
    shutil.rmtree(directory, ignore_errors=True)
    return existed


# -- which process of a node speaks --

_voice: dict = {}       # parent pid -> True (this process holds the voice) / False


def worker() -> bool:
    """A multiprocessing child (DataLoader worker, pool worker, Process)."""
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return False
    try:
        return mp.parent_process() is not None
    except Exception:
        return False


def speaks() -> bool:
    """Whether this process prints human lines, one per node: never a multiprocessing worker of the process
    that speaks (marked in VOICE by install()); else local rank 0 where a launcher gives a local rank; else
    never a rankless script's multiprocessing child; else the first of one parent's children to ask."""
    marker = os.environ.get(VOICE)
    if marker and marker != str(os.getpid()) and worker():
        return False
    rank = local_rank()
    if rank is not None:
        return rank == 0
    if worker():
        return False
    parent = os.getppid()
    if parent not in _voice:   # asked once per parent (a fork asks again)
        _voice[parent] = _lock_voice(parent)
    return _voice[parent]


def _lock_voice(parent: int) -> bool:
    """The first of its parent's children (on this node, in this environment) to ask keeps the voice until
    it exits (an fcntl lock the OS releases then)."""
    try:
        import fcntl
    except ImportError:  # no fcntl (Windows): every process speaks
        return True
    # /tmp: node-wide and node-local (TMPDIR may be per process; the cache directory may be per process,
    # or shared by nodes over NFS, where their parent pids collide). One file per user, never removed (a
    # lock on a removed file excludes nobody); the byte locked is the parent's pid (high bits) and this
    # environment (low bits).
    directory = "/tmp" if os.path.isdir("/tmp") else os.environ.get("TMPDIR") or "."
    path = os.path.join(directory, f"fastpath-hooks-{os.getuid()}.voice")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return True
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, (parent << 32) | int(environment_key()[:8], 16))
    except OSError:
        os.close(fd)
        return False
    return True  # fd stays open: the lock lasts as long as this process


# -- one human line: `fastpath-hooks: message`, fitted to MAX_LINE characters, on stderr --

MAX_LINE = 160          # characters, "fastpath-hooks: " included
PREFIX = "fastpath-hooks: "


def fit(message: str, limit: int = MAX_LINE, *, cut_words_only: bool = False) -> str:
    """`fastpath-hooks: message` on one line of at most `limit` characters. Over-long words (a path, a
    quoted value) are cut in the middle first, so the sentence and its fix stay. A build log's path is never
    cut (every message about a build names it): the line then ends after it, even past `limit`.
    cut_words_only: only the long words are cut, the line may stay longer than `limit`."""
    words = message.split()
    line = PREFIX + " ".join(words)

    def value(word):  # VARIABLE='value': only the value may be cut
        return len(word) - word.find("=") - 1

    for i in sorted(range(len(words)), key=lambda i: -value(words[i])):
        if len(line) <= limit or value(words[i]) < 48:   # shorter words read better whole
            break
        if _is_log(words[i]):
            continue
        word = words[i]
        head = word.find("=") + 3   # VARIABLE='value': the name stays whole
        keep = max(36, head + 16, len(word) - (len(line) - limit) - 3)
        head = max(keep // 2, head)
        words[i] = word[:head] + "..." + word[len(word) - (keep - head):]
        line = PREFIX + " ".join(words)
    if len(line) > limit and not cut_words_only:
        logs = [i for i, w in enumerate(words) if _is_log(w)]
        # cut at the end - but never before a build log's path ends
        end = len(PREFIX + " ".join(words[:logs[-1] + 1])) if logs else 0
        if end < len(line):
            cut = line[:max(limit - 3, end)]
            space = cut.rfind(" ")   # at a word's end where one is near
            line = (cut[:space] if space > max(end, len(cut) - 16) else cut).rstrip() + "..."
    return line


def _is_log(word: str) -> bool:
    return word.rstrip(";,)").endswith(".log")


def first_fitting(*candidates: str) -> str:
    """The first of a line's wordings (most whole first) that fits MAX_LINE; else the last, fitted."""
    for line in candidates:
        if len(PREFIX) + len(" ".join(line.split())) <= MAX_LINE:
            return line
    return fit(candidates[-1])[len(PREFIX):]


def fitted(head: str, detail: str, fix: str = "", *, whole_at: str | None = "fastpath-hooks doctor") -> str:
    """`<head><detail> (<fix>)` for a text handed over whole (a failed check's output, an exception): whole
    when it fits; else as much of the detail as fits, with the head, the fix and where it is whole
    (`whole_at`; None where the fix says it) kept."""
    whole = head + " ".join(str(detail).split()) + (f" ({fix})" if fix else "")
    if len(PREFIX) + len(whole) <= MAX_LINE:
        return whole
    where = f"the whole: {whole_at}" if whole_at else ""
    tail = f" ({'; '.join(p for p in (fix, where) if p)})" if fix or where else ""
    room = MAX_LINE - len(PREFIX) - len(head) - len(tail)
    text = " ".join(str(detail).split())
    cut = fit(text, room + len(PREFIX))[len(PREFIX):]
    if cut.endswith("...") and not any(_is_log(w) for w in text.split()):   # an error chain: its middle goes
        cut = _middle_out(fit(text, room + len(PREFIX), cut_words_only=True)[len(PREFIX):], room) or cut
    return head + cut + tail


_LEAST_ERROR = 20   # characters of the error a middle cut must keep (else the end is cut instead)


def _middle_out(text: str, room: int) -> str | None:
    """An error chain cut in its middle, by clauses (": "): the first says what failed, the last ones the
    error itself ("[Errno 28] No space left on device"), as many as fit. What goes first: trailing clauses
    that are only a path or URL, then the clauses between, then the end of the first clause, then a remark
    after the error ("(...)"). None when too little of the error would be left."""
    parts = text.split(": ")
    if len(parts) < 2:
        return None
    end = len(parts)
    while end > 2 and _is_detail(parts[end - 1]):
        end -= 1
    more = ": ..." if end < len(parts) else ""
    for k in range(1, end):   # drop clauses 1..k-1, the fewest that make it fit
        tail = ": ".join(parts[k:end]) + more
        line = f"{parts[0]}: {'' if k == 1 else '... '}{tail}"
        if len(line) <= room:
            return line if len(tail) >= _LEAST_ERROR else None
    clause = parts[end - 1]
    if len(clause) < _LEAST_ERROR:
        return None
    remark = clause.rfind(" (")   # a remark after the error ("... (X_URL points at a mirror)") goes next
    for error in (clause, clause[:remark] + " (...)" if remark >= _LEAST_ERROR and clause.endswith(")") else None):
        if error is None:
            continue
        error += more                     # the error alone, after as much of what failed as fits
        left = room - len(error) - len("...: ")
        if left >= 12:
            first = parts[0][:left]
            space = first.rfind(" ")
            return f"{first[:space] if space > left // 2 else first}...: {error}"
    return None


def _is_detail(clause: str) -> bool:
    """A clause that is only a path, a URL or a quoted value: where an error happened, not what it is."""
    word = clause.strip().strip("'\"")
    return bool(word) and " " not in word and (word.startswith(("/", "~", ".")) or "://" in word)


def shown_path(path: str) -> str:
    """A path as a line shows it, short and still what a shell expands back: `$FASTPATH_HOOKS_CACHE_DIR/...`,
    `$XDG_CACHE_HOME/...` or `~/...`."""
    for var in ("FASTPATH_HOOKS_CACHE_DIR", "XDG_CACHE_HOME", "HOME"):
        root = os.environ.get(var, "").strip()
        if len(root) > 1:
            root = os.path.abspath(os.path.expanduser(root)).rstrip("/")
            if path.startswith(root + "/"):
                return ("~" if var == "HOME" else "$" + var) + path[len(root):]
    return path


def minutes(seconds) -> str:
    if seconds is None:
        return ""
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def write(message: str, *, whole: bool) -> None:
    """Print the line (whole: FASTPATH_HOOKS_LOG=debug asks for the details); never raises."""
    line = PREFIX + " ".join(message.split()) if whole else fit(message)
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except Exception:
        pass
