"""A compiled kernel's source build, for the policy and `fastpath-hooks build`: which pinned release, whether a
build may start here (compiler, archs, time), what it compiles for this machine, and how builds share its cores
and memory. The pins (`source_build`, `releases`) say what each sdist does.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from ..facts import wheels as cached_wheels
from ..facts.distributions import canonical_name
from .common import Context, deps_step, lacking, versions_here, within
from .messages import few, minutes, render
from .plan import Decision, INSTALL, SKIP, Step, StepKind


def release_order(ctx: Context, kernel: str, planned: dict):
    """(the pinned versions that fit here, in order; version -> its declared requirement that what is installed
    or `planned` does not meet), or (None, why none fits). A --no-deps install leaves such a requirement unmet
    for the next resolve to "fix" (mamba-ssm 2.3.2's tilelang==0.1.8 would downgrade fla's on Hopper)."""
    env, pins = ctx.env, ctx.pins
    releases = pins.kernel(kernel).releases
    if not releases:
        return (pins.build(kernel).version,), {}
    transformers = env.version("transformers")
    fits = [r for r in releases if within(env.torch, r.torch) and (env.triton is None or within(env.triton, r.triton))
            and not (transformers and not within(transformers, r.transformers))]
    if not fits:
        what = f"torch {env.torch}, triton {env.triton}" + (f", transformers {transformers}" if transformers else "")
        return None, f"no pinned {kernel} release fits {what}"
    clashes = {}
    for r in fits:
        for raw in r.declares:
            req = Requirement(raw)
            name = canonical_name(req.name)
            have = planned.get(name) or ctx.installed(name)
            if have is not None and not within(have, req.specifier):
                clashes.setdefault(r.version, f"{raw} while {name} {have} is "
                                              f"{'planned' if name in planned else 'installed'}")
    return tuple(r.version for r in fits), clashes


def decide_build(env, settings, pins, kernel: str) -> Decision:
    """`fastpath-hooks build`: the source build for `env.gpus` (the archs asked for), whatever wheels exist."""
    ctx = Context(env, settings, pins, False)
    kw = ctx.kw(kernel, {})
    versions, clashes = release_order(ctx, kernel, {})
    if versions is None:
        return render(ctx, ctx.skip(kernel, "no-release", clashes, "add a release to a FASTPATH_HOOKS_PINS file",
                                    facts={"fits": versions_here(env)}, **kw))
    # a release without a declared clash first; the first that can be built here, else the first one's reason
    order = sorted(versions, key=lambda v: v in clashes)
    options = [source_build(ctx, kernel, pins.build(kernel, v), "asked for by `fastpath-hooks build`", kw, asked=True)
               for v in order]
    return render(ctx, next((d for d in options if d.action != SKIP), options[0]))


def source_build(ctx: Context, kernel: str, build, why: str, kw, *, asked: bool = False) -> Decision:
    """The build's INSTALL (`asked`: `fastpath-hooks build`, which installs nothing: no runtime dependencies),
    or why not. What the build needs and the environment lacks (the pins' build_deps) are its step's `helpers`:
    installed into the build's own directory, never the environment (a failed build leaves it as it was)."""
    env, settings = ctx.env, ctx.settings
    deps = None if asked else deps_step(ctx, ctx.pins.kernel(kernel))
    dep_steps = (deps,) if deps is not None else ()
    helpers = lacking(ctx, build.build_deps, besides=deps)
    mode = settings.allow_build
    rocm = bool(env.torch_hip)
    if mode == "0" and rocm:
        return ctx.skip(kernel, "rocm.no-build", "no prebuilt ROCm wheels, and source builds are off by "
                        "FASTPATH_HOOKS_ALLOW_BUILD=0", "set FASTPATH_HOOKS_ALLOW_BUILD=auto to build it with hipcc "
                        "for this machine's GPUs", **kw)
    if mode == "0":
        return ctx.skip(kernel, "no-wheel", f"source builds are off by FASTPATH_HOOKS_ALLOW_BUILD=0, and {why}",
                        "set FASTPATH_HOOKS_ALLOW_BUILD=auto to build it for this machine's GPUs, or put a wheel from "
                        "`fastpath-hooks build` in FASTPATH_HOOKS_FIND_LINKS", **kw)
    if not env.pip:  # the build runs `python -m pip wheel` (uv builds through an isolated cache of its own)
        return ctx.skip(kernel, "build.no-pip", f"{why}, and a source build runs pip, which this environment lacks "
                        "(a `uv venv`)", "run `python -m ensurepip`, or put a wheel from `fastpath-hooks build` in "
                        "FASTPATH_HOOKS_FIND_LINKS", **kw)
    needs_cuda, families = needs_cuda_build(env, build)   # families: "" where the release has no opt-in extension
    switch_env = dict(build.cuda_switch.env) if needs_cuda and families else {}
    if not needs_cuda and not rocm:   # the release's CUDA extension is opt-in and nothing in use calls it
        step = Step(kind=StepKind.BUILD, requirements=(build.pip_requirement,), binary_only=False,
                    build_isolation=False, env=tuple(sorted(build.env.items())), archs=("py",), helpers=helpers,
                    note=f"source build without the CUDA extension ({families}): Python and Triton only, no compiler")
        return _install(ctx, kernel, build, why, dep_steps + (step,), kw, rule=ctx.rule(kernel, "build.triton-only"),
                        reason=f"building from source without its CUDA extension, nothing to compile: {families}; "
                               f"{why}", facts={"users": few(cuda_families(env, build)[1])})
    if rocm:
        why = "no prebuilt ROCm wheels"
        if not env.hipcc:
            return ctx.skip(kernel, "rocm.no-hipcc", f"{why}, and a source build needs hipcc, which is not found",
                            "install ROCm's hipcc (ROCM_HOME, PATH or /opt/rocm)", **kw)
        compiler = "hipcc"
    else:
        if not env.nvcc or env.nvcc.startswith("nvidia-cuda-nvcc"):
            return ctx.skip(kernel, "no-nvcc", f"{why}, and a source build needs a CUDA toolkit's nvcc, which is not "
                            "found", f"install a CUDA {env.torch_cuda} toolkit (torch's) and set CUDA_HOME", **kw)
        torch_major = (env.torch_cuda or "").split(".")[0]
        if env.nvcc_version is None and mode == "auto":
            return ctx.skip(kernel, "nvcc-unknown", f"{why}, and the CUDA release of nvcc ({env.nvcc}) cannot be "
                            "told, so a build for torch's CUDA is not started unasked", "point CUDA_HOME at a toolkit "
                            "whose nvcc answers --version, or set FASTPATH_HOOKS_ALLOW_BUILD=1", **kw)
        if env.nvcc_version is not None and env.nvcc_version.split(".")[0] != torch_major:
            return ctx.skip(kernel, "nvcc-mismatch", f"{why}, and nvcc is CUDA {env.nvcc_version} while torch is "
                            f"built for CUDA {env.torch_cuda}: torch refuses to build extensions across CUDA majors",
                            f"point CUDA_HOME at a CUDA {torch_major}.x toolkit", **kw)
        compiler = f"nvcc {env.nvcc_version}" if env.nvcc_version else "nvcc"
    archs, unsupported = build_archs(env, build)
    if unsupported and not rocm:
        codes = cuda_codes(build, env.nvcc_version)
        return ctx.skip(kernel, "build.no-arch", f"{why}, and {build.requirement} compiles no code that "
                        f"runs on {'+'.join(unsupported)}; with {compiler} it targets {', '.join(codes)}", "",
                        facts={"unsupported": "+".join(unsupported)}, **kw)
    env_pairs = dict(build.rocm_env if rocm else build.env)
    env_pairs.update(switch_env)   # the opt-in CUDA build, where the release has one and a family in use needs it
    trim = trimmed(env, ctx.pins.kernel(kernel), build)
    if trim is not None:           # the head dims and sliding window the models in use do not have: left out
        env_pairs.update(trim.env)
    if unsupported or not archs:
        what = "+".join(unsupported) or "no GPU listed"
        if mode == "auto":
            seconds, _ = build_estimate(build, len(cuda_codes(build, env.nvcc_version)), env.cpus, env.build_history)
            return ctx.skip(kernel, "build.unrestricted", f"{why}; a source build cannot be restricted to "
                            f"this machine's GPUs, {what}: unknown archs; and one for every arch takes long "
                            f"- about {minutes(seconds)}, an estimate",
                            "set FASTPATH_HOOKS_ALLOW_BUILD=1 to build for every arch anyway",
                            facts={"unsupported": what, "minutes": minutes(seconds)}, **kw)
        archs, rule = ("all",), ctx.rule(kernel, "rocm.build" if rocm else "build.all-archs")
        n_archs = len(cuda_codes(build, env.nvcc_version)) if not rocm else 1
    else:
        rule = ctx.rule(kernel, "rocm.build" if rocm else "build")
        n_archs = len(archs)
        if rocm:
            env_pairs["HIP_ARCHITECTURES"] = " ".join(archs)
        elif build.arch_env:   # the sdist's own arch list (FLASH_ATTN_CUDA_ARCHS=80): it compiles only these
            env_pairs[build.arch_env] = ";".join(a[3:] for a in archs)
    where = "every arch" if archs == ("all",) else ", ".join(archs)
    seconds, how = build_estimate(build, n_archs, env.cpus, env.build_history)
    if rocm:
        how += " of a CUDA build"
    std = ctx.pins.cxx_standard(env.torch_version)
    notes = arch_rule_notes(env, build) if archs != ("all",) else ()
    if std is not None:
        compiler += f" and -std={std.std}"
    if seconds > settings.timeout:
        enough = int(seconds * 1.5)
        return ctx.skip(kernel, "build.timeout", f"{why}; a source build for {where} takes about "
                        f"{minutes(seconds)}, {how}; longer than FASTPATH_HOOKS_TIMEOUT={settings.timeout:.0f} s",
                        f"raise FASTPATH_HOOKS_TIMEOUT to {enough} or more" +
                        ("" if asked else f", or build it ahead of time with `fastpath-hooks build {kernel}`"),
                        facts={"minutes": minutes(seconds), "timeout_fix": f"FASTPATH_HOOKS_TIMEOUT={enough}"
                               if asked else f"ahead of time: fastpath-hooks build {kernel}"}, **kw)
    step = Step(kind=StepKind.BUILD, requirements=(build.pip_requirement,), binary_only=False, build_isolation=False,
                env=tuple(sorted(env_pairs.items())), archs=archs, cxx_std=std.std if std is not None else None,
                helpers=helpers, variant=trim.tokens if trim is not None else (),
                note=f"source build against the installed torch with {compiler}, for {', '.join(archs)}; about "
                     f"{minutes(seconds)}, {how}" + "".join(f"; {long}" for _, long in notes) +
                     (f"; trimmed to {trim.said}" if trim is not None else "") +
                     (f"; -std={std.std} handed last to the host compiler and {'hipcc' if rocm else 'nvcc'}: "
                      f"torch {env.torch} needs it" if std else "") +
                     (f"; {', '.join(f'{k}={v}' for k, v in switch_env.items())}: {families}" if switch_env else "") +
                     (f"; {', '.join(helpers)} for the build only, in its own directory" if helpers else ""))
    allowed = "" if asked else f", as FASTPATH_HOOKS_ALLOW_BUILD={mode} allows"
    # what happens and how long first, where a cut line keeps it
    return _install(ctx, kernel, build, why, dep_steps + (step,), kw, rule=rule, expected_seconds=round(seconds),
                    reason=f"building from source for {where} with {compiler}, about {minutes(seconds)}, an "
                           f"estimate{allowed}; {''.join(f'{short}; ' for short, _ in notes)}{why}")


def _install(ctx: Context, kernel: str, build, why: str, steps, kw, **decision) -> Decision:
    """The build's INSTALL, or offline-missing where the wheelhouse lacks what it needs."""
    missing = ctx.missing_offline(steps)
    if missing:
        return ctx.skip(kernel, "offline-missing", f"{why}; a source build needs {', '.join(missing)} too, "
                        "which FASTPATH_HOOKS_FIND_LINKS lacks", "add the sdist and wheels or allow the index",
                        facts={"missing": few(missing)}, **kw)
    return Decision(kernel=kernel, action=INSTALL, steps=steps, target={build.distribution: build.version},
                    **decision, **kw)


@lru_cache(maxsize=256)
def cuda_codes(build, nvcc_version: str | None) -> tuple:
    """The -gencode codes the sdist compiles with this nvcc release (all it knows when unknown)."""
    codes = (code for code, spec in build.cuda_archs.items() if nvcc_version is None or within(nvcc_version, spec))
    return tuple(sorted(codes, key=lambda c: cached_wheels.compute_capability(c) or (0, 0)))


def build_archs(env, build) -> tuple:
    """(codes to compile, GPUs nothing compiled runs on): the sdist's codes, given this nvcc, whose binaries run
    on the visible GPUs - sm_86 takes sm_80's; ROCm: gfx as is."""
    gpus = tuple(env.gpus)
    if env.torch_hip:
        known = tuple(g for g in gpus if g.startswith("gfx") and len(g) > 3)
        return tuple(sorted(set(known))), tuple(g for g in gpus if g not in known)
    codes = cuda_codes(build, env.nvcc_version)
    chosen = {}
    for g in gpus:
        rule = _arch_rule(g, build, env.nvcc_version)
        chosen[g] = cached_wheels.pair_for(rule.build_as if rule is not None else g, codes)
    return tuple(sorted({c for c in chosen.values() if c}, key=cached_wheels.compute_capability)), \
        tuple(g for g, c in chosen.items() if c is None)


def _arch_rule(gpu: str, build, nvcc_version):
    """The arch rule saying this nvcc's code for `gpu` is wrong (an unknown nvcc release fails closed), or None."""
    return next((r for r in build.arch_rules if r.applies(gpu, nvcc_version)), None)


def cuda_families(env, build) -> tuple:
    """(the model families in use that call the opt-in CUDA extension, those that use its Triton ops only)."""
    switch = build.cuda_switch
    if switch is None:
        return [], []
    in_use = env.model_types
    return [t for t in in_use if t in switch.needed_by], [t for t in in_use if t in switch.triton_only]


def needs_cuda_build(env, build) -> tuple:
    """(whether the build compiles the CUDA extension, why): always, unless it is opt-in (pins cuda_switch) and the
    model families in use include one that does without it and none that calls it; unknown counts as needed."""
    switch = build.cuda_switch
    if switch is None or build.version is None or not switch.applies(build.version):
        return True, ""
    calls, users = cuda_families(env, build)
    if calls:
        return True, f"{', '.join(calls)} calls its CUDA extension"
    if not users:
        return True, "the model families in use are not known here"
    return False, f"only {', '.join(users)} in use, {'which uses' if len(users) == 1 else 'which use'} its Triton ops"


def arch_rule_notes(env, build) -> tuple:
    """What the arch rules change for the visible GPUs: ((short for the reason, whole for the step's note), ...)."""
    rules = ((g, _arch_rule(g, build, env.nvcc_version)) for g in (() if env.torch_hip else env.gpus))
    return tuple((f"{g} gets {r.build_as} code: {r.id}", f"{g} gets {r.build_as} code, which runs on it: {g} code "
                  f"from nvcc {env.nvcc_version or '(release unknown)'} {r.effect} ({r.id})")
                 for g, r in rules if r is not None)


def build_estimate(build, n_archs: int, cpus: int | None, history=()) -> tuple:
    """(seconds, how): this machine's last build of it (`history`, the same version preferred), else the pins'
    figure, scaled by archs (each compiled separately) and by fewer cores (more do not help)."""
    mine = [r for r in history if r.get("distribution") == build.distribution and r.get("seconds")]
    same = [r for r in mine if r.get("version") == build.version] or mine
    if same:
        rec = same[-1]
        base, split = float(rec["seconds"]), int(rec.get("split") or 1)
        archs, cores = max(1, int(rec.get("n_archs") or 1)), max(1, int(rec.get("cores") or 1))
        origin = (f"this machine's build of {build.distribution} {rec.get('version')} took {base:.0f} s for {archs} "
                  f"arch on {cores} cores" + (f" (--split-compile={split})" if split > 1 else ""))
    else:
        base, archs, cores = build.seconds, build.archs, build.cores
        origin = f"{build.seconds:.0f} s measured for {build.archs} arch on {build.cores} cores"
    seconds = base * n_archs / archs
    if cpus and cpus < cores:
        seconds *= cores / cpus
    how = f"an estimate: {origin}, scaled to {n_archs} arch{'s' if n_archs != 1 else ''} on {cpus or '?'} cores"
    return seconds, how


class Trimmed(NamedTuple):
    """What a trimmed build (pins `source_build.trim`) keeps for the models in use, and how."""
    head_dims: tuple | None   # the head dims kept (None: all)
    window: bool              # local (sliding-window) attention kept
    env: tuple                # ((variable, "TRUE"), ...) leaving the rest out
    tokens: tuple             # its wheel label's (facts/wheels.py variant_tokens)
    said: str                 # "head dim 256 (qwen3_5), no sliding window"

    @property
    def needs(self) -> tuple:
        return self.head_dims, self.window


def trimmed(env, spec, build) -> Trimmed | None:
    """The build's trim for the imported models' attention (`env.attention_shapes`): per model the smallest of the
    kernel's head dims at or above its own, every dim where one is unknown or none is imported; local attention
    where one has a sliding window or none is imported. None for a build without `trim`."""
    trim = build.trim
    if trim is None or spec.head_dims is None:
        return None
    dims = sorted(spec.head_dims.k)
    rows = env.attention_shapes
    known = [r[1] for r in rows]
    keep = None if not rows or None in known else \
        tuple(sorted({next((d for d in dims if d >= own), dims[-1]) for own in known}))
    window = bool(trim.window) and (not rows or any(r[4] is not False for r in rows))
    off = [trim.head_dims.format(dim=d) for d in dims if keep is not None and d not in keep]
    if trim.window and not window:
        off.append(trim.window)
    models = ", ".join(dict.fromkeys(r[0] for r in rows)) or "no model imported"
    said = (("every head dim" if keep is None else f"head dim{'s' if len(keep) > 1 else ''} {'/'.join(map(str, keep))}")
            + f" ({models}), {'with' if window else 'no'} sliding window")
    return Trimmed(keep, window, tuple((var, "TRUE") for var in off), cached_wheels.variant_tokens(keep, window), said)


# -- how builds share the machine: jobs, split compilation, cores, memory --------------------------------

# nvcc --split-compile=N (CUDA 11.8+) runs the optimizer and ptxas of one translation unit in N threads
SPLIT_COMPILE_NVCC = ">=11.8"
# 4-6 GB resident measured for one causal-conv1d nvcc job with `--threads 4` (gpu-findings.md)
GIB_PER_THREAD = 1.5


class Share(NamedTuple):
    """One build's part of the machine: `cores`, MAX_JOBS=`jobs`, `split` threads per nvcc job (1: no
    --split-compile; jobs x split <= cores, within its memory), `parts` a `split_units` file is compiled in."""
    cores: int
    jobs: int
    split: int
    parts: int = 1


def unit_parts(build, cores: int) -> int:
    """The parts a split unit is compiled in with `cores`: the cores the build's other files leave."""
    if not build.split_units:
        return 1
    units = max(int(build.translation_units or 1), len(build.unit_seconds))
    return max(1, cores - (units - len(build.split_units)))


def makespan(build, cores: int) -> float | None:
    """The expected wall time on `cores` from the files' measured compiles (pins `parallel.unit_seconds`),
    longest first onto the least loaded core; None without the figures."""
    seconds = dict(build.unit_seconds)
    if not seconds:
        return None
    parts = unit_parts(build, cores)
    pieces = [s for u, s in seconds.items() if u not in build.split_units]
    pieces += [seconds[u] / parts for u in build.split_units for _ in range(parts)]
    loads = [0.0] * max(1, cores)
    for piece in sorted(pieces, reverse=True):
        loads[loads.index(min(loads))] += piece
    return max(loads)


def split_allowed(build, settings, nvcc_version) -> bool:
    """The pins allow --split-compile, FASTPATH_HOOKS_SPLIT_COMPILE is not 0, and nvcc is a release that has it."""
    return (settings.split_compile != "0" and build.split_compile and nvcc_version is not None
            and within(nvcc_version, SpecifierSet(SPLIT_COMPILE_NVCC)))


def core_budget(builds, *, cpus: int | None, memory_gib: float | None, settings, jobs_given: int | None = None) -> dict:
    """kernel -> Share for builds run at once: `builds` = (kernel, SourceBuild, expected seconds, split allowed).
    The cores go where they shorten the longest build, else in proportion to the expected times; a build runs a
    job per file and gives nvcc the cores left as split threads; memory takes threads first, then jobs."""
    builds = list(builds)
    if not builds:
        return {}
    total = max(1, cpus or 1)
    if len(builds) > 1 and all(b.unit_seconds for _, b, _, _ in builds):
        shares = _balanced(total, [b for _, b, _, _ in builds])
    else:
        weights = [max(1.0, float(seconds or 1.0)) for _, _, seconds, _ in builds]
        shares = _proportional(total, weights)
    forced = int(settings.split_compile) if settings.split_compile not in ("auto", "0") else None
    out = {}
    for (kernel, build, _, allowed), cores in zip(builds, shares):
        units = max(1, int(build.translation_units or 1))
        jobs = jobs_given or (max(1, min(units, cores // forced)) if allowed and forced else min(units, cores))
        split = (forced or max(1, cores // jobs)) if allowed else 1
        parts = unit_parts(build, cores) if allowed else 1
        if jobs_given:
            parts = min(parts, jobs_given)   # the user's MAX_JOBS caps the compiles at once, parts too
        if memory_gib:
            room = memory_gib * cores / total
            per_job = build.gib_per_job or GIB_PER_THREAD   # pins parallel.gib_per_job: a job's peak (flash-attn: 9)
            while split > 1 and jobs * split * GIB_PER_THREAD > room:
                split -= 1
            while parts > 1 and (jobs - 1 + parts) * GIB_PER_THREAD > room:
                parts -= 1
            while not jobs_given and jobs > 1 and jobs * per_job > room:
                jobs -= 1
        out[kernel] = Share(cores, jobs, split, parts)
    return out


def _balanced(total: int, builds) -> list:
    """`total` cores, one at a time to the build whose `makespan` is longest and drops with it."""
    shares = [1] * len(builds)
    for _ in range(max(0, total - len(builds))):
        spans = [makespan(b, c) for b, c in zip(builds, shares)]
        order = sorted(range(len(builds)), key=lambda i: spans[i], reverse=True)
        pick = next((i for i in order if makespan(builds[i], shares[i] + 1) < spans[i] - 1e-9), order[0])
        shares[pick] += 1
    return shares


def _proportional(total: int, weights) -> list:
    """`total` whole cores split in proportion to `weights`, at least one each (largest remainders)."""
    n = len(weights)
    if total <= n:
        return [1] * n
    spare = total - n
    raw = [spare * w / sum(weights) for w in weights]
    shares = [1 + int(r) for r in raw]
    left = total - sum(shares)
    for i in sorted(range(n), key=lambda i: raw[i] - int(raw[i]), reverse=True)[:left]:
        shares[i] += 1
    return shares

