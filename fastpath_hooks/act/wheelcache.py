"""The local wheel cache of compiled kernels: keys, file names, lookup, atomic store, list, clear.

A compiled kernel depends on more than its sdist: the torch version and its CUDA/HIP
build, the Python tag, the C++ ABI, the platform and the GPU archs it was compiled
for. pip's own wheel cache keys a build by the sdist alone (the same sdist under
another torch hands back the old binary: undefined symbols), so builds never go
through it; this cache keys them by all of that instead. A built wheel carries its
key in its file name, as a local version label:

    causal_conv1d-1.6.2.post1+fph.torch2.11.0.cu130.abi1.sm90-cp312-cp312-linux_x86_64.whl

(Python tag and platform are the wheel's own tags), so the same name matched the same
way works in a wheelhouse that FASTPATH_HOOKS_FIND_LINKS serves to an offline cluster.
Downloaded release wheels are cached under their release file name.

Layout: `<cache root>/wheels/<file>.whl` and a sidecar `<file>.whl.json` (size,
sha256, key, how it was made). An entry counts only when both are there and the sizes
agree; its sha256 is checked before it is installed. Writes are atomic (temporary
file + rename, the sidecar last) under the cache's lock. Listing is a directory read
plus small JSON files: cheap enough for the probe.
"""

from __future__ import annotations

import os

from ..facts.distributions import canonical_name
from ..facts.wheels import SIDECAR, defect, directory, sidecar, wheel_distribution
from .transaction import atomic_copy, atomic_write_json, sha256_of
from .locks import file_lock

_LOCK_TIMEOUT = 120.0   # a store holds it for a copy of one wheel


def entries(root: str) -> list:
    """Every wheel in the cache, complete or not, for `doctor` and `cache list`."""
    where = directory(root)
    try:
        names = sorted(n for n in os.listdir(where) if n.endswith(".whl"))
    except OSError:
        return []
    out = []
    for name in names:
        path = os.path.join(where, name)
        meta = sidecar(path) or {}
        try:
            size = os.path.getsize(path)
        except OSError:
            size = None
        out.append({"file": name, "path": path, "size": size, "sha256": meta.get("sha256"),
                    "distribution": meta.get("distribution"), "version": meta.get("version"),
                    "origin": meta.get("origin"), "key": meta.get("key") or {}, "log": meta.get("log"),
                    "ok": defect(path) is None, "problem": defect(path)})
    return out


def recorded_sha256(path: str) -> str | None:
    """The sha256 a sidecar next to `path` records (a cache entry, or a wheel `build --dest` wrote)."""
    meta = sidecar(path)
    value = meta.get("sha256") if meta else None
    return value if isinstance(value, str) and len(value) == 64 else None


def store(root: str, wheel: str, *, meta: dict, filename: str | None = None) -> str:
    """Copy `wheel` into the cache as `filename` (default its own name), atomically, under the
    cache's lock; return the cached path. The sidecar (meta + size + sha256) is written last, and
    an old sidecar goes first: never a new wheel under an old sidecar."""
    where = directory(root)
    os.makedirs(where, exist_ok=True)
    name = filename or os.path.basename(wheel)
    target = os.path.join(where, name)
    with file_lock(os.path.join(where, ".lock"), timeout=_LOCK_TIMEOUT):
        try:
            os.unlink(target + SIDECAR)
        except FileNotFoundError:
            pass
        atomic_copy(wheel, target)
        atomic_write_json(target + SIDECAR, dict(meta, file=name, size=os.path.getsize(target),
                                                 sha256=sha256_of(target)))
    return target


def export(path: str, dest: str) -> str:
    """Copy a cache entry (wheel + sidecar) into a wheelhouse directory, atomically."""
    from .transaction import atomic_copy

    os.makedirs(dest, exist_ok=True)
    target = os.path.join(dest, os.path.basename(path))
    for src, dst in ((path, target), (path + SIDECAR, target + SIDECAR)):
        if os.path.exists(src):
            atomic_copy(src, dst)
    return target


def clear(root: str, distribution: str | None = None) -> list:
    """Remove every entry (or those of one distribution), under the lock; the removed file names."""
    where = directory(root)
    if not os.path.isdir(where):
        return []
    want = canonical_name(distribution) if distribution else None
    removed = []
    with file_lock(os.path.join(where, ".lock"), timeout=_LOCK_TIMEOUT):
        for name in sorted(os.listdir(where)):
            if name.startswith(".lock"):  # the lock (and a no-flock holder file) stay: a store may wait on them
                continue
            base = name[: -len(SIDECAR)] if name.endswith(".whl" + SIDECAR) else name
            if want is not None:
                if not base.endswith(".whl") or wheel_distribution(base) != want:
                    continue
            try:
                os.unlink(os.path.join(where, name))
            except OSError:
                continue
            if name.endswith(".whl"):
                removed.append(name)
    return removed
