"""The hub as a kernel source (transformers 5.25+, HF `kernels` 0.19): decided once per process when
transformers asks for its kernel mapping, through the ecosystem's own levers - the mapping and
LOCAL_KERNELS - never transformers' code. Each entry for this device type is served from where it loads
(LOCAL_KERNELS, the kernels cache, the hub when it answers in pins' `hub.probe_seconds`, neither HF_HUB_OFFLINE
nor FASTPATH_HOOKS_OFFLINE set) if the package rules (decide/transformers.py) and its numeric check allow; the
rest is dropped, so kernelize keeps the decorated function instead of raising ValueError offline."""

from __future__ import annotations

import os
import sys
import threading

from .. import events
from .._names import cache_root
from ..act.numeric import verify_hub
from ..decide.common import Context
from ..decide.transformers import choose as decide_choices, served_kernels
from ..facts.probe import CACHE, ONLINE, device_type, entries, key_type, locate
from .context import load_context
from .world import World

_lock = threading.Lock()
_chosen: dict = {}       # device type -> (HubChoice, ...), decided once per process
_checked: dict = {}      # entry ref + name -> (ok, detail)


def choose(mapping: dict) -> dict:
    """transformers' kernel mapping with what may not serve here dropped (a copy; `mapping` is unchanged)."""
    settings, pins = load_context()
    env = World().probe(settings, pins)
    device = device_type(env.accelerator)
    if device is None:
        return mapping          # no accelerator: kernelize looks nothing up here
    with _lock:
        choices = _chosen.get(device)
        if choices is None:
            choices = _chosen[device] = _decide(mapping, device, env, settings, pins)
            _say(choices)
    dropped = {c.entry.name for c in choices if not c.serve}
    _forget_registered(dropped, device)
    out = dict(mapping)
    for name in dropped:
        per_device = {k: v for k, v in mapping[name].items() if key_type(k) != device}
        if per_device:
            out[name] = per_device
        else:
            out.pop(name, None)
    return out


def chosen() -> tuple:
    """Every HubChoice of this process (doctor, the example, --json)."""
    return tuple(c for choices in _chosen.values() for c in choices)


def forget() -> None:
    _chosen.clear()
    _checked.clear()


def _decide(mapping: dict, device: str, env, settings, pins) -> tuple:
    found = entries(mapping, device, env.gpus)
    refs = {}
    for entry in found:
        refs.setdefault(entry.ref, entry)
    where = locate(refs, offline=settings.offline, probe_seconds=pins.hub.probe_seconds)
    hazards = Context(env, settings, pins, False).hazards
    choices = decide_choices(found, env=env, pins=pins, where=where, hazards=hazards)
    added = {c.entry.repo_id: where[c.entry.ref].detail for c in choices if c.serve and c.where == CACHE}
    if added:   # kernels loads these from the cache without asking the hub (LOCAL_KERNELS: resolved first)
        extra = ":".join(f"{repo}={path}" for repo, path in added.items())
        os.environ["LOCAL_KERNELS"] = ":".join(x for x in (os.environ.get("LOCAL_KERNELS", ""), extra) if x)
    out = []
    for choice in choices:
        if choice.serve and choice.where != ONLINE:
            problem = _loads(choice.entry)    # a local build kernelize would fail on (ValueError): not asked for
            if problem:
                choice = type(choice)(choice.entry, False, problem, refused=True)
        if choice.serve and choice.entry.kernel is not None:   # the numeric check its package gets (act/numeric.py)
            key = f"{choice.entry.ref}:{choice.entry.name}"
            if key not in _checked:
                _checked[key] = verify_hub(choice.entry, env=env, pins=pins, root=cache_root(settings),
                                           timeout=settings.timeout)
            ok, detail = _checked[key]
            if not ok:
                choice = type(choice)(choice.entry, False, f"its numeric check failed: {detail}", refused=True)
        out.append(choice)
    return tuple(out)


def _loads(entry) -> str:
    """Why kernelize could not load this entry's local build ("" when it can), loaded as kernelize would."""
    load = getattr(entry.repository, "load", None)
    if load is None:
        return ""
    try:
        load()
    except Exception as exc:   # noqa: BLE001 - kernels raises ValueError / FileNotFoundError / ImportError ...
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"{entry.ref} does not load here: {text}"[:200]
    return ""


def _say(choices) -> None:
    """One line for what is not cached (offline), one per kernel kept off the hub, one per kernel it serves."""
    unloadable = [c for c in choices if not c.serve and not c.refused]
    if unloadable:
        why = unloadable[0].reason.split(", and ")[0]
        count = len({c.entry.ref for c in unloadable})
        events.status(f"hub kernels: {why}; {count} of the mapping's builds are not cached, so packages or torch "
                      "serve them", once="hub-offline")
    for kernel in sorted({c.entry.kernel for c in choices if c.refused and c.entry.kernel}):
        refused = [c for c in choices if c.refused and c.entry.kernel == kernel]
        whole = all(not c.serve for c in choices if c.entry.kernel == kernel)
        what = "" if whole else f"{', '.join(sorted({c.entry.name for c in refused}))} "
        events.warning(f"{kernel}: {what}not from {refused[0].entry.repo_id} - {refused[0].reason}", kernel,
                       once=f"hub-refused-{kernel}")
    served = [c for c in choices if c.serve and c.entry.kernel]
    for kernel, refs in sorted(served_kernels(choices).items()):
        names = sorted({c.entry.name for c in served if c.entry.kernel == kernel})
        events.status(f"{kernel}: {', '.join(names)} from {', '.join(refs)}", kernel, once=f"hub-served-{kernel}")


def _forget_registered(names, device: str) -> None:
    """Drop these entries for `device` from the mapping kernels already holds (a from_pretrained before install())."""
    for modname in ("kernels._internals.layer.globals", "kernels.layer.globals"):
        module = sys.modules.get(modname)
        mapping = getattr(module, "_KERNEL_MAPPING", None)
        if mapping is None:
            continue
        try:
            current = mapping.get()
        except Exception:   # noqa: BLE001
            continue
        for name in names:
            per_device = current.get(name)
            if isinstance(per_device, dict):
                per_device.pop(device, None)
                if not per_device:
                    current.pop(name, None)
