"""What earlier runs remember, in the cache (facts/memory.py reads it): verdicts, warm verdicts, checks.

The warm path (`environment_signature`, `get_warm`) runs at every first kernel import: only what a Python process
has anyway is imported. `VerdictCache`: per kernel, the KEEP newest verdicts under fingerprints of its facts
(failures expire); good outcomes under the whole environment's signature, the WARM_KEEP newest (nodes sharing the
cache do not evict each other). `recall`/`remember`: a passed check child keyed on all it read, so a later
environment with the same key runs none (a torch import saved: 13-43 s on the H200).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

from .. import events
from .._names import (JOURNAL, STATE_DIR_NAME, VERSION, cache_root, cache_root_from_environ, environment_key,
                      find_links_dir, find_links_given, sha256_hex)


# Variables besides FASTPATH_HOOKS_* whose value can change a decision (probe.py reads them).
SIGNATURE_VARIABLES = ("FLA_TILELANG", "FLA_FLASH_QLA", "CUDA_HOME", "CUDA_PATH", "PATH", "CUDA_VISIBLE_DEVICES",
                       "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "XDG_CACHE_HOME", "HOME")
# Where the kernel driver describes the GPUs without initialising CUDA/ROCm (cheap text files).
_GPU_INFO = (("/proc/driver/nvidia/gpus", "information"), ("/sys/class/kfd/kfd/topology/nodes", "name"))
SCHEMA = 2       # of every verdict file (VerdictCache writes them)


def signature_environ(environ=None, *, target: str | None = None) -> tuple:
    """The variables a decision can depend on, captured before a decision sets any (`target`: `--target`)."""
    env = os.environ if environ is None else environ
    captured = {k: v for k, v in env.items() if k.startswith("FASTPATH_HOOKS_") or k in SIGNATURE_VARIABLES}
    if target is not None:
        captured["FASTPATH_HOOKS_TARGET"] = target
    return tuple(sorted(captured.items()))


def environment_signature(captured: tuple) -> str | None:
    """Everything a kernel decision depends on, read without probing (site-packages' mtime catches a
    same-version reinstall such as another CUDA build of torch). None while an install is pending (a journal)."""
    env = dict(captured)
    parts: list = [VERSION, os.path.realpath(sys.prefix), sys.version, sys.implementation.name, captured,
                   (os.uname().nodename, os.uname().machine)]
    for base, leaf in _GPU_INFO:
        try:
            nodes = sorted(os.listdir(base))
        except OSError:
            continue
        for node in nodes:
            parts.append((node, _read_small(os.path.join(base, node, leaf))))
    parts.append(os.path.isfile("/usr/local/cuda/bin/nvcc"))
    parts.append(_stat_key(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "facts",
                                        "pins.json")))
    if env.get("FASTPATH_HOOKS_PINS", "").strip():
        parts.append(_stat_key(os.path.abspath(os.path.expanduser(env["FASTPATH_HOOKS_PINS"].strip()))))
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
        path = find_links_dir(location)
        if path is None:
            continue
        try:
            parts.append((location, sorted(n for n in os.listdir(path) if n.endswith((".whl", ".tar.gz", ".zip")))))
        except OSError:
            parts.append((location, None))
    return sha256_hex(repr(parts).encode("utf-8", "surrogateescape"))[:32]


def load_verdicts(path: str | None) -> dict:
    if path is None:
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("kernels"), dict):
        return {}
    return {k: v for k, v in data["kernels"].items() if isinstance(v, dict)}


def _warm_entry(entries: dict, kernel: str) -> dict | None:
    entry = entries.get(kernel)
    if not isinstance(entry, dict) or not isinstance(entry.get("reason"), str) or \
            entry.get("posed") not in (None, "cuda", "xpu"):
        return None
    pairs = entry.get("env") or []
    ok = isinstance(pairs, list) and all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
                                         for p in pairs)
    return entry if ok else None


def get_warm(captured: tuple, kernel: str, signature: str) -> dict | None:
    """The good verdict recorded for `kernel` under `signature` (the cache named in `captured`, no settings)."""
    return VerdictCache(root=cache_root_from_environ(dict(captured)), retry_after=0).get_warm(kernel, signature)


def _stat_key(path: str):
    with contextlib.suppress(OSError):
        st = os.stat(path)
        return st.st_mtime_ns, st.st_size
    return None


def _read_small(path: str) -> str | None:
    with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read(4096)
    return None


GOOD = "good"
FAILED = "failed"
KEEP = 16                    # fingerprints kept per kernel (GPU types, versions): the most recently written
WARM_KEEP = 64               # warm signatures kept (nodes sharing the cache directory): the most recently written
_WRITE_LOCK_TIMEOUT = 30.0   # a write holds it for milliseconds


class VerdictCache:
    def __init__(self, settings=None, *, root: str | None = None, retry_after: float | None = None):
        self.path = os.path.join(root if root is not None else cache_root(settings), "verdicts",
                                 environment_key()) + ".json"
        self.warm_dir = self.path[:-len(".json")] + ".warm"
        self.retry_after = retry_after if retry_after is not None else settings.retry_after

    def get(self, kernel: str, fingerprint: str, now: float | None = None) -> dict | None:
        entry = load_verdicts(self.path).get(kernel, {}).get(fingerprint)
        if not isinstance(entry, dict) or entry.get("state") not in (GOOD, FAILED) or \
                not isinstance(entry.get("ts"), (int, float)) or not isinstance(entry.get("reason"), str):
            return None
        if entry["state"] == FAILED and (time.time() if now is None else now) - entry["ts"] > self.retry_after:
            return None   # failures expire: a restart retries
        return dict(entry, fingerprint=fingerprint)

    def get_warm(self, kernel: str, signature: str) -> dict | None:
        return _warm_entry(load_verdicts(self._warm_path(signature)), kernel)

    def _warm_path(self, signature: str) -> str | None:
        return os.path.join(self.warm_dir, signature + ".json") if signature.isalnum() else None

    def record(self, kernel: str, *, verdict: tuple | None = None, warm: tuple | None = None) -> bool:
        """Under one lock: `verdict` = (fingerprint, state, reason) drops the warm verdicts earned under the same
        (or unknown) facts; then `warm` = (signature, entry), a good outcome for the next start."""
        def change():
            if verdict is not None:
                self._put(kernel, *verdict)
            if warm is not None:
                self._put_warm(kernel, *warm)

        return locked(self.path, change) if verdict is not None or warm is not None else True

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
        path = self._warm_path(signature)
        if path is None:
            return
        warm = load_verdicts(path)
        warm[kernel] = dict(entry, ts=time.time())
        _write(path, warm)
        names = _signature_files(self.warm_dir)
        if len(names) > WARM_KEEP:  # the least recently written signatures go
            def written(name):
                return max(map(_ts, load_verdicts(os.path.join(self.warm_dir, name)).values()), default=float("-inf"))

            for name in sorted(names, key=written)[:len(names) - WARM_KEEP]:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.warm_dir, name))

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


def locked(path: str, change) -> bool:
    """`change()` under the short lock of `path`: writers in several processes (ranks, nodes) never drop each
    other's entries. False where the cache is read-only or busy (said at debug): only a re-check next time."""
    import filelock

    from .locks import file_lock

    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with file_lock(path + ".lock", timeout=_WRITE_LOCK_TIMEOUT):
            change()
        return True
    except (OSError, filelock.Timeout) as exc:
        events.debug(f"not written ({path}): {exc}")
        return False


def _ts(entry) -> float:
    value = entry.get("ts") if isinstance(entry, dict) else None
    return value if isinstance(value, (int, float)) else float("-inf")


def _newest(keyed: dict, keep: int) -> dict:
    """The `keep` most recently written entries, newest first (unreadable ones dropped)."""
    return dict(sorted(((k, v) for k, v in keyed.items() if isinstance(v, dict)), key=lambda kv: _ts(kv[1]),
                       reverse=True)[:keep])


def _write(path: str, kernels: dict) -> None:
    from .transaction import atomic_write_json

    atomic_write_json(path, {"schema": SCHEMA, "prefix": os.path.realpath(sys.prefix), "kernels": kernels})


def _signature_files(directory: str) -> list:
    """The warm verdict files (not atomic_write's temporary `.tmp-*` ones)."""
    try:
        return [n for n in os.listdir(directory) if n.endswith(".json") and not n.startswith(".")]
    except OSError:
        return []


SUBDIR = "verified"
_SCRATCH = ("TMPDIR", "TEMP", "TMP")   # the install's own scratch directory: another one every time


def _mark(spec, env_extra, digest: str, versions: dict, extra: str = "", gpus=()) -> str:
    world = {
        "files": digest,
        "loaded": sorted(f"{name}=={version}" for name, version in versions.items()),
        "python": [sys.version, sys.platform, os.uname().machine, os.uname().nodename],
        "modules": [list(spec.verify_modules), list(spec.verify_attributes)],
        "env": sorted(f"{k}={v}" for k, v in env_extra if k not in _SCRATCH),
        "pythonpath": os.environ.get("PYTHONPATH", ""),
    }
    if extra:   # what else the remembered verification ran (a decision's check)
        world["extra"] = extra
    if gpus:    # the GPUs it was checked on: another GPU type sharing the cache checks again
        world["gpus"] = sorted(gpus)
    return sha256_hex(json.dumps(world, sort_keys=True).encode())[:32]


def _here(names) -> dict:
    """The versions of these distributions in this environment (None: not installed)."""
    from ..facts.distributions import canonical_name, scan

    found, _ = scan()
    return {name: (found[canonical_name(name)].version if canonical_name(name) in found else None) for name in names}


def _path(root: str, kernel: str) -> str:
    return os.path.join(root, SUBDIR, f"{kernel}.json")


# what a remembered check is keyed on: what it ran (shapes, dtype, variant, its length, tolerances), not how its
# JIT was shared out, the length Triton tuned at (fla's kernels never specialise on it), whether it waited for a
# first call, or the words saying where the shapes came from
UNKEYED = ("jit", "tune_seq", "first_call", "shapes_from", "compute")


def check_key(check) -> str:
    """A decision's gated-delta-rule check as part of the memory's key ("" for none); a first call's on the warm
    path too (engine/first_call.py): plain json, nothing imported."""
    def plain(value):
        if hasattr(value, "items"):
            return {k: plain(v) for k, v in value.items()}
        return [plain(v) for v in value] if isinstance(value, (list, tuple)) else value

    if not check:
        return ""
    return json.dumps({k: v for k, v in plain(check).items() if k not in UNKEYED}, sort_keys=True, default=str)


def installed_digest(distributions) -> str | None:
    """Of the installed files as their RECORD lists them (dist-info, bytecode left out): one wheel, one digest.
    Files outside site-packages (console scripts: their shebang names this venv's python) left out too."""
    import csv

    from ..facts.distributions import scan   # not on the warm path

    found, _ = scan()
    rows = []
    for name in sorted(n for n in distributions if n in found):
        with contextlib.suppress(OSError), open(os.path.join(found[name].path, "RECORD"), encoding="utf-8",
                                                errors="replace") as fh:
            rows += [f"{name}:{row[0]},{row[1]}" for row in csv.reader(fh)
                     if len(row) >= 2 and row[1] and ".dist-info/" not in row[0] and not row[0].endswith(".pyc")
                     and not row[0].startswith("..")]
    return sha256_hex("\n".join(sorted(rows)).encode()) if rows else None


def recall(root: str | None, spec, env_extra=(), extra: str = "", gpus=()) -> dict | None:
    from ..facts.memory import read_records   # not on the warm path

    data = read_records(_path(root, spec.name)) if root else None
    digest = installed_digest(spec.distributions) if data else None
    if digest is None:
        return None
    for names in {tuple(e.get("distributions") or ()) for e in data.values()}:
        entry = data.get(_mark(spec, env_extra, digest, _here(names), extra, gpus))
        if entry is not None:
            return entry
    return None


def _pass_key(spec, check, gpus) -> str | None:
    """What a gated-delta-rule pass computed with: the kernel's installed files, the versions of the distributions
    its check names (`compute`: its own, its backends', torch's, triton's), the GPUs, the check itself."""
    digest = installed_digest(spec.distributions)
    if digest is None:
        return None
    from ..facts.distributions import installed_versions   # not on the warm path

    versions = installed_versions(check.get("compute") or ())
    world = [spec.name, digest, sorted(f"{k}=={v}" for k, v in versions.items()), sorted(gpus), check_key(check)]
    return sha256_hex(json.dumps(world).encode())[:32]


def recall_pass(root: str | None, spec, check, gpus=()) -> dict | None:
    """A remembered passed gated-delta-rule check with exactly these facts, files and versions (and so its import)."""
    from ..facts.memory import read_records   # not on the warm path

    data = read_records(os.path.join(root, SUBDIR, f"{spec.name}.passes.json")) if root else None
    key = _pass_key(spec, check, gpus) if data else None
    return data.get(key) if key else None


def remember_pass(root: str | None, spec, check, gpus, seconds: float) -> None:
    key = _pass_key(spec, check, gpus) if root else None
    if key is not None:
        update_records(os.path.join(root, SUBDIR, f"{spec.name}.passes.json"), {key: {
            "check": {k: v for k, v in check.items() if k in ("shapes", "dtype", "final_state", "varlen")},
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": round(seconds, 2)}})


def forget(root: str | None) -> None:
    """`doctor --refresh`: the next install of each kernel checks it again."""
    if root:
        import shutil

        shutil.rmtree(os.path.join(root, SUBDIR), ignore_errors=True)


def remember(root: str | None, spec, env_extra, loaded: dict, seconds: float, extra: str = "", gpus=()) -> None:
    """A passed check, keyed on the names of the distributions it `loaded` (versions read here, as recall does)."""
    digest = installed_digest(spec.distributions) if root else None
    if digest is not None:
        update_records(_path(root, spec.name), {_mark(spec, env_extra, digest, _here(sorted(loaded)), extra, gpus): {
            "distributions": sorted(loaded), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds": round(seconds, 2)}})


def update_records(path: str, entries: dict) -> None:
    """Merge `entries` into the keyed-record file `path`."""
    from ..facts.memory import read_records
    from .transaction import atomic_write_json

    locked(path, lambda: atomic_write_json(path, {**read_records(path), **entries}))
