"""The decision policy: a pure function (environment, settings, pins) -> Plan.

No I/O, no imports of torch or transformers, no clock: every input is an argument, so each rule is
tested by a table row (tests/test_policy.py). The driver only orders the kernels by the registry's
needs/serves graph and hands each to its kind's rules (decide/rules/), then blocks a release whose
numbers were measured wrong here (common.numeric_block); `Decision.rule` names the rule that decided
(declared in decide/rule_ids.py).
"""

from __future__ import annotations

from .common import Context, no_accelerator_reason, numeric_block
from .plan import Plan
from .rules import compiled, pair, pure

RULES = {"pure": pure.decide, "pair": pair.decide, "compiled": compiled.decide}


def decide(env, settings, pins, *, fresh: bool = False) -> Plan:
    """Decide every kernel. `fresh`: plan as if no kernel package were installed
    (what a new machine of this kind needs - used by `download`)."""
    ctx = Context(env, settings, pins, fresh)
    decided: dict = {}
    for kernel in decision_order(pins):
        decided[kernel] = numeric_block(ctx, kernel, RULES[pins.kernel(kernel).kind](ctx, kernel, decided))
    notes = []
    if env.accelerator is None:
        notes.append(no_accelerator_reason(env))
    return Plan(environment=env, decisions={k: decided[k] for k in listed(pins)}, notes=tuple(notes))


def listed(pins) -> tuple:
    """The plan's order (what users read): the kernels models use, then the ones that serve them."""
    kernels = pins.kernels
    return tuple(k for k, s in kernels.items() if not s.serves) + tuple(k for k, s in kernels.items() if s.serves)


def decision_order(pins) -> tuple:
    """Each kernel after the ones its rules read (the registry's serves / with / imports_optional
    graph: facts.pins.decision_order, which rejects a circle when the pins are loaded)."""
    return pins.decision_order
