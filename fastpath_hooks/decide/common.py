"""What every kind's rules share: the decision context, version tests, the shared skip rules, the common steps."""

from __future__ import annotations

from functools import cached_property, lru_cache

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import InvalidSdistFilename, parse_sdist_filename
from packaging.version import InvalidVersion, Version

from ..events import MAX_LINE, PREFIX
from ..facts.distributions import canonical_name
from ..facts.environment import parse_version
from ..facts.memory import torch_build
from ..facts.pins import same_version
from ..facts.wheels import parse_wheel
from . import messages as rule_ids
from .messages import public
from .plan import BLOCK, Decision, INSTALL, OK, OnFailure, REPAIR, SKIP, Step, StepKind
from .transformers import hub_serves, uses

USABLE = (OK, INSTALL, REPAIR)   # a decision after which the kernel is there to use
HALF_INSTALLED = "half-installed: two .dist-info in one directory, an install was interrupted"
# skips that leave an installed kernel alone even under a hazard: asked for, or nothing can run it here
NOT_OURS = ("skip.user", "skip.no-torch", "skip.no-accelerator")


class Context:
    """One decision's inputs, and what is derived from them once."""

    def __init__(self, env, settings, pins, fresh):
        self.env, self.settings, self.pins, self.fresh = env, settings, pins, fresh

    def installed(self, dist: str) -> str | None:
        name = canonical_name(dist)
        if self.fresh and any(name in k.distributions for k in self.pins.kernels.values()):
            return None
        return self.env.version(name)

    def installed_of(self, kernel: str) -> dict:
        """distribution -> version, for the kernel's distributions that are installed."""
        return {d: v for d in self.pins.kernel(kernel).distributions if (v := self.installed(d))}

    def hazards(self, kernel: str) -> list:
        env = self.env
        if env.triton is None or env.accelerator is None:
            return []
        return [hz for hz in self.pins.hazards if hz.kernel == kernel and any(g in hz.gpu for g in env.gpus)
                and in_closed(env.triton_version, hz.triton)]

    def rule(self, kernel: str, suffix: str) -> str:
        return rule_ids.rule_id(self.pins, kernel, suffix)

    def kw(self, kernel: str, installed: dict) -> dict:
        """What every decision of `kernel` carries."""
        return {"installed": installed, "transformers_uses": uses(self.env, self.pins, kernel)}

    def skip(self, kernel: str, suffix: str, reason: str, fix: str = "", **kw) -> Decision:
        return Decision(kernel=kernel, action=SKIP, reason=reason, rule=self.rule(kernel, suffix), fix=fix, **kw)

    @cached_property
    def housed(self) -> tuple:
        """(name -> versions of its files, name -> versions of its sdists) in FASTPATH_HOOKS_FIND_LINKS."""
        files: dict = {}
        sdists: dict = {}
        for filename in self.env.wheelhouse:
            wheel = parse_wheel(filename) if filename.endswith(".whl") else None
            try:
                name, version = (wheel.distribution, wheel.version) if wheel else parse_sdist_filename(filename)
            except (InvalidSdistFilename, InvalidVersion):
                continue
            for out in (files,) if wheel else (files, sdists):
                out.setdefault(canonical_name(name), set()).add(version)
        return files, sdists

    def missing_offline(self, steps) -> list:
        """Requirements no wheelhouse file satisfies when the index is off."""
        if not self.settings.offline:
            return []
        files, sdists = self.housed
        missing = []
        for step in steps:
            for raw in step.requirements:
                if step.kind == StepKind.WHEEL:
                    if raw not in self.env.wheelhouse:
                        missing.append(raw)
                    continue
                req, _ = requirement(raw)
                name = canonical_name(req.name)
                if step.kind == StepKind.DEPS and self.installed_satisfies(req):
                    continue
                if req.url:   # a build from a URL (flash-attn-3's repository): only a local file is there offline
                    if not req.url.startswith("file:"):
                        missing.append(raw)
                    continue
                versions = (sdists if step.kind == StepKind.BUILD else files).get(name, set())
                if not any(req.specifier.contains(v, prereleases=True) for v in versions):
                    missing.append(raw)
            for raw in step.helpers:   # a build's: wheels, installed into its own directory
                req, _ = requirement(raw)
                if not any(req.specifier.contains(v, prereleases=True) for v in files.get(canonical_name(req.name), ())):
                    missing.append(raw)
        return missing

    def installed_satisfies(self, req: Requirement) -> bool:
        return within(self.env.dist_version(req.name), req.specifier)


# -- versions ---------------------------------------------------------------------------------

def within(version, spec) -> bool:
    """`version` (a Version or text) in `spec`, pre-releases included; a local label (+cu130) is ignored against
    a specifier without one, as PEP 440 says."""
    v = parse(version)
    return v is not None and spec.contains(v, prereleases=True)


def in_closed(version, spec) -> bool:
    """`version` in `spec`, failing closed for a safety range: a pre/dev release also counts when its release is
    inside the bounds taken as closed (PEP 440 puts 3.7.1rc1 outside `<3.7.1`, yet it is close to 3.7.1's code)."""
    if within(version, spec):
        return True
    v = parse(version)
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


def parse(version) -> Version | None:
    if isinstance(version, Version):
        return version
    if not version:
        return None
    return parse_version(str(version))


@lru_cache(maxsize=None)
def requirement(raw: str) -> tuple:
    """(the Requirement without its marker, the marker or None), parsed once per process."""
    req = Requirement(raw)
    marker, req.marker = req.marker, None
    return req, marker


def major_minor(version) -> str | None:
    v = parse(version)
    return None if v is None else f"{v.major}.{v.minor}"


def has_backend(spec, version: str, backend: str) -> bool:
    """Release `version` has this backend (pins `backends`); an unpinned one from the oldest pinned that has it."""
    known = next((r for r in spec.releases if same_version(r.version, version)), None)
    if known is not None:
        return backend in known.backends
    with_it = [Version(r.version) for r in spec.releases if backend in r.backends]
    try:
        return bool(with_it) and Version(version) >= min(with_it)
    except InvalidVersion:
        return False


# -- what every kernel shares -----------------------------------------------------------------------

def no_accelerator_reason(env) -> str:
    if env.torch is None:
        return "torch is not installed, so there is no accelerator to use kernels on"
    reason = no_accelerator_short(env)["no_gpu"]
    if env.torch_build == "CPU" and env.gpu_source == "target" and env.gpus:   # a posed GPU, this host's CPU torch
        gpus = "+".join(env.gpus)
        return f"{reason}; to pose a machine with {gpus}, add its torch build: cuda=..., hip=... or xpu=yes"
    return reason if env.torch_build == "CPU" or env.gpus else f"{reason}; {env.gpu_source}"


def no_accelerator_short(env) -> dict:
    """The short form of `no_accelerator_reason` (facts `no_gpu`, `no_gpu_fix` of skip.no-accelerator)."""
    fix = "run on a machine with a CUDA or XPU GPU"
    if env.torch_build == "CPU":
        posed = env.gpu_source == "target" and env.gpus
        return {"no_gpu": f"no CUDA/XPU accelerator: torch {env.torch} is a CPU build",
                "no_gpu_fix": f"to pose {'+'.join(env.gpus)}, add cuda=X.Y, hip=X.Y or xpu=yes" if posed else fix}
    no_gpu = f"no {env.torch_build.split()[0]} accelerator: torch {env.torch} ({env.torch_build})"   # CUDA/ROCm/XPU
    if env.gpus:
        return {"no_gpu": f"{no_gpu} cannot use {'+'.join(env.gpus)}",
                "no_gpu_fix": "install a torch build for these GPUs"}
    return {"no_gpu": f"{no_gpu} sees no device", "no_gpu_fix": fix}


def versions_here(env) -> str:
    """`torch 2.10.0, triton 3.6.0, transformers 5.24.0`: what a pinned release is chosen by."""
    transformers = env.version("transformers")
    return (f"torch {public(env.torch)}, triton {public(env.triton)}" +
            (f", transformers {public(transformers)}" if transformers else ""))


def shared_skip(ctx: Context, kernel: str, *, installed: dict) -> Decision | None:
    """The skip rules every kernel shares (`skip.*`), in order."""
    env, settings = ctx.env, ctx.settings
    spec = ctx.pins.kernel(kernel)
    kw = ctx.kw(kernel, installed)

    def skip(suffix, reason, fix="", facts=None):
        return Decision(kernel=kernel, action=SKIP, reason=reason, rule=rule_ids.rule_id(ctx.pins, None, suffix),
                        fix=fix, facts=facts or {}, **kw)

    if kernel in settings.skip:
        return skip("user", "skipped by FASTPATH_HOOKS_SKIP", f"remove {kernel} from FASTPATH_HOOKS_SKIP")
    if env.torch is None:
        return skip("no-torch", "torch is not installed", "install torch first")
    if env.accelerator is None:
        return skip("no-accelerator", no_accelerator_reason(env) + f"; {kernel} runs on GPUs only",
                    "run on a machine with a CUDA (or XPU) GPU and a matching torch build", no_accelerator_short(env))
    if not within(env.python_version, spec.python):
        return skip("python", f"Python {env.python} is outside {kernel}'s support ({spec.python})",
                    f"use Python {spec.python}")
    if env.platform not in spec.platforms:
        return skip("platform", f"no {kernel} builds for {env.platform} (supported: {', '.join(spec.platforms)})")
    glibc_spec = spec.glibc.get(env.arch)
    if glibc_spec and env.glibc and not within(env.glibc_version, SpecifierSet(glibc_spec)):
        return skip("glibc", f"{kernel} wheels for {env.arch} need glibc {glibc_spec}; this system has {env.glibc}")
    if not within(env.torch_version, spec.torch):
        return skip("torch", f"torch {env.torch} is outside {kernel}'s support ({spec.torch})",
                    f"use torch {spec.torch}")
    if env.accelerator not in spec.accelerators:
        name = rule_ids.ACCELERATOR_NAMES.get(env.accelerator, env.accelerator.upper())
        return skip(f"accelerator.{env.accelerator}", f"{kernel} does not support {name}")
    served = () if ctx.fresh else hub_serves(ctx, kernel)
    if served:   # transformers 5.25+: from_pretrained on this GPU takes all its functions from the hub
        return skip("hub", f"transformers takes {kernel}'s functions from the hub here ({', '.join(served)}): "
                    "from_pretrained on the GPU replaces them with its kernels, so no package is installed",
                    "set USE_HUB_KERNELS=0 to keep the hub out and install the package",
                    facts={"hub": ", ".join(served)})
    return None


def missing_import(ctx: Context, kernel: str, kw) -> Decision | None:
    """A protected distribution the kernel's import imports (pins `imports_installed`), never ours to install,
    is missing."""
    env, spec = ctx.env, ctx.pins.kernel(kernel)
    for name in spec.imports_installed:
        have = env.triton if name == "triton" else env.version(name)
        if have is None:
            fix = ("install the triton your torch build depends on (pip install torch==<yours> reinstalls it)"
                   if name == "triton" else f"install {name}")
            short_fix = "reinstall your torch, which brings it" if name == "triton" else f"install {name}"
            return ctx.skip(kernel, f"no-{name}", f"no {name}: `import {spec.module}` imports it", fix,
                            facts={"import": name, "import_fix": short_fix}, **kw)
    return None


def fetch_fix(what: str, source: str = "the index") -> str:
    return f"fetch {what} with `fastpath-hooks download --dest DIR` into FASTPATH_HOOKS_FIND_LINKS, or allow {source}"


def lacking(ctx: Context, wanted, besides=None) -> tuple:
    """The requirements of `wanted` this machine lacks or has too old (one satisfied is neither named nor backed
    up; a fresh plan names them all), their markers evaluated, those `besides` (a step) names left out."""
    env = ctx.env
    named = set(besides.names) if besides is not None else set()
    marker_env = {"python_version": ".".join(env.python.split(".")[:2]), "python_full_version": env.python,
                  "sys_platform": {"windows": "win32"}.get(env.os, env.os), "platform_machine": env.arch,
                  "platform_system": {"linux": "Linux", "darwin": "Darwin", "windows": "Windows"}.get(env.os, env.os)}
    return tuple(str(req) for req, marker in map(requirement, wanted)
                 if (marker is None or marker.evaluate(marker_env)) and canonical_name(req.name) not in named
                 and (ctx.fresh or not ctx.installed_satisfies(req)))


def deps_step(ctx: Context, spec) -> Step | None:
    """The runtime dependencies this machine lacks or has too old, or None."""
    reqs = lacking(ctx, spec.runtime_deps)
    if not reqs:
        return None
    return Step(kind=StepKind.DEPS, requirements=reqs, no_deps=False,
                note="runtime dependencies, resolved under a constraints file that pins torch, triton, numpy and "
                     "transformers")


def kernel_steps(ctx: Context, spec, version: str, note: str, *, force: bool = False) -> tuple:
    """The dependencies this machine lacks, then the kernel's distributions at `version`, --no-deps."""
    deps = deps_step(ctx, spec)
    return ((deps,) if deps is not None else ()) + (
        Step(kind=StepKind.KERNEL, requirements=tuple(f"{d}=={version}" for d in spec.distributions), no_deps=True,
             force=force, note=note),)


def first_installable(ctx: Context, releases, steps_of) -> tuple:
    """(release, its steps, ()) for the first of `releases` installable here, else (None, (), the first's lack)."""
    first_missing = ()
    for rel in releases:
        planned = steps_of(rel.version)
        missing = ctx.missing_offline(planned)
        if not missing:
            return rel, planned, ()
        first_missing = first_missing or tuple(missing)
    return None, (), first_missing


def served_hazards(ctx: Context, kernel: str) -> list:
    """The hazards on this machine of the kernels `kernel` serves that need it (fla#640 needs tilelang)."""
    spec = ctx.pins.kernel(kernel)
    return [h for served in spec.serves for h in ctx.hazards(served) if h.needs == kernel]


NUMERIC_FIX = ("pin a release that fixes it (FASTPATH_HOOKS_PINS), or delete <cache>/numeric/<kernel>.json to "
               "check again")


def numeric_block(ctx: Context, kernel: str, decision: Decision) -> Decision:
    """A release whose numbers were measured wrong on a visible GPU under this torch build (act/numeric.py's
    records) is blocked there, whatever else was decided."""
    if decision.action not in USABLE or not ctx.env.numeric_failures or not ctx.pins.kernel(kernel).checks_numbers:
        return decision
    dist = ctx.pins.kernel(kernel).distributions[0]
    version = decision.target.get(dist) or decision.installed.get(dist)
    build = torch_build(ctx.env)
    for k, measured, arch, torch_key, detail, path in ctx.env.numeric_failures:
        if k != kernel or arch not in ctx.env.gpus or torch_key != build or not _same_public(measured, version):
            continue
        return Decision(kernel=kernel, action=BLOCK, rule=ctx.rule(kernel, "block.numeric"), on_failure=OnFailure.BLOCK,
                        reason=detail,   # the measured error, as the check said it (for `measured` under `build`)
                        fix=NUMERIC_FIX.replace("<cache>/numeric/<kernel>.json", path), installed=decision.installed,
                        facts={"measured": numeric_measured(kernel, detail, arch)},
                        transformers_uses=decision.transformers_uses)
    return decision


def numeric_measured(kernel: str, detail: str, arch: str) -> str:
    """The measured error as the line says it: whole when it fits, else without its tolerance, else where."""
    room = MAX_LINE - len(PREFIX) - len(f"{kernel}: blocked - ") - len(f" ({rule_ids.NUMERIC_SHORT_FIX})")
    measure = detail.split(" (tolerance")[0]
    said = (detail, measure, measure.replace(" from torch by ", " by "), f"its numbers were measured wrong on {arch}")
    return next((s for s in said if len(s) <= room), f"its numbers are wrong on {arch}")


def _same_public(a, b) -> bool:
    va, vb = parse(a), parse(b)
    return va is not None and vb is not None and va.public == vb.public
