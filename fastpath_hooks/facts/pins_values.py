"""The values the pins are read into (facts/pins.py loads them, facts/pins_schema.py validates):
immutable, one class per kind of record, and the `Pins` that holds them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from .distributions import canonical_name

SHIPPED = os.path.join(os.path.dirname(__file__), "pins.json")
SOURCE_KINDS = ("measured", "reported", "upstream")
# pure: wheels at pinned releases (fla); pair: two distributions pinned together, serving another
# kernel (tilelang + apache-tvm-ffi); compiled: sdists with hard-coded -gencode pairs, release wheels
# on GitHub for some torch builds, arch-restricted source builds otherwise (causal-conv1d, mamba-ssm);
# backend: pure-Python wheels that the kernel they serve dispatches to by itself whenever they are
# importable (flash-qla under fla), so they are installed only where they are right and turned off
# through the served kernel's switch, never blocked.
KINDS = ("pure", "pair", "compiled", "backend")
ACCELERATORS = ("cuda", "rocm", "xpu")


class PinsError(ValueError):
    def __init__(self, origin: str, entry: str, message: str):
        self.origin, self.entry, self.message = origin, entry, message
        where = f"pins file {origin}" if origin != SHIPPED else "the shipped pins.json"
        super().__init__(f"{where}: {entry}: {message}" if entry else f"{where}: {message}")

@dataclass(frozen=True)
class PureRelease:
    """One pinned release of a pure kernel (every distribution at this version), where it fits;
    `backends`: the serving kernels it can use (fla 0.5+: tilelang; 0.6+: flash-qla), which a hazard
    may need and a backend kernel is installed for. A backend's release: `partners`, the versions of
    the kernels it is used `with` that it needs (flash-qla 0.1.3: tilelang >= 0.1.12)."""
    version: str
    torch: SpecifierSet
    triton: SpecifierSet
    transformers: SpecifierSet
    backends: tuple
    source: str
    partners: dict = field(default_factory=dict)    # kernel -> SpecifierSet
    issues: tuple = ()      # ReleaseIssue: known wrong results on some GPUs, fixed in a later release


@dataclass(frozen=True)
class ReleaseIssue:
    """A pinned release's known wrong results on `gpus` (fla 0.5.2 on Hopper: fla PR #1262), said in
    its install reason; the numeric check is what catches it on the user's GPU."""
    gpus: tuple
    id: str
    effect: str
    source: str


@dataclass(frozen=True)
class Archs:
    """A backend's GPUs: `train` runs its forward and backward, `forward` its forward only (the
    served kernel sends a call that needs gradients elsewhere, so it is no training path there)."""
    train: tuple
    forward: tuple
    source: str


@dataclass(frozen=True)
class HeadDims:
    """The head dims (K, V) a backend computes; the served kernel sends other shapes elsewhere. `config`:
    the transformers config attributes that hold them (and the head counts), read from the config
    classes of the modeling modules imported (facts/imported_models.py)."""
    k: tuple
    v: tuple
    config: dict      # "k" / "v" / "heads_k" / "heads_v" -> attribute names, first found wins
    source: str


@dataclass(frozen=True)
class Pays:
    """Where a backend is installed by default: `hazard` - where a hazard of the served kernel makes it
    need the backend's `with` kernel anyway (fla#640: fla runs tilelang on Hopper with triton < 3.7.1);
    `elsewhere` - everywhere else it applies. Flipped by a benchmark's figures (a pins file can too)."""
    hazard: bool
    elsewhere: bool
    source: str


@dataclass(frozen=True)
class Warm:
    """The gated-delta-rule check and warm-up a kernel's verification child runs (act/gdr_check.py):
    the check's sequence length, the sequence lengths warmed (each JIT variant the model's training
    shapes reach: short ones without, long ones with a backend's intra-card split), the head counts and
    dims used where the model's are not known, and the tolerances (relative RMS error vs a float32
    recurrence, as fla's tests measure it; or within `slack` times the served kernel's own error; none:
    the kernel is run and warmed, its errors only reported)."""
    check_seq: int
    seqs: tuple
    heads: tuple       # (key heads, value heads)
    dims: tuple        # (K, V)
    tolerances: dict   # o, dq, dk, dv, dbeta, dg -> ratio
    slack: float
    source: str
    gva_transformers: SpecifierSet = field(default_factory=SpecifierSet)   # where q/k keep their own head count
    final_state: tuple = (False,)   # output_final_state of the calls warmed (the first: the check's)


@dataclass(frozen=True)
class Pair:
    """A known-good pair: the kernel's first distribution at `version` with one of `companions`
    (its second distribution: tilelang 0.1.15 with apache-tvm-ffi 0.1.12 or 0.1.11)."""
    version: str
    companions: tuple
    source: str


@dataclass(frozen=True)
class BrokenPair:
    version: str
    companions: tuple
    arch: str
    effect: str
    source: str


@dataclass(frozen=True)
class Switch:
    """The variable a served kernel reads to stop using this one (FLA_TILELANG=0), and the
    accelerators where the policy sets it (where this kernel cannot run), unless the user set it."""
    variable: str
    off: str
    off_on: tuple
    source: str


@dataclass(frozen=True)
class KernelSpec:
    name: str
    module: str                     # the import name checked and blocked (modules[0])
    distributions: tuple
    python: SpecifierSet
    torch: SpecifierSet
    accelerators: tuple
    platforms: tuple
    runtime_deps: tuple
    verify_modules: tuple
    verify_attributes: tuple
    source: str
    glibc: dict = field(default_factory=dict)
    needs_nvcc: bool = False
    nvcc_packages: dict | None = None
    with_kernels: tuple = ()        # kernels it is only useful with (mamba-ssm: causal-conv1d), decided first
    imports_installed: tuple = ()   # protected distributions its import needs, never installed by us
    imports_optional: tuple = ()    # kernels its import tries under `except ImportError` (mamba-ssm: tilelang)
    # the registry (docs/registry.md)
    kind: str = "pure"
    modules: tuple = ()
    aliases: tuple = ()
    gates: tuple = ()               # transformers' gates that ask for it
    mirror: str | None = None       # the variable naming a mirror of its release wheels
    serves: tuple = ()              # kernels that use it (tilelang: fla)
    rule_prefix: str = ""
    switch: Switch | None = None
    wheel_indexes: tuple = ()       # compiled: WheelIndex, where prebuilt wheels of it may be looked up
    jit_caches: dict = field(default_factory=dict)   # variable -> subdirectory of the cache root (TRITON_CACHE_DIR)
    warm: Warm | None = None        # the gated-delta-rule check/warm-up its verification runs, where decided
    # its kind's data
    releases: tuple = ()            # pure, backend: PureRelease, newest preferred first; compiled: KernelRelease
    pairs: tuple = ()               # pair: Pair, preferred first
    broken: tuple = ()              # pair: BrokenPair
    archs: Archs | None = None      # backend
    head_dims: HeadDims | None = None   # backend
    pays: Pays | None = None        # backend
    # rules as data (docs/builds.md)
    numeric_checks: tuple = ()      # NumericCheck: its numbers against torch references on the GPU (any kind)
    arch_rules: tuple = ()          # compiled: ArchRule, code an nvcc release gets wrong for a GPU
    cuda_switch: "CudaSwitch | None" = None   # compiled: its source build's opt-in CUDA extension (source_build.cuda_switch)


@dataclass(frozen=True)
class KernelRelease:
    """One pinned release of a compiled kernel (mamba-ssm): where it fits, and the requirements its
    metadata declares that a --no-deps install leaves unmet (a later resolver may act on them)."""
    version: str
    torch: SpecifierSet
    triton: SpecifierSet
    transformers: SpecifierSet
    declares: tuple
    cuda_archs: dict | None        # this release's -gencode table when it differs from the source build's
    source: str
    release: "ReleaseWheels | None" = None   # its GitHub release wheels, when other than the kernel's `release`


@dataclass(frozen=True)
class ReleaseWheels:
    """A compiled kernel's GitHub release wheels: the file-name scheme and the builds published."""
    version: str
    tag: str
    base_url: str
    filename: str
    builds: tuple
    torch_aliases: dict
    sha256: dict
    source: str


@dataclass(frozen=True)
class WheelIndex:
    """A PEP 503/691 package index with one channel per CUDA release that publishes prebuilt wheels of
    a compiled kernel (Astral's layout: `<host>/simple/<channel>/<project>/`). A wheel is taken from it
    only when its version is a pinned release with the local label `local` spells for this torch
    build, its tags fit this Python and platform, and its sha256 is the one the index lists.
    `url`, `channel` and `local` are templates: {channel}, {project}, {cuda} (torch.version.cuda,
    13.0), {cuda_nodot} (130), {torch_mm} (2.11). Its builds hold every arch the sdist's -gencode
    table gives that CUDA release, and use the cxx11 ABI `cxx11_abi` (where `torch` holds)."""
    name: str
    url: str
    project: str
    channel: str
    local: str
    cxx11_abi: str
    torch: SpecifierSet
    enabled: bool          # used unless FASTPATH_HOOKS_WHEEL_INDEX says otherwise
    source: str


@dataclass(frozen=True)
class SourceBuild:
    """How a kernel builds from its sdist (data, so the next kernel - mamba-ssm - is a pins entry).
    `seconds` for `archs` GPU archs on `cores` cores is the measured time the estimates scale;
    `cuda_archs`: the sdist's hard-coded -gencode pairs, code -> the nvcc versions that get it."""
    requirement: str
    env: dict
    rocm_env: dict
    build_deps: tuple      # what setup.py imports/uses, installed first (builds run without isolation)
    seconds: float
    archs: int
    cores: int
    cuda_archs: dict
    source: str
    translation_units: int = 1     # files compiled (MAX_JOBS beyond this count leaves cores idle)
    split_compile: bool = False    # nvcc's --split-compile may be given to its compiles (nvcc >= 11.8)
    unit_seconds: tuple = ()       # (file name, measured seconds of its compile): how the cores are shared out
    split_units: tuple = ()        # files compiled in parts, one per explicit instantiation group (act/compiler_wrapper.py)
    arch_rules: tuple = ()   # ArchRule: the kernel's (kernels.<name>.arch_rules), for the arch arithmetic
    cuda_switch: "CudaSwitch | None" = None   # releases whose CUDA extension is opt-in (mamba-ssm after 2.3.2.post1)

    @cached_property   # parsed once (the policy asks for every cached and wheelhouse wheel)
    def distribution(self) -> str:
        return canonical_name(Requirement(self.requirement).name)

    @cached_property
    def version(self) -> str | None:
        spec = list(Requirement(self.requirement).specifier)
        return spec[0].version if len(spec) == 1 and spec[0].operator == "==" else None


@dataclass(frozen=True)
class CxxStandard:
    """The C++ standard a torch release's headers need: `std` is handed LAST to both compilers of
    every compiled kernel's build (host and nvcc/hipcc), replacing whatever the sdist hard-codes."""
    torch: SpecifierSet
    std: str
    source: str


@dataclass(frozen=True)
class ArchRule:
    """Code for `gpu` compiled by an nvcc in `nvcc` is known to be wrong: build `build_as` code instead
    (it runs on `gpu`), and with `wheels` == "avoid" take no release wheel built by such an nvcc there."""
    id: str
    gpu: str
    nvcc: SpecifierSet
    build_as: str
    wheels: str
    effect: str
    source: str

    def applies(self, gpu: str, nvcc_version) -> bool:
        """On `gpu`, with code from nvcc `nvcc_version` (None: unknown - the rule applies, failing closed)."""
        if gpu != self.gpu:
            return False
        if nvcc_version is None:
            return True
        try:
            return self.nvcc.contains(Version(str(nvcc_version)), prereleases=True)
        except InvalidVersion:
            return True


@dataclass(frozen=True)
class NumericCheck:
    """One tiny run of a kernel function on the GPU against a torch reference (act/numeric_check.py
    holds the references, by name). `gpus`: where it runs ("*": every GPU); `requires`: modules that
    must import for it to apply (a build without the CUDA extension has no selective_scan_cuda)."""
    name: str
    function: str
    reference: str
    shapes: dict
    dtype: str
    tolerance: dict              # atol + rtol (elementwise, as torch.allclose) and/or ratio (rms error / rms of torch's)
    backward: bool
    gpus: tuple
    requires: tuple
    source: str
    options: dict = field(default_factory=dict)         # the reference's switches (channel_last, ...)
    backward_tolerance: dict | None = None              # for the gradients, when it differs

    def runs_on(self, gpus) -> tuple:
        return tuple(g for g in gpus if g.startswith(("sm_", "gfx")) and ("*" in self.gpus or g in self.gpus))


@dataclass(frozen=True)
class CudaSwitch:
    """A release whose compiled CUDA extension is built only when `env` is set (mamba-ssm main, #977:
    MAMBA_KEEP_CUDA_BUILD=TRUE). `releases`: the versions that have the switch; `needed_by`: the model
    types whose modeling code calls that extension (transformers' Mamba-1 families); the others use
    only its Triton ops, so where only they are in use the build compiles nothing."""
    env: dict
    releases: SpecifierSet
    needed_by: tuple
    triton_only: tuple   # the model types that use the package without the extension (its Triton ops)
    source: str

    def applies(self, version) -> bool:
        try:
            return self.releases.contains(Version(str(version)), prereleases=True)
        except InvalidVersion:
            return False


@dataclass(frozen=True)
class Hazard:
    """A GPU + triton range where `kernel` is wrong unless `needs` is usable. Messages read
    `<gpu> + triton <version> <effect> (<id>)`, so `effect` is a short predicate and `fix` a
    short imperative without parentheses."""
    id: str
    kernel: str
    gpu: tuple
    triton: SpecifierSet      # matched failing closed: a pre-release of a bound counts as inside
    needs: str
    effect: str
    fix: str
    source: str


@dataclass(frozen=True)
class PackedPackage:
    """A package transformers' kernel functions need to keep packed sequences apart: a kernel
    fastpath-hooks manages (`kernel`: fla, causal-conv1d, mamba-ssm), or a distribution it does not
    (`kernel` None: only whether it is installed is checked)."""
    module: str
    kernel: str | None
    distribution: str
    models: tuple


@dataclass(frozen=True)
class PackedSequences:
    """The transformers versions that raise on packed sequences (cu_seqlens / seq_idx) when a
    kernel function is on its torch path, and the packages that concerns."""
    transformers: SpecifierSet
    packages: tuple
    source: str


@dataclass(frozen=True)
class HubBroken:
    """A hub kernel build known to fail: `repo` at `version` (None: any) with a torch and CUDA in these ranges
    (None: any) on these GPUs (empty: any)."""
    id: str
    repo: str
    version: int | None
    torch: SpecifierSet | None
    cuda: SpecifierSet | None
    gpu: tuple
    effect: str
    source: str


@dataclass(frozen=True)
class HubRules:
    """What fastpath-hooks knows of the hub's kernels (transformers 5.25+ asks for them by default):
    which remedies of a hazard a repo's build carries (`backends`: repo -> kernels it dispatches to,
    none by default), the builds known to be broken, and how long the hub may take to answer."""
    backends: dict = field(default_factory=dict)
    broken: tuple = ()
    probe_seconds: float = 3.0
    source: str = ""


@dataclass(frozen=True)
class Pins:
    protected: tuple
    triton_distributions: tuple
    allowed: frozenset
    kernels: dict                   # name -> KernelSpec, in the pins' order (shipped first, then a user's)
    hazards: tuple
    yanked: dict
    origins: tuple
    digest: str
    packed_sequences: PackedSequences | None = None
    release_wheels: dict = field(default_factory=dict)    # compiled kernel -> ReleaseWheels (where published)
    source_builds: dict = field(default_factory=dict)     # compiled kernel -> SourceBuild
    decision_order: tuple = ()      # each kernel after those its rules read (decision_order())
    cxx_standards: tuple = ()       # CxxStandard, first match wins (pins: cxx_standard)
    hub: HubRules = field(default_factory=HubRules)   # the hub's kernels (pins: hub)

    def kernel(self, name: str) -> KernelSpec:
        return self.kernels[name]

    def cxx_standard(self, torch_version) -> CxxStandard | None:
        """The rule for this torch (a Version or text; pre-releases and local builds included), or None."""
        if torch_version is None:
            return None
        try:
            v = torch_version if isinstance(torch_version, Version) else Version(str(torch_version))
        except InvalidVersion:
            return None
        v = Version(v.public)
        return next((r for r in self.cxx_standards if r.torch.contains(v, prereleases=True)), None)

    def of_kind(self, kind: str) -> tuple:
        return tuple(name for name, spec in self.kernels.items() if spec.kind == kind)

    def release(self, kernel: str, version: str | None = None) -> ReleaseWheels | None:
        """The kernel's release wheels (of `version` when given: a pinned release's own, else the kernel's
        `release` when it is of that version, else None)."""
        base = self.release_wheels.get(kernel)
        if version is None:
            return base
        rel = next((r for r in self.kernels[kernel].releases if same_version(r.version, version)), None)
        if rel is not None and getattr(rel, "release", None) is not None:
            return rel.release
        return base if base is not None and same_version(base.version, version) else None

    def build(self, kernel: str, version: str | None = None) -> SourceBuild:
        """The kernel's source build, of `version` when given (a pinned release: its own -gencode
        table where the data has one; the measured time stays the source build's)."""
        base = self.source_builds[kernel]
        if version is None or (base.version is not None and same_version(base.version, version)):
            return base
        from dataclasses import replace

        rel = next((r for r in self.kernels[kernel].releases if same_version(r.version, version)), None)
        return replace(base, requirement=f"{base.distribution}=={version}",
                       cuda_archs=rel.cuda_archs if rel is not None and rel.cuda_archs else base.cuda_archs)

    def build_for_distribution(self, distribution: str):
        """(kernel, SourceBuild) of the compiled kernel that ships `distribution`, else (None, None)."""
        name = canonical_name(distribution)
        for kernel, build in self.source_builds.items():
            if build.distribution == name:
                return kernel, build
        return None, None

    def good_companions(self, kernel: str, version: str) -> tuple:
        """A pair kernel's known-good companions of its first distribution at `version`."""
        for pair in self.kernels[kernel].pairs:
            if same_version(pair.version, version):
                return pair.companions
        return ()

    def broken_for(self, kernel: str, version: str, companion: str, archs) -> BrokenPair | None:
        for entry in self.kernels[kernel].broken:
            if not same_version(entry.version, version):
                continue
            if not any(same_version(v, companion) for v in entry.companions):
                continue
            if entry.arch == "*" or entry.arch in archs:
                return entry
        return None

def same_version(a: str, b: str) -> bool:
    """Version equality that never raises (a dist-info can carry any string)."""
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b
