"""The kernel registry with a user's pins file: the kernels FASTPATH_HOOKS_PINS adds (or changes).

A leaf like _names (stdlib only; it imports nothing of ours, _names hands it the index), loaded only when that variable is set - by the finder at
install(), the gates, settings and the policy's data - so that a kernel added by the file alone is
watched, accepted by name and decided like a shipped one. The read is shallow and never raises:
facts/pins.py validates the same file in full and says what is wrong; an entry that is not
well-formed here is left out (the hooks then do not know its kernel) or keeps the shipped keys.
"""

KEYS = ("kind", "modules", "distributions", "aliases", "gates", "mirror", "with", "serves", "rule_prefix", "switch")
_LISTS = ("modules", "distributions", "aliases", "gates", "with", "serves")
_cache: dict = {}   # (path, mtime_ns, size) -> registry


def registry_keys(name: str, entry, base=None) -> dict | None:
    """One kernel's registry keys from its pins entry (JSON values), over `base` (the keys of a
    shipped kernel the entry changes); None when a new kernel's entry lacks its kind or modules."""
    if not isinstance(entry, dict):
        return base
    out = dict(base) if base else {"kind": None, "modules": (), "distributions": (), "aliases": (), "gates": (),
                                   "mirror": None, "with": (), "serves": (), "rule_prefix": name, "switch": None}
    for key in _LISTS:
        value = entry.get(key)
        if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
            out[key] = tuple(value)
    for key in ("kind", "mirror", "rule_prefix"):
        if isinstance(entry.get(key), str) and entry[key]:
            out[key] = entry[key]
    switch = entry.get("switch")
    if isinstance(switch, dict) and isinstance(switch.get("variable"), str):
        out["switch"] = switch["variable"]
    if not out["kind"] or not out["modules"]:
        return base
    return out


def from_pins_data(kernels: dict, base=None) -> dict:
    """kernel -> registry keys for a pins `kernels` table (the shipped one, or a user file's over it)."""
    out = dict(base or {})
    for name, entry in kernels.items():
        keys = registry_keys(name, entry, out.get(name))
        if keys is not None:
            out[name] = keys
    return out


def with_user_file(path: str, base: dict) -> dict:
    """`base` (_names.REGISTRY) and the kernels the pins file at `path` adds or changes (cached by its mtime)."""
    import os

    path = os.path.abspath(os.path.expanduser(path))
    try:
        st = os.stat(path)
    except OSError:
        return base
    key = (path, st.st_mtime_ns, st.st_size, id(base))
    if key not in _cache:
        _cache.clear()
        _cache[key] = _read(path, base)
    return _cache[key]


def _read(path: str, base: dict) -> dict:
    try:
        with open(path, "rb") as fh:
            raw = fh.read().decode("utf-8")
        if path.endswith(".toml"):
            import tomllib

            data = tomllib.loads(raw)
        else:
            import json

            data = json.loads(raw)
    except Exception:   # unreadable, not JSON/TOML, no tomllib: facts/pins.py says so
        return base
    kernels = data.get("kernels") if isinstance(data, dict) else None
    if not isinstance(kernels, dict):
        return base
    return from_pins_data(kernels, base)
