"""The probed facts: `Environment`, an immutable snapshot of every fact a decision needs (facts/probe.py
reads it from this machine; a test or a posed target makes one directly), with the facts derived from
them and their versions parsed once."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property, lru_cache

from .distributions import FrozenMap, canonical_name, freeze_fields, thaw


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
    build_history: tuple = ()         # this machine's source builds, oldest first (facts/memory.py)
    pip: bool = True                       # pip is installed in this environment (`uv venv` makes none)
    unwritable_site: str | None = None     # site-packages, where this process cannot write it: no install can run
    # ((model type, K, V, key heads, value heads), ...): the gated-delta-rule models whose config classes are
    # imported in this process (their defaults; None where a default is derived), or posed (head_dims=, heads=)
    model_shapes: tuple = ()
    jit_caches: FrozenMap = field(default_factory=FrozenMap)   # the pins' JIT cache variables -> the directory in effect
    jit_caches_given: tuple = ()           # those the user set (the rest: under fastpath-hooks' cache)
    numeric_device: str | None = None      # numeric=cpu in the target: a posed GPU's numeric checks on CPU tensors
    numeric_failures: tuple = ()           # remembered numeric mismatches (facts/memory.failures)
    model_types: tuple = ()                # transformers.models.<type>.modeling_<type> imported in this process
    # transformers 5.25+ with an accelerator (facts/hub.py): its mapping's entries of the managed functions,
    # (name, repo, layer, version, revision, kernel, modes), and where each repo@version loads from here:
    # ref -> (how, detail), how LOCAL_KERNELS / cache / hub or "" (nowhere)
    hub_entries: tuple = ()
    hub_where: FrozenMap = field(default_factory=FrozenMap)

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
        data["hub_entries"] = [dict(zip(("function", "repo", "layer", "version", "revision", "kernel", "modes"), row),
                                    modes=list(row[6])) for row in self.hub_entries]
        data["hub_where"] = {ref: {"how": how, "detail": detail} for ref, (how, detail) in self.hub_where.items()}
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
