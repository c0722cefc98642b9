"""The leaf every layer may import: names and the raw environment readers of the start-up path.

Stdlib only, and nothing imported at module level, because the start-up path loads it: the kernel
registry's index (which kernels exist, their kinds, modules, aliases, gates, ... - pins.json's entries
as literals) and what is derived from it, the one module whose import wraps gates, the truth values,
and the few FASTPATH_HOOKS_* readers that must work before settings are parsed (facts/settings.py
parses every variable, and uses these for the ones read here).
"""

VERSION = "0.1.0"   # fastpath_hooks.__version__ (pyproject.toml holds the same)

# The kernel registry's index: each kernel's registry keys in facts/pins.json, as literals, so that
# the start-up path knows the kernels without parsing pins.json (tests/test_registry.py proves this
# equal to pins.json and prints the literal to paste when a kernel is added there). A user's
# FASTPATH_HOOKS_PINS file adds kernels the same way: `registry()` reads it (docs/registry.md).
#   kind: pure (wheels at pinned releases) | pair (two distributions pinned together, serving another
#   kernel) | compiled (release wheels or a source build); modules: its import names (the first is
#   the one checked and blocked); aliases: other names FASTPATH_HOOKS_SKIP etc. accept; gates:
#   transformers' availability gates that ask for it; mirror: the variable naming a mirror of its
#   release wheels; with: kernels it is only useful with (ensured first); serves: kernels that use it;
#   switch: the variable by which a served kernel is told not to use it.
REGISTRY = {
    "fla": {"kind": "pure", "modules": ("fla",), "distributions": ("fla-core", "flash-linear-attention"),
            "aliases": ("flash-linear-attention", "fla-core"), "gates": ("is_flash_linear_attention_available",),
            "mirror": None, "with": (), "serves": (), "rule_prefix": "fla", "switch": None},
    "tilelang": {"kind": "pair", "modules": ("tilelang",), "distributions": ("tilelang", "apache-tvm-ffi"),
                 "aliases": (), "gates": (), "mirror": None, "with": (), "serves": ("fla",), "rule_prefix": "tilelang",
                 "switch": "FLA_TILELANG"},
    "causal-conv1d": {"kind": "compiled", "modules": ("causal_conv1d",), "distributions": ("causal-conv1d",),
                      "aliases": ("causal_conv1d",), "gates": ("is_causal_conv1d_available",),
                      "mirror": "FASTPATH_HOOKS_CAUSAL_CONV1D_WHEEL_URL", "with": (), "serves": (),
                      "rule_prefix": "causal", "switch": None},
    "mamba-ssm": {"kind": "compiled", "modules": ("mamba_ssm",), "distributions": ("mamba-ssm",),
                  "aliases": ("mamba_ssm",), "gates": ("is_mamba_ssm_available", "is_mamba_2_ssm_available"),
                  "mirror": "FASTPATH_HOOKS_MAMBA_SSM_WHEEL_URL", "with": ("causal-conv1d",), "serves": (),
                  "rule_prefix": "mamba", "switch": None},
}


def kernel_modules(registry) -> dict:
    """module -> kernel (the distribution name fastpath-hooks manages), for every import name."""
    return {module: kernel for kernel, entry in registry.items() for module in entry["modules"]}


def served_modules(registry) -> dict:
    """module -> the modules of the kernels it serves. A kernel that only serves another (tilelang:
    fla's Hopper backend) is not installed for another package's optional import of it (mamba-ssm's
    Mamba-3 kernels try `import tilelang`) while neither it nor what it serves is on the path: that
    import goes on as without fastpath-hooks."""
    return {entry["modules"][0]: tuple(registry[k]["modules"][0] for k in entry["serves"] if k in registry)
            for entry in registry.values() if entry["serves"]}


def watched_modules(registry) -> frozenset:
    """What the finder (and the start-up stand-in, hooks/startup.py) watches."""
    return frozenset(kernel_modules(registry)) | {GATES_MODULE}


def listed(registry) -> tuple:
    """The kernels in the order users see them (plans, reports, messages): the ones models use, then
    the ones that serve them."""
    return tuple(k for k, e in registry.items() if not e["serves"]) + tuple(k for k, e in registry.items() if e["serves"])


GATES_MODULE = "transformers.utils.import_utils"
KERNELS = listed(REGISTRY)
KERNEL_MODULES = kernel_modules(REGISTRY)
MODULE_OF = {kernel: entry["modules"][0] for kernel, entry in REGISTRY.items()}     # kernel -> module
SERVES = served_modules(REGISTRY)   # module -> modules it serves
WATCHED = watched_modules(REGISTRY)
PINS = "FASTPATH_HOOKS_PINS"
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


def environ_of(environ):
    if environ is None:
        import os

        return os.environ
    return environ


def disabled(environ=None) -> bool:
    """FASTPATH_HOOKS_DISABLE: read first at start, before anything of ours is imported."""
    return environ_of(environ).get(DISABLE, "").strip().lower() in TRUE_VALUES


def given(environ=None) -> tuple:
    """Every FASTPATH_HOOKS_* variable set, as sorted (name, value) pairs."""
    return tuple(sorted((k, v) for k, v in environ_of(environ).items() if k.startswith(PREFIX)))


def local_rank(environ=None):
    """This process's rank on its node, where a launcher says it; None where none does."""
    env = environ_of(environ)

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


def registry(environ=None) -> dict:
    """kernel -> its registry keys: REGISTRY, and what the FASTPATH_HOOKS_PINS file adds or changes
    (read only when that variable is set: `_registry.with_user_file`)."""
    raw = environ_of(environ).get(PINS, "").strip()
    if not raw:
        return REGISTRY
    from ._registry import with_user_file

    return with_user_file(raw, REGISTRY)
