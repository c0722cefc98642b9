"""The environment probe: an immutable snapshot of every fact a decision needs.

Cheap by design: versions come from dist-info directory names, torch's CUDA/HIP
build from `torch/version.py` read as text. torch is imported only to enumerate
GPUs, and only when torch is a CUDA/ROCm/XPU build and no target spec names the
GPUs. That import costs 1-3 s in a fresh process (nothing inside a training
process, which has imported torch already); `torch.cuda.get_device_capability`
then initialises the CUDA runtime, which the training run does anyway.

Every fact can be posed with FASTPATH_HOOKS_TARGET (see `target.py`), so an image
builder on a CPU host can plan for a GPU cluster and tests can pose as any machine.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, fields
from functools import cached_property, lru_cache

from .distributions import canonical_name, scan
from .frozen import FrozenMap, freeze_fields, thaw
from .procfs import mem_available_gib
from .toolkits import find_hipcc, find_nvcc, find_uv, imported_model_types, nvcc_release, toolkit_version

# Distributions watched besides the ones the pins name (watched_distributions): the installer uv, and
# the hub's `kernels` (transformers' is_kernels_available).
_ALSO_WATCHED = ("uv", "kernels")


def watched_distributions(pins) -> frozenset:
    """The distributions whose half-installed state the policy reads: every one the pins name
    (the kernels', their dependencies, the protected ones) and _ALSO_WATCHED."""
    return frozenset(pins.allowed) | frozenset(pins.protected) | frozenset(_ALSO_WATCHED)


@dataclass(frozen=True)
class Environment:
    python: str
    implementation: str
    os: str
    arch: str
    glibc: str | None
    torch: str | None
    torch_cuda: str | None
    torch_hip: str | None
    torch_xpu: bool
    cxx11_abi: bool | None
    gpus: tuple
    gpu_source: str
    triton: str | None
    triton_dist: str | None
    nvcc: str | None
    distributions: FrozenMap = field(default_factory=FrozenMap)   # canonical name -> version (read-only)
    half_installed: tuple = ()
    uv: str | None = None
    wheelhouse: tuple = ()
    switches: FrozenMap = field(default_factory=FrozenMap)   # the pins' switch variables that are set (FLA_TILELANG)
    posed: tuple = ()
    prefix: str = ""
    pip_index_config: str | None = None   # where pip is told of an index/find-links (uv ignores it)
    nvcc_version: str | None = None   # CUDA release of that nvcc (version.json, posed, or `nvcc --version` on demand)
    hipcc: str | None = None          # ROCm's compiler, for source builds on ROCm
    cpus: int | None = None           # usable CPU cores (source-build estimates and MAX_JOBS)
    memory_gib: float | None = None   # available memory (MAX_JOBS: nvcc jobs take GBs each)
    wheel_cache: str | None = None    # the wheel cache directory (FASTPATH_HOOKS_CACHE_DIR/wheels)
    cached_wheels: tuple = ()         # complete entries in it (file names)
    build_history: tuple = ()         # this machine's source builds, oldest first (facts/build_history.py)
    pip: bool = True                       # pip is installed in this environment (`uv venv` makes none)
    # ((model type, K, V, key heads, value heads), ...): the gated-delta-rule models whose config classes are
    # imported in this process (their defaults; None where a default is derived), or posed (head_dims=, heads=)
    model_shapes: tuple = ()
    jit_caches: FrozenMap = field(default_factory=FrozenMap)   # the pins' JIT cache variables -> the directory in effect
    jit_caches_given: tuple = ()           # those the user set (the rest: under fastpath-hooks' cache)
    numeric_device: str | None = None      # numeric=cpu in the target: a posed GPU's numeric checks on CPU tensors
    numeric_failures: tuple = ()           # remembered numeric mismatches (facts/numeric_records.failures)
    model_types: tuple = ()                # transformers.models.<type>.modeling_<type> imported in this process

    _freezes_itself = True

    def __post_init__(self):
        # read-only all the way down, however it was made (probe(), dataclasses.replace, a test)
        freeze_fields(self)

    # -- derived facts -------------------------------------------------------
    @property
    def platform(self) -> str:
        return f"{self.os}-{self.arch}"

    @property
    def accelerator(self) -> str | None:
        """cuda / rocm / xpu when torch is such a build AND sees a device."""
        if self.torch is None:
            return None
        if self.torch_hip and any(g.startswith("gfx") for g in self.gpus):
            return "rocm"
        if self.torch_cuda and any(g.startswith("sm_") for g in self.gpus):
            return "cuda"
        if self.torch_xpu and "xpu" in self.gpus:
            return "xpu"
        return None

    @property
    def torch_build(self) -> str:
        if self.torch is None:
            return "none"
        if self.torch_hip:
            return f"ROCm {self.torch_hip}"
        if self.torch_cuda:
            return f"CUDA {self.torch_cuda}"
        if self.torch_xpu:
            return "XPU"
        return "CPU"

    def version(self, dist: str) -> str | None:
        return self.distributions.get(canonical_name(dist))

    # -- versions, parsed once (packaging Versions; None when absent or not PEP 440) ---------------
    @cached_property
    def python_version(self):
        return parse_version(self.python)

    @cached_property
    def torch_version(self):
        return parse_version(self.torch)

    @cached_property
    def triton_version(self):
        return parse_version(self.triton)

    @cached_property
    def glibc_version(self):
        return parse_version(self.glibc)

    @cached_property
    def cuda_version(self):
        """torch's CUDA release (torch_cuda)."""
        return parse_version(self.torch_cuda)

    def dist_version(self, dist: str):
        """The installed version of `dist`, parsed (once per version text and process)."""
        return parse_version(self.distributions.get(canonical_name(dist)))

    def to_json(self) -> dict:
        data = {f.name: thaw(getattr(self, f.name)) for f in fields(self)}
        data["platform"] = self.platform
        data["accelerator"] = self.accelerator
        data["torch_build"] = self.torch_build
        data["model_shapes"] = [dict(zip(("model", "k", "v", "heads_k", "heads_v"), row)) for row in self.model_shapes]
        return data


@lru_cache(maxsize=1024)
def parse_version(text: str | None):
    """A packaging Version, or None for no version or one that is not PEP 440 (a dist-info can carry any
    string). Cached: the policy asks for the same few versions many times (Versions are immutable)."""
    if not text:
        return None
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text)
    except InvalidVersion:
        return None


def probe(settings=None, *, pins=None, allow_torch_import: bool = True, found=None) -> Environment:
    """`pins`: the loaded pins (which distributions provide triton); default the shipped ones.
    `found`: a `scan()` of sys.path already made (the installer's, after an install), else one is made."""
    from .target import parse_target

    if pins is None:
        from .pins import load

        pins = load(None)
    posed = parse_target(settings.target, pins=pins) if settings is not None and settings.target else {}
    found, duplicates = scan() if found is None else found
    torch_info = _torch_build_info(found.get("torch"))
    gpus, gpu_source, cxx11_abi = _gpus(torch_info, posed, allow_torch_import)

    uname = os.uname() if hasattr(os, "uname") else None
    real = {
        "python": "%d.%d.%d" % sys.version_info[:3],
        "os": {"linux": "linux", "darwin": "darwin", "win32": "windows"}.get(sys.platform, sys.platform),
        "arch": _normal_arch(uname.machine if uname else os.environ.get("PROCESSOR_ARCHITECTURE", "")),
        "glibc": _glibc(),
        "torch": found["torch"].version if "torch" in found else None,
        "cuda": torch_info.get("cuda"),
        "hip": torch_info.get("hip"),
        "xpu": bool(torch_info.get("xpu")),
        "cxx11_abi": cxx11_abi,
        "uv": find_uv(),
        "hipcc": find_hipcc(),
        "cpus": _cpus(),
    }
    facts = dict(real)
    for key in ("python", "os", "arch", "glibc", "torch", "cuda", "hip", "xpu", "cxx11_abi", "uv", "hipcc", "cpus"):
        if key in posed:
            facts[key] = posed[key]
    if isinstance(facts["hipcc"], bool):
        facts["hipcc"] = "posed" if facts["hipcc"] else None
    if "cuda" in posed and posed["cuda"] and "hip" not in posed:
        facts["hip"] = None
    if "hip" in posed and posed["hip"] and "cuda" not in posed:
        facts["cuda"] = None
    if isinstance(facts["uv"], bool):
        facts["uv"] = "posed" if facts["uv"] else None

    if "gpus" in posed:
        gpus, gpu_source = posed["gpus"], "target"
        if facts["xpu"] is False and "xpu" in gpus:
            facts["xpu"] = True
    env = Environment(
        python=facts["python"],
        implementation=sys.implementation.name,
        os=facts["os"],
        arch=facts["arch"],
        glibc=facts["glibc"],
        torch=facts["torch"],
        torch_cuda=facts["cuda"],
        torch_hip=facts["hip"],
        torch_xpu=bool(facts["xpu"]),
        cxx11_abi=facts["cxx11_abi"],
        gpus=tuple(gpus),
        gpu_source=gpu_source,
        triton=None,
        triton_dist=None,
        nvcc=None,
        uv=facts["uv"],
        wheelhouse=_wheelhouse(settings.find_links if settings is not None else ()),
        switches={spec.switch.variable: os.environ[spec.switch.variable] for spec in pins.kernels.values()
                  if spec.switch is not None and spec.switch.variable in os.environ},
        posed=tuple(sorted(k for k in posed if k != "distributions") + sorted(posed.get("distributions", {}))),
        prefix=os.path.realpath(sys.prefix),
        pip_index_config=pip_index_config(),
        hipcc=facts["hipcc"],
        cpus=facts["cpus"],
        memory_gib=mem_available_gib(),
        model_shapes=_posed_shapes(posed) if ("head_dims" in posed or "heads" in posed) else model_shapes(pins),
        **_jit_caches(pins, settings),
    )
    return _with_distributions(env, found, duplicates, posed, settings, pins)


def _posed_shapes(posed: dict) -> tuple:
    k, v = posed.get("head_dims") or (None, None)
    hk, hv = posed.get("heads") or (None, None)
    return (("posed", k, v, hk, hv),)


def model_shapes(pins, modules=None) -> tuple:
    """((model type, K, V, key heads, value heads), ...) of the models whose transformers configuration
    module is imported (a modeling module imports its own before it chooses its kernels): the class
    defaults of the config attributes the pins name (a backend's `head_dims.config`). Reads
    sys.modules only; a default that is not an int (derived at run time) is None."""
    attrs: dict = {}
    for spec in pins.kernels.values():
        if spec.head_dims is not None:
            for key, names in spec.head_dims.config.items():
                attrs.setdefault(key, [])
                attrs[key] += [n for n in names if n not in attrs[key]]
    if not attrs.get("k") or not attrs.get("v"):
        return ()
    modules = sys.modules if modules is None else modules
    out = []
    for name, module in list(modules.items()):
        parts = name.split(".")
        if len(parts) != 4 or parts[:2] != ["transformers", "models"] or not parts[3].startswith("configuration_"):
            continue
        for obj in list(vars(module).values()):
            if not isinstance(obj, type) or getattr(obj, "__module__", None) != name:
                continue
            values = []
            for key in ("k", "v", "heads_k", "heads_v"):
                found = next((getattr(obj, a) for a in attrs.get(key, ()) if hasattr(obj, a)), None)
                values.append(found if isinstance(found, int) and not isinstance(found, bool) else None)
            if not any(hasattr(obj, a) for a in attrs["k"]):
                continue
            row = (parts[2], *values)
            if row not in out:
                out.append(row)
    return tuple(sorted(out, key=str))


def _jit_caches(pins, settings) -> dict:
    """The pins' JIT cache variables (a kernel's `jit_caches`): the directory each one names here - the
    user's, or one under fastpath-hooks' cache (<cache>/jit/<name>)."""
    from .._environ import cache_root, default_cache_root

    root = cache_root(settings) if settings is not None else default_cache_root()
    caches, given = {}, []
    for spec in pins.kernels.values():
        for var, sub in spec.jit_caches.items():
            if var in caches:
                continue
            value = os.environ.get(var, "").strip()
            if value:
                given.append(var)
            caches[var] = value or os.path.join(root, "jit", sub)
    return {"jit_caches": caches, "jit_caches_given": tuple(sorted(given))}


def after_install(env: Environment, settings, pins, found) -> Environment:
    """`env` as `probe` would find it after an install changed distributions (and perhaps the wheel
    cache): the facts that follow from what is installed are derived again from `found` (the
    installer's own `scan()` afterwards); the machine's own facts (GPUs, torch's build, the
    compilers) stay as probed - an install never changes them (torch & co are protected)."""
    from .target import parse_target

    posed = parse_target(settings.target, pins=pins) if settings is not None and settings.target else {}
    return _with_distributions(env, found[0], found[1], posed, settings, pins)


def _with_distributions(env: Environment, found: dict, duplicates: dict, posed: dict, settings, pins) -> Environment:
    """The facts that follow from the installed distributions (and the wheel cache), posed ones applied."""
    from dataclasses import replace

    from . import build_history, cached_wheels, numeric_records
    from .._environ import cache_root

    dists = {name: item.version for name, item in found.items()}  # all: deps are checked offline too
    nvcc = find_nvcc(dists)
    nvcc_version = toolkit_version(nvcc)
    if "nvcc" in posed:  # nvcc=13.0 poses a toolkit of that release; nvcc=yes one of unknown release
        if posed["nvcc"] is None:
            nvcc, nvcc_version = None, None
        elif nvcc and os.path.isfile(nvcc):
            # a real toolkit stays the compiler that runs (and gets the arch restriction): a posed release only
            # says which release it is (an image builder's `--target ...,nvcc=13.0` with CUDA_HOME set)
            nvcc_version = nvcc_version if posed["nvcc"] == "posed" else posed["nvcc"]
        else:
            nvcc = "posed"
            nvcc_version = None if posed["nvcc"] == "posed" else posed["nvcc"]
    for name, version in posed.get("distributions", {}).items():
        if version is None:
            dists.pop(name, None)
        else:
            dists[name] = version
    if "torch" in posed:
        if posed["torch"] is None:
            dists.pop("torch", None)
        else:
            dists["torch"] = posed["torch"]
    facts = {"hip": env.torch_hip, "xpu": env.torch_xpu}
    triton, triton_dist = _triton(dists, posed, facts, pins.triton_distributions)
    if "triton" in posed:  # a posed triton replaces whichever triton distribution is installed
        for name in pins.triton_distributions:
            dists.pop(name, None)
        if triton_dist is not None:
            dists[triton_dist] = triton
    cache = cache_root(settings) if settings is not None else None
    return replace(
        env,
        triton=triton,
        triton_dist=triton_dist,
        nvcc=nvcc,
        nvcc_version=nvcc_version,
        distributions=dists,
        half_installed=tuple(sorted(set(duplicates) & watched_distributions(pins))),
        wheel_cache=cached_wheels.directory(cache) if cache else None,
        cached_wheels=cached_wheels.listing(cache),
        build_history=build_history.read(cache),
        pip="pip" in dists,
        numeric_device=posed.get("numeric"),
        numeric_failures=numeric_records.failures(cache, [k for k, s in pins.kernels.items() if s.numeric_checks]),
        model_types=imported_model_types(),
    )


def with_nvcc_version(env: Environment) -> Environment:
    """`env` with the CUDA release of its nvcc, asking `nvcc --version` (once per nvcc and process):
    done only when a source build is being considered (engine.context.snapshot), never at every probe."""
    from dataclasses import replace

    if env.nvcc_version or not env.nvcc or not os.path.isfile(env.nvcc):
        return env
    return replace(env, nvcc_version=nvcc_release(env.nvcc))


def _cpus() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _torch_build_info(dist) -> dict:
    """cuda/hip/xpu of the installed torch build, from torch/version.py as text."""
    if dist is None:
        return {}
    path = os.path.join(dist.site, "torch", "version.py")
    info: dict = {}
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                name, sep, value = line.partition("=")
                if not sep:
                    continue
                key = name.split(":")[0].strip()
                if key in ("cuda", "hip", "xpu"):
                    value = value.strip().strip("'\"")
                    info[key] = None if value in ("None", "") else value
    except OSError:
        pass
    return info


def _gpus(torch_info: dict, posed: dict, allow_import: bool):
    """(gpus, how they were found, cxx11 abi flag if torch was imported)."""
    if "gpus" in posed:
        return (), "target", None
    if not any(torch_info.get(k) for k in ("cuda", "hip", "xpu")):
        if torch_info:
            return (), "none: torch is a CPU build", None
        return (), "none: torch is not installed", None
    torch = sys.modules.get("torch")
    if torch is None:
        if not allow_import:
            return (), "not probed (torch not imported)", None
        try:
            import torch  # noqa: F401  - the documented cost: only on accelerator builds
        except Exception as exc:  # a broken torch: report, never crash the caller
            return (), f"none: import torch failed ({type(exc).__name__}: {exc})", None
    abi = None
    try:
        abi = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    except Exception:
        pass
    try:
        if torch_info.get("xpu") and hasattr(torch, "xpu") and torch.xpu.is_available():
            return ("xpu",) * torch.xpu.device_count(), "torch.xpu", abi
        if not torch.cuda.is_available():
            return (), "none: torch.cuda.is_available() is False", abi
        out = []
        for i in range(torch.cuda.device_count()):
            if torch_info.get("hip"):
                arch = getattr(torch.cuda.get_device_properties(i), "gcnArchName", "gfx")
                out.append(arch.split(":")[0])
            else:
                major, minor = torch.cuda.get_device_capability(i)
                out.append(f"sm_{major}{minor}")
        return tuple(out), "torch.cuda", abi
    except Exception as exc:
        return (), f"none: GPU query failed ({type(exc).__name__}: {exc})", abi


def _triton(dists: dict, posed: dict, facts: dict, names: tuple):
    if "triton" in posed:
        if posed["triton"] is None:
            return None, None
        if facts.get("hip"):
            return posed["triton"], "pytorch-triton-rocm"
        if facts.get("xpu"):
            return posed["triton"], "pytorch-triton-xpu"
        return posed["triton"], "triton"
    for name in names:
        if name in dists:
            return dists[name], name
    return None, None


def _glibc() -> str | None:
    try:
        value = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"
    except (AttributeError, ValueError, OSError):
        return None
    if not value or not value.startswith("glibc "):
        return None
    return value.split()[1]


def _normal_arch(machine: str) -> str:
    low = machine.lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(low, low)


_PIP_INDEX_VARIABLES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS")
_PIP_INDEX_KEYS = ("index-url", "extra-index-url", "find-links")


def pip_index_config(environ=None) -> str | None:
    """Where pip is configured with an index or find-links for `pip install`, as pip reads it:
    PIP_* variables, then the files pip loads (PIP_CONFIG_FILE=os.devnull: none), or None."""
    env = os.environ if environ is None else environ
    found = [name for name in _PIP_INDEX_VARIABLES if env.get(name, "").strip()]
    for path in _pip_config_files(env):
        keys = _pip_index_keys(path)
        if keys:
            found.append(f"{path} sets {', '.join(keys)}")
    return "; ".join(found) or None


def _pip_config_files(env) -> list:
    """pip's configuration files in its load order: global, user (unless PIP_CONFIG_FILE names an
    existing file), the environment's own, PIP_CONFIG_FILE."""
    explicit = env.get("PIP_CONFIG_FILE")
    if explicit == os.devnull:
        return []
    home = env.get("HOME") or os.path.expanduser("~")
    if sys.platform == "darwin":
        global_dirs = ["/Library/Application Support/pip"]
        user_dirs = [os.path.join(home, "Library", "Application Support", "pip"), os.path.join(home, ".config", "pip")]
    else:
        global_dirs = [os.path.join(d, "pip") for d in (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep) if d]
        global_dirs.append("/etc")
        user_dirs = [os.path.join(env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"), "pip")]
    files = [os.path.join(d, "pip.conf") for d in global_dirs]
    if not (explicit and os.path.exists(explicit)):
        files += [os.path.join(home, ".pip", "pip.conf")] + [os.path.join(d, "pip.conf") for d in user_dirs]
    files.append(os.path.join(sys.prefix, "pip.conf"))
    if explicit:
        files.append(explicit)
    return files


def _pip_index_keys(path: str) -> list:
    """The index options a pip config file sets for `pip install` ([global] and [install])."""
    if not os.path.isfile(path):
        return []
    import configparser

    parser = configparser.RawConfigParser()
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, OSError, UnicodeDecodeError):
        return []
    keys = []
    for section in ("global", "install"):
        if not parser.has_section(section):
            continue
        for key, value in parser.items(section):
            name = key.lower().replace("_", "-").lstrip("-")
            if name in _PIP_INDEX_KEYS and value.strip() and name not in keys:
                keys.append(name)
    return keys


def _wheelhouse(find_links) -> tuple:
    from .links import find_links_dir

    names = []
    for location in find_links:
        path = find_links_dir(location)
        if path is None:
            continue
        try:
            names.extend(n for n in os.listdir(path) if n.endswith((".whl", ".tar.gz", ".zip")))
        except OSError:
            continue
    return tuple(sorted(set(names)))
