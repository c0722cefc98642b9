"""A kernel's import, remembered: the lighter check of a later environment (issue 20).

A verification child costs a torch import and the kernel's own (about 13 s for causal-conv1d and
mamba-ssm on the H200) in every new environment, although nothing it could find out has changed when
the same files are imported beside the same distributions. So the verification child says which
distributions its imports loaded modules of (act/verify.py), and a successful import is remembered in
the cache (`<cache root>/verified/<kernel>.json`, shared by every environment of the user, like the
wheel cache and the numeric records) under a key of everything the import read: the kernel's
installed files (the digest of their wheels' RECORD entries), those distributions with their
versions, the interpreter, the machine and the variables the child is given for the kernel. A later
environment whose key matches is not checked again; another torch build, another transformers, other
kernel files - and the child runs as before. A distribution the import does not load (the build's own
ninja and wheel) does not matter. A failed import is never remembered.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time

from .. import events

SUBDIR = "verified"
_SCRATCH = ("TMPDIR", "TEMP", "TMP")   # the install's own scratch directory: another one every time


def _mark(spec, env_extra, digest: str, versions: dict, extra: str = "", gpus=()) -> str:
    world = {
        "files": digest,
        "loaded": sorted(f"{name}=={version}" for name, version in versions.items()),
        "python": [sys.version, sys.platform, platform.machine(), platform.node()],
        "modules": [list(spec.verify_modules), list(spec.verify_attributes)],
        "env": sorted(f"{k}={v}" for k, v in env_extra if k not in _SCRATCH),
        "pythonpath": os.environ.get("PYTHONPATH", ""),
    }
    if extra:   # what else the remembered verification ran (a decision's check)
        world["extra"] = extra
    if gpus:    # the GPUs it was checked on: another GPU type sharing the cache checks again
        world["gpus"] = sorted(gpus)
    return hashlib.sha256(json.dumps(world, sort_keys=True).encode()).hexdigest()[:32]


def _here(names) -> dict:
    """The versions of these distributions in this environment (None: not installed)."""
    from ..facts.distributions import canonical_name, scan

    found, _ = scan()
    return {name: (found[canonical_name(name)].version if canonical_name(name) in found else None) for name in names}


def _path(root: str, kernel: str) -> str:
    return os.path.join(root, SUBDIR, f"{kernel}.json")


def _read(root: str, kernel: str) -> dict:
    try:
        with open(_path(root, kernel), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def recall(root: str | None, spec, env_extra=(), extra: str = "", gpus=()) -> dict | None:
    """The remembered import of this kernel for exactly this environment, or None."""
    if not root:
        return None
    data = _read(root, spec.name)
    if not data:
        return None
    from .numeric import installed_digest

    digest = installed_digest(spec.distributions)
    if digest is None:
        return None
    for names in {tuple(e.get("distributions") or ()) for e in data.values()}:
        entry = data.get(_mark(spec, env_extra, digest, _here(names), extra, gpus))
        if entry is not None:
            return entry
    return None


def forget(root: str | None) -> None:
    """Forget every remembered check (`doctor --refresh`): the next install of each kernel checks it again."""
    if root:
        import shutil

        shutil.rmtree(os.path.join(root, SUBDIR), ignore_errors=True)


def remember(root: str | None, spec, env_extra, loaded: dict, seconds: float, extra: str = "", gpus=()) -> None:
    """Remember a successful import beside the distributions it `loaded` (the child's {name: version};
    the names count); a read-only cache costs a child next time."""
    if not root:
        return
    from .files import atomic_write_json
    from .locks import file_lock
    from .numeric import installed_digest

    digest = installed_digest(spec.distributions)
    if digest is None:
        return
    path = _path(root, spec.name)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with file_lock(path + ".lock", timeout=30):
            data = _read(root, spec.name)
            # the versions as a later recall reads them (this environment's dist-info), not the child's
            data[_mark(spec, env_extra, digest, _here(sorted(loaded)), extra, gpus)] = {
                "distributions": sorted(loaded), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "seconds": round(seconds, 2)}
            atomic_write_json(path, data)
    except Exception as exc:   # noqa: BLE001 - never worth failing an install over
        events.debug(f"{spec.name}: could not remember its import in {path}: {exc}", spec.name)
