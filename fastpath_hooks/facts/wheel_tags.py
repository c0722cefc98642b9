"""Which wheel files fit a machine, by their tags (pure): CPython X.Y (or abi3 / py3), Linux on this
arch (manylinux up to this glibc, or plain linux_). A package index's listing (act/index.py) and a
cached index wheel (decide/wheel_fit.py) are matched the same way."""

from __future__ import annotations

import re


def choose(files, project: str, version: str, *, python: str, arch: str, glibc: str | None):
    """The file of exactly `version` (local label included) whose tags fit: CPython `python` (or
    abi3 / py3), Linux `arch` (manylinux up to this glibc, or plain linux_); None if none does."""
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    try:
        want = Version(version)
    except InvalidVersion:
        return None
    py = "cp" + "".join(python.split(".")[:2])
    for item in files:
        parsed = _parse(item["filename"])
        if parsed is None:
            continue
        name, ver, tags = parsed
        if canonicalize_name(name) != canonicalize_name(project) or ver != want:
            continue
        if any(_fits(t, py, arch, glibc) for t in tags):
            return item
    return None


def _parse(filename: str):
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    if not filename.endswith(".whl"):
        return None
    try:
        name, version, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    return name, version, tags


def wheel_version(filename: str):
    parsed = _parse(filename)
    return None if parsed is None else parsed[1]


def _fits(tag, py: str, arch: str, glibc: str | None) -> bool:
    minor = int(py[3:]) if py[3:].isdigit() else 0
    python_ok = ((tag.interpreter == py and tag.abi in (py, "abi3", "none"))
                 or (tag.abi == "abi3" and tag.interpreter.startswith("cp3") and tag.interpreter[3:].isdigit()
                     and int(tag.interpreter[3:]) <= minor)
                 or (tag.interpreter == "py3" and tag.abi == "none"))
    if not python_ok:
        return False
    plat = tag.platform
    if plat == f"linux_{arch}":
        return True
    m = re.fullmatch(rf"manylinux_(\d+)_(\d+)_{arch}", plat)
    legacy = {f"manylinux1_{arch}": (2, 5), f"manylinux2010_{arch}": (2, 12), f"manylinux2014_{arch}": (2, 17)}
    need = (int(m.group(1)), int(m.group(2))) if m else legacy.get(plat)
    if need is None:
        return False
    try:
        have = tuple(int(x) for x in (glibc or "").split(".")[:2])
    except ValueError:
        return False
    return len(have) == 2 and have >= need
