"""The warm path: the environment's cheap signature, and the good verdict recorded under it.

This runs at every first kernel import of every process, so it imports only what a Python
process has anyway (no settings, pins, probe, platformdirs or packaging; the tiny `links` when
FASTPATH_HOOKS_FIND_LINKS is set) and reads a handful of directories and one small file.
Writing warm verdicts is the verdict cache's job (verdicts.py), under its lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

from .._environ import JOURNAL, STATE_DIR_NAME, cache_root_from_environ, environment_key, find_links_given

# Variables besides FASTPATH_HOOKS_* whose value can change a decision (probe.py reads them).
SIGNATURE_VARIABLES = ("FLA_TILELANG", "FLA_FLASH_QLA", "CUDA_HOME", "CUDA_PATH", "PATH", "CUDA_VISIBLE_DEVICES",
                       "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "XDG_CACHE_HOME", "HOME")
# Where the kernel driver describes the GPUs without initialising CUDA/ROCm (cheap text files).
_GPU_INFO = (("/proc/driver/nvidia/gpus", "information"), ("/sys/class/kfd/kfd/topology/nodes", "name"))
SCHEMA = 2       # of every verdict file (verdicts.py writes them)


def signature_environ(environ=None, *, target: str | None = None) -> tuple:
    """The environment variables a decision can depend on, captured before a decision sets any;
    `target`: a FASTPATH_HOOKS_TARGET given as a parameter (`--target`) instead of the variable."""
    env = os.environ if environ is None else environ
    captured = {k: v for k, v in env.items() if k.startswith("FASTPATH_HOOKS_") or k in SIGNATURE_VARIABLES}
    if target is not None:
        captured["FASTPATH_HOOKS_TARGET"] = target
    return tuple(sorted(captured.items()))


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
    pins_files = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "facts", "pins.json")]
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


def warm_dir(root: str) -> str:
    """Where the warm verdicts of this environment live under a cache root (one file per signature)."""
    return os.path.join(root, "verdicts", environment_key()) + ".warm"


def warm_path(root: str, signature: str) -> str | None:
    return os.path.join(warm_dir(root), signature + ".json") if signature.isalnum() else None


def load_verdicts(path: str | None) -> dict:
    """{kernel: entry} of a schema-2 verdict file (whatever else is in it dropped), or {}."""
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


def warm_entry(entries: dict, kernel: str) -> dict | None:
    """The kernel's warm verdict in a loaded file, when it is well formed."""
    entry = entries.get(kernel)
    if not isinstance(entry, dict) or not isinstance(entry.get("reason"), str):
        return None
    if entry.get("posed") not in (None, "cuda", "xpu"):
        return None
    pairs = entry.get("env") or []
    if not (isinstance(pairs, list) and all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
                                            for p in pairs)):
        return None
    return entry


def get_warm(captured: tuple, kernel: str, signature: str) -> dict | None:
    """The good verdict recorded for `kernel` under `signature`, in the cache FASTPATH_HOOKS_CACHE_DIR
    names in `captured` (without parsing the settings)."""
    root = cache_root_from_environ(dict(captured))
    return warm_entry(load_verdicts(warm_path(root, signature)), kernel)


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
