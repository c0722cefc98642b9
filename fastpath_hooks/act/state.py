"""Where per-environment state lives: the install lock, the journal, the verdict cache.

The lock and the journal sit inside the environment they protect (next to
site-packages), so every process and every user of a shared environment - NFS
included - sees the same ones. The verdict cache is per user
(FASTPATH_HOOKS_CACHE_DIR, default the user cache dir), keyed by environment.

The warm path (`signature_environ`, `environment_signature`,
`VerdictCache.from_environ`) runs at every first kernel import of every
process, so it imports only what a Python process has anyway (no settings, pins,
probe, platformdirs or packaging; the tiny `links` when FASTPATH_HOOKS_FIND_LINKS is
set) and reads a handful of directories.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from .._environ import cache_root, cache_root_from_environ, environment_key, find_links_given

JOURNAL = "journal.json"        # written by transaction.py while an install runs
STATE_DIR_NAME = ".fastpath-hooks"
# Variables besides FASTPATH_HOOKS_* whose value can change a decision (probe.py reads them).
SIGNATURE_VARIABLES = ("FLA_TILELANG", "CUDA_HOME", "CUDA_PATH", "PATH", "CUDA_VISIBLE_DEVICES",
                       "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "XDG_CACHE_HOME", "HOME")
# Where the kernel driver describes the GPUs without initialising CUDA/ROCm (cheap text files).
_GPU_INFO = (("/proc/driver/nvidia/gpus", "information"), ("/sys/class/kfd/kfd/topology/nodes", "name"))


def environment_state_dir(settings) -> str:
    """`.fastpath-hooks/` beside site-packages when writable, else under the cache root."""
    from ..facts.distributions import site_packages

    site = site_packages()
    if os.access(site, os.W_OK):
        return os.path.join(site, STATE_DIR_NAME)
    return os.path.join(cache_root(settings), "envs", environment_key())


def environment_lock(settings):
    """One cross-process lock per environment (see file_lock)."""
    directory = environment_state_dir(settings)
    os.makedirs(directory, exist_ok=True)
    return file_lock(os.path.join(directory, "install.lock"), timeout=settings.lock_timeout)


def file_lock(path: str, *, timeout: float):
    """The one way fastpath-hooks takes a cross-process lock.

    flock where the filesystem supports it (filelock.FileLock: the OS releases it if the
    holder dies). Where it does not (Lustre without `-o flock`, some NFS), a lock file that
    names its holder and is recovered from a dead one (softlock.HolderLock, at `path`.holder),
    said once per filesystem. Either way: acquire(timeout=...)/release(), a context manager,
    `.lock_file`, filelock.Timeout on timeout.
    """
    from . import softlock

    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    if softlock.flock_works(directory):
        import filelock

        return filelock.FileLock(path, timeout=timeout)
    from .. import events

    events.status(f"{directory} does not support flock (Lustre without -o flock?); using a lock file "
                  f"with stale-holder recovery", once=f"no-flock:{os.stat(directory).st_dev}")  # once per filesystem
    return softlock.HolderLock(path + ".holder", timeout=timeout)


def atomic_write_json(path: str, data) -> None:
    import tempfile

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
SCHEMA = 2
KEEP = 16                    # fingerprints kept per kernel (GPU types, versions): the most recently written
WARM_KEEP = 64               # warm signatures kept (nodes sharing the cache directory): the most recently written
_WRITE_LOCK_TIMEOUT = 30.0   # a write holds it for milliseconds


class VerdictCache:
    """What was verified (or failed) per kernel, and the warm verdicts.

    `kernels` (`<env>.json`): per kernel, verdicts under fingerprints of the probed facts
    that kernel depends on (the interpreter, torch/triton/transformers, the GPU archs and
    that kernel's own distributions), so installing fla does not invalidate tilelang's
    verdict; the KEEP most recent per kernel. Failures expire after `retry_after` seconds
    so restarts do not hammer the index.
    warm verdicts (`<env>.warm/<signature>.json`): good outcomes under the whole
    environment's signature; a match skips the probe, the policy and every subprocess.
    One small file per signature, so the warm path reads what it needs however many nodes
    share the cache directory; the WARM_KEEP most recent are kept.
    Nodes or GPU types sharing one cache directory therefore do not evict each other. Every
    write happens under one lock and replaces a file atomically. A changed
    fingerprint/signature misses; a corrupt or unreadable file is ignored (and rewritten at
    the next verdict), never fatal.
    """

    def __init__(self, settings=None, *, root: str | None = None, retry_after: float | None = None):
        root = root if root is not None else cache_root(settings)
        base = os.path.join(root, "verdicts", environment_key())
        self.path, self.warm_dir = base + ".json", base + ".warm"
        self.retry_after = retry_after if retry_after is not None else settings.retry_after

    @classmethod
    def from_environ(cls, captured: tuple) -> "VerdictCache":
        """The cache FASTPATH_HOOKS_CACHE_DIR names (in `signature_environ()`), without parsing the settings."""
        return cls(root=cache_root_from_environ(dict(captured)), retry_after=0.0)

    @staticmethod
    def _load(path: str) -> dict:
        """{kernel: {key: entry}} of a schema-2 file (whatever else is in it dropped), or {}."""
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError, UnicodeDecodeError):
            return {}
        if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("kernels"), dict):
            return {}
        return {k: v for k, v in data["kernels"].items() if isinstance(v, dict)}

    def _warm_path(self, signature: str) -> str | None:
        return os.path.join(self.warm_dir, signature + ".json") if signature.isalnum() else None

    def get(self, kernel: str, fingerprint: str, now: float | None = None) -> dict | None:
        entry = self._load(self.path).get(kernel, {}).get(fingerprint)
        if not isinstance(entry, dict) or entry.get("state") not in (GOOD, FAILED):
            return None
        if not isinstance(entry.get("ts"), (int, float)) or not isinstance(entry.get("reason"), str):
            return None
        if entry["state"] == FAILED and (time.time() if now is None else now) - entry["ts"] > self.retry_after:
            return None
        return dict(entry, fingerprint=fingerprint)

    def get_warm(self, kernel: str, signature: str) -> dict | None:
        path = self._warm_path(signature)
        entry = self._load(path).get(kernel) if path else None
        if not isinstance(entry, dict) or not isinstance(entry.get("reason"), str):
            return None
        if entry.get("posed") not in (None, "cuda", "xpu"):
            return None
        pairs = entry.get("env") or []
        if not (isinstance(pairs, list) and all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
                                                for p in pairs)):
            return None
        return entry

    def put(self, kernel: str, fingerprint: str, state: str, reason: str) -> bool:
        """Record a verdict; the warm verdicts earned under the same facts (or unknown ones) are
        dropped, to be re-earned."""
        def change():
            kernels = self._load(self.path)
            keyed = kernels.setdefault(kernel, {})
            keyed[fingerprint] = {"state": state, "reason": reason, "ts": time.time()}
            kernels[kernel] = _newest(keyed, KEEP)
            _write(self.path, kernels)
            for name in _signature_files(self.warm_dir):
                path = os.path.join(self.warm_dir, name)
                warm = self._load(path)
                old = warm.get(kernel)
                if old is not None and old.get("fingerprint") in (None, fingerprint):
                    del warm[kernel]
                    if warm:
                        _write(path, warm)
                    else:
                        os.unlink(path)

        return self._locked(change)

    def put_warm(self, kernel: str, signature: str, entry: dict) -> bool:
        """`entry` may name the kernel verdict's `fingerprint` it was earned under."""
        path = self._warm_path(signature)
        if path is None:
            return False

        def change():
            warm = self._load(path)
            warm[kernel] = dict(entry, ts=time.time())
            _write(path, warm)
            names = _signature_files(self.warm_dir)
            if len(names) > WARM_KEEP:  # the least recently written signatures go
                def written(name):
                    stamps = [e.get("ts") for e in self._load(os.path.join(self.warm_dir, name)).values()]
                    return max((t for t in stamps if isinstance(t, (int, float))), default=float("-inf"))

                for name in sorted(names, key=written)[:len(names) - WARM_KEEP]:
                    try:
                        os.unlink(os.path.join(self.warm_dir, name))
                    except OSError:
                        pass

        return self._locked(change)

    def _locked(self, change) -> bool:
        """Read, change, write - under the cache's own short lock, so writers in several
        processes (ranks or nodes recording verdicts at once) never drop each other's entries."""
        import filelock

        try:
            with file_lock(self.path + ".lock", timeout=_WRITE_LOCK_TIMEOUT):
                change()
            return True
        except (OSError, filelock.Timeout):
            return False  # a read-only or busy cache only costs a re-check next time

    def entries(self) -> dict:
        """kernel -> its most recently written verdict (with its fingerprint)."""
        return {kernel: dict(entry, fingerprint=key)
                for kernel, keyed in self._load(self.path).items()
                for key, entry in list(_newest(keyed, 1).items())}

    def warm_entries(self) -> dict:
        """kernel -> {signature: warm verdict}."""
        out: dict = {}
        for name in sorted(_signature_files(self.warm_dir)):
            for kernel, entry in self._load(os.path.join(self.warm_dir, name)).items():
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
    atomic_write_json(path, {"schema": SCHEMA, "prefix": os.path.realpath(sys.prefix), "kernels": kernels})


def _signature_files(directory: str) -> list:
    """The warm verdict files (not atomic_write_json's temporary `.tmp-*` ones)."""
    try:
        return [n for n in os.listdir(directory) if n.endswith(".json") and not n.startswith(".")]
    except OSError:
        return []


# -- the warm signature ----------------------------------------------------------------------

def signature_environ(environ=None) -> tuple:
    """The environment variables a decision can depend on, captured before a decision sets any."""
    env = os.environ if environ is None else environ
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith("FASTPATH_HOOKS_") or k in SIGNATURE_VARIABLES))


def environment_signature(captured: tuple) -> str | None:
    """Everything a kernel decision depends on, read without probing; None while an install
    is pending (a journal: running now, or killed half-way - the slow path recovers it).

    Covered: fastpath-hooks' version and pins files, the interpreter, the variables in
    `captured`, this host and its GPUs as the driver lists them, and every distribution on
    sys.path (dist-info names carry versions; site-packages' mtime catches a same-version
    reinstall such as another CUDA build of torch), the local wheelhouse's file names.
    """
    from .._names import VERSION as __version__

    env = dict(captured)
    parts: list = [__version__, os.path.realpath(sys.prefix), sys.version, sys.implementation.name, captured]
    uname = os.uname() if hasattr(os, "uname") else None
    parts.append((uname.nodename, uname.machine) if uname else None)
    for base, leaf in _GPU_INFO:
        try:
            nodes = sorted(os.listdir(base))
        except OSError:
            continue
        for node in nodes:
            parts.append((node, _read_small(os.path.join(base, node, leaf))))
    parts.append(os.path.isfile("/usr/local/cuda/bin/nvcc"))
    pins_files = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "pins.json")]
    if env.get("FASTPATH_HOOKS_PINS", "").strip():
        pins_files.append(os.path.abspath(os.path.expanduser(env["FASTPATH_HOOKS_PINS"].strip())))
    for path in pins_files:
        parts.append(_stat_key(path))
    stdlib = os.path.dirname(os.__file__)
    skip = (stdlib, os.path.join(stdlib, "lib-dynload"))  # the interpreter's own: covered by sys.version
    for entry in sys.path:
        try:
            directory = entry or os.getcwd()
        except OSError:  # the working directory was deleted
            continue
        if directory in skip:
            continue
        try:
            names = os.listdir(directory)
        except OSError:
            parts.append((directory, _stat_key(directory)))
            continue
        if STATE_DIR_NAME in names and os.path.exists(os.path.join(directory, STATE_DIR_NAME, JOURNAL)):
            return None
        dists = sorted(n for n in names if n.endswith((".dist-info", ".egg-info", ".egg-link")) or n.startswith("~"))
        if os.path.basename(directory) in ("site-packages", "dist-packages"):
            parts.append((directory, _stat_key(directory), dists))
        else:  # the script's directory or cwd: only distributions found there matter
            parts.append(dists)
    root = cache_root_from_environ(env)
    if os.path.exists(os.path.join(root, "envs", environment_key(), JOURNAL)):
        return None
    for location in find_links_given(env):
        from ..facts.links import find_links_dir  # only when FIND_LINKS is set

        path = find_links_dir(location)
        if path is None:
            continue
        try:
            parts.append((location, sorted(n for n in os.listdir(path) if n.endswith((".whl", ".tar.gz", ".zip")))))
        except OSError:
            parts.append((location, None))
    return hashlib.sha256(repr(parts).encode("utf-8", "surrogateescape")).hexdigest()[:32]


def _stat_key(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _read_small(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(4096)
    except OSError:
        return None
