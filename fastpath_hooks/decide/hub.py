"""Hub kernels (transformers 5.25+ with HF `kernels`): which source serves each function or layer of
transformers' kernel mapping on this machine - the hub's kernel, or, with its entry dropped from the
mapping, what the decorated function chose at the modeling import: the package or the torch path.

Pure: the entries (read from the installed transformers' mapping), where each one's kernel can be
loaded from (LOCAL_KERNELS, the kernels cache, the hub - or nowhere, offline), the machine and the pins
in; one `HubChoice` per entry out. The same rules as for the packages: a hazard of the kernel a hub
function replaces (fla#640 on Hopper) refuses it unless the hub's build carries the remedy (pins
`hub.backends`); a build known to be broken (pins `hub.broken`) is refused; a kernel that cannot be
loaded here is never asked for (transformers would raise ValueError offline).
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

from .._names import DECORATED, KERNEL_MODULES
from ..facts.probe import HubEntry, ONLINE, Where
from .plan import BLOCK, INSTALL, OK, REPAIR

@dataclass(frozen=True)
class HubChoice:
    entry: HubEntry
    serve: bool               # True: the hub's kernel serves it (kept in the mapping)
    reason: str               # short, for the line, doctor and --json
    where: str = ""           # LOCAL / CACHE / ONLINE when served
    refused: bool = False     # not served because a rule (a hazard, a broken build, a failed check) forbids it

    @property
    def source(self) -> str:
        """`hub kernels-community/fla@v3` (where it is served from), or what serves instead."""
        if self.serve:
            return f"hub {self.entry.ref}" + (f" ({self.where})" if self.where != ONLINE else "")
        return "package or torch"


def choose(entries, *, env, pins, where: dict, hazards) -> tuple:
    """One HubChoice per entry. `where`: repo ref -> Where; `hazards`: kernel -> the pins' hazards that apply
    here (decide/common.Context.hazards)."""
    out = []
    for entry in entries:
        place = where.get(entry.ref) or Where("", "not looked up")
        if not place.how:
            out.append(HubChoice(entry, False, place.detail))
            continue
        refused = _refusal(env, entry, pins, hazards)
        if refused:
            out.append(HubChoice(entry, False, refused, refused=True))
            continue
        out.append(HubChoice(entry, True, f"from {place.detail or place.how}" if place.how != ONLINE else "online",
                             place.how))
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
    """A release's version in a range, its local label and pre-release ignored (torch 2.10.0+cu130 is 2.10)."""
    if version is None:
        return False
    return spec.contains(Version(version.base_version), prereleases=True)


def served_kernels(choices) -> dict:
    """kernel -> the hub refs that serve ALL of its functions in the mapping (a package install is not
    needed for it where transformers kernelizes the model)."""
    by_kernel: dict = {}
    for c in choices:
        if c.entry.kernel is not None:
            by_kernel.setdefault(c.entry.kernel, []).append(c)
    return {k: tuple(sorted({c.entry.ref for c in cs})) for k, cs in by_kernel.items() if all(c.serve for c in cs)}


def hub_serves(ctx, kernel: str) -> tuple:
    """The hub refs that serve every function of `kernel` in transformers' mapping here (the probe's facts:
    Environment.hub_entries / hub_where), () when the hub does not serve it all - then its package does."""
    env = ctx.env
    rows = [HubEntry(*row) for row in env.hub_entries if row[5] == kernel]
    if not rows:
        return ()
    where = {ref: Where(*pair) for ref, pair in env.hub_where.items()}
    return served_kernels(choose(rows, env=env, pins=ctx.pins, where=where, hazards=ctx.hazards)).get(kernel, ())


def sources(plan, pins, hazards) -> list:
    """What serves each function transformers decorates for the managed kernels here: `hub <repo>@v<N>`,
    `package <dist> <version>`, or `torch`, with the reason (doctor, plan, --json). The hub where the probe
    read transformers 5.25+'s mapping (its entries and where they load from), else the kernel's decision."""
    env = plan.environment
    where = {ref: Where(*pair) for ref, pair in env.hub_where.items()}
    rows = [HubEntry(*row) for row in env.hub_entries]
    hub = {c.entry.name: c for c in choose(rows, env=env, pins=pins, where=where, hazards=hazards)}
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
