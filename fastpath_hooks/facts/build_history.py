"""The source builds this machine has done, read back for the estimates (facts).

Every finished build appends one JSON line to `<cache root>/builds/history.jsonl` (act/build.py):
the distribution and version, the archs, the cores it had, MAX_JOBS, the --split-compile threads,
its measured seconds, the host. The policy's estimate (decide/build_time.py `build_estimate`) takes this
machine's last build of a distribution instead of the pins' figure, so `doctor`, the line before a
build and its heartbeat say what this machine took, not what another one did. A shared cache
directory holds several hosts' builds; only this host's are read. `cache clear` leaves it.
"""

from __future__ import annotations

import json
import os

SUBDIR = "builds"
FILE = "history.jsonl"
KEEP = 64                 # records read (the newest); the file is cut back to this when it grows past 4x
FIELDS = ("distribution", "version", "kernel", "archs", "n_archs", "cores", "cpus", "jobs", "split", "seconds",
          "nvcc", "launcher", "concurrent", "host", "when")


def path(root: str) -> str:
    return os.path.join(root, SUBDIR, FILE)


def host() -> str:
    import socket

    try:
        return socket.gethostname() or "?"
    except OSError:
        return "?"


def read(root: str | None, this_host: str | None = None) -> tuple:
    """This host's build records, oldest first (the newest KEEP); () when there are none or the
    file cannot be read. A line that is not a record is skipped."""
    if not root:
        return ()
    try:
        with open(path(root), encoding="utf-8", errors="replace") as fh:
            lines = fh.readlines()
    except OSError:
        return ()
    me = this_host or host()
    out = []
    for line in lines[-KEEP * 4:]:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("host") == me and isinstance(rec.get("seconds"), (int, float)):
            out.append({k: rec[k] for k in FIELDS if k in rec})
    return tuple(out[-KEEP:])
