"""Pure-Python wheels at pinned releases (fla: fla-core + flash-linear-attention at one version, --no-deps): the
first release that fits torch, triton and transformers - and where a hazard applies (fla#640 on Hopper) has the
backend it needs, installed after that serving kernel. A broken or unsafe install is replaced, or blocked."""

from __future__ import annotations

from packaging.version import Version

from ...facts.pins import same_version
from .. import messages as short
from ..common import (Context, HALF_INSTALLED, NOT_OURS, USABLE, fetch_fix, first_installable, has_backend,
                      kernel_steps, missing_import, parse, shared_skip, versions_here, within)
from ..messages import few
from ..plan import BLOCK, Decision, INSTALL, OK, OnFailure, REPAIR, gdr_check, model_shapes
from ..transformers import era


def decide(ctx: Context, kernel: str, decided: dict) -> Decision:
    pins, env = ctx.pins, ctx.env
    spec = pins.kernel(kernel)
    installed = ctx.installed_of(kernel)
    kw = ctx.kw(kernel, installed)
    # its first installed distribution's version (before 0.4 flash-linear-attention shipped `fla` itself)
    current = next(iter(installed.values()), None)
    common = shared_skip(ctx, kernel, installed=installed)
    if common is not None:
        # an installed kernel outside its support still imports: the hazard's block comes first
        hazards = ctx.hazards(kernel) if current and common.rule not in NOT_OURS else []
        if hazards and decided[hazards[0].needs].action not in USABLE:
            return _hazard(ctx, kernel, hazards[0], decided, kw, block=True)
        return common
    kw["env"] = _switched_off(ctx, kernel)
    transformers = env.version("transformers")
    if spec.gates and env.accelerator == "xpu" and era(env.dist_version("transformers")) in ("A", "B"):
        return ctx.skip(kernel, "xpu.old-transformers", f"transformers {transformers} uses {kernel} on CUDA only "
                        "(on XPU from 5.15)", "upgrade transformers to >= 5.15", **kw)
    missing = missing_import(ctx, kernel, kw)
    if missing is not None:
        return missing

    hz = next(iter(ctx.hazards(kernel)), None)
    serving_ok = hz is None or decided[hz.needs].action in USABLE
    candidates = [rel for rel in spec.releases
                  if within(env.torch_version, rel.torch) and within(env.triton_version, rel.triton)
                  and not (transformers and not within(env.dist_version("transformers"), rel.transformers))
                  and not (hz is not None and hz.needs not in rel.backends)]
    needs = (hz.needs,) if hz is not None else ()
    on_failure = OnFailure.BLOCK if hz else OnFailure.PROCEED
    check = _warm_check(ctx, kernel, hz)
    if current:
        if not serving_ok:
            return _hazard(ctx, kernel, hz, decided, kw, block=True)
        known = next((r for r in spec.releases if same_version(r.version, current)), None)
        first = spec.distributions[0]
        problems = []   # (the whole text, the short one the line says)
        if first not in installed:
            problems.append(("; ".join(f"{d} {v} without {first}" for d, v in installed.items()),
                             f"installed without {first}"))
        half = [d for d in spec.distributions if d in env.half_installed and not ctx.fresh]
        if half:
            problems.append((f"{' and '.join(half)} {HALF_INSTALLED}", f"{' and '.join(half)} half-installed"))
        if len(installed) > 1 and len({parse(v) or v for v in installed.values()}) > 1:
            problems.append((" and ".join(f"{d} {v}" for d, v in installed.items()) + " differ",
                             "its distributions' versions differ"))
        incompatible = known is not None and not within(env.triton_version, known.triton)
        if incompatible:
            problems.append((f"{kernel} {current} does not import with triton {env.triton}, it needs triton "
                             f"{known.triton}", f"{current} does not import with triton {env.triton}"))
        unsafe = hz is not None and not has_backend(spec, current, hz.needs)
        if unsafe:
            problems.append((f"{kernel} {current} has no {hz.needs} backend, so it is wrong here because of {hz.id}",
                             f"{current} lacks the {hz.needs} backend {hz.id} needs"))
        if not problems:
            # its check (run when a verification is due) also warms the JIT caches this process uses
            return Decision(kernel=kernel, action=OK, rule=ctx.rule(kernel, "ok"), needs=needs, check=check,
                            reason=f"{kernel} {current} installed" +
                                   (f"; needs {hz.needs} here because of {hz.id}" if hz else ""),
                            on_failure=on_failure, facts={"hazard": hz.id if hz else ""}, **kw)
        whole = "; ".join(w for w, _ in problems)
        problem = problems[0][1] + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
        chosen, planned, missing = _pick(ctx, kernel, candidates, force=True)
        if chosen is not None:
            return Decision(kernel=kernel, action=REPAIR, rule=ctx.rule(kernel, "repair"), steps=planned,
                            reason=f"{whole}; replacing with {kernel} {chosen.version}", needs=needs, check=check,
                            target=dict.fromkeys(spec.distributions, chosen.version),
                            on_failure=OnFailure.BLOCK if (unsafe or incompatible) else on_failure,
                            facts={"problem": problem}, **kw)
        nothing = (f"offline, and FASTPATH_HOOKS_FIND_LINKS lacks {', '.join(missing)}" if missing
                   else f"no known-good {kernel} release fits here")
        facts = {"problem": problem, "nothing": f"offline, lacking {few(missing, 16)}" if missing
                 else "no pinned release fits", "first_release": spec.releases[0].version}
        if unsafe or incompatible:   # its import would crash or compute wrongly: fail closed, torch path
            fix = (f"install {kernel} {spec.releases[0].version} or newer" if unsafe else
                   "add a fitting release's wheels to FASTPATH_HOOKS_FIND_LINKS or allow the index")
            return Decision(kernel=kernel, action=BLOCK, rule=ctx.rule(kernel, "unsafe.block" if unsafe else
                                                                       "incompatible.block"),
                            reason=f"{whole}; {nothing}", fix=fix, on_failure=OnFailure.BLOCK, facts=facts, **kw)
        return Decision(kernel=kernel, action=OK, rule=ctx.rule(kernel, "ok.with-problems"), needs=needs,
                        reason=f"{whole}; {nothing}, leaving it as it is", on_failure=on_failure, facts=facts,
                        check=check, **kw)
    if not serving_ok:
        return _hazard(ctx, kernel, hz, decided, kw, block=False)
    if not candidates:
        what = f"triton {env.triton}, torch {env.torch}" + (f", transformers {transformers}" if transformers else "")
        if hz is not None:
            what += f" with a {hz.needs} backend, needed here because of {hz.id}"
        return ctx.skip(kernel, "no-release", f"no known-good {kernel} release for {what}",
                        "add a release to a FASTPATH_HOOKS_PINS file",
                        facts={"fits": versions_here(env) + (f" with {hz.needs}" if hz is not None else "")}, **kw)
    chosen, planned, missing = _pick(ctx, kernel, candidates, force=False)
    if chosen is None:
        return ctx.skip(kernel, "offline-missing", f"offline, and FASTPATH_HOOKS_FIND_LINKS lacks {', '.join(missing)}",
                        fetch_fix(f"{kernel}'s wheels"), facts={"missing": few(missing)}, **kw)
    fits = [f"triton {env.triton}"] if str(chosen.triton) else []      # what the release's ranges name
    fits += [f"transformers {transformers}"] if transformers and str(chosen.transformers) else []
    reason = f"{kernel} {chosen.version} fits {' and '.join(fits or [f'torch {env.torch}'])}"
    if hz is not None:
        reason += f"; with {hz.needs} because of {hz.id}"
    reason += _issues(env, spec, chosen)
    return Decision(kernel=kernel, action=INSTALL, rule=ctx.rule(kernel, "install"), reason=reason, steps=planned,
                    target=dict.fromkeys(spec.distributions, chosen.version), needs=needs, check=check,
                    facts={"fits": " and ".join(fits or [f"torch {env.torch}"]), "hazard": hz.id if hz else ""}, **kw)


def _warm_check(ctx: Context, kernel: str, hz) -> dict:
    """Where a hazard makes it run a serving kernel's JIT path (fla on Hopper: tilelang), or on the GPUs whose
    miscompiles its pins name (`warm.gpus`), its one check pass runs at the model's shapes (pins `warm`): the JIT
    happens there, not in training. Where transformers calls it through a decorated function (5.15+), the check
    waits for the kernel's first call, which gives the shapes, dtype, length and variant."""
    spec, env = ctx.pins.kernel(kernel), ctx.env
    if spec.warm is None or (hz is None and not set(env.gpus) & set(spec.warm.gpus)):
        return {}
    shapes, source = model_shapes(env.model_shapes, spec.warm, env.dist_version("transformers"))
    first_call = bool(spec.gates) and era(env.dist_version("transformers")) in ("C", "D")
    return gdr_check(env, ctx.pins, kernel, served=kernel, shapes=shapes, shapes_from=source, first_call=first_call)


def _issues(env, spec, chosen) -> str:
    """The release's known issues on the visible GPUs (pins `issues`), one clause each, with the release fixing it."""
    out = ""
    for issue in chosen.issues:
        hit = [g for g in env.gpus if g in issue.gpus]
        if not hit:
            continue
        newer = next((r for r in spec.releases if r is not chosen and not any(i.id == issue.id for i in r.issues)
                      and Version(r.version) > Version(chosen.version)), None)
        out += (f"; on {'+'.join(hit)} it {issue.effect}, {issue.id}" +
                (f", fixed in {newer.version}, which needs transformers {newer.transformers}" if newer else "") +
                ": its numbers are checked on this GPU first and it is blocked if they differ")
    return out


def _switched_off(ctx: Context, kernel: str) -> tuple:
    """(variable, off) of the serving kernels that cannot run on this accelerator (pins `switch.off_on`; fla on
    ROCm: FLA_TILELANG=0), unless the user set the variable."""
    return tuple((s.switch.variable, s.switch.off) for s in ctx.pins.kernels.values()
                 if s.switch is not None and kernel in s.serves and ctx.env.accelerator in s.switch.off_on
                 and ctx.env.switches.get(s.switch.variable) is None)


def _hazard(ctx: Context, kernel: str, hz, decided: dict, kw, *, block: bool) -> Decision:
    """The serving kernel a hazard needs cannot be had: an installed kernel is blocked, else not installed. The
    line: `fla#640 on sm_90 + triton 3.6.0 needs tilelang: no nvcc`, the GPU and triton left out where too long."""
    env, serving = ctx.env, decided[hz.needs]
    gpus = "+".join(g for g in env.gpus if g in hz.gpu)
    why = serving.reason.split("; ")[0]   # a skip/block reason says why in its first clause
    reason = f"{gpus} + triton {env.triton} {hz.effect} ({hz.id}), and {hz.needs} is unavailable: {why}"
    fix = f"{serving.fix}; or {hz.fix}" if serving.fix else hz.fix
    short_fix = serving.short_fix if serving.short_reason and serving.short_fix else hz.fix
    whys = [serving.short_reason or why]
    whys += [w for w in (short.compact(ctx, serving),) if w and w != whys[0]]
    heads = (f"{hz.id} on {gpus} + triton {env.triton} needs {hz.needs}", f"{hz.id} on {gpus} needs {hz.needs}",
             f"{hz.id} needs {hz.needs}")
    line = short.fitting(kernel, short.BLOCKED if block else short.NOT_INSTALLED,
                         (f"{head}: {w}" for w in whys for head in heads), short_fix)
    facts = {"hazard": hz.id, "hazard_line": line, "hazard_fix": short_fix}
    if block:
        return Decision(kernel=kernel, action=BLOCK, rule=ctx.rule(kernel, "hazard.block"), reason=reason, fix=fix,
                        on_failure=OnFailure.BLOCK, facts=facts, **kw)
    return ctx.skip(kernel, "hazard.skip", f"{reason}; installed alone, {kernel} would crash or compute wrongly", fix,
                    facts=facts, **kw)


def _pick(ctx: Context, kernel: str, candidates, *, force: bool):
    spec = ctx.pins.kernel(kernel)
    note = (("every distribution at one version" if len(spec.distributions) > 1 else "the pinned release") +
            ", without their torch/transformers requirements")
    return first_installable(ctx, candidates, lambda v: kernel_steps(ctx, spec, v, note, force=force))
