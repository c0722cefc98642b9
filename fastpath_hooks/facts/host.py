"""This host's own facts besides its GPUs and tools: its CPU architecture (in the wheel tags' spelling),
its glibc release and the CPU cores this process may use. Standard library only, no process."""

from __future__ import annotations

import os


def normal_arch(machine: str) -> str:
    low = machine.lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(low, low)


def glibc() -> str | None:
    try:
        value = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"
    except (AttributeError, ValueError, OSError):
        return None
    if not value or not value.startswith("glibc "):
        return None
    return value.split()[1]


def usable_cpus() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()
