"""What a compiled kernel's source build compiles for this machine: the sdist's -gencode codes for an
nvcc release, the codes the visible GPUs take (an arch rule may give a GPU another arch's code), what
those rules change (said in the reason and the step's note), and whether the release's opt-in CUDA
extension is compiled at all (the model families in use).

Data, not code, says what each kernel's sdist does (pins: `source_build`).
"""

from __future__ import annotations

from ..facts import cached_wheels
from .common import within


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
