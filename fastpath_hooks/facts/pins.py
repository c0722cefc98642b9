"""The pins: the shipped pins.json merged with a user file (FASTPATH_HOOKS_PINS, JSON or TOML, only what it
changes or a new kernel's entry), read into a `Pins` (pins_values.py) by one typed loader. A user's record with
an identity (`record_keys`) replaces the shipped one and comes first; the rest is deep-merged.

Each record is read from its dataclass, field by field. The field's type says what the data holds (str: non-empty,
SpecifierSet, bool, int, float, tuple[X, ...], dict[str, X], a dataclass, X | None: None where absent); its
metadata (`pins_values.m`) the rest: `key` (else the field's name; "a.b": b of table a; "{distributions[0]}"),
`absent` (the value where left out; none: needed), `form` ("version", "requirement", "spec": a range kept as
text, "kernel": another kernel, or one of the _READERS), `ok`/`says` (a test of each value, and what it accepts),
`choices`, `key_ok`/`key_says` (of a table's keys), `nonempty`, `unique` (in a list), `conv`, `kinds` (only
kernels of these kinds have it), `req` (an X | None they need: True, or the kinds that do), `ctx` (kept for later
keys), `hand` (made here).
Every error is one PinsError naming the file and the entry."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import fields, is_dataclass, replace
from functools import cache, lru_cache
from types import NoneType, UnionType
from typing import get_args, get_origin, get_type_hints

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .._registry import REGISTRY, PinsFileError, read_pins_file
from .distributions import canonical_name
from .frozen import FrozenSpecifierSet, freeze
from .pins_values import (KINDS, SHIPPED, SOURCE_KINDS, TENSORS, WHEEL_FIELDS, ArchRule, Archs, BrokenPair,
                          CxxStandard, Hazard, HubRules, KernelRelease, KernelSpec, PackedPackage, PackedSequences,
                          Pair, Pays, Pins, PinsError, PureRelease, ReleaseWheels, SourceBuild, Warm, same_version)

__all__ = ["SHIPPED", "SOURCE_KINDS", "BrokenPair", "Hazard", "Pair", "Pays", "Pins", "PinsError", "decision_order",
           "load", "record_keys", "same_version"]


def record_keys(kernels: dict) -> dict:
    """The identity of each kind's records (what a user's record replaces)."""
    out = {("hazards",): ("id",), ("hub", "broken"): ("id",)}
    for name, entry in kernels.items():
        if not isinstance(entry, dict):
            continue
        kind = entry.get("kind")
        if kind in ("pure", "compiled", "backend"):
            out[("kernels", name, "releases")] = ("version",)
        if kind == "pair":
            first = (entry.get("distributions") or [None])[0]
            out[("kernels", name, "pairs")] = (first,)
            out[("kernels", name, "broken")] = (first, "arch", "effect")
    return out


def load(user_file: str | None = None) -> Pins:
    """The shipped pins, merged with `user_file` when given (cached by mtime)."""
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
        data = _merge(data, user, (), record_keys(data.get("kernels") or {}))
        origins.append(user_file)
    return build(data, tuple(origins))


def _read(path: str):
    try:
        return read_pins_file(path)
    except OSError as exc:
        raise PinsError(path, "", f"cannot read: {exc.strerror}") from None
    except PinsFileError as exc:
        raise PinsError(path, "", str(exc)) from None


def _check_user_shape(user: dict, origin: str) -> None:
    allowed = {"schema", "about", "protected", "triton_distributions", "allowed_distributions", "kernels", "hazards",
               "yanked", "packed_sequences", "cxx_standard", "hub"}
    for key in user:
        if key not in allowed:
            raise PinsError(origin, key, f"unknown section; expected one of {', '.join(sorted(allowed))}")
    for name, entry in (user.get("kernels") or {}).items():
        if name in REGISTRY:
            continue
        if not isinstance(entry, dict) or "kind" not in entry or "modules" not in entry:
            raise PinsError(origin, f"kernels.{name}", f"unknown kernel; a new kernel's entry needs at least `kind` "
                            f"({', '.join(KINDS)}) and `modules` (docs/registry.md); shipped: {', '.join(REGISTRY)}")


def _merge(base, over, path: tuple, records: dict):
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = _merge(base[key], value, path + (key,), records) if key in base else value
        return out
    if path in records and isinstance(base, list) and isinstance(over, list):
        keys = records[path]

        def ident(rec):
            return tuple(str(rec.get(k)) for k in keys) if isinstance(rec, dict) else None

        mine = {ident(r) for r in over}
        return list(over) + [r for r in base if ident(r) not in mine]
    return over


_RELEASES = {"pure": PureRelease, "backend": PureRelease, "compiled": KernelRelease}


def _required(md, ctx: dict) -> bool:
    """`req`: True (every record needs it) or the kernel kinds that need it."""
    req = md.get("req")
    return req is True or (isinstance(req, tuple) and ctx.get("kind") in req)


@cache
def _fields(cls) -> tuple:
    hints = get_type_hints(cls)
    return tuple((f, hints[f.name]) for f in fields(cls))


def _number(value, tp) -> bool:
    return isinstance(value, int if tp is int else (int, float)) and not isinstance(value, bool)


class _Loader:
    def __init__(self, origin: str):
        self.origin = origin     # the pins file read last

    def fail(self, entry: str, message: str):
        raise PinsError(self.origin, entry, message)

    def table(self, value, entry) -> dict:
        if not isinstance(value, dict):
            self.fail(entry, "expected a table/object")
        return value

    def list(self, value, entry):
        if not isinstance(value, (list, tuple)):
            self.fail(entry, "expected a list")
        return value

    def strings(self, value, entry, conv=str) -> tuple:
        return tuple(conv(self.leaf(str, v, f"{entry}[{i}]", {}, {})) for i, v in enumerate(self.list(value, entry)))

    def specifier(self, value, entry) -> SpecifierSet:
        if not isinstance(value, str):
            self.fail(entry, "expected a version specifier string such as '>=3.4,<3.9'")
        try:
            return FrozenSpecifierSet(value)
        except InvalidSpecifier:
            self.fail(entry, f"{value!r} is not a version specifier (e.g. '>=3.4,<3.9')")

    def source(self, record: dict, entry) -> str:
        value = record.get("source")
        if not isinstance(value, str) or value.split(":", 1)[0].strip() not in SOURCE_KINDS or ":" not in value:
            self.fail(f"{entry}.source",
                      "every fact needs a source 'measured: ...', 'reported: ...' or 'upstream: ...'")
        return value

    def only(self, table: dict, entry: str, allowed, kinds: dict | None = None) -> None:
        """Every key of `table` is one of `allowed` (a typo is never silently ignored); `kinds`: keys only some
        kinds of kernel have (key -> those kinds)."""
        unknown = [key for key in table if key not in allowed]
        if not unknown:
            return
        key, kinds = unknown[0], kinds or {}
        if key in kinds:
            self.fail(f"{entry}.{key}", f"only a {' or '.join(kinds[key])} kernel has {key}")
        close = closest(str(key), [str(k) for k in allowed])
        more = f"; also {', '.join(map(str, unknown[1:]))}" if len(unknown) > 1 else ""
        self.fail(f"{entry}.{key}", f"unknown key{f' (did you mean {close}?)' if close else ''}{more}")

    def known_keys(self, cls, t: dict, e: str, ctx: dict) -> None:
        """The keys of a `cls` record are its fields' (`key`, "a.b": b of table a) and the ones its readers read."""
        top: dict = {}
        kinds: dict = {}
        for f, _ in _fields(cls):
            md = f.metadata
            if md.get("hand"):
                continue
            try:
                key = md.get("key", f.name).format(**ctx)
            except (KeyError, IndexError):   # a key named after a value not read (a bad entry: said there)
                continue
            if "kinds" in md and ctx.get("kind") not in md["kinds"]:
                kinds[key] = md["kinds"]
                continue
            first, _, rest = key.partition(".")
            top.setdefault(first, set()).update([rest] if rest else [])
        for key in _RAW_KEYS.get(cls, ()):
            first, _, rest = key.partition(".")
            top.setdefault(first, set()).update([rest] if rest else [])
        self.only(t, e, top, kinds)
        for key, inner in top.items():
            if inner and isinstance(t.get(key), dict):
                self.only(t[key], f"{e}.{key}", inner)

    def record(self, cls, raw, e: str, ctx: dict, values: dict | None = None):
        t, values = self.table(raw, e), dict(values or {})
        self.known_keys(cls, t, e, ctx)
        for f, tp in _fields(cls):
            md = f.metadata
            if md.get("hand") or f.name in values or ("kinds" in md and ctx.get("kind") not in md["kinds"]):
                continue
            if f.name == "source":
                values["source"] = self.source(t, e)
                continue
            key = md.get("key", f.name).format(**ctx)
            *parts, last = key.split(".")
            where, entry = t, e
            for part in parts:
                entry = f"{entry}.{part}"
                where = self.table(where.get(part), entry) if part in where or "absent" not in md else {}
            if last in where:
                value = where[last]
            elif "absent" in md:
                value = md["absent"]
            elif get_origin(tp) is UnionType and not _required(md, ctx):
                values[f.name] = None
                continue
            else:
                value = None
            if _required(md, ctx):
                tp = next(a for a in get_args(tp) if a is not NoneType)
            values[f.name] = self.value(tp, value, f"{e}.{key}", md, ctx, top=True)
            if md.get("ctx"):
                ctx[f.name] = values[f.name]
        after = _AFTER.get(cls)
        if after is not None:
            after(self, values, t, e, ctx)
        return cls(**values)

    def value(self, tp, raw, e: str, md, ctx: dict, top=False):
        origin, args = get_origin(tp), get_args(tp)
        if origin is UnionType:
            return None if raw is None else self.value(next(a for a in args if a is not NoneType), raw, e, md, ctx, top)
        if md.get("form") in _READERS:
            return _READERS[md["form"]](self, raw, e, ctx)
        if is_dataclass(tp):
            return self.record(tp, raw, e, ctx)
        if origin is tuple:
            out = tuple(self.value(args[0], x, f"{e}[{i}]", md, ctx) for i, x in enumerate(self.list(raw, e)))
            for f in fields(args[0]) if is_dataclass(args[0]) else ():
                seen = set()
                for i, value in enumerate(getattr(item, f.name) for item in out if f.metadata.get("unique")):
                    if value in seen:
                        self.fail(f"{e}[{i}].{f.metadata.get('key', f.name)}", f"{value} is listed twice")
                    seen.add(value)
        elif origin is dict:
            out = {}
            for key, x in self.table(raw, e).items():
                if "key_ok" in md and not md["key_ok"](key):
                    self.fail(f"{e}.{key}", md["key_says"])
                out[str(key)] = self.value(args[1], x, f"{e}.{key}", md, ctx)
        else:
            return self.leaf(tp, raw, e, md, ctx)
        if top and "nonempty" in md and not out:
            self.fail(e, md["nonempty"].format(**ctx))
        return out

    def leaf(self, tp, raw, e: str, md, ctx: dict):
        says, form = md.get("says"), md.get("form")
        if "choices" in md:
            if raw not in md["choices"]:
                self.fail(e, f"{raw!r}: {says or 'expected one of ' + ', '.join(md['choices'])}")
            return raw
        if tp is SpecifierSet:
            return self.specifier(raw, e)
        if tp is bool and not isinstance(raw, bool):
            self.fail(e, "expected true or false")
        if tp in (int, float) and not _number(raw, tp):
            self.fail(e, says or f"expected a {'whole ' if tp is int else ''}number")
        if form == "spec":    # a range kept as text
            self.specifier(raw, e)
        elif tp is str:
            if not isinstance(raw, str) or not raw.strip():
                self.fail(e, f"{raw!r}: {says}" if says and raw is not None else "expected a non-empty string")
            if form in ("version", "requirement"):
                try:
                    (Version if form == "version" else Requirement)(raw)
                except (InvalidVersion, InvalidRequirement) as exc:
                    self.fail(e, f"{raw!r} is not a {form}" + (f": {exc}" if form == "requirement" else ""))
            own = ctx.get("name")
            if form == "kernel" and (raw not in ctx["names"] or raw == own):
                self.fail(e, f"{raw!r}: expected {'another kernel, ' if own else ''}one of "
                          f"{', '.join(k for k in ctx['names'] if k != own)}")
        if "ok" in md and not md["ok"](raw):
            self.fail(e, f"{raw!r}: {says}")
        value = float(raw) if tp is float else raw
        return md["conv"](value) if "conv" in md else value

    def kernel(self, name: str, raw, names: tuple) -> KernelSpec:
        e = f"kernels.{name}"
        k = self.table(raw, e)
        kind = k.get("kind")
        if kind not in KINDS:
            self.fail(f"{e}.kind", f"{kind!r}: expected one of {', '.join(KINDS)}")
        for key, kinds in _KIND_KEYS:
            if key in k and kind not in kinds:
                self.fail(f"{e}.{key}", f"only a {' or '.join(kinds)} kernel has {key} (this one is {kind})")
        if kind == "compiled" and "source_build" not in k:
            self.fail(f"{e}.source_build",
                      "a compiled kernel needs its source build (requirement, cuda_archs, measured)")
        if kind == "pair" and len(self.list(k.get("distributions"), f"{e}.distributions")) != 2:
            self.fail(f"{e}.distributions", "a pair kernel has exactly two distributions: its own and its companion")
        prefix = self.leaf(str, k.get("rule_prefix", name), f"{e}.rule_prefix", {}, {})
        if "." in prefix or prefix == "skip":
            self.fail(f"{e}.rule_prefix",
                      f"{prefix!r}: a rule prefix has no dot and is not `skip` (the shared rules' prefix)")
        mirror = k.get("mirror")
        if mirror is not None and (kind != "compiled" or not isinstance(mirror, str) or not (
                mirror.startswith("FASTPATH_HOOKS_") and mirror.endswith("_WHEEL_URL"))):
            self.fail(f"{e}.mirror", f"{mirror!r}: a compiled kernel's FASTPATH_HOOKS_<NAME>_WHEEL_URL")
        if kind == "backend" and not k.get("serves"):
            self.fail(f"{e}.serves", "a backend kernel serves another kernel (the one that dispatches to it)")
        if kind == "backend" and "switch" not in k:
            self.fail(f"{e}.switch", "a backend kernel needs the served kernel's switch: its import is never "
                      "blocked (the served kernel would dispatch to the blocked module), so a backend that cannot work "
                      "is turned off")
        ctx = {"name": name, "names": names, "kind": kind}
        spec = self.record(KernelSpec, k, e, ctx, {"name": name, "module": "", "kind": kind, "rule_prefix": prefix})
        releases = ()   # read last: a backend release's partners are kernels of its `with`
        if kind in _RELEASES and (kind != "compiled" or "releases" in k):
            releases = self.value(tuple[_RELEASES[kind], ...], k.get("releases"), f"{e}.releases",
                                  {"nonempty": "at least one release is needed"}, ctx, top=True)
        first, second = (spec.distributions + (None,))[:2]
        for i, pair in enumerate(spec.pairs):
            for companion in pair.companions:
                for j, b in enumerate(spec.broken):
                    if b.arch == "*" and same_version(b.version, pair.version) and any(same_version(x, companion)
                                                                                       for x in b.companions):
                        self.fail(f"{e}.pairs[{i}]", f"{first} {pair.version} + {second} {companion} is also listed "
                                  f"as broken in {e}.broken[{j}] ({b.effect})")
        return replace(spec, module=spec.modules[0], releases=releases)


# the keys of a record that are no field of its class (read by the loader or an _AFTER check)
_RAW_KEYS = {KernelSpec: ("kind", "rule_prefix", "releases", "release", "source_build"),
             SourceBuild: ("measured.source", "build_deps.source", "parallel.source"),
             PackedPackage: ("distribution",)}


def closest(name: str, options, cutoff: float = 0.75) -> str | None:
    """The option `name` was most likely meant to be (a typo), else None."""
    import difflib   # only where something is misspelt

    match = difflib.get_close_matches(name, list(options), n=1, cutoff=cutoff)
    return match[0] if match else None


_KIND_KEYS = (tuple((f.name, f.metadata["kinds"]) for f in fields(KernelSpec) if "kinds" in f.metadata)
              + (("release", ("compiled",)), ("source_build", ("compiled",))))


# -- the values a field's type does not say all of (`form`), and the checks across a record's fields (_AFTER)

def _partners(ld, raw, e, ctx) -> dict:
    """A backend release's versions of the kernels it is used with (flash-qla 0.1.3: tilelang >= 0.1.12)."""
    out = {}
    for kernel, spec in ld.table(raw, e).items():
        if kernel not in ctx["with_kernels"]:
            ld.fail(f"{e}.{kernel}",
                    f"{kernel!r}: expected a kernel of its `with` ({', '.join(ctx['with_kernels']) or 'none'})")
        out[kernel] = ld.specifier(spec, f"{e}.{kernel}")
    return out


def _positive(ld, value, entry, says) -> float:
    if not _number(value, float) or value <= 0:
        ld.fail(entry, says)
    return float(value)


def _tensor_tolerances(ld, raw, e, ctx) -> dict:
    tol = ld.table(raw, e)     # none: run and warmed, not compared
    ld.only(tol, e, TENSORS)
    return {n: _positive(ld, tol.get(n), f"{e}.{n}", "expected a positive number (a relative RMS error)")
            for n in (TENSORS if tol else ())}


def _tolerance(ld, raw, e, ctx) -> dict:
    out = {}
    for key, value in ld.table(raw, e).items():
        if key not in ("atol", "rtol", "ratio"):
            ld.fail(f"{e}.{key}", "expected atol, rtol or ratio")
        if not _number(value, float) or value < 0:
            ld.fail(f"{e}.{key}", "expected a number >= 0")
        out[key] = float(value)
    if ("atol" in out) != ("rtol" in out) or not out:
        ld.fail(e, "expected atol with rtol (elementwise), ratio (rms error over rms of torch's result), or both")
    return out


def _gencode(ld, raw, e, ctx) -> dict:
    table = ld.table(raw, e)
    ld.only(table, e, ("pairs", "source"))
    ld.source(table, e)
    gencode = {}
    for code, spec in ld.table(table.get("pairs"), f"{e}.pairs").items():
        if not (code.startswith("sm_") and code[3:].isdigit()):
            ld.fail(f"{e}.pairs.{code}", f"{code!r}: expected sm_XY (a -gencode code)")
        gencode[code] = ld.specifier(spec, f"{e}.pairs.{code}")
    return gencode


def _builds(ld, raw, e, ctx) -> tuple:
    out = []
    for i, b in enumerate(ld.list(raw, e)):
        be = f"{e}[{i}]"
        ld.only(ld.table(b, be), be, ("cuda_major", "torch_mm", "python", "arch", "abi"))
        out.append({"cuda_major": ld.leaf(str, str(b.get("cuda_major", "")), f"{be}.cuda_major", {}, ctx),
                    **{key: ld.strings(b.get(key), f"{be}.{key}") for key in ("torch_mm", "python", "arch", "abi")}})
    return tuple(out)


def _nvcc_packages(ld, raw, e, ctx) -> dict:
    ld.only(ld.table(raw, e), e, ("cuda", "requirements", "source"))
    ld.specifier(raw.get("cuda"), f"{e}.cuda")
    ld.value(tuple[str, ...], raw.get("requirements"), f"{e}.requirements", {"form": "requirement"}, ctx)
    ld.source(raw, e)
    return dict(raw)


def _unit_seconds(ld, raw, e, ctx) -> tuple:
    says = "expected a positive number (a file's measured compile)"
    return tuple(sorted((str(k), _positive(ld, value, f"{e}.{k}", says)) for k, value in ld.table(raw, e).items()))


_READERS = {"partners": _partners, "tensor_tolerances": _tensor_tolerances, "tolerance": _tolerance,
            "tolerance?": lambda ld, raw, e, ctx: _tolerance(ld, raw, e, ctx) if raw else None,   # falsy: none
            "gencode": _gencode, "builds": _builds, "nvcc": _nvcc_packages, "unit_seconds": _unit_seconds}


def _archs(ld, values, raw, e, ctx):
    if not values["train"] and not values["forward"]:
        ld.fail(e, "at least one GPU arch is needed")


def _warm(ld, values, raw, e, ctx):
    for key in ("heads", "dims"):
        if len(values[key]) != 2:
            ld.fail(f"{e}.{key}", "expected two numbers: key, value")


def _arch_rule(ld, values, raw, e, ctx):
    gpu, build_as = values["gpu"], values["build_as"]
    if gpu[3:-1] != build_as[3:-1] or int(build_as[-1]) > int(gpu[-1]):
        ld.fail(f"{e}.build_as", f"{build_as} code does not run on {gpu} (same major, a lower or equal minor)")


def _kernel_release(ld, values, raw, e, ctx):   # a release's own release wheels are of that release
    if values["release"] is not None and not same_version(values["release"].version, values["version"]):
        ld.fail(f"{e}.release.version", f"{values['release'].version} is not the release's version {values['version']}")


def _source_build(ld, values, raw, e, ctx):
    for key in ("measured", "build_deps", "parallel"):
        if key in raw or key == "measured":
            ld.source(raw[key], f"{e}.{key}")
    spec = list(Requirement(values["requirement"]).specifier)
    if len(spec) != 1 or spec[0].operator != "==":
        ld.fail(f"{e}.requirement",
                f"{values['requirement']!r}: expected one exact version (name==X): builds are cached by it")
    if not set(values["split_units"]) <= {name for name, _ in values["unit_seconds"]}:
        ld.fail(f"{e}.parallel.split_units", "expected a list of file names that unit_seconds has")


def _release_wheels(ld, values, raw, e, ctx):
    for name in WHEEL_FIELDS:
        if name not in values["filename"]:
            ld.fail(f"{e}.filename", f"the template must contain {name}")


def _packed_package(ld, values, raw, e, ctx):
    distribution = raw.get("distribution") or values["kernel"]
    if not isinstance(distribution, str):
        ld.fail(e, "expected a `kernel` (one of fastpath-hooks' kernels) or a `distribution`")
    values["distribution"] = canonical_name(distribution)


_AFTER = {Archs: _archs, Warm: _warm, ArchRule: _arch_rule, KernelRelease: _kernel_release,
          SourceBuild: _source_build, PackedPackage: _packed_package, ReleaseWheels: _release_wheels}


# -- the whole pins --------------------------------------------------------------------------------

def build(data, origins: tuple) -> Pins:
    ld = _Loader(origins[-1])
    ld.table(data, "")
    if data.get("schema") != 1:
        ld.fail("schema", f"unsupported schema {data.get('schema')!r}; expected 1")
    sections = {}
    for key, names in (("protected", "distributions"), ("triton_distributions", "names"),
                       ("allowed_distributions", "names")):
        table = ld.table(data.get(key), key)
        ld.only(table, key, (names, "source"))
        if key != "triton_distributions":
            ld.source(table, key)
        sections[key] = ld.strings(table.get(names), f"{key}.{names}", canonical_name)
    protected, triton_dists = sections["protected"], sections["triton_distributions"]

    kernels_raw = ld.table(data.get("kernels"), "kernels")
    names = tuple(kernels_raw)
    if not names:
        ld.fail("kernels", "at least one kernel is needed")
    kernels = {name: ld.kernel(name, kernels_raw[name], names) for name in names}
    _check_registry(ld, kernels)
    order = decision_order(kernels)
    if order is None:
        ld.fail("kernels", "their `with`, `serves` and `imports_optional` make a circle: each kernel is decided after "
                "the ones it names")

    release_wheels, source_builds = {}, {}
    for name, spec in tuple(kernels.items()):
        if spec.kind != "compiled":
            continue
        raw, ctx = kernels_raw[name], {"names": names}
        if "release" in raw:
            release_wheels[name] = ld.record(ReleaseWheels, raw["release"], f"kernels.{name}.release", ctx)
        build = ld.record(SourceBuild, raw.get("source_build"), f"kernels.{name}.source_build", ctx)
        source_builds[name] = build = replace(build, arch_rules=spec.arch_rules)
        kernels[name] = spec = replace(spec, cuda_switch=build.cuda_switch, trim=build.trim)
        if build.trim is not None and spec.head_dims is None:
            ld.fail(f"kernels.{name}.source_build.trim", "a trimmed build needs the kernel's head_dims (its dims and "
                    "the config attributes naming the models' ones)")
        if build.version is not None and spec.releases and not any(same_version(r.version, build.version)
                                                                   for r in spec.releases):
            ld.fail(f"kernels.{name}.releases", f"the source build's {build.requirement} is not one of the releases")

    top = {"names": names}
    hazards = ld.value(tuple[Hazard, ...], data.get("hazards", []), "hazards", {}, top)
    for i, h in enumerate(hazards):
        if h.needs not in kernels or h.kernel not in kernels[h.needs].serves:
            serving = [k for k, s in kernels.items() if h.kernel in s.serves]
            ld.fail(f"hazards[{i}].needs", f"{h.needs!r}: expected a kernel that serves {h.kernel} "
                    f"({', '.join(serving) or 'none does: add `serves` to its entry'})")

    yanked = {canonical_name(k): ld.value(tuple[str, ...], val, f"yanked.{k}", {"form": "version"}, top)
              for k, val in ld.table(data.get("yanked", {}), "yanked").items() if k != "source"}
    _check_yanked(ld, kernels, yanked)

    # every distribution a kernel may install is allowed (naming a kernel's own in its entry allows them)
    allowed = frozenset(sections["allowed_distributions"]).union(*(spec.distributions for spec in kernels.values()))
    for name, spec in kernels.items():
        for dist in spec.distributions:
            if dist in protected:
                ld.fail(f"kernels.{name}.distributions", f"{dist} is protected and can never be installed")
    for entry, reqs in [(f"kernels.{n}.runtime_deps", s.runtime_deps) for n, s in kernels.items()] + \
            [(f"kernels.{n}.source_build.build_deps.requirements", b.build_deps) for n, b in source_builds.items()]:
        for i, req in enumerate(reqs):
            if canonical_name(Requirement(req).name) not in allowed:
                ld.fail(f"{entry}[{i}]", f"{Requirement(req).name} is not in allowed_distributions.names")
    for name, build in source_builds.items():
        if build.distribution not in kernels[name].distributions:
            ld.fail(f"kernels.{name}.source_build.requirement",
                    f"{build.distribution} is not one of the kernel's distributions")
    for name in triton_dists:
        if name not in protected:
            ld.fail("triton_distributions.names", f"{name} provides triton for a torch build, so it must also be in "
                    "protected.distributions (fastpath-hooks never changes it)")
    for p in protected:
        if p in allowed and p != "numpy":
            ld.fail("allowed_distributions.names", f"{p} is protected and can never be installed")

    cxx, cxx_standards = data.get("cxx_standard"), ()
    if cxx is not None:
        ld.only(ld.table(cxx, "cxx_standard"), "cxx_standard", ("rules", "source"))
        ld.source(cxx, "cxx_standard")
        cxx_standards = ld.value(tuple[CxxStandard, ...], cxx.get("rules"), "cxx_standard.rules", {}, top)
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    # frozen all the way down: `load()` is cached and shared by every caller in the process
    return freeze(Pins(
        protected=protected, triton_distributions=triton_dists, allowed=allowed, kernels=kernels,
        hazards=hazards, yanked=yanked, origins=origins, digest=digest,
        packed_sequences=None if data.get("packed_sequences") is None else
        ld.record(PackedSequences, data["packed_sequences"], "packed_sequences", top),
        release_wheels=release_wheels, source_builds=source_builds, decision_order=order, cxx_standards=cxx_standards,
        hub=HubRules() if data.get("hub") is None else ld.record(HubRules, data["hub"], "hub", top),
    ))


def _check_yanked(ld, kernels: dict, yanked: dict) -> None:
    """A yanked version would not install (or would warn): never pin one."""
    def check(dist, version, entry):
        if any(same_version(version, y) for y in yanked.get(dist, ())):
            ld.fail(entry, f"{dist} {version} is yanked on the index (see yanked.{dist}); pin another version")

    for name, spec in kernels.items():
        first, *rest = spec.distributions
        for i, pair in enumerate(spec.pairs):
            check(first, pair.version, f"kernels.{name}.pairs[{i}].{first}")
            for j, companion in enumerate(pair.companions):
                check(rest[0], companion, f"kernels.{name}.pairs[{i}].{rest[0]}[{j}]")
        if spec.kind in ("pure", "backend"):
            for i, rel in enumerate(spec.releases):
                for dist in spec.distributions:
                    check(dist, rel.version, f"kernels.{name}.releases[{i}].version")


def decision_order(kernels: dict) -> tuple | None:
    """Each kernel after the ones its rules read: those that serve it, it is used with or its import tries; a
    backend after the kernels it serves (it reads their release); else in the pins' order. None: a circle."""
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


def _check_registry(ld, kernels: dict) -> None:
    """Names, modules, aliases, gates and rule prefixes are each one kernel's; the shipped kernels keep the
    modules the start-up entry watches."""
    owner: dict = {}
    for name, spec in kernels.items():
        for what, values in (("name", (name,) + spec.aliases), ("module", spec.modules), ("gate", spec.gates),
                             ("rule prefix", (spec.rule_prefix,))):
            for value in values:
                other = owner.setdefault((what, value), name)
                if other != name:
                    ld.fail(f"kernels.{name}", f"{what} {value!r} is also {other}'s")
        if name in REGISTRY and spec.modules != REGISTRY[name]["modules"]:
            ld.fail(f"kernels.{name}.modules", "a shipped kernel's modules are fixed (the start-up entry watches them)")
        for served in spec.serves:
            if served in spec.with_kernels:
                ld.fail(f"kernels.{name}.serves",
                        f"{served} is also in `with`: a kernel serves another or needs it, not both")
