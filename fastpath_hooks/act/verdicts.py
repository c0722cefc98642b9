"""The verdict cache: what was verified (or failed) per kernel, and the warm verdicts.

Per user (FASTPATH_HOOKS_CACHE_DIR, default the user cache dir), keyed by environment.

- kernel verdicts (`<env>.json`): per kernel, verdicts under fingerprints of the probed facts
  that kernel depends on (the interpreter, torch/triton/transformers, the GPU archs and that
  kernel's own distributions), so installing fla does not invalidate tilelang's verdict; the
  KEEP most recent per kernel. Failures expire after `retry_after` seconds so restarts do not
  hammer the index.
- warm verdicts (`<env>.warm/<signature>.json`, read by warm.py): good outcomes under the whole
  environment's signature; a match skips the probe, the policy and every subprocess. One small
  file per signature, so the warm path reads what it needs however many nodes share the cache
  directory; the WARM_KEEP most recent are kept.

Nodes or GPU types sharing one cache directory therefore do not evict each other. Every write
happens under one short lock and replaces a file atomically; `record` writes a verdict and its
warm verdict in one go. A changed fingerprint/signature misses; a corrupt or unreadable file is
ignored (and rewritten at the next verdict), never fatal.
"""

from __future__ import annotations

import os
import sys
import time

from .._environ import cache_root, environment_key
from .warm import SCHEMA, load_verdicts, warm_dir, warm_entry, warm_path

GOOD = "good"
FAILED = "failed"
KEEP = 16                    # fingerprints kept per kernel (GPU types, versions): the most recently written
WARM_KEEP = 64               # warm signatures kept (nodes sharing the cache directory): the most recently written
_WRITE_LOCK_TIMEOUT = 30.0   # a write holds it for milliseconds


class VerdictCache:
    def __init__(self, settings=None, *, root: str | None = None, retry_after: float | None = None):
        root = root if root is not None else cache_root(settings)
        self.path = os.path.join(root, "verdicts", environment_key()) + ".json"
        self.warm_dir = warm_dir(root)
        self.root = root
        self.retry_after = retry_after if retry_after is not None else settings.retry_after

    def get(self, kernel: str, fingerprint: str, now: float | None = None) -> dict | None:
        entry = load_verdicts(self.path).get(kernel, {}).get(fingerprint)
        if not isinstance(entry, dict) or entry.get("state") not in (GOOD, FAILED):
            return None
        if not isinstance(entry.get("ts"), (int, float)) or not isinstance(entry.get("reason"), str):
            return None
        if entry["state"] == FAILED and (time.time() if now is None else now) - entry["ts"] > self.retry_after:
            return None
        return dict(entry, fingerprint=fingerprint)

    def get_warm(self, kernel: str, signature: str) -> dict | None:
        return warm_entry(load_verdicts(warm_path(self.root, signature)), kernel)

    def record(self, kernel: str, *, verdict: tuple | None = None, warm: tuple | None = None) -> bool:
        """Write, under one lock: `verdict` = (fingerprint, state, reason) - the warm verdicts earned
        under the same facts (or unknown ones) are dropped, to be re-earned - and then `warm` =
        (signature, entry): a good outcome for the next start (`entry` may name the `fingerprint`
        of the verdict it was earned under)."""
        def change():
            if verdict is not None:
                self._put(kernel, *verdict)
            if warm is not None:
                self._put_warm(kernel, *warm)

        return self._locked(change) if verdict is not None or warm is not None else True

    def _put(self, kernel: str, fingerprint: str, state: str, reason: str) -> None:
        kernels = load_verdicts(self.path)
        keyed = kernels.setdefault(kernel, {})
        keyed[fingerprint] = {"state": state, "reason": reason, "ts": time.time()}
        kernels[kernel] = _newest(keyed, KEEP)
        _write(self.path, kernels)
        for name in _signature_files(self.warm_dir):
            path = os.path.join(self.warm_dir, name)
            warm = load_verdicts(path)
            old = warm.get(kernel)
            if old is not None and old.get("fingerprint") in (None, fingerprint):
                del warm[kernel]
                if warm:
                    _write(path, warm)
                else:
                    os.unlink(path)

    def _put_warm(self, kernel: str, signature: str, entry: dict) -> None:
        path = warm_path(self.root, signature)
        if path is None:
            return
        warm = load_verdicts(path)
        warm[kernel] = dict(entry, ts=time.time())
        _write(path, warm)
        names = _signature_files(self.warm_dir)
        if len(names) > WARM_KEEP:  # the least recently written signatures go
            def written(name):
                stamps = [e.get("ts") for e in load_verdicts(os.path.join(self.warm_dir, name)).values()]
                return max((t for t in stamps if isinstance(t, (int, float))), default=float("-inf"))

            for name in sorted(names, key=written)[:len(names) - WARM_KEEP]:
                try:
                    os.unlink(os.path.join(self.warm_dir, name))
                except OSError:
                    pass

    def _locked(self, change) -> bool:
        """Read, change, write - under the cache's own short lock, so writers in several
        processes (ranks or nodes recording verdicts at once) never drop each other's entries."""
        import filelock

        from .locks import file_lock

        try:
            with file_lock(self.path + ".lock", timeout=_WRITE_LOCK_TIMEOUT):
                change()
            return True
        except (OSError, filelock.Timeout):
            return False  # a read-only or busy cache only costs a re-check next time

    def entries(self) -> dict:
        """kernel -> its most recently written verdict (with its fingerprint)."""
        return {kernel: dict(entry, fingerprint=key)
                for kernel, keyed in load_verdicts(self.path).items()
                for key, entry in list(_newest(keyed, 1).items())}

    def warm_entries(self) -> dict:
        """kernel -> {signature: warm verdict}."""
        out: dict = {}
        for name in sorted(_signature_files(self.warm_dir)):
            for kernel, entry in load_verdicts(os.path.join(self.warm_dir, name)).items():
                out.setdefault(kernel, {})[name[:-len(".json")]] = entry
        return out

    def forget(self) -> bool:
        import shutil

        shutil.rmtree(self.warm_dir, ignore_errors=True)
        try:
            os.unlink(self.path)
            return True
        except FileNotFoundError:
            return False


def _newest(keyed: dict, keep: int) -> dict:
    """The `keep` most recently written entries, newest first (unreadable ones dropped)."""
    def ts(item):
        value = item[1].get("ts")
        return value if isinstance(value, (int, float)) else float("-inf")

    return dict(sorted(((k, v) for k, v in keyed.items() if isinstance(v, dict)), key=ts, reverse=True)[:keep])


def _write(path: str, kernels: dict) -> None:
    from .files import atomic_write_json

    atomic_write_json(path, {"schema": SCHEMA, "prefix": os.path.realpath(sys.prefix), "kernels": kernels})


def _signature_files(directory: str) -> list:
    """The warm verdict files (not atomic_write's temporary `.tmp-*` ones)."""
    try:
        return [n for n in os.listdir(directory) if n.endswith(".json") and not n.startswith(".")]
    except OSError:
        return []
