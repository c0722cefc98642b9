"""One wheel file a plan step names, made local: from FASTPATH_HOOKS_FIND_LINKS, the local wheel
cache (a file:// URL into it) or its URL, and checked against its sha256 (the pinned one, else the
one the cache recorded when it stored the file). The installer and `fastpath-hooks download` both
get their wheel steps' files here.

`fastpath-hooks download`'s act part: a plan's wheels fetched into a wheelhouse.

The binary requirements with `pip download --only-binary=:all: --no-deps` for the target's
Python and architecture; the wheel steps' files (release wheels, the wheel cache) as the
installer fetches them. What to fetch is the engine's (engine/prepare.py): it reads the world
and the plan; nothing here probes or decides. Afterwards `FASTPATH_HOOKS_FIND_LINKS=DIR
FASTPATH_HOOKS_OFFLINE=1` installs from the directory alone.
"""

from __future__ import annotations

import os
import shutil
import sys
import urllib.request

from .. import events
from .._environ import cache_root
from .._registry import registry
from ..facts.links import find_links_dir
from ..facts.wheels import wheel_distribution
from . import wheelcache
from .files import sha256_of
from .runner import run


class FetchError(Exception):
    """The file is not to be had, or is not the pinned one (nothing corrupt is left behind)."""


def check_sha256(path: str, expected: str | None) -> None:
    if not expected:
        return
    digest = sha256_of(path)
    if digest != expected:
        raise FetchError(f"{os.path.basename(path)}: sha256 {digest} does not match the pinned "
                         f"{expected} (a corrupt or substituted file); refusing it")


def cached_path(url: str | None, settings) -> str | None:
    """The local path of a file:// URL into the wheel cache, else None."""
    if not url or not url.startswith("file:"):
        return None
    from urllib.parse import unquote, urlsplit


    path = os.path.abspath(unquote(urlsplit(url).path))
    where = os.path.abspath(wheelcache.directory(cache_root(settings)))
    return path if os.path.dirname(path) == where else None


def fetch_wheel(step, settings, dest: str) -> str:
    """The local path of the step's wheel: a FASTPATH_HOOKS_FIND_LINKS file or a cache entry where
    it lies, else downloaded from the step's URL into `dest`. FetchError names what to do."""
    filename = step.requirements[0]
    for location in settings.find_links:
        path = find_links_dir(location)
        candidate = os.path.join(path, filename) if path is not None else None
        if candidate is not None and os.path.isfile(candidate):
            check_sha256(candidate, step.sha256 or wheelcache.recorded_sha256(candidate))
            return candidate
    cached = cached_path(step.url, settings)
    if cached is not None:  # the local wheel cache
        if os.path.isfile(cached):
            try:
                check_sha256(cached, step.sha256 or wheelcache.recorded_sha256(cached))
            except FetchError as exc:
                raise FetchError(f"{exc}; remove it with `fastpath-hooks cache clear`") from None
            return cached
        if settings.offline:
            raise FetchError(f"{filename} is no longer in {os.path.dirname(cached)} and the network is off")
    if settings.offline or not step.url:
        raise FetchError(f"{filename} is not in FASTPATH_HOOKS_FIND_LINKS and the network is off" if settings.offline
                         else f"{filename} is not in FASTPATH_HOOKS_FIND_LINKS and the plan has no URL for it")
    target = os.path.join(dest, filename)
    events.status(f"downloading {step.url}")
    try:
        with urllib.request.urlopen(step.url, timeout=min(settings.timeout, 120)) as resp, open(target, "wb") as out:
            while True:
                chunk = resp.read(1 << 20)
                if not chunk:
                    break
                out.write(chunk)
        check_sha256(target, step.sha256)
    except (OSError, FetchError) as exc:
        try:
            os.unlink(target)   # never a partial or substituted file left where a wheelhouse is read
        except OSError:
            pass
        if isinstance(exc, FetchError):
            raise
        raise FetchError(f"could not download {step.url}: {exc}{_mirror_hint(filename)}") from None
    return target


def _mirror_hint(filename: str) -> str:
    """The wheel's own mirror variable, for a compiled kernel's release wheel (the registry's `mirror`)."""
    dist = wheel_distribution(filename)
    variable = next((e["mirror"] for e in registry().values() if dist in e["distributions"] and e["mirror"]), None)
    return f" ({variable} points at a mirror)" if variable else ""


class DownloadError(Exception):
    pass


def platform_tags(arch: str) -> list[str]:
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(39, 16, -1)]
    return tags + [f"manylinux2014_{arch}", f"linux_{arch}"]


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
    for tag in platform_tags(env.arch):
        argv += ["--platform", tag]
    if settings.index_url:
        argv += ["--index-url", settings.index_url]
    for link in settings.find_links:
        argv += ["--find-links", link]
    argv += list(binary)
    ran = run(argv, timeout=settings.timeout, label=f"downloading {', '.join(binary)}")
    if ran.timed_out:
        raise DownloadError(f"pip download of {' '.join(binary)} did not finish within {settings.timeout:.0f} s "
                            "(FASTPATH_HOOKS_TIMEOUT)")
    if ran.code != 0:
        tail = " | ".join(ran.output.strip().splitlines()[-3:])
        if "No module named pip" in ran.output:
            tail += f" (download runs `pip download` with {sys.executable}: `{sys.executable} -m ensurepip` adds pip)"
        raise DownloadError(f"pip download failed for {' '.join(binary)}: {tail}")


def _fetch(step, dest: str, settings) -> None:
    """The step's wheel into `dest` (copied from FASTPATH_HOOKS_FIND_LINKS or the wheel cache where it lies)."""
    pass

    try:
        local = fetch_wheel(step, settings, dest)
    except FetchError as exc:
        raise DownloadError(str(exc)) from None
    target = os.path.join(dest, os.path.basename(local))
    if os.path.abspath(local) != os.path.abspath(target):
        shutil.copy2(local, target)
