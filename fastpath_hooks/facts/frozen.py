"""Values that cannot change: `freeze` makes what JSON or a probe produced read-only all the way down, so the
cached, shared pins and an Environment stay as they were checked; `thaw` gives plain dicts and lists back."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from packaging.specifiers import Specifier, SpecifierSet


class FrozenMap(Mapping):
    """A read-only, hashable mapping (a `types.MappingProxyType` cannot be hashed or pickled); equal to a dict
    with the same items (Mapping's __eq__)."""

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

    def __repr__(self):
        return f"FrozenMap({self._data!r})"

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is read-only")

    __delattr__ = __setattr__

    def __reduce__(self):
        return (FrozenMap, (self._data,))


class FrozenSpecifier(Specifier):
    __slots__ = ()
    prereleases = property(Specifier.prereleases.fget)   # no setter: read-only


class FrozenSpecifierSet(SpecifierSet):
    """A SpecifierSet whose `prereleases` cannot be assigned (that would change every later decision)."""
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
    """Dicts, lists, sets and SpecifierSets made read-only, recursively; a frozen dataclass frozen field by field
    in place (our own fresh values) unless its class says `_freezes_itself` (its __post_init__ does it)."""
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
    if getattr(type(value), "_freezes_itself", False):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if not type(value).__dataclass_params__.frozen:
            raise TypeError(f"{type(value).__name__} is a mutable dataclass; values must be frozen")
        freeze_fields(value)
    return value


def freeze_fields(obj) -> None:
    for f in dataclasses.fields(obj):
        current = getattr(obj, f.name)
        frozen = freeze(current)
        if frozen is not current:
            object.__setattr__(obj, f.name, frozen)


def thaw(value):
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [thaw(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((thaw(v) for v in value), key=str)
    return value
