"""Find-links entries (FASTPATH_HOOKS_FIND_LINKS) as the local directories they name.

Its own module, importing only `os`: the warm path (`state.environment_signature`) lists
these directories at every first kernel import, where importing `settings` (~4 ms of
dataclass set-up) would cost more than the whole decision.
"""

from __future__ import annotations

import os


def find_links_dir(entry: str) -> str | None:
    """The local directory a find-links entry names (a path or a file:// URL, read as pip reads
    it), or None for a remote URL."""
    if "://" in entry:
        if not entry.startswith("file://"):
            return None
        entry = entry[len("file://"):]
        if entry.startswith("localhost/"):
            entry = entry[len("localhost"):]
        if "%" in entry:
            from urllib.parse import unquote

            entry = unquote(entry)
    return os.path.abspath(os.path.expanduser(entry))
