"""The leaf every layer may import: names, and the raw FASTPATH_HOOKS_* readers needed before settings are
parsed (facts/settings.py validates with these same readers, so the two cannot disagree). Stdlib only, imported
inside functions: install() and the start-up hand-over load it."""

VERSION = "0.2.0"   # fastpath_hooks.__version__ (pyproject.toml holds the same)

# The shipped kernels without a registry: KERNELS as users see them; module -> kernel; SERVES: module -> the
# modules of the kernels it serves (_registry.served_modules says why).
# -- generated from facts/pins.json by tools/registry_index.py: do not edit --
KERNELS = ("fla", "causal-conv1d", "mamba-ssm", "flash-attn", "flash-attn-3", "tilelang", "flash-qla")
KERNEL_MODULES = {"fla": "fla", "tilelang": "tilelang", "causal_conv1d": "causal-conv1d", "mamba_ssm": "mamba-ssm",
                  "flash_attn": "flash-attn", "flash_attn_interface": "flash-attn-3",
                  "flash_attn_3": "flash-attn-3", "flash_qla": "flash-qla"}
SERVES = {"tilelang": ("fla",), "flash_qla": ("fla",)}
ASKED = {"flash-attn": "flash_attention_2", "flash-attn-3": "flash_attention_3"}
# -- end of generated --
# transformers 5.15+: its decorated kernel functions, module global -> (func_name, package) passed to
# use_kernel_func_from_hub_with_fallback (read from the 5.24.0 sources; the hub's mapping names them by func_name).
DECORATED = {
    "causal_conv1d_fn": ("causal_conv1d_fn", "causal_conv1d"),
    "causal_conv1d_update": ("causal_conv1d_update", "causal_conv1d"),
    "torch_chunk_gated_delta_rule": ("chunk_gated_delta_rule", "fla"),
    "torch_recurrent_gated_delta_rule": ("fused_recurrent_gated_delta_rule", "fla"),
    "chunk_kimi_delta_attention": ("chunk_kda", "fla"),
    "recurrent_kimi_delta_attention": ("fused_recurrent_kda", "fla"),
    "mamba2_split_conv1d_scan_combined": ("mamba_split_conv1d_scan_combined", "mamba_ssm"),
    "mamba2_selective_state_update": ("selective_state_update", "mamba_ssm"),
    "mamba2_chunk_scan": ("mamba_chunk_scan_combined", "mamba_ssm"),
    "mamba_inner_fn": ("mamba_inner_fn", "mamba_ssm"),
    "mamba_selective_state_update": ("selective_state_update", "mamba_ssm"),
    "mamba_selective_scan": ("selective_scan_fn", "mamba_ssm"),
}

GATES_MODULE = "transformers.utils.import_utils"
HUB_MODULE = "transformers.integrations.hub_kernels"
MASKS_MODULE = "transformers.masking_utils"   # its mask preprocessing is looked at once (hooks/packed.py)
WATCHED = frozenset(KERNEL_MODULES) | {GATES_MODULE, HUB_MODULE, MASKS_MODULE}
# transformers' attention implementations whose masks masking_utils builds, packed rows (restarting
# position_ids) kept apart only without an attention mask and a cache (flash attention reads position_ids)
MASKED_ATTENTION = ("sdpa", "eager", "flex_attention")
PINS = "FASTPATH_HOOKS_PINS"
TRUE_VALUES = ("1", "true", "yes", "on")
FALSE_VALUES = ("0", "false", "no", "off")
STAND_IN = "_FastpathHooksStartup"   # the name of the start-up stand-in finder (a function)
STARTUP_FORMAT = 5   # what hooks/startup.py passes to hooks.resume; no release wrote another

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


def environ_of(environ):
    import os

    return os.environ if environ is None else environ


def disabled(environ=None) -> bool:
    return environ_of(environ).get(DISABLE, "").strip().lower() in TRUE_VALUES


def given(environ=None) -> tuple:
    return tuple(sorted((k, v) for k, v in environ_of(environ).items() if k.startswith(PREFIX)))


def local_rank(environ=None):
    """This process's rank on its node, where a launcher says it; None where none does."""
    env = environ_of(environ)

    def number(raw):
        try:
            return int(raw)
        except ValueError:
            return 0

    raw = next((env[var] for var in LOCAL_RANK_VARIABLES if var in env), None)
    if raw is not None:
        return number(raw)
    rank, size = env.get("RANK"), env.get("LOCAL_WORLD_SIZE")
    if rank is not None and size is not None:
        size_value = number(size)
        return number(rank) % size_value if size_value > 0 else 0
    return None


STATE_DIR_NAME = ".fastpath-hooks"   # an environment's own state (lock, journal), beside site-packages
JOURNAL = "journal.json"             # in it while an install runs (act/transaction.py)


def log_level(environ=None) -> str | None:
    """None when not a level: settings reports the bad value, events uses the default."""
    raw = environ_of(environ).get(LOG, "").strip().lower() or DEFAULT_LOG
    return raw if raw in LOG_LEVELS else None


def find_links_given(environ=None) -> tuple:
    return tuple(environ_of(environ).get(FIND_LINKS, "").replace(",", " ").split())


def find_links_dir(entry: str) -> str | None:
    """The local directory a find-links entry names (a path or a file:// URL, as pip reads it); None: remote.
    Here, not in facts/wheels: the warm path lists these directories and must not load packaging."""
    import os

    if "://" in entry:
        if not entry.startswith("file://"):
            return None
        entry = entry[len("file://"):]
        if entry.startswith("localhost/"):
            entry = entry[len("localhost"):]
        if "%" in entry:
            from urllib.parse import unquote

            entry = unquote(entry)
    return os.path.abspath(os.path.expanduser(entry))


def environment_key() -> str:
    """Of sys.prefix: sys.executable differs between `python` and a console script in one venv."""
    import os
    import sys

    return sha256_hex(os.path.realpath(sys.prefix).encode())[:16]


def said_dir() -> str:
    """Where the lines said once per environment are remembered (events' `persist`)."""
    import os

    return os.path.join(cache_root_from_environ(), "said", environment_key())


def said_path(key: str) -> str:
    import os

    return os.path.join(said_dir(), sha256_hex(key.encode())[:24])


def sha256_hex(data: bytes) -> str:
    """hashlib.sha256(data).hexdigest() without loading hashlib where nothing has yet: its OpenSSL module costs a
    bare start 2-4 ms (install() with a FASTPATH_HOOKS_* variable, the warm path); CPython's own sha256 (`_sha2`
    3.12+, `_sha256` before) gives the same digest."""
    import sys

    if "hashlib" not in sys.modules:
        try:
            if sys.version_info >= (3, 12):
                from _sha2 import sha256
            else:
                from _sha256 import sha256
            return sha256(data).hexdigest()
        except ImportError:   # a build without it
            pass
    from hashlib import sha256

    return sha256(data).hexdigest()


def log(message: str, *args, level: int = 10) -> None:
    """A record of the `fastpath_hooks` logger (DEBUG unless `level`), where `logging` is loaded: a process that
    never imported it has set up no handler that could take the record, and importing it costs a bare start ~10 ms."""
    import sys

    if "logging" in sys.modules:
        import logging

        logging.getLogger("fastpath_hooks").log(level, message, *args)


def cache_dir_given(environ=None) -> str | None:
    """`~` expanded, absolute normalised (a relative one as given: `cache_dir_problem` refuses it)."""
    import os

    raw = environ_of(environ).get(CACHE_DIR, "").strip()
    if not raw:
        return None
    path = os.path.expanduser(raw)
    return os.path.abspath(path) if os.path.isabs(path) else path


_unusable: dict = {}   # path -> why it cannot be the cache root ("" when it can): asked once per process
_WRITE_TEST = 4096     # bytes the cache root must take, a page (a full tmpfs still makes empty files)


def cache_dir_problem(path: str) -> str:
    """Why `path` cannot be the cache root ("" when it can: an absolute directory we can write, made if missing).
    An unusable one (a full or read-only mount, a relative path) falls back to the default root, said once,
    instead of every verdict being lost. Asked once per process and path."""
    import os

    if path not in _unusable:
        problem = ""
        if not os.path.isabs(path):
            problem = "is a relative path"
        elif os.path.lexists(path) and not os.path.isdir(path):
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
    """Written, not access(2): that says a full tmpfs is writable, and as root says so of every directory."""
    import os

    probe = os.path.join(path, f".fastpath-hooks-write-test-{os.getpid()}")
    try:
        with open(probe, "wb", buffering=0) as fh:   # NFS may say a delayed write's error at close
            fh.write(bytes(_WRITE_TEST))
    except OSError as exc:
        return f"cannot be written ({exc.strerror or exc})"
    finally:
        try:
            os.unlink(probe)
        except OSError:
            pass
    return ""


def cache_root_from_environ(environ=None) -> str:
    """The cache root as settings would say it, without parsing them (the warm path's)."""
    given = cache_dir_given(environ)
    return given if given and not cache_dir_problem(given) else default_cache_root(environ)


def default_cache_root(environ=None) -> str:
    """$XDG_CACHE_HOME/fastpath-hooks, else ~/.cache/fastpath-hooks."""
    import os

    base = environ_of(environ).get("XDG_CACHE_HOME", "")
    return os.path.join(base if base.strip() else os.path.expanduser("~/.cache"), "fastpath-hooks")


def cache_root(settings) -> str:
    return settings.cache_dir or default_cache_root()
