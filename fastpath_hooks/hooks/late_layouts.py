"""How transformers' modeling modules hold their kernel choice, for the late pass (hooks/late.py):
per era, which module globals a fresh import binds and from where (DATA, read from the released
sources of 4.57.6, 5.14.1 and 5.24.0), and which of the modeling modules already imported hold one.

Loaded only with the late pass (install() with transformers imported): the stdlib and the leaf _names.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from .._names import DECORATED, KERNEL_MODULES

PREFIX = "transformers.models."

# package -> kernel it is managed as (the import name -> the distribution fastpath-hooks manages: the registry)
PACKAGES = KERNEL_MODULES

# How these tables were read (2026-12-01), from the released wheels' sources (`pip download --no-deps
# transformers==X`), with `ast`, never by eye alone:
# - DECORATED (era C, 5.24.0): every module-level `@use_kernel_func_from_hub_with_fallback(func, package)`
#   function AND assignment (`x = use_kernel_func_from_hub_with_fallback(func, package)(torch_x)`: zamba) in
#   models/*/modeling_*.py; tests/test_late.py (functions) and tests/test_mamba_families.py (the mamba
#   families, assignments too) read the installed transformers the same way and fail on a difference.
# - MODELS "A" (4.57.6): the module-level `if is_X_available(): from pkg import ... / else: ... = None`
#   blocks of every modeling module that names a gate, and its module-level `is_fast_path_available = all(...)`.
# - MODELS "B" (5.14.1): the names each mixer's __init__ declares `global` and binds from
#   `lazy_load_kernel("causal-conv1d" | "mamba-ssm")` (which asks `is_{name}_available` by name), and its
#   `is_fast_path_available` when that is global too.

# Era C: DECORATED (module global -> (func_name, package)), in _names (the hub's kernels are named by func_name).

# Eras A/B: module global -> (package, module it comes from, attribute), bound behind the package's gate.
_SSM_SCAN = "mamba_ssm.ops.selective_scan_interface"
_SSM_SSD = "mamba_ssm.ops.triton.ssd_combined"
BOUND = {
    "causal_conv1d_fn": ("causal_conv1d", "causal_conv1d", "causal_conv1d_fn"),
    "causal_conv1d_update": ("causal_conv1d", "causal_conv1d", "causal_conv1d_update"),
    "chunk_gated_delta_rule": ("fla", "fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
    "fused_recurrent_gated_delta_rule": ("fla", "fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule"),
    "FusedRMSNormGated": ("fla", "fla.modules", "FusedRMSNormGated"),
    "ShortConvolution": ("fla", "fla.modules", "ShortConvolution"),
    "selective_state_update": ("mamba_ssm", "mamba_ssm.ops.triton.selective_state_update", "selective_state_update"),
    "mamba_chunk_scan_combined": ("mamba_ssm", _SSM_SSD, "mamba_chunk_scan_combined"),
    "mamba_split_conv1d_scan_combined": ("mamba_ssm", _SSM_SSD, "mamba_split_conv1d_scan_combined"),
    # era B reads these two from the package root (`getattr(mamba_ssm, ...)`), which re-exports them from here
    "selective_scan_fn": ("mamba_ssm", _SSM_SCAN, "selective_scan_fn"),
    "mamba_inner_fn": ("mamba_ssm", _SSM_SCAN, "mamba_inner_fn"),
}


def gates() -> dict:
    """package -> the gate its modeling code asks first (the registry's first gate of the kernel); read
    when a module is healed, so that install() in a process with transformers loads no registry."""
    from .._registry import REGISTRY

    return {entry["modules"][0]: entry["gates"][0] for entry in REGISTRY.values() if entry["gates"]}

# How a layer sees the module's choice: CALL - forward reads the module globals at call time
# (a model built before install() follows); BUILT - copied into the layer when it is built.
CALL, BUILT = "call", "built"


@dataclass(frozen=True)
class Layout:
    """How one modeling module of one era holds its kernel choice."""

    names: tuple                    # the module globals a fresh import (A) or a fresh mixer (B) binds behind gates
    fast_path: tuple                # `is_fast_path_available` = all(these), where the module has that global
    layers: str = CALL
    tuple_global: str | None = None  # a module tuple of the fast-path objects (lfm2's `kernel_modules`)
    optional: tuple = ()            # names bound only when the gate says yes (no `else: name = None`)
    gates: tuple = ()               # (package, gate) where the module asks another gate than gates()[package]
    sources: tuple = ()             # (name, (package, module, attribute)) where it is not BOUND[name]

    def source(self, name: str) -> tuple:
        return dict(self.sources).get(name) or BOUND[name]

    def gate(self, package: str) -> str:
        return dict(self.gates).get(package) or gates().get(package, "")


_CONV = ("causal_conv1d_fn", "causal_conv1d_update")
_GDN = _CONV + ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule")
_OLMO = ("ShortConvolution", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "FusedRMSNormGated")
_SSM1 = ("selective_state_update", "selective_scan_fn", "mamba_inner_fn")                    # mamba, jamba, zamba
_SSM2 = ("selective_state_update", "mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined")  # Mamba-2 mixers
_MAMBA2_GATE = (("mamba_ssm", "is_mamba_2_ssm_available"),)
_QWEN = Layout(_GDN + ("FusedRMSNormGated",), _GDN, BUILT)

# Eras A/B: model -> era -> Layout. Era B's mamba family binds its globals in a mixer's __init__
# (lazy_load_kernel): absent until a model is built - then nothing was chosen yet, and a model built
# after install() asks the wrapped gate itself.
MODELS = {
    "qwen3_next": {"A": _QWEN, "B": _QWEN},
    "qwen3_5": {"B": _QWEN},
    "qwen3_5_moe": {"B": _QWEN},
    "olmo_hybrid": {"B": Layout(_OLMO, _OLMO, BUILT)},
    "lfm2": {"A": Layout(_CONV, _CONV, CALL, "kernel_modules"), "B": Layout(_CONV, _CONV, CALL, "kernel_modules")},
    "lfm2_moe": {"B": Layout(_CONV, _CONV, CALL, "kernel_modules")},
    # era A: the causal-conv1d pair is cached in `_causal_conv1d_cache` (RESET_CACHES), not a module global;
    # falcon_mamba's mamba_inner_fn is transformers' own (kernels/falcon_mamba), imported behind the mamba gate
    "mamba": {"A": Layout(_SSM1, _SSM1), "B": Layout(_CONV + _SSM1, _SSM1 + _CONV)},
    "falcon_mamba": {"A": Layout(_SSM1, _SSM1, sources=(
                         ("mamba_inner_fn", ("mamba_ssm", "transformers.kernels.falcon_mamba", "mamba_inner_fn")),)),
                     # era B asks lazy_load_kernel("falcon_mamba-ssm"): no `is_falcon_mamba_ssm_available`
                     # exists, so without the hub's `kernels` it never gets mamba_ssm - only causal-conv1d
                     "B": Layout(_CONV, ("selective_state_update", "selective_scan_fn", "falcon_mamba_inner_fn") + _CONV)},
    "jamba": {"A": Layout(_SSM1 + _CONV, _SSM1 + _CONV), "B": Layout(_CONV + _SSM1, _SSM1 + _CONV)},
    "zamba": {"A": Layout(_SSM1 + _CONV, _SSM1 + _CONV), "B": Layout(_CONV + _SSM1, _SSM1 + _CONV)},
    "mamba2": {"A": Layout(_SSM2 + _CONV, _SSM2 + _CONV, gates=_MAMBA2_GATE), "B": Layout(_CONV + _SSM2, _SSM2 + _CONV)},
    "zamba2": {"A": Layout(_SSM2 + _CONV, ("selective_state_update",) + _CONV), "B": Layout(_CONV + _SSM2, _SSM2 + _CONV)},
    # era A: `else: selective_state_update = None` only - the two scans exist only when the gate said yes
    "bamba": {"A": Layout(_SSM2 + _CONV, ("selective_state_update",) + _CONV, optional=_SSM2[1:], gates=_MAMBA2_GATE),
              "B": Layout(_CONV + _SSM2, _SSM2 + _CONV)},
    "falcon_h1": {"A": Layout(_SSM2 + _CONV, ("selective_state_update",) + _CONV, optional=_SSM2[1:],
                              gates=_MAMBA2_GATE),
                  "B": Layout(_CONV + _SSM2, _SSM2 + _CONV)},
    "granitemoehybrid": {"A": Layout(_SSM2 + _CONV, ("selective_state_update",) + _CONV, optional=_SSM2[1:],
                                     gates=_MAMBA2_GATE),
                         "B": Layout(_CONV + _SSM2, _SSM2 + _CONV)},
    "nemotron_h": {"B": Layout(_CONV + _SSM2, _SSM2 + _CONV)},
}
# Era A: mamba and falcon_mamba cache (update, fn) in this global at the first layer built;
# a cached (None, None) is reset so the next forward asks the (wrapped) gate again.
RESET_CACHES = {"mamba": "_causal_conv1d_cache", "falcon_mamba": "_causal_conv1d_cache"}

_NAMES = frozenset(DECORATED) | frozenset(BOUND) | frozenset(RESET_CACHES.values())  # a module holding none: nothing to heal


def imported_modeling_modules() -> list:
    """transformers.models.<model>.modeling_<model> modules already imported that hold a kernel global."""
    out = []
    for name, module in list(sys.modules.items()):
        if name.startswith(PREFIX) and module is not None:
            parts = name.split(".")
            if len(parts) == 4 and parts[3] == f"modeling_{parts[2]}" and not _NAMES.isdisjoint(module.__dict__):
                if not getattr(getattr(module, "__spec__", None), "_initializing", False):  # mid-import: the hooks see the rest
                    out.append(module)
    return out
