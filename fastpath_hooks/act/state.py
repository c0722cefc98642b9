"""Where an environment's own state lives: the install lock and the journal of a running install.

They sit inside the environment they protect (next to site-packages), so every process and
every user of a shared environment - NFS included - sees the same ones; where site-packages
is not writable, under the cache root, keyed by the environment. (The verdicts are per user:
act/verdicts.py; the lock itself: act/locks.py.)
"""

from __future__ import annotations

import os

from .._environ import JOURNAL, STATE_DIR_NAME, cache_root, environment_key

__all__ = ("JOURNAL", "STATE_DIR_NAME", "environment_state_dir")


def environment_state_dir(settings) -> str:
    """`.fastpath-hooks/` beside site-packages when writable, else under the cache root."""
    from ..facts.distributions import site_packages

    site = site_packages()
    if os.access(site, os.W_OK):
        return os.path.join(site, STATE_DIR_NAME)
    return os.path.join(cache_root(settings), "envs", environment_key())
