"""The decision policy: a pure function (environment, settings, pins) -> Plan, each rule tested by a row of
tests/test_policy.py. Kernels are decided in the registry's needs/serves order, each by its kind's module.

Batches (the engine's): a request's compiled kernels that install wheels or build, whose other needs are usable,
install together - builds side by side, wheels in one installer call, one verification child (act/installer.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .. import messages as short
from ..builds import core_budget, cuda_codes, split_allowed
from ..common import Context, USABLE, no_accelerator_reason, numeric_block
from ..plan import (CONSTRAINTS_PLACEHOLDER, INSTALL, OK, Invocation, Plan, SKIP, StepKind, build_argv, constraints,
                    helpers_argv, installer_choice, invocation, jit_env)
from . import backend, compiled, pair, pure
from .compiled import cxx11_abi_flag


RULES = {"pure": pure.decide, "pair": pair.decide, "compiled": compiled.decide, "backend": backend.decide}


def decide(env, settings, pins, *, fresh: bool = False) -> Plan:
    """`fresh`: plan as if no kernel package were installed (what a new machine needs: `download`)."""
    ctx = Context(env, settings, pins, fresh)
    decided: dict = {}
    for kernel in pins.decision_order:   # each kernel after the ones its rules read (facts/pins)
        # rendered at once: a later kernel's line may name this one's short reason (fla's: tilelang's)
        decision = RULES[pins.kernel(kernel).kind](ctx, kernel, decided)
        decided[kernel] = short.render(ctx, numeric_block(ctx, kernel, decision))
    decided = with_jit_caches(ctx, with_backends(ctx, decided))
    notes = (no_accelerator_reason(env),) if env.accelerator is None else ()
    return Plan(environment=env, decisions={k: decided[k] for k in listed(pins)}, notes=notes)


def with_backends(ctx: Context, decided: dict) -> dict:
    """A usable kernel ensures its backends (`wants`) right after itself, before its registry looks for them."""
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
    """Where a check warms JIT caches, every usable kernel sets its caches (pins `jit_caches`) the user has not
    set for the process that imports it, which then finds what the check compiled."""
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


@dataclass(frozen=True)
class Commands:
    """How act/ runs the steps here, decided before it runs and handed to it with the decisions (act/ never calls
    decide/); act/ adds what exists only then: the constraints file, local wheels, what is installed, the builds."""
    installer: str                    # pip where none can run (installer_choice says why)
    uv: str | None                    # never one only posed by a target (`uv=yes`)
    settings: object
    env: object
    protected: tuple
    abi: str                          # TRUE/FALSE: the C++ ABI a built wheel is labelled with

    @classmethod
    def of(cls, settings, env, pins) -> "Commands":
        return cls(installer_choice(settings, env)[0] or "pip", None if env.uv in (None, "posed") else env.uv,
                   settings, env, tuple(pins.protected), cxx11_abi_flag(env))

    def invocation(self, step, *, installer=None, constraints_file=CONSTRAINTS_PLACEHOLDER, local_files=()):
        return invocation(step, installer=installer or self.installer, settings=self.settings, uv=self.uv,
                          constraints_file=constraints_file, local_files=local_files)

    def build_argv(self, step, out_dir: str) -> list:
        return build_argv(step, settings=self.settings, out_dir=out_dir)

    def helpers_argv(self, step, target: str) -> list:
        return helpers_argv(step, settings=self.settings, target=target)

    def invocations(self, step, **kw) -> list:
        """What running `step` takes: a build's helpers' install into its own directory first."""
        before = [Invocation(argv=tuple(self.helpers_argv(step, "<work>/helpers")), env=(), step=step)] \
            if step.kind == StepKind.BUILD and step.helpers else []
        return before + [self.invocation(step, **kw)]

    def constraints(self, installed: dict, named=()) -> list:
        return constraints(installed, self.protected, named)

    def shares(self, builds, jobs_given=None) -> dict:
        """kernel -> its builds.Share of the machine, for `builds` = [(kernel, spec, expected seconds)] run at once."""
        env = self.env
        return core_budget([(k, b, s, split_allowed(b, self.settings, env.nvcc_version)) for k, b, s in builds],
                           cpus=env.cpus, memory_gib=env.memory_gib, settings=self.settings, jobs_given=jobs_given)

    def codes(self, build) -> int:
        """How many arch codes the sdist compiles with this nvcc (a build "for all")."""
        return len(cuda_codes(build, self.env.nvcc_version))

    @staticmethod
    def deps_with_wheels(members) -> bool:
        """Whether the batch's dependencies go into its wheels' one installer call: where no member builds, nothing
        needs them before its wheel is there."""
        return not any(s.kind == StepKind.BUILD for d in members for s in d.steps)


def builds(decision) -> bool:
    return any(s.kind == StepKind.BUILD for s in decision.steps)


def batch(plan, pins, kernel: str, *, request, good, decision=None) -> tuple:
    """The decisions installed with `kernel`'s (`decision`, default the plan's), in dependency order; just its own
    when nothing joins it. `good`: the kernels already usable (a need outside the batch must be one). Compiled
    kernels go in together (their builds side by side); where one builds, the request's pure kernels join too, so
    that they are installed and checked while it builds (nothing waits that need not: issue 39)."""
    current = decision if decision is not None else plan.decisions[kernel]
    if not batchable(current, pins):
        return (current,)
    chosen = {name: (current if name == kernel else plan.decisions.get(name)) for name in pins.decision_order}
    request = set(request) | {n for k in request if chosen.get(k) is not None for n in chosen[k].needs}  # fla's tilelang
    building = any(d is not None and (name == kernel or (name in request and batchable(d, pins))) and builds(d)
                   for name, d in chosen.items())
    members, names = [], set()
    for name, d in chosen.items():
        joins = d is not None and name in request and (batchable(d, pins) or (building and _pure(d, pins)))
        if name == kernel or (joins and all(n in names or n in good for n in d.needs)):
            members.append(d)
            names.add(name)
    return tuple(members) if len(members) > 1 else (current,)


def _pure(decision, pins) -> bool:
    """A pure or pair kernel to install from wheels (fla, tilelang): it can go in while another builds."""
    return (decision.action == INSTALL and pins.kernel(decision.kernel).kind in ("pure", "pair") and bool(decision.steps)
            and all(s.kind in (StepKind.KERNEL, StepKind.DEPS) for s in decision.steps))


def batches(plan, pins, request=None) -> list:
    """Every batch of several kernels `fastpath-hooks install` of `request` (default all) would run."""
    request = frozenset(plan.decisions if request is None else request)
    good = frozenset(k for k, d in plan.decisions.items() if d.action == OK)
    out, placed = [], set()
    for name in pins.decision_order:
        if name not in request or name in placed or name not in plan.decisions:
            continue
        members = tuple(d for d in batch(plan, pins, name, request=request, good=good) if d.kernel not in placed)
        if len(members) > 1:
            out.append(members)
            placed.update(d.kernel for d in members)
    return out
