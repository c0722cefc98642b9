"""Pins and rules as data: load the shipped `pins.json`, merge a user file, validate.

A user file (FASTPATH_HOOKS_PINS, JSON or TOML) has the same shape as `pins.json`
and only needs the parts it changes. Records with an identity replace the shipped
record with that identity and come first (so a user's release is preferred):
fla releases by `version`, tilelang pairs by `tilelang`, broken entries by
(`tilelang`, `arch`, `effect`), hazards by `id`. Everything else is deep-merged;
lists of plain values are replaced. Errors name the file and the entry.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .distributions import canonical_name
from .frozen import FrozenSpecifierSet, freeze
from .._names import MODULE_OF

SHIPPED = os.path.join(os.path.dirname(__file__), "pins.json")
SOURCE_KINDS = ("measured", "reported", "upstream")
KERNELS = ("fla", "tilelang", "causal-conv1d", "mamba-ssm")
# The compiled kernels: sdists with hard-coded -gencode pairs, release wheels on GitHub for some
# torch builds, arch-restricted source builds otherwise (one decision path, parameterized by these
# entries: kernels.<name>.release and .source_build).
COMPILED = ("causal-conv1d", "mamba-ssm")
_RECORD_KEYS = {
    ("kernels", "fla", "releases"): ("version",),
    ("kernels", "mamba-ssm", "releases"): ("version",),
    ("kernels", "causal-conv1d", "releases"): ("version",),
    ("kernels", "tilelang", "pairs"): ("tilelang",),
    ("kernels", "tilelang", "broken"): ("tilelang", "arch", "effect"),
    ("hazards",): ("id",),
}


class PinsError(ValueError):
    def __init__(self, origin: str, entry: str, message: str):
        self.origin, self.entry, self.message = origin, entry, message
        where = f"pins file {origin}" if origin != SHIPPED else "the shipped pins.json"
        super().__init__(f"{where}: {entry}: {message}" if entry else f"{where}: {message}")


@dataclass(frozen=True)
class FlaRelease:
    version: str
    torch: SpecifierSet
    triton: SpecifierSet
    transformers: SpecifierSet
    tilelang_backend: bool
    source: str
    issues: tuple = ()      # ((gpus, id, effect), ...): known wrong results on those GPUs, fixed in a later release


@dataclass(frozen=True)
class KernelSpec:
    name: str
    module: str
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


@dataclass(frozen=True)
class TilelangPair:
    tilelang: str
    tvm_ffi: tuple
    source: str


@dataclass(frozen=True)
class BrokenPair:
    tilelang: str
    tvm_ffi: tuple
    arch: str
    effect: str
    source: str


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
    release: "ReleaseWheels | None" = None   # its GitHub release wheels, when other than kernels.<name>.release's


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
class Pins:
    protected: tuple
    triton_distributions: tuple
    allowed: frozenset
    kernels: dict
    fla_releases: tuple
    tilelang_pairs: tuple
    tilelang_broken: tuple
    hazards: tuple
    yanked: dict
    origins: tuple
    digest: str
    packed_sequences: PackedSequences | None = None
    release_wheels: dict = field(default_factory=dict)    # compiled kernel -> ReleaseWheels
    source_builds: dict = field(default_factory=dict)     # compiled kernel -> SourceBuild
    kernel_releases: dict = field(default_factory=dict)   # compiled kernel -> (KernelRelease, ...) when pinned per machine
    cxx_standards: tuple = ()                             # CxxStandard, first match wins
    arch_rules: dict = field(default_factory=dict)        # kernel -> (ArchRule, ...)
    numeric_checks: dict = field(default_factory=dict)    # kernel -> (NumericCheck, ...)

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

    def kernel(self, name: str) -> KernelSpec:
        return self.kernels[name]

    def release(self, kernel: str, version: str | None = None) -> ReleaseWheels | None:
        """The kernel's release wheels (of `version` when given: a pinned release's own, else the kernel's
        `release` when it is of that version, else None)."""
        base = self.release_wheels[kernel]
        if version is None:
            return base
        rel = next((r for r in self.kernel_releases.get(kernel, ()) if same_version(r.version, version)), None)
        if rel is not None and rel.release is not None:
            return rel.release
        return base if same_version(base.version, version) else None

    def build(self, kernel: str, version: str | None = None) -> SourceBuild:
        """The kernel's source build, of `version` when given (a pinned release: its own -gencode
        table where the data has one; the measured time stays the source build's)."""
        base = self.source_builds[kernel]
        if version is None or (base.version is not None and same_version(base.version, version)):
            return base
        from dataclasses import replace

        rel = next((r for r in self.kernel_releases.get(kernel, ()) if same_version(r.version, version)), None)
        return replace(base, requirement=f"{base.distribution}=={version}",
                       cuda_archs=rel.cuda_archs if rel is not None and rel.cuda_archs else base.cuda_archs)

    def build_for_distribution(self, distribution: str):
        """(kernel, SourceBuild) of the compiled kernel that ships `distribution`, else (None, None)."""
        name = canonical_name(distribution)
        for kernel, build in self.source_builds.items():
            if build.distribution == name:
                return kernel, build
        return None, None

    def good_tvm_ffi(self, tilelang_version: str) -> tuple:
        for pair in self.tilelang_pairs:
            if same_version(pair.tilelang, tilelang_version):
                return pair.tvm_ffi
        return ()

    def broken_for(self, tilelang_version: str, tvm_ffi_version: str, archs) -> BrokenPair | None:
        for entry in self.tilelang_broken:
            if not same_version(entry.tilelang, tilelang_version):
                continue
            if not any(same_version(v, tvm_ffi_version) for v in entry.tvm_ffi):
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


def load(user_file: str | None = None) -> Pins:
    """The shipped pins, merged with `user_file` when given (validated, cached by mtime)."""
    stamp = None
    if user_file:
        try:
            stamp = os.stat(user_file).st_mtime_ns
        except OSError as exc:
            raise PinsError(user_file, "", f"cannot read: {exc.strerror}") from None
    return _load_cached(user_file, stamp)


@lru_cache(maxsize=8)
def _load_cached(user_file, _stamp) -> Pins:
    data = _read(SHIPPED)
    origins = [SHIPPED]
    if user_file:
        user = _read(user_file)
        if not isinstance(user, dict):
            raise PinsError(user_file, "", "the top level must be a table/object")
        _check_user_shape(user, user_file)
        data = _merge(data, user, ())
        origins.append(user_file)
    return _build(data, tuple(origins))


def _read(path: str):
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise PinsError(path, "", f"cannot read: {exc.strerror}") from None
    if path.endswith(".toml"):
        try:
            import tomllib
        except ImportError:  # Python 3.10
            try:
                import tomli as tomllib  # type: ignore
            except ImportError:
                raise PinsError(path, "", "TOML pins need Python 3.11+ or the tomli package; or write the file as JSON") from None
        try:
            return tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise PinsError(path, "", f"not valid TOML: {exc}") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise PinsError(path, "", f"not valid JSON: {exc}") from None


def _check_user_shape(user: dict, origin: str) -> None:
    allowed = {"schema", "about", "protected", "triton_distributions", "allowed_distributions", "kernels", "hazards", "yanked",
               "packed_sequences", "cxx_standard"}
    for key in user:
        if key not in allowed:
            raise PinsError(origin, key, f"unknown section; expected one of {', '.join(sorted(allowed))}")
    if "schema" in user and user["schema"] != 1:
        raise PinsError(origin, "schema", f"unsupported schema {user['schema']!r}; this fastpath-hooks reads schema 1")
    for name in (user.get("kernels") or {}):
        if name not in KERNELS:
            raise PinsError(origin, f"kernels.{name}", f"unknown kernel; expected one of {', '.join(KERNELS)}")


def _merge(base, over, path: tuple):
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = _merge(base[key], value, path + (key,)) if key in base else value
        return out
    if path in _RECORD_KEYS and isinstance(base, list) and isinstance(over, list):
        keys = _RECORD_KEYS[path]

        def ident(rec):
            return tuple(str(rec.get(k)) for k in keys) if isinstance(rec, dict) else None

        mine = {ident(r) for r in over}
        return list(over) + [r for r in base if ident(r) not in mine]
    return over


# -- validation -------------------------------------------------------------

class _V:
    def __init__(self, origin: str):
        self.origin = origin

    def fail(self, entry: str, message: str):
        raise PinsError(self.origin, entry, message)

    def table(self, value, entry) -> dict:
        if not isinstance(value, dict):
            self.fail(entry, "expected a table/object")
        return value

    def list(self, value, entry) -> list:
        if not isinstance(value, list):
            self.fail(entry, "expected a list")
        return value

    def string(self, value, entry) -> str:
        if not isinstance(value, str) or not value.strip():
            self.fail(entry, "expected a non-empty string")
        return value

    def strings(self, value, entry) -> tuple:
        return tuple(self.string(v, f"{entry}[{i}]") for i, v in enumerate(self.list(value, entry)))

    def version(self, value, entry) -> str:
        self.string(value, entry)
        try:
            Version(value)
        except InvalidVersion:
            self.fail(entry, f"{value!r} is not a version")
        return value

    def versions(self, value, entry) -> tuple:
        return tuple(self.version(v, f"{entry}[{i}]") for i, v in enumerate(self.list(value, entry)))

    def specifier(self, value, entry) -> SpecifierSet:
        if not isinstance(value, str):
            self.fail(entry, "expected a version specifier string such as '>=3.4,<3.9'")
        try:
            return FrozenSpecifierSet(value)
        except InvalidSpecifier:
            self.fail(entry, f"{value!r} is not a version specifier (e.g. '>=3.4,<3.9')")

    def requirement(self, value, entry) -> str:
        self.string(value, entry)
        try:
            Requirement(value)
        except InvalidRequirement as exc:
            self.fail(entry, f"{value!r} is not a requirement: {exc}")
        return value

    def boolean(self, value, entry) -> bool:
        if not isinstance(value, bool):
            self.fail(entry, "expected true or false")
        return value

    def source(self, record: dict, entry) -> str:
        value = record.get("source")
        if not isinstance(value, str) or value.split(":", 1)[0].strip() not in SOURCE_KINDS or ":" not in value:
            self.fail(f"{entry}.source", "every fact needs a source 'measured: ...', 'reported: ...' or 'upstream: ...'")
        return value


def _build(data, origins: tuple) -> Pins:
    v = _V(origins[-1])
    v.table(data, "")
    if data.get("schema") != 1:
        v.fail("schema", f"unsupported schema {data.get('schema')!r}; expected 1")

    prot = v.table(data.get("protected"), "protected")
    v.source(prot, "protected")
    protected = tuple(canonical_name(n) for n in v.strings(prot.get("distributions"), "protected.distributions"))
    tri = v.table(data.get("triton_distributions"), "triton_distributions")
    triton_dists = tuple(canonical_name(n) for n in v.strings(tri.get("names"), "triton_distributions.names"))
    allow = v.table(data.get("allowed_distributions"), "allowed_distributions")
    v.source(allow, "allowed_distributions")
    allowed = frozenset(canonical_name(n) for n in v.strings(allow.get("names"), "allowed_distributions.names"))

    kernels_raw = v.table(data.get("kernels"), "kernels")
    kernels = {}
    for name in KERNELS:
        k = v.table(kernels_raw.get(name), f"kernels.{name}")
        e = f"kernels.{name}"
        verify = v.table(k.get("verify", {}), f"{e}.verify")
        attrs = v.strings(verify.get("attributes", []), f"{e}.verify.attributes")
        for i, a in enumerate(attrs):
            if ":" not in a:
                v.fail(f"{e}.verify.attributes[{i}]", "expected module:attribute")
        glibc = v.table(k.get("glibc", {}), f"{e}.glibc")
        for arch, spec in glibc.items():
            v.specifier(spec, f"{e}.glibc.{arch}")
        nvcc_pk = k.get("nvcc_packages")
        if nvcc_pk is not None:
            v.table(nvcc_pk, f"{e}.nvcc_packages")
            v.specifier(nvcc_pk.get("cuda"), f"{e}.nvcc_packages.cuda")
            for i, r in enumerate(v.list(nvcc_pk.get("requirements"), f"{e}.nvcc_packages.requirements")):
                v.requirement(r, f"{e}.nvcc_packages.requirements[{i}]")
            v.source(nvcc_pk, f"{e}.nvcc_packages")
        accelerators = v.strings(k.get("accelerators"), f"{e}.accelerators")
        for i, a in enumerate(accelerators):
            if a not in ("cuda", "rocm", "xpu"):
                v.fail(f"{e}.accelerators[{i}]", f"{a!r}: expected cuda, rocm or xpu")
        platforms = v.strings(k.get("platforms"), f"{e}.platforms")
        for i, p in enumerate(platforms):
            if "-" not in p:
                v.fail(f"{e}.platforms[{i}]", f"{p!r}: expected os-arch such as linux-x86_64")
        kernels[name] = KernelSpec(
            name=name,
            module=MODULE_OF[name],  # fixed: the import hook watches these names from interpreter start
            distributions=tuple(canonical_name(d) for d in v.strings(k.get("distributions"), f"{e}.distributions")),
            python=v.specifier(k.get("python"), f"{e}.python"),
            torch=v.specifier(k.get("torch"), f"{e}.torch"),
            accelerators=accelerators,
            platforms=platforms,
            runtime_deps=tuple(v.requirement(r, f"{e}.runtime_deps[{i}]") for i, r in enumerate(v.list(k.get("runtime_deps", []), f"{e}.runtime_deps"))),
            verify_modules=v.strings(verify.get("modules", []), f"{e}.verify.modules"),
            verify_attributes=attrs,
            source=v.source(k, e),
            glibc=dict(glibc),
            needs_nvcc=v.boolean(k.get("needs_nvcc", False), f"{e}.needs_nvcc"),
            nvcc_packages=dict(nvcc_pk) if nvcc_pk else None,
            with_kernels=_kernel_names(v, k.get("with", []), f"{e}.with", name),
            imports_installed=tuple(canonical_name(n) for n in v.strings(k.get("imports_installed", []),
                                                                        f"{e}.imports_installed")),
            imports_optional=_kernel_names(v, k.get("imports_optional", []), f"{e}.imports_optional", name),
        )

    fla = kernels_raw["fla"]
    releases = _releases(v, fla.get("releases"), "kernels.fla.releases", lambda r, e, **common: FlaRelease(
        tilelang_backend=v.boolean(r.get("tilelang_backend"), f"{e}.tilelang_backend"),
        issues=tuple((v.strings(x.get("gpu"), f"{e}.issues[{j}].gpu"), v.string(x.get("id"), f"{e}.issues[{j}].id"),
                      v.string(x.get("effect"), f"{e}.issues[{j}].effect"))
                     for j, x in enumerate(v.list(r.get("issues", []), f"{e}.issues"))
                     if v.table(x, f"{e}.issues[{j}]") is not None and v.source(x, f"{e}.issues[{j}]")), **common))

    tl = kernels_raw["tilelang"]
    pairs = []
    for i, p in enumerate(v.list(tl.get("pairs"), "kernels.tilelang.pairs")):
        e = f"kernels.tilelang.pairs[{i}]"
        v.table(p, e)
        ffi = v.versions(p.get("tvm_ffi"), f"{e}.tvm_ffi")
        if not ffi:
            v.fail(f"{e}.tvm_ffi", "at least one known-good apache-tvm-ffi version is needed")
        pairs.append(TilelangPair(v.version(p.get("tilelang"), f"{e}.tilelang"), ffi, v.source(p, e)))
    if not pairs:
        v.fail("kernels.tilelang.pairs", "at least one known-good pair is needed")
    broken = []
    for i, b in enumerate(v.list(tl.get("broken", []), "kernels.tilelang.broken")):
        e = f"kernels.tilelang.broken[{i}]"
        v.table(b, e)
        arch = v.string(b.get("arch"), f"{e}.arch")
        if arch != "*" and not (arch.startswith("sm_") or arch.startswith("gfx")):
            v.fail(f"{e}.arch", f"{arch!r}: expected '*', sm_XY or gfxNNN")
        broken.append(BrokenPair(v.version(b.get("tilelang"), f"{e}.tilelang"), v.versions(b.get("tvm_ffi"), f"{e}.tvm_ffi"),
                                 arch, v.string(b.get("effect"), f"{e}.effect"), v.source(b, e)))
    for i, pair in enumerate(pairs):
        for ffi in pair.tvm_ffi:
            for k, b in enumerate(broken):
                if b.arch == "*" and same_version(b.tilelang, pair.tilelang) and any(same_version(x, ffi) for x in b.tvm_ffi):
                    v.fail(f"kernels.tilelang.pairs[{i}]", f"tilelang {pair.tilelang} + apache-tvm-ffi {ffi} is also listed "
                           f"as broken in kernels.tilelang.broken[{k}] ({b.effect})")

    arch_rules = {name: _arch_rules(v, kernels_raw[name].get("arch_rules", []), f"kernels.{name}.arch_rules")
                  for name in KERNELS}
    numeric_checks = {name: _numeric_checks(v, kernels_raw[name].get("numeric_checks", []),
                                            f"kernels.{name}.numeric_checks") for name in KERNELS}
    release_wheels, source_builds, kernel_releases = {}, {}, {}
    for name in COMPILED:
        raw = kernels_raw[name]
        release_wheels[name] = _release_wheels(v, raw.get("release"), f"kernels.{name}.release")
        source_builds[name] = _source_build(v, raw.get("source_build"), f"kernels.{name}.source_build",
                                            arch_rules[name])
        if "releases" in raw:
            kernel_releases[name] = _kernel_releases(v, raw.get("releases"), f"kernels.{name}.releases",
                                                     source_builds[name])

    hazards = []
    for i, h in enumerate(v.list(data.get("hazards", []), "hazards")):
        e = f"hazards[{i}]"
        v.table(h, e)
        kernel = v.string(h.get("kernel"), f"{e}.kernel")
        if kernel not in KERNELS:
            v.fail(f"{e}.kernel", f"{kernel!r}: expected one of {', '.join(KERNELS)}")
        needs = v.string(h.get("needs"), f"{e}.needs")
        if needs not in KERNELS:
            v.fail(f"{e}.needs", f"{needs!r}: expected one of {', '.join(KERNELS)}")
        hazards.append(Hazard(
            id=v.string(h.get("id"), f"{e}.id"), kernel=kernel, gpu=v.strings(h.get("gpu"), f"{e}.gpu"),
            triton=v.specifier(h.get("triton"), f"{e}.triton"), needs=needs,
            effect=v.string(h.get("effect"), f"{e}.effect"), fix=v.string(h.get("fix"), f"{e}.fix"),
            source=v.source(h, e),
        ))

    yanked_raw = v.table(data.get("yanked", {}), "yanked")
    yanked = {canonical_name(k): v.versions(val, f"yanked.{k}") for k, val in yanked_raw.items() if k != "source"}

    # a pinned version the index has yanked would not install (or would warn): never pin one
    def check_not_yanked(dist, version, entry):
        if any(same_version(version, y) for y in yanked.get(dist, ())):
            v.fail(entry, f"{dist} {version} is yanked on the index (see yanked.{dist}); pin another version")

    for i, pair in enumerate(pairs):
        check_not_yanked("tilelang", pair.tilelang, f"kernels.tilelang.pairs[{i}].tilelang")
        for j, ffi in enumerate(pair.tvm_ffi):
            check_not_yanked("apache-tvm-ffi", ffi, f"kernels.tilelang.pairs[{i}].tvm_ffi[{j}]")
    for i, rel in enumerate(releases):
        for dist in ("fla-core", "flash-linear-attention"):
            check_not_yanked(dist, rel.version, f"kernels.fla.releases[{i}].version")

    # consistency: every distribution a kernel may install is on the allow-list
    for name, spec in kernels.items():
        for dist in spec.distributions:
            if dist not in allowed:
                v.fail(f"kernels.{name}.distributions", f"{dist} is not in allowed_distributions.names")
        for i, req in enumerate(spec.runtime_deps):
            if canonical_name(Requirement(req).name) not in allowed:
                v.fail(f"kernels.{name}.runtime_deps[{i}]", f"{Requirement(req).name} is not in allowed_distributions.names")
    for name, build in source_builds.items():
        for i, req in enumerate(build.build_deps):
            if canonical_name(Requirement(req).name) not in allowed:
                v.fail(f"kernels.{name}.source_build.build_deps.requirements[{i}]",
                       f"{Requirement(req).name} is not in allowed_distributions.names")
        if build.distribution not in kernels[name].distributions:
            v.fail(f"kernels.{name}.source_build.requirement", f"{build.distribution} is not one of the kernel's distributions")
    for name in triton_dists:
        if name not in protected:
            v.fail("triton_distributions.names", f"{name} provides triton for a torch build, so it must also be in "
                   "protected.distributions (fastpath-hooks never changes it)")
    for p in protected:
        if p in allowed and p != "numpy":
            v.fail("allowed_distributions.names", f"{p} is protected and can never be installed")

    packed = _packed_sequences(v, data.get("packed_sequences"))
    cxx = _cxx_standards(v, data.get("cxx_standard"))
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    # frozen all the way down: `load()` is cached and shared by every caller in the process
    return freeze(Pins(
        protected=protected, triton_distributions=triton_dists, allowed=allowed, kernels=kernels,
        fla_releases=tuple(releases), tilelang_pairs=tuple(pairs), tilelang_broken=tuple(broken),
        hazards=tuple(hazards), yanked=yanked,
        origins=origins, digest=digest, packed_sequences=packed,
        release_wheels=release_wheels, source_builds=source_builds, kernel_releases=kernel_releases,
        cxx_standards=cxx, arch_rules={k: r for k, r in arch_rules.items() if r},
        numeric_checks={k: c for k, c in numeric_checks.items() if c},
    ))


def _packed_sequences(v: _V, raw) -> PackedSequences | None:
    if raw is None:
        return None
    e = "packed_sequences"
    v.table(raw, e)
    packages = []
    for i, p in enumerate(v.list(raw.get("packages"), f"{e}.packages")):
        pe = f"{e}.packages[{i}]"
        v.table(p, pe)
        kernel = p.get("kernel")
        if kernel is not None and kernel not in KERNELS:
            v.fail(f"{pe}.kernel", f"{kernel!r}: expected one of {', '.join(KERNELS)} (or a `distribution` instead)")
        if kernel is None and not isinstance(p.get("distribution"), str):
            v.fail(pe, "expected a `kernel` (one of fastpath-hooks' kernels) or a `distribution`")
        packages.append(PackedPackage(
            module=v.string(p.get("module"), f"{pe}.module"), kernel=kernel,
            distribution=canonical_name(p.get("distribution") or kernel),
            models=v.strings(p.get("models", []), f"{pe}.models")))
    return PackedSequences(transformers=v.specifier(raw.get("transformers"), f"{e}.transformers"),
                           packages=tuple(packages), source=v.source(raw, e))


def _kernel_names(v: _V, raw, entry: str, own: str) -> tuple:
    names = v.strings(raw, entry)
    for i, name in enumerate(names):
        if name not in KERNELS or name == own:
            v.fail(f"{entry}[{i}]", f"{name!r}: expected another kernel, one of {', '.join(k for k in KERNELS if k != own)}")
    return names


def _gencode_table(v: _V, raw, e: str) -> dict:
    arch_table = v.table(raw, e)
    v.source(arch_table, e)
    gencode = {}
    for code, spec in v.table(arch_table.get("pairs"), f"{e}.pairs").items():
        if not (code.startswith("sm_") and code[3:].isdigit()):
            v.fail(f"{e}.pairs.{code}", "expected sm_XY (a -gencode code)")
        gencode[code] = v.specifier(spec, f"{e}.pairs.{code}")
    return gencode


def _release_wheels(v: _V, raw, e: str) -> ReleaseWheels:
    rel = v.table(raw, e)
    fname = v.string(rel.get("filename"), f"{e}.filename")
    for fieldname in ("{version}", "{cuda_major}", "{torch_mm}", "{abi}", "{py}", "{arch}"):
        if fieldname not in fname:
            v.fail(f"{e}.filename", f"the template must contain {fieldname}")
    base_url = v.string(rel.get("base_url"), f"{e}.base_url")
    builds = []
    for i, b in enumerate(v.list(rel.get("builds"), f"{e}.builds")):
        be = f"{e}.builds[{i}]"
        v.table(b, be)
        builds.append({
            "cuda_major": v.string(str(b.get("cuda_major", "")), f"{be}.cuda_major"),
            "torch_mm": v.strings(b.get("torch_mm"), f"{be}.torch_mm"),
            "python": v.strings(b.get("python"), f"{be}.python"),
            "arch": v.strings(b.get("arch"), f"{be}.arch"),
            "abi": v.strings(b.get("abi"), f"{be}.abi"),
        })
    sha = v.table(rel.get("sha256", {}), f"{e}.sha256")
    for key, digest in sha.items():
        if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
            v.fail(f"{e}.sha256.{key}", "expected 64 lowercase hex digits")
    aliases = v.table(rel.get("torch_aliases", {}), f"{e}.torch_aliases")
    return ReleaseWheels(
        version=v.version(rel.get("version"), f"{e}.version"),
        tag=v.string(rel.get("tag"), f"{e}.tag"),
        base_url=base_url,
        filename=fname,
        builds=tuple(builds),
        torch_aliases={str(k): v.string(val, f"{e}.torch_aliases.{k}") for k, val in aliases.items()},
        sha256=dict(sha),
        source=v.source(rel, e),
    )


_STDS = ("c++17", "c++20", "c++23", "gnu++17", "gnu++20", "gnu++23")


def _cxx_standards(v: _V, raw) -> tuple:
    if raw is None:
        return ()
    e = "cxx_standard"
    v.table(raw, e)
    v.source(raw, e)
    out = []
    for i, r in enumerate(v.list(raw.get("rules"), f"{e}.rules")):
        re_ = f"{e}.rules[{i}]"
        v.table(r, re_)
        std = v.string(r.get("std"), f"{re_}.std")
        if std not in _STDS:
            v.fail(f"{re_}.std", f"{std!r}: expected one of {', '.join(_STDS)}")
        out.append(CxxStandard(torch=v.specifier(r.get("torch"), f"{re_}.torch"), std=std, source=v.source(r, re_)))
    return tuple(out)


def _sm(v: _V, value, entry) -> str:
    v.string(value, entry)
    if not (value.startswith("sm_") and value[3:].isdigit() and len(value) in (5, 6)):
        v.fail(entry, f"{value!r}: expected sm_XY (a CUDA compute capability)")
    return value


def _arch_rules(v: _V, raw, e: str) -> tuple:
    out = []
    for i, r in enumerate(v.list(raw, e)):
        re_ = f"{e}[{i}]"
        v.table(r, re_)
        gpu, build_as = _sm(v, r.get("gpu"), f"{re_}.gpu"), _sm(v, r.get("build_as"), f"{re_}.build_as")
        if gpu[3:-1] != build_as[3:-1] or int(build_as[-1]) > int(gpu[-1]):
            v.fail(f"{re_}.build_as", f"{build_as} code does not run on {gpu} (same major, a lower or equal minor)")
        wheels = r.get("wheels", "")
        if wheels not in ("", "avoid"):
            v.fail(f"{re_}.wheels", f"{wheels!r}: expected \"avoid\" or nothing")
        out.append(ArchRule(id=v.string(r.get("id"), f"{re_}.id"), gpu=gpu, nvcc=v.specifier(r.get("nvcc"), f"{re_}.nvcc"),
                            build_as=build_as, wheels=wheels, effect=v.string(r.get("effect"), f"{re_}.effect"),
                            source=v.source(r, re_)))
    return tuple(out)


_DTYPES = ("float32", "float16", "bfloat16")


def _numeric_checks(v: _V, raw, e: str) -> tuple:
    out, names = [], set()
    for i, c in enumerate(v.list(raw, e)):
        ce = f"{e}[{i}]"
        v.table(c, ce)
        name = v.string(c.get("name"), f"{ce}.name")
        if name in names:
            v.fail(f"{ce}.name", f"{name} is listed twice")
        names.add(name)
        function = v.string(c.get("function"), f"{ce}.function")
        if ":" not in function:
            v.fail(f"{ce}.function", "expected module:function")
        shapes = v.table(c.get("shapes"), f"{ce}.shapes")
        for key, value in shapes.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                v.fail(f"{ce}.shapes.{key}", "expected a positive whole number")
        dtype = v.string(c.get("dtype"), f"{ce}.dtype")
        if dtype not in _DTYPES:
            v.fail(f"{ce}.dtype", f"{dtype!r}: expected one of {', '.join(_DTYPES)}")
        options = v.table(c.get("options", {}), f"{ce}.options")
        for key, value in options.items():
            if not isinstance(value, (bool, int, float, str)):
                v.fail(f"{ce}.options.{key}", "expected a plain value")
        reference = v.string(c.get("reference"), f"{ce}.reference")
        if reference not in NUMERIC_REFERENCES:
            v.fail(f"{ce}.reference", f"{reference!r}: expected one of {', '.join(NUMERIC_REFERENCES)} (act/numeric_check.py)")
        gpus = v.strings(c.get("gpus", ["*"]), f"{ce}.gpus")
        backward_tol = c.get("backward_tolerance")
        out.append(NumericCheck(
            name=name, function=function, reference=reference,
            shapes=dict(shapes), dtype=dtype, tolerance=_tolerance(v, c.get("tolerance"), f"{ce}.tolerance"),
            backward=v.boolean(c.get("backward", False), f"{ce}.backward"), gpus=gpus,
            requires=v.strings(c.get("requires", []), f"{ce}.requires"), source=v.source(c, ce), options=dict(options),
            backward_tolerance=_tolerance(v, backward_tol, f"{ce}.backward_tolerance") if backward_tol else None))
    return tuple(out)


# the references act/numeric_check.py holds (it imports nothing of the package, so the names live here too)
NUMERIC_REFERENCES = ("causal_conv1d", "causal_conv1d_update", "ssd", "selective_state_update", "selective_scan",
                      "gated_delta_rule")


def _tolerance(v: _V, raw, e: str) -> dict:
    tol = v.table(raw, e)
    out = {}
    for key, value in tol.items():
        if key not in ("atol", "rtol", "ratio"):
            v.fail(f"{e}.{key}", "expected atol, rtol or ratio")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            v.fail(f"{e}.{key}", "expected a number >= 0")
        out[key] = float(value)
    if ("atol" in out) != ("rtol" in out) or not out:
        v.fail(e, "expected atol with rtol (elementwise), ratio (rms error over rms of torch's result), or both")
    return out


def _source_build(v: _V, raw, e: str, arch_rules=()) -> SourceBuild:
    sb = v.table(raw, e)
    measured = v.table(sb.get("measured"), f"{e}.measured")
    v.source(measured, f"{e}.measured")
    numbers = {}
    for key in ("seconds", "archs", "cores"):
        value = measured.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            v.fail(f"{e}.measured.{key}", "expected a positive number")
        numbers[key] = value
    gencode = _gencode_table(v, sb.get("cuda_archs"), f"{e}.cuda_archs")
    bd = v.table(sb.get("build_deps", {"requirements": [], "source": "upstream: none"}), f"{e}.build_deps")
    v.source(bd, f"{e}.build_deps")
    build_deps = tuple(v.requirement(r, f"{e}.build_deps.requirements[{i}]")
                       for i, r in enumerate(v.list(bd.get("requirements", []), f"{e}.build_deps.requirements")))
    requirement = v.requirement(sb.get("requirement"), f"{e}.requirement")
    spec = list(Requirement(requirement).specifier)
    if len(spec) != 1 or spec[0].operator != "==":
        v.fail(f"{e}.requirement", f"{requirement!r}: expected one exact version (name==X): builds are cached by it")
    switch = None
    if "cuda_switch" in sb:
        sw = v.table(sb["cuda_switch"], f"{e}.cuda_switch")
        switch = CudaSwitch(env={str(k): str(x) for k, x in v.table(sw.get("env"), f"{e}.cuda_switch.env").items()},
                            releases=v.specifier(sw.get("releases"), f"{e}.cuda_switch.releases"),
                            needed_by=v.strings(sw.get("needed_by"), f"{e}.cuda_switch.needed_by"),
                            triton_only=v.strings(sw.get("triton_only", []), f"{e}.cuda_switch.triton_only"),
                            source=v.source(sw, f"{e}.cuda_switch"))
        if not switch.env:
            v.fail(f"{e}.cuda_switch.env", "expected the variable that turns the CUDA build on")
    return SourceBuild(
        requirement=requirement,
        env={str(k): str(x) for k, x in v.table(sb.get("env", {}), f"{e}.env").items()},
        rocm_env={str(k): str(x) for k, x in v.table(sb.get("rocm_env", {}), f"{e}.rocm_env").items()},
        build_deps=build_deps,
        seconds=float(numbers["seconds"]), archs=int(numbers["archs"]), cores=int(numbers["cores"]),
        cuda_archs=gencode,
        source=v.source(sb, e),
        arch_rules=tuple(arch_rules),
        cuda_switch=switch,
    )


def _releases(v: _V, raw, e: str, make) -> list:
    """A list of releases (fla's, a compiled kernel's): tables, each version listed once, with
    torch/triton/transformers ranges and a source; `make(entry, path, **those)` adds the rest."""
    out, seen = [], set()
    for i, r in enumerate(v.list(raw, e)):
        re_ = f"{e}[{i}]"
        v.table(r, re_)
        ver = v.version(r.get("version"), f"{re_}.version")
        if ver in seen:
            v.fail(f"{re_}.version", f"{ver} is listed twice")
        seen.add(ver)
        out.append(make(r, re_, version=ver,
                        torch=v.specifier(r.get("torch", ""), f"{re_}.torch"),
                        triton=v.specifier(r.get("triton", ""), f"{re_}.triton"),
                        transformers=v.specifier(r.get("transformers", ""), f"{re_}.transformers"),
                        source=v.source(r, re_)))
    if not out:
        v.fail(e, "at least one release is needed")
    return out


def _kernel_releases(v: _V, raw, e: str, build: SourceBuild) -> tuple:
    out = _releases(v, raw, e, lambda r, re_, **common: KernelRelease(
        declares=tuple(v.requirement(x, f"{re_}.declares[{j}]")
                       for j, x in enumerate(v.list(r.get("declares", []), f"{re_}.declares"))),
        cuda_archs=_gencode_table(v, r["cuda_archs"], f"{re_}.cuda_archs") if "cuda_archs" in r else None,
        release=_release_wheels(v, r["release"], f"{re_}.release") if "release" in r else None,
        **common))
    for i, r in enumerate(out):
        if r.release is not None and not same_version(r.release.version, r.version):
            v.fail(f"{e}[{i}].release.version", f"{r.release.version} is not the release's version {r.version}")
    if build.version is not None and not any(same_version(r.version, build.version) for r in out):
        v.fail(e, f"the source build's {build.requirement} is not one of the releases")
    return tuple(out)
