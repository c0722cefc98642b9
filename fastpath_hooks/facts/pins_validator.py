"""The pins validator: typed checks of the pins data (tables, lists, strings, versions, specifiers,
requirements, sources), each returning the value checked or raising `PinsError`, which names the file
and the entry. facts/pins_schema.py, pins_kernels.py and pins_rules.py read the pins through it."""

from __future__ import annotations

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .frozen import FrozenSpecifierSet
from .pins_values import SOURCE_KINDS, PinsError


class Validator:
    """The checks; every error names `origin`, the pins file read last (a user file, else the shipped one)."""

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

    def tables(self, value, entry):
        """(`entry[i]`, table) for each item of a list, each checked to be a table as the loop reaches it:
        the first error met is the one named."""
        for i, item in enumerate(self.list(value, entry)):
            yield f"{entry}[{i}]", self.table(item, f"{entry}[{i}]")

    def once(self, value, seen: set, entry):
        """`value`, refused when an earlier item of the same list had it (a version, a check's name)."""
        if value in seen:
            self.fail(entry, f"{value} is listed twice")
        seen.add(value)
        return value

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

    def requirements(self, value, entry) -> tuple:
        return tuple(self.requirement(v, f"{entry}[{i}]") for i, v in enumerate(self.list(value, entry)))

    def boolean(self, value, entry) -> bool:
        if not isinstance(value, bool):
            self.fail(entry, "expected true or false")
        return value

    def source(self, record: dict, entry) -> str:
        value = record.get("source")
        if not isinstance(value, str) or value.split(":", 1)[0].strip() not in SOURCE_KINDS or ":" not in value:
            self.fail(f"{entry}.source", "every fact needs a source 'measured: ...', 'reported: ...' or 'upstream: ...'")
        return value
