"""What the installed transformers does with the kernels (pure): its era, the packed-sequence failures, and
which hub kernels serve in era D.

Eras (transformers-eras.md): A 4.x, plain gates; B 5.0 - 5.14, cached gates; C 5.15 - 5.24, no gate: a kernel
function is chosen once, at the modeling import, by whether `import <module>` succeeds; D 5.25+, as C, and
from_pretrained on a GPU replaces the decorated functions with hub kernels (HF `kernels`). A pre-release is its
release's era. A hub kernel is refused where a hazard applies that its build has no remedy for (pins `hub`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import Version

from .._names import DECORATED, KERNEL_MODULES
from ..facts.probe import HubEntry, ONLINE, Where
from .plan import BLOCK, INSTALL, OK, REPAIR, installer_choice


def era(version) -> str | None:
    """A / B / C / D for a transformers version (text or a packaging Version); None for none or one before 4."""
    major_minor = _release(version)
    if major_minor is None or major_minor[0] < 4:
        return None
    if major_minor[0] == 4:
        return "A"
    if major_minor < (5, 15):
        return "B"
    return "C" if major_minor < (5, 25) else "D"


def _release(version) -> tuple | None:
    """(major, minor) of a packaging Version or a version's text (`5.15.0rc1`, `5rc1`); None when unreadable."""
    if hasattr(version, "release"):
        return (tuple(version.release) + (0,))[:2]
    match = re.match(r"(\d+)(?:\.(\d+))?", str(version or "").strip())
    return (int(match[1]), int(match[2] or 0)) if match else None


def uses(env, pins, kernel: str) -> str:
    """Whether and how the installed transformers uses `kernel` here (a decision's `transformers_uses`)."""
    version = env.version("transformers")
    if version is None:
        return "transformers is not installed"
    spec = pins.kernel(kernel)
    if spec.serves:
        why = sorted({h.id for h in pins.hazards if h.needs == kernel})
        where = f" (where {', '.join(why)} applies)" if why else ""
        return f"not directly: {' and '.join(spec.serves)} uses it{where}"
    module = spec.module
    if not spec.gates:
        return f"no transformers gate names it: whatever imports `{module}` uses it"
    which = era(env.dist_version("transformers"))
    if which is None:
        return f"transformers {version} is older than the eras fastpath-hooks knows (4.x and later)"
    if which == "C":
        return (f"transformers {version} (era C) imports {module} with a modeling module and uses it whenever "
                "that import succeeds, GPU or not")
    if which == "D":
        return (f"transformers {version} (era D) imports {module} with a modeling module and uses it for GPU inputs "
                "where no hub kernel replaces it (from_pretrained on a GPU asks the hub first)")
    yes = env.accelerator in ("cuda", "rocm")  # A/B gate on CUDA (ROCm torch says CUDA); XPU from 5.15 = era C
    where = "accelerator" if env.accelerator else "machine (no accelerator)"
    gates = " / ".join(f"{g}()" for g in spec.gates)
    also = f", which also need {' and '.join(spec.with_kernels)}" if spec.with_kernels else ""
    return f"transformers {version} (era {which}) asks {gates}{also}: {'yes' if yes else 'no'} on this {where}"


def packed_sequences(plan, settings, pins, *, enabled: bool) -> dict:
    """{"transformers", "raises", "failures": [...]}: transformers 5.20+ raises ValueError when cu_seqlens reaches a
    kernel function on its torch path (pins `packed_sequences`). `enabled`: we run at interpreter start here."""
    facts = pins.packed_sequences
    env = plan.environment
    parsed = env.dist_version("transformers")   # a 5.25 dev build raises too: pre-releases count
    raises = facts is not None and parsed is not None and facts.transformers.contains(parsed, prereleases=True)
    failures = [dict(failure, package=p.kernel or p.distribution, kernel=p.kernel, models=list(p.models))
                for p in (facts.packages if raises else ()) if (failure := _failure(p, plan, settings, enabled))]
    return {"transformers": env.version("transformers"), "raises": raises, "failures": failures}


def _failure(package, plan, settings, enabled: bool) -> dict | None:
    kernel, dist = package.kernel, package.distribution
    if kernel is None:   # a distribution fastpath-hooks does not manage: only whether it is installed
        return None if plan.environment.version(dist) else {
            "action": None, "problem": f"{dist} is not installed (fastpath-hooks does not manage it)",
            "fix": f"install {dist} (pip install {dist})"}
    decision = plan.decisions.get(kernel)
    if decision is None or decision.action == OK:
        return None
    action = decision.action
    if action not in (INSTALL, REPAIR):
        verb = "blocked" if action == BLOCK else "left alone"
        return {"action": action, "problem": f"{kernel} is {verb} here: {decision.reason}",
                "fix": decision.fix or "none on this machine"}
    what = f"{action} " + ", ".join(f"{k}=={v}" for k, v in decision.target.items())
    if action == REPAIR:
        problem = f"{kernel} is broken here: {decision.reason}"
    elif decision.installed:
        have = ", ".join(f"{k} {v}" for k, v in decision.installed.items())
        problem = f"{kernel} {have} is not usable here: {decision.reason}"
    else:
        problem = f"{kernel} is not installed"
    if settings.mode == "report":
        return {"action": action, "problem": problem + " and FASTPATH_HOOKS_MODE=report installs nothing",
                "fix": f"unset FASTPATH_HOOKS_MODE: fastpath-hooks would then {what}"}
    installer, why = installer_choice(settings, plan.environment)
    if installer is None:   # no command of ours can do it here: the fix is what lets one run
        return {"action": action, "problem": problem + ", and no installer can run here",
                "fix": f"{why}; fastpath-hooks would then {what}"}
    if enabled:
        return None  # done at the first import, before transformers needs it
    return {"action": action, "problem": problem,
            "fix": f"fastpath-hooks would {what} at the first import once active: `fastpath-hooks enable` "
                   f"(or fastpath_hooks.install() in the script); `fastpath-hooks install {kernel}` does it now"}


# -- hub kernels (era D) ------------------------------------------------------------------------------

@dataclass(frozen=True)
class HubChoice:
    entry: HubEntry
    serve: bool               # True: the hub's kernel serves it (kept in the mapping)
    reason: str               # short, for the line, doctor and --json
    where: str = ""           # LOCAL / CACHE / ONLINE when served
    refused: bool = False     # not served because a rule (a hazard, a broken build, a failed check) forbids it

    @property
    def source(self) -> str:   # `hub kernels-community/fla@v3 (cache)`, or what serves instead
        if self.serve:
            return f"hub {self.entry.ref}" + (f" ({self.where})" if self.where != ONLINE else "")
        return "package or torch"


def choose(entries, *, env, pins, where: dict, hazards) -> tuple:
    """One HubChoice per entry. `where`: repo ref -> Where; `hazards`: Context.hazards."""
    out = []
    for entry in entries:
        place = where.get(entry.ref) or Where("", "not looked up")
        refused = _refusal(env, entry, pins, hazards) if place.how else ""
        if place.how and not refused:
            said = f"from {place.detail or place.how}" if place.how != ONLINE else "online"
            out.append(HubChoice(entry, True, said, place.how))
        else:
            out.append(HubChoice(entry, False, refused or place.detail, refused=bool(refused)))
    return tuple(out)


def _refusal(env, entry: HubEntry, pins, hazards) -> str:
    """Why a rule forbids this entry's hub kernel here ("" when none does)."""
    hub = pins.hub
    if entry.kernel is not None and entry.kernel in pins.kernels:
        remedies = hub.backends.get(entry.repo_id, ())
        for hz in hazards(entry.kernel):
            if hz.needs not in remedies:
                gpus = "+".join(g for g in env.gpus if g in hz.gpu)
                return f"{hz.id} on {gpus} + triton {env.triton}: it has no {hz.needs} backend"
    for bad in hub.broken:
        if bad.repo != entry.repo_id or (bad.version is not None and bad.version != entry.version):
            continue
        if bad.gpu and not any(g in bad.gpu for g in env.gpus):
            continue
        if bad.torch is not None and not _within(env.torch_version, bad.torch):
            continue
        if bad.cuda is not None and not _within(env.cuda_version, bad.cuda):
            continue
        return f"{entry.ref} {bad.effect} on {'+'.join(g for g in env.gpus if not bad.gpu or g in bad.gpu)} ({bad.id})"
    return ""


def _within(version, spec) -> bool:
    """Its local label and pre-release ignored (torch 2.10.0+cu130 is 2.10)."""
    return version is not None and spec.contains(Version(version.base_version), prereleases=True)


def served_kernels(choices) -> dict:
    """kernel -> the hub refs that serve ALL of its functions in the mapping (then no package install is needed)."""
    by_kernel: dict = {}
    for c in choices:
        if c.entry.kernel is not None:
            by_kernel.setdefault(c.entry.kernel, []).append(c)
    return {k: tuple(sorted({c.entry.ref for c in cs})) for k, cs in by_kernel.items() if all(c.serve for c in cs)}


def hub_serves(ctx, kernel: str) -> tuple:
    """The hub refs that serve every function of `kernel` here; () when its package does."""
    return served_kernels(_choices(ctx.env, ctx.pins, ctx.hazards, kernel)).get(kernel, ())


def _choices(env, pins, hazards, kernel=None) -> tuple:
    """The probe's hub entries (`kernel`'s, else all), chosen by where they load from."""
    rows = [HubEntry(*row) for row in env.hub_entries if kernel is None or row[5] == kernel]
    where = {ref: Where(*pair) for ref, pair in env.hub_where.items()}
    return choose(rows, env=env, pins=pins, where=where, hazards=hazards)


def sources(plan, pins, hazards) -> list:
    """What serves each decorated function of the managed kernels here: `hub <repo>@v<N>`, `package <dist>
    <version>` or `torch`, with the reason (doctor, plan, --json)."""
    hub = {c.entry.name: c for c in _choices(plan.environment, pins, hazards)}
    out = []
    for func, package in dict.fromkeys(DECORATED.values()):
        kernel = KERNEL_MODULES.get(package)
        decision = plan.decisions.get(kernel)
        if decision is None:
            continue
        choice = hub.get(func)
        if choice is not None and choice.serve:
            out.append({"function": func, "kernel": kernel, "source": choice.source,
                        "reason": "from_pretrained on the GPU takes it from the hub"})
            continue
        dist = pins.kernel(kernel).distributions[0]
        version = decision.target.get(dist) or decision.installed.get(dist)
        said = decision.short_reason or decision.reason
        if decision.action in (OK, INSTALL, REPAIR) and version:
            source, why = f"package {dist} {version}", said
        elif decision.action == BLOCK:
            source, why = "torch", f"{kernel} blocked: {said}"
        else:
            source, why = "torch", f"{kernel}: {said}"
        if choice is not None:
            why = f"not from {choice.entry.ref}: {choice.reason}; {why}"
        out.append({"function": func, "kernel": kernel, "source": source, "reason": why})
    return out
