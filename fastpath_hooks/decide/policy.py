"""The decision policy: a pure function (environment, settings, pins) -> Plan.

No I/O, no imports of torch or transformers, no clock: every input is an argument, so each rule is
tested by a table row (tests/test_policy.py). The driver only orders the kernels by the registry's
needs/serves graph and hands each to its kind's rules (decide/rules/), then blocks a release whose
numbers were measured wrong here (common.numeric_block: before a backend of it is decided); then a
usable kernel's backends are named in its `wants`, and the JIT cache variables set where a check warms
them. `Decision.rule` names the rule that decided (declared in decide/rule_ids.py), and its short form
for the start-up line (decide/short.py).
"""

from __future__ import annotations

from dataclasses import replace

from . import short
from .common import USABLE, Context, no_accelerator_reason, numeric_block
from .plan import SKIP, Plan
from .rules import backend, compiled, pair, pure
from .warmup import jit_env

RULES = {"pure": pure.decide, "pair": pair.decide, "compiled": compiled.decide, "backend": backend.decide}


def decide(env, settings, pins, *, fresh: bool = False) -> Plan:
    """Decide every kernel. `fresh`: plan as if no kernel package were installed
    (what a new machine of this kind needs - used by `download`)."""
    ctx = Context(env, settings, pins, fresh)
    decided: dict = {}
    for kernel in decision_order(pins):
        # rendered at once: a later kernel's line may name this one's short reason (fla's: tilelang's)
        decided[kernel] = short.render(ctx, numeric_block(ctx, kernel, RULES[pins.kernel(kernel).kind](ctx, kernel,
                                                                                                     decided)))
    decided = with_jit_caches(ctx, with_backends(ctx, decided))
    notes = []
    if env.accelerator is None:
        notes.append(no_accelerator_reason(env))
    return Plan(environment=env, decisions={k: decided[k] for k in listed(pins)}, notes=tuple(notes))


def with_backends(ctx: Context, decided: dict) -> dict:
    """A usable kernel ensures its backends right after itself, before its import goes on (`wants`): they
    are installed (or checked, or switched off) before its backend registry looks for them."""
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
    """Where a verification child warms JIT caches here (a decision with a `check`: the one due now, or the
    install's earlier one for an installed kernel), every usable kernel with JIT caches (pins `jit_caches`)
    sets them for the process that imports it - the training run then finds what the child compiled -
    unless the user set them (to another directory than fastpath-hooks': facts/probe.py)."""
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


def decision_order(pins) -> tuple:
    """Each kernel after the ones its rules read (the registry's serves / with / imports_optional
    graph: facts.pins.decision_order, which rejects a circle when the pins are loaded)."""
    return pins.decision_order
