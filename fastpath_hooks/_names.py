"""The leaf every layer may import: names and the raw environment readers of the start-up path.

Stdlib only, and nothing imported at module level, because the start-up path loads it: the shipped
kernels' import names (written out from the kernel registry, _registry.py), the one module whose
import wraps gates, the truth values, and the few FASTPATH_HOOKS_* readers that must work before
settings are parsed (facts/settings.py parses every variable, and uses these for the ones read here).
"""

VERSION = "0.1.0"   # fastpath_hooks.__version__ (pyproject.toml holds the same)

# The shipped kernels as the start-up path needs them: derived from the registry's index
# (_registry.REGISTRY, pins.json's entries as literals) - written out, so that loading this leaf costs
# no registry (tests/test_registry.py proves both equal to pins.json). A FASTPATH_HOOKS_PINS file's
# kernels: `_registry.registry()`.
KERNELS = ("fla", "causal-conv1d", "mamba-ssm", "tilelang", "flash-qla")      # as listed to users (_registry.listed)
# module -> kernel (the distribution name fastpath-hooks manages); the start-up stand-in
# (hooks/startup.py) and the finder watch exactly these module names (and a user's kernels' from install()).
KERNEL_MODULES = {"fla": "fla", "tilelang": "tilelang", "causal_conv1d": "causal-conv1d", "mamba_ssm": "mamba-ssm",
                  "flash_qla": "flash-qla"}
MODULE_OF = {kernel: module for module, kernel in KERNEL_MODULES.items()}     # kernel -> module
# A kernel that only serves another (tilelang: fla's Hopper backend) is not installed for another
# package's optional import of it (mamba-ssm's Mamba-3 kernels try `import tilelang`) while neither
# it nor what it serves is installed (their metadata): that import goes on as without fastpath-hooks.
SERVES = {"tilelang": ("fla",), "flash_qla": ("fla",)}   # module -> modules it serves
# transformers 5.15+ (eras C, D): its decorated kernel functions, module global -> (func_name, package) passed to
# use_kernel_func_from_hub_with_fallback (read with `ast` from the released sources: hooks/late.py; the
# hub's kernel mapping names them by func_name).
# Families (5.24.0): the mamba_ssm group - mamba, falcon_mamba, jamba (mamba_inner_fn, selective_state_update,
# selective_scan_fn; zamba the last two), mamba2, bamba, falcon_h1, granitemoehybrid, nemotron_h, zamba2
# (mamba_split_conv1d_scan_combined, selective_state_update, mamba_chunk_scan_combined) - each with the
# causal_conv1d pair; and the fla group (qwen3_next, qwen3_5, qwen3_5_moe, olmo_hybrid, kimi_linear, ...).
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
# transformers 5.25+: where its hub-kernel mapping lives; fastpath-hooks decides which entries may serve
# here when transformers asks for the mapping (engine/hub.py)
HUB_MODULE = "transformers.integrations.hub_kernels"
WATCHED = frozenset(KERNEL_MODULES) | {GATES_MODULE, HUB_MODULE}
PINS = "FASTPATH_HOOKS_PINS"
TRUE_VALUES = ("1", "true", "yes", "on")
FALSE_VALUES = ("0", "false", "no", "off")
STAND_IN = "_FastpathHooksStartup"   # the name of the start-up stand-in finder (a function)
# The start-up stand-in's format (hooks/startup.py passes it to hooks.resume). Only this one is
# known: no released fastpath-hooks wrote another (0.1.0 is the first release).
STARTUP_FORMAT = 5

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

