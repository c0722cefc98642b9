"""The short human form of a decision: what one line at start-up says.

Each rule id declares two templates in decide/rule_ids.py: `line` (the reason, short by design) and
`fix` (how to change the outcome; "" where nothing the user does changes it). Their named slots
(`{torch}`, `{missing}` ...) are filled from the decision's context (`slots` below: the facts every
rule can name) and from the decision's own `facts` (what only its rule knows: the hazard, what a
wheelhouse lacks, ...). `[...]` in a template is kept only when every slot inside it has a value.

The driver (decide/policy.py) renders every decision once (`render`): `short_reason`, `short_fix`.
The engine says `<kernel>: <outcome> - <short reason> (<short fix>)` (`line`); the whole reason
and fix (`reason`, `fix`: paths, wheel names, the full list of what is missing) stay in doctor,
plan and the debug log. A value that could be long (a list) is shortened where it is made (`few`),
so a line never needs cutting; events.fit stays a last-resort net.

Pure, like the rest of decide/.
"""

from __future__ import annotations

import re
import string
from dataclasses import replace

from ..events.lines import MAX_LINE, PREFIX
from . import rule_ids

_FORMATTER = string.Formatter()
_GROUP = re.compile(r"\[([^\[\]]*)\]")

# The outcome as the line says it (the action, and whether something is installed or built)
NOT_INSTALLED, LEFT_ALONE, BLOCKED = "not installed", "left as it is", "blocked"
INSTALLING, BUILDING, REPAIRING, OK_WORD = "installing", "building", "repairing", "ok"
MACHINE_WIDE = "torch path for every kernel"
DOCTOR = "fastpath-hooks doctor"


def few(items, limit: int = 24) -> str:
    """`a, b and 3 more`: the first items that fit in `limit` characters, then how many are left (the
    whole list is in the decision's reason: doctor, plan, the debug log). Wheel file names and
    requirements are named by their distribution."""
    names = []
    for item in items:
        name = _name(str(item))
        if name not in names:
            names.append(name)
    shown: list = []
    for name in names:
        if shown and len(", ".join(shown + [name])) > limit:
            break
        shown.append(name)
    rest = len(names) - len(shown)
    return ", ".join(shown) + (f" and {rest} more" if rest else "")


def _name(item: str) -> str:
    """A distribution's name for a requirement (`z3-solver<4.15.5,>=4.13.0`) or a file name (`..-1.0-py3-none-any.whl`)."""
    if item.endswith((".whl", ".tar.gz", ".zip")):
        return item.split("-", 1)[0].replace("_", "-") + (" wheel" if item.endswith(".whl") else " sdist")
    return re.split(r"[<>=!~;\[ @]", item, maxsplit=1)[0]


def public(version) -> str:
    """A version without its local label (`1.6.2.post1+fph.torch2.11.0...` -> `1.6.2.post1`): the label is detail."""
    return str(version).split("+", 1)[0] if version else ""


def versions(spec, mapping) -> str:
    """`0.6.0` (every distribution at one version), `0.1.15 + apache-tvm-ffi 0.1.12` (one at another)."""
    if not mapping:
        return ""
    items = {d: public(v) for d, v in mapping.items()}
    own = items.get(spec.distributions[0]) or next(iter(items.values()))
    return " + ".join([own] + [f"{d} {v}" for d, v in items.items() if v != own])


def minutes(seconds) -> str:
    if seconds is None:
        return ""
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


ACCELERATOR_NAMES = {"cuda": "CUDA", "rocm": "ROCm", "xpu": "XPU"}


def slots(ctx, decision) -> dict:
    """The slots every template may name, from the decision's context, then the decision's own facts."""
    env, settings, pins = ctx.env, ctx.settings, ctx.pins
    spec = pins.kernel(decision.kernel)
    build = next((s for s in decision.steps if s.kind == "build"), None)
    archs = tuple(build.archs) if build is not None else ()
    values = {
        "kernel": decision.kernel,
        "dist": spec.distributions[0],
        "module": spec.module,
        "target": versions(spec, decision.target),
        "installed": versions(spec, decision.installed),
        "needs": ", ".join(decision.needs),
        "torch": env.torch or "",
        "triton": env.triton or "",
        "transformers": env.version("transformers") or "",
        "python": env.python,
        "platform": env.platform,
        "arch": env.arch,
        "glibc": env.glibc or "",
        "cuda": env.torch_cuda or "",
        "cuda_major": (env.torch_cuda or "").split(".")[0],
        "nvcc": env.nvcc_version or "",
        "gpus": "+".join(dict.fromkeys(env.gpus)),
        "accelerator": ACCELERATOR_NAMES.get(env.accelerator or "", env.accelerator or ""),
        "spec_python": str(spec.python),
        "spec_torch": str(spec.torch),
        "spec_platforms": " or ".join(spec.platforms),
        "spec_glibc": str(spec.glibc.get(env.arch, "")),
        "archs": "every arch" if archs == ("all",) else ", ".join(archs),
        "minutes": minutes(decision.expected_seconds),
        "timeout": f"{settings.timeout:.0f}" if settings is not None else "",
    }
    values.update(decision.facts)
    return values


def texts(rule, values: dict) -> tuple:
    """(short reason, short fix) of a declared Rule; KeyError naming the slot a template lacks."""
    if rule.line is None or rule.fix is None:
        raise KeyError("no short form (line= and fix=)")
    return fill(rule.line, values), fill(rule.fix, values)


def fill(template: str, values: dict) -> str:
    def group(match):
        part = match.group(1)
        fields = [f for _, f, _, _ in _FORMATTER.parse(part) if f]
        return part.format_map(values) if all(values.get(f) for f in fields) else ""

    return _GROUP.sub(group, template).format_map(values)


def compact(ctx, decision) -> str:
    """The decision's short reason without its optional parts (`[...]`, the least important): what a line
    that composes it with another kernel's says where the whole does not fit (`fitting`); "" where its
    rule has no short form or nothing would be left."""
    rule = rule_ids.lookup(ctx.pins, decision.rule)
    bare = _GROUP.sub("", rule.line) if rule is not None and rule.line else ""
    if not bare.strip(" ;,"):
        return ""
    try:
        return bare.format_map(slots(ctx, decision))
    except (KeyError, ValueError, IndexError):
        return ""


def fitting(kernel: str, outcome_word: str, reasons, fix: str = "") -> str:
    """The first of a composed line's reasons, most whole first, with which `<kernel>: <outcome> - <reason>
    (<fix>)` fits the line width; else the last (events.fit cuts it: tests/test_lines.py says which)."""
    reasons = list(reasons)
    return next((r for r in reasons if len(PREFIX + compose(kernel, outcome_word, r, fix)) <= MAX_LINE), reasons[-1])


def strict(ctx, decision) -> tuple:
    """(short reason, short fix, and the repair's) as `render` makes them; KeyError saying which rule and why
    (the test of every rule id calls this)."""
    values = slots(ctx, decision)
    try:
        out = texts(_rule(ctx, decision.rule), values)
        if decision.repair_steps:
            from .plan import target_of

            repair = dict(values, target=versions(ctx.pins.kernel(decision.kernel), target_of(decision.repair_steps)))
            out += texts(_rule(ctx, decision.rule + ".repair"), repair)
    except KeyError as exc:
        raise KeyError(f"rule {decision.rule!r}: {exc.args[0]} - give it line= and fix= templates in "
                       "decide/rule_ids.py, whose slots are the context's (decide/short.py `slots`) or the "
                       "decision's facts") from None
    return out


def _rule(ctx, rule_id: str):
    rule = rule_ids.lookup(ctx.pins, rule_id)
    if rule is None:
        raise KeyError(f"{rule_id!r} is not declared")
    return rule


def render(ctx, decision):
    """The decision with its short reason and fix (and its repair's, in `facts`). A rule without a short
    form - a bug the test of every rule id catches - falls back to the whole texts (fitted when said)."""
    try:
        found = strict(ctx, decision)
    except (KeyError, ValueError, IndexError):
        return replace(decision, short_reason="", short_fix="")
    facts = dict(decision.facts)
    if len(found) == 4:
        facts["repair_reason"], facts["repair_fix"] = found[2], found[3]
    return replace(decision, short_reason=found[0], short_fix=found[1], facts=facts)


# -- the lines ---------------------------------------------------------------------------------

def outcome(decision) -> str:
    action = str(decision.action)
    if action == "skip":
        return LEFT_ALONE if decision.installed else NOT_INSTALLED
    if action == "block":
        return BLOCKED
    if action == "repair":
        return REPAIRING
    if action == "install":
        return BUILDING if any(s.kind == "build" for s in decision.steps) else INSTALLING
    return OK_WORD


def would(decision) -> str:
    """Report mode's outcome: `would install`, `would build`, `would repair`."""
    return {INSTALLING: "would install", BUILDING: "would build", REPAIRING: "would repair"}.get(outcome(decision),
                                                                                               f"would {decision.action}")


def gist(text: str, limit: int = 60) -> str:
    """The first clause of a text the engine was handed (a failed check's or install's output) when it is
    short - never a cut one; "" otherwise (the line then points to doctor, which shows it whole)."""
    first = " ".join(str(text or "").split("; ")[0].split())
    return first if first and len(first) <= limit else ""


def line(decision, *, outcome_word: str | None = None, reason: str | None = None, fix: str | None = None) -> str:
    """`<kernel>: <outcome> - <reason> (<fix>)`, from the short forms (the whole texts for a decision
    without one)."""
    why = reason if reason is not None else (decision.short_reason or decision.reason)
    how = fix if fix is not None else (decision.short_fix if decision.short_reason else decision.fix)
    return compose(decision.kernel, outcome_word or outcome(decision), why, how)


def compose(kernel: str, outcome_word: str, reason: str, fix: str = "") -> str:
    return f"{kernel}: {outcome_word} - {reason}" + (f" ({fix})" if fix else "")


def machine_line(decision) -> str:
    """A machine-wide skip (no torch, no accelerator), said once for every kernel."""
    why = decision.short_reason or decision.reason
    how = decision.short_fix if decision.short_reason else decision.fix
    return f"{MACHINE_WIDE} - {why}" + (f" ({how})" if how else "")


def reminder(kernel: str) -> str:
    """What a later start says for a kernel whose line was said before and that is still not in use."""
    return f"{kernel} not in use (torch path): see {DOCTOR}"
