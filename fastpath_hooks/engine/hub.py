"""The hub as a kernel source (transformers 5.25+, HF `kernels` 0.19): decided once per process when
transformers asks for its kernel mapping, through the ecosystem's own levers - the mapping and
LOCAL_KERNELS - never transformers' code. Each entry for this device type is served from where it loads
(LOCAL_KERNELS, the kernels cache, the hub when it answers in pins' `hub.probe_seconds`, neither HF_HUB_OFFLINE
nor FASTPATH_HOOKS_OFFLINE set) if the package rules (decide/transformers.py) and its numeric check allow; the
rest is dropped, so kernelize keeps the decorated function instead of raising ValueError offline.

Flash attention (`attention`): where a model asks for flash_attention_2 / _3 and the package cannot serve it,
transformers loads the hub kernel its FLASH_ATTN_KERNEL_FALLBACK table names - decided the same way; where that
cannot load either, the table sends the implementation to sdpa (from_pretrained then builds an sdpa model instead
of raising), and one line says so."""

from __future__ import annotations

import os
import sys
import threading

from .. import events
from .._names import GATES_MODULE, cache_root
from ..act.numeric import verify_hub
from ..decide.common import Context
from ..decide.messages import compose
from ..decide.transformers import choose as decide_choices, served_kernels
from ..facts.probe import CACHE, ONLINE, HubEntry, device_type, entries, key_type, locate
from .context import load_context
from .world import World

FLASH_MODULE = "transformers.modeling_flash_attention_utils"   # 5.25+: FLASH_ATTN_KERNEL_FALLBACK / _VERSIONS
TORCH_ATTENTION = "sdpa"

_lock = threading.Lock()
_chosen: dict = {}       # device type, or an attn_implementation -> (HubChoice, ...), decided once per process
_checked: dict = {}      # entry ref + name -> (ok, detail)
_sent: dict = {}         # attn_implementation -> the hub repo FLASH_ATTN_KERNEL_FALLBACK named before sdpa


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
            choices = _chosen[device] = _decide(entries(mapping, device, env.gpus), env, settings, pins)
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
    """Forget this process' choices; the flash-attention table gets back what it named."""
    table = getattr(sys.modules.get(FLASH_MODULE), "FLASH_ATTN_KERNEL_FALLBACK", None)
    for implementation, repo in _sent.items():
        if isinstance(table, dict) and table.get(implementation) == TORCH_ATTENTION:
            table[implementation] = repo
    _sent.clear()
    _chosen.clear()
    _checked.clear()


def attention(kernel: str, implementation: str):
    """A model asks for `implementation` (flash_attention_2) and `kernel`'s package does not serve it here: the hub
    kernel transformers' FLASH_ATTN_KERNEL_FALLBACK names serves where it loads and no rule refuses it, else that
    table sends `implementation` to sdpa, said in one line. The HubChoice; None before 5.25 (no hub fallback) or
    where transformers does not use `kernels`."""
    module = sys.modules.get(FLASH_MODULE)
    table = getattr(module, "FLASH_ATTN_KERNEL_FALLBACK", None)
    repo = _sent.get(implementation) or (table.get(implementation) if isinstance(table, dict) else None)
    if not isinstance(repo, str) or not _hub_used():
        return None
    with _lock:
        choices = _chosen.get(implementation)
        if choices is None:
            version = getattr(module, "FLASH_ATTN_KERNEL_VERSIONS", {}).get(repo, 1)   # transformers' default: 1
            entry = HubEntry(name=implementation, repo_id=repo, layer="", version=version, kernel=kernel,
                             repository=_Module(repo, version))
            settings, pins = load_context()
            choices = _chosen[implementation] = _decide((entry,), World().probe(settings, pins), settings, pins,
                                                        load_online=True)
            _say_attention(choices[0])
    if not choices[0].serve and table.get(implementation) != TORCH_ATTENTION:
        _sent.setdefault(implementation, repo)
        table[implementation] = TORCH_ATTENTION   # transformers' own fallback table: from_pretrained builds sdpa
    return choices[0]


def _hub_used() -> bool:
    """transformers' own answer to whether it loads hub kernels (`is_kernels_available`, kernels in its window)."""
    gates = sys.modules.get(GATES_MODULE)
    available = getattr(gates, "is_kernels_available", None)
    try:
        return bool(available()) if callable(available) else False
    except Exception:   # noqa: BLE001 - a kernels that does not import: transformers does not use it either
        return False


class _Module:
    """A hub kernel that is a module of functions (flash attention), loaded as transformers loads it."""

    def __init__(self, repo: str, version: int):
        self.repo, self.version = repo, version

    def load(self):
        from kernels import get_kernel

        return get_kernel(self.repo, version=self.version)


def _say_attention(choice) -> None:
    entry = choice.entry
    if choice.serve:
        events.status(f"{entry.kernel}: {entry.name} from {entry.ref}" + (f" ({choice.where})" if choice.where != ONLINE
                      else ""), entry.kernel, once=f"hub-served-{entry.name}")
        return
    if choice.refused:   # it does not load here, a rule refuses it, or its numbers differ
        line = compose(entry.kernel, f"sdpa for {entry.name}", f"no package, and {choice.reason}")
    else:                # not cached, and the hub is not asked (offline, not answering)
        line = compose(entry.kernel, f"sdpa for {entry.name}", f"no package, {choice.reason.split(', and ')[0]}",
                       f"cache {entry.ref} online")
    events.warning(line, entry.kernel, once=f"hub-sdpa-{entry.name}")


def _decide(found, env, settings, pins, *, load_online: bool = False) -> tuple:
    """HubChoices for `found`; `load_online`: a build the hub serves is loaded here too (transformers raises where
    a flash-attention kernel does not load; kernelize falls back by itself)."""
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
        if choice.serve and (load_online or choice.where != ONLINE):
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
