"""A backend: wheels the served kernel dispatches to whenever they import (flash-qla under fla 0.6: fla checks
`find_spec("flash_qla")` only and catches none of its errors). So it is installed only where it is the fastest
correct path (`archs.train`, nvcc, its `with` kernels, head dims, `pays`), and never blocked: one that cannot work
here is turned off by the served kernel's switch (`off`, FLA_FLASH_QLA=0). Its check compares it with that path."""

from __future__ import annotations

from dataclasses import replace

from packaging.version import Version

from ...facts.pins import same_version
from ..common import (Context, NOT_OURS, USABLE, fetch_fix, first_installable, has_backend, kernel_steps, shared_skip,
                      within)
from ..messages import PINS_FILE, few
from ..plan import Decision, INSTALL, OK, OnFailure, gdr_check, model_shapes


def decide(ctx: Context, kernel: str, decided: dict) -> Decision:
    pins, env = ctx.pins, ctx.env
    spec = pins.kernel(kernel)
    installed = ctx.installed_of(kernel)
    have = installed.get(spec.distributions[0])
    kw = ctx.kw(kernel, installed)
    switch = spec.switch
    # an installed backend that cannot work here: the served kernel is told not to use it (never blocked)
    off = ((switch.variable, switch.off),) if env.switches.get(switch.variable) is None else ()
    kw_off = {**kw, "env": off if have else ()}

    common = shared_skip(ctx, kernel, installed=installed)
    if common is not None:
        return common if common.rule in NOT_OURS or not have else replace(common, env=off)

    served = next((k for k in spec.serves if decided[k].action in USABLE), None)
    if served is None:
        first = spec.serves[0]
        return ctx.skip(kernel, "not-used", f"{first} is not used here: {decided[first].reason.split('; ')[0]}",
                        facts={"served": first}, **kw)
    version = _version_of(ctx, served, decided[served])
    if not has_backend(pins.kernel(served), version, kernel):
        since = min((r.version for r in pins.kernel(served).releases if kernel in r.backends), key=Version, default=None)
        if since is None:   # no pinned release of it dispatches to it (a pins file's override)
            return ctx.skip(kernel, "no-backend.pinned", f"{served} {version} does not dispatch to {kernel}, nor does "
                            f"any pinned {served} release", f"pin a {served} release whose `backends` name {kernel} "
                            "(FASTPATH_HOOKS_PINS)", facts={"served": served, "version": version}, **kw)
        return ctx.skip(kernel, "no-backend", f"{served} {version} does not dispatch to {kernel} ({served} does from "
                        f"{since})", f"upgrade {served} to {since} or newer",
                        facts={"served": served, "version": version, "since": since}, **kw)
    if env.switches.get(switch.variable) == switch.off:
        return ctx.skip(kernel, "user-disabled", f"{switch.variable}={switch.off} is set; {served} would not use "
                        f"{kernel}", f"unset {switch.variable}",
                        facts={"variable": switch.variable, "off": switch.off, "served": served}, **kw)
    no_train = [g for g in env.gpus if g not in spec.archs.train]
    if no_train:
        forward = sorted({g for g in no_train if g in spec.archs.forward})
        reason = f"{'+'.join(no_train)}: {kernel} trains (forward + backward) on {', '.join(spec.archs.train)} only"
        if forward:
            reason += f"; on {'/'.join(forward)} it has a forward only, and training needs the backward"
        return ctx.skip(kernel, "arch", reason,
                        facts={"no_train": "+".join(no_train), "train": ", ".join(spec.archs.train)}, **kw_off)
    if spec.needs_nvcc and not env.nvcc and not _nvcc_planned(spec, decided):
        return ctx.skip(kernel, "no-nvcc", f"no nvcc; tilelang compiles {kernel}'s kernels with it at first use, "
                        f"and {served} chooses {kernel} without looking for one",
                        "install a CUDA toolkit matching torch or point CUDA_HOME at one", **kw_off)
    hazard = next((h for h in ctx.hazards(served) if h.needs in spec.with_kernels), None)
    default = spec.pays.hazard if hazard is not None else spec.pays.elsewhere
    if not have and not default:
        where = (f"where {served} runs {hazard.needs} anyway ({hazard.id})" if hazard is not None else
                 f"where {served} needs no {' or '.join(spec.with_kernels)} ({_no_hazard_why(ctx, served, spec)})")
        key = "hazard" if hazard is not None else "elsewhere"
        short_where = f"under {hazard.id}" if hazard is not None else f"without {' or '.join(spec.with_kernels)}"
        # not shown: a benchmark that said no (flash-qla on the H200), or none yet
        return ctx.skip(kernel, "off", f"off by default {where}: not shown to pay there (pins `pays.{key}`)",
                        f"set kernels.{kernel}.pays.{key} to true in a FASTPATH_HOOKS_PINS file",
                        facts={"where": short_where, "key": key}, **kw)
    for partner in spec.with_kernels:
        pd = decided[partner]
        if pd.action not in USABLE:
            return ctx.skip(kernel, f"without.{pins.kernel(partner).rule_prefix}",
                            f"{kernel} runs on {partner}, which is not used here: {pd.reason.split('; ')[0]}", pd.fix,
                            facts={"partner": partner}, **kw_off)
    # the imported (or posed) models whose head dims are known, and those it computes (none known: the pins')
    models = [m for m in env.model_shapes if m[1] is not None and m[2] is not None]
    fits = [m for m in models if m[1] in spec.head_dims.k and m[2] in spec.head_dims.v]
    shapes, shapes_from = model_shapes(fits, spec.warm, env.dist_version("transformers"))
    dims_k, dims_v = ("/".join(map(str, dims)) for dims in (spec.head_dims.k, spec.head_dims.v))
    check = gdr_check(env, pins, kernel, served=served, shapes=shapes, shapes_from=shapes_from) if spec.warm else {}
    needs = tuple(spec.with_kernels) + (served,)
    if have:
        known = next((r for r in spec.releases if same_version(r.version, have)), None)
        old = _old_partner(ctx, kernel, known, decided) if known is not None else None
        if old is not None:
            return ctx.skip(kernel, f"old.{pins.kernel(old[0]).rule_prefix}", old[1], old[2], facts=old[3], **kw_off)
        return Decision(kernel=kernel, action=OK, rule=ctx.rule(kernel, "ok"), verify=True, needs=needs, check=check,
                        reason=f"{kernel} {have} installed; {served} dispatches to it here, so it is checked once "
                               f"against {served}'s own path in a child process",
                        on_failure=OnFailure.PROCEED, off=off, facts={"served": served}, **kw)
    if models and not fits:
        bad = ", ".join(f"{name}: K x V = {k} x {v}" for name, k, v, _, _ in env.model_shapes if k is not None)
        return ctx.skip(kernel, "head-dims", f"{bad}; {kernel} computes K = {dims_k}, V = {dims_v} only ({served} "
                        "keeps its own path for the rest)", facts={"dims": dims_k, "served": served}, **kw)
    candidates = [r for r in spec.releases
                  if within(env.torch_version, r.torch) and within(env.triton_version, r.triton)]
    if not candidates:
        return ctx.skip(kernel, "no-release", f"no known-good {kernel} release for torch {env.torch}",
                        "add a release to a FASTPATH_HOOKS_PINS file", **kw)
    fitting = [r for r in candidates if _old_partner(ctx, kernel, r, decided) is None]
    if not fitting:
        partner, why, fix, facts = _old_partner(ctx, kernel, candidates[0], decided)
        return ctx.skip(kernel, f"old.{pins.kernel(partner).rule_prefix}", why, fix, facts=facts, **kw)
    note = ("the pinned release, without its torch/tilelang requirements (tilelang is the known-good pair, "
            "installed first)")
    rel, planned, first_missing = first_installable(ctx, fitting, lambda v: kernel_steps(ctx, spec, v, note))
    if rel is None:
        return ctx.skip(kernel, "offline-missing", f"offline, and FASTPATH_HOOKS_FIND_LINKS lacks "
                        f"{', '.join(first_missing)}", fetch_fix(f"{kernel}'s wheel"),
                        facts={"missing": few(first_missing)}, **kw)
    reason = f"{kernel} {rel.version} for {served}'s gated delta rule on {'+'.join(sorted(set(env.gpus)))}"
    reason += (f", where {served} runs {hazard.needs} anyway because of {hazard.id}" if hazard is not None else
               f", on by default where {served} needs no {' or '.join(spec.with_kernels)}")
    reason += (f"; {shapes_from}: K x V = " + ", ".join(f"{k} x {v}" for _, _, k, v in shapes) if models else
               f"; the model's head dims are not known here: {served} uses it for K = V = {dims_k}, as in Qwen3.5 "
               "and Qwen3-Next, and keeps its own path otherwise")
    return Decision(kernel=kernel, action=INSTALL, rule=ctx.rule(kernel, "install"), reason=reason, steps=planned,
                    target=dict.fromkeys(spec.distributions, rel.version), needs=needs, check=check,
                    on_failure=OnFailure.PROCEED, off=off,
                    facts={"served": served, "runs": hazard.needs if hazard is not None else "",
                           "hazard": hazard.id if hazard is not None else ""}, **kw)


def wanted_here(ctx: Context, kernel: str) -> bool:
    """On by default here without a hazard (`pays.elsewhere`) and not ruled out: the pair rule then installs its
    `with` kernel (tilelang). Reads no decision."""
    spec = ctx.pins.kernel(kernel)
    env, switch = ctx.env, spec.switch
    if not spec.pays.elsewhere or shared_skip(ctx, kernel, installed={}) is not None:
        return False
    if all(s in ctx.settings.skip for s in spec.serves) or env.switches.get(switch.variable) == switch.off:
        return False
    return bool(env.gpus) and all(g in spec.archs.train for g in env.gpus)


def _version_of(ctx: Context, kernel: str, decision: Decision) -> str:
    """The version `kernel` has once its decision ran: its target, else what is installed."""
    dists = ctx.pins.kernel(kernel).distributions
    return next((v for d in dists if (v := decision.target.get(d) or ctx.installed(d))), "?")


def _old_partner(ctx: Context, kernel: str, release, decided: dict):
    """(partner, reason, fix, facts) when a kernel this release runs on is outside its `with` range."""
    for partner, spec in release.partners.items():
        version = _version_of(ctx, partner, decided[partner])
        if not within(version, spec):
            good = next((p.version for p in ctx.pins.kernel(partner).pairs if within(p.version, spec)), None)
            fix = (f"install {partner} {good} (with its known-good partner) or remove {partner} to let fastpath-hooks "
                   "install it" if good else f"add a {partner} {spec} pair to a FASTPATH_HOOKS_PINS file")
            short_fix = f"install {partner} {good}" if good else PINS_FILE
            why = f"{partner} {version} is used here; {kernel} {release.version} needs {partner} {spec}"
            return partner, why, fix, {"partner": partner, "version": version, "spec": str(spec),
                                       "partner_fix": short_fix}
    return None


def _nvcc_planned(spec, decided: dict) -> bool:
    """A kernel it runs on installs the nvcc wheel (tilelang on a CUDA >= 13 torch without a toolkit)."""
    return any(r.startswith("nvidia-cuda-nvcc") for partner in spec.with_kernels for step in decided[partner].steps
               for r in step.requirements)


def _no_hazard_why(ctx: Context, served: str, spec) -> str:
    gpus = sorted({g for h in ctx.pins.hazards if h.kernel == served for g in h.gpu})
    if not any(g in gpus for g in ctx.env.gpus):
        return f"no {'/'.join(gpus)} GPU" if gpus else "no hazard of it applies"
    return f"triton {ctx.env.triton}"

