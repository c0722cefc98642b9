"""Which wheels of a compiled kernel fit this machine: the cxx11 ABI flag of their names, the pinned
release wheel's file name, the package indexes that may hold a build for this torch, whether a cached
index wheel or a built wheel of ours runs here, and the GPUs an installed build of ours has no code for.
"""

from __future__ import annotations

from ..facts import wheels as cached_wheels
from ..facts.wheels import choose, parse_wheel
from .builds import cuda_codes, needs_cuda_build
from .common import Context, major_minor, within


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
