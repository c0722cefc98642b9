"""A pair of distributions pinned together that serves another kernel (tilelang + apache-tvm-ffi, fla's Hopper
backend): installed where a served kernel's hazard or a backend needs it, as a known-good pair, never a broken
one; a broken or half-installed pair is repaired (the companion first: a broken pair can abort any process
that imports it) or its import blocked."""

from __future__ import annotations

from dataclasses import replace

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ...facts.pins import same_version
from ..common import HALF_INSTALLED, Context, fetch_fix, deps_step, served_hazards, shared_skip, within
from ..plan import BLOCK, INSTALL, OK, REPAIR, Decision, OnFailure, Step, StepKind
from ..messages import few
from . import backend


def decide(ctx: Context, kernel: str, decided: dict) -> Decision:
    pins, env, settings = ctx.pins, ctx.env, ctx.settings
    spec = pins.kernel(kernel)
    first, second = spec.distributions
    have, companion = ctx.installed(first), ctx.installed(second)
    installed = ctx.installed_of(kernel)
    hazards = [h for h in served_hazards(ctx, kernel) if h.kernel not in settings.skip]
    served = " and ".join(spec.serves)

    common = shared_skip(ctx, kernel, installed=installed)
    if common is not None:
        if hazards and common.rule == "skip.user":
            hz = hazards[0]
            common = replace(common, facts={"served": hz.kernel, "hazard": hz.id},
                             reason=f"skipped by FASTPATH_HOOKS_SKIP; {hz.kernel} needs it here because of {hz.id}")
        return common

    kw = ctx.kw(kernel, installed)
    half = [d for d in spec.distributions if d in env.half_installed and ctx.installed(d)]
    if have and half:
        return _repair(ctx, kernel, have, f"{' and '.join(half)} {HALF_INSTALLED}", "half-installed", kw,
                       short=f"{' and '.join(half)} half-installed")
    if have and companion:
        broken = pins.broken_for(kernel, have, companion, env.gpus)
        if broken is not None:
            return _repair(ctx, kernel, have, f"{second} {companion} is broken with {first} {have}"
                           f"{'' if broken.arch == '*' else ' on ' + broken.arch} - {broken.effect}", "broken-pair", kw,
                           short=f"{second} {companion} breaks it")
    if have and not companion:
        return _repair(ctx, kernel, have, f"{first} {have} is installed without {second}", "missing-companion", kw,
                       short=f"installed without {second}")

    backends = [] if hazards else [b for b, s in pins.kernels.items()
                                   if s.kind == "backend" and kernel in s.with_kernels and backend.wanted_here(ctx, b)]
    if not hazards and not backends:
        why, why_short = _not_needed(ctx, kernel)
        facts, reason = {"served": served, "why": why_short}, f"{served} does not need it here: {why}"
        if have:
            return Decision(kernel=kernel, action=OK, rule=ctx.rule(kernel, "ok.not-needed"), facts=facts,
                            reason=f"{first} {have} + {second} {companion} installed; {reason}", **kw)
        return ctx.skip(kernel, "not-needed", reason, facts=facts, **kw)

    # who needs it, and why: a served kernel's hazard (fla#640), or a backend that runs on it, on by default here
    hz = hazards[0] if hazards else None
    who = hz.kernel if hz is not None else backends[0]
    because = f"because of {hz.id}" if hz is not None else f"to run {who}, on by default here: pins pays.elsewhere"
    facts = ({"served": hz.kernel, "hazard": hz.id, "hazard_gpus": "+".join(hz.gpu)} if hz is not None else
             {"served": who, "hazard": f"{who}, on by default here"})
    switch = spec.switch
    if hz is not None and switch is not None and env.switches.get(switch.variable) == switch.off:
        return ctx.skip(kernel, "user-disabled", f"{switch.variable}={switch.off} is set; {hz.kernel} would not use "
                        f"{kernel}", f"unset {switch.variable}: {hz.kernel} needs {kernel} here because of {hz.id}",
                        facts={**facts, "variable": switch.variable, "off": switch.off}, **kw)
    nvcc_reqs = ()
    if spec.needs_nvcc and not env.nvcc:
        pk = spec.nvcc_packages
        if pk and env.torch_cuda and within(env.cuda_version, SpecifierSet(pk["cuda"])):
            nvcc_reqs = tuple(pk["requirements"])
        else:
            tail = (f", and {hz.kernel} uses {kernel} only when nvcc is found in CUDA_HOME, CUDA_PATH, PATH, "
                    "/usr/local/cuda or the nvidia-cuda-nvcc wheel" if hz is not None else f" (and {who}'s kernels)")
            return ctx.skip(kernel, "no-nvcc", f"no nvcc; {kernel} compiles its kernels with it at run time{tail}",
                            "install a CUDA toolkit matching torch or point CUDA_HOME at one", **kw)
    pair = preferred(ctx, kernel)
    if have:
        pair_now = f"{first} {have} + {second} {companion}"
        good = [g for g in pins.good_companions(kernel, have) if pins.broken_for(kernel, have, g, env.gpus) is None]
        if any(same_version(companion, g) for g in good):
            if nvcc_reqs:
                return _install(ctx, kernel, have, companion, nvcc_reqs, "install.nvcc", REPAIR,
                                f"{pair_now} need nvcc; installing the nvcc wheel", kw, facts)
            return Decision(kernel=kernel, action=OK, rule=ctx.rule(kernel, "ok"), verify=True,
                            reason=f"{pair_now} is a known-good pair; {who} needs it here {because}",
                            on_failure=OnFailure.BLOCK, facts=facts,
                            repair_steps=steps(ctx, kernel, have, good[0], nvcc_reqs, replace=True), **kw)
        return Decision(kernel=kernel, action=OK, rule=ctx.rule(kernel, "ok.unverified"), verify=True,
                        reason=f"{pair_now} is not in the pins; checking it in a child process",
                        on_failure=OnFailure.BLOCK,
                        repair_steps=steps(ctx, kernel, *pair, nvcc_reqs, replace=True) if pair else (), **kw)
    if pair is None:
        return ctx.skip(kernel, "offline-missing",
                        f"offline, and FASTPATH_HOOKS_FIND_LINKS has no known-good {first} + {second} pair",
                        fetch_fix(f"{kernel}'s wheels"), facts={"missing": "a known-good pair"}, **kw)
    if hz is None:
        return _install(ctx, kernel, pair[0], pair[1], nvcc_reqs, "install.for-backend", INSTALL,
                        f"{who} runs on {kernel}, and {who} is on by default here: pins pays.elsewhere", kw, facts)
    return _install(ctx, kernel, pair[0], pair[1], nvcc_reqs, "install", INSTALL, f"{hz.kernel} needs {kernel} on "
                    f"{'+'.join(hz.gpu)} + triton {env.triton} because of {hz.id}", kw, facts)


def _not_needed(ctx: Context, kernel: str) -> tuple:
    """(why no served kernel needs it here, its short form): the hazards' GPUs, triton range, or a skip."""
    env, spec = ctx.env, ctx.pins.kernel(kernel)
    hazards = [h for h in ctx.pins.hazards if h.needs == kernel and h.kernel in spec.serves]
    if not hazards:
        return "no hazard of theirs needs it", "no hazard needs it"
    skipped = [h.kernel for h in hazards if h.kernel in ctx.settings.skip and ctx.hazards(h.kernel)]
    if skipped:
        why = f"{' and '.join(sorted(set(skipped)))} is skipped by FASTPATH_HOOKS_SKIP"
        return why, why
    gpus = sorted({g for h in hazards for g in h.gpu})
    if not any(g in gpus for g in env.gpus):
        return f"no {'/'.join(gpus)} GPU", f"no {'/'.join(gpus)} GPU"
    if env.triton is None:
        return "no triton", "no triton"
    return (f"triton {env.triton} is outside {', '.join(f'{h.id} {h.triton}' for h in hazards)}",
            f"triton {env.triton} is outside {', '.join(h.id for h in hazards)}")


def _good_pairs(ctx: Context, kernel: str, version: str | None = None) -> list:
    """(version, companion) pairs the pins know good on these GPUs: `version`'s own companions first, then all."""
    pins = ctx.pins
    options = [(version, c) for c in pins.good_companions(kernel, version)] if version else []
    options += [(pair.version, c) for pair in pins.kernel(kernel).pairs for c in pair.companions]
    return [o for o in dict.fromkeys(options) if pins.broken_for(kernel, *o, ctx.env.gpus) is None]


def preferred(ctx: Context, kernel: str):
    """The first known-good pair installable here (offline: in the wheelhouse), else None."""
    first, second = ctx.pins.kernel(kernel).distributions
    have = ctx.housed[0] if ctx.settings.offline else None
    return next(((v, c) for v, c in _good_pairs(ctx, kernel) if have is None or
                 (Version(v) in have.get(first, set()) and Version(c) in have.get(second, set()))), None)


def steps(ctx: Context, kernel: str, version, companion, nvcc_reqs, *, replace: bool) -> tuple:
    spec = ctx.pins.kernel(kernel)
    first, second = spec.distributions
    out = []
    if replace:
        out.append(Step(kind=StepKind.REPLACE, requirements=(f"{second}=={companion}",), no_deps=True, force=True,
                        note=f"replace {second} alone first: the broken pair can abort any process that imports it"))
    deps = deps_step(ctx, spec)
    if deps is not None:
        out.append(deps)
    if nvcc_reqs:
        out.append(Step(kind=StepKind.DEPS, requirements=tuple(nvcc_reqs), no_deps=False,
                        note=f"nvcc for {kernel}'s JIT"))
    out.append(Step(kind=StepKind.KERNEL, requirements=(f"{first}=={version}", f"{second}=={companion}"), no_deps=True,
                    note=f"the known-good pair, pinned together (a fresh resolve picks a broken {second})"))
    return tuple(out)


def _install(ctx, kernel, version, companion, nvcc_reqs, suffix, action, reason, kw, facts) -> Decision:
    first, second = ctx.pins.kernel(kernel).distributions
    planned = steps(ctx, kernel, version, companion, nvcc_reqs, replace=False)
    missing = ctx.missing_offline(planned)
    if missing:
        return ctx.skip(kernel, "offline-missing", f"offline, and FASTPATH_HOOKS_FIND_LINKS lacks {', '.join(missing)}",
                        fetch_fix(f"{kernel}'s wheels"), facts={"missing": few(missing)}, **kw)
    return Decision(kernel=kernel, action=action, rule=ctx.rule(kernel, suffix), reason=reason, steps=planned,
                    target={first: version, second: companion}, on_failure=OnFailure.BLOCK, facts=facts, **kw)


def _repair(ctx, kernel, version, reason, problem, kw, *, short: str) -> Decision:
    """Replace a broken or half-installed pair: the user's version with a known-good companion where the pins
    have one, else the first known-good pair the wheelhouse has; else block the import."""
    first, second = ctx.pins.kernel(kernel).distributions
    facts = {"problem": short}
    first_missing = None
    for target, target_companion in _good_pairs(ctx, kernel, version):
        planned = steps(ctx, kernel, target, target_companion, (), replace=True)
        missing = ctx.missing_offline(planned)
        if missing:
            first_missing = first_missing or missing
            continue
        return Decision(kernel=kernel, action=REPAIR, rule=ctx.rule(kernel, f"repair.{problem}"), steps=planned,
                        reason=reason + f"; repairing to {first} {target} + {second} {target_companion}",
                        target={first: target, second: target_companion}, on_failure=OnFailure.BLOCK, facts=facts, **kw)
    if first_missing:
        return Decision(kernel=kernel, action=BLOCK, rule=ctx.rule(kernel, f"repair.{problem}.offline-missing"),
                        reason=reason + f"; offline, and FASTPATH_HOOKS_FIND_LINKS lacks {', '.join(first_missing)}",
                        fix=fetch_fix(f"{kernel}'s wheels"), on_failure=OnFailure.BLOCK,
                        facts={**facts, "missing": few(first_missing, 20)}, **kw)
    return Decision(kernel=kernel, action=BLOCK, rule=ctx.rule(kernel, f"repair.{problem}.unrepairable"),
                    reason=reason + f"; the pins know no good {second} for this GPU", on_failure=OnFailure.BLOCK,
                    fix=f"add a known-good {first} + {second} pair in a FASTPATH_HOOKS_PINS file", facts=facts, **kw)
