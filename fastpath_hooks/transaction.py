"""Undo for installs: back up what may be replaced, journal it, restore it exactly.

`begin()` copies every file (per RECORD) of each installed distribution the
steps may change into a backup beside a journal; `rollback()` removes whatever
those distributions are now (per their RECORD) and puts the copies back, so the
environment is exactly as before - also after a crash: a journal found at the
next start (under the environment lock, so its writer is dead) is rolled back
first. Files nobody owns that appeared during an interrupted install (a
half-extracted wheel has no RECORD yet) and pip's `~name` stash directories are
removed too. Nothing outside these distributions is ever touched.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid

from .distributions import canonical_name, record_files, scan
from .state import atomic_write_json

JOURNAL = "journal.json"


class Transaction:
    def __init__(self, state_dir: str, site_dir: str, names, description: str = ""):
        self.state_dir = state_dir
        self.site_dir = os.path.realpath(site_dir)
        self.prefix = os.path.realpath(sys.prefix)  # console scripts live in <prefix>/bin
        self.names = sorted({canonical_name(n) for n in names})
        self.description = description
        self.id = uuid.uuid4().hex[:12]
        self.backup_dir = os.path.join(state_dir, "backup-" + self.id)
        self.journal_path = os.path.join(state_dir, JOURNAL)
        self.before: dict = {}
        self.manifest: list = []
        self.listing: list = []

    # -- lifecycle -------------------------------------------------------------
    def begin(self) -> None:
        found, _ = scan([self.site_dir])
        self.listing = sorted(os.listdir(self.site_dir))
        os.makedirs(self.backup_dir, exist_ok=True)
        for name in self.names:
            dist = found.get(name)
            self.before[name] = dist.version if dist else None
            if dist is None:
                continue
            for path in record_files(dist):
                if not os.path.isfile(path) or os.path.islink(path):
                    continue
                target = os.path.join(self.backup_dir, str(len(self.manifest)))
                shutil.copy2(path, target)
                self.manifest.append([path, target])
        self._write_journal()

    def commit(self) -> None:
        shutil.rmtree(self.backup_dir, ignore_errors=True)
        try:
            os.unlink(self.journal_path)
        except FileNotFoundError:
            pass

    def rollback(self) -> list:
        """Restore the before-state; returns a list of what was done (for the report)."""
        done = []
        found, dups = scan([self.site_dir])
        owned = set()
        for name in self.names:
            current = [found[name]] if name in found else []
            current += [d for d in dups.get(name, []) if d not in current]
            for dist in current:
                files = record_files(dist)
                for path in files:
                    if _inside(path, self.site_dir) or _inside(path, self.prefix):
                        _remove(path)
                shutil.rmtree(dist.path, ignore_errors=True)
                owned.update(files)
                done.append(f"removed {name} {dist.version}")
        for original, backup in self.manifest:
            os.makedirs(os.path.dirname(original), exist_ok=True)
            shutil.copy2(backup, original)
        for name, version in self.before.items():
            if version:
                done.append(f"restored {name} {version}")
        done += self._remove_orphans()
        _prune_empty_dirs(self.site_dir, owned)
        self.commit()
        return done

    # -- crash recovery ----------------------------------------------------------
    @classmethod
    def pending(cls, state_dir: str):
        """The interrupted transaction recorded in `state_dir`, if any."""
        path = os.path.join(state_dir, JOURNAL)
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            data = None
        tx = cls.__new__(cls)
        tx.state_dir = state_dir
        tx.journal_path = path
        if not isinstance(data, dict):
            # unreadable journal: nothing reliable to restore; drop it
            tx.site_dir, tx.names, tx.before, tx.manifest, tx.listing = "", [], {}, [], []
            tx.prefix = os.path.realpath(sys.prefix)
            tx.backup_dir, tx.id, tx.description = "", "unreadable", "unreadable journal"
            return tx
        tx.id = data.get("id", "?")
        tx.site_dir = data.get("site_dir", "")
        tx.prefix = data.get("prefix") or os.path.realpath(sys.prefix)
        tx.names = list(data.get("names", []))
        tx.before = dict(data.get("before", {}))
        tx.manifest = [list(x) for x in data.get("manifest", [])]
        tx.listing = list(data.get("listing", []))
        tx.backup_dir = data.get("backup_dir", "")
        tx.description = data.get("description", "")
        tx.pid = data.get("pid")
        tx.started = data.get("started")
        return tx

    # -- helpers -------------------------------------------------------------------
    def _write_journal(self) -> None:
        atomic_write_json(self.journal_path, {
            "id": self.id, "pid": os.getpid(), "started": time.time(), "description": self.description,
            "site_dir": self.site_dir, "prefix": self.prefix, "names": self.names, "before": self.before, "manifest": self.manifest,
            "listing": self.listing, "backup_dir": self.backup_dir,
        })

    def _remove_orphans(self) -> list:
        """Top-level entries that appeared since begin() and that no distribution owns."""
        if not self.site_dir or not os.path.isdir(self.site_dir):
            return []
        before = set(self.listing)
        new = [n for n in os.listdir(self.site_dir) if n not in before and n != os.path.basename(self.state_dir)]
        if not new:
            return []
        owned_tops = set()
        found, dups = scan([self.site_dir])
        for dist in list(found.values()) + [d for ds in dups.values() for d in ds]:
            owned_tops.add(os.path.basename(dist.path))
            for path in record_files(dist):
                rel = os.path.relpath(path, self.site_dir)
                if not rel.startswith(".."):
                    owned_tops.add(rel.split(os.sep, 1)[0])
        done = []
        for name in new:
            if name in owned_tops:
                continue
            path = os.path.join(self.site_dir, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                _remove(path)
            done.append(f"removed leftover {name}")
        return done


def _inside(path: str, root: str) -> bool:
    if not root:
        return False
    try:
        return os.path.commonpath([os.path.realpath(path), root]) == root
    except ValueError:
        return False


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        pass


def _prune_empty_dirs(site_dir: str, files) -> None:
    dirs = sorted({os.path.dirname(f) for f in files}, key=len, reverse=True)
    for d in dirs:
        while d.startswith(site_dir) and d != site_dir:
            try:
                if os.listdir(d) in ([], ["__pycache__"]):
                    shutil.rmtree(d, ignore_errors=True)
                else:
                    break
            except OSError:
                break
            d = os.path.dirname(d)
