"""Wrappers for transformers' availability gates (eras A and B; `lazy_load_kernel`).

A wrapper asks the engine once (`engine.ensure`, which may install or repair), clears the import and gate
caches and returns the ORIGINAL gate's fresh answer - never a True the real gate would not give; a blocked
kernel's gate says False. Then it steps aside: the original is rebound wherever the wrapper was, so later
calls cost what the original gate costs (benchmarks/gate_cost.py). Modules are searched by identity in their
`__dict__`, which never triggers a lazy module's `__getattr__`.
"""

from __future__ import annotations

import functools
import importlib
import sys
import threading


def gate_table(registry) -> dict:
    """gate -> the kernels its first query ensures: its own first (its answer), then those it is used `with`
    (the mamba family's fast path needs causal-conv1d too: `is_fast_path_available = all((..., causal_conv1d_fn,
    causal_conv1d_update))` in transformers 4.57.6 - 5.24.0)."""
    return {gate: (kernel,) + tuple(entry["with"]) for kernel, entry in registry.items() for gate in entry["gates"]}


def _gates() -> dict:
    from .._registry import registry   # with a FASTPATH_HOOKS_PINS file's kernels

    return gate_table(registry())


CACHED_GATES = ("is_kernels_available", "is_torch_cuda_available")   # cleared with the kernels' gates
_patched: dict = {}   # gate name -> (original, wrapper), kept after it stepped aside, until uninstall()
_bound: dict = {}     # id(wrapper) -> [(namespace, key)] where patch() bound it: stepping aside needs no scan
_PASS, _BLOCKED = "pass", "blocked"   # a wrapper's mode after its first query (else: an accelerator to simulate)
_simulation_lock = threading.RLock()


def patch(import_utils, hooks, *, just_imported: bool = False) -> None:
    """Wrap the gates of `import_utils` and rebind them (callers hold `hooks.lock`; `hooks`: hooks.HOOKS).
    just_imported: the module has just executed, so only its namespace can hold the originals. Else the gates are
    looked for where they can be: transformers' own modules, under any name; then, only where a gate's reference
    count says something else holds it (a user's `from transformers.utils import is_causal_conv1d_available`), the
    other modules holding a gate under its own name, each whole (a copy only under another name keeps the
    original, which still answers). Walking all ~1,400 namespaces of a training process cost install() 11-20 ms."""
    table, namespace = _gates(), import_utils.__dict__
    held = {} if just_imported else _references(namespace, table)   # counted before any reference of ours exists
    swaps, left, names = {}, {}, set()
    for name, kernels in table.items():
        current = namespace.get(name)
        if current is None or getattr(current, "_fastpath_hooks_original", None) is not None:
            continue
        if name in _patched and _patched[name][0] is current:
            continue  # the wrapper stepped aside: done, not wrapped again
        wrapper = _wrap(current, kernels, import_utils, hooks)
        _patched[name] = (current, wrapper)
        swaps[id(current)] = (current, wrapper)
        names.add(name)
        left[id(wrapper)] = held.get(name)   # its references not rebound yet (None: not counted)
    if not swaps:
        return
    rebound = _rebind(swaps, [namespace] if just_imported else  # transformers' modules holding a gate (in C)
                      [ns for ns in _namespaces(_transformers()) if not swaps.keys().isdisjoint(map(id, ns.values()))])
    for _, _, new in rebound:
        if left[id(new)] is not None:
            left[id(new)] -= 1
    if not just_imported and any(n is None or n > 0 for n in left.values()):   # held beyond transformers
        names = frozenset(names)
        rebound += _rebind(swaps, [ns for ns in _namespaces(_transformers(inside=False)) if ns.keys() & names])
    for where, key, new in rebound:
        _bound.setdefault(id(new), []).append((where, key))


def unpatch() -> None:
    """In every module: a wrapper copied anywhere since, under any name, would go on deciding after uninstall()."""
    if _patched:
        _rebind({id(wrapper): (wrapper, original) for original, wrapper in _patched.values()}, _namespaces())
    _patched.clear()
    _bound.clear()


def _references(namespace: dict, names) -> dict:
    """name -> the references to namespace[name] (sys.getrefcount, less what asking adds, measured on an object
    held the same way: Python versions count a call's own references differently); {} where none are counted."""
    count = getattr(sys, "getrefcount", None)
    if count is None:
        return {}
    probe = {"probe": object()}
    asking = count(probe["probe"]) - 1
    out = {}
    for name in names:
        if name in namespace:
            out[name] = count(namespace[name]) - asking
    return out


def _namespaces(names=None) -> list:
    """The namespaces of the loaded modules (of those `names`: no other module is touched)."""
    out = []
    for name in list(sys.modules) if names is None else names:
        try:
            namespace = sys.modules[name].__dict__
        except Exception:   # gone meanwhile, or an odd object in sys.modules (a proxy whose __dict__ raises)
            continue
        if isinstance(namespace, dict):
            out.append(namespace)
    return out


def _transformers(inside: bool = True) -> list:
    """The names of transformers' own loaded modules (inside=False: of all the others)."""
    return [name for name in list(sys.modules) if (name == "transformers" or name.startswith("transformers.")) is inside]


def _rebind(swaps: dict, namespaces) -> list:
    """Replace each `old` with its `new` (swaps: id(old) -> (old, new)) in `namespaces`; [(namespace, key, new)]."""
    out = []
    for namespace in namespaces:
        for key, value in list(namespace.items()):
            pair = swaps.get(id(value))
            if pair is not None and pair[0] is value:
                namespace[key] = pair[1]
                out.append((namespace, key, pair[1]))
    return out


def _wrap(original, kernels: tuple, import_utils, hooks):
    mode = None  # None until the first query; then _PASS, _BLOCKED or an accelerator kind to simulate

    @functools.wraps(original)
    def gate(*args, **kwargs):
        nonlocal mode
        if mode is _PASS:  # the common case after the first query: one identity test
            return original(*args, **kwargs)
        if mode is None:
            mode = _first_query(kernels, import_utils, hooks)
            if mode is _PASS:
                _step_aside(gate, original, hooks)
                return original(*args, **kwargs)
        if mode is _BLOCKED:
            return False
        return _simulated(mode, import_utils, lambda: original(*args, **kwargs))

    for attr in ("cache_clear", "cache_info", "cache_parameters"):
        if hasattr(original, attr):
            setattr(gate, attr, getattr(original, attr))
    gate._fastpath_hooks_original = original
    gate._fastpath_hooks_kernel = kernels[0]
    return gate


def _step_aside(wrapper, original, hooks) -> None:
    """Put the original back where patch() bound the wrapper and in transformers' modules, which may have
    copied it since (a key lookup each); a copy elsewhere keeps the wrapper, which only passes through."""
    try:
        name = original.__name__
        with hooks.lock:
            for namespace, key in _bound.pop(id(wrapper), ()):
                if namespace.get(key) is wrapper:
                    namespace[key] = original
            for namespace in _namespaces(_transformers()):
                if namespace.get(name) is wrapper:
                    namespace[name] = original
    except Exception as exc:  # the wrapper keeps passing through: only a little slower
        hooks.internal_error(exc)


def _first_query(kernels: tuple, import_utils, hooks):
    try:
        from .. import engine
        from ..engine.outcome import CHANGED

        if not hooks.selected(kernels[0]):  # install(kernels=...) left this one alone
            return _PASS
        engine.expect_from(modeling_kernels)   # read only if this kernel is about to be installed
        outcome = engine.ensure(kernels[0])
        for partner in kernels[1:]:     # what the gate's models need with it; its answer stays the gate's own
            if hooks.selected(partner):
                engine.ensure(partner)
    except Exception as exc:  # the original gate's answer, untouched
        hooks.internal_error(exc)
        return _PASS
    mode = _BLOCKED if outcome.block is not None else None   # decided: nothing after this may drop a block
    try:
        refresh(import_utils, distributions=any(o.state in CHANGED for o in engine.outcomes().values()))
        return mode or engine.simulation() or _PASS
    except Exception as exc:  # a stale cache at worst; a blocked kernel stays blocked
        hooks.internal_error(exc)
        return mode or _PASS


def refresh(import_utils, *, distributions: bool = True) -> None:
    """Make the next gate call see what is on disk now (transformers-eras.md, 'Making a gate say True').
    distributions: also rebuild transformers' package -> distribution mapping (after an install)."""
    importlib.invalidate_caches()
    namespace = import_utils.__dict__
    for name in tuple(_gates()) + CACHED_GATES:
        clear = getattr(namespace.get(name), "cache_clear", None)
        if clear is not None:
            clear()
    if not distributions:
        return
    mapping = namespace.get("_package_distribution_mapping")        # 5.23+
    if getattr(mapping, "cache_clear", None) is not None:
        mapping.cache_clear()
    elif "PACKAGE_DISTRIBUTION_MAPPING" in namespace:                # 5.0 - 5.22
        from importlib.metadata import packages_distributions

        namespace["PACKAGE_DISTRIBUTION_MAPPING"] = packages_distributions()


def _simulated(kind: str, import_utils, call):
    """`call()` (a wrapped gate) seeing the GPU FASTPATH_HOOKS_TARGET poses and this machine lacks: only
    during the call, under a lock, `torch.<cuda|xpu>.is_available` says True (era A's gates ask torch) and
    transformers' cached `is_torch_cuda_available` is cleared before and after."""
    try:
        import torch

        module = torch.xpu if kind == "xpu" else torch.cuda
    except Exception:
        return call()
    clear = getattr(import_utils.__dict__.get("is_torch_cuda_available"), "cache_clear", None) or (lambda: None)
    with _simulation_lock:
        real, module.is_available = module.is_available, lambda: True
        clear()
        try:
            return call()
        finally:
            module.is_available = real
            clear()


def modeling_kernels() -> set:
    """The registry's kernels named (a package in quotes, the kernel's name, or a gate) by the modeling modules
    being imported now: the engine's hint for a batch. transformers >= 5.15 imports each kernel package while
    a modeling module executes, so without it granitemoehybrid's causal-conv1d and mamba-ssm would not build
    side by side."""
    from .._registry import registry

    sources = []
    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        if name.startswith("transformers.models.") and getattr(spec, "_initializing", False) and spec.origin:
            try:
                with open(spec.origin, encoding="utf-8", errors="replace") as fh:
                    sources.append(fh.read())
            except OSError:
                continue
    if not sources:
        return set()
    text = "\n".join(sources)
    return {kernel for kernel, entry in registry().items()
            if any(f'"{m}"' in text or f"'{m}'" in text for m in entry["modules"]) or f'"{kernel}"' in text
            or any(g in text for g in entry["gates"])}
