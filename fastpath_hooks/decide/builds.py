"""Build arithmetic of the compiled kernels, for the policy and the act layer: release-wheel file
names, the cxx11 ABI flag, which -gencode codes a build gets for which GPUs, how long it takes, whether
a built wheel fits this machine - and the source-build decision itself (`source_build`, and
`decide_build` for `fastpath-hooks build`), with the choice of the pinned release it builds.

Data, not code, says what each kernel's sdist does (pins: `source_build`, `release`, `releases`).
"""

from __future__ import annotations

from typing import NamedTuple

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from ..facts import cached_wheels
from ..facts.distributions import canonical_name
from ..facts.wheel_names import parse_wheel
from .common import Context, deps_step, major_minor, versions_here, within
from .plan import INSTALL, SKIP, Decision, Step, StepKind
from .short import few, render


def cxx11_abi_flag(env) -> str:
    """TRUE/FALSE for every compiled kernel's wheel names (release wheels, cache labels). Unknown (torch
    not imported, or posed without abi=): PyPI's torch wheels use the cxx11 ABI from 2.7 on, the
    pre-cxx11 one before."""
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
    bad = next(((g, r) for r in pins.kernel(kernel).arch_rules if r.wheels == "avoid"
                for g in env.gpus if r.applies(g, f"{cuda_major}.0")), None)
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
    return None, (f"no prebuilt {kernel} {rel.version} wheel for torch {major_minor(env.torch_version)} + CUDA {cuda_major} + "
                  f"cp{py} + {env.arch} + cxx11abi {abi}")



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



def index_sources(ctx: Context, kernel: str, build, *, cached: bool = False) -> tuple:
    """([(WheelIndex, project page URL, exact version)], why none): the package indexes (pins:
    `wheel_indexes`) that may hold a wheel of `build`'s version for this machine - the ones
    FASTPATH_HOOKS_WHEEL_INDEX allows (unset: the pins' enabled ones; a URL: the first entry's layout
    at that base), never offline - with the exact version their local label spells for this torch
    build. An index's builds hold every arch the sdist's -gencode table gives torch's CUDA release:
    taken only where that covers every visible GPU and no arch rule refuses that code.
    `cached`: every entry, whatever the settings (a wheel from one already in the local cache)."""
    env, settings = ctx.env, ctx.settings
    spec = ctx.pins.kernel(kernel)
    indexes = list(spec.wheel_indexes)
    chosen = None if cached else settings.wheel_index
    if not cached:
        if settings.offline:
            return [], "offline (FASTPATH_HOOKS_OFFLINE=1)"
        if chosen is None:
            indexes = [ix for ix in indexes if ix.enabled]
        elif chosen[:1] == ("url",):
            from dataclasses import replace as _replace

            indexes = [_replace(ix, url=chosen[1] + "{channel}/{project}/", name=chosen[1]) for ix in indexes[:1]]
        else:
            indexes = [ix for name in chosen for ix in indexes if ix.name == name]
    if not indexes:
        return [], "no package index of prebuilt wheels is enabled (FASTPATH_HOOKS_WHEEL_INDEX)"
    if env.os != "linux" or not env.torch_cuda or build.version is None:
        return [], "index wheels are Linux CUDA builds"
    abi = cxx11_abi_flag(env)
    codes = cuda_codes(build, env.torch_cuda)
    fields = {"cuda": env.torch_cuda, "cuda_nodot": "".join(env.torch_cuda.split(".")[:2]),
              "torch_mm": major_minor(env.torch_version)}
    out, why = [], ""
    for ix in indexes:
        if not within(env.torch_version, ix.torch) or abi != ix.cxx11_abi:
            why = f"the {ix.name} index builds for torch {ix.torch} with cxx11 ABI {ix.cxx11_abi}"
            continue
        gaps = [g for g in env.gpus if cached_wheels.pair_for(g, codes) is None]
        if gaps or not env.gpus:
            why = f"the {ix.name} index's CUDA {env.torch_cuda} builds hold no code for {'+'.join(gaps) or 'no GPU'}"
            continue
        refused = prebuilt_arch_refusal(ctx.pins, kernel, env.gpus, env.torch_cuda)
        if refused:
            why = f"the {ix.name} index's builds {refused}"
            continue
        channel = ix.channel.format(**fields, project=ix.project, channel="")
        url = ix.url.format(**fields, project=ix.project, channel=channel)
        out.append((ix, url, f"{build.version}+{ix.local.format(**fields, project=ix.project, channel=channel)}"))
    return out, ("" if out else why)


def prebuilt_arch_refusal(pins, kernel: str, gpus, cuda: str | None) -> str | None:
    """Why a prebuilt all-arch wheel (a package index's) compiled by CUDA `cuda`'s nvcc must not run
    on one of `gpus`, else None. The hook for the pins' arch rules (`kernels.<name>.arch_rules`, with
    `applies(gpu, nvcc_version)` and `wheels == "avoid"`: e.g. causal-conv1d#105, sm_103 code from
    nvcc 13 computes wrong results): none in these pins, so nothing is refused yet."""
    rules = getattr(pins, "arch_rules", None)
    rules = rules.get(kernel, ()) if isinstance(rules, dict) or hasattr(rules, "get") else ()
    for rule in rules:
        if getattr(rule, "wheels", "avoid") != "avoid":
            continue
        for gpu in gpus:
            if rule.applies(gpu, cuda):
                return f"carry {gpu} code from nvcc {cuda}, which {rule.effect} ({rule.id})"
    return None


def index_wheel_fits(ctx: Context, kernel: str, build, name: str) -> bool:
    """A wheel file (in the local cache) of an index's build that fits here: its exact version is the
    one an index's label spells for this torch build, and its tags fit this Python and platform."""
    wheel = parse_wheel(name)
    if wheel is None or wheel.distribution != build.distribution:
        return False
    sources, _ = index_sources(ctx, kernel, build, cached=True)
    if not any(str(wheel.version) == exact for _, _, exact in sources):
        return False
    from ..facts.wheel_tags import choose

    return choose([{"filename": name}], build.distribution, str(wheel.version), python=ctx.env.python,
                  arch=ctx.env.arch, glibc=ctx.env.glibc) is not None


def built_archs(installed: str) -> tuple:
    """The archs in the local label of a build of ours (`...+fph.torch2.11.0.cu130.abi1.sm90` ->
    ("sm_90",)); () for anything else (a release wheel, a build for `all`)."""
    local = installed.split("+", 1)[1] if "+" in installed else ""
    tokens = local.split(".")
    if not local.startswith(cached_wheels.LABEL + ".") or not any(t.startswith("abi") for t in tokens):
        return ()
    archs = tokens[[i for i, t in enumerate(tokens) if t.startswith("abi")][0] + 1:]  # after torchX.Y.Z.cuXY.abiN
    return () if not archs or "all" in archs else tuple(f"sm_{t[2:]}" if t.startswith("sm") else t for t in archs)


def arch_gaps(installed: str, gpus) -> tuple:
    """The visible GPUs an installed build of ours has no code for (a release wheel holds every arch)."""
    codes = set(built_archs(installed))
    return tuple(g for g in gpus if cached_wheels.pair_for(g, codes) is None) if codes else ()



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


def built_fits(env, pins, name: str, kernel: str | None = None) -> bool:
    """A built wheel (by its file name) of a compiled kernel's pinned version (of `kernel` when given)
    that runs here: this torch build, Python, ABI, platform and GPUs."""
    wheel = parse_wheel(name)
    if wheel is None:
        return False
    owner, build = pins.build_for_distribution(wheel.distribution)
    if owner is None or (kernel is not None and owner != kernel):
        return False
    kernel = owner
    ctx = Context(env, None, pins, False)
    versions = [r.version for r in pins.kernel(kernel).releases] or [build.version]
    return any(fits(ctx, name, pins.build(kernel, v)) for v in versions)


def fits(ctx: Context, name: str, build) -> bool:
    env = ctx.env
    if not env.torch or build.version is None:
        return False
    # a cached build was compiled by an nvcc of torch's CUDA major (cuXY in its label): its code for a GPU an
    # arch rule names is wrong, whichever wheel holds it
    bad = {g: g for g in env.gpus if env.torch_cuda and any(r.applies(g, env.torch_cuda) for r in build.arch_rules)}
    return cached_wheels.fits(name, distribution=build.distribution, version=build.version, torch=env.torch,
                              cuda=env.torch_cuda, hip=env.torch_hip, abi=cxx11_abi_flag(env), python=env.python,
                              arch=env.arch, gpus=env.gpus, all_codes=cuda_codes(build, env.torch_cuda), bad=bad,
                              python_only=not needs_cuda_build(env, build)[0])


def cuda_codes(build, nvcc_version: str | None) -> tuple:
    """The -gencode codes the sdist compiles with this nvcc release (all it knows when unknown)."""
    codes = (code for code, spec in build.cuda_archs.items() if nvcc_version is None or within(nvcc_version, spec))
    return tuple(sorted(codes, key=lambda c: cached_wheels.compute_capability(c) or (0, 0)))


def build_archs(env, build, archs=None) -> tuple:
    """(codes to compile, GPUs nothing compiled runs on): the sdist's codes whose binaries run on
    `archs` (default the visible GPUs) - sm_86 takes sm_80's - given this nvcc; ROCm: gfx as is.
    `build`: the kernel's SourceBuild (pins.build(kernel))."""
    gpus = tuple(archs if archs is not None else env.gpus)
    if env.torch_hip:
        known = tuple(g for g in gpus if g.startswith("gfx") and len(g) > 3)
        return tuple(sorted(set(known))), tuple(g for g in gpus if g not in known)
    codes = cuda_codes(build, env.nvcc_version)
    chosen = {g: cached_wheels.pair_for(_build_as(g, build, env.nvcc_version), codes) for g in gpus}
    return tuple(sorted({c for c in chosen.values() if c}, key=cached_wheels.compute_capability)), \
        tuple(g for g, c in chosen.items() if c is None)


def _build_as(gpu: str, build, nvcc_version) -> str:
    """The arch whose code is compiled for `gpu`: itself, or the `build_as` of an arch rule that says this
    nvcc's code for it is wrong (pins: kernels.<name>.arch_rules; an unknown nvcc release fails closed)."""
    rule = next((r for r in build.arch_rules if r.applies(gpu, nvcc_version)), None)
    return rule.build_as if rule is not None else gpu


def cuda_families(env, build) -> tuple:
    """(the model families in use that call the release's opt-in CUDA extension, those that use its Triton ops only)."""
    switch = build.cuda_switch
    if switch is None:
        return [], []
    return ([t for t in env.model_types if t in switch.needed_by], [t for t in env.model_types if t in switch.triton_only])


def needs_cuda_build(env, build) -> tuple:
    """(whether the build compiles the CUDA extension, why - one clause). Always, unless this release's
    extension is opt-in (pins: source_build.cuda_switch) and the model families known to be in use -
    the modeling modules this process imported - include one that uses the package without it and none
    that calls it. Not known (a CLI run, an import outside a model) counts as needing it."""
    switch = build.cuda_switch
    if switch is None or build.version is None or not switch.applies(build.version):
        return True, ""
    calls, users = cuda_families(env, build)
    if calls:
        return True, f"{', '.join(calls)} calls its CUDA extension"
    if not users:
        return True, "the model families in use are not known here"
    return False, f"only {', '.join(users)} in use, {'which uses' if len(users) == 1 else 'which use'} its Triton ops"


def arch_rule_notes(env, build, archs=None) -> tuple:
    """What the arch rules change for these GPUs: ((short, long), ...) - `sm_103 gets sm_100 code,
    causal-conv1d#105` for the reason, the whole fact for the step's note and doctor."""
    gpus = tuple(archs if archs is not None else env.gpus)
    if env.torch_hip:
        return ()
    out = []
    for g in gpus:
        rule = next((r for r in build.arch_rules if r.applies(g, env.nvcc_version)), None)
        if rule is not None:
            out.append((f"{g} gets {rule.build_as} code: {rule.id}",
                        f"{g} gets {rule.build_as} code, which runs on it: {g} code from nvcc "
                        f"{env.nvcc_version or '(release unknown)'} {rule.effect} ({rule.id})"))
    return tuple(out)


def build_estimate(build, n_archs: int, cpus: int | None, history=()) -> tuple:
    """(seconds, how): a measured build scaled by archs (each is compiled separately) and by fewer
    cores (more cores do not help: the big files compile one per job). The measurement is this
    machine's own last build of the distribution (`history`: the probe's `build_history`, newest
    last; the same version preferred) where there is one, else the pins' `measured` figure."""
    mine = [r for r in history if r.get("distribution") == build.distribution and r.get("seconds")]
    same = [r for r in mine if r.get("version") == build.version] or mine
    if same:
        rec = same[-1]
        base, archs, cores = float(rec["seconds"]), max(1, int(rec.get("n_archs") or 1)), max(1, int(rec.get("cores") or 1))
        split = int(rec.get("split") or 1)
        origin = (f"this machine's build of {build.distribution} {rec.get('version')} took {base:.0f} s for {archs} arch "
                  f"on {cores} cores" + (f" (--split-compile={split})" if split > 1 else ""))
    else:
        base, archs, cores = build.seconds, build.archs, build.cores
        origin = f"{build.seconds:.0f} s measured for {build.archs} arch on {build.cores} cores"
    seconds = base * n_archs / archs
    if cpus and cpus < cores:
        seconds *= cores / cpus
    how = f"an estimate: {origin}, scaled to {n_archs} arch{'s' if n_archs != 1 else ''} on {cpus or '?'} cores"
    return seconds, how


# -- how a build uses the machine: jobs, split compilation, the share of the cores -------------------

# nvcc --split-compile=N (CUDA 11.8+: "Improving CUDA Compilation Time" in the CUDA Programming Guide;
# `nvcc --help` of 13.0) runs the optimizer (cicc) and ptxas of one translation unit in N threads.
SPLIT_COMPILE_NVCC = ">=11.8"
# A job's memory: 4-6 GB resident measured for one causal-conv1d nvcc job with `--threads 4` (four
# compiler threads, gpu-findings.md): about 1.5 GB per compiler thread, a job counted as its threads.
GIB_PER_THREAD = 1.5


class Share(NamedTuple):
    """One build's part of the machine: `cores` of its CPUs, MAX_JOBS=`jobs`, `split` threads per nvcc job
    (1: no --split-compile) - jobs x split <= cores, and within its part of the memory."""
    cores: int
    jobs: int
    split: int


def split_allowed(build, settings, nvcc_version) -> bool:
    """--split-compile for this build: the pins allow it for the kernel, FASTPATH_HOOKS_SPLIT_COMPILE is
    not 0, and nvcc is a release that has it (an unknown release: not given)."""
    if getattr(settings, "split_compile", "auto") == "0" or not build.split_compile or nvcc_version is None:
        return False
    return within(nvcc_version, SpecifierSet(SPLIT_COMPILE_NVCC))


def core_budget(builds, *, cpus: int | None, memory_gib: float | None, settings=None, jobs_given: int | None = None) -> dict:
    """kernel -> Share for builds that run at the same time: `builds` = (kernel, SourceBuild,
    expected seconds, split allowed). The cores are split in proportion to the expected times (the
    longest build gets the most), at least one each; within its share a build runs one job per
    translation unit (more leave cores idle) and gives nvcc the cores left over as --split-compile
    threads; memory (`GIB_PER_THREAD` per thread, in the same proportion) takes threads away first,
    then jobs. `jobs_given`: the user's MAX_JOBS, kept as it is. FASTPATH_HOOKS_SPLIT_COMPILE=N sets N."""
    builds = list(builds)
    if not builds:
        return {}
    total = max(1, cpus or 1)
    weights = [max(1.0, float(seconds or 1.0)) for _, _, seconds, _ in builds]
    shares = _proportional(total, weights)
    forced = getattr(settings, "split_compile", "auto")
    out = {}
    for (kernel, build, _, allowed), cores in zip(builds, shares):
        units = max(1, int(getattr(build, "translation_units", 1) or 1))
        if jobs_given:
            jobs = jobs_given
        elif allowed and forced not in ("auto", "0"):
            jobs = max(1, min(units, cores // int(forced)))
        else:
            jobs = min(units, cores)
        split = 1
        if allowed:
            split = int(forced) if forced not in ("auto", "0") else max(1, cores // jobs)
        if memory_gib:
            room = memory_gib * cores / total
            while split > 1 and jobs * split * GIB_PER_THREAD > room:
                split -= 1
            while not jobs_given and jobs > 1 and jobs * GIB_PER_THREAD > room:
                jobs -= 1
        out[kernel] = Share(cores, jobs, split)
    return out


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


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


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
