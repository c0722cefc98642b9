"""Undo for installs, and the files the act layer writes (whole or not at all: `atomic_write`).

`begin()` backs up each distribution the steps may change and lists site-packages; `rollback()` puts it back
exactly as it was, new files deleted, other distributions' files never touched (the `nvidia/__init__.py` every
nvidia-* wheel lists). The journal lives beside site-packages (every user of a shared environment sees it), else
under the cache root; one found at the next start (under the lock) is rolled back.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid

from .. import events
from .._names import JOURNAL, STATE_DIR_NAME, cache_root, environment_key
from ..events import first_fitting, fitted
from ..facts.distributions import canonical_name, record_files, scan, site_packages
from .runner import group_record, kill_group

LISTING = "listing.json"
BACKUP_PREFIX = "backup-"
WORK_PREFIX = "work-"   # the installer's scratch (constraints, downloads, TMPDIR) for one transaction
_JOURNALLED = ("id", "description", "site_dir", "prefix", "names", "before", "manifest", "listing", "dist_dirs",
               "before_dirs", "backup_dir", "group")


class Transaction:
    def __init__(self, state_dir: str, site_dir: str, names, description: str = "", prefix: str | None = None):
        self.state_dir = state_dir
        self.site_dir = os.path.realpath(site_dir)
        self.prefix = os.path.realpath(prefix or sys.prefix)  # console scripts live in <prefix>/bin
        self.names = sorted({canonical_name(n) for n in names})
        self.description = description
        self.id = uuid.uuid4().hex[:12]
        self.backup_dir = os.path.join(state_dir, BACKUP_PREFIX + self.id)
        self.work_dir = os.path.join(state_dir, WORK_PREFIX + self.id)
        self.journal_path = os.path.join(state_dir, JOURNAL)
        self._groups_lock = threading.Lock()   # a build and the installs beside it journal their children at once
        self.before: dict = {}
        self.manifest: list = []
        self.listing: list = []      # top-level entries of site-packages at begin()
        self.dist_dirs: list = []    # every *.dist-info / *.egg-info at begin()
        self.before_dirs: dict = {}  # name -> its dist-info directories at begin() (two after a crash)
        self.group = None            # the running child's process group (runner.group_record), if any
        self.groups: dict = {}       # pgid -> record: children running side by side (a request's builds)

    # -- lifecycle -------------------------------------------------------------
    def begin(self) -> None:
        found, dups = scan([self.site_dir])
        self.listing = sorted(os.listdir(self.site_dir))
        self.dist_dirs = sorted(e for e in self.listing if e.endswith((".dist-info", ".egg-info")))
        os.makedirs(self.backup_dir, exist_ok=True)
        atomic_write_json(os.path.join(self.backup_dir, LISTING), _file_listing(self.site_dir, self._skip_dir()))
        for name in self.names:
            instances = _instances(name, found, dups)
            self.before[name] = instances[0].version if instances else None
            self.before_dirs[name] = sorted(os.path.basename(d.path) for d in instances)
            seen: set = set()
            for dist in instances:
                for path in record_files(dist) + _tree(dist.path):
                    if path in seen or not os.path.isfile(path) or os.path.islink(path):
                        continue
                    seen.add(path)
                    target = os.path.join(self.backup_dir, str(len(self.manifest)))
                    shutil.copy2(path, target)
                    self.manifest.append([path, target, name])
        self._write_journal()

    def record_group(self, pgid) -> None:
        """The runner's `started=`: the child's group journalled (None: it ended), for a recovery to kill first."""
        with self._groups_lock:
            self.group = group_record(pgid) if pgid is not None else None
            self._write_journal()

    def record_side_group(self, pgid, running: bool) -> None:
        """`record_group` for one of several children running side by side (a request's builds)."""
        with self._groups_lock:
            if running:
                self.groups[pgid] = group_record(pgid)
            else:
                self.groups.pop(pgid, None)
            self._write_journal()

    def stop_group(self) -> int:
        """Kill what is left of a dead writer's children; the number of processes still running."""
        return sum(kill_group(g) for g in [self.group, *self.groups.values()] if g)

    def commit(self) -> None:
        # the work directory, then the journal, then the backup: a crash leaves a stale backup (recover removes it),
        # never a journal that points at missing backups
        if self.work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.journal_path)
        if self.backup_dir:
            shutil.rmtree(self.backup_dir, ignore_errors=True)

    def rollback(self) -> list:
        """Restore the before-state; what was done."""
        done, intact, failed, restored = [], set(), [], set()
        if self.site_dir and os.path.isdir(self.site_dir):
            found, dups = scan([self.site_dir])
            intact = {n for n in self.names if self._intact(n, found, dups)}
            dist_dirs = set(self.dist_dirs)
            # files there at begin() that no backup covers are another distribution's: never deleted
            others = _paths(self.site_dir, self._known_listing() or {}) - {o for o, *_ in self.manifest}
            removed_files: list = []
            for name in sorted(set(found) | set(dups)):
                if name.startswith("~"):
                    continue  # pip's stash of a dist-info directory: a leftover, removed below
                for dist in _instances(name, found, dups):
                    new = os.path.basename(dist.path) not in dist_dirs
                    if (name not in self.names and not new) or name in intact:
                        continue
                    removed_files += self._remove_dist(dist, others)
                    if self.before.get(name) != dist.version:
                        done.append(f"removed {name} {dist.version}")
            _prune_empty_dirs(self.site_dir, removed_files)
        for original, backup, *owner in self.manifest:
            if owner and owner[0] in intact:
                continue
            try:
                os.makedirs(os.path.dirname(original), exist_ok=True)
                if os.path.isdir(original) and not os.path.islink(original):
                    shutil.rmtree(original)
                elif os.path.lexists(original):
                    os.unlink(original)
                shutil.copy2(backup, original)
                restored.update(owner)
            except OSError as exc:
                failed.append(f"{original}: {exc}")
        done += [f"restored {name} {self.before[name]}" for name in sorted(restored)]
        if failed:
            done.append(f"could not restore {len(failed)} files ({failed[0]})")
        done += self._remove_new_files()
        self.commit()
        return done

    def remove(self) -> list:
        """Remove the named distributions begin() backed up (an install this process made that is not wanted
        after all): their RECORD's files - never one that another distribution had there - and their dist-info.
        rollback() puts them back. What was done."""
        found, dups = scan([self.site_dir])
        others = _paths(self.site_dir, self._known_listing() or {}) - {o for o, *_ in self.manifest}
        done, removed_files = [], []
        for name in self.names:
            for dist in _instances(name, found, dups):
                removed_files += self._remove_dist(dist, others)
                done.append(f"removed {name} {dist.version}")
        _prune_empty_dirs(self.site_dir, removed_files)
        return done

    def _remove_dist(self, dist, others: set) -> list:
        """Delete one distribution's files (inside site-packages and the prefix; not `others`) and its dist-info."""
        files = [p for p in record_files(dist) if p not in others]
        for path in files:
            if _inside(path, self.site_dir) or _inside(path, self.prefix):
                _remove(path)
        shutil.rmtree(dist.path, ignore_errors=True)
        return files

    def _intact(self, name: str, found: dict, dups: dict) -> bool:
        """As begin() found it: the same dist-info directories, every backed-up file with its size and mtime (an
        installer that rewrote a file, even with the same version, gave it a new mtime)."""
        now = sorted(os.path.basename(d.path) for d in _instances(name, found, dups))
        if now != self.before_dirs.get(name, []):
            return False
        if not now:
            return True
        files = [(o, b) for o, b, *owner in self.manifest if owner and owner[0] == name]
        if not files:
            return False
        for original, backup in files:
            try:
                a, b = os.stat(original), os.stat(backup)
            except OSError:
                return False
            if a.st_size != b.st_size or a.st_mtime_ns != b.st_mtime_ns:
                return False
        return True

    # -- crash recovery ----------------------------------------------------------
    @classmethod
    def pending(cls, state_dir: str):
        path = os.path.join(state_dir, JOURNAL)
        if not os.path.lexists(path):
            return None
        data = _read_json(path)
        readable = data is not None   # an unreadable journal: nothing reliable to restore, dropped
        data = data if readable else {"id": "unreadable", "description": "install (its journal is unreadable)"}
        defaults = {"id": "?", "site_dir": "", "names": [], "before": {}, "manifest": [], "listing": [],
                    "before_dirs": {}, "backup_dir": "", "description": ""}
        tx = cls.__new__(cls)
        tx.state_dir, tx.journal_path = state_dir, path
        for field in _JOURNALLED + ("pid", "started"):
            setattr(tx, field, data.get(field, defaults.get(field)))
        tx.prefix = tx.prefix or os.path.realpath(sys.prefix)
        tx.manifest = [list(x) for x in tx.manifest]
        if tx.dist_dirs is None:
            tx.dist_dirs = [e for e in tx.listing if e.endswith((".dist-info", ".egg-info"))]
        tx.work_dir = os.path.join(state_dir, WORK_PREFIX + tx.id) if readable and str(tx.id).isalnum() else ""
        tx.groups = {i: g for i, g in enumerate(data.get("groups") or []) if isinstance(g, dict)}
        return tx

    # -- helpers -------------------------------------------------------------------
    def _skip_dir(self) -> str:
        """The state directory's name when it lives inside site-packages (never listed, nor cleaned)."""
        state = os.path.realpath(self.state_dir)
        return os.path.basename(state) if os.path.dirname(state) == self.site_dir else ""

    def _write_journal(self) -> None:
        journal = {field: getattr(self, field) for field in _JOURNALLED}
        atomic_write_json(self.journal_path, dict(journal, pid=os.getpid(), started=time.time(),
                                                  groups=list(self.groups.values())))

    def _known_listing(self) -> dict | None:
        """begin()'s {relative directory: [file names]}, None when unreadable."""
        return _read_json(os.path.join(self.backup_dir, LISTING)) if self.backup_dir else None

    def _remove_new_files(self) -> list:
        if not self.site_dir or not os.path.isdir(self.site_dir):
            return []
        skip, known, done = self._skip_dir(), self._known_listing(), []
        for entry in sorted(os.listdir(self.site_dir)):
            if entry == skip or entry in self.listing:
                continue
            path = os.path.join(self.site_dir, entry)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                _remove(path)
            done.append(f"removed leftover {entry}" + (" (an installer's stash)" if entry.startswith("~") else ""))
        if known is None:
            return done  # the per-file listing is gone: only new top-level entries were removed
        listing = _file_listing(self.site_dir, skip)
        before = {rel_dir: set(names) for rel_dir, names in known.items() if isinstance(names, list)}
        new = [os.path.join(self.site_dir, rel_dir, name) for rel_dir, files in listing.items() for name in files
               if name not in before.get(rel_dir, ())]
        stray = 0
        for path in sorted(new, key=_is_bytecode):  # sources first: a cache needs its source
            if _is_bytecode(path) and _source_exists(path) and "~" not in path[len(self.site_dir):]:
                continue  # a cache another process wrote for a module that is still there (checked at load)
            _remove(path)
            stray += 1
        for rel_dir in sorted(listing, reverse=True):
            full = os.path.join(self.site_dir, rel_dir)
            if rel_dir != "." and rel_dir not in known and not _has_files(full):
                shutil.rmtree(full, ignore_errors=True)
        if stray:
            done.append(f"removed {stray} leftover files inside existing directories")
        return done


def recover(state_dir: str) -> list:
    """Roll back an interrupted install found in `state_dir`, remove what killed runs left (lock held)."""
    tx = Transaction.pending(state_dir)
    done = []
    if tx is not None:
        # its writer died; its installer may not have (its own session): stopped first
        stopped = tx.stop_group()
        still = f" (stopped {stopped} process{'es' if stopped > 1 else ''} it left running)" if stopped else ""
        what = tx.description or f"install {tx.id}"
        whole = f"an earlier {what} was interrupted; rolling it back{still}"
        events.warning(first_fitting(whole, f"an earlier {what.split(' (')[0]} was interrupted; rolling it back{still}"),
                       detail=whole)
        done = tx.rollback()
        whole = "rolled back: " + ("; ".join(done) if done else "nothing had changed")
        events.status(fitted("rolled back: ", "; ".join(_counted(done)) if done else "nothing had changed",
                             whole_at="FASTPATH_HOOKS_LOG=debug"), detail=whole)
    with contextlib.suppress(OSError):   # backups no journal points at (a crash in begin, commit), killed runs' work
        entries = os.listdir(state_dir)
        stale = [] if JOURNAL in entries else [e for e in entries if e.startswith((BACKUP_PREFIX, WORK_PREFIX))]
        for entry in stale:
            shutil.rmtree(os.path.join(state_dir, entry), ignore_errors=True)
    return done


def _counted(done: list) -> list:
    """Many leftovers removed are one count on the line (the debug log names them)."""
    leftovers = [d for d in done if d.startswith("removed leftover ")]
    if len(leftovers) <= 2:
        return done
    return [d for d in done if d not in leftovers] + [f"removed {len(leftovers)} leftover files"]


def _read_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _instances(name: str, found: dict, dups: dict) -> list:
    out = list(dups.get(name, []))
    first = found.get(name)
    if first is not None and first.path not in {d.path for d in out}:
        out.insert(0, first)
    return out


def _paths(site_dir: str, listing: dict) -> set:
    return {os.path.normpath(os.path.join(site_dir, rel_dir, name))
            for rel_dir, names in listing.items() if isinstance(names, list) for name in names
            if isinstance(name, str)}


def _tree(path: str) -> list:
    return [os.path.join(root, f) for root, _dirs, files in os.walk(path) for f in files]


def _file_listing(site_dir: str, skip: str) -> dict:
    """{relative directory: [file names]} under site-packages (symlinks as files)."""
    out: dict = {}
    for root, dirs, files in os.walk(site_dir):
        rel = os.path.relpath(root, site_dir)
        if rel == ".":
            dirs[:] = [d for d in dirs if d != skip]
        names = list(files) + [d for d in dirs if os.path.islink(os.path.join(root, d))]
        out[rel] = sorted(names)
    return out


def _is_bytecode(path: str) -> bool:
    return path.endswith(".pyc") and os.path.basename(os.path.dirname(path)) == "__pycache__"


def _source_exists(path: str) -> bool:
    """A cache whose source exists: Python re-validates it at load, so keeping it is safe (torch's, written by
    the check child)."""
    directory, name = os.path.split(path)
    return os.path.isfile(os.path.join(os.path.dirname(directory), name.split(".", 1)[0] + ".py"))


def _prune_empty_dirs(site_dir: str, files) -> None:
    dirs = sorted({os.path.dirname(f) for f in files}, key=len, reverse=True)
    for d in dirs:
        while d.startswith(site_dir + os.sep):
            try:
                if os.listdir(d) not in ([], ["__pycache__"]):
                    break
            except OSError:
                break
            shutil.rmtree(d, ignore_errors=True)
            d = os.path.dirname(d)


def _has_files(path: str) -> bool:
    return any(files for _root, _dirs, files in os.walk(path))


def _inside(path: str, root: str) -> bool:
    with contextlib.suppress(ValueError):   # another drive, or an empty root
        return os.path.commonpath([os.path.realpath(path), root]) == root
    return False


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError, NotADirectoryError):
        os.unlink(path)


def atomic_write(path: str, write, *, binary: bool = False, suffix: str = "") -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=directory)
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str, data) -> None:
    atomic_write(path, lambda fh: json.dump(data, fh, indent=1, sort_keys=True), suffix=".json")


def atomic_copy(src: str, dst: str) -> None:
    with open(src, "rb") as source:
        atomic_write(dst, lambda out: shutil.copyfileobj(source, out, 1 << 20), binary=True,
                     suffix=os.path.splitext(dst)[1])


def environment_state_dir(settings) -> str:
    """`.fastpath-hooks/` beside site-packages when writable, else under the cache root."""
    site = site_packages()
    if os.access(site, os.W_OK):
        return os.path.join(site, STATE_DIR_NAME)
    return os.path.join(cache_root(settings), "envs", environment_key())
