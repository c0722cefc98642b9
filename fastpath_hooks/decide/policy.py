"""The decision policy: a pure function (environment, settings, pins) -> Plan.

No I/O, no imports of torch or transformers, no clock: every input is an
argument, so each rule is tested by a table row (tests/test_policy.py).
Rule ids in `Decision.rule` name which rule decided.
"""

from __future__ import annotations

import os
from dataclasses import replace as _replace
from functools import cached_property
from urllib.parse import quote

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import InvalidSdistFilename, parse_sdist_filename
from packaging.version import InvalidVersion, Version

from ..facts import cached_wheels
from ..facts.distributions import canonical_name
from ..facts.pins import same_version
from ..facts.wheel_names import parse_wheel
from .plan import BLOCK, INSTALL, OK, REPAIR, SKIP, Decision, OnFailure, Plan, Step, StepKind

ORDER = ("fla", "causal-conv1d", "mamba-ssm", "tilelang")
TILELANG_GOOD = (OK, INSTALL, REPAIR)


def decide(env, settings, pins, *, fresh: bool = False) -> Plan:
    """Decide every kernel. `fresh`: plan as if no kernel package were installed
    (what a new machine of this kind needs - used by `download`)."""
    ctx = _Context(env, settings, pins, fresh)
    tilelang = _decide_tilelang(ctx)
    fla = _decide_fla(ctx, tilelang)
    decisions = {"fla": fla, "tilelang": tilelang}
    decisions["causal-conv1d"] = _decide_compiled(ctx, "causal-conv1d", decisions)
    decisions["mamba-ssm"] = _decide_compiled(ctx, "mamba-ssm", decisions)
    notes = []
    if ctx.env.accelerator is None:
        notes.append(_no_accelerator_reason(ctx.env))
    return Plan(environment=env, decisions={k: decisions[k] for k in ORDER}, notes=tuple(notes))


class _Context:
    def __init__(self, env, settings, pins, fresh):
        self.env, self.settings, self.pins, self.fresh = env, settings, pins, fresh

    def installed(self, dist: str) -> str | None:
        name = canonical_name(dist)
        if self.fresh and any(name in k.distributions for k in self.pins.kernels.values()):
            return None
        return self.env.version(name)

    def hazards(self, kernel: str) -> list:
        env = self.env
        out = []
        for hz in self.pins.hazards:
            if hz.kernel != kernel or env.triton is None or env.accelerator is None:
                continue
            if not any(g in hz.gpu for g in env.gpus):
                continue
            if _in_closed(env.triton_version, hz.triton):
                out.append(hz)
        return out

    @cached_property
    def wheelhouse(self) -> dict:
        """name -> set of versions available as files in FASTPATH_HOOKS_FIND_LINKS (parsed once)."""
        out: dict = {}
        for filename in self.env.wheelhouse:
            try:
                if filename.endswith(".whl"):
                    wheel = parse_wheel(filename)
                    if wheel is None:
                        continue
                    name, version = wheel.distribution, wheel.version
                else:
                    name, version = parse_sdist_filename(filename)
            except (InvalidSdistFilename, InvalidVersion):
                continue
            out.setdefault(canonical_name(name), set()).add(version)
        return out

    @cached_property
    def sdists(self) -> dict:
        """name -> set of versions available as sdists in FASTPATH_HOOKS_FIND_LINKS (what a build needs)."""
        out: dict = {}
        for filename in self.env.wheelhouse:
            if filename.endswith(".whl"):
                continue
            try:
                name, version = parse_sdist_filename(filename)
            except (InvalidSdistFilename, InvalidVersion):
                continue
            out.setdefault(canonical_name(name), set()).add(version)
        return out

    def missing_offline(self, steps) -> list:
        """Requirements no wheelhouse file satisfies when the index is off."""
        if not self.settings.offline:
            return []
        have = self.wheelhouse
        missing = []
        for step in steps:
            for raw in step.requirements:
                if step.kind == StepKind.WHEEL:
                    if raw not in self.env.wheelhouse:
                        missing.append(raw)
                    continue
                req = Requirement(raw)
                name = canonical_name(req.name)
                if step.kind == StepKind.DEPS and self.installed_satisfies(req):
                    continue
                versions = self.sdists.get(name, set()) if step.kind == StepKind.BUILD else have.get(name, set())
                if not any(req.specifier.contains(v, prereleases=True) for v in versions):
                    missing.append(raw)
        return missing

    def installed_satisfies(self, req: Requirement) -> bool:
        return _in(self.env.dist_version(req.name), req.specifier)


def _in(version, spec) -> bool:
    """`version` (a Version parsed once, e.g. `env.torch_version`, or text) in `spec`, pre-releases
    included; a local label (+cu130) is ignored against a specifier without one, as PEP 440 says."""
    v = _parse(version)
    return v is not None and spec.contains(v, prereleases=True)


def _in_closed(version, spec) -> bool:
    """`version` in `spec`, failing closed for a safety range: a pre/dev release also counts when its
    release is inside the bounds taken as closed (PEP 440 puts 3.7.1rc1 outside `<3.7.1` and
    3.4.0rc1 outside `>=3.4.0`, yet each is that release's code, or close to it)."""
    if _in(version, spec):
        return True
    v = _parse(version)
    if v is None:
        return True  # an unreadable version cannot be shown to be outside
    if not (v.is_prerelease or v.is_devrelease):
        return False
    release = Version(v.base_version)
    for s in spec:
        if s.operator in ("<", "<="):
            inside = release <= Version(s.version)
        elif s.operator in (">", ">="):
            inside = release >= Version(s.version)
        else:
            inside = s.contains(release, prereleases=True)
        if not inside:
            return False
    return True


def _parse(version) -> Version | None:
    if isinstance(version, Version):
        return version
    if not version:
        return None
    try:
        return Version(version)
    except InvalidVersion:
        return None


def _mm(version) -> str | None:
    v = _parse(version)
    return None if v is None else f"{v.major}.{v.minor}"


def _no_accelerator_reason(env) -> str:
    if env.torch is None:
        return "torch is not installed, so there is no accelerator to use kernels on"
    if env.torch_build == "CPU":
        reason = f"no CUDA/XPU accelerator: torch {env.torch} is a CPU build"
        if env.gpu_source == "target" and env.gpus:
            # A posed GPU with this host's CPU torch: say how to pose the GPU machine's torch too.
            reason += f"; to pose a machine with {'+'.join(env.gpus)}, add its torch build: cuda=..., hip=... or xpu=yes"
        return reason
    kind = env.torch_build.split()[0]  # CUDA / ROCm / XPU: the build's own kind of device
    if env.gpus:
        return f"no {kind} accelerator: torch {env.torch} ({env.torch_build}) cannot use {'+'.join(env.gpus)}"
    return f"no {kind} accelerator: torch {env.torch} ({env.torch_build}) sees no device; {env.gpu_source}"


def _skip(kernel, rule, reason, fix="", **kw) -> Decision:
    return Decision(kernel=kernel, action=SKIP, reason=reason, rule=rule, fix=fix, **kw)


def _common(ctx: _Context, kernel: str, *, installed: dict) -> Decision | None:
    """The skip rules every kernel shares, in order."""
    env, settings = ctx.env, ctx.settings
    spec = ctx.pins.kernel(kernel)
    kw = {"installed": installed, "transformers_uses": _transformers_uses(ctx, kernel)}
    if kernel in settings.skip:
        return _skip(kernel, "skip.user", "skipped by FASTPATH_HOOKS_SKIP", f"remove {kernel} from FASTPATH_HOOKS_SKIP", **kw)
    if env.torch is None:
        return _skip(kernel, "skip.no-torch", "torch is not installed", "install torch first", **kw)
    if env.accelerator is None:
        return _skip(kernel, "skip.no-accelerator",
                     _no_accelerator_reason(env) + f"; {kernel} runs on GPUs only",
                     "run on a machine with a CUDA (or XPU) GPU and a matching torch build", **kw)
    if not _in(env.python_version, spec.python):
        return _skip(kernel, "skip.python", f"Python {env.python} is outside {kernel}'s support ({spec.python})",
                     f"use Python {spec.python}", **kw)
    if env.platform not in spec.platforms:
        return _skip(kernel, "skip.platform",
                     f"no {kernel} builds for {env.platform} (supported: {', '.join(spec.platforms)})", "", **kw)
    glibc_spec = spec.glibc.get(env.arch)
    if glibc_spec and env.glibc and not _in(env.glibc_version, _spec(glibc_spec)):
        return _skip(kernel, "skip.glibc", f"{kernel} wheels for {env.arch} need glibc {glibc_spec}; this system has {env.glibc}",
                     "", **kw)
    if not _in(env.torch_version, spec.torch):
        return _skip(kernel, "skip.torch", f"torch {env.torch} is outside {kernel}'s support ({spec.torch})",
                     f"use torch {spec.torch}", **kw)
    if env.accelerator not in spec.accelerators:
        name = {"rocm": "ROCm"}.get(env.accelerator, env.accelerator.upper())
        return _skip(kernel, f"skip.accelerator.{env.accelerator}", f"{kernel} does not support {name}", "", **kw)
    return None


_HALF_INSTALLED = "half-installed: two .dist-info in one directory, an install was interrupted"


def _fetch_fix(what: str, source: str = "the index") -> str:
    return f"fetch {what} with `fastpath-hooks download --dest DIR` into FASTPATH_HOOKS_FIND_LINKS, or allow {source}"


def _spec(text):
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(text)


def _deps_step(ctx: _Context, spec, extra=()) -> Step | None:
    """The kernel's runtime dependencies (and `extra`: what a source build needs) that this machine
    lacks (or has too old): one already satisfied is neither named nor backed up by the installer.
    A fresh plan (`download`, for another machine) names them all."""
    reqs = []
    named = {canonical_name(Requirement(r).name) for r in spec.runtime_deps}
    wanted = tuple(spec.runtime_deps) + tuple(r for r in extra if canonical_name(Requirement(r).name) not in named)
    marker_env = {"python_version": ".".join(ctx.env.python.split(".")[:2]), "python_full_version": ctx.env.python,
                  "sys_platform": {"windows": "win32"}.get(ctx.env.os, ctx.env.os),
                  "platform_system": {"linux": "Linux", "darwin": "Darwin", "windows": "Windows"}.get(ctx.env.os, ctx.env.os),
                  "platform_machine": ctx.env.arch}
    for raw in wanted:
        req = Requirement(raw)
        if req.marker is not None and not Marker(str(req.marker)).evaluate(marker_env):
            continue
        if not ctx.fresh and ctx.installed_satisfies(req):
            continue
        req.marker = None
        reqs.append(str(req))
    if not reqs:
        return None
    return Step(kind=StepKind.DEPS, requirements=tuple(reqs), no_deps=False,
                note=("runtime dependencies" + (" and what the source build imports" if extra else "") +
                      ", resolved under a constraints file that pins torch, triton, numpy and transformers"))


# -- tilelang ------------------------------------------------------------------

def _decide_tilelang(ctx: _Context) -> Decision:
    pins, env, settings = ctx.pins, ctx.env, ctx.settings
    spec = pins.kernel("tilelang")
    tl, ffi = ctx.installed("tilelang"), ctx.installed("apache-tvm-ffi")
    installed = {k: v for k, v in (("tilelang", tl), ("apache-tvm-ffi", ffi)) if v}
    fla_hazards = [h for h in ctx.hazards("fla") if h.needs == "tilelang"]
    needed = bool(fla_hazards) and "fla" not in settings.skip
    uses = _transformers_uses(ctx, "tilelang")

    common = _common(ctx, "tilelang", installed=installed)
    if common is not None:
        if needed and common.rule == "skip.user":
            hz = fla_hazards[0]
            common = _replace(common, reason=f"skipped by FASTPATH_HOOKS_SKIP; fla needs it here because of {hz.id}")
        return common

    kw = {"installed": installed, "transformers_uses": uses}
    half = [d for d in ("tilelang", "apache-tvm-ffi") if d in env.half_installed and ctx.installed(d)]
    if tl and half:
        return _tilelang_repair(ctx, tl, ffi, f"{' and '.join(half)} {_HALF_INSTALLED}", "tilelang.repair.half-installed", kw)
    if tl and ffi:
        broken = pins.broken_for(tl, ffi, env.gpus)
        if broken is not None:
            return _tilelang_repair(ctx, tl, ffi, f"apache-tvm-ffi {ffi} is broken with tilelang {tl}"
                                    f"{'' if broken.arch == '*' else ' on ' + broken.arch} - {broken.effect}",
                                    "tilelang.repair.broken-pair", kw)
    if tl and not ffi:
        return _tilelang_repair(ctx, tl, None, f"tilelang {tl} is installed without apache-tvm-ffi", "tilelang.repair.missing-ffi", kw)

    if not needed:
        why = "no Hopper GPU" if not any(g in h.gpu for h in pins.hazards for g in env.gpus) else \
            f"triton {env.triton} is outside the Hopper bug's range" if env.triton else "no triton"
        if "fla" in settings.skip and fla_hazards:
            why = "fla is skipped by FASTPATH_HOOKS_SKIP"
        if tl:
            return Decision(kernel="tilelang", action=OK, rule="tilelang.ok.not-needed",
                            reason=f"tilelang {tl} + apache-tvm-ffi {ffi} installed; fla does not need it here: {why}", **kw)
        return _skip("tilelang", "tilelang.not-needed", f"fla does not need it here: {why}", **kw)

    hz = fla_hazards[0]
    if env.fla_tilelang_env == "0":
        return _skip("tilelang", "tilelang.user-disabled", "FLA_TILELANG=0 is set; fla would not use tilelang",
                     f"unset FLA_TILELANG: fla needs tilelang here because of {hz.id}", **kw)
    nvcc_reqs = ()
    if spec.needs_nvcc and not env.nvcc:
        pk = spec.nvcc_packages
        if pk and env.torch_cuda and _in(env.cuda_version, _spec(pk["cuda"])):
            nvcc_reqs = tuple(pk["requirements"])
        else:
            return _skip("tilelang", "tilelang.no-nvcc",
                         "no nvcc; tilelang compiles its kernels with it at run time, and fla uses tilelang only when "
                         "nvcc is found in CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda or the nvidia-cuda-nvcc wheel",
                         "install a CUDA toolkit matching torch or point CUDA_HOME at one", **kw)

    if tl:
        good = [g for g in pins.good_tvm_ffi(tl) if pins.broken_for(tl, g, env.gpus) is None]
        if good and any(same_version(ffi, g) for g in good):
            if nvcc_reqs:
                return _tilelang_install(ctx, tl, ffi, nvcc_reqs, "tilelang.install.nvcc", REPAIR,
                                         f"tilelang {tl} + apache-tvm-ffi {ffi} need nvcc; installing the nvcc wheel", kw)
            return Decision(kernel="tilelang", action=OK, rule="tilelang.ok", verify=True,
                            reason=f"tilelang {tl} + apache-tvm-ffi {ffi} is a known-good pair; fla needs it here because of {hz.id}",
                            on_failure=OnFailure.BLOCK, repair_steps=_pair_steps(ctx, tl, good[0], nvcc_reqs, replace_ffi=True), **kw)
        pair = _preferred_pair(ctx)
        return Decision(kernel="tilelang", action=OK, rule="tilelang.ok.unverified", verify=True,
                        reason=f"tilelang {tl} + apache-tvm-ffi {ffi} is not in the pins; checking it in a child process",
                        on_failure=OnFailure.BLOCK,
                        repair_steps=_pair_steps(ctx, pair[0], pair[1], nvcc_reqs, replace_ffi=True) if pair else (), **kw)

    pair = _preferred_pair(ctx)
    if pair is None:
        return _skip("tilelang", "tilelang.offline-missing",
                     "offline, and FASTPATH_HOOKS_FIND_LINKS has no known-good tilelang + apache-tvm-ffi pair",
                     _fetch_fix("tilelang's wheels"), **kw)
    return _tilelang_install(ctx, pair[0], pair[1], nvcc_reqs, "tilelang.install", INSTALL,
                             f"fla needs tilelang on {'+'.join(hz.gpu)} + triton {env.triton} because of {hz.id}", kw)


def _preferred_pair(ctx: _Context):
    """The first pins pair (and tvm-ffi) installable here; offline: present in the wheelhouse."""
    have = ctx.wheelhouse if ctx.settings.offline else None
    for pair in ctx.pins.tilelang_pairs:
        for ffi in pair.tvm_ffi:
            if ctx.pins.broken_for(pair.tilelang, ffi, ctx.env.gpus) is not None:
                continue
            if have is not None:
                if Version(pair.tilelang) not in have.get("tilelang", set()) or Version(ffi) not in have.get("apache-tvm-ffi", set()):
                    continue
            return pair.tilelang, ffi
    return None


def _pair_steps(ctx, tl, ffi, nvcc_reqs, *, replace_ffi: bool) -> tuple:
    spec = ctx.pins.kernel("tilelang")
    steps = []
    if replace_ffi:
        steps.append(Step(kind=StepKind.REPLACE, requirements=(f"apache-tvm-ffi=={ffi}",), no_deps=True, force=True,
                          note="replace apache-tvm-ffi alone first: the broken pair can abort any process that imports it"))
    deps = _deps_step(ctx, spec)
    if deps is not None:
        steps.append(deps)
    if nvcc_reqs:
        steps.append(Step(kind=StepKind.DEPS, requirements=tuple(nvcc_reqs), no_deps=False, note="nvcc for tilelang's JIT"))
    steps.append(Step(kind=StepKind.KERNEL, requirements=(f"tilelang=={tl}", f"apache-tvm-ffi=={ffi}"), no_deps=True,
                      note="the known-good pair, pinned together (a fresh resolve picks a broken apache-tvm-ffi)"))
    return tuple(steps)


def _tilelang_install(ctx, tl, ffi, nvcc_reqs, rule, action, reason, kw) -> Decision:
    steps = _pair_steps(ctx, tl, ffi, nvcc_reqs, replace_ffi=False)
    missing = ctx.missing_offline(steps)
    if missing:
        return _skip("tilelang", "tilelang.offline-missing",
                     f"offline, and FASTPATH_HOOKS_FIND_LINKS lacks {', '.join(missing)}",
                     _fetch_fix("tilelang's wheels"), **kw)
    return Decision(kernel="tilelang", action=action, rule=rule, reason=reason, steps=steps,
                    target={"tilelang": tl, "apache-tvm-ffi": ffi}, on_failure=OnFailure.BLOCK, **kw)


def _tilelang_repair(ctx, tl, ffi, reason, rule, kw) -> Decision:
    """Replace a broken/half-installed pair: keep the user's tilelang with a known-good
    apache-tvm-ffi when the pins have one, else the first known-good pair; offline, the
    first option the wheelhouse can satisfy. Nothing installable: block the import."""
    gpus, pins = ctx.env.gpus, ctx.pins
    options = [(tl, good) for good in pins.good_tvm_ffi(tl) if pins.broken_for(tl, good, gpus) is None]
    for pair in pins.tilelang_pairs:
        options += [(pair.tilelang, good) for good in pair.tvm_ffi
                    if pins.broken_for(pair.tilelang, good, gpus) is None and (pair.tilelang, good) not in options]
    first_missing = None
    for target_tl, target_ffi in options:
        steps = _pair_steps(ctx, target_tl, target_ffi, (), replace_ffi=True)
        missing = ctx.missing_offline(steps)
        if missing:
            first_missing = first_missing or missing
            continue
        return Decision(kernel="tilelang", action=REPAIR, rule=rule, reason=reason + f"; repairing to tilelang {target_tl} + "
                        f"apache-tvm-ffi {target_ffi}", steps=steps,
                        target={"tilelang": target_tl, "apache-tvm-ffi": target_ffi}, on_failure=OnFailure.BLOCK, **kw)
    if first_missing:
        return Decision(kernel="tilelang", action=BLOCK, rule=rule + ".offline-missing",
                        reason=reason + f"; offline, and FASTPATH_HOOKS_FIND_LINKS lacks {', '.join(first_missing)}",
                        fix=_fetch_fix("tilelang's wheels"),
                        on_failure=OnFailure.BLOCK, **kw)
    return Decision(kernel="tilelang", action=BLOCK, rule=rule + ".unrepairable",
                    reason=reason + "; the pins know no good apache-tvm-ffi for this GPU", on_failure=OnFailure.BLOCK,
                    fix="add a known-good tilelang + apache-tvm-ffi pair in a FASTPATH_HOOKS_PINS file", **kw)


# -- fla -------------------------------------------------------------------------

_FLA_DISTS = ("fla-core", "flash-linear-attention")


# Skips that leave an installed fla alone even under the Hopper hazard: the user asked for it, or
# nothing can run fla here anyway.
_NOT_OURS = ("skip.user", "skip.no-torch", "skip.no-accelerator")


def _decide_fla(ctx: _Context, tilelang: Decision) -> Decision:
    pins, env = ctx.pins, ctx.env
    core, layers = ctx.installed("fla-core"), ctx.installed("flash-linear-attention")
    installed = {k: v for k, v in (("fla-core", core), ("flash-linear-attention", layers)) if v}
    kw = {"installed": installed, "transformers_uses": _transformers_uses(ctx, "fla")}

    common = _common(ctx, "fla", installed=installed)
    if common is not None:
        # An installed fla outside its support (Python, platform, torch) still imports: the Hopper
        # hazard's block comes first. Only the user's skip list and a machine without a GPU win.
        hazards = ctx.hazards("fla") if (core or layers) and common.rule not in _NOT_OURS else []
        if hazards and tilelang.action not in TILELANG_GOOD:
            return Decision(kernel="fla", action=BLOCK, rule="fla.hazard.block",
                            reason=_hazard_reason(env, hazards[0], tilelang), fix=_hazard_fix(hazards[0], tilelang),
                            on_failure=OnFailure.BLOCK, **kw)
        return common
    if env.accelerator == "rocm" and env.fla_tilelang_env is None:
        kw["env"] = (("FLA_TILELANG", "0"),)  # no tilelang on ROCm: fla must not try its tilelang backend
    transformers = env.version("transformers")
    if env.accelerator == "xpu" and transformers_era(env.dist_version("transformers")) in ("A", "B"):
        return _skip("fla", "fla.xpu.old-transformers",
                     f"transformers {transformers} uses fla on CUDA only (on XPU from 5.15)",
                     "upgrade transformers to >= 5.15", **kw)
    if env.triton is None:
        return _skip("fla", "fla.no-triton", "no triton: fla's kernels are triton programs and torch's triton is missing",
                     "install the triton your torch build depends on (pip install torch==<yours> reinstalls it)", **kw)

    hazards = ctx.hazards("fla")
    hz = hazards[0] if hazards else None
    tilelang_ok = tilelang.action in TILELANG_GOOD
    transformers_version = env.dist_version("transformers")
    candidates = [rel for rel in pins.fla_releases
                  if _in(env.torch_version, rel.torch) and _in(env.triton_version, rel.triton)
                  and not (transformers and not _in(transformers_version, rel.transformers))
                  and not (hz is not None and not rel.tilelang_backend)]
    needs = ("tilelang",) if hz is not None else ()
    # Before fla-core split off (0.4), flash-linear-attention shipped the `fla` package itself.
    fla = core or layers

    if fla:
        if hz is not None and not tilelang_ok:
            return Decision(kernel="fla", action=BLOCK, rule="fla.hazard.block", reason=_hazard_reason(env, hz, tilelang),
                            fix=_hazard_fix(hz, tilelang), on_failure=OnFailure.BLOCK, **kw)
        known = next((r for r in pins.fla_releases if same_version(r.version, fla)), None)
        problems = []
        if not core:
            problems.append(f"flash-linear-attention {layers} without fla-core")
        half = [d for d in _FLA_DISTS if d in env.half_installed and not ctx.fresh]
        if half:
            problems.append(f"{' and '.join(half)} {_HALF_INSTALLED}")
        if core and layers and not same_version(layers, core):
            problems.append(f"fla-core {core} and flash-linear-attention {layers} differ")
        incompatible = known is not None and not _in(env.triton_version, known.triton)
        if incompatible:
            problems.append(f"fla {fla} does not import with triton {env.triton}, it needs triton {known.triton}")
        unsafe = hz is not None and not _has_tilelang_backend(pins, fla, known)
        if unsafe:
            problems.append(f"fla {fla} has no tilelang backend, so its backward is wrong here because of {hz.id}")
        if problems:
            chosen, steps, missing = _pick_fla(ctx, candidates, replace=True)
            if chosen is not None:
                return Decision(kernel="fla", action=REPAIR, rule="fla.repair", reason="; ".join(problems) +
                                f"; replacing with fla {chosen.version}", steps=steps,
                                target={"fla-core": chosen.version, "flash-linear-attention": chosen.version},
                                needs=needs, on_failure=OnFailure.BLOCK if (unsafe or incompatible or hz) else OnFailure.PROCEED, **kw)
            nothing = (f"offline, and FASTPATH_HOOKS_FIND_LINKS lacks {', '.join(missing)}" if missing
                       else "no known-good fla release fits here")
            if unsafe or incompatible:
                # Importing it would crash (or compute wrong gradients): fail closed, transformers keeps torch.
                rule = "fla.unsafe.block" if unsafe else "fla.incompatible.block"
                fix = f"install fla {pins.fla_releases[0].version} or newer" if unsafe else \
                    "add a fitting release's wheels to FASTPATH_HOOKS_FIND_LINKS or allow the index"
                return Decision(kernel="fla", action=BLOCK, rule=rule, reason="; ".join(problems) + f"; {nothing}",
                                fix=fix, on_failure=OnFailure.BLOCK, **kw)
            return Decision(kernel="fla", action=OK, rule="fla.ok.with-problems",
                            reason="; ".join(problems) + f"; {nothing}, leaving it as it is",
                            needs=needs, on_failure=OnFailure.BLOCK if hz else OnFailure.PROCEED, **kw)
        return Decision(kernel="fla", action=OK, rule="fla.ok",
                        reason=f"fla {fla} installed" + (f"; needs tilelang here because of {hz.id}" if hz else ""),
                        needs=needs, on_failure=OnFailure.BLOCK if hz else OnFailure.PROCEED, **kw)

    if hz is not None and not tilelang_ok:
        return _skip("fla", "fla.hazard.skip", _hazard_reason(env, hz, tilelang) + "; fla alone would crash at its "
                     "first backward", _hazard_fix(hz, tilelang), **kw)
    if not candidates:
        what = f"triton {env.triton}, torch {env.torch}" + (f", transformers {transformers}" if transformers else "")
        if hz is not None:
            what += f" with a tilelang backend, needed here because of {hz.id}"
        return _skip("fla", "fla.no-release", f"no known-good fla release for {what}",
                     "add a release to a FASTPATH_HOOKS_PINS file", **kw)
    chosen, steps, missing = _pick_fla(ctx, candidates, replace=False)
    if chosen is None:
        return _skip("fla", "fla.offline-missing", f"offline, and FASTPATH_HOOKS_FIND_LINKS lacks {', '.join(missing)}",
                     _fetch_fix("fla's wheels"), **kw)
    reason = f"fla {chosen.version} fits triton {env.triton}" + (f" and transformers {transformers}" if transformers else "")
    if hz is not None:
        reason += f"; with tilelang because of {hz.id}"
    return Decision(kernel="fla", action=INSTALL, rule="fla.install", reason=reason, steps=steps,
                    target={"fla-core": chosen.version, "flash-linear-attention": chosen.version}, needs=needs, **kw)


def _hazard_reason(env, hz, tilelang: Decision) -> str:
    """The facts, in one clause each: `sm_90 + triton 3.6.0 computes fla's backward wrongly (fla#640),
    and tilelang is unavailable: no nvcc`. A tilelang skip/block reason says why in its first clause."""
    gpus = "+".join(g for g in env.gpus if g in hz.gpu)
    why = tilelang.reason.split("; ")[0]
    return f"{gpus} + triton {env.triton} {hz.effect} ({hz.id}), and tilelang is unavailable: {why}"


def _hazard_fix(hz, tilelang: Decision) -> str:
    """tilelang's own fix first (the reason it is missing), then the hazard's (a triton without the bug)."""
    return f"{tilelang.fix}; or {hz.fix}" if tilelang.fix else hz.fix


def _has_tilelang_backend(pins, version: str, known) -> bool:
    """Pinned releases say so; an unpinned one is trusted only from the oldest pinned release with the backend on."""
    if known is not None:
        return known.tilelang_backend
    with_backend = [Version(r.version) for r in pins.fla_releases if r.tilelang_backend]
    try:
        return bool(with_backend) and Version(version) >= min(with_backend)
    except InvalidVersion:
        return False


def _pick_fla(ctx, candidates, *, replace: bool):
    """(release, steps, ()) for the first candidate installable here, else (None, (), what the first one lacks)."""
    first_missing = ()
    for rel in candidates:
        steps = _fla_steps(ctx, rel.version, replace=replace)
        missing = ctx.missing_offline(steps)
        if not missing:
            return rel, steps, ()
        first_missing = first_missing or tuple(missing)
    return None, (), first_missing


def _fla_steps(ctx, version: str, *, replace: bool) -> tuple:
    steps = []
    deps = _deps_step(ctx, ctx.pins.kernel("fla"))
    if deps is not None:
        steps.append(deps)
    steps.append(Step(kind=StepKind.KERNEL, requirements=(f"fla-core=={version}", f"flash-linear-attention=={version}"),
                      no_deps=True, force=replace,
                      note="both distributions at one version, without their torch/transformers requirements"))
    return tuple(steps)


# -- compiled kernels: causal-conv1d, mamba-ssm ------------------------------------------------
#
# One path, parameterized by the kernel's pins entry (release wheels, source build, releases):
# a fitting wheel in the local cache -> a built wheel in the wheelhouse -> the release wheel ->
# a source build for the visible GPUs (FASTPATH_HOOKS_ALLOW_BUILD); ROCm only by a build; an
# installed build of ours without code for a visible GPU is blocked. Rule ids carry the prefix.

RULE_PREFIX = {"causal-conv1d": "causal", "mamba-ssm": "mamba"}


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
    rel = pins.release(kernel)
    if version is not None and not same_version(version, rel.version):
        return None, f"no release wheels are pinned for {kernel} {version}, only for {rel.version}"
    if env.os != "linux":
        return None, f"release wheels are Linux-only (this is {env.os})"
    if not env.torch_cuda:
        return None, "release wheels are CUDA builds"
    cuda_major = env.torch_cuda.split(".")[0]
    torch_mm = _mm(env.torch_version)
    torch_mm = rel.torch_aliases.get(torch_mm, torch_mm)
    py = "".join(env.python.split(".")[:2])
    py_dotted = ".".join(env.python.split(".")[:2])
    abi = cxx11_abi_flag(env)
    for build in rel.builds:
        if (build["cuda_major"] == cuda_major and torch_mm in build["torch_mm"] and py_dotted in build["python"]
                and env.arch in build["arch"] and abi in build["abi"]):
            name = rel.filename.format(version=rel.version, cuda_major=cuda_major, torch_mm=torch_mm, abi=abi,
                                       py=py, arch=env.arch)
            return name, ""
    return None, (f"no prebuilt {kernel} {rel.version} wheel for torch {_mm(env.torch_version)} + CUDA {cuda_major} + "
                  f"cp{py} + {env.arch} + cxx11abi {abi}")


def _decide_compiled(ctx: _Context, kernel: str, decided: dict) -> Decision:
    p = RULE_PREFIX[kernel]
    spec = ctx.pins.kernel(kernel)
    dist = spec.distributions[0]
    installed_v = ctx.installed(dist)
    installed = {dist: installed_v} if installed_v else {}
    common = _common(ctx, kernel, installed=installed)
    if common is not None:
        return common
    kw = {"installed": installed, "transformers_uses": _transformers_uses(ctx, kernel)}
    half = installed_v is not None and dist in ctx.env.half_installed
    if installed_v and not half:
        missing = _arch_gaps(installed_v, ctx.env.gpus)
        if missing:
            # it imports fine (no kernel launched), then fails at the first forward: worse than torch
            have = _built_archs(installed_v)
            union = ",".join(sorted({*missing, *ctx.env.gpus, *have}))
            return Decision(kernel=kernel, action=BLOCK, rule=f"{p}.block.arch", on_failure=OnFailure.BLOCK,
                            reason=f"{dist} {installed_v} was built for {'+'.join(have)} only and has no code for "
                                   f"{'+'.join(missing)}",
                            fix=f"`pip uninstall {dist}`, then `fastpath-hooks build {kernel} --arch "
                                f"{union}` for every GPU type sharing this environment", **kw)
        # A wrong-arch/ABI build can crash at import: checked once in a child process, blocked if it fails.
        return Decision(kernel=kernel, action=OK, rule=f"{p}.ok", verify=True, on_failure=OnFailure.BLOCK,
                        reason=f"{dist} {installed_v} installed; checked once in a child process, as a "
                               "wrong-arch build can crash at import", needs=_optional_needs(ctx, kernel, decided), **kw)
    if not installed_v:
        blocked = _prerequisites(ctx, kernel, decided, kw)
        if blocked is not None:
            return blocked
    decision = _compiled_choice(ctx, kernel, decided, kw)
    if not half:
        return decision
    what = f"{dist} {installed_v} is {_HALF_INSTALLED}"
    if decision.action == INSTALL:
        steps = tuple(_replace(s, force=True) if s.kind in (StepKind.WHEEL, StepKind.BUILD) else s for s in decision.steps)
        return _replace(decision, action=REPAIR, rule=f"{p}.repair.half-installed", steps=steps,
                        reason=f"{what}; reinstalling: {decision.reason}", on_failure=OnFailure.BLOCK)
    return Decision(kernel=kernel, action=OK, rule=f"{p}.ok.half-installed", verify=True, on_failure=OnFailure.BLOCK,
                    reason=f"{what}; checked in a child process, as it cannot be reinstalled here: {decision.reason}",
                    fix=decision.fix, **kw)


def _prerequisites(ctx: _Context, kernel: str, decided: dict, kw) -> Decision | None:
    """What must be there before installing the kernel is worth it (pins: `imports_installed`,
    which fastpath-hooks never installs, and `with`, the kernels it is only useful with)."""
    env, p, spec = ctx.env, RULE_PREFIX[kernel], ctx.pins.kernel(kernel)
    for name in spec.imports_installed:
        have = env.triton if name == "triton" else env.version(name)
        if have is None:
            fix = ("install the triton your torch build depends on (pip install torch==<yours> reinstalls it)"
                   if name == "triton" else f"install {name}")
            return _skip(kernel, f"{p}.no-{name}", f"no {name}: `import {spec.module}` imports it", fix, **kw)
    for partner in spec.with_kernels:
        d = decided.get(partner)
        if d is None or d.action in TILELANG_GOOD:
            continue
        partner_dist = ctx.pins.kernel(partner).distributions[0]
        if ctx.installed(partner_dist):
            continue  # the user's own (skipped or blocked) install: not ours to judge here
        verb = "blocked" if d.action == BLOCK else "not installed"
        return _skip(kernel, f"{p}.without.{RULE_PREFIX.get(partner, partner)}",
                     f"transformers uses {kernel} only with {partner}, which is {verb} here: {d.reason}",
                     d.fix, **kw)
    return None


def _release_order(ctx: _Context, kernel: str, decided: dict):
    """(the pinned versions that fit here, in the pins' order of preference; version -> the declared
    requirement the installed distributions, or those planned by a kernel ensured first, do not meet),
    or (None, why none fits).
    A --no-deps install leaves such a requirement unmet, and the next resolver run would "fix" it
    (mamba-ssm 2.3.2's tilelang==0.1.8 would downgrade the tilelang fla uses on Hopper)."""
    env, pins = ctx.env, ctx.pins
    releases = pins.kernel_releases.get(kernel)
    if not releases:
        return (pins.build(kernel).version,), {}
    transformers = env.version("transformers")
    fits = [r for r in releases if _in(env.torch, r.torch) and (env.triton is None or _in(env.triton, r.triton))
            and not (transformers and not _in(transformers, r.transformers))]
    if not fits:
        what = f"torch {env.torch}, triton {env.triton}" + (f", transformers {transformers}" if transformers else "")
        return None, f"no pinned {kernel} release fits {what}"
    planned = {}   # only what is ensured before this kernel: another kernel's plan may never run (fla absent)
    for k in _needed(ctx, kernel, decided):
        if decided[k].action in (INSTALL, REPAIR):
            planned.update({canonical_name(n): v for n, v in decided[k].target.items()})
    clashes = {}
    for r in fits:
        for raw in r.declares:
            req = Requirement(raw)
            name = canonical_name(req.name)
            have = planned.get(name) or ctx.installed(name)
            if have is not None and not _in(have, req.specifier):
                clashes.setdefault(r.version, f"{raw} while {name} {have} is "
                                              f"{'planned' if name in planned else 'installed'}")
    return tuple(r.version for r in fits), clashes


def _compiled_choice(ctx: _Context, kernel: str, decided: dict, kw) -> Decision:
    """The install of one pinned release: one that needs no build before one that does, then one
    whose declared requirements agree with what is installed or planned, then the pins' order. When
    none can be installed, the first one's reason."""
    versions, clashes = _release_order(ctx, kernel, decided)
    if versions is None:
        return _skip(kernel, f"{RULE_PREFIX[kernel]}.no-release", clashes, "add a release to a FASTPATH_HOOKS_PINS file",
                     **kw)
    options = [(version, _compiled_install(ctx, kernel, version, kw)) for version in versions]
    acting = [(i, v, d) for i, (v, d) in enumerate(options) if d.action != SKIP]
    if not acting:
        return options[0][1]
    _, version, decision = min(acting, key=lambda o: (any(s.kind == StepKind.BUILD for s in o[2].steps), o[1] in clashes, o[0]))
    if version in clashes:
        decision = _replace(decision, reason=f"{decision.reason}; {version} declares {clashes[version]}: the --no-deps "
                                             "install leaves it unmet, a later resolver run could change it")
    elif version != versions[0] and versions[0] in clashes:
        decision = _replace(decision, reason=f"{decision.reason}; {kernel} {version}, not {versions[0]}, which declares "
                                             f"{clashes[versions[0]]}")
    return _with_partners(ctx, kernel, decided, decision)


def _with_partners(ctx: _Context, kernel: str, decided: dict, decision: Decision) -> Decision:
    """The kernels it is only useful with, or whose import runs inside its own, are ensured first
    (the engine's `needs`)."""
    needs = _needed(ctx, kernel, decided)
    if not needs:
        return decision
    first = [k for k in needs if decided[k].action != OK]
    return _replace(decision, needs=needs, reason=decision.reason + (
        f"; with {', '.join(first)}, installed first" if first else f"; with {', '.join(needs)}"))


def _needed(ctx: _Context, kernel: str, decided: dict) -> tuple:
    """The kernels ensured before this one: its `with` partners that will be usable, then its
    `imports_optional` ones (below)."""
    partners = tuple(k for k in ctx.pins.kernel(kernel).with_kernels
                     if decided.get(k) is not None and decided[k].action in TILELANG_GOOD)
    return partners + _optional_needs(ctx, kernel, decided)


def _optional_needs(ctx: _Context, kernel: str, decided: dict) -> tuple:
    """The pins' `imports_optional` kernels that are installed and not skipped: its import imports
    them under a guard that catches only ImportError (mamba-ssm: tilelang), so a broken one would fail
    this kernel's check; they are checked, repaired or blocked first."""
    return tuple(k for k in ctx.pins.kernel(kernel).imports_optional
                 if decided.get(k) is not None and decided[k].action != SKIP
                 and ctx.installed(ctx.pins.kernel(k).distributions[0]))


def _built_archs(installed: str) -> tuple:
    """The archs in the local label of a build of ours (`...+fph.torch2.11.0.cu130.abi1.sm90` ->
    ("sm_90",)); () for anything else (a release wheel, a build for `all`)."""
    local = installed.split("+", 1)[1] if "+" in installed else ""
    tokens = local.split(".")
    if not local.startswith(cached_wheels.LABEL + ".") or not any(t.startswith("abi") for t in tokens):
        return ()
    archs = tokens[[i for i, t in enumerate(tokens) if t.startswith("abi")][0] + 1:]  # after torchX.Y.Z.cuXY.abiN
    return () if not archs or "all" in archs else tuple(f"sm_{t[2:]}" if t.startswith("sm") else t for t in archs)


def _arch_gaps(installed: str, gpus) -> tuple:
    """The visible GPUs an installed build of ours has no code for (a release wheel holds every arch)."""
    codes = set(_built_archs(installed))
    return tuple(g for g in gpus if cached_wheels.pair_for(g, codes) is None) if codes else ()


def _compiled_install(ctx: _Context, kernel: str, version: str, kw) -> Decision:
    """Preference: a fitting wheel this machine (or a shared cache) already has, a fitting built
    wheel in the wheelhouse, the release wheel, then a source build as FASTPATH_HOOKS_ALLOW_BUILD
    allows."""
    from ..facts.settings import release_wheel_url

    pins, env, settings = ctx.pins, ctx.env, ctx.settings
    p, dist = RULE_PREFIX[kernel], pins.kernel(kernel).distributions[0]
    rel, build = pins.release(kernel), pins.build(kernel, version)
    deps = _deps_step(ctx, pins.kernel(kernel))
    dep_steps = (deps,) if deps is not None else ()
    filename, why = release_wheel(env, pins, kernel, version)

    def prebuilt(name, rule, reason, url=None, note=""):
        steps = dep_steps + (Step(kind=StepKind.WHEEL, requirements=(name,), url=url, sha256=rel.sha256.get(name), note=note),)
        return Decision(kernel=kernel, action=INSTALL, rule=rule, reason=reason, steps=steps,
                        target={dist: version}, **kw)

    deps_missing = ctx.missing_offline(dep_steps)
    cached = next((n for n in env.cached_wheels if n == filename or _built_fits(ctx, n, build)), None)
    housed = next((n for n in env.wheelhouse if n != filename and _built_fits(ctx, n, build)), None)
    if deps_missing and (cached or housed):
        return _skip(kernel, f"{p}.offline-missing", f"offline, and FASTPATH_HOOKS_FIND_LINKS lacks "
                     f"{', '.join(deps_missing)}, which {cached or housed} needs", _fetch_fix("them"), **kw)
    if cached:
        path = os.path.join(env.wheel_cache or "", cached)
        return prebuilt(cached, f"{p}.cache", f"{cached} from the local wheel cache, {env.wheel_cache}",
                        url="file://" + quote(path), note="from the local wheel cache, no build")
    if housed:
        return prebuilt(housed, f"{p}.wheelhouse", f"built wheel {housed} from the wheelhouse",
                        note="a wheel built for this torch and these GPUs, from the wheelhouse")

    if filename is not None:
        base = release_wheel_url(settings, kernel) or rel.base_url.format(tag=rel.tag)
        url = base.rstrip("/") + "/" + quote(filename)
        in_house = filename in env.wheelhouse
        missing = list(deps_missing)
        if settings.offline and not in_house:
            missing = [filename] + missing
        if not missing:
            return prebuilt(filename, f"{p}.wheel", f"prebuilt wheel {filename}", url=None if in_house else url,
                            note="prebuilt release wheel" + (" from the wheelhouse" if in_house else "") +
                                 ("" if rel.sha256.get(filename) else "; no pinned sha256 (the pins do not know it)"))
        why = f"offline, and FASTPATH_HOOKS_FIND_LINKS lacks {', '.join(missing)}"
        if settings.allow_build == "0":
            return _skip(kernel, f"{p}.offline-missing", why, _fetch_fix("the wheel", "the network"), **kw)
    return _compiled_source_build(ctx, kernel, build, why, kw)


def decide_build(env, settings, pins, kernel: str) -> Decision:
    """`fastpath-hooks build`: the kernel's source build for `env.gpus` (the archs asked for, on a
    host that may have no GPU), whatever wheels exist; the same release choice, compiler, arch and
    time rules as an automatic build."""
    ctx = _Context(env, settings, pins, False)
    kw = {"installed": {}, "transformers_uses": _transformers_uses(ctx, kernel)}
    versions, clashes = _release_order(ctx, kernel, {})
    if versions is None:
        return _skip(kernel, f"{RULE_PREFIX[kernel]}.no-release", clashes, "add a release to a FASTPATH_HOOKS_PINS file",
                     **kw)
    version = next((v for v in versions if v not in clashes), versions[0])
    return _compiled_source_build(ctx, kernel, pins.build(kernel, version), "asked for by `fastpath-hooks build`",
                                  kw, asked=True)


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
    ctx = _Context(env, None, pins, False)
    versions = [r.version for r in pins.kernel_releases.get(kernel, ())] or [build.version]
    return any(_built_fits(ctx, name, pins.build(kernel, v)) for v in versions)


def _built_fits(ctx: _Context, name: str, build) -> bool:
    env = ctx.env
    if not env.torch or build.version is None:
        return False
    return cached_wheels.fits(name, distribution=build.distribution, version=build.version, torch=env.torch,
                              cuda=env.torch_cuda, hip=env.torch_hip, abi=cxx11_abi_flag(env), python=env.python,
                              arch=env.arch, gpus=env.gpus, all_codes=_cuda_codes(build, env.torch_cuda))


def _cuda_codes(build, nvcc_version: str | None) -> tuple:
    """The -gencode codes the sdist compiles with this nvcc release (all it knows when unknown)."""
    codes = (code for code, spec in build.cuda_archs.items() if nvcc_version is None or _in(nvcc_version, spec))
    return tuple(sorted(codes, key=lambda c: cached_wheels.compute_capability(c) or (0, 0)))


def build_archs(env, build, archs=None) -> tuple:
    """(codes to compile, GPUs nothing compiled runs on): the sdist's codes whose binaries run on
    `archs` (default the visible GPUs) - sm_86 takes sm_80's - given this nvcc; ROCm: gfx as is.
    `build`: the kernel's SourceBuild (pins.build(kernel))."""
    gpus = tuple(archs if archs is not None else env.gpus)
    if env.torch_hip:
        known = tuple(g for g in gpus if g.startswith("gfx") and len(g) > 3)
        return tuple(sorted(set(known))), tuple(g for g in gpus if g not in known)
    codes = _cuda_codes(build, env.nvcc_version)
    chosen = {g: cached_wheels.pair_for(g, codes) for g in gpus}
    return tuple(sorted({c for c in chosen.values() if c}, key=cached_wheels.compute_capability)), \
        tuple(g for g, c in chosen.items() if c is None)


def build_estimate(build, n_archs: int, cpus: int | None) -> tuple:
    """(seconds, how): the measured build scaled by archs (each is compiled separately) and by
    fewer cores (more cores do not help: the big files compile one per job)."""
    seconds = build.seconds * n_archs / build.archs
    if cpus and cpus < build.cores:
        seconds *= build.cores / cpus
    how = (f"an estimate: {build.seconds:.0f} s measured for {build.archs} arch on {build.cores} cores, "
           f"scaled to {n_archs} arch{'s' if n_archs != 1 else ''} on {cpus or '?'} cores")
    return seconds, how


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _compiled_source_build(ctx: _Context, kernel: str, build, why: str, kw, *, asked: bool = False) -> Decision:
    env, settings = ctx.env, ctx.settings
    p = RULE_PREFIX[kernel]
    deps = _deps_step(ctx, ctx.pins.kernel(kernel), extra=build.build_deps)
    dep_steps = (deps,) if deps is not None else ()
    mode = settings.allow_build
    rocm = bool(env.torch_hip)
    if mode == "0":
        if rocm:
            return _skip(kernel, f"{p}.rocm.no-build", "no prebuilt ROCm wheels, and source builds are off "
                         "by FASTPATH_HOOKS_ALLOW_BUILD=0", "set FASTPATH_HOOKS_ALLOW_BUILD=auto to build it with hipcc "
                         "for this machine's GPUs", **kw)
        return _skip(kernel, f"{p}.no-wheel", f"source builds are off by FASTPATH_HOOKS_ALLOW_BUILD=0, and {why}",
                     "set FASTPATH_HOOKS_ALLOW_BUILD=auto to build it for this machine's GPUs, or put a wheel from "
                     "`fastpath-hooks build` in FASTPATH_HOOKS_FIND_LINKS", **kw)
    if not env.pip:  # the build runs `python -m pip wheel` (uv builds through an isolated cache of its own)
        return _skip(kernel, f"{p}.build.no-pip", f"{why}, and a source build runs pip, which this "
                     "environment lacks (a `uv venv`)", "run `python -m ensurepip`, or put a wheel from "
                     "`fastpath-hooks build` in FASTPATH_HOOKS_FIND_LINKS", **kw)
    if rocm:
        why = "no prebuilt ROCm wheels"
        if not env.hipcc:
            return _skip(kernel, f"{p}.rocm.no-hipcc", f"{why}, and a source build needs hipcc, which is not "
                         "found", "install ROCm's hipcc (ROCM_HOME, PATH or /opt/rocm)", **kw)
        compiler = "hipcc"
    else:
        if not env.nvcc or env.nvcc.startswith("nvidia-cuda-nvcc"):
            return _skip(kernel, f"{p}.no-nvcc", f"{why}, and a source build needs a CUDA toolkit's nvcc, "
                         "which is not found", f"install a CUDA {env.torch_cuda} toolkit (torch's) and set CUDA_HOME", **kw)
        torch_major = (env.torch_cuda or "").split(".")[0]
        if env.nvcc_version is None and mode == "auto":
            return _skip(kernel, f"{p}.nvcc-unknown", f"{why}, and the CUDA release of nvcc ({env.nvcc}) "
                         "cannot be told, so a build for torch's CUDA is not started unasked",
                         "point CUDA_HOME at a toolkit whose nvcc answers --version, or set FASTPATH_HOOKS_ALLOW_BUILD=1",
                         **kw)
        if env.nvcc_version is not None and env.nvcc_version.split(".")[0] != torch_major:
            return _skip(kernel, f"{p}.nvcc-mismatch", f"{why}, and nvcc is CUDA {env.nvcc_version} while "
                         f"torch is built for CUDA {env.torch_cuda}: torch refuses to build extensions across CUDA "
                         "majors", f"point CUDA_HOME at a CUDA {torch_major}.x toolkit", **kw)
        compiler = f"nvcc {env.nvcc_version}" if env.nvcc_version else "nvcc"
    archs, unsupported = build_archs(env, build)
    if unsupported and not rocm:
        codes = _cuda_codes(build, env.nvcc_version)
        return _skip(kernel, f"{p}.build.no-arch", f"{why}, and {build.requirement} compiles no code that "
                     f"runs on {'+'.join(unsupported)}; with {compiler} it targets {', '.join(codes)}", "", **kw)
    env_pairs = dict(build.rocm_env if rocm else build.env)
    if unsupported or not archs:
        what = "+".join(unsupported) or "no GPU listed"
        if mode == "auto":
            seconds, _ = build_estimate(build, len(_cuda_codes(build, env.nvcc_version)), env.cpus)
            return _skip(kernel, f"{p}.build.unrestricted", f"{why}; a source build cannot be restricted to "
                         f"this machine's GPUs, {what}: unknown archs; and one for every arch takes long "
                         f"- about {_minutes(seconds)}, an estimate",
                         "set FASTPATH_HOOKS_ALLOW_BUILD=1 to build for every arch anyway", **kw)
        archs, rule = ("all",), f"{p}.rocm.build" if rocm else f"{p}.build.all-archs"
        n_archs = len(_cuda_codes(build, env.nvcc_version)) if not rocm else 1
    else:
        rule = f"{p}.rocm.build" if rocm else f"{p}.build"
        n_archs = len(archs)
        if rocm:
            env_pairs["HIP_ARCHITECTURES"] = " ".join(archs)
    seconds, how = build_estimate(build, n_archs, env.cpus)
    if rocm:
        how += " of a CUDA build"
    if seconds > settings.timeout:
        return _skip(kernel, f"{p}.build.timeout", f"{why}; a source build for {'every arch' if archs == ('all',) else ', '.join(archs)} takes about "
                     f"{_minutes(seconds)}, {how}; longer than FASTPATH_HOOKS_TIMEOUT={settings.timeout:.0f} s",
                     f"raise FASTPATH_HOOKS_TIMEOUT to {int(seconds * 1.5)} or more", **kw)
    steps = dep_steps + (Step(kind=StepKind.BUILD, requirements=(build.requirement,), no_deps=True, binary_only=False,
                              build_isolation=False, env=tuple(sorted(env_pairs.items())), archs=archs,
                              note=f"source build against the installed torch with {compiler}, for "
                                   f"{', '.join(archs)}; about {_minutes(seconds)}, {how}"),)
    missing = ctx.missing_offline(steps)
    if missing:
        return _skip(kernel, f"{p}.offline-missing", f"{why}; a source build needs {', '.join(missing)} too, "
                     "which FASTPATH_HOOKS_FIND_LINKS lacks", "add the sdist and wheels or allow the index", **kw)
    allowed = "" if asked else f", as FASTPATH_HOOKS_ALLOW_BUILD={mode} allows"
    return Decision(kernel=kernel, action=INSTALL, rule=rule,
                    # what happens and how long first: a line cut at 160 characters keeps it (the step's note
                    # says how the estimate was made)
                    reason=f"building from source for {'every arch' if archs == ('all',) else ', '.join(archs)} with "
                           f"{compiler}, about {_minutes(seconds)}, an estimate{allowed}; {why}",
                    steps=steps, target={build.distribution: build.version}, expected_seconds=round(seconds), **kw)


# -- what transformers does with a kernel ---------------------------------------------

_ERA_B, _ERA_C = Version("5.0"), Version("5.15")


def transformers_era(version) -> str | None:
    """A / B / C (see shared notes) for a transformers version (parsed or text); None when none."""
    v = _parse(version)
    if v is None:
        return None
    if v >= _ERA_C:
        return "C"
    if v >= _ERA_B:
        return "B"
    return "A"


def _transformers_uses(ctx: _Context, kernel: str) -> str:
    env = ctx.env
    version = env.version("transformers")
    era = transformers_era(env.dist_version("transformers"))
    if era is None:
        return "transformers is not installed"
    if kernel == "tilelang":
        return "not directly: fla uses it for its Hopper backward"
    module = ctx.pins.kernel(kernel).module
    if era == "C":
        return (f"transformers {version} (era C) imports {module} with a modeling module and uses it whenever "
                "that import succeeds, GPU or not")
    yes = env.accelerator in ("cuda", "rocm")  # eras A/B gate on CUDA (ROCm torch reports as CUDA); XPU from 5.15 = era C
    if kernel == "mamba-ssm":
        return (f"transformers {version} (era {era}) asks is_mamba_ssm_available() / is_mamba_2_ssm_available(), which "
                f"also need causal-conv1d: {'yes' if yes else 'no'} on this "
                f"{'accelerator' if env.accelerator else 'machine (no accelerator)'}")
    return (f"transformers {version} (era {era}) asks is_{'flash_linear_attention' if kernel == 'fla' else 'causal_conv1d'}"
            f"_available(): {'yes' if yes else 'no'} on this {'accelerator' if env.accelerator else 'machine (no accelerator)'}")
