"""Whether pip is configured with an index or find-links for `pip install` (PIP_* variables, then the
pip.conf files in pip's load order): uv ignores that configuration, so the installer choice reads it
(decide/commands.py)."""

from __future__ import annotations

import os
import sys


_PIP_INDEX_VARIABLES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS")
_PIP_INDEX_KEYS = ("index-url", "extra-index-url", "find-links")


def pip_index_config(environ=None) -> str | None:
    """Where pip is configured with an index or find-links for `pip install`, as pip reads it:
    PIP_* variables, then the files pip loads (PIP_CONFIG_FILE=os.devnull: none), or None."""
    env = os.environ if environ is None else environ
    found = [name for name in _PIP_INDEX_VARIABLES if env.get(name, "").strip()]
    for path in _pip_config_files(env):
        keys = _pip_index_keys(path)
        if keys:
            found.append(f"{path} sets {', '.join(keys)}")
    return "; ".join(found) or None


def _pip_config_files(env) -> list:
    """pip's configuration files in its load order: global, user (unless PIP_CONFIG_FILE names an
    existing file), the environment's own, PIP_CONFIG_FILE."""
    explicit = env.get("PIP_CONFIG_FILE")
    if explicit == os.devnull:
        return []
    home = env.get("HOME") or os.path.expanduser("~")
    if sys.platform == "darwin":
        global_dirs = ["/Library/Application Support/pip"]
        user_dirs = [os.path.join(home, "Library", "Application Support", "pip"), os.path.join(home, ".config", "pip")]
    else:
        global_dirs = [os.path.join(d, "pip") for d in (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep) if d]
        global_dirs.append("/etc")
        user_dirs = [os.path.join(env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"), "pip")]
    files = [os.path.join(d, "pip.conf") for d in global_dirs]
    if not (explicit and os.path.exists(explicit)):
        files += [os.path.join(home, ".pip", "pip.conf")] + [os.path.join(d, "pip.conf") for d in user_dirs]
    files.append(os.path.join(sys.prefix, "pip.conf"))
    if explicit:
        files.append(explicit)
    return files


def _pip_index_keys(path: str) -> list:
    """The index options a pip config file sets for `pip install` ([global] and [install])."""
    if not os.path.isfile(path):
        return []
    import configparser

    parser = configparser.RawConfigParser()
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, OSError, UnicodeDecodeError):
        return []
    keys = []
    for section in ("global", "install"):
        if not parser.has_section(section):
            continue
        for key, value in parser.items(section):
            name = key.lower().replace("_", "-").lstrip("-")
            if name in _PIP_INDEX_KEYS and value.strip() and name not in keys:
                keys.append(name)
    return keys
