"""What earlier runs on this machine left in the cache, read back: this host's source builds (act/build.py
appends one JSON line per build; estimates prefer this host's last build over the pins' figure) and the numeric
checks' records (one key per installed files, GPU arch and torch build: the policy blocks a mismatch there)."""

from __future__ import annotations

import json
import os
import socket

KEEP = 64                 # records read (the newest); the file is cut back to this when it grows past 4x
FIELDS = ("distribution", "version", "kernel", "archs", "n_archs", "cores", "cpus", "jobs", "split", "seconds",
          "nvcc", "launcher", "concurrent", "host", "when")


def builds_path(root: str) -> str:
    return os.path.join(root, "builds", "history.jsonl")


def host() -> str:
    try:
        return socket.gethostname() or "?"
    except OSError:
        return "?"


def read_builds(root: str | None) -> tuple:
    """This host's build records (a shared cache holds several hosts'), the newest KEEP, oldest first."""
    if not root:
        return ()
    try:
        with open(builds_path(root), encoding="utf-8", errors="replace") as fh:
            lines = fh.readlines()
    except OSError:
        return ()
    me = host()
    out = []
    for line in lines[-KEEP * 4:]:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("host") == me and isinstance(rec.get("seconds"), (int, float)):
            out.append({k: rec[k] for k in FIELDS if k in rec})
    return tuple(out[-KEEP:])


GOOD, MISMATCH = "good", "mismatch"


def numeric_path(root: str, kernel: str) -> str:
    return os.path.join(root, "numeric", f"{kernel}.json")


def read_records(path: str) -> dict:
    """A file of keyed records ({key: {...}}); {} when it is missing, unreadable or not such a file."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def read_numeric(root: str | None, kernel: str) -> dict:
    return read_records(numeric_path(root, kernel)) if root else {}


def failures(root: str | None, kernels) -> tuple:
    """Every remembered mismatch, as (kernel, version, arch, torch build, detail, file), sorted."""
    out = set()
    for kernel in kernels:
        for entry in read_numeric(root, kernel).values():
            if entry.get("state") == MISMATCH:
                out.add((kernel, *(str(entry.get(k)) for k in ("version", "arch", "torch_build", "detail")),
                         numeric_path(root, kernel)))
    return tuple(sorted(out))


def torch_build(env) -> str:
    """The torch part of a record's key: `torch 2.13.0 CUDA 13.0`."""
    return f"torch {env.torch} {env.torch_build}"
