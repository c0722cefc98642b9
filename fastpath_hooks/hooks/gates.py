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


# the locals transformers' code holds a model's requested attention in while it resolves it (4.56 - 5.25:
# _check_and_adjust_attn_implementation, get_correct_attn_implementation, set_attn_implementation, _lazy_imports)
ASKING_LOCALS = ("attn_implementation", "requested_attention", "applicable_attention", "requested_implementation",
                 "applicable_attn_implementation", "implementation")
FLASH_MATRIX = ("transformers.modeling_flash_attention_utils", "FLASH_ATTENTION_COMPATIBILITY_MATRIX")


def asked(implementation: str, frame=None) -> bool:
    """Whether transformers is resolving a model's attention to `implementation` (flash_attention_2) now: a frame of
    its code holds it as the requested implementation. transformers asks the flash-attention gates for every model
    too (its modeling_utils, at import: flash_attn_supports_top_left_mask), so only this asking installs."""
    frame = sys._getframe(1) if frame is None else frame
    while frame is not None:
        if (frame.f_globals.get("__name__") or "").startswith("transformers"):
            local = frame.f_locals
            if any(local.get(name) == implementation for name in ASKING_LOCALS):
                return True
        frame = frame.f_back
    return False


def gate_table(registry) -> dict:
    """gate -> the kernels its first query ensures: its own first (its answer), then those it is used `with`
    (the mamba family's fast path needs causal-conv1d too: `is_fast_path_available = all((..., causal_conv1d_fn,
    causal_conv1d_update))` in transformers 4.57.6 - 5.24.0)."""
    return {gate: (kernel,) + tuple(entry["with"]) for kernel, entry in registry.items() for gate in entry["gates"]}


def _gates() -> dict:
    from .._registry import registry   # with a FASTPATH_HOOKS_PINS file's kernels

    return gate_table(registry())


def _asked_as(kernel: str):
    """The attn_implementation that asks for `kernel` (flash-attn: flash_attention_2), None for the others."""
    from .._registry import registry

    return (registry().get(kernel) or {}).get("attn_implementation")


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
    if not just_imported:   # transformers imported before install(): its flash-attention table holds originals
        rebound += _rebind_matrix(swaps)
    for where, key, new in rebound:
        _bound.setdefault(id(new), []).append((where, key))


def unpatch() -> None:
    """In every module: a wrapper copied anywhere since, under any name, would go on deciding after uninstall()."""
    if _patched:
        swaps = {id(wrapper): (wrapper, original) for original, wrapper in _patched.values()}
        _rebind(swaps, _namespaces())
        _rebind_matrix(swaps)
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


def _rebind_matrix(swaps: dict) -> list:
    """The gates FLASH_ATTENTION_COMPATIBILITY_MATRIX (transformers 5.x) holds as `general_availability_check`,
    replaced as _rebind does in module namespaces: [(the entry, key, new)]."""
    module = sys.modules.get(FLASH_MATRIX[0])
    matrix = getattr(module, "__dict__", {}).get(FLASH_MATRIX[1])
    return _rebind(swaps, [entry for entry in (matrix.values() if isinstance(matrix, dict) else ())
                           if isinstance(entry, dict)])


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
    asked_as = _asked_as(kernels[0])   # an attention kernel: its gate installs only when a model asks for it

    @functools.wraps(original)
    def gate(*args, **kwargs):
        nonlocal mode
        if mode is _PASS:  # the common case after the first query: one identity test
            return original(*args, **kwargs)
        if mode is None:
            if asked_as is not None and not asked(asked_as, sys._getframe(1)):
                return original(*args, **kwargs)   # every model's import asks too: its own answer, nothing installed
            mode = _first_query(kernels, import_utils, hooks)
            if asked_as is not None:   # the package cannot serve the model asking: the hub's kernel, else sdpa
                _without_package(kernels[0], asked_as, lambda: gate(*args, **kwargs), hooks)
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


def _without_package(kernel: str, implementation: str, answer, hooks) -> None:
    """Where the gate now says False, transformers 5.25+ loads the hub kernel it names for `implementation`, and
    raises where that does not load: decided by the engine first (engine/hub.py `attention`)."""
    try:
        if hooks.selected(kernel) and not answer():
            from ..engine.hub import attention

            attention(kernel, implementation)
    except Exception as exc:   # transformers' own behaviour, untouched
        hooks.internal_error(exc)


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
    elif isinstance(namespace.get("PACKAGE_DISTRIBUTION_MAPPING"), dict):   # 5.0 - 5.22
        from importlib.metadata import packages_distributions

        # in place: modeling_flash_attention_utils holds the same dict (`from .utils.import_utils import ...`)
        fresh = packages_distributions()
        namespace["PACKAGE_DISTRIBUTION_MAPPING"].clear()
        namespace["PACKAGE_DISTRIBUTION_MAPPING"].update(fresh)


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
    version = getattr(torch, "version", None)
    # era A's flash-attention gate also reads torch.version.cuda (None in a CPU build): the posed CUDA release
    cuda = _posed_cuda() if kind != "xpu" and version is not None and not getattr(version, "cuda", None) else None
    with _simulation_lock:
        real, module.is_available = module.is_available, lambda: True
        if cuda:
            version.cuda = cuda
        clear()
        try:
            return call()
        finally:
            module.is_available = real
            if cuda:
                version.cuda = None
            clear()


def _posed_cuda() -> str:
    """The CUDA release FASTPATH_HOOKS_TARGET poses (`cuda=12.8`), else "12.0"."""
    import os

    for entry in os.environ.get("FASTPATH_HOOKS_TARGET", "").split(","):
        key, _, value = entry.partition("=")
        if key.strip().lower() == "cuda" and value.strip()[:1].isdigit():
            return value.strip()
    return "12.0"


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
    return {kernel for kernel, entry in registry().items() if not entry.get("attn_implementation")   # asked for only
            and (any(f'"{m}"' in text or f"'{m}'" in text for m in entry["modules"]) or f'"{kernel}"' in text
                 or any(g in text for g in entry["gates"]))}
