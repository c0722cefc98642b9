"""Installing a kernel together with the others of its request (INSTALL, when decide/policy.py finds
more than this one): their builds side by side, one installer call, one check (World.install_batch).
The other members' verdicts are written here and remembered in the World for their own runs.
"""

from __future__ import annotations

from dataclasses import replace

from .. import events
from ..act.store import FAILED, GOOD as VERIFIED
from ..decide import messages as short
from ..decide.policy import batch
from .outcome import describe, engine_line, installed_line, numeric_block
from .world import Batched, InstallFailed


def batch_of(run) -> tuple:
    """The acting decisions installed together with this one (decide/policy.py), in dependency
    order, this one among them: the compiled kernels of the same request - being ensured in this
    process now, or said to be coming (engine.expect) - whose other needs are already usable. Just
    this decision otherwise (or a repair)."""
    if run.repairing or run.request is None:
        return (run.decision,)
    request = run.request()
    return batch(run.plan, run.pins, run.kernel, request=request.kernels, good=request.good, decision=run.decision)


def install_together(run, batch: tuple):
    """This kernel and the others of its request in one batch (World.install_batch). The others'
    verdicts are written here, under the fingerprint of what is on disk now, and remembered in the
    World for their own runs (CHECK), which then neither check nor install again. Returns this kernel's
    Run for RECORD (its verdict, and its install's result when it went in)."""
    world, settings, kernel, pins = run.world, run.settings, run.kernel, run.pins
    for decision in batch:   # each member's own reason, said as one install says it
        events.status(short.line(decision), decision.kernel,
                      detail=f"{decision.kernel}: installing {describe(decision, whole=True)} ({decision.reason})")
    events.status(f"{kernel}: installing {' and '.join(d.kernel for d in batch)} together: one installer call, "
                  "one check", kernel)
    try:
        result = world.install_batch(batch, settings=settings, env=run.env, pins=pins)
        results, failed, numeric = dict(result.results), dict(result.failed), set(result.numeric)
    except InstallFailed as exc:
        results, failed, numeric = {}, {d.kernel: str(exc) for d in batch}, set()
    any_result = next(iter(results.values()), None)
    env = world.settle(run.env, settings, pins, any_result) if any_result is not None else run.env
    for decision in batch:
        other = decision.kernel
        if other == kernel:
            continue
        done = results.get(other)
        if done is not None:
            detail = installed_line(other, done, decision)
            verdict = (world.fingerprint(env, settings, pins, other), VERIFIED, f"installed with {kernel}")
            world.batched[other] = Batched(True, decision.reason, kernel)
        else:
            detail = failed.get(other, "not installed")
            verdict = (world.fingerprint(env, settings, pins, other), FAILED, detail)
            world.batched[other] = Batched(False, detail, kernel, other in numeric)
            events.error(engine_line(f"{other}: could not install - ", detail), other, once=f"fail-{other}",
                         detail=f"{other}: could not install - {detail}")
        if not run.cache.record(other, verdict=verdict):
            events.debug(f"{other}: verdict not cached (the cache is read-only or busy)", other)
        events.debug(f"{other}: {detail}", other)
    mine = results.get(kernel)
    if mine is None:
        why = failed.get(kernel, "not installed")
        decision = numeric_block(run.decision, why, run.env.gpus) if kernel in numeric else run.decision   # as _install
        return replace(run, decision=decision, verdict=(False, why))
    return replace(run, verdict=(True, f"installed in {mine.seconds:.1f} s"), installed=mine)
