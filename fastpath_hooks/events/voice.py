"""Which process of a node prints the human lines (`speaks()`): one per node.

- never from a multiprocessing worker of the process that speaks: install() in a launcher's
  local rank 0 marks it (`_FASTPATH_HOOKS_VOICE`), and its DataLoader/pool workers, which
  inherit LOCAL_RANK=0, inherit the mark too (other subprocesses, a CLI run, are not workers);
- else the local rank decides where a launcher gives one: LOCAL_RANK, an MPI
  launcher's local rank, or RANK modulo LOCAL_WORLD_SIZE - local rank 0 prints (so the ranks
  a plain script starts with torch.multiprocessing.spawn speak: rank 0 of them);
- else never from a multiprocessing child (a rankless script's DataLoader or pool worker);
- else processes started by one parent (a shell loop, xargs, a launcher that sets
  no rank) are one job: the first of them with something to say takes the node's
  "voice" for that parent (an fcntl lock on one byte of one file per user in /tmp,
  released by the OS when it exits) and the others stay quiet.

Self-contained (the voice file's place is its own business): loaded at the first human line.
"""

from __future__ import annotations

import os
import sys

from .._environ import environment_key
from .._names import VOICE, local_rank

_voice: dict = {}       # parent pid -> True (this process holds the voice) / False


def worker() -> bool:
    """A multiprocessing child (DataLoader worker, pool worker, Process)."""
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return False
    try:
        return mp.parent_process() is not None
    except Exception:
        return False


def speaks() -> bool:
    """Whether this process prints human lines (one process per node, see the module docstring)."""
    marker = os.environ.get(VOICE)
    if marker and marker != str(os.getpid()) and worker():
        return False  # a worker of the process that speaks for the node (install() marked it)
    rank = local_rank()
    if rank is not None:
        return rank == 0
    if worker():
        return False  # a rankless script's DataLoader/pool worker: its parent speaks for it
    return _take_voice()


def _take_voice() -> bool:
    """The first process of its parent's children (on this node, in this environment) to ask keeps
    the voice until it exits; asked once per process (per parent: a fork re-asks)."""
    parent = os.getppid()
    if parent not in _voice:
        _voice[parent] = _lock_voice(parent)
    return _voice[parent]


def _lock_voice(parent: int) -> bool:
    try:
        import fcntl
    except ImportError:  # no fcntl (Windows): every process speaks
        return True
    # Node-wide and node-local: /tmp (not TMPDIR, a scratch directory a job may clean or give each
    # process its own of; not the cache directory, which each process may set apart, and which nodes
    # may share - an fcntl lock there would be cluster-wide on NFS, where parent pids of different
    # nodes collide). One file per user, whatever the number of environments: the byte locked is the
    # parent's pid (high bits) and this environment (low bits), so nothing accumulates, and the file
    # is never removed (a process that locked a removed file would not exclude one that made it anew).
    directory = "/tmp" if os.path.isdir("/tmp") else os.environ.get("TMPDIR") or "."
    path = os.path.join(directory, f"fastpath-hooks-{os.getuid()}.voice")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return True
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, (parent << 32) | int(environment_key()[:8], 16))
    except OSError:
        os.close(fd)
        return False
    return True  # fd stays open: the lock lasts as long as this process
