"""Validation of one kernel's pins entry into its `KernelSpec` (facts/pins_values.py): the keys every
kernel has, the records of its kind (releases, pairs, archs, head dims, pays, warm-up, wheel indexes),
which keys which kind may have; the build and numeric rules it holds are facts/pins_rules.py's."""

from __future__ import annotations

import re

from . import pins_rules
from .distributions import canonical_name
from .pins_validator import Validator
from .pins_values import (ACCELERATORS, KINDS, Archs, BrokenPair, HeadDims, KernelRelease, KernelSpec, Pair, Pays,
                          PureRelease, Switch, Warm, WheelIndex, same_version)


def kernel_spec(v: Validator, name: str, raw, names: tuple) -> KernelSpec:
    """One kernel's entry: the registry keys, what every kernel has, and its kind's data."""
    e = f"kernels.{name}"
    k = v.table(raw, e)
    kind = k.get("kind")
    if kind not in KINDS:
        v.fail(f"{e}.kind", f"{kind!r}: expected one of {', '.join(KINDS)}")
    modules = v.strings(k.get("modules"), f"{e}.modules")
    if not modules:
        v.fail(f"{e}.modules", "at least one import name is needed")
    for i, module in enumerate(modules):
        if not module.isidentifier():
            v.fail(f"{e}.modules[{i}]", f"{module!r}: expected a top-level module name (the finder watches those)")
    distributions = tuple(canonical_name(d) for d in v.strings(k.get("distributions"), f"{e}.distributions"))
    if not distributions:
        v.fail(f"{e}.distributions", "at least one distribution is needed")
    if kind == "pair" and len(distributions) != 2:
        v.fail(f"{e}.distributions", "a pair kernel has exactly two distributions: its own and its companion")
    prefix = v.string(k.get("rule_prefix", name), f"{e}.rule_prefix")
    if "." in prefix or prefix == "skip":
        v.fail(f"{e}.rule_prefix", f"{prefix!r}: a rule prefix has no dot and is not `skip` (the shared rules' prefix)")
    mirror = k.get("mirror")
    if mirror is not None:
        v.string(mirror, f"{e}.mirror")
        if kind != "compiled" or not (mirror.startswith("FASTPATH_HOOKS_") and mirror.endswith("_WHEEL_URL")):
            v.fail(f"{e}.mirror", f"{mirror!r}: a compiled kernel's FASTPATH_HOOKS_<NAME>_WHEEL_URL")

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
        v.requirements(nvcc_pk.get("requirements"), f"{e}.nvcc_packages.requirements")
        v.source(nvcc_pk, f"{e}.nvcc_packages")
    accelerators = v.strings(k.get("accelerators"), f"{e}.accelerators")
    for i, a in enumerate(accelerators):
        if a not in ACCELERATORS:
            v.fail(f"{e}.accelerators[{i}]", f"{a!r}: expected cuda, rocm or xpu")
    platforms = v.strings(k.get("platforms"), f"{e}.platforms")
    for i, p in enumerate(platforms):
        if "-" not in p:
            v.fail(f"{e}.platforms[{i}]", f"{p!r}: expected os-arch such as linux-x86_64")

    releases, pairs, broken, switch = (), (), (), None
    archs = head_dims = pays = None
    with_kernels = _kernel_names(v, k.get("with", []), f"{e}.with", name, names)
    if kind == "pure":
        releases = tuple(_releases(v, k.get("releases"), f"{e}.releases", lambda r, re_, **common: PureRelease(
            backends=_kernel_names(v, r.get("backends", []), f"{re_}.backends", name, names),
            issues=pins_rules.release_issues(v, r.get("issues", []), f"{re_}.issues"), **common)))
    elif kind == "backend":
        releases = tuple(_releases(v, k.get("releases"), f"{e}.releases", lambda r, re_, **common: PureRelease(
            backends=(), partners=_partners(v, r.get("with", {}), f"{re_}.with", with_kernels), **common)))
        archs, head_dims, pays = _archs(v, k, e), _head_dims(v, k, e), _pays(v, k, e)
    elif kind == "compiled" and "releases" in k:
        releases = _kernel_releases(v, k.get("releases"), f"{e}.releases")
    elif kind == "pair":
        pairs, broken = _pairs(v, k, e, distributions)
    if "switch" in k and kind in ("pair", "backend"):
        sw = v.table(k["switch"], f"{e}.switch")
        off_on = v.strings(sw.get("off_on", []), f"{e}.switch.off_on")
        for i, a in enumerate(off_on):
            if a not in ACCELERATORS:
                v.fail(f"{e}.switch.off_on[{i}]", f"{a!r}: expected cuda, rocm or xpu")
        switch = Switch(variable=v.string(sw.get("variable"), f"{e}.switch.variable"),
                        off=v.string(sw.get("off"), f"{e}.switch.off"), off_on=off_on, source=v.source(sw, f"{e}.switch"))
    indexes = _wheel_indexes(v, k["wheel_indexes"], f"{e}.wheel_indexes") if "wheel_indexes" in k else ()
    for key, kinds in (("releases", ("pure", "compiled", "backend")), ("pairs", ("pair",)), ("broken", ("pair",)),
                       ("release", ("compiled",)), ("source_build", ("compiled",)), ("switch", ("pair", "backend")),
                       ("arch_rules", ("compiled",)), ("archs", ("backend",)), ("head_dims", ("backend",)),
                       ("pays", ("backend",)), ("numeric_checks", ("pure", "compiled", "pair")),
                       ("wheel_indexes", ("compiled",))):
        if key in k and kind not in kinds:
            v.fail(f"{e}.{key}", f"only a {' or '.join(kinds)} kernel has {key} (this one is {kind})")
    if kind == "compiled" and "source_build" not in k:
        v.fail(f"{e}.source_build", "a compiled kernel needs its source build (requirement, cuda_archs, measured)")
    if kind == "backend":
        if not k.get("serves"):
            v.fail(f"{e}.serves", "a backend kernel serves another kernel (the one that dispatches to it)")
        if switch is None:
            v.fail(f"{e}.switch", "a backend kernel needs the served kernel's switch: its import is never blocked "
                   "(the served kernel would dispatch to the blocked module), so a backend that cannot work is turned off")
    jit_caches = {}
    for var, sub in v.table(k.get("jit_caches", {}), f"{e}.jit_caches").items():
        if not (var.isidentifier() and var.upper() == var):
            v.fail(f"{e}.jit_caches.{var}", "expected an environment variable name such as TRITON_CACHE_DIR")
        if not isinstance(sub, str) or not sub or "/" in sub or sub.startswith("."):
            v.fail(f"{e}.jit_caches.{var}", "expected the name of a subdirectory of fastpath-hooks' JIT cache")
        jit_caches[var] = sub
    warm = _warm(v, k["warm"], f"{e}.warm") if "warm" in k else None

    return KernelSpec(
        name=name, module=modules[0], distributions=distributions,
        python=v.specifier(k.get("python"), f"{e}.python"),
        torch=v.specifier(k.get("torch"), f"{e}.torch"),
        accelerators=accelerators,
        platforms=platforms,
        runtime_deps=v.requirements(k.get("runtime_deps", []), f"{e}.runtime_deps"),
        verify_modules=v.strings(verify.get("modules", []), f"{e}.verify.modules"),
        verify_attributes=attrs,
        source=v.source(k, e),
        glibc=dict(glibc),
        needs_nvcc=v.boolean(k.get("needs_nvcc", False), f"{e}.needs_nvcc"),
        nvcc_packages=dict(nvcc_pk) if nvcc_pk else None,
        with_kernels=with_kernels,
        imports_installed=tuple(canonical_name(n) for n in v.strings(k.get("imports_installed", []),
                                                                    f"{e}.imports_installed")),
        imports_optional=_kernel_names(v, k.get("imports_optional", []), f"{e}.imports_optional", name, names),
        kind=kind, modules=modules,
        aliases=tuple(a.lower() for a in v.strings(k.get("aliases", []), f"{e}.aliases")),
        gates=v.strings(k.get("gates", []), f"{e}.gates"),
        mirror=mirror,
        serves=_kernel_names(v, k.get("serves", []), f"{e}.serves", name, names),
        rule_prefix=prefix, switch=switch, jit_caches=jit_caches, warm=warm, wheel_indexes=indexes,
        releases=releases, pairs=pairs, broken=broken, archs=archs, head_dims=head_dims, pays=pays,
        numeric_checks=pins_rules.numeric_checks(v, k.get("numeric_checks", []), f"{e}.numeric_checks"),
        arch_rules=pins_rules.arch_rules(v, k.get("arch_rules", []), f"{e}.arch_rules"),
    )


INDEX_FIELDS = ("{channel}", "{project}", "{cuda}", "{cuda_nodot}", "{torch_mm}")


def _wheel_indexes(v: Validator, raw, e: str) -> tuple:
    out, seen = [], set()
    for ie, r in v.tables(raw, e):
        name = v.string(r.get("name"), f"{ie}.name")
        if name in seen or not name.replace("-", "").isalnum() or name.lower() != name:
            v.fail(f"{ie}.name", f"{name!r}: a lowercase name, once per kernel (FASTPATH_HOOKS_WHEEL_INDEX names it)")
        seen.add(name)
        url = v.string(r.get("url"), f"{ie}.url")
        if not url.startswith(("https://", "http://", "file://")) or "{project}" not in url or not url.endswith("/"):
            v.fail(f"{ie}.url", f"{url!r}: an http(s):// or file:// template of the project page, with {{project}}, "
                   "ending in /")
        for key in ("url", "channel", "local"):
            text = v.string(r.get(key), f"{ie}.{key}")
            for placeholder in re.findall(r"{[^}]*}", text):
                if placeholder not in INDEX_FIELDS:
                    v.fail(f"{ie}.{key}", f"unknown placeholder {placeholder}; known: {', '.join(INDEX_FIELDS)}")
        abi = v.string(r.get("cxx11_abi"), f"{ie}.cxx11_abi")
        if abi not in ("TRUE", "FALSE"):
            v.fail(f"{ie}.cxx11_abi", f"{abi!r}: expected TRUE or FALSE (the cxx11 ABI of its builds)")
        out.append(WheelIndex(name=name, url=url, project=v.string(r.get("project"), f"{ie}.project"),
                              channel=r["channel"], local=r["local"], cxx11_abi=abi,
                              torch=v.specifier(r.get("torch", ""), f"{ie}.torch"),
                              enabled=v.boolean(r.get("enabled", False), f"{ie}.enabled"), source=v.source(r, ie)))
    return tuple(out)


def _pairs(v: Validator, k: dict, e: str, distributions: tuple) -> tuple:
    """A pair kernel's known-good pairs and broken pairs, keyed by its two distributions."""
    first, second = distributions
    pairs = []
    for pe, p in v.tables(k.get("pairs"), f"{e}.pairs"):
        companions = v.versions(p.get(second), f"{pe}.{second}")
        if not companions:
            v.fail(f"{pe}.{second}", f"at least one known-good {second} version is needed")
        pairs.append(Pair(v.version(p.get(first), f"{pe}.{first}"), companions, v.source(p, pe)))
    if not pairs:
        v.fail(f"{e}.pairs", "at least one known-good pair is needed")
    broken = []
    for be, b in v.tables(k.get("broken", []), f"{e}.broken"):
        arch = v.string(b.get("arch"), f"{be}.arch")
        if arch != "*" and not (arch.startswith("sm_") or arch.startswith("gfx")):
            v.fail(f"{be}.arch", f"{arch!r}: expected '*', sm_XY or gfxNNN")
        broken.append(BrokenPair(v.version(b.get(first), f"{be}.{first}"), v.versions(b.get(second), f"{be}.{second}"),
                                 arch, v.string(b.get("effect"), f"{be}.effect"), v.source(b, be)))
    for i, pair in enumerate(pairs):
        for companion in pair.companions:
            for j, b in enumerate(broken):
                if b.arch == "*" and same_version(b.version, pair.version) and any(same_version(x, companion) for x in b.companions):
                    v.fail(f"{e}.pairs[{i}]", f"{first} {pair.version} + {second} {companion} is also listed "
                           f"as broken in {e}.broken[{j}] ({b.effect})")
    return tuple(pairs), tuple(broken)


def _kernel_names(v: Validator, raw, entry: str, own: str, kernels: tuple) -> tuple:
    names = v.strings(raw, entry)
    for i, name in enumerate(names):
        if name not in kernels or name == own:
            v.fail(f"{entry}[{i}]", f"{name!r}: expected another kernel, one of {', '.join(k for k in kernels if k != own)}")
    return names


def _releases(v: Validator, raw, e: str, make) -> list:
    """A list of releases (fla's, a compiled kernel's): tables, each version listed once, with
    torch/triton/transformers ranges and a source; `make(entry, path, **those)` adds the rest."""
    out, seen = [], set()
    for re_, r in v.tables(raw, e):
        ver = v.once(v.version(r.get("version"), f"{re_}.version"), seen, f"{re_}.version")
        out.append(make(r, re_, version=ver,
                        torch=v.specifier(r.get("torch", ""), f"{re_}.torch"),
                        triton=v.specifier(r.get("triton", ""), f"{re_}.triton"),
                        transformers=v.specifier(r.get("transformers", ""), f"{re_}.transformers"),
                        source=v.source(r, re_)))
    if not out:
        v.fail(e, "at least one release is needed")
    return out


def _kernel_releases(v: Validator, raw, e: str) -> tuple:
    out = tuple(_releases(v, raw, e, lambda r, re_, **common: KernelRelease(
        declares=v.requirements(r.get("declares", []), f"{re_}.declares"),
        cuda_archs=pins_rules.gencode_table(v, r["cuda_archs"], f"{re_}.cuda_archs") if "cuda_archs" in r else None,
        release=pins_rules.release_wheels(v, r["release"], f"{re_}.release") if "release" in r else None,
        **common)))
    for i, r in enumerate(out):   # a release's own release wheels are of that release
        if r.release is not None and not same_version(r.release.version, r.version):
            v.fail(f"{e}[{i}].release.version", f"{r.release.version} is not the release's version {r.version}")
    return out


def _partners(v: Validator, raw, e: str, with_kernels: tuple) -> dict:
    """A backend release's versions of the kernels it is used with (flash-qla 0.1.3: tilelang >= 0.1.12)."""
    out = {}
    for kernel, spec in v.table(raw, e).items():
        if kernel not in with_kernels:
            v.fail(f"{e}.{kernel}", f"{kernel!r}: expected a kernel of its `with` ({', '.join(with_kernels) or 'none'})")
        out[kernel] = v.specifier(spec, f"{e}.{kernel}")
    return out


def _archs(v: Validator, k: dict, e: str) -> Archs:
    raw = v.table(k.get("archs"), f"{e}.archs")
    lists = {}
    for key in ("train", "forward"):
        lists[key] = v.strings(raw.get(key, []), f"{e}.archs.{key}")
        for i, arch in enumerate(lists[key]):
            if not (arch.startswith("sm_") and arch[3:].isdigit()):
                v.fail(f"{e}.archs.{key}[{i}]", f"{arch!r}: expected sm_XY")
    if not lists["train"] and not lists["forward"]:
        v.fail(f"{e}.archs", "at least one GPU arch is needed")
    return Archs(train=lists["train"], forward=lists["forward"], source=v.source(raw, f"{e}.archs"))


def _dims(v: Validator, raw, entry: str) -> tuple:
    values = v.list(raw, entry)
    if not values or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in values):
        v.fail(entry, "expected a list of positive integers")
    return tuple(values)


def _head_dims(v: Validator, k: dict, e: str) -> HeadDims:
    raw = v.table(k.get("head_dims"), f"{e}.head_dims")
    config = v.table(raw.get("config", {}), f"{e}.head_dims.config")
    attrs = {}
    for key, names in config.items():
        if key not in ("k", "v", "heads_k", "heads_v"):
            v.fail(f"{e}.head_dims.config.{key}", "expected k, v, heads_k or heads_v")
        attrs[key] = v.strings(names, f"{e}.head_dims.config.{key}")
    return HeadDims(k=_dims(v, raw.get("k"), f"{e}.head_dims.k"), v=_dims(v, raw.get("v"), f"{e}.head_dims.v"),
                    config=attrs, source=v.source(raw, f"{e}.head_dims"))


def _pays(v: Validator, k: dict, e: str) -> Pays:
    raw = v.table(k.get("pays"), f"{e}.pays")
    return Pays(hazard=v.boolean(raw.get("hazard"), f"{e}.pays.hazard"),
                elsewhere=v.boolean(raw.get("elsewhere"), f"{e}.pays.elsewhere"), source=v.source(raw, f"{e}.pays"))


_TENSORS = ("o", "dq", "dk", "dv", "dbeta", "dg")


def _warm(v: Validator, raw, e: str) -> Warm:
    w = v.table(raw, e)
    check_seq = w.get("check_seq")
    if not isinstance(check_seq, int) or isinstance(check_seq, bool) or check_seq <= 0:
        v.fail(f"{e}.check_seq", "expected a positive integer (the check's sequence length)")
    seqs = tuple(w.get("seqs", []))
    if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in seqs):
        v.fail(f"{e}.seqs", "expected a list of positive integers (the sequence lengths warmed)")
    heads, dims = _dims(v, w.get("heads"), f"{e}.heads"), _dims(v, w.get("dims"), f"{e}.dims")
    if len(heads) != 2 or len(dims) != 2:
        v.fail(f"{e}.heads" if len(heads) != 2 else f"{e}.dims", "expected two numbers: key, value")
    tol = v.table(w.get("tolerances", {}), f"{e}.tolerances")   # none: run and warmed, not compared
    for name in (_TENSORS if tol else ()):
        value = tol.get(name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            v.fail(f"{e}.tolerances.{name}", "expected a positive number (a relative RMS error)")
    slack = w.get("slack", 1.0)
    if not isinstance(slack, (int, float)) or isinstance(slack, bool) or slack < 1:
        v.fail(f"{e}.slack", "expected a number >= 1")
    return Warm(check_seq=check_seq, seqs=seqs, heads=heads, dims=dims,
                tolerances={n: float(tol[n]) for n in _TENSORS if tol}, slack=float(slack), source=v.source(w, e),
                gva_transformers=v.specifier(w.get("gva_transformers", ""), f"{e}.gva_transformers"),
                final_state=_final_states(v, w.get("final_state", [False]), f"{e}.final_state"))


def _final_states(v: Validator, raw, e: str) -> tuple:
    values = tuple(v.boolean(x, f"{e}[{i}]") for i, x in enumerate(v.list(raw, e)))
    if not values:
        v.fail(e, "expected a list of true / false (output_final_state of the calls warmed)")
    return values
