"""Which acting decisions of one request are installed together (pure): the engine's batch.

The compiled kernels of a request (mamba-ssm and the causal-conv1d it is used with; the kernels
`fastpath-hooks install` is given; the ones a modeling module being imported names) whose
decisions install wheels or build, and whose other needs are already usable, go in one batch: their
builds side by side, their wheels in one installer call - with the dependencies they lack where no
member builds (`deps_with_wheels`; a build imports them, so they go first then) - and one
verification child (act/batch.py). The first of them in dependency order leads it - the one the engine reaches
first, as every other one needs it or is decided after it. `plan` and `doctor` show the same
batches (report.commands_for), the engine runs them (engine/batch_install.py).
"""

from __future__ import annotations

from .plan import INSTALL, OK, StepKind

BATCHED_STEPS = frozenset({StepKind.DEPS, StepKind.WHEEL, StepKind.INDEX, StepKind.BUILD})


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
