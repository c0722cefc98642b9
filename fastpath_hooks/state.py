"""Where per-environment state lives: the install lock, the journal, the verdict cache.

The lock and the journal sit inside the environment they protect (next to
site-packages), so every process and every user of a shared environment - NFS
included - sees the same ones. The verdict cache is per user
(FASTPATH_HOOKS_CACHE_DIR, default the user cache dir), keyed by environment.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time


def environment_key() -> str:
    # sys.executable differs between `python` and a console script in one venv; the prefix does not.
    return hashlib.sha256(os.path.realpath(sys.prefix).encode()).hexdigest()[:16]


def cache_root(settings) -> str:
    if settings.cache_dir:
        return settings.cache_dir
    import platformdirs

    return platformdirs.user_cache_dir("fastpath-hooks", appauthor=False)


def environment_state_dir(settings) -> str:
    """`.fastpath-hooks/` beside site-packages when writable, else under the cache root."""
    from .distributions import site_packages

    site = site_packages()
    if os.access(site, os.W_OK):
        return os.path.join(site, ".fastpath-hooks")
    return os.path.join(cache_root(settings), "envs", environment_key())


def environment_lock(settings):
    """One cross-process lock per environment (flock: the OS releases it if the holder dies)."""
    import filelock

    directory = environment_state_dir(settings)
    os.makedirs(directory, exist_ok=True)
    return filelock.FileLock(os.path.join(directory, "install.lock"), timeout=settings.lock_timeout)


def atomic_write_json(path: str, data) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


GOOD = "good"
FAILED = "failed"


class VerdictCache:
    """What was verified (or failed) per kernel, each under its own fingerprint.

    A kernel's fingerprint covers the interpreter, torch/triton/transformers, the
    GPU archs and that kernel's own distributions, so installing fla does not
    invalidate tilelang's verdict. A changed fingerprint invalidates the entry; a
    corrupt or unreadable file is ignored (and rewritten at the next verdict),
    never fatal; failures expire after `retry_after` seconds so restarts do not
    hammer the index.
    """

    def __init__(self, settings):
        self.path = os.path.join(cache_root(settings), "verdicts", environment_key() + ".json")
        self.retry_after = settings.retry_after

    def _read(self) -> dict:
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError, UnicodeDecodeError):
            return {}
        if not isinstance(data, dict) or not isinstance(data.get("kernels"), dict):
            return {}
        return data

    def get(self, kernel: str, fingerprint: str, now: float | None = None) -> dict | None:
        entry = self._read().get("kernels", {}).get(kernel)
        if not isinstance(entry, dict) or entry.get("fingerprint") != fingerprint:
            return None
        if entry.get("state") not in (GOOD, FAILED) or not isinstance(entry.get("ts"), (int, float)):
            return None
        if entry["state"] == FAILED and (time.time() if now is None else now) - entry["ts"] > self.retry_after:
            return None
        return entry

    def put(self, kernel: str, fingerprint: str, state: str, reason: str) -> bool:
        data = self._read() or {"schema": 1, "kernels": {}}
        data["schema"] = 1
        data["prefix"] = os.path.realpath(sys.prefix)
        data["kernels"][kernel] = {"fingerprint": fingerprint, "state": state, "reason": reason, "ts": time.time()}
        try:
            atomic_write_json(self.path, data)
            return True
        except OSError:
            return False  # a read-only cache only costs a re-check next time

    def entries(self) -> dict:
        return dict(self._read().get("kernels", {}))

    def forget(self) -> bool:
        try:
            os.unlink(self.path)
            return True
        except FileNotFoundError:
            return False
