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
    """FASTPATH_HOOKS_CACHE_DIR as an absolute path, None when unset."""
    import os

    raw = environ_of(environ).get(CACHE_DIR, "").strip()
    return os.path.abspath(os.path.expanduser(raw)) if raw else None


_unusable: dict = {}   # path -> why it cannot be the cache root ("" when it can): asked once per process


def cache_dir_problem(path: str) -> str:
    """Why `path` cannot be the cache root ("" when it can): a directory this process can write, made
    if missing. An unusable FASTPATH_HOOKS_CACHE_DIR (`/proc/nope`) falls back to the default root -
    said once (settings.cache_dir_unusable) - instead of every verdict being lost and every start
    verifying again. One or two system calls, once per process and path."""
    import os

    if path not in _unusable:
        problem = ""
        if os.path.isdir(path):
            if not os.access(path, os.W_OK | os.X_OK):
                problem = "is not writable"
        elif os.path.lexists(path):
            problem = "is not a directory"
        else:
            try:
                os.makedirs(path, exist_ok=True)
            except OSError as exc:
                problem = f"cannot be created ({exc.strerror or exc})"
        _unusable[path] = problem
    return _unusable[path]


def cache_root_from_environ(environ=None) -> str:
    """The cache root FASTPATH_HOOKS_CACHE_DIR names (as settings parses it: the default root when
    it cannot be used), without parsing the settings: the warm path's."""
    given = cache_dir_given(environ)
    return given if given and not cache_dir_problem(given) else default_cache_root(environ)


def default_cache_root(environ=None) -> str:
    """platformdirs' user cache dir; on Linux computed the same way without importing it (~10 ms)."""
    import os
    import sys

    env = environ_of(environ)
    if sys.platform.startswith("linux"):
        base = env.get("XDG_CACHE_HOME", "")
        if not base.strip():
            base = os.path.expanduser("~/.cache")
        return os.path.join(base, "fastpath-hooks")
    import platformdirs

    return platformdirs.user_cache_dir("fastpath-hooks", appauthor=False)


def cache_root(settings) -> str:
    """The cache root of parsed settings."""
    return settings.cache_dir or default_cache_root()
