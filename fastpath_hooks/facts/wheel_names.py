"""Wheel file names, read one way: the distribution (canonical), the version and the tags.

Every part of the package that looks at a wheel's name (plans, the policy's wheelhouse, the cache's
key scheme, cache clearing, the verdict signature, relabelling a built wheel) asks here, so a name
is parsed by packaging's rules once and `causal_conv1d` / `Causal-Conv1D` are the same distribution
everywhere. packaging is imported when a name is read, not at import time.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from .distributions import canonical_name


@dataclass(frozen=True)
class WheelName:
    filename: str
    distribution: str      # canonical: causal-conv1d
    version: object        # packaging Version
    build: tuple           # () or (number, text): the optional build tag
    tags: frozenset        # packaging Tags
    tag_text: str          # the name's own python-abi-platform part: cp312-cp312-linux_x86_64


def parse_wheel(filename: str) -> WheelName | None:
    """The parts of a standard wheel file name (a path's base name is read), else None."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename
    from packaging.version import InvalidVersion

    base = os.path.basename(filename)
    try:
        name, version, build, tags = parse_wheel_filename(base)
    except (InvalidWheelFilename, InvalidVersion):
        return None
    # a valid name ends in exactly python-abi-platform (the build tag, if any, comes before them)
    tag_text = "-".join(base[:-len(".whl")].split("-")[-3:])
    return WheelName(base, canonical_name(name), version, tuple(build), frozenset(tags), tag_text)


def wheel_distribution(filename: str) -> str:
    """The canonical distribution a wheel file installs; for a name that is not standard, what comes
    before its first dash (how installers that accept it read it)."""
    parsed = parse_wheel(filename)
    if parsed is not None:
        return parsed.distribution
    return canonical_name(os.path.basename(filename).split("-", 1)[0])


def with_local_label(filename: str, local: str) -> str:
    """The file name of the same wheel whose version carries the local label `local` (any old one
    replaced): causal_conv1d-1.6.2.post1+fph.torch2.11.0...-cp312-cp312-linux_x86_64.whl."""
    parsed = parse_wheel(filename)
    if parsed is None:
        raise ValueError(f"{os.path.basename(filename)!r} is not a wheel file name")
    build = f"-{parsed.build[0]}{parsed.build[1]}" if parsed.build else ""
    return f"{parsed.distribution.replace('-', '_')}-{parsed.version.public}+{local}{build}-{parsed.tag_text}.whl"
