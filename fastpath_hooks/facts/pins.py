"""Pins and rules as data: load the shipped `pins.json`, merge a user file, validate.

Each kernel's entry is its registry entry (docs/registry.md): its kind (`pure` wheels at pinned
releases, a `pair` of distributions pinned together that serves another kernel, or `compiled`:
release wheels and a source build), import modules, aliases, gates, mirror variable, the kernels it
is used `with` or `serves`, its rule prefix - and the data its kind's rules read.

A user file (FASTPATH_HOOKS_PINS, JSON or TOML) has the same shape as `pins.json`
and only needs the parts it changes - or a whole new kernel entry. Records with an identity
replace the shipped record with that identity and come first (so a user's release is preferred):
releases by `version`, pairs by their first distribution, broken pairs by (that, `arch`,
`effect`), hazards by `id`. Everything else is deep-merged; lists of plain values are replaced.
Errors name the file and the entry.
"""

from __future__ import annotations

import os
from functools import lru_cache

from .pins_loader import build, decision_order
from .pins_values import (KINDS, SHIPPED, SOURCE_KINDS, Archs, BrokenPair, Hazard, HeadDims, KernelRelease, KernelSpec,
                          PackedPackage, PackedSequences, Pair, Pays, Pins, PinsError, PureRelease, ReleaseWheels,
                          SourceBuild, Switch, Warm, WheelIndex, same_version)
from .._registry import REGISTRY, PinsFileError, read_pins_file

# the values (pins_values) and the order of the kernels (pins_loader) are read from here too
__all__ = ["KINDS", "SHIPPED", "SOURCE_KINDS", "Archs", "BrokenPair", "Hazard", "HeadDims", "KernelRelease", "KernelSpec",
           "PackedPackage", "PackedSequences", "Pair", "Pays", "Pins", "PinsError", "PureRelease", "ReleaseWheels",
           "SourceBuild", "Switch", "Warm", "WheelIndex", "decision_order", "load", "record_keys", "same_version"]


def record_keys(kernels: dict) -> dict:
    """The identity of each kind's records, per kernel (what a user's record replaces)."""
    out = {("hazards",): ("id",), ("hub", "broken"): ("id",)}
    for name, entry in kernels.items():
        if not isinstance(entry, dict):
            continue
        kind = entry.get("kind")
        if kind in ("pure", "compiled", "backend"):
            out[("kernels", name, "releases")] = ("version",)
        if kind == "compiled":
            out[("kernels", name, "wheel_indexes")] = ("name",)
        elif kind == "pair":
            first = (entry.get("distributions") or [None])[0]
            out[("kernels", name, "pairs")] = (first,)
            out[("kernels", name, "broken")] = (first, "arch", "effect")
    return out

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
    allowed = {"schema", "about", "protected", "triton_distributions", "allowed_distributions", "kernels", "hazards", "yanked",
               "packed_sequences", "cxx_standard", "hub"}
    for key in user:
        if key not in allowed:
            raise PinsError(origin, key, f"unknown section; expected one of {', '.join(sorted(allowed))}")
    if "schema" in user and user["schema"] != 1:
        raise PinsError(origin, "schema", f"unsupported schema {user['schema']!r}; this fastpath-hooks reads schema 1")
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

