"""The gated-delta-rule check a verification child runs (act/gdr_check.py), as the policy decides it:
which shapes (the imported model's, else the pins' defaults), which kernel path is compared with which
(a backend against the served kernel's own path), and the tolerances. Pure: a plain dict of values,
carried by the Decision (`check`) to the child.

The same check warms the JIT caches (triton's, tilelang's) for those shapes, so that the first
training step finds them compiled: the child runs under the training process's cache variables
(the decision's `env`: TRITON_CACHE_DIR / TILELANG_CACHE_DIR, when the user has not set them).
"""

from __future__ import annotations

from .common import within

KIND = "gated-delta-rule"


def model_shapes(rows, warm, transformers=None) -> tuple:
    """((key heads, value heads, K, V), ...) to check and warm, and where they come from: `rows`, the
    gated-delta-rule models whose config classes are imported here (Environment.model_shapes: their
    defaults; a missing head count taken from the pins), else the pins' defaults. The heads are the ones
    fla is called with: a `transformers` outside the pins' `gva_transformers` repeats q and k to the
    value heads before the call."""
    shapes, names = [], []
    heads = warm.heads if warm is not None else (None, None)
    repeat = warm is not None and transformers is not None and not within(transformers, warm.gva_transformers)
    rows = tuple(rows) or ((("pins", warm.dims[0], warm.dims[1], None, None),) if warm is not None else ())
    for name, k, v, hk, hv in rows:
        if k is None or v is None:
            continue
        hk, hv = hk or heads[0], hv or heads[1]
        shape = (hv if repeat else hk, hv, k, v)
        if shape not in shapes:
            shapes.append(shape)
        if name not in names:
            names.append(name)
    if not shapes:
        return (), "no model known yet"
    source = "the pins' defaults, no model known yet" if names == ["pins"] else f"the {' and '.join(names)} config"
    return tuple(shapes), source + (f", q and k repeated to the value heads by transformers {transformers}" if repeat else "")



def off_switches(pins, served: str) -> dict:
    """The variables that keep `served` on its own path: every backend's switch, off."""
    return {s.switch.variable: s.switch.off for s in pins.kernels.values()
            if s.kind == "backend" and served in s.serves and s.switch is not None}


def gdr_check(env, pins, kernel: str, *, served: str, shapes: tuple, shapes_from: str) -> dict:
    """The check of `kernel`: `served`'s own path run forward + backward at `shapes` (and warmed at the
    pins' sequence lengths); for a backend also with it switched on, compared."""
    spec = pins.kernel(kernel)
    warm = spec.warm
    check = {
        "kind": KIND, "kernel": kernel, "served": served,
        "own": off_switches(pins, served),
        "check_seq": warm.check_seq, "seqs": list(warm.seqs), "final_state": list(warm.final_state),
        "shapes": [list(s) for s in shapes], "shapes_from": shapes_from,
        "tolerances": dict(warm.tolerances), "slack": warm.slack,
    }
    if spec.kind == "backend":
        module, _, function = next((a for a in spec.verify_attributes if a.startswith(spec.module + ":")),
                                   f"{spec.module}:").partition(":")
        # on: the variable unset (the served kernel's default is on), off: the switch's value
        check["compare"] = {"module": module, "function": function, "switch": spec.switch.variable}
    return check


def jit_env(env, pins, kernel: str) -> tuple:
    """((variable, directory), ...) of the kernel's JIT caches the user has not set (pins `jit_caches`):
    kept under fastpath-hooks' cache, where every environment of this machine finds them."""
    return tuple((var, env.jit_caches[var]) for var in pins.kernel(kernel).jit_caches
                 if var in env.jit_caches and var not in env.jit_caches_given)
