"""The decision policy: a pure function (environment, settings, pins) -> Plan, each rule tested by a
table row (tests/test_policy.py). The driver orders the kernels by the registry's needs/serves graph and
hands each to its kind's rules (one module per kind here: `decide(ctx, kernel, decided) -> Decision`),
then blocks a release whose numbers were measured wrong here (common.numeric_block, before a backend of
it is decided), names a usable kernel's backends in its `wants` and sets the JIT cache variables where a
check warms them.

Batches (the engine's): the compiled kernels of a request whose decisions install wheels or build, and
whose other needs are already usable, install together - builds side by side, wheels in one installer
call (with the dependencies they lack where no member builds: `deps_with_wheels`), one verification
child (act/installer.py) - led by the first in dependency order. `plan` and `doctor` show the same batches.
"""

from __future__ import annotations

from dataclasses import replace

from .. import messages as short
from ..common import Context, USABLE, no_accelerator_reason, numeric_block
from ..plan import INSTALL, OK, Plan, SKIP, StepKind, jit_env
from . import backend, compiled, pair, pure


RULES = {"pure": pure.decide, "pair": pair.decide, "compiled": compiled.decide, "backend": backend.decide}


def decide(env, settings, pins, *, fresh: bool = False) -> Plan:
    """Decide every kernel. `fresh`: plan as if no kernel package were installed
    (what a new machine of this kind needs - used by `download`)."""
    ctx = Context(env, settings, pins, fresh)
    decided: dict = {}
    for kernel in pins.decision_order:   # each kernel after the ones its rules read (facts/pins)
        # rendered at once: a later kernel's line may name this one's short reason (fla's: tilelang's)
        decision = RULES[pins.kernel(kernel).kind](ctx, kernel, decided)
        decided[kernel] = short.render(ctx, numeric_block(ctx, kernel, decision))
    decided = with_jit_caches(ctx, with_backends(ctx, decided))
    notes = []
    if env.accelerator is None:
        notes.append(no_accelerator_reason(env))
    return Plan(environment=env, decisions={k: decided[k] for k in listed(pins)}, notes=tuple(notes))


def with_backends(ctx: Context, decided: dict) -> dict:
    """A usable kernel ensures its backends (`wants`) right after itself, before its import goes on and its
    backend registry looks for them."""
    out = dict(decided)
    for kernel, decision in decided.items():
        if decision.action not in USABLE:
            continue
        wants = tuple(b for b, spec in ctx.pins.kernels.items() if spec.kind == "backend" and kernel in spec.serves
                      and (decided[b].action != SKIP or decided[b].env))
        if wants:
            out[kernel] = replace(decision, wants=wants)
    return out


def with_jit_caches(ctx: Context, decided: dict) -> dict:
    """Where a check warms JIT caches here (a decision with a `check`), every usable kernel with JIT caches
    (pins `jit_caches`) sets them for the process that imports it, so the training run finds what the child
    compiled - unless the user set them."""
    if not any(d.check and d.action in USABLE for d in decided.values()):
        return decided
    out = dict(decided)
    for kernel, decision in decided.items():
        extra = tuple(p for p in jit_env(ctx.env, ctx.pins, kernel) if p[0] not in dict(decision.env))
        if extra and decision.action in USABLE:
            out[kernel] = replace(decision, env=tuple(decision.env) + extra)
    return out


def listed(pins) -> tuple:
    """The plan's order (what users read): the kernels models use, then the ones that serve them."""
    kernels = pins.kernels
    return tuple(k for k, s in kernels.items() if not s.serves) + tuple(k for k, s in kernels.items() if s.serves)


BATCHED_STEPS = frozenset({StepKind.DEPS, StepKind.WHEEL, StepKind.BUILD})


def batchable(decision, pins) -> bool:
    return (decision.action == INSTALL and pins.kernel(decision.kernel).kind == "compiled" and bool(decision.steps)
            and all(s.kind in BATCHED_STEPS for s in decision.steps))


def deps_with_wheels(members) -> bool:
    """Whether the batch's dependencies go into its wheels' installer call (`--no-deps`, one call: a later
    environment's cached kernels) - where no member builds, so nothing needs them before its wheel is
    there. What those dependencies need in turn is resolved by a second call, only where one lacks it."""
    return not any(s.kind == StepKind.BUILD for d in members for s in d.steps)


def batch(plan, pins, kernel: str, *, request, good, decision=None) -> tuple:
    """The decisions installed with `kernel`'s (`decision`, default the plan's), dependency order, it
    among them; just its own when nothing joins it. `request`: the kernels of the request; `good`:
    those already usable (a need outside the batch must be one of them)."""
    current = decision if decision is not None else plan.decisions[kernel]
    if not batchable(current, pins):
        return (current,)
    members, names = [], set()
    for name in pins.decision_order:
        d = current if name == kernel else plan.decisions.get(name)
        if d is None or (name != kernel and (name not in request or not batchable(d, pins))):
            continue
        if name != kernel and not all(n in names or n in good for n in d.needs):
            continue
        members.append(d)
        names.add(name)
    return tuple(members) if len(members) > 1 else (current,)


def batches(plan, pins, request=None) -> list:
    """Every batch of more than one kernel `fastpath-hooks install` of `request` (default: every
    kernel of the plan) would run, each a tuple of decisions led by its first."""
    request = frozenset(plan.decisions if request is None else request)
    good = frozenset(k for k, d in plan.decisions.items() if d.action == OK)
    out, placed = [], set()
    for name in pins.decision_order:
        if name not in request or name in placed or name not in plan.decisions:
            continue
        members = batch(plan, pins, name, request=request, good=good)
        if len(members) > 1:
            members = tuple(d for d in members if d.kernel not in placed)
            if len(members) > 1:
                out.append(members)
                placed.update(d.kernel for d in members)
    return out
