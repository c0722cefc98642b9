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
