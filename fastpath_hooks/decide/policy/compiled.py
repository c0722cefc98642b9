"""Compiled kernels (causal-conv1d, mamba-ssm), one path parameterized by the pins entry: a fitting wheel in
the local cache -> a built wheel in the wheelhouse -> the release wheel -> a source build for the visible GPUs
(decide/builds.py); ROCm only by a build; an installed build without code for a visible GPU is blocked. Which
wheels fit this machine is decided here too. Rule ids: `<prefix>.*` (decide/messages.py COMPILED)."""

from __future__ import annotations

import os
from dataclasses import replace
from urllib.parse import quote

from ...events import MAX_LINE, PREFIX
from ...facts import wheels as cached_wheels
from ...facts.distributions import canonical_name
from ...facts.wheels import parse_wheel
from ..builds import cuda_codes, cuda_families, needs_cuda_build, release_order, source_build, trimmed
from ..common import (Context, HALF_INSTALLED, USABLE, deps_step, fetch_fix, major_minor, missing_import, shared_skip,
                      versions_here)
from ..messages import compose, few, public, render
from ..plan import BLOCK, Decision, INSTALL, OK, OnFailure, REPAIR, SKIP, Step, StepKind


def decide(ctx: Context, kernel: str, decided: dict) -> Decision:
    spec = ctx.pins.kernel(kernel)
    dist = spec.distributions[0]
    installed_v = ctx.installed(dist)
    installed = {dist: installed_v} if installed_v else {}
    common = shared_skip(ctx, kernel, installed=installed)
    if common is not None:
        return common
    kw = ctx.kw(kernel, installed)
    half = installed_v is not None and dist in ctx.env.half_installed
    if installed_v and not half:
        if built_archs(installed_v) == ("py",):   # our build without the (opt-in) CUDA extension
            return _without_cuda(ctx, kernel, installed_v, decided, kw)
        missing = arch_gaps(installed_v, ctx.env.gpus)
        bad = _bad_code(ctx, kernel, installed_v)
        block = dict(kernel=kernel, action=BLOCK, rule=ctx.rule(kernel, "block.arch"), on_failure=OnFailure.BLOCK, **kw)
        if bad and not missing:
            gpu, rule = bad
            return Decision(reason=f"{dist} {installed_v} runs {gpu} code from nvcc {ctx.env.torch_cuda}, which "
                                   f"{rule.effect} ({rule.id})",
                            fix=f"`pip uninstall {dist}`, then `fastpath-hooks install {kernel}` (it builds "
                                f"{rule.build_as} code for {gpu})",
                            facts={"bad_gpu": gpu, "arch_rule": rule.id, "bad_nvcc": ctx.env.torch_cuda or "?",
                                   "uninstall": "pip uninstall it"}, **block)
        lacks = _untrimmed_need(ctx, kernel, installed_v)
        if lacks and not missing and not bad:
            return _retrimmed(ctx, kernel, installed_v, lacks, decided, kw)
        if missing:
            # it imports fine (no kernel launched), then fails at the first forward: worse than torch
            have = built_archs(installed_v)
            union = ",".join(sorted({*missing, *ctx.env.gpus, *have}))
            return Decision(reason=f"{dist} {installed_v} was built for {'+'.join(have)} only and has no code for "
                                   f"{'+'.join(missing)}",
                            fix=f"`pip uninstall {dist}`, then `fastpath-hooks build {kernel} --arch "
                                f"{union}` for every GPU type sharing this environment",
                            facts={"have": "+".join(have), "gaps": "+".join(missing), "union": union}, **block)
        return Decision(kernel=kernel, action=OK, rule=ctx.rule(kernel, "ok"), verify=True, on_failure=OnFailure.BLOCK,
                        reason=f"{dist} {installed_v} installed; checked once in a child process, as a "
                               "wrong-arch build can crash at import",
                        needs=_optional_needs(ctx, kernel, decided), **kw)
    if not installed_v:
        blocked = _prerequisites(ctx, kernel, decided, kw)
        if blocked is not None:
            return blocked
    decision = _choice(ctx, kernel, decided, kw)
    if not half:
        return decision
    what = f"{dist} {installed_v} is {HALF_INSTALLED}"
    if decision.action == INSTALL:
        return replace(decision, action=REPAIR, rule=ctx.rule(kernel, "repair.half-installed"), steps=_forced(decision),
                        reason=f"{what}; reinstalling: {decision.reason}", on_failure=OnFailure.BLOCK)
    return Decision(kernel=kernel, action=OK, rule=ctx.rule(kernel, "ok.half-installed"), verify=True,
                    on_failure=OnFailure.BLOCK, fix=decision.fix, **kw,
                    reason=f"{what}; checked in a child process, as it cannot be reinstalled here: {decision.reason}")


def _without_cuda(ctx: Context, kernel: str, installed_v: str, decided: dict, kw) -> Decision:
    """An installed build of ours labelled `py`: its release's CUDA extension is opt-in and was left out.
    Fine while only families that use its Triton ops are in use (decided again at every start); a family
    that calls the extension needs a rebuild with it (`repair.cuda`), or the kernel is blocked (`block.no-cuda`)."""
    dist = ctx.pins.kernel(kernel).distributions[0]
    build = ctx.pins.build(kernel, public(installed_v))
    needs, why = needs_cuda_build(ctx.env, build)
    calls, users = cuda_families(ctx.env, build)
    if not needs:
        return Decision(kernel=kernel, action=OK, rule=ctx.rule(kernel, "ok.triton-only"), verify=True,
                        on_failure=OnFailure.BLOCK, needs=_optional_needs(ctx, kernel, decided),
                        facts={"users": few(users)},
                        reason=f"{dist} {installed_v} installed, without its CUDA extension: {why}; decided again "
                               "at every start, as a model that calls the extension needs a rebuild", **kw)
    decision = _choice(ctx, kernel, decided, kw)
    if decision.action == INSTALL:
        return replace(decision, action=REPAIR, rule=ctx.rule(kernel, "repair.cuda"), steps=_forced(decision),
                       on_failure=OnFailure.BLOCK, reason=f"installed without its CUDA extension, and "
                       f"{why}: rebuilding; {decision.reason}", facts={**decision.facts, "calls": few(calls)})
    # nvcc's release unknown: engine.context.complete asks it (the rule needs it), then decides again
    rule = decision.rule if decision.rule == ctx.rule(kernel, "nvcc-unknown") else ctx.rule(kernel, "block.no-cuda")
    return Decision(kernel=kernel, action=BLOCK, rule=rule, on_failure=OnFailure.BLOCK,
                    facts=_cannot_rebuild(ctx, kernel, installed_v, render(ctx, decision)),
                    reason=f"{dist} {installed_v} was built without its CUDA extension and {why}: its "
                           f"Mamba-1 calls would raise; it cannot be rebuilt here: {decision.reason}",
                    fix=decision.fix or f"`pip uninstall {dist}` and install it where it can be built", **kw)


def _untrimmed_need(ctx: Context, kernel: str, installed_v: str) -> str:
    """What a trimmed build of ours (pins `source_build.trim`) leaves out that a model in use needs ("" if none):
    `head dim 256`, `sliding window` - its first forward there would raise."""
    build = ctx.pins.build(kernel, public(installed_v)) if kernel in ctx.pins.source_builds else None
    trim = trimmed(ctx.env, ctx.pins.kernel(kernel), build) if build is not None else None
    if trim is None or not built_archs(installed_v):
        return ""
    have, window = cached_wheels.kept(cached_wheels.label_parts(installed_v.split("+", 1)[1].split("."))[1])
    out = []
    if have is not None:
        lacking = sorted(set(trim.head_dims or ctx.pins.kernel(kernel).head_dims.k) - set(have))
        if lacking:
            out.append(f"head dim{'s' if len(lacking) > 1 else ''} {'/'.join(map(str, lacking))}")
    if trim.window and not window:
        out.append("sliding window")
    return " and ".join(out)


def _retrimmed(ctx: Context, kernel: str, installed_v: str, lacks: str, decided: dict, kw) -> Decision:
    """An installed trimmed build without what a model in use needs: rebuilt for it (`repair.trim`), else blocked
    (`block.trim`) - its first forward would raise."""
    dist = ctx.pins.kernel(kernel).distributions[0]
    decision = _choice(ctx, kernel, decided, kw)
    what = f"{dist} {installed_v} was built without {lacks}, which a model here needs"
    if decision.action == INSTALL:
        return replace(decision, action=REPAIR, rule=ctx.rule(kernel, "repair.trim"), steps=_forced(decision),
                       on_failure=OnFailure.BLOCK, reason=f"{what}: rebuilding; {decision.reason}",
                       facts={**decision.facts, "lacks": lacks})
    return Decision(kernel=kernel, action=BLOCK, rule=ctx.rule(kernel, "block.trim"), on_failure=OnFailure.BLOCK,
                    reason=f"{what}; it cannot be rebuilt here: {decision.reason}",
                    fix=decision.fix or f"`pip uninstall {dist}` and install it where it can be built",
                    facts={"lacks": lacks}, **kw)


def _forced(decision: Decision) -> tuple:
    return tuple(replace(s, force=True) if s.kind in (StepKind.WHEEL, StepKind.BUILD) else s for s in decision.steps)


def _cannot_rebuild(ctx: Context, kernel: str, installed_v: str, inner: Decision) -> dict:
    """Why a build without its CUDA extension cannot be rebuilt here, and the fix, as the blocked line says
    them: the rebuild's own short forms where they fit, else a pointer to doctor."""
    head = f"{public(installed_v)} lacks the CUDA extension a model here calls; "
    options = [(inner.short_reason, inner.short_fix)] if inner.short_reason else []
    options.append(("it cannot be rebuilt here", "why and how to fix it: fastpath-hooks doctor"))
    for reason, fix in options:
        if len(PREFIX + compose(kernel, "blocked", head + reason, fix)) <= MAX_LINE:
            break
    return {"cannot": reason, "cannot_fix": fix or "pip uninstall it; install it where it builds"}


def _bad_code(ctx: Context, kernel: str, installed: str):
    """(gpu, rule) when the installed build runs code on a visible GPU that an arch rule says is wrong:
    a build of ours with that GPU's own code, or a release wheel (cuXY label) of such a CUDA major; else None."""
    local = installed.split("+", 1)[1] if "+" in installed else ""
    env, spec = ctx.env, ctx.pins.kernel(kernel)
    if not env.torch_cuda:
        return None
    if local.startswith("cu") and "torch" in local:   # a release wheel, built by that CUDA major's nvcc
        return _avoided(spec, env.gpus, local[2:local.index("torch")] + ".0")
    ours = set(built_archs(installed))
    return next(((g, r) for r in spec.arch_rules for g in env.gpus
                 if r.applies(g, env.torch_cuda) and cached_wheels.pair_for(g, ours) == g), None)


def _prerequisites(ctx: Context, kernel: str, decided: dict, kw) -> Decision | None:
    """What must be there before installing the kernel is worth it (pins: `imports_installed`,
    which fastpath-hooks never installs, and `with`, the kernels it is only useful with)."""
    spec = ctx.pins.kernel(kernel)
    missing = missing_import(ctx, kernel, kw)
    if missing is not None:
        return missing
    for partner in spec.with_kernels:
        d = decided.get(partner)
        if d is None or d.action in USABLE:
            continue
        if ctx.installed(ctx.pins.kernel(partner).distributions[0]):
            continue  # the user's own (skipped or blocked) install: not ours to judge here
        verb = "blocked" if d.action == BLOCK else "not installed"
        return ctx.skip(kernel, f"without.{ctx.pins.kernel(partner).rule_prefix}",
                        f"transformers uses {kernel} only with {partner}, which is {verb} here: {d.reason}", d.fix,
                        facts={"partner": partner, "verb": verb}, **kw)
    return None


def _choice(ctx: Context, kernel: str, decided: dict, kw) -> Decision:
    """The install of one pinned release: no build before a build, then one whose declared requirements
    agree with what is installed or planned, then the pins' order; none installable: the first one's reason."""
    planned = {canonical_name(n): v for k in _needed(ctx, kernel, decided) if decided[k].action in (INSTALL, REPAIR)
               for n, v in decided[k].target.items()}
    versions, clashes = release_order(ctx, kernel, planned)
    if versions is None:
        return ctx.skip(kernel, "no-release", clashes, "add a release to a FASTPATH_HOOKS_PINS file",
                        facts={"fits": versions_here(ctx.env)}, **kw)
    options = [(version, _install(ctx, kernel, version, kw)) for version in versions]
    acting = [(i, v, d) for i, (v, d) in enumerate(options) if d.action != SKIP]
    if not acting:   # the first release whose own files are there says what else is missing, else the first
        dist = ctx.pins.kernel(kernel).distributions[0]
        return next((d for v, d in options if f"{dist}=={v}" not in d.reason), options[0][1])
    # no build before a build; among release wheels, one whose sha256 the pins know before one they do not
    # (causal-conv1d 1.7.0's assets are not verified); then no declared clash; then the pins' order
    wheel = f"{ctx.pins.kernel(kernel).rule_prefix}.wheel"   # declared only for a kernel with release wheels
    _, version, decision = min(acting, key=lambda o: (
        any(s.kind == StepKind.BUILD for s in o[2].steps),
        o[2].rule == wheel and any(s.kind == StepKind.WHEEL and not s.sha256 for s in o[2].steps),
        o[1] in clashes, o[0]))
    if version in clashes:
        decision = replace(decision, reason=f"{decision.reason}; {version} declares {clashes[version]}: the --no-deps "
                                             "install leaves it unmet, a later resolver run could change it")
    elif version != versions[0] and versions[0] in clashes:
        decision = replace(decision, reason=f"{decision.reason}; {kernel} {version}, not {versions[0]}, which declares "
                                             f"{clashes[versions[0]]}")
    return _with_partners(ctx, kernel, decided, decision)


def _with_partners(ctx: Context, kernel: str, decided: dict, decision: Decision) -> Decision:
    """The kernels it is only useful with, or whose import runs inside its own, are ensured first (`needs`)."""
    needs = _needed(ctx, kernel, decided)
    if not needs:
        return decision
    first = [k for k in needs if decided[k].action != OK]
    return replace(decision, needs=needs, reason=decision.reason + (
        f"; with {', '.join(first)}, installed first" if first else f"; with {', '.join(needs)}"))


def _needed(ctx: Context, kernel: str, decided: dict) -> tuple:
    """The kernels ensured before it: its `with` partners that will be usable, then `_optional_needs`."""
    partners = tuple(k for k in ctx.pins.kernel(kernel).with_kernels
                     if decided.get(k) is not None and decided[k].action in USABLE)
    return partners + _optional_needs(ctx, kernel, decided)


def _optional_needs(ctx: Context, kernel: str, decided: dict) -> tuple:
    """The pins' `imports_optional` kernels that are installed and not skipped: its import imports them under
    a guard that catches only ImportError (mamba-ssm: tilelang), so a broken one is dealt with first."""
    return tuple(k for k in ctx.pins.kernel(kernel).imports_optional
                 if decided.get(k) is not None and decided[k].action != SKIP
                 and ctx.installed(ctx.pins.kernel(k).distributions[0]))


def _install(ctx: Context, kernel: str, version: str, kw) -> Decision:
    pins, env, settings = ctx.pins, ctx.env, ctx.settings
    spec = pins.kernel(kernel)
    dist = spec.distributions[0]
    rel, build = pins.release(kernel, version) or pins.release(kernel), pins.build(kernel, version)
    deps = deps_step(ctx, spec)
    dep_steps = (deps,) if deps is not None else ()
    filename, why = release_wheel(env, pins, kernel, version)

    def prebuilt(name, rule, reason, url=None, note=""):
        sha256 = rel.sha256.get(name) if rel is not None else None
        steps = dep_steps + (Step(kind=StepKind.WHEEL, requirements=(name,), url=url, sha256=sha256, note=note),)
        return Decision(kernel=kernel, action=INSTALL, rule=rule, reason=reason, steps=steps,
                        target={dist: version}, **kw)

    deps_missing = ctx.missing_offline(dep_steps)
    cached = next((n for n in env.cached_wheels if n == filename or fits(ctx, n, build, kernel)), None)
    housed = next((n for n in env.wheelhouse if n != filename and fits(ctx, n, build, kernel)), None)
    if deps_missing and (cached or housed):
        return ctx.skip(kernel, "offline-missing", f"offline, and FASTPATH_HOOKS_FIND_LINKS lacks "
                     f"{', '.join(deps_missing)}, which {cached or housed} needs", fetch_fix("them"),
                        facts={"missing": few(deps_missing)}, **kw)
    if cached:
        path = os.path.join(env.wheel_cache or "", cached)
        return prebuilt(cached, ctx.rule(kernel, "cache"), f"{cached} from the local wheel cache, {env.wheel_cache}",
                        url="file://" + quote(path), note="from the local wheel cache, no build")
    if housed:
        return prebuilt(housed, ctx.rule(kernel, "wheelhouse"), f"built wheel {housed} from the wheelhouse",
                        note="a wheel built for this torch and these GPUs, from the wheelhouse")

    if filename is not None:
        base = settings.wheel_urls.get(kernel) or rel.base_url.format(tag=rel.tag)
        url = base.rstrip("/") + "/" + quote(filename)
        in_house = filename in env.wheelhouse
        missing = list(deps_missing)
        if settings.offline and not in_house:
            missing = [filename] + missing
        if not missing:
            return prebuilt(filename, ctx.rule(kernel, "wheel"), f"prebuilt wheel {filename}",
                            url=None if in_house else url,
                            note="prebuilt release wheel" + (" from the wheelhouse" if in_house else "") +
                                 ("" if rel.sha256.get(filename) else "; no pinned sha256 (the pins do not know it)"))
        why = f"offline, and FASTPATH_HOOKS_FIND_LINKS lacks {', '.join(missing)}"
        if settings.allow_build == "0":
            return ctx.skip(kernel, "offline-missing", why, fetch_fix("the wheel", "the network"),
                            facts={"missing": few(missing)}, **kw)
    return source_build(ctx, kernel, build, why, kw)


# -- which wheels fit: release wheels, wheels built here ---------------------------------------------

def cxx11_abi_flag(env) -> str:
    """TRUE/FALSE for compiled kernels' wheel names. Unknown (torch not imported, or posed without abi=):
    PyPI's torch wheels use the cxx11 ABI from 2.7 on."""
    if env.cxx11_abi is not None:
        return "TRUE" if env.cxx11_abi else "FALSE"
    v = env.torch_version
    return "FALSE" if v is not None and (v.major, v.minor) < (2, 7) else "TRUE"


def release_wheel(env, pins, kernel: str, version: str | None = None) -> tuple[str | None, str]:
    """The kernel's release wheel file name for this torch/CUDA/ABI/Python/arch, or (None, why not)."""
    rel = pins.release(kernel, version)   # a pinned release's own (causal-conv1d 1.7.0), else the kernel's
    if rel is None:
        if pins.release(kernel) is None and not any(getattr(r, "release", None) for r in pins.kernel(kernel).releases):
            return None, f"no release wheels of {kernel} are pinned"
        return None, f"no release wheels are pinned for {kernel} {version}"
    if env.os != "linux":
        return None, f"release wheels are Linux-only (this is {env.os})"
    if not env.torch_cuda:
        return None, "release wheels are CUDA builds"
    cuda_major = env.torch_cuda.split(".")[0]
    torch_mm = major_minor(env.torch_version)
    torch_mm = rel.torch_aliases.get(torch_mm, torch_mm)
    py = "".join(env.python.split(".")[:2])
    py_dotted = ".".join(env.python.split(".")[:2])
    abi = cxx11_abi_flag(env)
    bad = _avoided(pins.kernel(kernel), env.gpus, f"{cuda_major}.0")
    if bad is not None:  # the release wheels of this CUDA major were built by such an nvcc (pins: arch_rules)
        gpu, rule = bad
        return None, (f"{kernel}'s cu{cuda_major} release wheels carry {gpu} code from nvcc {cuda_major}, which "
                      f"{rule.effect}, {rule.id}")
    for build in rel.builds:
        if (build["cuda_major"] == cuda_major and torch_mm in build["torch_mm"] and py_dotted in build["python"]
                and env.arch in build["arch"] and abi in build["abi"]):
            name = rel.filename.format(version=rel.version, cuda_major=cuda_major, torch_mm=torch_mm, abi=abi,
                                       py=py, arch=env.arch)
            return name, ""
    return None, (f"no prebuilt {kernel} {rel.version} wheel for torch {major_minor(env.torch_version)} + "
                  f"CUDA {cuda_major} + cp{py} + {env.arch} + cxx11abi {abi}")


def _avoided(spec, gpus, nvcc: str | None):
    """(gpu, rule) where an arch rule says prebuilt all-arch code from this nvcc is wrong on a visible GPU
    (pins `arch_rules` with `wheels: avoid`: causal-conv1d#105, sm_103 code from nvcc 13), else None."""
    return next(((g, r) for r in spec.arch_rules if r.wheels == "avoid" for g in gpus if r.applies(g, nvcc)), None)


def built_archs(installed: str) -> tuple:
    """The archs in the local label of a build of ours (`...+fph.torch2.11.0.cu130.abi1.sm90` ->
    ("sm_90",)); () for anything else (a release wheel, a build for `all`)."""
    local = installed.split("+", 1)[1] if "+" in installed else ""
    tokens = local.split(".")
    if not local.startswith(cached_wheels.LABEL + ".") or not any(t.startswith("abi") for t in tokens):
        return ()
    archs, _ = cached_wheels.label_parts(   # after torchX.Y.Z.cuXY.abiN, before a trimmed build's tokens
        tokens[[i for i, t in enumerate(tokens) if t.startswith("abi")][0] + 1:])
    return () if not archs or "all" in archs else tuple(f"sm_{t[2:]}" if t.startswith("sm") else t for t in archs)


def arch_gaps(installed: str, gpus) -> tuple:
    """The visible GPUs an installed build of ours has no code for (a release wheel holds every arch)."""
    codes = set(built_archs(installed))
    return tuple(g for g in gpus if cached_wheels.pair_for(g, codes) is None) if codes else ()


def built_fits(env, pins, name: str, kernel: str | None = None) -> bool:
    """A built wheel (by its file name) of a compiled kernel's pinned version (`kernel`'s when given) that
    runs here: this torch build, Python, ABI, platform and GPUs."""
    wheel = parse_wheel(name)
    owner, build = pins.build_for_distribution(wheel.distribution) if wheel is not None else (None, None)
    if owner is None or kernel not in (None, owner):
        return False
    versions = [r.version for r in pins.kernel(owner).releases] or [build.version]
    return any(fits(Context(env, None, pins, False), name, pins.build(owner, v), owner) for v in versions)


def fits(ctx: Context, name: str, build, kernel: str) -> bool:
    env = ctx.env
    if not env.torch or build.version is None:
        return False
    trim = trimmed(env, ctx.pins.kernel(kernel), build)
    # a cached build was compiled by an nvcc of torch's CUDA major (cuXY in its label): its code for a GPU an
    # arch rule names is wrong, whichever wheel holds it
    bad = {g: g for g in env.gpus if env.torch_cuda and any(r.applies(g, env.torch_cuda) for r in build.arch_rules)}
    return cached_wheels.fits(name, distribution=build.distribution, version=build.version, torch=env.torch,
                              cuda=env.torch_cuda, hip=env.torch_hip, abi=cxx11_abi_flag(env), python=env.python,
                              arch=env.arch, gpus=env.gpus, all_codes=cuda_codes(build, env.torch_cuda), bad=bad,
                              python_only=not needs_cuda_build(env, build)[0],
                              needs=trim.needs if trim is not None else None)
