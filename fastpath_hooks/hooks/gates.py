"""Wrappers for transformers' availability gates (eras A and B; `lazy_load_kernel`).

A wrapper asks the engine once (`engine.ensure`, which may install or repair), then clears the
import and gate caches and returns the ORIGINAL gate's fresh answer - never a
True the real gate would not give. When the engine blocks a kernel, the wrapper
says False without asking (the import would fail). Otherwise, its job done, the
wrapper steps aside: the original is rebound wherever the wrapper was, so later
calls cost exactly what the original (cached) gate costs (benchmarks/gate_cost.py).

The wrapper is rebound in every module that holds the original (found by
identity in each module's `__dict__`, which never triggers a lazy module's
`__getattr__`), so `from ...import_utils import is_..._available` done before
install() sees it too. `unpatch()` puts the originals back the same way.

Which kernels the modeling module being imported will ask for: the engine's hint for a batch.

transformers >= 5.15 imports each kernel package while its modeling module executes (the
decorators of `use_kernel_func_from_hub_with_fallback(..., "causal_conv1d")` run one after the
other), and eras A/B ask a gate per package: the first kernel is decided before the next is asked
for. When the first is about to be installed, the engine asks this hint (engine.expect_from):
every `transformers.models.*` module still executing, its source read for the kernels it names -
a package in quotes (`"mamba_ssm"`), a kernel name (`lazy_load_kernel("mamba-ssm")`) or a gate
(`is_mamba_2_ssm_available`) - so that granitemoehybrid's causal-conv1d and mamba-ssm build side
by side and install in one batch. Only read on that path (an install is about to start), never at
a warm start.
"""

from __future__ import annotations

import functools
import importlib
import sys
import threading
from contextlib import contextmanager


def gate_table(registry) -> dict:
    """gate -> the kernels its first query ensures: the gate's own first (its answer; a block makes it
    False), then the ones it is used `with` (registry). The mamba gates' models (mamba, mamba2, jamba,
    bamba, zamba, ... in eras A/B) take their fast path only with causal-conv1d too
    (`is_fast_path_available = all((selective_state_update, ..., causal_conv1d_fn, causal_conv1d_update))`),
    and mamba-ssm's mamba_inner_fn calls causal_conv1d: asking for one gets both. Read from transformers
    4.57.6 / 5.14.1 / 5.24.0 `utils/import_utils.py` (the gates) and the mamba-family modeling files (what
    they need); era B's `lazy_load_kernel("mamba-ssm")` finds `is_mamba_ssm_available` by name here."""
    return {gate: (kernel,) + tuple(entry["with"]) for kernel, entry in registry.items() for gate in entry["gates"]}


def _gates() -> dict:
    """The gates of the registry (and of a FASTPATH_HOOKS_PINS file's kernels), read when they are wrapped."""
    from .._registry import registry

    return gate_table(registry())
# Cleared after the first query so a later call re-reads the environment (with the kernels' gates).
CACHED_GATES = ("is_kernels_available", "is_torch_cuda_available")

# gate name -> (original, wrapper). Kept after the wrapper stepped aside: install() again does
# not wrap that gate again (its job is done) - only uninstall() forgets it.
_patched: dict = {}
# id(wrapper) -> [(namespace, key)]: where patch() bound it, so stepping aside needs no full scan.
_bound: dict = {}
# A wrapper's mode after its first query: pass through, answer False, or simulate an accelerator.
_PASS, _BLOCKED = "pass", "blocked"
_simulation_lock = threading.RLock()


def patch(import_utils, hooks, *, just_imported: bool = False) -> None:
    """Wrap the gates of `import_utils` and rebind them (callers hold `hooks.lock`; `hooks`: the
    hooks' registry, hooks.HOOKS, which the wrappers ask what is selected).

    just_imported: called right after that module executed - nothing else can hold the
    originals yet, so only its namespace is rebound; otherwise every module's (one pass).
    """
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
    if just_imported:
        bound = _rebind_in([import_utils.__dict__], swaps)
    else:
        bound = _rebind(swaps)
    for namespace, key, new in bound:
        _bound.setdefault(id(new), []).append((namespace, key))


def unpatch() -> None:
    _rebind({id(wrapper): (wrapper, original) for original, wrapper in _patched.values()})
    _patched.clear()
    _bound.clear()


def _rebind(swaps: dict) -> list:
    """One pass over every module's namespace: replace each `old` (by identity) with its `new`.

    swaps: id(old) -> (old, new). Reads `module.__dict__`, never getattr, so a lazy
    module's `__getattr__` is not triggered. Returns [(namespace, key, new)] rebound.
    """
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
    """Put the original back wherever the wrapper is: nothing is left for the wrapper to do.

    Where patch() bound it, and in transformers' modules, which may have copied it since
    (`from ...import_utils import is_..._available` in a modeling module imported later) -
    a key lookup each, no full scan. A copy elsewhere keeps the wrapper, which now only
    passes through (one identity test)."""
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

        engine.expect_from(_modeling_hint)   # read only if this kernel is about to be installed
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

    distributions: also rebuild transformers' package -> distribution mapping
    (only needed after an install; ~50 ms on 5.0 - 5.22).
    """
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
    """While a wrapped gate runs, let it see the accelerator FASTPATH_HOOKS_TARGET poses.

    Only used when the target poses a GPU this machine does not have (dry runs,
    tests): the gate then answers as it would on the posed machine. The patch of
    `torch.<cuda|xpu>.is_available` lasts for the call only (serialised by a lock,
    transformers' cached `is_torch_cuda_available` cleared before and after), so
    nothing else in the process - the model's own device checks - sees a GPU.
    Without an importable torch the gate runs as it is. It patches torch, not transformers'
    `is_torch_cuda_available`: era A's gates (4.57.6) call `torch.cuda.is_available()` themselves.
    """
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


def _modeling_hint():
    """The kernels the modeling module being imported names (hooks/gates.py), for the engine's batch."""
    return modeling_kernels()


def modeling_kernels() -> set:
    """The registry's kernels the transformers modeling modules being imported right now name."""
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
