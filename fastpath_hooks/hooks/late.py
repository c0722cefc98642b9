"""Late activation: install() called after transformers' modeling modules were imported.

A modeling module chooses its kernels when it is imported (transformers-eras.md), so a
`from transformers import Qwen3_5ForCausalLM` before install() would keep the torch path -
or, on Hopper with an fla installed by hand, a kernel that crashes at the first backward.
`heal()` runs at every install() (and so at the start-up hand-over) once transformers is
imported: for each kernel an already-imported modeling module uses it decides as usual
(`engine.ensure`, through the gates in eras A/B), then rebinds that module's globals to
what a fresh import would choose now - the kernel when it is usable, the torch path when
it is not or is blocked (the Hopper rule takes fla away again, even if fla was imported).

Which globals exist, per era, is DATA (the tables below, read from the released sources
of 4.57.6, 5.14.1 and 5.24.0):

- era C (>= 5.15): functions decorated with `use_kernel_func_from_hub_with_fallback(func_name,
  package)`; their closure holds `torch_function` and `implementation`. They are rebuilt with
  transformers' own decorator (a fresh import, exactly), and forward looks them up at call
  time: a model built before install() follows.
- eras A/B (4.56 - 5.14): kernel objects bound as module globals behind the gates
  (`if is_X_available(): from pkg import ...`, or `lazy_load_kernel` in a mixer's __init__),
  and an `is_fast_path_available` computed from them. Families whose forward reads those
  globals at call time (lfm2, the mamba family) follow; the gated-delta-net families
  (qwen3_next, qwen3_5, olmo_hybrid) copy the choice into each layer when it is built, so a
  model built before install() keeps it - said in one line, with the fix.

Whatever cannot be healed (a layout not in the tables, a kernel module already imported
under a block, layers built earlier, programs exported earlier) is said in one line with
the fix. Graphs compiled by torch.compile earlier retrace by themselves: dynamo guards on
the module globals they read.
"""

from __future__ import annotations

import sys

PREFIX = "transformers.models."
FIX = "call install() first or `fastpath-hooks enable`"   # short: a line fits 160 characters

# package -> kernel it is managed as (None: not managed here; re-resolved only, never installed)
PACKAGES = {"fla": "fla", "causal_conv1d": "causal-conv1d", "mamba_ssm": None}

# Era C: module global -> (func_name, package) passed to use_kernel_func_from_hub_with_fallback.
DECORATED = {
    "causal_conv1d_fn": ("causal_conv1d_fn", "causal_conv1d"),
    "causal_conv1d_update": ("causal_conv1d_update", "causal_conv1d"),
    "torch_chunk_gated_delta_rule": ("chunk_gated_delta_rule", "fla"),
    "torch_recurrent_gated_delta_rule": ("fused_recurrent_gated_delta_rule", "fla"),
    "chunk_kimi_delta_attention": ("chunk_kda", "fla"),
    "recurrent_kimi_delta_attention": ("fused_recurrent_kda", "fla"),
    "mamba2_split_conv1d_scan_combined": ("mamba_split_conv1d_scan_combined", "mamba_ssm"),
    "mamba2_selective_state_update": ("selective_state_update", "mamba_ssm"),
    "mamba2_chunk_scan": ("mamba_chunk_scan_combined", "mamba_ssm"),
    "mamba_inner_fn": ("mamba_inner_fn", "mamba_ssm"),
    "mamba_selective_state_update": ("selective_state_update", "mamba_ssm"),
    "mamba_selective_scan": ("selective_scan_fn", "mamba_ssm"),
}

# Eras A/B: module global -> (package, module it comes from, attribute), bound behind the package's gate.
BOUND = {
    "causal_conv1d_fn": ("causal_conv1d", "causal_conv1d", "causal_conv1d_fn"),
    "causal_conv1d_update": ("causal_conv1d", "causal_conv1d", "causal_conv1d_update"),
    "chunk_gated_delta_rule": ("fla", "fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
    "fused_recurrent_gated_delta_rule": ("fla", "fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule"),
    "FusedRMSNormGated": ("fla", "fla.modules", "FusedRMSNormGated"),
    "ShortConvolution": ("fla", "fla.modules", "ShortConvolution"),
}
GATES = {"fla": "is_flash_linear_attention_available", "causal_conv1d": "is_causal_conv1d_available"}

# How a layer sees the module's choice: CALL - forward reads the module globals at call time
# (a model built before install() follows); BUILT - copied into the layer when it is built.
CALL, BUILT = "call", "built"
_CONV = ("causal_conv1d_fn", "causal_conv1d_update")
_GDN = _CONV + ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule")
_OLMO = ("ShortConvolution", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "FusedRMSNormGated")
_SSM2 = ("selective_state_update", "mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined") + _CONV
_SSM1 = ("selective_state_update", "selective_scan_fn") + _CONV + ("mamba_inner_fn",)
_SSM_SHORT = ("selective_state_update",) + _CONV

# Eras A/B: model -> era -> (globals rebound, `is_fast_path_available` = all(these), layers, extra tuple global).
# Era B's mamba family binds these globals in a mixer's __init__ (lazy_load_kernel): absent until a model
# is built - then nothing was chosen yet, and a model built after install() asks the wrapped gate itself.
MODELS = {
    "qwen3_next": {"A": (_GDN + ("FusedRMSNormGated",), _GDN, BUILT, None),
                   "B": (_GDN + ("FusedRMSNormGated",), _GDN, BUILT, None)},
    "qwen3_5": {"B": (_GDN + ("FusedRMSNormGated",), _GDN, BUILT, None)},
    "qwen3_5_moe": {"B": (_GDN + ("FusedRMSNormGated",), _GDN, BUILT, None)},
    "olmo_hybrid": {"B": (_OLMO, _OLMO, BUILT, None)},
    "lfm2": {"A": (_CONV, _CONV, CALL, "kernel_modules"), "B": (_CONV, _CONV, CALL, "kernel_modules")},
    "lfm2_moe": {"B": (_CONV, _CONV, CALL, "kernel_modules")},
    "mamba2": {"A": (_CONV, _SSM2, CALL, None), "B": (_CONV, _SSM2, CALL, None)},
    "mamba": {"B": (_CONV, _SSM1, CALL, None)},
    "falcon_mamba": {"B": (_CONV, _SSM1[:-1] + ("falcon_mamba_inner_fn",), CALL, None)},
    "nemotron_h": {"B": (_CONV, _SSM2, CALL, None)},
    "jamba": {"A": (_CONV, _SSM1, CALL, None), "B": (_CONV, _SSM1, CALL, None)},
    "zamba": {"A": (_CONV, _SSM1, CALL, None), "B": (_CONV, _SSM1, CALL, None)},
    "bamba": {"A": (_CONV, _SSM_SHORT, CALL, None), "B": (_CONV, _SSM2, CALL, None)},
    "granitemoehybrid": {"A": (_CONV, _SSM_SHORT, CALL, None), "B": (_CONV, _SSM2, CALL, None)},
    "zamba2": {"A": (_CONV, _SSM_SHORT, CALL, None), "B": (_CONV, _SSM2, CALL, None)},
    "falcon_h1": {"A": (_CONV, _SSM_SHORT, CALL, None), "B": (_CONV, _SSM2, CALL, None)},
}
# Era A: mamba and falcon_mamba cache (update, fn) in this global at the first layer built;
# a cached (None, None) is reset so the next forward asks the (wrapped) gate again.
RESET_CACHES = {"mamba": "_causal_conv1d_cache", "falcon_mamba": "_causal_conv1d_cache"}

_NAMES = frozenset(DECORATED) | frozenset(BOUND) | frozenset(RESET_CACHES.values())  # a module holding none: nothing to heal


def heal() -> None:
    """Rebind the kernel choice of every modeling module imported before install().
    Costs a scan of sys.modules when none is (benchmarks/late_cost.py)."""
    modules = imported_modeling_modules()
    if not modules:
        return
    from .. import hooks

    with hooks._lock:
        if not hooks.installed():
            return
        era = transformers_era()
        if era is None:
            _warning(None, f"transformers {_version()} is not a version fastpath-hooks knows; modeling modules "
                 f"imported before install() keep their kernel choice ({', '.join(_short(m) for m in modules)}): {FIX}",
                 once="late-unknown")
            return
        if era == "C":
            _Pass().era_c(modules)
        else:
            _Pass().era_ab(modules, era)


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


def transformers_era() -> str | None:
    """A (4.x; read from 4.57.6), B (5.0 - 5.14), C (5.15 and later) or None (no version to read).
    Versions newer than the tables are tried as era C: every function's layout is checked first."""
    try:
        major, minor = (int(x) for x in _version().split(".")[:2])
    except ValueError:
        return None
    if major <= 4:
        return "A" if major == 4 else None
    return "B" if major == 5 and minor < 15 else "C"


def _version() -> str:
    return str(getattr(sys.modules.get("transformers"), "__version__", "?"))


def _short(module) -> str:
    return module.__name__.split(".")[2]


class _Pass:
    """One heal pass: kernel decisions and fresh resolutions are asked once per package."""

    def __init__(self):
        self.outcomes: dict = {}   # package -> runtime Outcome (None: not managed / not selected)
        self.fresh: dict = {}      # package -> {attribute path: object or None} (eras A/B)

    # -- the kernel decision ---------------------------------------------------------------

    def decide(self, package: str):
        if package not in self.outcomes:
            from .. import hooks
            from .. import engine

            kernel = PACKAGES.get(package)
            self.outcomes[package] = engine.ensure(kernel) if kernel and hooks.selected(kernel) else None
        return self.outcomes[package]

    def managed(self, package: str) -> bool:
        from .. import hooks

        kernel = PACKAGES.get(package)
        return kernel is None or hooks.selected(kernel)

    # -- era C -------------------------------------------------------------------------------

    def era_c(self, modules) -> None:
        hub = sys.modules.get("transformers.integrations.hub_kernels")
        decorate = getattr(hub, "use_kernel_func_from_hub_with_fallback", None)
        for module in modules:
            namespace = module.__dict__
            found = [(name, namespace[name]) for name in DECORATED if name in namespace]
            if not found:
                continue
            changed, unknown, taken = {}, [], set()
            for name, function in found:
                func_name, package = DECORATED[name]
                if not self.managed(package):
                    continue
                closure = _closure(function)
                if decorate is None or closure is None or not {"implementation", "torch_function"} <= set(closure):
                    unknown.append(name)
                    continue
                torch_function = closure["torch_function"]
                outcome = self.decide(package)
                blocked = outcome is not None and outcome.block is not None
                fresh = _redecorate(decorate, func_name, package, torch_function, blocked)
                now = (_closure(fresh) or {}).get("implementation")
                if now is None:
                    unknown.append(name)
                    continue
                if now is closure["implementation"]:
                    continue
                namespace[name] = fresh
                changed[name] = (package, now is not torch_function)
                if blocked and package in sys.modules:
                    taken.add(package)
            self.report(module, changed, unknown, taken, CALL)

    # -- eras A/B -----------------------------------------------------------------------------

    def era_ab(self, modules, era: str) -> None:
        import_utils = sys.modules.get("transformers.utils.import_utils")
        for module in modules:
            model = _short(module)
            namespace = module.__dict__
            if model in RESET_CACHES and era == "A":
                self.reset_cache(module, RESET_CACHES[model])
                continue
            entry = MODELS.get(model, {}).get(era)
            if entry is None:
                if any(name in namespace for name in BOUND) and self.stale(namespace, import_utils):
                    _warning(None, f"{model}: imported before install(), and its kernel globals are not in "
                         f"fastpath-hooks' table for transformers {_version()}: it keeps the choice made then; {FIX}",
                         once=f"late-unknown-{model}")
                continue
            names, fast_path, layers, tuple_global = entry
            present = [name in namespace for name in names]
            if not any(present):       # nothing chosen yet (era B's mixers bind them when a model is built)
                continue
            if not all(present):
                _warning(None, f"{model}: imported before install(), and transformers {_version()} lays out its "
                     f"kernel globals differently than fastpath-hooks knows: it keeps the choice made then; {FIX}",
                     once=f"late-unknown-{model}")
                continue
            changed, taken = {}, set()
            for name in names:
                package, _, _ = BOUND[name]
                if not self.managed(package):
                    continue
                value = self.resolve(package, name, import_utils)
                if value is namespace[name]:
                    continue
                namespace[name] = value
                changed[name] = (package, value is not None)
                outcome = self.outcomes.get(package)
                if value is None and package in sys.modules and outcome is not None and outcome.block:
                    taken.add(package)
            lacking = ()
            if changed:
                if "is_fast_path_available" in namespace and all(n in namespace for n in fast_path):
                    namespace["is_fast_path_available"] = all(namespace[n] for n in fast_path)
                if tuple_global and tuple_global in namespace:
                    namespace[tuple_global] = tuple(namespace[n] for n in fast_path)
                lacking = tuple(n for n in fast_path if namespace.get(n) is None)
            self.report(module, changed, [], taken, layers, lacking)

    def stale(self, namespace, import_utils) -> bool:
        return any(self.resolve(BOUND[n][0], n, import_utils) is not namespace[n]
                   for n in BOUND if n in namespace and self.managed(BOUND[n][0]))

    def resolve(self, package: str, name: str, import_utils):
        """What a fresh modeling import binds `name` to: behind the (wrapped) gate, as transformers does."""
        if package not in self.fresh:
            self.fresh[package] = {}
            gate = getattr(import_utils, "__dict__", {}).get(GATES.get(package, ""))
            kernel = PACKAGES.get(package)
            if kernel is not None:
                self.decide(package)
            ok = False
            if gate is not None:
                try:
                    ok = bool(gate())
                except Exception:
                    ok = False
            self.fresh[package]["ok"] = ok
        if not self.fresh[package]["ok"]:
            return None
        _, source, attribute = BOUND[name]
        key = f"{source}.{attribute}"
        if key not in self.fresh[package]:
            import importlib

            try:
                self.fresh[package][key] = getattr(importlib.import_module(source), attribute, None)
            except Exception:
                self.fresh[package][key] = None
        return self.fresh[package][key]

    def reset_cache(self, module, name: str) -> None:
        if module.__dict__.get(name) == (None, None) and self.managed("causal_conv1d"):
            outcome = self.decide("causal_conv1d")
            if outcome is not None and outcome.block is None:
                module.__dict__[name] = None     # the next forward asks the gate again
                events = sys.modules.get("fastpath_hooks.events")
                if events is not None:
                    events.debug(f"{_short(module)}: imported before install(); its causal-conv1d cache is reset",
                                 "causal-conv1d")

    # -- what is said -------------------------------------------------------------------------

    def report(self, module, changed: dict, unknown: list, taken: set, layers: str, lacking=()) -> None:
        model = _short(module)
        if unknown:
            _warning(None, f"{model}: imported before install(), and {', '.join(unknown)} "
                 f"{'is' if len(unknown) == 1 else 'are'} not laid out as fastpath-hooks knows for transformers "
                 f"{_version()}: kept as chosen then; {FIX}", once=f"late-unknown-{model}")
        if not changed:
            return
        kernels = sorted({PACKAGES.get(p) or p for p, _ in changed.values()})
        on = sorted({PACKAGES.get(p) or p for p, kernel in changed.values() if kernel})
        off = sorted(set(kernels) - set(on))
        what = "; ".join(x for x in (f"now uses {', '.join(on)}" if on else "",
                                     f"back on the torch path for {', '.join(off)}" if off else "") if x)
        if on and lacking:   # e.g. the mamba family's fast path needs mamba-ssm too, which is not managed here
            what += f"; its fast path still lacks {', '.join(lacking)}"
        kernel = kernels[0] if len(kernels) == 1 else None
        if taken:
            _warning(kernel, f"{model}: imported before install(); {what}; "
                 f"{', '.join(sorted(taken))} stays imported; {FIX}", once=f"late-{model}")
        elif layers == BUILT and _built(module):
            # transformers copies the kernels into each layer it builds: a model built before keeps its own
            _warning(kernel, f"{model}: imported before install(); {what} for models built from now on; "
                 "older ones keep theirs: rebuild them", once=f"late-{model}")
        else:
            tail = "models already built follow" if layers == CALL else "for the models built from now on"
            _status(kernel, f"{model}: imported before install(); {what} ({tail})", once=f"late-{model}")
        compiled = _compiled_graphs()
        if compiled:   # dynamo guards on the module globals a graph read (checked: a rebound global retraces)
            _status(kernel, f"{compiled} graph(s) compiled with torch.compile before install() retrace at their "
                 "next call (they guard on the rebound functions); a program exported or AOT-compiled before "
                 "install() keeps its kernels: export it again", once="late-compiled")


def _closure(function) -> dict | None:
    code, cells = getattr(function, "__code__", None), getattr(function, "__closure__", None)
    if code is None or not cells:
        return None
    out = {}
    for name, cell in zip(code.co_freevars, cells):
        try:
            out[name] = cell.cell_contents
        except ValueError:  # an empty cell
            pass
    return out


def _redecorate(decorate, func_name: str, package: str, torch_function, blocked: bool):
    """transformers' own decorator applied again: what a fresh modeling import chooses now.
    blocked: the package may already be imported (before install()); a fresh process could not
    import it, so it is hidden for this call (a None in sys.modules fails its import at once)."""
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
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    try:
        return int(dynamo_utils.counters["stats"]["unique_graphs"]) if dynamo_utils is not None else 0
    except Exception:
        return 0


def _warning(kernel, message: str, *, once: str) -> None:
    from .. import events   # not at module level: this module loads at start-up

    events.warning(message, kernel, once=once)


def _status(kernel, message: str, *, once: str) -> None:
    from .. import events

    events.status(message, kernel, once=once)
