"""Raw readers of the environment that the lower layers share (events, facts, act): the cache
root, this environment's key, the log level and wheelhouse as given.

A leaf like _names, and kept apart from it so that the start-up path (hooks/), which loads
_names, does not load these. facts/settings.py parses the same variables with these readers,
so the two cannot disagree.
"""

from ._names import CACHE_DIR, DEFAULT_LOG, FIND_LINKS, LOG, LOG_LEVELS, environ_of

STATE_DIR_NAME = ".fastpath-hooks"   # an environment's own state (lock, journal), beside site-packages
JOURNAL = "journal.json"             # in it while an install runs (act/transaction.py)


def log_level(environ=None) -> str | None:
    """FASTPATH_HOOKS_LOG as given (lower case), the default when unset, None when not a level
    (settings reports the bad value; events then uses the default)."""
    raw = environ_of(environ).get(LOG, "").strip().lower()
    if not raw:
        return DEFAULT_LOG
    return raw if raw in LOG_LEVELS else None


def find_links_given(environ=None) -> tuple:
    """FASTPATH_HOOKS_FIND_LINKS's entries (comma or whitespace separated) as given; () when unset."""
    return tuple(environ_of(environ).get(FIND_LINKS, "").replace(",", " ").split())


def environment_key() -> str:
    """This environment (sys.prefix): sys.executable differs between `python` and a console script
    in one venv; the prefix does not."""
    import hashlib
    import os
    import sys

    return hashlib.sha256(os.path.realpath(sys.prefix).encode()).hexdigest()[:16]


def cache_dir_given(environ=None) -> str | None:
    """FASTPATH_HOOKS_CACHE_DIR with `~` expanded (absolute, normalised; a relative one as given, which
    `cache_dir_problem` refuses), None when unset."""
    import os

    raw = environ_of(environ).get(CACHE_DIR, "").strip()
    if not raw:
        return None
    path = os.path.expanduser(raw)
    return os.path.abspath(path) if os.path.isabs(path) else path


_unusable: dict = {}   # path -> why it cannot be the cache root ("" when it can): asked once per process
_WRITE_TEST = 4096     # bytes the cache root must take, a page (a full tmpfs still makes empty files)


def cache_dir_problem(path: str) -> str:
    """Why `path` cannot be the cache root ("" when it can): an absolute directory this process can write
    a file into, made if missing. An unusable FASTPATH_HOOKS_CACHE_DIR (`/proc/nope`, a full or read-only
    mount, a relative path each process would resolve in its own working directory) falls back to the
    default root - said once (settings.cache_dir_unusable) - instead of every verdict being lost and every
    start verifying again. A few system calls (a small file written and removed), once per process and path."""
    import os

    if path not in _unusable:
        problem = ""
        if not os.path.isabs(path):
            problem = "is a relative path"
        elif os.path.isdir(path):
            problem = _write_problem(path)
        elif os.path.lexists(path):
            problem = "is not a directory"
        else:
            try:
                os.makedirs(path, exist_ok=True)
            except OSError as exc:
                problem = f"cannot be created ({exc.strerror or exc})"
            else:
                problem = _write_problem(path)
        _unusable[path] = problem
    return _unusable[path]


def _write_problem(path: str) -> str:
    """"" when a file of _WRITE_TEST bytes can be written into `path` (and is removed again), else why not:
    access(2) says a full tmpfs is writable, and as root says so of every directory."""
    import os

    probe = os.path.join(path, f".fastpath-hooks-write-test-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        return f"cannot be written ({exc.strerror or exc})"
    problem = ""
    try:
        os.write(fd, bytes(_WRITE_TEST))
    except OSError as exc:
        problem = f"cannot be written ({exc.strerror or exc})"
    finally:
        try:
            os.close(fd)   # NFS may say a delayed write's error here
        except OSError as exc:
            problem = problem or f"cannot be written ({exc.strerror or exc})"
        try:
            os.unlink(probe)
        except OSError:
            pass
    return problem


def cache_root_from_environ(environ=None) -> str:
    """The cache root FASTPATH_HOOKS_CACHE_DIR names (as settings parses it: the default root when
    it cannot be used), without parsing the settings: the warm path's."""
    given = cache_dir_given(environ)
    return given if given and not cache_dir_problem(given) else default_cache_root(environ)


def default_cache_root(environ=None) -> str:
    """The user cache dir of the XDG base directory spec (Linux, the one supported OS):
    $XDG_CACHE_HOME/fastpath-hooks, else ~/.cache/fastpath-hooks."""
    import os

    base = environ_of(environ).get("XDG_CACHE_HOME", "")
    if not base.strip():
        base = os.path.expanduser("~/.cache")
    return os.path.join(base, "fastpath-hooks")


def cache_root(settings) -> str:
    """The cache root of parsed settings."""
    return settings.cache_dir or default_cache_root()
