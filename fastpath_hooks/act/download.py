"""`fastpath-hooks download`'s act part: a plan's wheels fetched into a wheelhouse.

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
    from .runner import run

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
    from .fetch import FetchError, fetch_wheel

    try:
        local = fetch_wheel(step, settings, dest)
    except FetchError as exc:
        raise DownloadError(str(exc)) from None
    target = os.path.join(dest, os.path.basename(local))
    if os.path.abspath(local) != os.path.abspath(target):
        shutil.copy2(local, target)
