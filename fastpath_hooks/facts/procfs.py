"""Readers of Linux's /proc: a process's state, group and start time, the boot id, available
memory. Small reads that never raise: None (or nothing) where there is no /proc."""

from __future__ import annotations

import os


def read_text(path: str, limit: int = 4096) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read(limit).strip()
    except OSError:
        return None


def boot_id() -> str | None:
    """This boot of the kernel: with a start time, it tells a reused pid from the process recorded."""
    return read_text("/proc/sys/kernel/random/boot_id")


def process_stat(pid: int):
    """(state, process group, start time in clock ticks since boot) of a process, None when gone."""
    text = read_text(f"/proc/{pid}/stat")
    if not text:
        return None
    fields = text[text.rfind(")") + 2:].split()   # the command name may hold spaces and parentheses
    try:
        return fields[0], int(fields[2]), int(fields[19])
    except (IndexError, ValueError):
        return None


def group_members(pgid: int) -> list:
    """Pids of the group's living members (zombies are done writing)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    out = []
    for entry in entries:
        if entry.isdigit():
            stat = process_stat(int(entry))
            if stat is not None and stat[1] == pgid and stat[0] not in ("Z", "X"):
                out.append(int(entry))
    return out


def mem_available_gib() -> float | None:
    text = read_text("/proc/meminfo", limit=1 << 16)
    for line in (text or "").splitlines():
        if line.startswith("MemAvailable:"):
            try:
                return round(int(line.split()[1]) / (1 << 20), 1)
            except (IndexError, ValueError):
                return None
    return None
