"""The kernel registry: each kernel's registry keys (pins.json's `kernels` entries: kind, modules,
aliases, gates, mirror, with, serves, rule prefix, switch), as literals - the index the hooks, the
settings and the CLI read without parsing pins.json - and the kernels a FASTPATH_HOOKS_PINS file adds.

A leaf like _names (stdlib only), loaded after interpreter start: by the gates, the settings, the
first kernel import; the start-up path itself reads only _names' written-out names. The user file is
read when that variable is set, shallowly, and never raises: facts/pins.py validates the same file in
full and says what is wrong; an entry that is not well-formed here is left out (the hooks then do not
know its kernel) or keeps the shipped keys.
"""

from ._names import GATES_MODULE, HUB_MODULE, PINS, environ_of

# The index: each kernel's registry keys in facts/pins.json, generated (tools/registry_index.py). A user's
# FASTPATH_HOOKS_PINS file adds kernels the same way: `registry()` reads it (docs/registry.md).
#   kind: pure (wheels at pinned releases) | pair (two distributions pinned together, serving another
#   kernel) | compiled (release wheels or a source build) | backend (wheels the kernel it serves
#   dispatches to by itself when they are importable); modules: its import names (the first is
#   the one checked and blocked); aliases: other names FASTPATH_HOOKS_SKIP etc. accept; gates:
#   transformers' availability gates that ask for it; mirror: the variable naming a mirror of its
#   release wheels; with: kernels it is only useful with (ensured first); serves: kernels that use it;
#   switch: the variable by which a served kernel is told not to use it.
# -- generated from facts/pins.json by tools/registry_index.py: do not edit --
REGISTRY = {
    "fla": {"kind": "pure", "modules": ("fla",), "distributions": ("fla-core", "flash-linear-attention"),
            "aliases": ("flash-linear-attention", "fla-core"), "gates": ("is_flash_linear_attention_available",),
            "mirror": None, "with": (), "serves": (), "rule_prefix": "fla", "switch": None},
    "tilelang": {"kind": "pair", "modules": ("tilelang",), "distributions": ("tilelang", "apache-tvm-ffi"),
                 "aliases": (), "gates": (), "mirror": None, "with": (), "serves": ("fla",),
                 "rule_prefix": "tilelang", "switch": "FLA_TILELANG"},
    "causal-conv1d": {"kind": "compiled", "modules": ("causal_conv1d",), "distributions": ("causal-conv1d",),
                      "aliases": ("causal_conv1d",), "gates": ("is_causal_conv1d_available",),
                      "mirror": "FASTPATH_HOOKS_CAUSAL_CONV1D_WHEEL_URL", "with": (), "serves": (),
                      "rule_prefix": "causal", "switch": None},
    "mamba-ssm": {"kind": "compiled", "modules": ("mamba_ssm",), "distributions": ("mamba-ssm",),
                  "aliases": ("mamba_ssm",), "gates": ("is_mamba_ssm_available", "is_mamba_2_ssm_available"),
                  "mirror": "FASTPATH_HOOKS_MAMBA_SSM_WHEEL_URL", "with": ("causal-conv1d",), "serves": (),
                  "rule_prefix": "mamba", "switch": None},
    "flash-qla": {"kind": "backend", "modules": ("flash_qla",), "distributions": ("flash-qla",),
                  "aliases": ("flash_qla", "flashqla"), "gates": (), "mirror": None, "with": ("tilelang",),
                  "serves": ("fla",), "rule_prefix": "qla", "switch": "FLA_FLASH_QLA"},
}
# -- end of generated --


def kernel_modules(registry) -> dict:
    """module -> kernel (the distribution name fastpath-hooks manages), for every import name."""
    return {module: kernel for kernel, entry in registry.items() for module in entry["modules"]}


def served_modules(registry) -> dict:
    """module -> the modules of the kernels it serves. A kernel that only serves another (tilelang:
    fla's Hopper backend) is not installed for another package's optional import of it (mamba-ssm's
    Mamba-3 kernels try `import tilelang`) while neither it nor what it serves is installed (its
    distribution's metadata on sys.path): that import goes on as without fastpath-hooks."""
    return {entry["modules"][0]: tuple(registry[k]["modules"][0] for k in entry["serves"] if k in registry)
            for entry in registry.values() if entry["serves"]}


def watched_modules(registry) -> frozenset:
    """What the finder (and the start-up stand-in, hooks/startup.py) watches."""
    return frozenset(kernel_modules(registry)) | {GATES_MODULE, HUB_MODULE}


def listed(registry) -> tuple:
    """The kernels in the order users see them (plans, reports, messages): the ones models use, then
    the ones that serve them."""
    return tuple(k for k, e in registry.items() if not e["serves"]) + tuple(k for k, e in registry.items() if e["serves"])


KEYS = ("kind", "modules", "distributions", "aliases", "gates", "mirror", "with", "serves", "rule_prefix", "switch")
_LISTS = ("modules", "distributions", "aliases", "gates", "with", "serves")
_cache: dict = {}   # (path, mtime_ns, size) -> registry


def registry_keys(name: str, entry, base=None) -> dict | None:
    """One kernel's registry keys from its pins entry (JSON values), over `base` (the keys of a
    shipped kernel the entry changes); None when a new kernel's entry lacks its kind or modules."""
    if not isinstance(entry, dict):
        return base
    out = dict(base) if base else {"kind": None, "modules": (), "distributions": (), "aliases": (), "gates": (),
                                   "mirror": None, "with": (), "serves": (), "rule_prefix": name, "switch": None}
    for key in _LISTS:
        value = entry.get(key)
        if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
            out[key] = tuple(value)
    for key in ("kind", "mirror", "rule_prefix"):
        if isinstance(entry.get(key), str) and entry[key]:
            out[key] = entry[key]
    switch = entry.get("switch")
    if isinstance(switch, dict) and isinstance(switch.get("variable"), str):
        out["switch"] = switch["variable"]
    if not out["kind"] or not out["modules"]:
        return base
    return out


def from_pins_data(kernels: dict, base=None) -> dict:
    """kernel -> registry keys for a pins `kernels` table (the shipped one, or a user file's over it)."""
    out = dict(base or {})
    for name, entry in kernels.items():
        keys = registry_keys(name, entry, out.get(name))
        if keys is not None:
            out[name] = keys
    return out


def with_user_file(path: str, base: dict) -> dict:
    """`base` (REGISTRY) and the kernels the pins file at `path` adds or changes (cached by its mtime)."""
    import os

    path = os.path.abspath(os.path.expanduser(path))
    try:
        st = os.stat(path)
    except OSError:
        return base
    key = (path, st.st_mtime_ns, st.st_size, id(base))
    if key not in _cache:
        _cache.clear()
        _cache[key] = _read(path, base)
    return _cache[key]


PINS_MAX_BYTES = 1 << 20   # a pins file is small (the shipped one: about 56 KB); a bigger one is refused unread


class PinsFileError(ValueError):
    """Why a pins file's text is not pins data: too big, not JSON or TOML (the message says which)."""


def pins_file_size_problem(size: int) -> str:
    """"" for a pins file of `size` bytes that may be read, else why not (a 208 MB one was parsed in every process)."""
    if size <= PINS_MAX_BYTES:
        return ""
    return f"it is {size / (1 << 20):.0f} MB; a pins file is at most {PINS_MAX_BYTES >> 20} MB"


def read_pins_file(path: str):
    """The data of a JSON or TOML pins file (`.toml`), read at most PINS_MAX_BYTES - the one reader of pins
    files (the registry's shallow look, the pins' validation, the posed archs). OSError: unreadable;
    PinsFileError: too big, not valid JSON/TOML, no TOML parser (Python 3.10 without tomli)."""
    import os

    with open(path, "rb") as fh:
        problem = pins_file_size_problem(os.fstat(fh.fileno()).st_size)
        if problem:
            raise PinsFileError(problem)
        raw = fh.read(PINS_MAX_BYTES + 1)
    if len(raw) > PINS_MAX_BYTES:   # grew while being read
        raise PinsFileError(pins_file_size_problem(len(raw)))
    if path.endswith(".toml"):
        try:
            import tomllib
        except ImportError:  # Python 3.10
            try:
                import tomli as tomllib  # type: ignore
            except ImportError:
                raise PinsFileError("TOML pins need Python 3.11+ or the tomli package; or write the file as JSON") \
                    from None
        try:
            return tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise PinsFileError(f"not valid TOML: {exc}") from None
    import json

    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise PinsFileError(f"not valid JSON: {exc}") from None


def _read(path: str, base: dict) -> dict:
    try:
        data = read_pins_file(path)
    except (OSError, PinsFileError):   # facts/pins.py says what is wrong
        return base
    kernels = data.get("kernels") if isinstance(data, dict) else None
    if not isinstance(kernels, dict):
        return base
    return from_pins_data(kernels, base)


def registry(environ=None) -> dict:
    """kernel -> its registry keys: REGISTRY, and what the FASTPATH_HOOKS_PINS file adds or changes
    (read only when that variable is set: `with_user_file`)."""
    raw = environ_of(environ).get(PINS, "").strip()
    if not raw:
        return REGISTRY
    return with_user_file(raw, REGISTRY)
