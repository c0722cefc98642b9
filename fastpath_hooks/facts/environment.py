"""The facts a decision reads: `Environment`, an immutable snapshot (probed, or made by a test), its versions
parsed once; and `parse_target`, which reads FASTPATH_HOOKS_TARGET / `--target` (a comma list of key=value facts:
`gpu=sm_90+sm_80,torch=2.11.0,cuda=13.0`, `hip=6.4,gpu=gfx942`, `head_dims=128x128,heads=16x32`) to pose as
another machine; the facts not named are probed."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from functools import cached_property, lru_cache

from packaging.version import InvalidVersion, Version

from .._names import PINS
from .._registry import registry
from .distributions import canonical_name
from .frozen import FrozenMap, freeze_fields, thaw
from .host import normal_arch
from .pins import PinsError, load


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
    distributions: FrozenMap = field(default_factory=FrozenMap)   # canonical name -> version
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
    build_history: tuple = ()         # this machine's source builds, oldest first (facts/memory.py)
    pip: bool = True                       # pip is installed in this environment (`uv venv` makes none)
    unwritable_site: str | None = None     # site-packages, where this process cannot write it: no install can run
    # ((model type, K, V, key heads, value heads), ...): of the imported config classes, or posed
    model_shapes: tuple = ()
    # ((model type, head dim, key heads, heads, sliding window), ...): the imported models' attention (probe)
    attention_shapes: tuple = ()
    jit_caches: FrozenMap = field(default_factory=FrozenMap)   # the pins' JIT cache variables -> their directory
    jit_caches_given: tuple = ()           # those the user set (the rest: under fastpath-hooks' cache)
    numeric_device: str | None = None      # numeric=cpu in the target: a posed GPU's numeric checks on CPU tensors
    numeric_failures: tuple = ()           # remembered numeric mismatches (facts/memory.failures)
    model_types: tuple = ()                # transformers.models.<type>.modeling_<type> imported in this process
    # the hub mapping's (name, repo, layer, version, revision, kernel, modes); ref -> (how, detail): where it loads
    hub_entries: tuple = ()
    hub_where: FrozenMap = field(default_factory=FrozenMap)

    _freezes_itself = True

    def __post_init__(self):   # read-only all the way down, however it was made
        freeze_fields(self)

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

    # packaging Versions, parsed once; None when absent or not PEP 440
    python_version = cached_property(lambda self: parse_version(self.python))
    torch_version = cached_property(lambda self: parse_version(self.torch))
    triton_version = cached_property(lambda self: parse_version(self.triton))
    glibc_version = cached_property(lambda self: parse_version(self.glibc))
    cuda_version = cached_property(lambda self: parse_version(self.torch_cuda))   # torch's CUDA release

    def dist_version(self, dist: str):
        return parse_version(self.version(dist))

    def to_json(self) -> dict:
        data = {f.name: thaw(getattr(self, f.name)) for f in fields(self)}
        data.update(platform=self.platform, accelerator=self.accelerator, torch_build=self.torch_build)
        data["model_shapes"] = [dict(zip(("model", "k", "v", "heads_k", "heads_v"), row)) for row in self.model_shapes]
        data["attention_shapes"] = [dict(zip(("model", "head_dim", "heads_k", "heads", "window"), row))
                                    for row in self.attention_shapes]
        data["hub_entries"] = [dict(zip(("function", "repo", "layer", "version", "revision", "kernel", "modes"), row),
                                    modes=list(row[6])) for row in self.hub_entries]
        data["hub_where"] = {ref: {"how": how, "detail": detail} for ref, (how, detail) in self.hub_where.items()}
        return data


@lru_cache(maxsize=1024)
def parse_version(text: str | None):
    """None for no version or one that is not PEP 440 (a dist-info can carry any string)."""
    if not text:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


FACT_KEYS = ("gpu", "torch", "cuda", "hip", "xpu", "triton", "python", "os", "arch", "platform",
             "glibc", "abi", "nvcc", "hipcc", "uv", "cpus", "memory", "numeric", "head_dims", "heads")
_OS = ("linux", "darwin", "windows")
_ARCH = ("x86_64", "aarch64", "arm64", "amd64")
_NONE = ("none", "no", "absent", "")
_YES = ("yes", "1", "true", "on")
_NO = ("no", "0", "false", "off", "none")


def distribution_keys(pins) -> tuple:
    """The distributions a target may pose: every one the pins name (torch and its triton are facts of their own)."""
    named = (set(pins.allowed) | set(pins.protected)) - set(pins.triton_distributions) - {"torch"}
    return tuple(sorted(named))


def parse_target(spec: str, *, pins=None, pins_file: str | None = None) -> dict:
    """A target spec's facts; ValueError names the bad entry. A posed distribution is a kernel's (the registry)
    or one the pins name (`pins`, else loaded with `pins_file`)."""
    facts: dict = {}
    seen: set = set()
    entries = [e.strip() for e in spec.split(",") if e.strip()]
    if not entries:
        raise ValueError("empty target; expected key=value facts such as gpu=sm_90,torch=2.11.0")
    for entry in entries:
        if "=" not in entry:
            raise ValueError(f"{entry!r}: expected key=value (e.g. gpu=sm_90)")
        key, _, value = entry.partition("=")
        key, value = key.strip().lower(), value.strip()
        same = {"os": "platform", "arch": "platform", "platform": "os"}.get(key)
        if canonical_name(key) in seen or same in seen or (key == "platform" and "arch" in seen):
            raise ValueError(f"{entry!r}: {key} is given twice")
        seen.add(canonical_name(key))
        if key == "gpu":
            facts["gpus"] = _gpus(entry, value)
        elif key in ("torch", "triton", "cuda", "hip", "glibc"):
            facts[key] = None if value.lower() in _NONE else _version(entry, value)
        elif key == "python":
            facts["python"] = _python(entry, value)
        elif key in ("xpu", "abi", "uv", "hipcc"):
            facts["cxx11_abi" if key == "abi" else key] = _flag(entry, value)
        elif key in ("head_dims", "heads"):
            facts[key] = _pair(entry, value)
        elif key == "cpus":
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"{entry!r}: cpus is a number of CPU cores, e.g. cpus=16")
            facts["cpus"] = int(value)
        elif key == "memory":   # GiB available: with cpus, what a build's jobs and split threads are sized by
            try:
                gib = float(value)
            except ValueError:
                gib = 0.0
            if not 0 < gib < float("inf"):
                raise ValueError(f"{entry!r}: memory is the GiB available, e.g. memory=128")
            facts["memory_gib"] = gib
        elif key == "nvcc":   # a release, or yes (one of unknown release)
            low = value.lower()
            facts["nvcc"] = None if low in _NO else "posed" if low in _YES else _version(entry, value)
        elif key == "numeric":   # where the numeric checks of a posed GPU run: cpu (CPU stand-ins), none: skipped
            if value.lower() not in ("cpu", "none", "no"):
                raise ValueError(f"{entry!r}: numeric=cpu runs the numeric checks on CPU tensors (a posed GPU has none "
                                 "here); numeric=none skips them")
            facts["numeric"] = "cpu" if value.lower() == "cpu" else None
        elif key == "os":
            if value.lower() not in _OS:
                raise ValueError(f"{entry!r}: os must be one of {', '.join(_OS)}")
            facts["os"] = value.lower()
        elif key == "arch":
            facts["arch"] = _arch(entry, value)
        elif key == "platform":
            os_name, _, arch = value.lower().partition("-")
            if os_name not in _OS or not arch:
                raise ValueError(f"{entry!r}: platform looks like linux-x86_64")
            facts["os"], facts["arch"] = os_name, _arch(entry, arch)
        else:
            name = canonical_name(key)
            if not _posable(name, pins, pins_file):
                accepted = ", ".join(FACT_KEYS + distribution_keys(pins or _pins(pins_file)))
                raise ValueError(f"{entry!r}: unknown fact {key!r}; accepted: {accepted}")
            dists = facts.setdefault("distributions", {})
            dists[name] = None if value.lower() in _NONE else _version(entry, value)
    if facts.get("hip") and facts.get("cuda"):
        raise ValueError("cuda=... and hip=... together: a torch build has one or the other")
    return facts


# The archs of released GPUs: `nvcc --list-gpu-code` of CUDA 11.8, 12.8 / 12.9 and 13.0 (sm_101 renamed sm_110).
CUDA_ARCHS = ("sm_35", "sm_37", "sm_50", "sm_52", "sm_53", "sm_60", "sm_61", "sm_62", "sm_70", "sm_72", "sm_75",
              "sm_80", "sm_86", "sm_87", "sm_88", "sm_89", "sm_90", "sm_100", "sm_101", "sm_103", "sm_110", "sm_120",
              "sm_121")


def known_cuda_archs() -> tuple:
    """CUDA_ARCHS and every arch the pins' -gencode tables name (FASTPATH_HOOKS_PINS's too), by number."""
    pins = _pins(os.environ.get(PINS, "").strip() or None)
    found = set(CUDA_ARCHS).union(*(build.cuda_archs for build in pins.source_builds.values()))
    return tuple(sorted(found, key=lambda a: int(a[3:])))


def _cuda_arch(entry: str, part: str) -> str:
    """sm_XY / smXY / sm_XYa / sm_XYf -> sm_XY: arch- and family-specific targets (sm_90a) name the GPU's arch."""
    digits = part[3:] if part.startswith("sm_") else part[2:]
    if digits[-1:] in ("a", "f"):
        digits = digits[:-1]
    if not (digits.isdigit() and len(digits) in (2, 3)):
        raise ValueError(f"{entry!r}: a GPU is sm_XY (CUDA compute capability, e.g. sm_90 or sm_90a), gfxNNN (ROCm) "
                         "or none")
    arch = "sm_" + digits
    if arch not in CUDA_ARCHS and arch not in (known := known_cuda_archs()):
        raise ValueError(f"{entry!r}: {part} is not a CUDA GPU arch; known: sm_" + " ".join(a[3:] for a in known))
    return arch


def _posable(name: str, pins, pins_file) -> bool:
    if pins is None:
        if any(name in e["distributions"] for e in registry({PINS: pins_file} if pins_file else {}).values()):
            return True   # a kernel's own distribution: known without loading the pins
        pins = _pins(pins_file)
    return name in distribution_keys(pins)


def _pins(pins_file):
    try:
        return load(pins_file)
    except PinsError:   # said where the pins are loaded for the decision
        return load(None)


def _gpus(entry: str, value: str) -> tuple:
    if value.lower() in _NONE:
        return ()
    out = []
    for part in value.replace("/", "+").split("+"):
        part = part.strip().lower()
        if part.startswith("sm") and len(part) > 2:
            out.append(_cuda_arch(entry, part))
        elif part == "xpu" or (part.startswith("gfx") and len(part) > 3 and part[3:].isalnum()):
            out.append(part)
        else:
            raise ValueError(f"{entry!r}: a GPU is sm_XY (CUDA compute capability, e.g. sm_90), gfxNNN (ROCm) or none")
    return tuple(out)


def _pair(entry: str, value: str) -> tuple:
    parts = value.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"{entry!r}: expected two numbers such as 128x128")
    return int(parts[0]), int(parts[1])


def _version(entry: str, value: str) -> str:
    if parse_version(value) is None:
        raise ValueError(f"{entry!r}: {value!r} is not a version")
    return value


def _python(entry: str, value: str) -> str:
    parts = value.split(".")
    if not (2 <= len(parts) <= 3 and all(p.isdigit() for p in parts) and parts[0] == "3"):
        raise ValueError(f"{entry!r}: python looks like 3.12 or 3.12.3")
    return value


def _flag(entry: str, value: str) -> bool:
    if value.lower() not in _YES + _NO:
        raise ValueError(f"{entry!r}: expected yes or no")
    return value.lower() in _YES


def _arch(entry: str, value: str) -> str:
    low = value.lower()
    if low not in _ARCH:
        raise ValueError(f"{entry!r}: arch must be one of x86_64, aarch64")
    return normal_arch(low)
