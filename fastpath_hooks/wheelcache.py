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

import json
import os

SUBDIR = "wheels"
LABEL = "fph"
SIDECAR = ".json"
_LOCK_TIMEOUT = 120.0   # a store holds it for a copy of one wheel


def directory(root: str) -> str:
    return os.path.join(root, SUBDIR)


# -- keys (pure) -----------------------------------------------------------------------------

def _public(version: str) -> str:
    return version.split("+", 1)[0]


def toolkit_tag(cuda: str | None, hip: str | None) -> str:
    """cu130 for CUDA 13.0, rocm64 for HIP 6.4 (major and minor, as torch's own wheel labels)."""
    if cuda:
        return "cu" + "".join(cuda.split(".")[:2])
    if hip:
        return "rocm" + "".join(hip.split(".")[:2])
    return "cpu"


def arch_token(arch: str) -> str:
    return arch.replace("_", "").lower()


def key_prefix(*, torch: str, cuda: str | None, hip: str | None, abi: str) -> str:
    """The label's fixed part: `fph.torch2.11.0.cu130.abi1` (abi: TRUE/FALSE, the cxx11 ABI flag)."""
    return ".".join((LABEL, "torch" + _public(torch).lower(), toolkit_tag(cuda, hip), "abi1" if abi == "TRUE" else "abi0"))


def label(*, torch: str, cuda: str | None, hip: str | None, abi: str, archs) -> str:
    """The local version label of a built wheel; archs `("all",)` for an unrestricted build."""
    return key_prefix(torch=torch, cuda=cuda, hip=hip, abi=abi) + "." + ".".join(arch_token(a) for a in archs)


def compute_capability(arch: str) -> tuple | None:
    """sm_90 -> (9, 0), sm_121 -> (12, 1); None for anything else."""
    digits = arch[3:] if arch.startswith("sm_") else arch[2:] if arch.startswith("sm") else ""
    if len(digits) < 2 or not digits.isdigit():
        return None
    return int(digits[:-1]), int(digits[-1])


def pair_for(gpu: str, codes) -> str | None:
    """The code in `codes` whose binary runs on `gpu`: ROCm gfx archs exactly; CUDA cubins run on
    their own major with an equal or higher minor (sm_80 code runs on sm_86 and sm_89)."""
    if gpu.startswith("gfx"):
        return gpu if gpu in codes else None
    want = compute_capability(gpu)
    if want is None:
        return None
    best = None
    for code in codes:
        cc = compute_capability(code)
        if cc is not None and cc[0] == want[0] and cc[1] <= want[1] and (best is None or cc[1] > best[1]):
            best = cc
    return None if best is None else f"sm_{best[0]}{best[1]}"


def fits(filename: str, *, distribution: str, version: str, torch: str, cuda: str | None, hip: str | None,
         abi: str, python: str, arch: str, gpus, all_codes=()) -> bool:
    """A built wheel (fph label) that runs here: same distribution and version, same key, this
    Python and platform, and code for every visible GPU (`all_codes`: what an `all` build holds)."""
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
    from packaging.version import InvalidVersion

    try:
        name, ver, _, tags = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion):
        return False
    if canonicalize_name(name) != canonicalize_name(distribution) or ver.public != _public(version) or not ver.local:
        return False
    prefix = key_prefix(torch=torch, cuda=cuda, hip=hip, abi=abi) + "."
    if not ver.local.startswith(prefix):
        return False
    have = ver.local[len(prefix):].split(".")
    py = "cp" + "".join(python.split(".")[:2])
    if not any(t.interpreter == py and t.platform.endswith("_" + arch) and t.platform.startswith(("linux_", "manylinux"))
               for t in tags):
        return False
    codes = set(all_codes) if "all" in have else {(f"sm_{a[2:]}" if a.startswith("sm") else a) for a in have}
    return bool(gpus) and all(pair_for(g, codes) is not None for g in gpus)


# -- the directory ----------------------------------------------------------------------------

def listing(root: str | None) -> tuple:
    """File names of the complete entries (wheel + sidecar of the right size). Others are left
    out (an interrupted store, a truncated file, a sidecar that is not ours), reported at debug."""
    if not root:
        return ()
    where = directory(root)
    try:
        names = os.listdir(where)
    except OSError:
        return ()
    out = []
    for name in sorted(names):
        if not name.endswith(".whl"):
            continue
        problem = _problem(os.path.join(where, name))
        if problem:
            from . import events

            events.debug(f"wheel cache: ignoring {name}: {problem}")
            continue
        out.append(name)
    return tuple(out)


def _sidecar(path: str) -> dict | None:
    try:
        with open(path + SIDECAR, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _problem(path: str) -> str | None:
    meta = _sidecar(path)
    if meta is None:
        return "no readable sidecar (an interrupted store?)"
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        return f"unreadable: {exc}"
    if meta.get("size") != size or not isinstance(meta.get("sha256"), str):
        return f"size {size} differs from the recorded {meta.get('size')} (a partial or damaged file)"
    return None


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
        meta = _sidecar(path) or {}
        try:
            size = os.path.getsize(path)
        except OSError:
            size = None
        out.append({"file": name, "path": path, "size": size, "sha256": meta.get("sha256"),
                    "distribution": meta.get("distribution"), "version": meta.get("version"),
                    "origin": meta.get("origin"), "key": meta.get("key") or {}, "log": meta.get("log"),
                    "ok": _problem(path) is None, "problem": _problem(path)})
    return out


def sha256_of(path: str) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def recorded_sha256(path: str) -> str | None:
    """The sha256 a sidecar next to `path` records (a cache entry, or a wheel `build --dest` wrote)."""
    meta = _sidecar(path)
    value = meta.get("sha256") if meta else None
    return value if isinstance(value, str) and len(value) == 64 else None


def store(root: str, wheel: str, *, meta: dict, filename: str | None = None) -> str:
    """Copy `wheel` into the cache as `filename` (default its own name), atomically, under the
    cache's lock; return the cached path. The sidecar (meta + size + sha256) is written last."""
    import shutil
    import tempfile

    from .state import atomic_write_json, file_lock

    where = directory(root)
    os.makedirs(where, exist_ok=True)
    name = filename or os.path.basename(wheel)
    target = os.path.join(where, name)
    with file_lock(os.path.join(where, ".lock"), timeout=_LOCK_TIMEOUT):
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".whl", dir=where)
        try:
            with os.fdopen(fd, "wb") as out, open(wheel, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
                out.flush()
                os.fsync(out.fileno())
            record = dict(meta, file=name, size=os.path.getsize(tmp), sha256=sha256_of(tmp))
            try:
                os.unlink(target + SIDECAR)   # never a new wheel under an old sidecar
            except FileNotFoundError:
                pass
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        atomic_write_json(target + SIDECAR, record)
    return target


def export(path: str, dest: str) -> str:
    """Copy a cache entry (wheel + sidecar) into a wheelhouse directory, atomically."""
    import shutil
    import tempfile

    os.makedirs(dest, exist_ok=True)
    target = os.path.join(dest, os.path.basename(path))
    for src, dst in ((path, target), (path + SIDECAR, target + SIDECAR)):
        if not os.path.exists(src):
            continue
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=dest)
        os.close(fd)
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    return target


def clear(root: str, distribution: str | None = None) -> list:
    """Remove every entry (or those of one distribution), under the lock; the removed file names."""
    from packaging.utils import canonicalize_name

    from .state import file_lock

    where = directory(root)
    if not os.path.isdir(where):
        return []
    want = canonicalize_name(distribution) if distribution else None
    removed = []
    with file_lock(os.path.join(where, ".lock"), timeout=_LOCK_TIMEOUT):
        for name in sorted(os.listdir(where)):
            if name.startswith(".lock"):  # the lock (and a no-flock holder file) stay: a store may wait on them
                continue
            base = name[: -len(SIDECAR)] if name.endswith(".whl" + SIDECAR) else name
            if want is not None:
                if not base.endswith(".whl") or canonicalize_name(base.split("-", 1)[0]) != want:
                    continue
            try:
                os.unlink(os.path.join(where, name))
            except OSError:
                continue
            if name.endswith(".whl"):
                removed.append(name)
    return removed
