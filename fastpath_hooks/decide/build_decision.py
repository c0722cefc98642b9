"""The source-build decision of a compiled kernel, for the policy: which pinned release it builds
(`release_order`), whether a build may start here, with which compiler, for which archs and how long
(`source_build`), and `decide_build` for `fastpath-hooks build`.

Data, not code, says what each kernel's sdist does (pins: `source_build`, `release`, `releases`).
"""

from __future__ import annotations

from packaging.requirements import Requirement

from ..facts.distributions import canonical_name
from .build_codes import arch_rule_notes, build_archs, cuda_codes, cuda_families, needs_cuda_build
from .build_time import build_estimate, minutes
from .common import Context, deps_step, versions_here, within
from .plan import INSTALL, SKIP, Decision, Step, StepKind
from .short import few, render


def release_order(ctx: Context, kernel: str, planned: dict):
    """(the pinned versions that fit here, in the pins' order of preference; version -> the declared
    requirement the installed distributions, or those planned by a kernel ensured first, do not meet),
    or (None, why none fits). `planned`: distribution -> version the kernels ensured before this one
    install (only those: another kernel's plan may never run, fla absent).
    A --no-deps install leaves such a requirement unmet, and the next resolver run would "fix" it
    (mamba-ssm 2.3.2's tilelang==0.1.8 would downgrade the tilelang fla uses on Hopper)."""
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
    """`fastpath-hooks build`: the kernel's source build for `env.gpus` (the archs asked for, on a
    host that may have no GPU), whatever wheels exist; the same release choice, compiler, arch and
    time rules as an automatic build."""
    ctx = Context(env, settings, pins, False)
    kw = ctx.kw(kernel, {})
    versions, clashes = release_order(ctx, kernel, {})
    if versions is None:
        return render(ctx, ctx.skip(kernel, "no-release", clashes, "add a release to a FASTPATH_HOOKS_PINS file",
                                    facts={"fits": versions_here(env)}, **kw))
    # the pins' order, a release without a declared clash first; the first one that can be built here (offline:
    # whose sdist the wheelhouse has), else the first one's reason
    order = sorted(versions, key=lambda v: v in clashes)
    options = [source_build(ctx, kernel, pins.build(kernel, v), "asked for by `fastpath-hooks build`", kw, asked=True)
               for v in order]
    return render(ctx, next((d for d in options if d.action != SKIP), options[0]))


def source_build(ctx: Context, kernel: str, build, why: str, kw, *, asked: bool = False) -> Decision:
    env, settings = ctx.env, ctx.settings
    deps = deps_step(ctx, ctx.pins.kernel(kernel), extra=build.build_deps)
    dep_steps = (deps,) if deps is not None else ()
    mode = settings.allow_build
    rocm = bool(env.torch_hip)
    if mode == "0":
        if rocm:
            return ctx.skip(kernel, "rocm.no-build", "no prebuilt ROCm wheels, and source builds are off "
                         "by FASTPATH_HOOKS_ALLOW_BUILD=0", "set FASTPATH_HOOKS_ALLOW_BUILD=auto to build it with hipcc "
                         "for this machine's GPUs", **kw)
        return ctx.skip(kernel, "no-wheel", f"source builds are off by FASTPATH_HOOKS_ALLOW_BUILD=0, and {why}",
                     "set FASTPATH_HOOKS_ALLOW_BUILD=auto to build it for this machine's GPUs, or put a wheel from "
                     "`fastpath-hooks build` in FASTPATH_HOOKS_FIND_LINKS", **kw)
    if not env.pip:  # the build runs `python -m pip wheel` (uv builds through an isolated cache of its own)
        return ctx.skip(kernel, "build.no-pip", f"{why}, and a source build runs pip, which this "
                     "environment lacks (a `uv venv`)", "run `python -m ensurepip`, or put a wheel from "
                     "`fastpath-hooks build` in FASTPATH_HOOKS_FIND_LINKS", **kw)
    needs_cuda, families = needs_cuda_build(env, build)
    switch = build.cuda_switch if build.cuda_switch is not None and build.version is not None \
        and build.cuda_switch.applies(build.version) else None
    switch_env = dict(switch.env) if switch is not None and needs_cuda else {}
    if not needs_cuda and not rocm:   # the release's CUDA extension is opt-in, and nothing in use calls it
        return _triton_only(ctx, kernel, build, why, families, dep_steps, kw)
    if rocm:
        why = "no prebuilt ROCm wheels"
        if not env.hipcc:
            return ctx.skip(kernel, "rocm.no-hipcc", f"{why}, and a source build needs hipcc, which is not "
                         "found", "install ROCm's hipcc (ROCM_HOME, PATH or /opt/rocm)", **kw)
        compiler = "hipcc"
    else:
        if not env.nvcc or env.nvcc.startswith("nvidia-cuda-nvcc"):
            return ctx.skip(kernel, "no-nvcc", f"{why}, and a source build needs a CUDA toolkit's nvcc, "
                         "which is not found", f"install a CUDA {env.torch_cuda} toolkit (torch's) and set CUDA_HOME", **kw)
        torch_major = (env.torch_cuda or "").split(".")[0]
        if env.nvcc_version is None and mode == "auto":
            return ctx.skip(kernel, "nvcc-unknown", f"{why}, and the CUDA release of nvcc ({env.nvcc}) "
                         "cannot be told, so a build for torch's CUDA is not started unasked",
                         "point CUDA_HOME at a toolkit whose nvcc answers --version, or set FASTPATH_HOOKS_ALLOW_BUILD=1",
                         **kw)
        if env.nvcc_version is not None and env.nvcc_version.split(".")[0] != torch_major:
            return ctx.skip(kernel, "nvcc-mismatch", f"{why}, and nvcc is CUDA {env.nvcc_version} while "
                         f"torch is built for CUDA {env.torch_cuda}: torch refuses to build extensions across CUDA "
                         "majors", f"point CUDA_HOME at a CUDA {torch_major}.x toolkit", **kw)
        compiler = f"nvcc {env.nvcc_version}" if env.nvcc_version else "nvcc"
    archs, unsupported = build_archs(env, build)
    if unsupported and not rocm:
        codes = cuda_codes(build, env.nvcc_version)
        return ctx.skip(kernel, "build.no-arch", f"{why}, and {build.requirement} compiles no code that "
                     f"runs on {'+'.join(unsupported)}; with {compiler} it targets {', '.join(codes)}", "",
                        facts={"unsupported": "+".join(unsupported)}, **kw)
    env_pairs = dict(build.rocm_env if rocm else build.env)
    env_pairs.update(switch_env)   # the opt-in CUDA build, where the release has one and a family in use needs it
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
    seconds, how = build_estimate(build, n_archs, env.cpus, env.build_history)
    if rocm:
        how += " of a CUDA build"
    std = ctx.pins.cxx_standard(env.torch_version)
    notes = arch_rule_notes(env, build) if archs != ("all",) else ()
    if std is not None:
        compiler += f" and -std={std.std}"
    if seconds > settings.timeout:
        return ctx.skip(kernel, "build.timeout", f"{why}; a source build for {'every arch' if archs == ('all',) else ', '.join(archs)} takes about "
                     f"{minutes(seconds)}, {how}; longer than FASTPATH_HOOKS_TIMEOUT={settings.timeout:.0f} s",
                     f"raise FASTPATH_HOOKS_TIMEOUT to {int(seconds * 1.5)} or more" +
                     ("" if asked else f", or build it ahead of time with `fastpath-hooks build {kernel}`"),
                        facts={"minutes": minutes(seconds), "timeout_fix": f"FASTPATH_HOOKS_TIMEOUT={int(seconds * 1.5)}"
                               if asked else f"ahead of time: fastpath-hooks build {kernel}"}, **kw)
    steps = dep_steps + (Step(kind=StepKind.BUILD, requirements=(build.requirement,), no_deps=True, binary_only=False,
                              build_isolation=False, env=tuple(sorted(env_pairs.items())), archs=archs,
                              cxx_std=std.std if std is not None else None,
                              note=f"source build against the installed torch with {compiler}, for "
                                   f"{', '.join(archs)}; about {minutes(seconds)}, {how}" +
                                   "".join(f"; {long}" for _, long in notes) +
                                   (f"; -std={std.std} handed last to the host compiler and "
                                    f"{'hipcc' if rocm else 'nvcc'}: torch {env.torch} needs it" if std else "") +
                                   (f"; {', '.join(f'{k}={v}' for k, v in switch_env.items())}: {families}"
                                    if switch_env else "")),)
    missing = ctx.missing_offline(steps)
    if missing:
        return ctx.skip(kernel, "offline-missing", f"{why}; a source build needs {', '.join(missing)} too, "
                     "which FASTPATH_HOOKS_FIND_LINKS lacks", "add the sdist and wheels or allow the index",
                        facts={"missing": few(missing)}, **kw)
    allowed = "" if asked else f", as FASTPATH_HOOKS_ALLOW_BUILD={mode} allows"
    return Decision(kernel=kernel, action=INSTALL, rule=rule,
                    # what happens and how long first: a line cut at 160 characters keeps it (the step's note
                    # says how the estimate was made)
                    reason=f"building from source for {'every arch' if archs == ('all',) else ', '.join(archs)} with "
                           f"{compiler}, about {minutes(seconds)}, an estimate{allowed}; "
                           f"{''.join(f'{short}; ' for short, _ in notes)}{why}",
                    steps=steps, target={build.distribution: build.version}, expected_seconds=round(seconds), **kw)


def _triton_only(ctx: Context, kernel: str, build, why: str, families: str, dep_steps, kw) -> Decision:
    """The release's CUDA extension is opt-in and no family in use calls it: a build that compiles nothing
    (its Python and Triton ops), labelled `py` (`<prefix>.build.triton-only`)."""
    steps = dep_steps + (Step(kind=StepKind.BUILD, requirements=(build.requirement,), no_deps=True,
                              binary_only=False, build_isolation=False, env=tuple(sorted(build.env.items())),
                              archs=("py",), note=f"source build without the CUDA extension ({families}): "
                                                  "Python and Triton only, no compiler"),)
    missing = ctx.missing_offline(steps)
    if missing:
        return ctx.skip(kernel, "offline-missing", f"{why}; a source build needs {', '.join(missing)} too, "
                        "which FASTPATH_HOOKS_FIND_LINKS lacks", "add the sdist and wheels or allow the index",
                        facts={"missing": few(missing)}, **kw)
    return Decision(kernel=kernel, action=INSTALL, rule=ctx.rule(kernel, "build.triton-only"),
                    reason=f"building from source without its CUDA extension, nothing to compile: {families}; {why}",
                    steps=steps, target={build.distribution: build.version},
                    facts={"users": few(cuda_families(ctx.env, build)[1])}, **kw)
