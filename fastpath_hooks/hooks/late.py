"""Late activation: install() called after transformers' modeling modules were imported.

A modeling module chooses its kernels when it is imported, so one imported before install() keeps the torch
path (or, on Hopper with an fla installed by hand, a kernel that crashes at the first backward). `heal()`
decides each kernel such a module uses (`engine.ensure`), then rebinds the module's choice to what a fresh
import would choose now: eras C/D (>= 5.15) by running transformers' decorator again and writing its choice
into the decorated functions' closures; eras A/B (4.56 - 5.14) by rebinding the module globals of the tables
below. What cannot be healed (an unknown layout, a kernel imported under a block, layers or programs built
earlier) is said in one line with the fix. torch.compile graphs retrace: dynamo guards on the globals.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from .._names import DECORATED, KERNEL_MODULES
from .closures import closure_of, decorated_function, set_choice


FIX = "call install() first or `fastpath-hooks enable`"   # short: a line fits 160 characters
_healing: set = set()   # names of the modeling modules a pass (of any thread) is healing now


def heal(hooks) -> None:
    """Rebind the kernel choice of every modeling module imported before install() (`hooks`: hooks.HOOKS).
    The modules are claimed under the lock, the kernels decided (installed, for minutes maybe) with no lock
    held, and rebound under the lock while still installed: no other thread waits for this pass."""
    modules = imported_modeling_modules()
    if not modules:
        return
    with hooks.lock:
        if not hooks.installed():
            return
        mine = [m for m in modules if m.__name__ not in _healing]   # a module another pass heals now is that pass's
        _healing.update(m.__name__ for m in mine)
    if not mine:
        return
    try:
        era = transformers_era()
        if era is None:
            _say(None, f"transformers {_version()} is not a version fastpath-hooks knows; modeling modules "
                 f"imported before install() keep their kernel choice ({', '.join(_short(m) for m in mine)}): {FIX}",
                 once="late-unknown")
            return
        heal_pass = _Pass(hooks)
        plans = heal_pass.era_c(mine) if era in ("C", "D") else heal_pass.era_ab(mine, era)   # no lock held
        with hooks.lock:
            applied = [plan.apply() for plan in plans] if hooks.installed() else []
        for plan, changed in applied:
            heal_pass.report(plan, changed)
    finally:
        with hooks.lock:
            _healing.difference_update(m.__name__ for m in mine)


def transformers_era() -> str | None:
    """The imported transformers' era (decide/transformers.py); newer versions are tried as era C (every
    function's layout is checked first)."""
    from ..decide.transformers import era

    return era(_version())


def _version() -> str:
    return str(getattr(sys.modules.get("transformers"), "__version__", "?"))


def _short(module) -> str:
    return module.__name__.split(".")[2]


class _Pass:
    """One heal pass: kernel decisions and fresh resolutions are asked once per package."""

    def __init__(self, hooks):
        self.hooks = hooks
        self.outcomes: dict = {}   # package -> engine Outcome (None: not managed / not selected)
        self.gate_says: dict = {}  # gate name -> its answer now (eras A/B)
        self.fresh: dict = {}      # "module.attribute" -> the object a fresh import binds, or None (eras A/B)

    def decide(self, package: str):
        if package not in self.outcomes:
            from .. import engine

            kernel = PACKAGES.get(package)
            outcome = engine.ensure(kernel) if kernel and self.hooks.selected(kernel) else None
            if outcome is not None and outcome.first_call is not None and package in sys.modules:
                from .first_call import hold   # imported before install(): held now, before it is chosen again

                hold(outcome.first_call)
            self.outcomes[package] = outcome
        return self.outcomes[package]

    def managed(self, package: str) -> bool:
        kernel = PACKAGES.get(package)
        return kernel is None or self.hooks.selected(kernel)

    def era_c(self, modules) -> list:
        """The function objects stay (under HF `kernels` each module global is a `Func` module that kernelize
        routes by identity): only their closure gets the fresh choice."""
        hub = sys.modules.get("transformers.integrations.hub_kernels")
        decorate = getattr(hub, "use_kernel_func_from_hub_with_fallback", None)
        plans = []
        for module in modules:
            namespace = module.__dict__
            found = [(name, namespace[name]) for name in DECORATED if name in namespace]
            if not found:
                continue
            plan = _Rebind(module)
            for name, value in found:
                func_name, package = DECORATED[name]
                if not self.managed(package):
                    continue
                function = decorated_function(value)
                closure = closure_of(function)
                if decorate is None or closure is None or not {"implementation", "torch_function"} <= set(closure):
                    plan.unknown.append(name)
                    continue
                torch_function = closure["torch_function"]
                outcome = self.decide(package)
                blocked = outcome is not None and outcome.block is not None
                fresh = closure_of(decorated_function(_redecorate(decorate, func_name, package, torch_function,
                                                                  blocked)))
                now = (fresh or {}).get("implementation")
                if now is None:
                    plan.unknown.append(name)
                    continue
                if now is closure["implementation"]:
                    continue
                plan.change(name, closure["implementation"], fresh, package, now is not torch_function,
                            taken=blocked and package in sys.modules, function=function)
            plans.append(plan)
        return plans

    def era_ab(self, modules, era: str) -> list:
        import_utils = sys.modules.get("transformers.utils.import_utils")
        plans = []
        for module in modules:
            model = _short(module)
            namespace = module.__dict__
            plan = _Rebind(module)
            plans.append(plan)
            if model in RESET_CACHES and era == "A":
                self.reset_cache(plan, RESET_CACHES[model])
            layout = MODELS.get(model, {}).get(era)
            if layout is None:
                if any(name in namespace for name in BOUND) and self.stale(namespace, import_utils):
                    _unknown(model, f"its kernel globals are not in fastpath-hooks' table for transformers "
                             f"{_version()}: it keeps the choice made then")
                continue
            present = [name in namespace for name in layout.names if name not in layout.optional]
            if not any(present):       # nothing chosen yet (era B's mixers bind them when a model is built)
                continue
            if not all(present):
                _unknown(model, f"transformers {_version()} lays out its kernel globals differently than "
                         "fastpath-hooks knows: it keeps the choice made then")
                continue
            plan.layers, plan.layout = layout.layers, layout
            for name in layout.names:
                package = layout.source(name)[0]
                if not self.managed(package):
                    continue
                value = self.resolve(package, name, import_utils, layout)
                old = namespace.get(name)
                if value is old or (value is None and name in layout.optional):
                    continue       # an optional name a fresh import leaves unbound: only reached on the fast path
                outcome = self.outcomes.get(package)
                plan.change(name, old, value, package, value is not None,
                            taken=value is None and package in sys.modules and outcome is not None
                            and outcome.block is not None)
        return plans

    def stale(self, namespace, import_utils) -> bool:
        return any(self.resolve(BOUND[n][0], n, import_utils) is not namespace[n]
                   for n in BOUND if n in namespace and self.managed(BOUND[n][0]))

    def resolve(self, package: str, name: str, import_utils, layout: Layout | None = None):
        """What a fresh modeling import binds `name` to: behind the (wrapped) gate, as transformers does."""
        _, source, attribute = layout.source(name) if layout else BOUND[name]
        gate_name = layout.gate(package) if layout else gates().get(package, "")
        if gate_name not in self.gate_says:
            if PACKAGES.get(package) is not None:
                self.decide(package)
            gate = getattr(import_utils, "__dict__", {}).get(gate_name)
            try:
                self.gate_says[gate_name] = gate is not None and bool(gate())
            except Exception:
                self.gate_says[gate_name] = False
        if not self.gate_says[gate_name]:
            return None
        key = f"{source}.{attribute}"
        if key not in self.fresh:
            import importlib

            try:
                self.fresh[key] = getattr(importlib.import_module(source), attribute, None)
            except Exception:
                self.fresh[key] = None
        return self.fresh[key]

    def reset_cache(self, plan, name: str) -> None:
        if plan.module.__dict__.get(name) == (None, None) and self.managed("causal_conv1d"):
            outcome = self.decide("causal_conv1d")
            if outcome is not None and outcome.block is None:
                plan.resets.append(name)     # the next forward asks the gate again

    def report(self, plan, changed: dict) -> None:
        module, unknown, taken, layers, lacking = plan.module, plan.unknown, plan.taken, plan.layers, plan.lacking
        model = _short(module)
        if plan.reset:
            _say("causal-conv1d", f"{model}: imported before install(); its causal-conv1d cache is reset",
                 once=f"late-reset-{model}", level="debug")
        if unknown:
            _unknown(model, f"{', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not laid out as "
                     f"fastpath-hooks knows for transformers {_version()}: kept as chosen then")
        if not changed:
            return
        kernels = sorted({PACKAGES.get(p) or p for p, _ in changed.values()})
        on = sorted({PACKAGES.get(p) or p for p, kernel in changed.values() if kernel})
        off = sorted(set(kernels) - set(on))
        what = "; ".join(x for x in (f"now uses {', '.join(on)}" if on else "",
                                     f"back on the torch path for {', '.join(off)}" if off else "") if x)
        if on and lacking:   # e.g. falcon_mamba in era B: its mamba_ssm comes only from the hub's `kernels`
            what += f"; its fast path still lacks {', '.join(lacking)}"
        kernel = kernels[0] if len(kernels) == 1 else None
        if taken:
            _say(kernel, f"{model}: imported before install(); {what}; "
                 f"{', '.join(sorted(taken))} stays imported; {FIX}", once=f"late-{model}")
        elif layers == BUILT and _built(module):
            # transformers copies the kernels into each layer it builds: a model built before keeps its own
            _say(kernel, f"{model}: imported before install(); {what} for models built from now on; "
                 "older ones keep theirs: rebuild them", once=f"late-{model}")
        else:
            tail = "models already built follow" if layers == CALL else "for the models built from now on"
            _say(kernel, f"{model}: imported before install(); {what} ({tail})", once=f"late-{model}", level="status")
        compiled = _compiled_graphs()
        if compiled:   # dynamo guards on the module globals a graph read (checked: a rebound global retraces)
            _say(kernel, f"{compiled} graph(s) compiled with torch.compile before install() retrace at their "
                 "next call (they guard on the rebound functions); a program exported or AOT-compiled before "
                 "install() keeps its kernels: export it again", once="late-compiled", level="status")


class _Rebind:
    """What one pass would change in one modeling module, worked out with no lock held; `apply()` makes the
    change under the hooks' lock, each global only where it still holds what the pass saw."""

    def __init__(self, module):
        self.module, self.layers, self.layout = module, CALL, None
        self.changes: list = []    # (name, old, new, package, kernel_on, function)
        self.unknown: list = []    # globals not laid out as the tables know
        self.taken: set = set()    # packages imported before install() and now blocked
        self.resets: list = []     # era A caches to reset
        self.lacking: tuple = ()
        self.reset = False

    def change(self, name, old, new, package, kernel_on: bool, taken: bool, function=None) -> None:
        """The module global `name` from `old` to `new`; or (eras C/D) `function`'s implementation `old`
        replaced by the fresh decoration's closure `new`."""
        self.changes.append((name, old, new, package, kernel_on, function))
        if taken:
            self.taken.add(package)

    def apply(self):
        """(self, {name: (package, kernel_on)} of the globals rebound). Call with the hooks' lock held."""
        namespace = self.module.__dict__
        for name in self.resets:
            if namespace.get(name) == (None, None):
                namespace[name] = None
                self.reset = True
        changed = {}
        for name, old, new, package, kernel_on, function in self.changes:
            # only where it still holds what the pass saw (not rebound meanwhile by another pass, the user)
            if function is not None:
                if set_choice(function, old, new):
                    changed[name] = (package, kernel_on)
            elif namespace.get(name) is old:
                namespace[name] = new
                changed[name] = (package, kernel_on)
        layout = self.layout
        if changed and layout is not None:
            fast_path = layout.fast_path
            if "is_fast_path_available" in namespace and all(n in namespace for n in fast_path):
                namespace["is_fast_path_available"] = all(namespace[n] for n in fast_path)
            if layout.tuple_global and layout.tuple_global in namespace:
                namespace[layout.tuple_global] = tuple(namespace[n] for n in fast_path)
            self.lacking = tuple(n for n in fast_path if namespace.get(n) is None)
        if not changed:
            self.taken = set()
        return self, changed


def _redecorate(decorate, func_name: str, package: str, torch_function, blocked: bool):
    """transformers' own decorator applied again: what a fresh modeling import chooses now. blocked: a
    fresh process could not import the package, so an imported one is hidden for this call (None in
    sys.modules fails its import at once)."""
    hidden = sys.modules.get(package) if blocked else None
    if hidden is not None:
        sys.modules[package] = None
    try:
        return decorate(func_name, package)(torch_function)
    finally:
        if hidden is not None:
            sys.modules[package] = hidden


def _built(module) -> bool:
    """Whether a layer of this modeling module exists (a model built before install())."""
    import gc

    name = module.__name__
    return any(type(obj).__module__ == name for obj in gc.get_objects())


def _compiled_graphs() -> int:
    try:
        return int(sys.modules["torch._dynamo.utils"].counters["stats"]["unique_graphs"])
    except Exception:   # torch.compile never ran in this process
        return 0


def _say(kernel, message: str, *, once: str, level: str = "warning") -> None:
    from .. import events   # not at module level: this module loads at start-up

    getattr(events, level)(message, kernel, once=once)


def _unknown(model: str, what: str) -> None:
    _say(None, f"{model}: imported before install(), and {what}; {FIX}", once=f"late-unknown-{model}")


PACKAGES = KERNEL_MODULES   # import name -> the kernel it is managed as

# The tables were read with `ast` from the released sources (tests/test_late.py and test_mamba_families.py
# read the installed transformers the same way): _names.DECORATED (eras C/D) from 5.24.0's decorated functions;
# MODELS "A" from 4.57.6's module-level `if is_X_available(): from pkg import ...` blocks and
# `is_fast_path_available = all(...)`; MODELS "B" from 5.14.1's mixers, which bind `global` names from
# `lazy_load_kernel` (it asks `is_{name}_available` by name).

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
    """package -> the gate its modeling code asks first (the kernel's first gate in the registry); read
    only when a module is healed, so that install() with transformers imported loads no registry."""
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
_LFM2 = Layout(_CONV, _CONV, CALL, "kernel_modules")
_SSM1_B = Layout(_CONV + _SSM1, _SSM1 + _CONV)
_SSM2_B = Layout(_CONV + _SSM2, _SSM2 + _CONV)
# era A's Mamba-2 hybrids: `else: selective_state_update = None` only - the two scans exist only when the gate said yes
_HYBRID_A = Layout(_SSM2 + _CONV, ("selective_state_update",) + _CONV, optional=_SSM2[1:], gates=_MAMBA2_GATE)

# Eras A/B: model -> era -> Layout. Era B's mamba family binds its globals in a mixer's __init__
# (lazy_load_kernel): absent until a model is built - then nothing was chosen yet, and a model built
# after install() asks the wrapped gate itself.
MODELS = {
    "qwen3_next": {"A": _QWEN, "B": _QWEN},
    "qwen3_5": {"B": _QWEN},
    "qwen3_5_moe": {"B": _QWEN},
    "olmo_hybrid": {"B": Layout(_OLMO, _OLMO, BUILT)},
    "lfm2": {"A": _LFM2, "B": _LFM2},
    "lfm2_moe": {"B": _LFM2},
    # era A: the causal-conv1d pair is cached in `_causal_conv1d_cache` (RESET_CACHES), not a module global;
    # falcon_mamba's mamba_inner_fn is transformers' own (kernels/falcon_mamba), imported behind the mamba gate
    "mamba": {"A": Layout(_SSM1, _SSM1), "B": _SSM1_B},
    "falcon_mamba": {"A": Layout(_SSM1, _SSM1, sources=(
                         ("mamba_inner_fn", ("mamba_ssm", "transformers.kernels.falcon_mamba", "mamba_inner_fn")),)),
                     # era B asks lazy_load_kernel("falcon_mamba-ssm"): no `is_falcon_mamba_ssm_available`
                     # exists, so without the hub's `kernels` it never gets mamba_ssm - only causal-conv1d
                     "B": Layout(_CONV, ("selective_state_update", "selective_scan_fn", "falcon_mamba_inner_fn")
                                 + _CONV)},
    "jamba": {"A": Layout(_SSM1 + _CONV, _SSM1 + _CONV), "B": _SSM1_B},
    "zamba": {"A": Layout(_SSM1 + _CONV, _SSM1 + _CONV), "B": _SSM1_B},
    "mamba2": {"A": Layout(_SSM2 + _CONV, _SSM2 + _CONV, gates=_MAMBA2_GATE), "B": _SSM2_B},
    "zamba2": {"A": Layout(_SSM2 + _CONV, ("selective_state_update",) + _CONV), "B": _SSM2_B},
    "bamba": {"A": _HYBRID_A, "B": _SSM2_B},
    "falcon_h1": {"A": _HYBRID_A, "B": _SSM2_B},
    "granitemoehybrid": {"A": _HYBRID_A, "B": _SSM2_B},
    "nemotron_h": {"B": _SSM2_B},
}
# Era A: mamba and falcon_mamba cache (update, fn) in this global at the first layer built; a cached
# (None, None) is reset so the next forward asks the (wrapped) gate again.
RESET_CACHES = {"mamba": "_causal_conv1d_cache", "falcon_mamba": "_causal_conv1d_cache"}

# a module holding none of these has nothing to heal
_NAMES = frozenset(DECORATED) | frozenset(BOUND) | frozenset(RESET_CACHES.values())


def imported_modeling_modules() -> list:
    """transformers.models.<model>.modeling_<model> modules already imported that hold a kernel global."""
    out = []
    for name, module in list(sys.modules.items()):
        if name.startswith("transformers.models.") and module is not None:
            parts = name.split(".")
            if len(parts) == 4 and parts[3] == f"modeling_{parts[2]}" and not _NAMES.isdisjoint(module.__dict__):
                # one still being imported: the hooks see the rest of it
                if not getattr(getattr(module, "__spec__", None), "_initializing", False):
                    out.append(module)
    return out
