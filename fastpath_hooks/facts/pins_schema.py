"""Validation of the pins data (shipped pins.json merged with a user file) into a `Pins`
(facts/pins_values.py): the top-level tables, the checks across entries (hazards, yanked versions, the
allow-list, the registry's names) and the order the kernels are decided in. One kernel's entry is
facts/pins_kernels.py's; the typed checks, whose errors name the file and the entry (`PinsError`),
facts/pins_validator.py's."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

from packaging.requirements import Requirement

from . import pins_rules
from .distributions import canonical_name
from .frozen import freeze
from .pins_kernels import kernel_spec
from .pins_validator import Validator
from .pins_values import Hazard, HubBroken, HubRules, PackedPackage, PackedSequences, Pins, same_version
from .._registry import REGISTRY


def build(data, origins: tuple) -> Pins:
    v = Validator(origins[-1])
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
    names = tuple(kernels_raw)
    if not names:
        v.fail("kernels", "at least one kernel is needed")
    kernels = {name: kernel_spec(v, name, kernels_raw[name], names) for name in names}
    _check_registry(v, kernels)
    order = decision_order(kernels)
    if order is None:
        v.fail("kernels", "their `with`, `serves` and `imports_optional` make a circle: each kernel is decided after "
               "the ones it names")

    release_wheels, source_builds = {}, {}
    for name, spec in tuple(kernels.items()):
        if spec.kind != "compiled":
            continue
        raw = kernels_raw[name]
        if "release" in raw:
            release_wheels[name] = pins_rules.release_wheels(v, raw.get("release"), f"kernels.{name}.release")
        source_builds[name] = build = pins_rules.source_build(v, raw.get("source_build"), f"kernels.{name}.source_build",
                                                              spec.arch_rules)
        kernels[name] = spec = replace(spec, cuda_switch=build.cuda_switch)
        if build.version is not None and spec.releases and not any(same_version(r.version, build.version)
                                                                   for r in spec.releases):
            v.fail(f"kernels.{name}.releases", f"the source build's {build.requirement} is not one of the releases")

    hazards = []
    for e, h in v.tables(data.get("hazards", []), "hazards"):
        kernel = v.string(h.get("kernel"), f"{e}.kernel")
        if kernel not in kernels:
            v.fail(f"{e}.kernel", f"{kernel!r}: expected one of {', '.join(kernels)}")
        needs = v.string(h.get("needs"), f"{e}.needs")
        if needs not in kernels or kernel not in kernels[needs].serves:
            serving = [k for k, s in kernels.items() if kernel in s.serves]
            v.fail(f"{e}.needs", f"{needs!r}: expected a kernel that serves {kernel} "
                   f"({', '.join(serving) or 'none does: add `serves` to its entry'})")
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

    for name, spec in kernels.items():
        first, *rest = spec.distributions
        for i, pair in enumerate(spec.pairs):
            check_not_yanked(first, pair.version, f"kernels.{name}.pairs[{i}].{first}")
            for j, companion in enumerate(pair.companions):
                check_not_yanked(rest[0], companion, f"kernels.{name}.pairs[{i}].{rest[0]}[{j}]")
        if spec.kind in ("pure", "backend"):
            for i, rel in enumerate(spec.releases):
                for dist in spec.distributions:
                    check_not_yanked(dist, rel.version, f"kernels.{name}.releases[{i}].version")

    # consistency: every distribution a kernel may install is on the allow-list (a kernel's own
    # distributions are: naming them in its entry allows them)
    allowed = allowed | {d for spec in kernels.values() for d in spec.distributions}
    for name, spec in kernels.items():
        for dist in spec.distributions:
            if dist in protected:
                v.fail(f"kernels.{name}.distributions", f"{dist} is protected and can never be installed")
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

    packed = _packed_sequences(v, data.get("packed_sequences"), names)
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    # frozen all the way down: `load()` is cached and shared by every caller in the process
    return freeze(Pins(
        protected=protected, triton_distributions=triton_dists, allowed=allowed, kernels=kernels,
        hazards=tuple(hazards), yanked=yanked,
        origins=origins, digest=digest, packed_sequences=packed,
        release_wheels=release_wheels, source_builds=source_builds, decision_order=order,
        cxx_standards=pins_rules.cxx_standards(v, data.get("cxx_standard")),
        hub=_hub(v, data.get("hub"), names),
    ))


def decision_order(kernels: dict) -> tuple | None:
    """The kernels in the order they are decided: each after the ones its rules read - the kernels that
    serve it (fla after tilelang), that it is used with (mamba-ssm after causal-conv1d) and that its
    import tries (mamba-ssm after tilelang); a backend after the kernels it serves (flash-qla after
    fla, whose release and use it reads); else in the pins' order. None: they make a circle."""
    after = {name: set(spec.with_kernels) | set(spec.imports_optional)
             | {k for k, s in kernels.items() if name in s.serves and s.kind != "backend"}
             | (set(spec.serves) if spec.kind == "backend" else set())
             for name, spec in kernels.items()}
    order: list = []
    while len(order) < len(kernels):
        ready = next((k for k in kernels if k not in order and after[k] <= set(order)), None)
        if ready is None:
            return None
        order.append(ready)
    return tuple(order)


def _check_registry(v: Validator, kernels: dict) -> None:
    """Names, modules, aliases and rule prefixes are each one kernel's; a kernel does not serve itself
    through its partners; the shipped kernels keep the modules the start-up entry watches."""
    owner: dict = {}
    for name, spec in kernels.items():
        for what, values in (("name", (name,) + spec.aliases), ("module", spec.modules), ("rule prefix", (spec.rule_prefix,)),
                             ("gate", spec.gates)):
            for value in values:
                key = (what if what != "name" else "name", value)
                other = owner.setdefault(key, name)
                if other != name:
                    v.fail(f"kernels.{name}", f"{what} {value!r} is also {other}'s")
        if name in REGISTRY and spec.modules != REGISTRY[name]["modules"]:
            v.fail(f"kernels.{name}.modules", "a shipped kernel's modules are fixed (the start-up entry watches them)")
        for served in spec.serves:
            if served in spec.with_kernels:
                v.fail(f"kernels.{name}.serves", f"{served} is also in `with`: a kernel serves another or needs it, not both")


def _packed_sequences(v: Validator, raw, kernels: tuple) -> PackedSequences | None:
    if raw is None:
        return None
    e = "packed_sequences"
    v.table(raw, e)
    packages = []
    for pe, p in v.tables(raw.get("packages"), f"{e}.packages"):
        kernel = p.get("kernel")
        if kernel is not None and kernel not in kernels:
            v.fail(f"{pe}.kernel", f"{kernel!r}: expected one of {', '.join(kernels)} (or a `distribution` instead)")
        if kernel is None and not isinstance(p.get("distribution"), str):
            v.fail(pe, "expected a `kernel` (one of fastpath-hooks' kernels) or a `distribution`")
        packages.append(PackedPackage(
            module=v.string(p.get("module"), f"{pe}.module"), kernel=kernel,
            distribution=canonical_name(p.get("distribution") or kernel),
            models=v.strings(p.get("models", []), f"{pe}.models")))
    return PackedSequences(transformers=v.specifier(raw.get("transformers"), f"{e}.transformers"),
                           packages=tuple(packages), source=v.source(raw, e))


def _hub(v: Validator, raw, kernels: tuple) -> HubRules:
    if raw is None:
        return HubRules()
    e = "hub"
    v.table(raw, e)
    backends = {}
    for repo, names in v.table(raw.get("backends", {}), f"{e}.backends").items():
        backends[repo] = v.strings(names, f"{e}.backends.{repo}")
        for i, name in enumerate(backends[repo]):
            if name not in kernels:
                v.fail(f"{e}.backends.{repo}[{i}]", f"{name!r}: expected one of {', '.join(kernels)}")
    broken = []
    for be, b in v.tables(raw.get("broken", []), f"{e}.broken"):
        version = b.get("version")
        if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
            v.fail(f"{be}.version", "expected the repo's kernel version, a whole number such as 5")
        broken.append(HubBroken(
            id=v.string(b.get("id"), f"{be}.id"), repo=v.string(b.get("repo"), f"{be}.repo"), version=version,
            torch=v.specifier(b["torch"], f"{be}.torch") if "torch" in b else None,
            cuda=v.specifier(b["cuda"], f"{be}.cuda") if "cuda" in b else None,
            gpu=v.strings(b.get("gpu", []), f"{be}.gpu"), effect=v.string(b.get("effect"), f"{be}.effect"),
            source=v.source(b, be)))
    seconds = raw.get("probe_seconds", 3.0)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 60:
        v.fail(f"{e}.probe_seconds", "expected seconds, more than 0 and at most 60")
    return HubRules(backends=backends, broken=tuple(broken), probe_seconds=float(seconds), source=v.source(raw, e))
