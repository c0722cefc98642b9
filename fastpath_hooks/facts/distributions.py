"""Installed distributions, read from the `*.dist-info` directory names on sys.path (importlib.metadata
costs ~48 ms to import and walks every entry point; this runs on a training process's import path), and
the read-only values facts are kept in: `freeze` makes what JSON or a probe produced read-only all the way
down, so the cached, shared pins and an Environment stay as they were checked; `thaw` undoes it for JSON."""

from __future__ import annotations

import dataclasses
import os
import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from packaging.specifiers import Specifier, SpecifierSet


@lru_cache(maxsize=4096)
def canonical_name(name: str) -> str:
    """PEP 503 normalization without `re` (runs on the import path); remembered per name."""
    out = []
    prev_sep = False
    for ch in name.strip().lower():
        if ch in "-_.":
            if not prev_sep:
                out.append("-")
            prev_sep = True
        else:
            out.append(ch)
            prev_sep = False
    return "".join(out)


@dataclass(frozen=True)
class Installed:
    name: str          # canonical
    version: str
    path: str          # the .dist-info / .egg-info directory
    site: str          # the sys.path entry holding it


def _parse_entry(entry: str):
    if entry.endswith(".dist-info"):
        stem = entry[: -len(".dist-info")]
    elif entry.endswith(".egg-info"):
        stem = entry[: -len(".egg-info")]
    else:
        return None
    name, sep, version = stem.partition("-")
    if not sep:
        return canonical_name(name), None
    # egg-info may carry "-py3.11" after the version
    version = version.split("-py", 1)[0]
    return canonical_name(name), version


def _version_from_metadata(path: str) -> str | None:
    for fname in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(path, fname), encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
                    if not line.strip():
                        break
        except OSError:
            continue
    return None


def scan(paths=None) -> tuple[dict, dict]:
    """(first-found distributions by canonical name, duplicates: name -> every Installed found in ONE
    directory more than once - what a killed installer leaves behind)."""
    found: dict[str, Installed] = {}
    duplicates: dict[str, list] = {}
    for site in (sys.path if paths is None else paths):
        site = site or os.getcwd()
        try:
            entries = os.listdir(site)
        except OSError:
            continue
        here: dict[str, Installed] = {}
        for entry in entries:
            parsed = _parse_entry(entry)
            if parsed is None:
                continue
            name, version = parsed
            path = os.path.join(site, entry)
            if version is None:
                version = _version_from_metadata(path)
                if version is None:
                    continue
            item = Installed(name, version, path, site)
            if name in here:
                duplicates.setdefault(name, [here[name]]).append(item)
                continue
            here[name] = item
            found.setdefault(name, item)
    return found, duplicates


def installed_versions(names=None, paths=None) -> dict:
    found, _ = scan(paths)
    if names is None:
        return {k: v.version for k, v in found.items()}
    wanted = {canonical_name(n) for n in names}
    return {k: v.version for k, v in found.items() if k in wanted}


def site_packages() -> str:
    """The directory installs go to: the running interpreter's purelib."""
    return sysconfig.get_paths()["purelib"]


def record_files(dist: Installed) -> list[str]:
    """Absolute paths a distribution owns, from its RECORD (empty if none)."""
    record = os.path.join(dist.path, "RECORD")
    files: list[str] = []
    try:
        with open(record, encoding="utf-8", errors="replace") as fh:
            import csv

            for row in csv.reader(fh):
                if not row or not row[0]:
                    continue
                files.append(os.path.normpath(os.path.join(dist.site, row[0])))
    except OSError:
        return []
    return files


class FrozenMap(Mapping):
    """A read-only, hashable mapping (a `types.MappingProxyType` cannot be hashed or pickled); it equals
    a dict with the same items."""

    __slots__ = ("_data", "_hash")

    def __init__(self, *args, **kwargs):
        object.__setattr__(self, "_data", dict(*args, **kwargs))
        object.__setattr__(self, "_hash", None)

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)

    def __contains__(self, key):
        return key in self._data

    def __hash__(self):
        if self._hash is None:
            object.__setattr__(self, "_hash", hash(frozenset(self._data.items())))
        return self._hash

    def __eq__(self, other):
        if isinstance(other, Mapping):
            return self._data == dict(other.items())
        return NotImplemented

    def __repr__(self):
        return f"FrozenMap({self._data!r})"

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is read-only")

    __delattr__ = __setattr__

    def __reduce__(self):
        return (FrozenMap, (self._data,))

    def __or__(self, other):  # `frozen | {...}` makes a new map, as dict's does
        if not isinstance(other, Mapping):
            return NotImplemented
        return FrozenMap({**self._data, **other})


class FrozenSpecifier(Specifier):
    __slots__ = ()
    prereleases = property(Specifier.prereleases.fget)   # no setter: read-only


class FrozenSpecifierSet(SpecifierSet):
    """A SpecifierSet whose prerelease handling is fixed when it is parsed (packaging's, and its
    specifiers', can be switched by assigning `prereleases`, which would change every later decision)."""
    __slots__ = ()
    prereleases = property(SpecifierSet.prereleases.fget)

    def __init__(self, specifiers="", prereleases=None):
        super().__init__(specifiers, prereleases)
        # its parsed specifiers read-only too, without parsing them again: FrozenSpecifier adds no state
        for spec in self._specs:
            if type(spec) is Specifier:
                spec.__class__ = FrozenSpecifier


_LEAVES = (str, int, float, bool, bytes, type(None), FrozenSpecifierSet)


def freeze(value):
    """`value` with every dict made a FrozenMap, every list a tuple, every set a frozenset and every
    SpecifierSet a FrozenSpecifierSet, recursively. Frozen dataclasses are frozen field by field in
    place (they are our own fresh values) unless their class says `_freezes_itself` (its
    __post_init__ calls freeze_fields); other objects are returned as they are."""
    if isinstance(value, _LEAVES):
        return value
    if isinstance(value, Mapping):
        if isinstance(value, FrozenMap) and all(freeze(v) is v for v in value.values()):
            return value
        return FrozenMap({freeze(k): freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        items = tuple(freeze(v) for v in value)
        if type(value) is tuple and all(a is b for a, b in zip(items, value)):
            return value
        return items if type(value) in (list, tuple) else type(value)(*items)   # a namedtuple stays one
    if isinstance(value, (set, frozenset)):
        return frozenset(freeze(v) for v in value)
    if isinstance(value, SpecifierSet):
        return FrozenSpecifierSet(str(value), prereleases=getattr(value, "_prereleases", None))
    if getattr(type(value), "_freezes_itself", False):   # froze its fields when it was made
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if not type(value).__dataclass_params__.frozen:
            raise TypeError(f"{type(value).__name__} is a mutable dataclass; values must be frozen")
        freeze_fields(value)
    return value


def freeze_fields(obj) -> None:
    """Freeze a frozen dataclass's fields in place (from its __post_init__, or at a conversion edge)."""
    for f in dataclasses.fields(obj):
        current = getattr(obj, f.name)
        frozen = freeze(current)
        if frozen is not current:
            object.__setattr__(obj, f.name, frozen)


def thaw(value):
    """Plain dicts and lists again (JSON output, or a copy to build on)."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [thaw(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((thaw(v) for v in value), key=str)
    return value
