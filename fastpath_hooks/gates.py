"""Wrappers for transformers' availability gates (eras A and B; `lazy_load_kernel`).

A wrapper asks the runtime once (which may install or repair), then clears the
import and gate caches and returns the ORIGINAL gate's fresh answer - never a
True the real gate would not give. When the runtime blocks a kernel, the wrapper
says False without asking (the import would fail). Later calls cost one flag
test on top of the original (cached) gate.

The wrapper is rebound in every module that holds the original (found by
identity in each module's `__dict__`, which never triggers a lazy module's
`__getattr__`), so `from ...import_utils import is_..._available` done before
install() sees it too. `unpatch()` puts the originals back the same way.
"""

from __future__ import annotations

import functools
import importlib
import sys
from contextlib import contextmanager

GATES = {
    "is_flash_linear_attention_available": "fla",
    "is_causal_conv1d_available": "causal-conv1d",
}
# Cleared after an install so a later call re-reads the environment.
CACHED_GATES = tuple(GATES) + ("is_kernels_available", "is_mamba_ssm_available", "is_mamba_2_ssm_available")

_patched: dict = {}   # gate name -> (original, wrapper)


def patch(import_utils) -> None:
    for name, kernel in GATES.items():
        current = import_utils.__dict__.get(name)
        if current is None or getattr(current, "_fastpath_hooks_original", None) is not None:
            continue
        wrapper = _wrap(current, kernel, import_utils)
        _patched[name] = (current, wrapper)
        _rebind(current, wrapper)


def unpatch() -> None:
    for original, wrapper in list(_patched.values()):
        _rebind(wrapper, original)
    _patched.clear()


def patched() -> dict:
    return {name: pair[1] for name, pair in _patched.items()}


def _rebind(old, new) -> int:
    count = 0
    for module in list(sys.modules.values()):
        try:
            namespace = module.__dict__ if module is not None else None
        except Exception:
            continue
        if not isinstance(namespace, dict):
            continue
        for key, value in list(namespace.items()):
            if value is old:
                namespace[key] = new
                count += 1
    return count


def _wrap(original, kernel: str, import_utils):
    cell = [None]  # (allowed, simulate) after the first query

    @functools.wraps(original)
    def gate(*args, **kwargs):
        decided = cell[0]
        if decided is None:
            decided = cell[0] = _first_query(kernel, import_utils)
        allowed, simulate = decided
        if not allowed:
            return False
        if simulate:
            with simulated_accelerator(import_utils, simulate):
                return original(*args, **kwargs)
        return original(*args, **kwargs)

    for attr in ("cache_clear", "cache_info", "cache_parameters"):
        if hasattr(original, attr):
            setattr(gate, attr, getattr(original, attr))
    gate._fastpath_hooks_original = original
    gate._fastpath_hooks_kernel = kernel
    return gate


def _first_query(kernel: str, import_utils):
    try:
        from . import runtime

        outcome = runtime.ensure(kernel)
        refresh(import_utils)
        return outcome.block is None, runtime.simulation()
    except Exception as exc:  # the original gate's answer, untouched
        from .hooks import _internal_error

        _internal_error(exc)
        return True, None


def refresh(import_utils) -> None:
    """Make the next gate call see what is on disk now (transformers-eras.md, 'Making a gate say True')."""
    importlib.invalidate_caches()
    namespace = import_utils.__dict__
    for name in CACHED_GATES:
        clear = getattr(namespace.get(name), "cache_clear", None)
        if clear is not None:
            clear()
    mapping = namespace.get("_package_distribution_mapping")        # 5.23+
    if getattr(mapping, "cache_clear", None) is not None:
        mapping.cache_clear()
    elif "PACKAGE_DISTRIBUTION_MAPPING" in namespace:                # 5.0 - 5.22
        import importlib.metadata

        namespace["PACKAGE_DISTRIBUTION_MAPPING"] = importlib.metadata.packages_distributions()


@contextmanager
def simulated_accelerator(import_utils, kind: str):
    """While a wrapped gate runs, let it see the accelerator FASTPATH_HOOKS_TARGET poses.

    Only used when the target poses a GPU this machine does not have (dry runs,
    tests): the gate then answers as it would on the posed machine.
    """
    import torch

    module = torch.xpu if kind == "xpu" else torch.cuda
    real = module.is_available
    clear = getattr(import_utils.__dict__.get("is_torch_cuda_available"), "cache_clear", None)
    module.is_available = lambda: True
    if clear:
        clear()
    try:
        yield
    finally:
        module.is_available = real
        if clear:
            clear()
