"""Every rule id the policy can emit, declared once with its severity and its short form, and the one-line
human form of a decision. The engine reads severities and needs from here, never from the id's text.

An id is `<scope>.<suffix>`: `skip` for the rules every kernel shares, else the kernel's `rule_prefix` and a
suffix declared for its kind; `{accelerator}`, `{with}` and `{import}` expand from the kernel's data. `line` and
`fix` templates take their slots from `slots` and the decision's `facts`; `[...]` is kept only when every slot in
it has a value. The line says `<kernel>: <outcome> - <short reason> (<short fix>)`; doctor and plan keep the whole.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, replace

from ..events import MAX_LINE, PREFIX, Severity, first_fitting, minutes
from ..facts.pins_values import ACCELERATORS
from .plan import target_of


NVCC_RELEASE = "nvcc-release"   # needs nvcc's CUDA release: asked for (`nvcc --version`), then decided again
SHARED_SCOPE = "skip"


@dataclass(frozen=True)
class Rule:
    """One rule id's severity, needs and short form; what each decides is docs/decisions.md's table."""
    severity: Severity            # how its outcome is said: status, warning or error
    needs: frozenset = frozenset()   # NVCC_RELEASE
    machine_wide: bool = False    # said once for the machine and every kernel (no torch, no accelerator)
    engine: bool = False          # made by the engine (the repair of a failed check), not by a rule
    requires: tuple = ()          # KernelSpec fields that must be set for a kernel to get it (releases, switch)
    accelerator: str | None = None   # only a kernel that supports this accelerator gets it (rocm: hipcc builds)
    release: bool = False         # only a kernel with release wheels pinned gets it
    warm: bool = True             # a good outcome is remembered for the next start (False: decided again at each)
    line: str | None = None       # the short form (None: not written yet - tests/test_lines.py names the rule)
    fix: str | None = None


_S, _W = Severity.STATUS, Severity.WARNING

FETCH = "fastpath-hooks download gets them"
PINS_FILE = "add one via FASTPATH_HOOKS_PINS"
AHEAD = "ahead of time: fastpath-hooks build {kernel}"

NUMERIC_SHORT_FIX = "pin a good release: fastpath-hooks doctor"
OFFLINE = "offline; FASTPATH_HOOKS_FIND_LINKS lacks {missing}"
# rules of several kinds
COMMON = {
    "block.numeric": Rule(_W, requires=("checks_numbers",), line="{measured}", fix=NUMERIC_SHORT_FIX),
    "no-{import}": Rule(_S, line="no {import}, which `import {module}` imports", fix="{import_fix}"),
}
# an opt-in CUDA extension (pins: source_build.cuda_switch): a build without it is good for the families in use
# only, so never a warm verdict
_SWITCH = ("cuda_switch",)

SHARED = {
    "user": Rule(_S, line="in FASTPATH_HOOKS_SKIP[; {served} needs it for {hazard}]",
                 fix="remove {kernel} from FASTPATH_HOOKS_SKIP"),
    "no-torch": Rule(_S, machine_wide=True, line="torch is not installed", fix="install torch first"),
    "no-accelerator": Rule(_S, machine_wide=True, line="{no_gpu}", fix="{no_gpu_fix}"),
    "python": Rule(_S, line="Python {python} is outside its support ({spec_python})", fix="use Python {spec_python}"),
    "platform": Rule(_S, line="no builds for {platform}", fix="use {spec_platforms}"),
    "glibc": Rule(_S, line="its {arch} wheels need glibc {spec_glibc}; this has {glibc}",
                  fix="use a system with glibc {spec_glibc}"),
    "torch": Rule(_S, line="torch {torch} is outside its support ({spec_torch})", fix="use torch {spec_torch}"),
    "accelerator.{accelerator}": Rule(_S, line="it does not support {accelerator}", fix=""),
    "hub": Rule(_S, line="{hub} serves it at from_pretrained", fix="USE_HUB_KERNELS=0 for the package"),
}

PURE = {
    "install": Rule(_S, line="{target} fits {fits}[; with {needs} for {hazard}]", fix=""),
    "repair": Rule(_S, line="{problem}; replacing it with {target}", fix=""),
    "ok": Rule(_S, line="{installed} installed[; with {needs} for {hazard}]", fix=""),
    "ok.with-problems": Rule(_S, line="{problem}; {nothing}, left as it is", fix=""),
    "hazard.block": Rule(_W, line="{hazard_line}", fix="{hazard_fix}"),
    "hazard.skip": Rule(_W, line="{hazard_line}", fix="{hazard_fix}"),
    "unsafe.block": Rule(_W, line="{problem}; {nothing}", fix="install {kernel} {first_release} or newer"),
    "incompatible.block": Rule(_W, line="{problem}; {nothing}", fix=FETCH),
    "no-release": Rule(_S, line="no pinned release for {fits}", fix=PINS_FILE),
    "offline-missing": Rule(_S, line=OFFLINE, fix=FETCH),
    "xpu.old-transformers": Rule(_S, requires=("gates",), line="transformers {transformers} uses it on CUDA only",
                                 fix="upgrade transformers to >= 5.15"),
    **COMMON,
}

PAIR = {
    "install": Rule(_S, line="{target} for {served} on {hazard_gpus} + triton {triton} ({hazard})", fix=""),
    "install.nvcc": Rule(_S, requires=("nvcc_packages",), line="{installed} needs nvcc: adding the nvcc wheel", fix=""),
    "ok": Rule(_S, line="{installed}, a known-good pair, for {served} ({hazard})", fix=""),
    "ok.unverified": Rule(_S, line="{installed}, a pair the pins do not know: checked once", fix=""),
    "ok.not-needed": Rule(_S, line="{installed}; {served} does not need it: {why}", fix=""),
    "not-needed": Rule(_S, line="{served} does not need it: {why}", fix=""),
    "user-disabled": Rule(_S, requires=("switch",), line="{variable}={off} is set: {served} does not use it",
                          fix="unset {variable}: {served} needs it for {hazard}"),
    "no-nvcc": Rule(_W, requires=("needs_nvcc",), line="no nvcc to compile with",
                    fix="set CUDA_HOME to a CUDA toolkit"),
    "offline-missing": Rule(_S, line=OFFLINE, fix=FETCH),
    "repair.{problem}": Rule(_S, line="{problem}; replacing it with {target}", fix=""),
    "repair.{problem}.offline-missing": Rule(_W, line="{problem}; offline[, lacking {missing}]", fix=FETCH),
    "repair.{problem}.unrepairable": Rule(_W, line="{problem}; no known-good pair for this GPU", fix=PINS_FILE),
    "install.for-backend": Rule(_S, line="{target} to run {hazard}", fix=""),
    "ok.repair": Rule(_S, engine=True, line="its check failed; replacing it with {target}", fix=""),
    "ok.unverified.repair": Rule(_S, engine=True, line="its check failed; replacing it with {target}", fix=""),
    "block.numeric": COMMON["block.numeric"],
}
PAIR_PROBLEMS = ("half-installed", "broken-pair", "missing-companion")

COMPILED = {
    "ok": Rule(_S, line="{installed} installed; checked once in a child process", fix=""),
    "ok.half-installed": Rule(_S, line="{installed} is half-installed, cannot be reinstalled: checked as it is",
                              fix=""),
    "repair.half-installed": Rule(_S, line="{installed} is half-installed; reinstalling", fix=""),
    "block.arch": Rule(_W,
                       line="[built for {have} only, not {gaps}]"
                            "[{bad_gpu} code from nvcc {bad_nvcc} is wrong ({arch_rule})]",
                       fix="[pip uninstall it; fastpath-hooks build {kernel} --arch {union}]"
                           "[{uninstall}; fastpath-hooks install {kernel}]"),
    "cache": Rule(_S, line="{target} from the local wheel cache", fix=""),
    "wheelhouse": Rule(_S, line="{target}, built for this machine, from FASTPATH_HOOKS_FIND_LINKS", fix=""),
    "wheel": Rule(_S, release=True, line="{target}, the release wheel for torch {torch}", fix=""),
    "build": Rule(_S, line="from source for {archs}, an estimated {minutes}", fix=AHEAD),
    "build.all-archs": Rule(_S, line="from source for every arch, an estimated {minutes}", fix=AHEAD),
    "rocm.build": Rule(_S, accelerator="rocm", line="from source for {archs} with hipcc, an estimated {minutes}",
                       fix=AHEAD),
    "no-release": Rule(_S, requires=("releases",), line="no pinned release for {fits}", fix=PINS_FILE),
    "offline-missing": Rule(_S, line=OFFLINE, fix=FETCH),
    "no-wheel": Rule(_W, line="no wheel fits; FASTPATH_HOOKS_ALLOW_BUILD=0 forbids a build",
                     fix="set it to auto, or `fastpath-hooks build` it"),
    "rocm.no-build": Rule(_S, accelerator="rocm", line="no ROCm wheels; builds are off (FASTPATH_HOOKS_ALLOW_BUILD=0)",
                          fix="set it to auto to build with hipcc"),
    "build.no-pip": Rule(_S, line="no wheel fits; a build needs pip, missing here",
                         fix="`python -m ensurepip`, or use `fastpath-hooks build`"),
    "rocm.no-hipcc": Rule(_S, accelerator="rocm", line="no ROCm wheels; a build needs hipcc, not found",
                          fix="install ROCm's hipcc"),
    "no-nvcc": Rule(_W, line="no wheel fits; a build needs nvcc, not found",
                    fix="install a CUDA {cuda} toolkit, set CUDA_HOME"),
    "nvcc-unknown": Rule(_S, needs=frozenset({NVCC_RELEASE}), line="no wheel fits; nvcc's CUDA release is unknown",
                         fix="FASTPATH_HOOKS_ALLOW_BUILD=1 builds anyway"),
    "nvcc-mismatch": Rule(_S, line="no wheel fits; nvcc is CUDA {nvcc}, torch's is {cuda}",
                          fix="set CUDA_HOME to a CUDA {cuda_major}.x toolkit"),
    "build.no-arch": Rule(_S, line="no wheel fits; its sdist has no code for {unsupported}", fix=""),
    "build.unrestricted": Rule(_S, line="no build for {unsupported} alone; all archs: an estimated {minutes}",
                               fix="FASTPATH_HOOKS_ALLOW_BUILD=1 builds it anyway"),
    "build.timeout": Rule(_S, line="a build takes an estimated {minutes} > FASTPATH_HOOKS_TIMEOUT",
                          fix="{timeout_fix}"),
    "without.{with}": Rule(_S, line="useful only with {partner}, which is {verb} here", fix="fix {partner} first"),
    "build.triton-only": Rule(_S, requires=_SWITCH, warm=False,
                              line="{target} without its CUDA extension: only {users} in use, Triton ops", fix=""),
    "ok.triton-only": Rule(_S, requires=_SWITCH, warm=False,
                           line="{installed} without its CUDA extension: only {users} in use, Triton ops", fix=""),
    "repair.cuda": Rule(_S, requires=_SWITCH,
                        line="{installed} lacks its CUDA extension[, which {calls} calls]; rebuilding {target}",
                        fix=""),
    "block.no-cuda": Rule(_W, requires=_SWITCH,
                          line="{installed} lacks the CUDA extension a model here calls; {cannot}", fix="{cannot_fix}"),
    # a build trimmed to the models in use (pins: source_build.trim) without what a model here needs
    "repair.trim": Rule(_S, requires=("trim",), line="{installed} lacks {lacks}, needed here; rebuilding {target}",
                        fix=""),
    "block.trim": Rule(_W, requires=("trim",), line="{installed} lacks {lacks}, needed here; it cannot be rebuilt here",
                       fix="fastpath-hooks doctor"),
    **COMMON,
}

BACKEND = {
    "install": Rule(_S, line="{target} for {served} on {gpus}[, where it runs {runs} anyway ({hazard})]", fix=""),
    "ok": Rule(_S, line="{installed}; {served} uses it: checked once against {served}'s own path", fix=""),
    "not-used": Rule(_S, line="{served} is not used here", fix=""),
    "no-backend": Rule(_S, line="{served} {version} does not dispatch to it",
                       fix="upgrade {served} to {since} or newer"),
    "no-backend.pinned": Rule(_S, line="no pinned {served} release dispatches to it",
                              fix="pin one whose `backends` name it (FASTPATH_HOOKS_PINS)"),
    "user-disabled": Rule(_S, requires=("switch",), line="{variable}={off} is set: {served} does not use it",
                          fix="unset {variable}"),
    "arch": Rule(_S, line="{no_train}: it trains on {train} only", fix=""),
    "no-nvcc": Rule(_W, requires=("needs_nvcc",), line="no nvcc to compile its kernels at first use",
                    fix="set CUDA_HOME to a CUDA toolkit"),
    "without.{with}": Rule(_S, line="it runs on {partner}, which is not used here",
                           fix="fix {partner} first: its line says how"),
    "old.{with}": Rule(_S, line="{partner} {version} is used here; it needs {partner} {spec}", fix="{partner_fix}"),
    "off": Rule(_S, line="off by default {where}: not shown to pay",
                fix="set kernels.{kernel}.pays.{key} in FASTPATH_HOOKS_PINS"),
    "head-dims": Rule(_S, line="it computes K = V = {dims} only; {served} keeps its own path", fix=""),
    "no-release": Rule(_S, line="no known-good release for torch {torch}", fix=PINS_FILE),
    "offline-missing": Rule(_S, line=OFFLINE, fix=FETCH),
}

KINDS = {"pure": PURE, "pair": PAIR, "compiled": COMPILED, "backend": BACKEND}

# Said of a model's forward, not of a kernel (hooks/packed.py): `[<model type>: ]<line> (<fix>)`
PACKED_LEAK = "attention.packed-leak"
FORWARD = {
    PACKED_LEAK: Rule(_W, line="packed documents attend to each other under {attention}",
                                  fix='{remedy}[, or attn_implementation="{flash}"]'),
}


def forward_line(rule: str, values: dict, subject: str = "") -> str:
    """A FORWARD rule's line; `subject` (the model type) leads it where the whole still fits."""
    declared_rule = FORWARD[rule]
    fix = fill(declared_rule.fix, values)
    body = fill(declared_rule.line, values) + (f" ({fix})" if fix else "")
    return first_fitting(f"{subject}: {body}", body) if subject else body


def _expand(template: str, spec, pins) -> list:
    # skip.accelerator.<a>: only for an accelerator some kernel does not support
    kernels = pins.kernels.values() if pins is not None else ()
    unsupported = tuple(a for a in ACCELERATORS if pins is None or any(a not in k.accelerators for k in kernels))
    values = {"{accelerator}": unsupported, "{problem}": PAIR_PROBLEMS,
              "{with}": tuple(pins.kernel(k).rule_prefix for k in spec.with_kernels) if spec else (),
              "{import}": spec.imports_installed if spec else ()}
    for field, options in values.items():
        if field in template:
            return [template.replace(field, option) for option in options]
    return [template]


_declared: dict = {}   # pins digest -> {rule id: Rule}


def declared(pins) -> dict:
    """Every rule id these pins' kernels can get -> its Rule (the shared ones once)."""
    if pins.digest not in _declared:
        found = {f"{SHARED_SCOPE}.{s}": rule for t, rule in SHARED.items() for s in _expand(t, None, pins)}
        found.update((f"{spec.rule_prefix}.{s}", rule) for spec in pins.kernels.values()
                     for t, rule in KINDS[spec.kind].items() if all(getattr(spec, f) for f in rule.requires)
                     and (rule.accelerator is None or rule.accelerator in spec.accelerators)
                     and (not rule.release or pins.release(spec.name) is not None
                          or any(getattr(r, "release", None) for r in spec.releases))
                     for s in _expand(t, spec, pins))
        _declared[pins.digest] = found
    return _declared[pins.digest]


def rule_id(pins, kernel: str | None, suffix: str) -> str:
    """`<kernel's rule prefix, or skip for none>.<suffix>`; one not declared for it is a bug (KeyError)."""
    rule = f"{pins.kernel(kernel).rule_prefix if kernel else SHARED_SCOPE}.{suffix}"
    if rule not in declared(pins):
        raise KeyError(f"rule {rule!r} is not declared for {kernel or 'every kernel'} in decide/messages.py")
    return rule


def lookup(pins, rule: str) -> Rule | None:
    """The declared Rule of an id these pins' policy emitted (None for one it cannot have)."""
    return declared(pins).get(rule)


_FORMATTER = string.Formatter()
_GROUP = re.compile(r"\[([^\[\]]*)\]")

# The outcome as the line says it (the action, and whether something is installed or built)
NOT_INSTALLED, LEFT_ALONE, BLOCKED = "not installed", "left as it is", "blocked"
INSTALLING, BUILDING, REPAIRING, OK_WORD = "installing", "building", "repairing", "ok"
MACHINE_WIDE = "torch path for every kernel"
DOCTOR = "fastpath-hooks doctor"
ACCELERATOR_NAMES = {"cuda": "CUDA", "rocm": "ROCm", "xpu": "XPU"}


def few(items, limit: int = 24) -> str:
    """`a, b and 3 more`: the distributions of the first items that fit in `limit` characters (the whole list
    is in the reason: doctor, plan, the debug log)."""
    names = list(dict.fromkeys(_name(str(item)) for item in items))
    shown: list = []
    for name in names:
        if shown and len(", ".join(shown + [name])) > limit:
            break
        shown.append(name)
    rest = len(names) - len(shown)
    return ", ".join(shown) + (f" and {rest} more" if rest else "")


def _name(item: str) -> str:
    """The distribution of a requirement (`z3-solver<4.15.5,>=4.13.0`) or a file (`..-1.0-py3-none-any.whl`)."""
    if item.endswith((".whl", ".tar.gz", ".zip")):
        return item.split("-", 1)[0].replace("_", "-") + (" wheel" if item.endswith(".whl") else " sdist")
    return re.split(r"[<>=!~;\[ @]", item, maxsplit=1)[0]


def public(version) -> str:
    """A version without its local label (`1.6.2.post1+fph.torch2.11.0...` -> `1.6.2.post1`)."""
    return str(version).split("+", 1)[0] if version else ""


def versions(spec, mapping) -> str:
    """`0.6.0` (every distribution at one version), `0.1.15 + apache-tvm-ffi 0.1.12` (one at another)."""
    if not mapping:
        return ""
    items = {d: public(v) for d, v in mapping.items()}
    own = items.get(spec.distributions[0]) or next(iter(items.values()))
    return " + ".join([own] + [f"{d} {v}" for d, v in items.items() if v != own])


def slots(ctx, decision) -> dict:
    """The slots every template may name, from the decision's context, then the decision's own facts."""
    env, settings, pins = ctx.env, ctx.settings, ctx.pins
    spec = pins.kernel(decision.kernel)
    build = next((s for s in decision.steps if s.kind == "build"), None)
    archs = tuple(build.archs) if build is not None else ()
    values = {
        "kernel": decision.kernel, "dist": spec.distributions[0], "module": spec.module,
        "target": versions(spec, decision.target), "installed": versions(spec, decision.installed),
        "needs": ", ".join(decision.needs), "torch": env.torch or "", "triton": env.triton or "",
        "transformers": env.version("transformers") or "", "python": env.python, "platform": env.platform,
        "arch": env.arch, "glibc": env.glibc or "", "cuda": env.torch_cuda or "",
        "cuda_major": (env.torch_cuda or "").split(".")[0], "nvcc": env.nvcc_version or "",
        "gpus": "+".join(dict.fromkeys(env.gpus)),
        "accelerator": ACCELERATOR_NAMES.get(env.accelerator or "", env.accelerator or ""),
        "spec_python": str(spec.python), "spec_torch": str(spec.torch), "spec_platforms": " or ".join(spec.platforms),
        "spec_glibc": str(spec.glibc.get(env.arch, "")),
        "archs": "every arch" if archs == ("all",) else ", ".join(archs),
        "minutes": minutes(decision.expected_seconds),
        "timeout": f"{settings.timeout:.0f}" if settings is not None else "",
    }
    return {**values, **decision.facts}


def fill(template: str, values: dict) -> str:
    def group(match):
        part = match.group(1)
        fields = [f for _, f, _, _ in _FORMATTER.parse(part) if f]
        return part.format_map(values) if all(values.get(f) for f in fields) else ""

    return _GROUP.sub(group, template).format_map(values)


def compact(ctx, decision) -> str:
    """The short reason without its optional parts (`[...]`), for a line composing it with another kernel's
    where the whole does not fit (`fitting`); "" where nothing would be left."""
    rule = lookup(ctx.pins, decision.rule)
    bare = _GROUP.sub("", rule.line) if rule is not None and rule.line else ""
    if not bare.strip(" ;,"):
        return ""
    try:
        return bare.format_map(slots(ctx, decision))
    except (KeyError, ValueError, IndexError):
        return ""


def fitting(kernel: str, outcome_word: str, reasons, fix: str = "") -> str:
    """The first of `reasons` (most whole first) whose line fits the width; else the last (events.fit cuts it)."""
    reasons = list(reasons)
    return next((r for r in reasons if len(PREFIX + compose(kernel, outcome_word, r, fix)) <= MAX_LINE), reasons[-1])


def strict(ctx, decision) -> tuple:
    """(short reason, short fix[, the repair's two]) as `render` makes them; KeyError naming the rule and why."""
    values = slots(ctx, decision)
    said = [(decision.rule, values)]
    if decision.repair_steps:
        target = versions(ctx.pins.kernel(decision.kernel), target_of(decision.repair_steps))
        said.append((decision.rule + ".repair", dict(values, target=target)))
    out: tuple = ()
    try:
        for rule_id_, vals in said:
            rule = lookup(ctx.pins, rule_id_)
            if rule is None or rule.line is None or rule.fix is None:
                raise KeyError(f"{rule_id_!r} is not declared" if rule is None else "no short form (line= and fix=)")
            out += (fill(rule.line, vals), fill(rule.fix, vals))
    except KeyError as exc:
        raise KeyError(f"rule {decision.rule!r}: {exc.args[0]} - give it line= and fix= templates in "
                       "decide/messages.py, whose slots are `slots`' or the decision's facts") from None
    return out


def render(ctx, decision):
    """The decision with its short reason and fix (its repair's in `facts`). A rule without a short form - a
    bug the test of every rule id catches - leaves them "": the line then says the whole texts."""
    try:
        found = strict(ctx, decision)
    except (KeyError, ValueError, IndexError):
        return replace(decision, short_reason="", short_fix="")
    facts = dict(decision.facts, **dict(zip(("repair_reason", "repair_fix"), found[2:])))
    return replace(decision, short_reason=found[0], short_fix=found[1], facts=facts)


# -- the lines ---------------------------------------------------------------------------------

def outcome(decision) -> str:
    action = str(decision.action)
    if action == "skip":
        return LEFT_ALONE if decision.installed else NOT_INSTALLED
    if action == "install":
        return BUILDING if any(s.kind == "build" for s in decision.steps) else INSTALLING
    return {"block": BLOCKED, "repair": REPAIRING}.get(action, OK_WORD)


def _said(decision) -> tuple:
    """(reason, fix) as a line says them: the short forms, else the whole texts."""
    if decision.short_reason:
        return decision.short_reason, decision.short_fix
    return decision.reason, decision.fix


def line(decision, *, outcome_word: str | None = None, reason: str | None = None, fix: str | None = None) -> str:
    why, how = _said(decision)
    return compose(decision.kernel, outcome_word or outcome(decision), why if reason is None else reason,
                   how if fix is None else fix)


def compose(kernel: str, outcome_word: str, reason: str, fix: str = "") -> str:
    return f"{kernel}: {outcome_word} - {reason}" + (f" ({fix})" if fix else "")


def machine_line(decision) -> str:
    """A machine-wide skip (no torch, no accelerator), said once for every kernel."""
    why, how = _said(decision)
    return f"{MACHINE_WIDE} - {why}" + (f" ({how})" if how else "")


def reminder(kernel: str) -> str:
    """What a later start says for a kernel whose line was said before and that is still not in use."""
    return f"{kernel} not in use (torch path): see {DOCTOR}"
