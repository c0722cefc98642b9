"""The leaf every layer may import: names and the raw environment readers of the start-up path.

Stdlib only, and nothing imported at module level, because the start-up path loads it: which
kernels exist and the modules they are imported as, the one module whose import wraps gates, the
truth values, and the few FASTPATH_HOOKS_* readers that must work before settings are parsed
(facts/settings.py parses every variable, and uses these for the ones read here).
"""

VERSION = "0.1.0"   # fastpath_hooks.__version__ (pyproject.toml holds the same)

# module -> kernel (the distribution name fastpath-hooks manages); the start-up stand-in
# (hooks/startup.py) and the finder watch exactly these module names.
KERNEL_MODULES = {"fla": "fla", "causal_conv1d": "causal-conv1d", "tilelang": "tilelang", "mamba_ssm": "mamba-ssm"}
MODULE_OF = {kernel: module for module, kernel in KERNEL_MODULES.items()}     # kernel -> module
KERNELS = tuple(MODULE_OF)
# A kernel that only serves another (tilelang: fla's Hopper backend) is not installed for another
# package's optional import of it (mamba-ssm's Mamba-3 kernels try `import tilelang`) while neither
# it nor what it serves is on the path: that import goes on as without fastpath-hooks.
SERVES = {"tilelang": ("fla",)}   # module -> modules it serves
GATES_MODULE = "transformers.utils.import_utils"
WATCHED = frozenset(KERNEL_MODULES) | {GATES_MODULE}
TRUE_VALUES = ("1", "true", "yes", "on")
FALSE_VALUES = ("0", "false", "no", "off")
STAND_IN = "_FastpathHooksStartup"   # the name of the start-up stand-in finder (a function; a class before v4)
# The start-up stand-in's format (hooks/startup.py passes it to hooks.resume; v4 passed none).
STARTUP_FORMAT = 5
STARTUP_FORMATS = (None, 4, 5)      # the formats this version hands over from

# Local rank variables of launchers (torchrun/accelerate/deepspeed, Open MPI, Intel MPI, MVAPICH).
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK")
VOICE = "_FASTPATH_HOOKS_VOICE"   # pid of the node's printing process; its children inherit it and stay quiet

PREFIX = "FASTPATH_HOOKS_"
DISABLE = "FASTPATH_HOOKS_DISABLE"
LOG = "FASTPATH_HOOKS_LOG"
CACHE_DIR = "FASTPATH_HOOKS_CACHE_DIR"
FIND_LINKS = "FASTPATH_HOOKS_FIND_LINKS"
LOG_LEVELS = ("off", "error", "warning", "info", "debug")
DEFAULT_LOG = "info"


def _environ(environ):
    if environ is None:
        import os

        return os.environ
    return environ


def disabled(environ=None) -> bool:
    """FASTPATH_HOOKS_DISABLE: read first at start, before anything of ours is imported."""
    return _environ(environ).get(DISABLE, "").strip().lower() in TRUE_VALUES


def log_level(environ=None) -> str | None:
    """FASTPATH_HOOKS_LOG as given (lower case), the default when unset, None when not a level
    (settings reports the bad value; events then uses the default)."""
    raw = _environ(environ).get(LOG, "").strip().lower()
    if not raw:
        return DEFAULT_LOG
    return raw if raw in LOG_LEVELS else None


def find_links_given(environ=None) -> tuple:
    """FASTPATH_HOOKS_FIND_LINKS's entries (comma or whitespace separated) as given; () when unset."""
    return tuple(_environ(environ).get(FIND_LINKS, "").replace(",", " ").split())


def given(environ=None) -> tuple:
    """Every FASTPATH_HOOKS_* variable set, as sorted (name, value) pairs."""
    return tuple(sorted((k, v) for k, v in _environ(environ).items() if k.startswith(PREFIX)))


def local_rank(environ=None):
    """This process's rank on its node, where a launcher says it; None where none does."""
    env = _environ(environ)

    def number(raw):
        try:
            return int(raw)
        except ValueError:
            return 0

    for var in LOCAL_RANK_VARIABLES:
        raw = env.get(var)
        if raw is not None:
            return number(raw)
    rank, size = env.get("RANK"), env.get("LOCAL_WORLD_SIZE")
    if rank is not None and size is not None:
        size_value = number(size)
        return number(rank) % size_value if size_value > 0 else 0
    return None


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

    raw = _environ(environ).get(CACHE_DIR, "").strip()
    return os.path.abspath(os.path.expanduser(raw)) if raw else None


def cache_root_from_environ(environ=None) -> str:
    """The cache root FASTPATH_HOOKS_CACHE_DIR names (as settings parses it), without parsing the
    settings: the warm path's."""
    return cache_dir_given(environ) or default_cache_root(environ)


def default_cache_root(environ=None) -> str:
    """platformdirs' user cache dir; on Linux computed the same way without importing it (~10 ms)."""
    import os
    import sys

    env = _environ(environ)
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
