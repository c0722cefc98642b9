"""Wrappers for transformers' availability gates (eras A and B; `lazy_load_kernel`).

A wrapper asks the engine once (`engine.ensure`, which may install or repair), clears the import and
gate caches and returns the ORIGINAL gate's fresh answer - never a True the real gate would not give;
a blocked kernel's gate says False. Its job done, the wrapper steps aside: the original is rebound
wherever the wrapper was, so later calls cost what the original (cached) gate costs
(benchmarks/gate_cost.py). Wrappers are (un)bound in every module holding the original, found by
identity in each module's `__dict__`, which never triggers a lazy module's `__getattr__`.
"""

from __future__ import annotations

import functools
import importlib
import sys
import threading
from contextlib import contextmanager


def gate_table(registry) -> dict:
    """gate -> the kernels its first query ensures: its own first (its answer), then the ones it is used
    `with` (registry): the mamba family's fast path needs causal-conv1d too (`is_fast_path_available =
    all((selective_state_update, ..., causal_conv1d_fn, causal_conv1d_update))` in transformers 4.57.6 -
    5.24.0), so asking for one gets both; era B's `lazy_load_kernel("mamba-ssm")` finds its gate by name."""
    return {gate: (kernel,) + tuple(entry["with"]) for kernel, entry in registry.items() for gate in entry["gates"]}


def _gates() -> dict:
    """The gates of the registry (and of a FASTPATH_HOOKS_PINS file's kernels)."""
    from .._registry import registry

    return gate_table(registry())


# Cleared after the first query so a later call re-reads the environment (with the kernels' gates).
CACHED_GATES = ("is_kernels_available", "is_torch_cuda_available")

# gate name -> (original, wrapper), kept after the wrapper stepped aside (install() again does not wrap
# that gate again); only uninstall() forgets it.
_patched: dict = {}
_bound: dict = {}   # id(wrapper) -> [(namespace, key)] where patch() bound it: stepping aside needs no full scan
_PASS, _BLOCKED = "pass", "blocked"   # a wrapper's mode after its first query (else: an accelerator to simulate)
_simulation_lock = threading.RLock()


def patch(import_utils, hooks, *, just_imported: bool = False) -> None:
    """Wrap the gates of `import_utils` and rebind them (callers hold `hooks.lock`; `hooks`: hooks.HOOKS).
    just_imported: the module has just executed, so only its namespace can hold the originals."""
    swaps = {}
    for name, kernels in _gates().items():
        current = import_utils.__dict__.get(name)
        if current is None or getattr(current, "_fastpath_hooks_original", None) is not None:
            continue
        if name in _patched and _patched[name][0] is current:
            continue  # the wrapper stepped aside: done, not wrapped again
        wrapper = _wrap(current, kernels, import_utils, hooks)
        _patched[name] = (current, wrapper)
        swaps[id(current)] = (current, wrapper)
    if not swaps:
        return
    bound = _rebind_in([import_utils.__dict__], swaps) if just_imported else _rebind(swaps)
    for namespace, key, new in bound:
        _bound.setdefault(id(new), []).append((namespace, key))


def unpatch() -> None:
    _rebind({id(wrapper): (wrapper, original) for original, wrapper in _patched.values()})
    _patched.clear()
    _bound.clear()


def _rebind(swaps: dict) -> list:
    """Replace each `old` with its `new` (swaps: id(old) -> (old, new)) in every module's namespace;
    [(namespace, key, new)] rebound."""
    if not swaps:
        return []
    namespaces = []
    for module in list(sys.modules.values()):
        try:
            namespace = module.__dict__
        except Exception:
            continue
        if isinstance(namespace, dict):
            namespaces.append(namespace)
    return _rebind_in(namespaces, swaps)


def _rebind_in(namespaces, swaps: dict) -> list:
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
        with simulated_accelerator(import_utils, mode):
            return original(*args, **kwargs)

    for attr in ("cache_clear", "cache_info", "cache_parameters"):
        if hasattr(original, attr):
            setattr(gate, attr, getattr(original, attr))
    gate._fastpath_hooks_original = original
    gate._fastpath_hooks_kernel = kernels[0]
    return gate


def _step_aside(wrapper, original, hooks) -> None:
    """Put the original back where patch() bound the wrapper and in transformers' modules, which may have
    copied it since (a key lookup each, no full scan); a copy elsewhere keeps the wrapper, which now only
    passes through."""
    try:
        name = original.__name__
        with hooks.lock:
            for namespace, key in _bound.pop(id(wrapper), ()):
                if namespace.get(key) is wrapper:
                    namespace[key] = original
            for module_name, module in list(sys.modules.items()):
                if module_name == "transformers" or module_name.startswith("transformers."):
                    namespace = getattr(module, "__dict__", None)
                    if isinstance(namespace, dict) and namespace.get(name) is wrapper:
                        namespace[name] = original
    except Exception as exc:  # the wrapper keeps passing through: only a little slower
        hooks.internal_error(exc)


def _first_query(kernels: tuple, import_utils, hooks):
    try:
        from .. import engine
        from ..engine.outcome import CHANGED

        kernel = kernels[0]
        if not hooks.selected(kernel):  # install(kernels=...) left this one alone
            return _PASS

        engine.expect_from(modeling_kernels)   # read only if this kernel is about to be installed
        outcome = engine.ensure(kernel)
        for partner in kernels[1:]:     # what the gate's models need with it; its answer stays the gate's own
            if hooks.selected(partner):
                engine.ensure(partner)
    except Exception as exc:  # the original gate's answer, untouched
        hooks.internal_error(exc)
        return _PASS
    # The block is decided: nothing after this point may drop it (fail safe at the seam).
    mode = _BLOCKED if outcome.block is not None else None
    try:
        changed = any(o.state in CHANGED for o in engine.outcomes().values())
        refresh(import_utils, distributions=changed)
        return mode or engine.simulation() or _PASS
    except Exception as exc:  # a stale cache at worst; a blocked kernel stays blocked
        hooks.internal_error(exc)
        return mode or _PASS


def refresh(import_utils, *, distributions: bool = True) -> None:
    """Make the next gate call see what is on disk now (transformers-eras.md, 'Making a gate say True').
    distributions: also rebuild transformers' package -> distribution mapping (after an install; ~50 ms on
    5.0 - 5.22)."""
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


@contextmanager
def simulated_accelerator(import_utils, kind: str):
    """While a wrapped gate runs, let it see the GPU FASTPATH_HOOKS_TARGET poses and this machine lacks
    (dry runs, tests). `torch.<cuda|xpu>.is_available` is patched for the call only, under a lock, with
    transformers' cached `is_torch_cuda_available` cleared before and after, so nothing else in the
    process sees a GPU; torch, not transformers, because era A's gates call torch.cuda.is_available()."""
    try:
        import torch

        module = torch.xpu if kind == "xpu" else torch.cuda
        real = module.is_available
    except Exception:
        yield
        return
    clear = getattr(import_utils.__dict__.get("is_torch_cuda_available"), "cache_clear", None)
    with _simulation_lock:
        module.is_available = _available
        if clear:
            clear()
        try:
            yield
        finally:
            module.is_available = real
            if clear:
                clear()


def _available() -> bool:
    return True


def modeling_kernels() -> set:
    """The registry's kernels the transformers modeling modules being imported right now name: the
    engine's hint for a batch (engine.expect_from), read only when an install is about to start.
    transformers >= 5.15 imports each kernel package while a modeling module executes, one after the
    other, so without it granitemoehybrid's causal-conv1d and mamba-ssm would not build side by side.
    A module names a kernel by a package in quotes, the kernel's name, or one of its gates."""
    from .._registry import registry

    sources = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("transformers.models.") or module is None:
            continue
        spec = getattr(module, "__spec__", None)
        if spec is None or not getattr(spec, "_initializing", False) or not spec.origin:
            continue
        try:
            with open(spec.origin, encoding="utf-8", errors="replace") as fh:
                sources.append(fh.read())
        except OSError:
            continue
    if not sources:
        return set()
    text = "\n".join(sources)
    out = set()
    for kernel, entry in registry().items():
        names = [f'"{m}"' for m in entry["modules"]] + [f"'{m}'" for m in entry["modules"]] + [f'"{kernel}"']
        if any(n in text for n in names) or any(g in text for g in entry["gates"]):
            out.add(kernel)
    return out
