"""The decision policy: a pure function (environment, settings, pins) -> Plan.

No I/O, no imports of torch or transformers, no clock: every input is an
argument, so each rule is tested by a table row (tests/test_policy.py).
Rule ids in `Decision.rule` name which rule decided.
"""

from __future__ import annotations

from dataclasses import replace as _replace
from urllib.parse import quote

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from .distributions import canonical_name
from .plan import BLOCK, INSTALL, OK, REPAIR, SKIP, Decision, Plan, Step

ORDER = ("fla", "causal-conv1d", "tilelang")
TILELANG_GOOD = (OK, INSTALL, REPAIR)


def decide(env, settings, pins, *, fresh: bool = False) -> Plan:
    """Decide every kernel. `fresh`: plan as if no kernel package were installed
    (what a new machine of this kind needs - used by `download`)."""
    ctx = _Context(env, settings, pins, fresh)
    tilelang = _decide_tilelang(ctx)
    fla = _decide_fla(ctx, tilelang)
    causal = _decide_causal(ctx)
    decisions = {"fla": fla, "causal-conv1d": causal, "tilelang": tilelang}
    notes = []
    if ctx.env.accelerator is None:
        notes.append(_no_accelerator_reason(ctx.env))
    return Plan(environment=env, decisions={k: decisions[k] for k in ORDER}, notes=tuple(notes))


class _Context:
    def __init__(self, env, settings, pins, fresh):
        self.env, self.settings, self.pins, self.fresh = env, settings, pins, fresh

    def installed(self, dist: str) -> str | None:
        name = canonical_name(dist)
        if self.fresh and name in _KERNEL_DISTS:
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
            if _in(env.triton, hz.triton):
                out.append(hz)
        return out

    @property
    def wheelhouse(self) -> dict:
        """name -> set of versions available as files in FASTPATH_HOOKS_FIND_LINKS."""
        out: dict = {}
        for filename in self.env.wheelhouse:
            try:
                if filename.endswith(".whl"):
                    name, version, _, _ = parse_wheel_filename(filename)
                else:
                    name, version = parse_sdist_filename(filename)
            except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
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
                if step.kind == "wheel":
                    if raw not in self.env.wheelhouse:
                        missing.append(raw)
                    continue
                req = Requirement(raw)
                name = canonical_name(req.name)
                if step.kind == "deps" and self.installed_satisfies(req):
                    continue
                versions = have.get(name, set())
                if not any(req.specifier.contains(v, prereleases=True) for v in versions):
                    missing.append(raw)
        return missing

    def installed_satisfies(self, req: Requirement) -> bool:
        version = self.env.version(req.name)
        return version is not None and _in(version, req.specifier)


_KERNEL_DISTS = ("fla-core", "flash-linear-attention", "tilelang", "apache-tvm-ffi", "causal-conv1d")


def _in(version: str, spec) -> bool:
    try:
        return spec.contains(Version(version).public if "+" in version else version, prereleases=True)
    except InvalidVersion:
        return False


def _same(a: str, b: str) -> bool:
    """Version equality that never raises (a dist-info can carry any string)."""
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def _parse(version: str | None) -> Version | None:
    if not version:
        return None
    try:
        return Version(version)
    except InvalidVersion:
        return None


def _mm(version: str | None) -> str | None:
    v = _parse(version)
    return None if v is None else f"{v.major}.{v.minor}"


def _no_accelerator_reason(env) -> str:
    if env.torch is None:
        return "torch is not installed, so there is no accelerator to use kernels on"
    if env.torch_build == "CPU":
        reason = f"no CUDA/XPU accelerator: torch {env.torch} is a CPU build"
        if env.gpu_source == "target" and env.gpus:
            # A posed GPU with this host's CPU torch: say how to pose the GPU machine's torch too.
            reason += f" (to pose a machine with {'+'.join(env.gpus)}, add its torch build: cuda=..., hip=... or xpu=yes)"
        return reason
    if env.gpus:
        return (f"no CUDA/XPU accelerator: torch {env.torch} ({env.torch_build}) cannot use "
                f"{'+'.join(env.gpus)}")
    return f"no CUDA/XPU accelerator: torch {env.torch} ({env.torch_build}) sees no device ({env.gpu_source})"


def _skip(kernel, rule, reason, fix="", **kw) -> Decision:
    return Decision(kernel=kernel, action=SKIP, reason=reason, rule=rule, fix=fix, **kw)


def _common(ctx: _Context, kernel: str, *, installed: dict) -> Decision | None:
    """The skip rules every kernel shares, in order."""
    env, settings = ctx.env, ctx.settings
    spec = ctx.pins.kernel(kernel)
    kw = {"installed": installed, "transformers_uses": _transformers_uses(ctx, kernel)}
    if kernel in settings.skip:
        return _skip(kernel, "skip.user", "skipped by FASTPATH_HOOKS_SKIP", "remove it from FASTPATH_HOOKS_SKIP", **kw)
    if env.torch is None:
        return _skip(kernel, "skip.no-torch", "torch is not installed", "install torch first", **kw)
    if env.accelerator is None:
        return _skip(kernel, "skip.no-accelerator",
                     _no_accelerator_reason(env) + f"; {kernel} runs on GPUs only",
                     "run on a machine with a CUDA (or XPU) GPU and a matching torch build", **kw)
    if not _in(env.python, spec.python):
        return _skip(kernel, "skip.python", f"Python {env.python} is outside {kernel}'s support ({spec.python})",
                     f"use Python {spec.python}", **kw)
    if env.platform not in spec.platforms:
        return _skip(kernel, "skip.platform",
                     f"no {kernel} builds for {env.platform} (supported: {', '.join(spec.platforms)})", "", **kw)
    glibc_spec = spec.glibc.get(env.arch)
    if glibc_spec and env.glibc and not _in(env.glibc, _spec(glibc_spec)):
        return _skip(kernel, "skip.glibc", f"{kernel} wheels for {env.arch} need glibc {glibc_spec}; this system has {env.glibc}",
                     "", **kw)
    if not _in(env.torch, spec.torch):
        return _skip(kernel, "skip.torch", f"torch {env.torch} is outside {kernel}'s support ({spec.torch})",
                     f"use torch {spec.torch}", **kw)
    if env.accelerator not in spec.accelerators:
        reason = f"{kernel} does not support {env.accelerator.upper() if env.accelerator != 'rocm' else 'ROCm'}"
        if kernel == "causal-conv1d" and env.accelerator == "rocm":
            pass  # handled by the causal-conv1d rules (source build only)
        else:
            return _skip(kernel, f"skip.accelerator.{env.accelerator}", reason, "", **kw)
    return None


def _spec(text):
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(text)


def _deps_step(ctx: _Context, spec) -> Step | None:
    reqs = []
    marker_env = {"python_version": ".".join(ctx.env.python.split(".")[:2]), "python_full_version": ctx.env.python,
                  "sys_platform": {"windows": "win32"}.get(ctx.env.os, ctx.env.os),
                  "platform_system": {"linux": "Linux", "darwin": "Darwin", "windows": "Windows"}.get(ctx.env.os, ctx.env.os),
                  "platform_machine": ctx.env.arch}
    for raw in spec.runtime_deps:
        req = Requirement(raw)
        if req.marker is not None and not Marker(str(req.marker)).evaluate(marker_env):
            continue
        req.marker = None
        reqs.append(str(req))
    if not reqs:
        return None
    return Step(kind="deps", requirements=tuple(reqs), no_deps=False,
                note="runtime dependencies, resolved under a constraints file that pins torch, triton, numpy and transformers")


# -- tilelang ------------------------------------------------------------------

def _decide_tilelang(ctx: _Context) -> Decision:
    pins, env, settings = ctx.pins, ctx.env, ctx.settings
    spec = pins.kernel("tilelang")
    tl, ffi = ctx.installed("tilelang"), ctx.installed("apache-tvm-ffi")
    installed = {k: v for k, v in (("tilelang", tl), ("apache-tvm-ffi", ffi)) if v}
    fla_hazards = [h for h in ctx.hazards("fla") if h.needs == "tilelang"]
    needed = bool(fla_hazards) and "fla" not in settings.skip
    uses = _transformers_uses(ctx, "tilelang")

    if env.accelerator == "rocm" and "tilelang" not in settings.skip and env.torch is not None:
        return _skip("tilelang", "tilelang.rocm", "no tilelang on ROCm (fla is told FLA_TILELANG=0)", "",
                     installed=installed, transformers_uses=uses)
    common = _common(ctx, "tilelang", installed=installed)
    if common is not None:
        if needed and common.rule == "skip.user":
            hz = fla_hazards[0]
            common = Decision(**{**common.__dict__, "reason": f"skipped by FASTPATH_HOOKS_SKIP, although fla needs it here ({hz.id})"})
        return common

    kw = {"installed": installed, "transformers_uses": uses}
    half = [d for d in ("tilelang", "apache-tvm-ffi") if d in env.half_installed and ctx.installed(d)]
    if tl and half:
        return _tilelang_repair(ctx, tl, ffi, f"{' and '.join(half)} half-installed (two .dist-info in one directory: "
                                "an install was interrupted)", "tilelang.repair.half-installed", kw)
    if tl and ffi:
        broken = pins.broken_for(tl, ffi, env.gpus)
        if broken is not None:
            return _tilelang_repair(ctx, tl, ffi, f"apache-tvm-ffi {ffi} is broken with tilelang {tl}"
                                    f"{'' if broken.arch == '*' else ' on ' + broken.arch}: {broken.effect} ({broken.source})",
                                    "tilelang.repair.broken-pair", kw)
    if tl and not ffi:
        return _tilelang_repair(ctx, tl, None, f"tilelang {tl} is installed without apache-tvm-ffi", "tilelang.repair.missing-ffi", kw)

    if not needed:
        why = "no Hopper GPU here" if not any(g in h.gpu for h in pins.hazards for g in env.gpus) else \
            f"triton {env.triton} is outside the Hopper bug's range" if env.triton else "no triton"
        if "fla" in settings.skip and fla_hazards:
            why = "fla is skipped by FASTPATH_HOOKS_SKIP"
        if tl:
            return Decision(kernel="tilelang", action=OK, rule="tilelang.ok.not-needed",
                            reason=f"tilelang {tl} + apache-tvm-ffi {ffi} installed; not needed by fla here ({why})", **kw)
        return _skip("tilelang", "tilelang.not-needed", f"not needed: fla works without it here ({why})", **kw)

    hz = fla_hazards[0]
    if env.fla_tilelang_env == "0":
        return _skip("tilelang", "tilelang.user-disabled", "FLA_TILELANG=0 is set, so fla would not use tilelang",
                     f"unset FLA_TILELANG (fla needs tilelang here: {hz.id})", **kw)
    nvcc_reqs = ()
    if spec.needs_nvcc and not env.nvcc:
        pk = spec.nvcc_packages
        if pk and env.torch_cuda and _in(env.torch_cuda, _spec(pk["cuda"])):
            nvcc_reqs = tuple(pk["requirements"])
        else:
            return _skip("tilelang", "tilelang.no-nvcc",
                         "tilelang compiles its kernels with nvcc at run time and fla only uses it when nvcc is found; "
                         "no nvcc here (CUDA_HOME, PATH, /usr/local/cuda, nvidia-cuda-nvcc)",
                         "install a CUDA toolkit matching torch (or set CUDA_HOME)", **kw)

    if tl:
        good = [g for g in pins.good_tvm_ffi(tl) if pins.broken_for(tl, g, env.gpus) is None]
        if good and any(_same(ffi, g) for g in good):
            if nvcc_reqs:
                return _tilelang_install(ctx, tl, ffi, nvcc_reqs, "tilelang.install.nvcc", REPAIR,
                                         f"tilelang {tl} + apache-tvm-ffi {ffi} need nvcc; installing the nvcc wheel", kw)
            return Decision(kernel="tilelang", action=OK, rule="tilelang.ok", verify=True,
                            reason=f"tilelang {tl} + apache-tvm-ffi {ffi} is a known-good pair; fla needs it here ({hz.id})",
                            on_failure="block", repair_steps=_pair_steps(ctx, tl, good[0], nvcc_reqs, replace_ffi=True), **kw)
        pair = _preferred_pair(ctx)
        return Decision(kernel="tilelang", action=OK, rule="tilelang.ok.unverified", verify=True,
                        reason=f"tilelang {tl} + apache-tvm-ffi {ffi} is not in the pins; checking it in a child process",
                        on_failure="block",
                        repair_steps=_pair_steps(ctx, pair[0], pair[1], nvcc_reqs, replace_ffi=True) if pair else (), **kw)

    pair = _preferred_pair(ctx)
    if pair is None:
        return _skip("tilelang", "tilelang.offline-missing",
                     "offline, and FASTPATH_HOOKS_FIND_LINKS holds no known-good tilelang + apache-tvm-ffi pair",
                     "add the wheels (`fastpath-hooks download --dest DIR`) or allow the index", **kw)
    return _tilelang_install(ctx, pair[0], pair[1], nvcc_reqs, "tilelang.install", INSTALL,
                             f"fla needs tilelang on {'/'.join(hz.gpu)} with triton {env.triton} ({hz.id})", kw)


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
        steps.append(Step(kind="replace", requirements=(f"apache-tvm-ffi=={ffi}",), no_deps=True, force=True,
                          note="replace apache-tvm-ffi alone first: the broken pair can abort any process that imports it"))
    deps = _deps_step(ctx, spec)
    if deps is not None:
        steps.append(deps)
    if nvcc_reqs:
        steps.append(Step(kind="deps", requirements=tuple(nvcc_reqs), no_deps=False, note="nvcc for tilelang's JIT"))
    steps.append(Step(kind="kernel", requirements=(f"tilelang=={tl}", f"apache-tvm-ffi=={ffi}"), no_deps=True,
                      note="the known-good pair, pinned together (a fresh resolve picks a broken apache-tvm-ffi)"))
    return tuple(steps)


def _tilelang_install(ctx, tl, ffi, nvcc_reqs, rule, action, reason, kw) -> Decision:
    steps = _pair_steps(ctx, tl, ffi, nvcc_reqs, replace_ffi=False)
    missing = ctx.missing_offline(steps)
    if missing:
        return _skip("tilelang", "tilelang.offline-missing",
                     f"offline, and FASTPATH_HOOKS_FIND_LINKS lacks {', '.join(missing)}",
                     "add the wheels (`fastpath-hooks download --dest DIR`) or allow the index", **kw)
    return Decision(kernel="tilelang", action=action, rule=rule, reason=reason, steps=steps,
                    target={"tilelang": tl, "apache-tvm-ffi": ffi}, on_failure="block", **kw)


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
                        target={"tilelang": target_tl, "apache-tvm-ffi": target_ffi}, on_failure="block", **kw)
    if first_missing:
        return Decision(kernel="tilelang", action=BLOCK, rule=rule + ".offline-missing",
                        reason=reason + f"; offline, and FASTPATH_HOOKS_FIND_LINKS lacks {', '.join(first_missing)}",
                        fix="add the wheels (`fastpath-hooks download --dest DIR`) or allow the index",
                        on_failure="block", **kw)
    return Decision(kernel="tilelang", action=BLOCK, rule=rule + ".unrepairable",
                    reason=reason + "; the pins know no good apache-tvm-ffi for this GPU", on_failure="block",
                    fix="add a known-good tilelang + apache-tvm-ffi pair in a FASTPATH_HOOKS_PINS file", **kw)


# -- fla -------------------------------------------------------------------------

_FLA_DISTS = ("fla-core", "flash-linear-attention")


def _decide_fla(ctx: _Context, tilelang: Decision) -> Decision:
    pins, env = ctx.pins, ctx.env
    core, layers = ctx.installed("fla-core"), ctx.installed("flash-linear-attention")
    installed = {k: v for k, v in (("fla-core", core), ("flash-linear-attention", layers)) if v}
    kw = {"installed": installed, "transformers_uses": _transformers_uses(ctx, "fla")}

    common = _common(ctx, "fla", installed=installed)
    if common is not None:
        return common
    if env.accelerator == "rocm" and env.fla_tilelang_env is None:
        kw["env"] = (("FLA_TILELANG", "0"),)  # no tilelang on ROCm: fla must not try its tilelang backend
    transformers = env.version("transformers")
    if env.accelerator == "xpu" and transformers_era(transformers) in ("A", "B"):
        return _skip("fla", "fla.xpu.old-transformers",
                     f"transformers {transformers} uses fla on CUDA only (on XPU from 5.15)",
                     "upgrade transformers to >= 5.15", **kw)
    if env.triton is None:
        return _skip("fla", "fla.no-triton", "no triton: fla's kernels are triton programs and torch's triton is missing",
                     "install the triton your torch build depends on (pip install torch==<yours> reinstalls it)", **kw)

    hazards = ctx.hazards("fla")
    hz = hazards[0] if hazards else None
    tilelang_ok = tilelang.action in TILELANG_GOOD
    candidates = [rel for rel in pins.fla_releases
                  if _in(env.torch, rel.torch) and _in(env.triton, rel.triton)
                  and not (transformers and not _in(transformers, rel.transformers))
                  and not (hz is not None and not rel.tilelang_backend)]
    needs = ("tilelang",) if hz is not None else ()
    hazard_reason = (f"{hz.effect} ({hz.id}); tilelang: {tilelang.reason}") if hz is not None else ""

    if core:
        if hz is not None and not tilelang_ok:
            return Decision(kernel="fla", action=BLOCK, rule="fla.hazard.block", reason=hazard_reason,
                            fix=hz.fix, on_failure="block", **kw)
        known = next((r for r in pins.fla_releases if _same(r.version, core)), None)
        problems = []
        half = [d for d in _FLA_DISTS if d in env.half_installed and not ctx.fresh]
        if half:
            problems.append(f"{' and '.join(half)} half-installed (two .dist-info in one directory: an install was interrupted)")
        if layers and not _same(layers, core):
            problems.append(f"fla-core {core} and flash-linear-attention {layers} differ")
        incompatible = known is not None and not _in(env.triton, known.triton)
        if incompatible:
            problems.append(f"fla {core} does not import with triton {env.triton} (needs {known.triton})")
        unsafe = hz is not None and not _has_tilelang_backend(pins, core, known)
        if unsafe:
            problems.append(f"fla {core} has no tilelang backend, so its backward is wrong here ({hz.id})")
        if problems:
            chosen, steps, missing = _pick_fla(ctx, candidates, replace=True)
            if chosen is not None:
                return Decision(kernel="fla", action=REPAIR, rule="fla.repair", reason="; ".join(problems) +
                                f"; replacing with fla {chosen.version}", steps=steps,
                                target={"fla-core": chosen.version, "flash-linear-attention": chosen.version},
                                needs=needs, on_failure="block" if (unsafe or incompatible or hz) else "proceed", **kw)
            nothing = (f"offline, and FASTPATH_HOOKS_FIND_LINKS lacks {', '.join(missing)}" if missing
                       else "no known-good fla release fits here")
            if unsafe or incompatible:
                # Importing it would crash (or compute wrong gradients): fail closed, transformers keeps torch.
                rule = "fla.unsafe.block" if unsafe else "fla.incompatible.block"
                fix = f"install fla {pins.fla_releases[0].version} or newer" if unsafe else \
                    "add a fitting release's wheels to FASTPATH_HOOKS_FIND_LINKS or allow the index"
                return Decision(kernel="fla", action=BLOCK, rule=rule, reason="; ".join(problems) + f"; {nothing}",
                                fix=fix, on_failure="block", **kw)
            return Decision(kernel="fla", action=OK, rule="fla.ok.with-problems",
                            reason="; ".join(problems) + f"; {nothing}, leaving it as it is",
                            needs=needs, on_failure="block" if hz else "proceed", **kw)
        return Decision(kernel="fla", action=OK, rule="fla.ok",
                        reason=f"fla {core} installed" + (f"; needs tilelang here ({hz.id})" if hz else ""),
                        needs=needs, on_failure="block" if hz else "proceed", **kw)

    if hz is not None and not tilelang_ok:
        return _skip("fla", "fla.hazard.skip", hazard_reason + "; installing fla alone would turn the working torch path "
                     "into a crash", hz.fix, **kw)
    if not candidates:
        what = f"triton {env.triton}, torch {env.torch}" + (f", transformers {transformers}" if transformers else "")
        if hz is not None:
            what += f" with a tilelang backend ({hz.id})"
        return _skip("fla", "fla.no-release", f"no known-good fla release for {what}",
                     "add a release to a FASTPATH_HOOKS_PINS file", **kw)
    chosen, steps, missing = _pick_fla(ctx, candidates, replace=False)
    if chosen is None:
        return _skip("fla", "fla.offline-missing", f"offline, and FASTPATH_HOOKS_FIND_LINKS lacks {', '.join(missing)}",
                     "add the wheels (`fastpath-hooks download --dest DIR`) or allow the index", **kw)
    reason = f"fla {chosen.version} fits triton {env.triton}" + (f" and transformers {transformers}" if transformers else "")
    if hz is not None:
        reason += f"; together with tilelang ({hz.id})"
    return Decision(kernel="fla", action=INSTALL, rule="fla.install", reason=reason, steps=steps,
                    target={"fla-core": chosen.version, "flash-linear-attention": chosen.version}, needs=needs, **kw)


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
    steps.append(Step(kind="kernel", requirements=(f"fla-core=={version}", f"flash-linear-attention=={version}"),
                      no_deps=True, force=replace,
                      note="both distributions at one version, without their torch/transformers requirements"))
    return tuple(steps)


# -- causal-conv1d -------------------------------------------------------------------

def causal_conv1d_abi(env) -> str:
    """TRUE/FALSE for the wheel name. Unknown (torch not imported, or posed without abi=): PyPI's
    torch wheels use the cxx11 ABI from 2.7 on, the pre-cxx11 one before."""
    if env.cxx11_abi is not None:
        return "TRUE" if env.cxx11_abi else "FALSE"
    mm = _mm(env.torch)
    return "FALSE" if mm is not None and Version(mm) < Version("2.7") else "TRUE"


def causal_conv1d_wheel(env, pins) -> tuple[str | None, str]:
    """The release wheel's file name for this torch/CUDA/ABI/Python/arch, or (None, why not)."""
    rel = pins.causal_release
    if env.os != "linux":
        return None, f"release wheels are Linux-only (this is {env.os})"
    if not env.torch_cuda:
        return None, "release wheels are CUDA builds"
    cuda_major = env.torch_cuda.split(".")[0]
    torch_mm = _mm(env.torch)
    torch_mm = rel.torch_aliases.get(torch_mm, torch_mm)
    py = "".join(env.python.split(".")[:2])
    py_dotted = ".".join(env.python.split(".")[:2])
    abi = causal_conv1d_abi(env)
    for build in rel.builds:
        if (build["cuda_major"] == cuda_major and torch_mm in build["torch_mm"] and py_dotted in build["python"]
                and env.arch in build["arch"] and abi in build["abi"]):
            name = rel.filename.format(version=rel.version, cuda_major=cuda_major, torch_mm=torch_mm, abi=abi,
                                       py=py, arch=env.arch)
            return name, ""
    return None, (f"no prebuilt causal-conv1d {rel.version} wheel for torch {_mm(env.torch)} + CUDA {cuda_major} + "
                  f"cp{py} + {env.arch} (cxx11abi {abi})")


def _decide_causal(ctx: _Context) -> Decision:
    installed_v = ctx.installed("causal-conv1d")
    installed = {"causal-conv1d": installed_v} if installed_v else {}
    common = _common(ctx, "causal-conv1d", installed=installed)
    if common is not None:
        return common
    kw = {"installed": installed, "transformers_uses": _transformers_uses(ctx, "causal-conv1d")}
    half = installed_v is not None and "causal-conv1d" in ctx.env.half_installed
    if installed_v and not half:
        # A wrong-arch/ABI build can crash at import: checked once in a child process, blocked if it fails.
        return Decision(kernel="causal-conv1d", action=OK, rule="causal.ok", verify=True, on_failure="block",
                        reason=f"causal-conv1d {installed_v} installed (checked once in a child process: a wrong-arch "
                               "build can crash at import)", **kw)
    decision = _causal_install(ctx, kw)
    if not half:
        return decision
    what = f"causal-conv1d {installed_v} is half-installed (two .dist-info in one directory: an install was interrupted)"
    if decision.action == INSTALL:
        steps = tuple(_replace(s, force=True) if s.kind in ("wheel", "build") else s for s in decision.steps)
        return _replace(decision, action=REPAIR, rule="causal.repair.half-installed", steps=steps,
                        reason=f"{what}; reinstalling: {decision.reason}", on_failure="block")
    return Decision(kernel="causal-conv1d", action=OK, rule="causal.ok.half-installed", verify=True, on_failure="block",
                    reason=f"{what}; it cannot be reinstalled here ({decision.reason}); checked in a child process",
                    fix=decision.fix, **kw)


def _causal_install(ctx: _Context, kw) -> Decision:
    pins, env, settings = ctx.pins, ctx.env, ctx.settings
    spec = pins.kernel("causal-conv1d")
    build = pins.source_build
    minutes = build.expected_minutes
    deps = _deps_step(ctx, spec)
    dep_steps = (deps,) if deps is not None else ()
    if env.accelerator == "rocm":
        if not settings.allow_build:
            return _skip("causal-conv1d", "causal.rocm.no-build",
                         f"no prebuilt ROCm wheels; a source build takes about {minutes:.0f} minutes",
                         "set FASTPATH_HOOKS_ALLOW_BUILD=1 to build it (needs hipcc)", **kw)
        steps = dep_steps + (Step(kind="build", requirements=(build.requirement,), no_deps=True, binary_only=False,
                                  build_isolation=False, env=tuple(sorted(build.rocm_env.items())),
                                  note=f"source build, about {minutes:.0f} min"),)
        return _causal_build(ctx, steps, minutes, "causal.rocm.build", "ROCm source build (allowed by FASTPATH_HOOKS_ALLOW_BUILD)", kw)

    filename, why = causal_conv1d_wheel(env, pins)
    if filename is not None:
        rel = pins.causal_release
        base = settings.causal_conv1d_wheel_url or rel.base_url.format(tag=rel.tag)
        url = base.rstrip("/") + "/" + quote(filename)
        in_house = filename in env.wheelhouse
        missing = ctx.missing_offline(dep_steps)
        if settings.offline and not in_house:
            missing = [filename] + missing
        if not missing:
            steps = dep_steps + (Step(kind="wheel", requirements=(filename,), url=None if in_house else url,
                                      sha256=rel.sha256.get(filename),
                                      note="prebuilt release wheel" + (" from the wheelhouse" if in_house else "")),)
            return Decision(kernel="causal-conv1d", action=INSTALL, rule="causal.wheel",
                            reason=f"prebuilt wheel {filename}", steps=steps,
                            target={"causal-conv1d": rel.version}, **kw)
        if not settings.allow_build:
            return _skip("causal-conv1d", "causal.offline-missing",
                         f"offline, and FASTPATH_HOOKS_FIND_LINKS lacks {', '.join(missing)}",
                         "add the wheel (`fastpath-hooks download --dest DIR`) or allow the network", **kw)
        why = f"offline, and FASTPATH_HOOKS_FIND_LINKS lacks {', '.join(missing)}"
    if not settings.allow_build:
        return _skip("causal-conv1d", "causal.no-wheel", f"{why}; a source build takes about {minutes:.0f} minutes "
                     "(not started silently)", "set FASTPATH_HOOKS_ALLOW_BUILD=1 to build from source (needs nvcc)", **kw)
    if not env.nvcc:
        return _skip("causal-conv1d", "causal.no-nvcc", f"{why}, and a source build needs nvcc, which is not found",
                     "install a CUDA toolkit matching torch", **kw)
    steps = dep_steps + (Step(kind="build", requirements=(build.requirement,), no_deps=True, binary_only=False,
                              build_isolation=False, env=tuple(sorted(build.env.items())),
                              note=f"source build against the installed torch, about {minutes:.0f} min"),)
    return _causal_build(ctx, steps, minutes, "causal.build", f"{why}; source build allowed by FASTPATH_HOOKS_ALLOW_BUILD", kw)


def _causal_build(ctx, steps, minutes, rule, reason, kw) -> Decision:
    missing = ctx.missing_offline(steps)
    if missing:
        return _skip("causal-conv1d", "causal.offline-missing", f"offline, and FASTPATH_HOOKS_FIND_LINKS lacks {', '.join(missing)}",
                     "add the sdist and wheels or allow the index", **kw)
    version = Requirement(ctx.pins.source_build.requirement).specifier
    target = {"causal-conv1d": str(next(iter(version)).version)} if len(version) == 1 else {}
    return Decision(kernel="causal-conv1d", action=INSTALL, rule=rule, reason=reason + f" (about {minutes:.0f} min)",
                    steps=steps, target=target, expected_seconds=minutes * 60, **kw)


# -- what transformers does with a kernel ---------------------------------------------

def transformers_era(version: str | None) -> str | None:
    v = _parse(version)
    if v is None:
        return None
    if v >= Version("5.15"):
        return "C"
    if v >= Version("5.0"):
        return "B"
    return "A"


def _transformers_uses(ctx: _Context, kernel: str) -> str:
    env = ctx.env
    version = env.version("transformers")
    era = transformers_era(version)
    if era is None:
        return "transformers is not installed"
    if kernel == "tilelang":
        return "not directly: fla uses it for its Hopper backward"
    module = "fla" if kernel == "fla" else "causal_conv1d"
    if era == "C":
        return (f"transformers {version} (era C) uses it whenever `import {module}` succeeds when a modeling module is "
                "imported (no device check)")
    devices = ("cuda", "rocm")
    if kernel == "fla" and Version(version) >= Version("5.15"):
        devices = devices + ("xpu",)
    yes = env.accelerator in devices
    return (f"transformers {version} (era {era}) asks is_{'flash_linear_attention' if kernel == 'fla' else 'causal_conv1d'}"
            f"_available(): {'yes' if yes else 'no'} on this {'accelerator' if env.accelerator else 'machine (no accelerator)'}")
