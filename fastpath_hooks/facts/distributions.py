"""Installed distributions, read from the `*.dist-info` directory names on sys.path, standard library only:
importlib.metadata costs ~48 ms to import and walks every entry point, and this runs on a training process's
import path; `enable` / `disable` and the import hook read it where fastpath-hooks' dependencies are gone."""

from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import dataclass
from functools import lru_cache


@lru_cache(maxsize=4096)
def canonical_name(name: str) -> str:
    """PEP 503 normalization without `re` (runs on the import path)."""
    out = []
    for ch in name.strip().lower():
        if ch not in "-_.":
            out.append(ch)
        elif not out or out[-1] != "-":   # a run of separators is one dash
            out.append("-")
    return "".join(out)


@dataclass(frozen=True)
class Installed:
    name: str          # canonical
    version: str
    path: str          # the .dist-info / .egg-info directory
    site: str          # the sys.path entry holding it


def _parse_entry(entry: str):
    for suffix in (".dist-info", ".egg-info"):
        if entry.endswith(suffix):
            name, sep, version = entry[:-len(suffix)].partition("-")
            return canonical_name(name), version.split("-py", 1)[0] if sep else None   # egg-info: 1.0-py3.11
    return None


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
            version = version or _version_from_metadata(path)   # a name without one: its metadata's
            if not version:
                continue
            item = Installed(name, version, path, site)
            if name in here:
                duplicates.setdefault(name, [here[name]]).append(item)
                continue
            here[name] = item
            found.setdefault(name, item)
    return found, duplicates


def installed_versions(names=None) -> dict:
    wanted = None if names is None else {canonical_name(n) for n in names}
    return {k: v.version for k, v in scan()[0].items() if wanted is None or k in wanted}


def site_packages() -> str:
    """The directory installs go to."""
    return sysconfig.get_paths()["purelib"]


def record_files(dist: Installed) -> list[str]:
    """Absolute paths a distribution owns, from its RECORD (empty if none)."""
    import csv

    try:
        with open(os.path.join(dist.path, "RECORD"), encoding="utf-8", errors="replace") as fh:
            return [os.path.normpath(os.path.join(dist.site, row[0])) for row in csv.reader(fh) if row and row[0]]
    except OSError:
        return []
