"""Wheels made local and checked, and the local wheel cache.

A wheel step's file comes from FASTPATH_HOOKS_FIND_LINKS, the wheel cache (a file:// URL into it) or its URL,
checked against its pinned sha256, else the one the cache recorded; `fastpath-hooks download` adds `pip download`
of the binary requirements for the target's Python, architecture and glibc. The wheel cache
(`<root>/wheels/<file>.whl` + a `.json` sidecar) exists because pip's keys a build by the sdist alone (another
torch gets the old binary back: undefined symbols); a built wheel carries its whole key in its local version
label (facts/wheels.py). An entry counts only with both files, agreeing sizes and - where its mtime is not the
recorded one - agreeing digests; writes are atomic under the cache's lock, the sidecar last.
"""

from __future__ import annotations

import os
import shutil
import sys
import urllib.request
from contextlib import suppress
from urllib.parse import unquote, urlsplit

from .. import events
from .._names import cache_root, find_links_dir
from .._registry import registry
from ..facts.distributions import canonical_name
from ..facts.wheels import SIDECAR, defect, directory, linux_platforms, sha256_of, sidecar, wheel_distribution
from .locks import file_lock
from .runner import run
from .transaction import atomic_copy, atomic_write_json


class FetchError(Exception):
    """The file is not to be had, or is not the pinned one (nothing corrupt is left behind)."""


def check_sha256(path: str, expected: str | None, digest: str | None = None, *, what: str, fix: str) -> None:
    """FetchError unless the file's sha256 is `expected`: a line short by design (`what` is wrong, refused, `fix`);
    the file and both digests are said at debug (and a cache entry's in `cache list`)."""
    got = (digest or sha256_of(path)) if expected else None
    if got is None or got == expected:
        return
    events.debug(f"{path}: sha256 {got}, not the expected {expected}; refused")
    raise FetchError(f"{what} (sha256 differs), refused; {fix}")


def _download(url: str, target: str, timeout: float) -> str:
    """`url` into `target`; its sha256. OSError leaves no partial file (a wheelhouse may be read there)."""
    events.status(f"downloading {url}")
    try:
        with urllib.request.urlopen(url, timeout=min(timeout, 120)) as resp, open(target, "wb") as out:
            shutil.copyfileobj(resp, out, 1 << 20)
        return sha256_of(target)
    except OSError:
        _remove(target)
        raise


def fetch_wheel(step, settings, dest: str) -> str:
    """The local path of the step's wheel: a FASTPATH_HOOKS_FIND_LINKS file or a cache entry where
    it lies, else downloaded from the step's URL into `dest`. FetchError names what to do."""
    filename = step.requirements[0]
    for path in filter(None, map(find_links_dir, settings.find_links)):
        candidate = os.path.join(path, filename)
        if os.path.isfile(candidate):
            check_sha256(candidate, step.sha256 or recorded_sha256(candidate), fix="replace it",
                         what=f"{wheel_distribution(filename)} wheel in FASTPATH_HOOKS_FIND_LINKS: not the "
                              f"{'pinned' if step.sha256 else 'recorded'} one")
            return candidate
    cached = os.path.abspath(unquote(urlsplit(step.url).path)) if (step.url or "").startswith("file:") else None
    if cached is not None and os.path.dirname(cached) == os.path.abspath(directory(cache_root(settings))):
        if os.path.isfile(cached):
            check_sha256(cached, step.sha256 or recorded_sha256(cached), fix="fastpath-hooks cache clear removes it",
                         what=f"cached {wheel_distribution(filename)} wheel altered")
            restamp(cache_root(settings), cached)
            return cached
        if settings.offline:
            raise FetchError(f"{filename} is no longer in {os.path.dirname(cached)} and the network is off")
    if settings.offline or not step.url:
        raise FetchError(f"{filename} is not in FASTPATH_HOOKS_FIND_LINKS and the network is off" if settings.offline
                         else f"{filename} is not in FASTPATH_HOOKS_FIND_LINKS and the plan has no URL for it")
    target = os.path.join(dest, filename)
    try:
        digest = _download(step.url, target, settings.timeout)
    except OSError as exc:
        dist = wheel_distribution(filename)   # a compiled kernel's release wheel: its registry `mirror` variable
        mirror = next((e["mirror"] for e in registry().values() if dist in e["distributions"] and e["mirror"]), None)
        hint = f" ({mirror} points at a mirror)" if mirror else ""
        raise FetchError(f"could not download {step.url}: {exc}{hint}") from None
    try:
        check_sha256(target, step.sha256, digest, what=f"downloaded {wheel_distribution(filename)} wheel: not the "
                     "pinned one", fix="check its URL or mirror")
    except FetchError:
        _remove(target)   # never a substituted file left where a wheelhouse is read
        raise
    return target


def fetch_into(dest: str, *, env, settings, binary, wheels) -> list[str]:
    """Fetch `binary` requirements and `wheels` steps for `env`'s Python and architecture into
    `dest`; the files that are new there (or, when all were there already, every file)."""
    os.makedirs(dest, exist_ok=True)
    before = set(os.listdir(dest))
    if binary:
        _pip_download(dest, env=env, settings=settings, binary=binary)
    for step in wheels:
        _fetch(step, dest, settings)
    return sorted(os.path.join(dest, n) for n in set(os.listdir(dest)) - before) or \
        sorted(os.path.join(dest, n) for n in os.listdir(dest))


def _pip_download(dest: str, *, env, settings, binary) -> None:
    py = ".".join(env.python.split(".")[:2])
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-input",
            "--no-deps", "--only-binary=:all:", "--dest", dest, "--python-version", py, "--implementation", "cp"]
    argv += [arg for tag in linux_platforms(env.glibc, env.arch) for arg in ("--platform", tag)]
    argv += ["--index-url", settings.index_url] if settings.index_url else []
    argv += [arg for link in settings.find_links for arg in ("--find-links", link)] + list(binary)
    ran = run(argv, timeout=settings.timeout, label=f"downloading {', '.join(binary)}")
    if ran.timed_out:
        raise FetchError(f"pip download of {' '.join(binary)} did not finish within {settings.timeout:.0f} s "
                         "(FASTPATH_HOOKS_TIMEOUT)")
    if ran.code != 0:
        tail = " | ".join(ran.output.strip().splitlines()[-3:])
        if "No module named pip" in ran.output:
            tail += f" (download runs `pip download` with {sys.executable}: `{sys.executable} -m ensurepip` adds pip)"
        raise FetchError(f"pip download failed for {' '.join(binary)}: {tail}")


def _fetch(step, dest: str, settings) -> None:
    """The step's wheel into `dest` (copied from FASTPATH_HOOKS_FIND_LINKS or the wheel cache where it lies)."""
    local = fetch_wheel(step, settings, dest)
    target = os.path.join(dest, os.path.basename(local))
    if os.path.abspath(local) != os.path.abspath(target):
        shutil.copy2(local, target)


def _remove(path: str) -> None:
    with suppress(OSError):
        os.unlink(path)


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
        size = os.path.getsize(path) if os.path.isfile(path) else None
        problem = defect(path)
        if problem is None:
            restamp(root, path)
        out.append({"file": name, "path": path, "size": size, "sha256": meta.get("sha256"),
                    "distribution": meta.get("distribution"), "version": meta.get("version"),
                    "origin": meta.get("origin"), "key": meta.get("key") or {}, "log": meta.get("log"),
                    "ok": problem is None, "problem": problem})
    return out


def restamp(root: str, path: str) -> None:
    """An entry whose bytes were just found to be the recorded ones, though its mtime is not (touched, copied, or
    stored before mtimes were recorded): its sidecar records the mtime now, so that no later listing hashes it."""
    with suppress(OSError, ValueError):
        meta = sidecar(path)
        stat = os.stat(path)
        if meta is None or meta.get("mtime_ns") == stat.st_mtime_ns or meta.get("size") != stat.st_size:
            return
        with file_lock(os.path.join(directory(root), ".lock"), timeout=1.0):   # a store holding it: next time
            if os.stat(path).st_mtime_ns == stat.st_mtime_ns and sidecar(path) == meta:
                atomic_write_json(path + SIDECAR, dict(meta, mtime_ns=stat.st_mtime_ns))


def recorded_sha256(path: str) -> str | None:
    """The sha256 a sidecar next to `path` records (a cache entry, or a wheel `build --dest` wrote)."""
    value = (sidecar(path) or {}).get("sha256")
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
        with suppress(FileNotFoundError):
            os.unlink(target + SIDECAR)
        atomic_copy(wheel, target)
        stat = os.stat(target)
        atomic_write_json(target + SIDECAR, dict(meta, file=name, size=stat.st_size, mtime_ns=stat.st_mtime_ns,
                                                 sha256=sha256_of(target)))
    return target


def export(path: str, dest: str) -> str:
    """Copy a cache entry (wheel + sidecar) into a wheelhouse directory, atomically."""
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
            if want is not None and (not base.endswith(".whl") or wheel_distribution(base) != want):
                continue
            try:
                os.unlink(os.path.join(where, name))
            except OSError:
                continue
            if name.endswith(".whl"):
                removed.append(name)
    return removed
