"""The values the pins are read into: immutable, one class per kind of record, and the `Pins` that holds
them. Each field's type and metadata (`m(...)`) say what the pins data may hold there (facts/pins.py
reads them and documents the keys)."""

from __future__ import annotations

import os
from dataclasses import MISSING, dataclass, field, replace
from functools import cached_property

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from .distributions import canonical_name

SHIPPED = os.path.join(os.path.dirname(__file__), "pins.json")
SOURCE_KINDS = ("measured", "reported", "upstream")
# pure: wheels at pinned releases (fla); pair: two distributions pinned together, serving another kernel
# (tilelang + apache-tvm-ffi); compiled: sdists with hard-coded -gencode pairs, release wheels for some torch
# builds, arch-restricted source builds otherwise (causal-conv1d, mamba-ssm); backend: wheels the kernel they
# serve dispatches to whenever importable (flash-qla under fla): installed only where right, turned off
# through the served kernel's switch, never blocked.
KINDS = ("pure", "pair", "compiled", "backend")
ACCELERATORS = ("cuda", "rocm", "xpu")
STDS = ("c++17", "c++20", "c++23", "gnu++17", "gnu++20", "gnu++23")
DTYPES = ("float32", "float16", "bfloat16")
# the references act/check_child.py holds (it imports nothing of the package, so the names live here too)
NUMERIC_REFERENCES = ("causal_conv1d", "causal_conv1d_update", "ssd", "selective_state_update", "selective_scan",
                      "gated_delta_rule", "attention")
WHEEL_FIELDS = ("{version}", "{cuda_major}", "{torch_mm}", "{abi}", "{py}", "{arch}")
TENSORS = ("o", "dq", "dk", "dv", "dbeta", "dg")


class PinsError(ValueError):
    def __init__(self, origin: str, entry: str, message: str):
        self.origin, self.entry, self.message = origin, entry, message
        where = f"pins file {origin}" if origin != SHIPPED else "the shipped pins.json"
        super().__init__(f"{where}: {entry}: {message}" if entry else f"{where}: {message}")


def m(default=MISSING, factory=MISSING, **checks):
    """A field and what the pins data may hold for it (facts/pins.py reads `checks`)."""
    return field(default=default, default_factory=factory, metadata=checks)


def _contains(spec, version, unknown: bool) -> bool:
    """`version` in `spec`, pre-releases included; `unknown` for a version that is not PEP 440."""
    try:
        return spec.contains(Version(str(version)), prereleases=True)
    except InvalidVersion:
        return unknown


def _sm(text) -> bool:
    return text.startswith("sm_") and text[3:].isdigit()


_ACCELERATOR = dict(choices=ACCELERATORS, says="expected cuda, rocm or xpu")
_SPEC = dict(absent="")            # a range left out: any version
_SOME = dict(absent=())            # a list left out: none
_POSITIVE = dict(ok=lambda x: x > 0, says="expected a positive number")


@dataclass(frozen=True)
class ReleaseIssue:
    """A pinned release's known wrong results on `gpus` (fla 0.5.2 on Hopper: fla PR #1262), said in
    its install reason; the numeric check is what catches it on the user's GPU."""
    gpus: tuple[str, ...] = m(key="gpu")
    id: str
    effect: str
    source: str


@dataclass(frozen=True)
class PureRelease:
    """One pinned release of a pure kernel, where it fits; `backends`: the serving kernels it can use (fla 0.5+:
    tilelang; 0.6+: flash-qla); a backend's `partners`: the `with` versions it needs (flash-qla 0.1.3: tilelang
    >= 0.1.12)."""
    version: str = m(form="version", unique=True)
    torch: SpecifierSet = m(**_SPEC)
    triton: SpecifierSet = m(**_SPEC)
    transformers: SpecifierSet = m(**_SPEC)
    source: str
    backends: tuple[str, ...] = m((), form="kernel", kinds=("pure",), **_SOME)
    # kernel -> SpecifierSet
    partners: dict = m(factory=dict, key="with", absent={}, form="partners", kinds=("backend",))
    # known wrong results on some GPUs, fixed in a later release
    issues: tuple[ReleaseIssue, ...] = m((), kinds=("pure",), **_SOME)


@dataclass(frozen=True)
class Archs:
    """A backend's GPUs: `train` runs its forward and backward, `forward` its forward only (the
    served kernel sends a call that needs gradients elsewhere, so it is no training path there)."""
    train: tuple[str, ...] = m(ok=_sm, says="expected sm_XY", **_SOME)
    forward: tuple[str, ...] = m(ok=_sm, says="expected sm_XY", **_SOME)
    source: str


_DIMS = dict(ok=lambda x: x > 0, says="expected a positive integer", nonempty="expected a list of positive integers")


@dataclass(frozen=True)
class HeadDims:
    """The head dims (K, V) a backend computes (the served kernel sends others elsewhere), or a compiled attention
    kernel has code for (its build keeps the models': `source_build.trim`); `config`: the transformers config
    attributes that hold them, the head counts and the sliding window (facts/probe.py)."""
    k: tuple[int, ...] = m(**_DIMS)
    v: tuple[int, ...] = m(**_DIMS)
    # "k" / "v" / "heads_k" / "heads_v" / "window" -> attribute names, first found wins
    config: dict[str, tuple[str, ...]] = m(absent={}, key_ok=("k", "v", "heads_k", "heads_v", "window").__contains__,
                                           key_says="expected k, v, heads_k, heads_v or window")
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
    """The gated-delta-rule check of a kernel: ONE pass at the model's head shapes, dtype and variant (known at the
    kernel's first call, else these defaults), compiled and tuned at the training length, then compared at
    `check_seq` with a float32 recurrence; tolerances: relative RMS error (as fla's tests), or within `slack` times
    the served kernel's own path (a backend); none: errors reported."""
    check_seq: int = m(ok=lambda x: x > 0, says="expected a positive integer (the check's sequence length)")
    heads: tuple[int, ...] = m(**_DIMS)       # (key heads, value heads)
    dims: tuple[int, ...] = m(**_DIMS)        # (K, V)
    tolerances: dict = m(absent={}, form="tensor_tolerances")   # o, dq, dk, dv, dbeta, dg -> ratio
    slack: float = m(absent=1.0, ok=lambda x: x >= 1, says="expected a number >= 1")
    source: str
    gva_transformers: SpecifierSet = m(factory=SpecifierSet, **_SPEC)   # where q/k keep their own head count
    # where the first call is not known yet: the length Triton tunes at (0: check_seq), output_final_state, dtype
    tune_seq: int = m(0, absent=0, ok=lambda x: x >= 0, says="expected a sequence length (0: the check's)")
    final_state: bool = m(True, absent=True)
    dtype: str = m("bfloat16", absent="bfloat16", choices=("bfloat16", "float16", "float32"),
                   says="expected bfloat16, float16 or float32")
    gpus: tuple[str, ...] = m((), **_SOME)   # where it runs without a hazard too (the GPUs its pins' miscompiles hit)


@dataclass(frozen=True)
class Pair:
    """A known-good pair: the kernel's first distribution at `version` with one of `companions`
    (its second distribution: tilelang 0.1.15 with apache-tvm-ffi 0.1.12 or 0.1.11)."""
    version: str = m(key="{distributions[0]}", form="version")
    companions: tuple[str, ...] = m(key="{distributions[1]}", form="version",
                                    nonempty="at least one known-good {distributions[1]} version is needed")
    source: str


@dataclass(frozen=True)
class BrokenPair:
    version: str = m(key="{distributions[0]}", form="version")
    companions: tuple[str, ...] = m(key="{distributions[1]}", form="version")
    arch: str = m(ok=lambda a: a == "*" or a.startswith(("sm_", "gfx")), says="expected '*', sm_XY or gfxNNN")
    effect: str
    source: str


@dataclass(frozen=True)
class Switch:
    """The variable a served kernel reads to stop using this one (FLA_TILELANG=0), and the
    accelerators where the policy sets it (where this kernel cannot run), unless the user set it."""
    variable: str
    off: str
    off_on: tuple[str, ...] = m(**_ACCELERATOR, **_SOME)
    source: str


@dataclass(frozen=True)
class KernelSpec:
    """One kernel's entry (docs/registry.md). `hand`: made by facts/pins.py from other keys;
    `kinds`: only a kernel of these kinds has the key."""
    name: str = m(hand=True)
    module: str = m(hand=True)          # the import name checked and blocked (modules[0])
    distributions: tuple[str, ...] = m(conv=canonical_name, ctx=True, nonempty="at least one distribution is needed")
    python: SpecifierSet
    torch: SpecifierSet
    accelerators: tuple[str, ...] = m(**_ACCELERATOR)
    platforms: tuple[str, ...] = m(ok=lambda p: "-" in p, says="expected os-arch such as linux-x86_64")
    runtime_deps: tuple[str, ...] = m(form="requirement", **_SOME)
    verify_modules: tuple[str, ...] = m(key="verify.modules", **_SOME)
    verify_attributes: tuple[str, ...] = m(key="verify.attributes", ok=lambda a: ":" in a,
                                           says="expected module:attribute", **_SOME)
    source: str
    glibc: dict[str, str] = m(factory=dict, absent={}, form="spec")
    needs_nvcc: bool = m(False, absent=False)
    nvcc_packages: dict | None = m(None, form="nvcc")
    # kernels it is only useful with (mamba-ssm: causal-conv1d), decided first
    with_kernels: tuple[str, ...] = m((), key="with", form="kernel", ctx=True, **_SOME)
    # protected distributions its import needs, never installed by us
    imports_installed: tuple[str, ...] = m((), conv=canonical_name, **_SOME)
    # kernels its import tries under `except ImportError` (mamba-ssm: tilelang)
    imports_optional: tuple[str, ...] = m((), form="kernel", **_SOME)
    # the registry (docs/registry.md)
    kind: str = m("pure", hand=True)
    modules: tuple[str, ...] = m((), nonempty="at least one import name is needed", ok=str.isidentifier,
                                 says="expected a top-level module name (the finder watches those)")
    aliases: tuple[str, ...] = m((), conv=str.lower, **_SOME)
    gates: tuple[str, ...] = m((), **_SOME)        # transformers' gates that ask for it
    mirror: str | None = m(None)    # the variable naming a mirror of its release wheels
    # compiled: the attn_implementation whose request installs it (flash_attention_2); its gates and imports then act
    # only when a model asks for it (hooks/gates.py `asked`)
    attn_implementation: str | None = m(None, kinds=("compiled",), ok=lambda v: v.startswith("flash_attention_"),
                                        says="expected transformers' name of it, such as flash_attention_2")
    # the GPUs where fastpath_hooks.attention() prefers it to sdpa (engine/attention.py)
    attention_gpus: tuple[str, ...] = m((), kinds=("compiled",), ok=_sm, says="expected sm_XY", **_SOME)
    serves: tuple[str, ...] = m((), form="kernel", **_SOME)      # kernels that use it (tilelang: fla)
    rule_prefix: str = m("", hand=True)
    switch: Switch | None = m(None, kinds=("pair", "backend"))
    # variable -> subdirectory of the cache root (TRITON_CACHE_DIR)
    jit_caches: dict[str, str] = m(factory=dict, absent={},
                                   key_ok=lambda var: var.isidentifier() and var.upper() == var,
                                   key_says="expected an environment variable name such as TRITON_CACHE_DIR",
                                   ok=lambda name: "/" not in name and not name.startswith("."),
                                   says="expected the name of a subdirectory of fastpath-hooks' JIT cache")
    warm: Warm | None = m(None)     # the gated-delta-rule check/warm-up its verification runs, where decided
    # its kind's data; releases: PureRelease (pure, backend; newest preferred first) or KernelRelease (compiled)
    releases: tuple = m((), hand=True, kinds=("pure", "compiled", "backend"))
    pairs: tuple[Pair, ...] = m((), kinds=("pair",), nonempty="at least one known-good pair is needed")   # best first
    broken: tuple[BrokenPair, ...] = m((), kinds=("pair",), **_SOME)
    archs: Archs | None = m(None, kinds=("backend",), req=True)
    head_dims: HeadDims | None = m(None, kinds=("backend", "compiled"), req=("backend",))
    pays: Pays | None = m(None, kinds=("backend",), req=True)
    # rules as data (docs/builds.md): its numbers against torch references on the GPU (any kind but a backend)
    numeric_checks: tuple[NumericCheck, ...] = m((), kinds=("pure", "compiled", "pair"), **_SOME)
    # compiled: code an nvcc release gets wrong for a GPU
    arch_rules: tuple[ArchRule, ...] = m((), kinds=("compiled",), **_SOME)
    # compiled: its source build's opt-in CUDA extension (source_build.cuda_switch)
    cuda_switch: CudaSwitch | None = m(None, hand=True)
    # compiled: what its source build leaves out for the models in use (source_build.trim)
    trim: Trim | None = m(None, hand=True)

    @property
    def checks_numbers(self) -> bool:
        """Its numbers are checked against torch on the GPU: numeric checks, or the gated-delta-rule check."""
        return bool(self.numeric_checks or self.warm)


@dataclass(frozen=True)
class KernelRelease:
    """One pinned release of a compiled kernel (mamba-ssm): where it fits, and the requirements its
    metadata declares that a --no-deps install leaves unmet (a later resolver may act on them)."""
    version: str = m(form="version", unique=True)
    torch: SpecifierSet = m(**_SPEC)
    triton: SpecifierSet = m(**_SPEC)
    transformers: SpecifierSet = m(**_SPEC)
    declares: tuple[str, ...] = m(form="requirement", **_SOME)
    cuda_archs: dict | None = m(form="gencode")   # its -gencode table, where it differs from the source build's
    source: str
    release: ReleaseWheels | None = m(None)   # its GitHub release wheels, when other than the kernel's `release`


@dataclass(frozen=True)
class ReleaseWheels:
    """A compiled kernel's GitHub release wheels: the file-name scheme and the builds published."""
    version: str = m(form="version")
    tag: str
    base_url: str
    filename: str = m()    # a template of WHEEL_FIELDS (facts/pins.py)
    builds: tuple = m(form="builds")
    torch_aliases: dict[str, str] = m(absent={})
    sha256: dict[str, str] = m(absent={}, ok=lambda d: len(d) == 64 and all(c in "0123456789abcdef" for c in d),
                               says="expected 64 lowercase hex digits")
    source: str


@dataclass(frozen=True)
class SourceBuild:
    """How a kernel builds from its sdist (data, so the next kernel - mamba-ssm - is a pins entry).
    `seconds` for `archs` GPU archs on `cores` cores is the measured time the estimates scale;
    `cuda_archs`: the sdist's hard-coded -gencode pairs, code -> the nvcc versions that get it."""
    requirement: str = m(form="requirement")
    env: dict[str, object] = m(absent={}, conv=str)
    rocm_env: dict[str, object] = m(absent={}, conv=str)
    # what setup.py imports/uses, installed first (builds run without isolation)
    build_deps: tuple[str, ...] = m(key="build_deps.requirements", form="requirement", **_SOME)
    seconds: float = m(key="measured.seconds", **_POSITIVE)
    archs: int = m(key="measured.archs", **_POSITIVE)
    cores: int = m(key="measured.cores", **_POSITIVE)
    cuda_archs: dict = m(form="gencode")
    source: str
    # files compiled (MAX_JOBS beyond this count leaves cores idle)
    translation_units: int = m(1, key="parallel.translation_units", absent=1, ok=lambda x: x >= 1,
                               says="expected a positive whole number (the files the build compiles)")
    # nvcc's --split-compile may be given to its compiles (nvcc >= 11.8)
    split_compile: bool = m(False, key="parallel.split_compile", absent=False)
    # (file name, measured seconds of its compile): how the cores are shared out
    unit_seconds: tuple = m((), key="parallel.unit_seconds", absent={}, form="unit_seconds")
    # files compiled in parts, one per explicit instantiation group (act/compiler_wrapper.py)
    split_units: tuple[str, ...] = m((), key="parallel.split_units", **_SOME)
    arch_rules: tuple = m((), hand=True)   # ArchRule: the kernel's (kernels.<name>.arch_rules), for the arch arithmetic
    cuda_switch: CudaSwitch | None = m(None)   # releases whose CUDA extension is opt-in (mamba-ssm after 2.3.2.post1)
    trim: Trim | None = m(None)   # code left out for the models in use (FA3: head dims, sliding window)
    # the variable its setup.py reads for the CUDA archs, set to the archs built (FLASH_ATTN_CUDA_ARCHS=80;90)
    arch_env: str | None = m(None, ok=lambda v: v.isidentifier() and v.upper() == v,
                             says="expected an environment variable name such as FLASH_ATTN_CUDA_ARCHS")
    # where pip builds it from when the index has no sdist of it: a URL pip takes after `name @` (a VCS or archive
    # URL; `#subdirectory=` for a package in a subdirectory: flash-attn-3 in flash-attention's hopper/)
    url: str | None = m(None, ok=lambda v: "://" in v, says="expected a URL pip installs from (git+https://..., "
                        "https://..., file://...)")
    # GiB one compile job of it takes at its peak (MAX_JOBS is bounded by the free memory): 0 - the nvcc threads'
    gib_per_job: float = m(0.0, key="parallel.gib_per_job", absent=0.0, ok=lambda x: x >= 0,
                           says="expected GiB, a number >= 0")

    @cached_property   # parsed once (the policy asks for every cached and wheelhouse wheel)
    def distribution(self) -> str:
        return canonical_name(Requirement(self.requirement).name)

    @cached_property
    def version(self) -> str | None:
        spec = list(Requirement(self.requirement).specifier)
        return spec[0].version if len(spec) == 1 and spec[0].operator == "==" else None

    @property
    def pip_requirement(self) -> str:
        """What pip builds: the requirement, or `name @ url` where the build's source is a URL."""
        return f"{self.distribution} @ {self.url}" if self.url else self.requirement


@dataclass(frozen=True)
class CxxStandard:
    """The C++ standard a torch release's headers need: `std` is handed LAST to both compilers of
    every compiled kernel's build (host and nvcc/hipcc), replacing whatever the sdist hard-codes."""
    torch: SpecifierSet
    std: str = m(choices=STDS)
    source: str


_SM = dict(ok=lambda gpu: _sm(gpu) and len(gpu) in (5, 6), says="expected sm_XY (a CUDA compute capability)")


@dataclass(frozen=True)
class ArchRule:
    """Code for `gpu` compiled by an nvcc in `nvcc` is known to be wrong: build `build_as` code instead
    (it runs on `gpu`), and with `wheels` == "avoid" take no release wheel built by such an nvcc there."""
    id: str
    gpu: str = m(**_SM)
    nvcc: SpecifierSet
    build_as: str = m(**_SM)
    wheels: str = m(absent="", choices=("", "avoid"), says='expected "avoid" or nothing')
    effect: str
    source: str

    def applies(self, gpu: str, nvcc_version) -> bool:
        """On `gpu`, with code from nvcc `nvcc_version` (None: unknown - the rule applies, failing closed)."""
        return gpu == self.gpu and (nvcc_version is None or _contains(self.nvcc, nvcc_version, unknown=True))


@dataclass(frozen=True)
class NumericCheck:
    """One tiny run of a kernel function on the GPU against a torch reference (act/check_child.py
    holds the references, by name). `gpus`: where it runs ("*": every GPU); `requires`: modules that
    must import for it to apply (a build without the CUDA extension has no selective_scan_cuda)."""
    name: str = m(unique=True)
    function: str = m(ok=lambda f: ":" in f, says="expected module:function")
    reference: str = m(choices=NUMERIC_REFERENCES,
                       says=f"expected one of {', '.join(NUMERIC_REFERENCES)} (act/check_child.py)")
    shapes: dict[str, int] = m(ok=lambda x: x >= 1, says="expected a positive whole number")
    dtype: str = m(choices=DTYPES)
    # atol + rtol (elementwise, as torch.allclose) and/or ratio (rms error / rms of torch's)
    tolerance: dict = m(form="tolerance")
    backward: bool = m(absent=False)
    gpus: tuple[str, ...] = m(absent=("*",))
    requires: tuple[str, ...] = m(**_SOME)
    source: str
    # the reference's switches (channel_last, ...)
    options: dict[str, object] = m(factory=dict, absent={}, ok=lambda x: isinstance(x, (bool, int, float, str)),
                                   says="expected a plain value")
    backward_tolerance: dict | None = m(None, form="tolerance?")   # for the gradients, when it differs
    # only for a hub kernel replacing the function (transformers 5.25): the package's own numbers are its
    # gated-delta-rule check's (one pass at the model's shapes)
    hub_only: bool = m(False, absent=False)

    def runs_on(self, gpus) -> tuple:
        return tuple(g for g in gpus if g.startswith(("sm_", "gfx")) and ("*" in self.gpus or g in self.gpus))


@dataclass(frozen=True)
class CudaSwitch:
    """Releases whose CUDA extension is built only with `env` (mamba-ssm #977: MAMBA_KEEP_CUDA_BUILD=TRUE);
    `needed_by`: the model types that call it (Mamba-1) - with only others in use, the build compiles nothing."""
    env: dict[str, object] = m(conv=str, nonempty="expected the variable that turns the CUDA build on")
    releases: SpecifierSet
    needed_by: tuple[str, ...]
    triton_only: tuple[str, ...] = m(**_SOME)   # the model types that use only its Triton ops
    source: str

    def applies(self, version) -> bool:
        return _contains(self.releases, version, unknown=False)


@dataclass(frozen=True)
class Trim:
    """Variables its setup.py reads to leave code out (FA3's FLASH_ATTENTION_DISABLE_*=TRUE), set from the models
    in use (their configs: the kernel's `head_dims.config`): `head_dims` names each head dim's (`{dim}`: one of the
    kernel's `head_dims.k`) - a build keeps, per model, the smallest listed dim at or above its head dim, and every
    dim where a model's is unknown; `window` leaves sliding-window attention out - where no model in use has one."""
    head_dims: str = m(ok=lambda v: v.count("{dim}") == 1 and v.replace("{dim}", "").isidentifier(),
                       says="expected an environment variable name with {dim} in it")
    source: str
    window: str | None = m(None, ok=lambda v: v.isidentifier() and v.upper() == v,
                           says="expected an environment variable name")


@dataclass(frozen=True)
class Hazard:
    """A GPU + triton range where `kernel` is wrong unless `needs` is usable. Messages read
    `<gpu> + triton <version> <effect> (<id>)`, so `effect` is a short predicate and `fix` a
    short imperative without parentheses."""
    id: str
    kernel: str = m(form="kernel")
    gpu: tuple[str, ...]
    triton: SpecifierSet = m()      # matched failing closed: a pre-release of a bound counts as inside
    needs: str = m()                # a kernel that serves `kernel` (facts/pins.py)
    effect: str
    fix: str
    source: str


@dataclass(frozen=True)
class PackedPackage:
    """A package transformers' kernel functions need to keep packed sequences apart: a managed `kernel`, or
    (None) a distribution only checked for being installed."""
    module: str
    kernel: str | None = m(form="kernel")
    distribution: str = m(hand=True)    # the kernel's name where none is given
    models: tuple[str, ...] = m(**_SOME)


@dataclass(frozen=True)
class PackedSequences:
    """The transformers versions that raise on packed sequences (cu_seqlens / seq_idx) when a
    kernel function is on its torch path, and the packages that concerns."""
    transformers: SpecifierSet
    packages: tuple[PackedPackage, ...]
    source: str


@dataclass(frozen=True)
class HubBroken:
    """A hub kernel build known to fail: `repo` at `version` (None: any) with a torch and CUDA in these ranges
    (None: any) on these GPUs (empty: any)."""
    id: str
    repo: str
    version: int | None = m(says="expected the repo's kernel version, a whole number such as 5")
    torch: SpecifierSet | None
    cuda: SpecifierSet | None
    gpu: tuple[str, ...] = m(**_SOME)
    effect: str
    source: str


@dataclass(frozen=True)
class HubRules:
    """The hub's kernels (transformers 5.25+ asks for them by default): `backends`, repo -> the kernels its
    build dispatches to (a hazard's remedies); builds known broken; how long the hub may take to answer."""
    backends: dict[str, tuple[str, ...]] = m(factory=dict, absent={}, form="kernel")
    broken: tuple[HubBroken, ...] = m((), **_SOME)
    probe_seconds: float = m(3.0, absent=3.0, ok=lambda x: 0 < x <= 60,
                             says="expected seconds, more than 0 and at most 60")
    source: str = m("")


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

    @property
    def keyed(self) -> frozenset:
        """The distributions a remembered check is keyed on (act/verify.relevant): what the kernels may install
        and what they compute with (torch, triton); not transformers, which fla imports but never runs."""
        return self.allowed | frozenset(self.triton_distributions) | {"torch"}

    def kernel(self, name: str) -> KernelSpec:
        return self.kernels[name]

    def cxx_standard(self, torch_version) -> CxxStandard | None:
        """The rule for this torch (a Version or text; pre-releases and local builds included), or None."""
        try:
            v = Version(Version(str(torch_version)).public)
        except InvalidVersion:   # None too
            return None
        return next((r for r in self.cxx_standards if r.torch.contains(v, prereleases=True)), None)

    def of_kind(self, kind: str) -> tuple:
        return tuple(name for name, spec in self.kernels.items() if spec.kind == kind)

    def _pinned(self, kernel: str, version: str):
        return next((r for r in self.kernels[kernel].releases if same_version(r.version, version)), None)

    def release(self, kernel: str, version: str | None = None) -> ReleaseWheels | None:
        """The kernel's release wheels (of `version` when given: a pinned release's own, else the kernel's
        `release` when it is of that version, else None)."""
        base = self.release_wheels.get(kernel)
        if version is None:
            return base
        rel = self._pinned(kernel, version)
        if rel is not None and getattr(rel, "release", None) is not None:
            return rel.release
        return base if base is not None and same_version(base.version, version) else None

    def build(self, kernel: str, version: str | None = None) -> SourceBuild:
        """The kernel's source build, of `version` when given (a pinned release: its own -gencode
        table where the data has one; the measured time stays the source build's)."""
        base = self.source_builds[kernel]
        if version is None or (base.version is not None and same_version(base.version, version)):
            return base
        rel = self._pinned(kernel, version)
        return replace(base, requirement=f"{base.distribution}=={version}",
                       cuda_archs=rel.cuda_archs if rel is not None and rel.cuda_archs else base.cuda_archs)

    def build_for_distribution(self, distribution: str):
        """(kernel, SourceBuild) of the compiled kernel that ships `distribution`, else (None, None)."""
        name = canonical_name(distribution)
        return next(((k, b) for k, b in self.source_builds.items() if b.distribution == name), (None, None))

    def good_companions(self, kernel: str, version: str) -> tuple:
        """A pair kernel's known-good companions of its first distribution at `version`."""
        return next((p.companions for p in self.kernels[kernel].pairs if same_version(p.version, version)), ())

    def broken_for(self, kernel: str, version: str, companion: str, archs) -> BrokenPair | None:
        return next((e for e in self.kernels[kernel].broken if same_version(e.version, version)
                     and any(same_version(v, companion) for v in e.companions) and (e.arch == "*" or e.arch in archs)),
                    None)


def same_version(a: str, b: str) -> bool:
    """Version equality that never raises (a dist-info can carry any string)."""
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b
