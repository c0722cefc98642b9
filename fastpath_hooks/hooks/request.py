"""Which kernels the modeling module being imported will ask for: the engine's hint for a batch.

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

import sys


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
