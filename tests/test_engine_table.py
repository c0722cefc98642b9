"""The engine's transitions, one row each, in milliseconds: the real state machine and the real policy
over a TableWorld (tests/support/worlds.py) - an outside made of values: the Environment the test
holds, a lock that is free, contended (with what another process does meanwhile) or unavailable,
scripted verifications, an installer that installs the decision's target or fails, and the real
verdict cache in a temporary directory.

Each row names what the world is like, and what must follow: the states passed through, the
outcome, how often the world was read / locked / installed into / verified, what the verdict cache
holds afterwards (a verdict, a warm verdict for the next start), and a line the user sees.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest

from fastpath_hooks import events
from fastpath_hooks.decide.plan import OK, REPAIR
from fastpath_hooks.engine.machine import State
from fastpath_hooks.engine.outcome import Outcome, OutcomeState
from fastpath_hooks.facts.settings import Settings
from support.worlds import PINS, TILELANG_PAIR, TableWorld, environment

FLA = {"fla-core": "0.6.0", "flash-linear-attention": "0.6.0"}
HOPPER = dict(gpus=("sm_90",), triton="3.6.0")      # fla needs tilelang here (the sm_90 + triton < 3.7.1 hazard)

CAUSAL = {"causal-conv1d": "1.6.2.post1", "ninja": "1.13.0"}
MEASURED = "on sm_80, causal_conv1d_fn forward differs from torch by 0.43 (tolerance 0.05 + 1%)"
# the line: the measured error without its tolerance (doctor has it whole), and the fix
BLOCKED_LINE = ("causal-conv1d: blocked - on sm_80, causal_conv1d_fn forward differs from torch by 0.43 "
                "(pin a good release: fastpath-hooks doctor)")


def _next_mamba():
    """The shipped pins plus a mamba-ssm release whose CUDA extension is opt-in (2.4.0 stands for the next one)."""
    import json
    import tempfile

    from fastpath_hooks.facts import pins as pins_mod

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump({"kernels": {"mamba-ssm": {"releases": [
            {"version": "2.4.0", "torch": ">=2.6", "triton": ">=3.5.0", "source": "upstream: test stand-in"}]}}}, fh)
    return pins_mod.load(fh.name)


NEXT_MAMBA = _next_mamba()

S = State
INSTALLED = (S.CONTEXT, S.READ, S.NEEDS, S.CACHED, S.LOCK, S.CHECK, S.INSTALL, S.RECORD)
VERIFIED = (S.CONTEXT, S.READ, S.NEEDS, S.CACHED, S.LOCK, S.CHECK, S.VERIFY, S.RECORD)
REPAIRED = (S.CONTEXT, S.READ, S.NEEDS, S.CACHED, S.LOCK, S.CHECK, S.VERIFY, S.INSTALL, S.RECORD)


# -- what other processes do while this one waits for the lock --------------------------------

def other_installs_fla(world):
    world.add(FLA)
    world.verdict("fla", "good")


def other_fails_fla(world):
    world.verdict("fla", "failed", "could not install - index unreachable")


def other_takes_the_gpu(world):
    world.env = environment(gpus=())
    world.generation += 1


def other_verifies_tilelang(world):
    world.verdict("tilelang", "good")


# -- the table ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    name: str
    kernel: str
    state: OutcomeState
    trail: tuple
    env: dict = field(default_factory=dict)          # environment() facts
    dists: dict = field(default_factory=dict)        # installed distributions
    world: dict = field(default_factory=dict)        # TableWorld attributes
    settings: dict = field(default_factory=dict)
    calls: dict = field(default_factory=dict)        # world calls expected (absent: 0)
    verdict: str | None = None                       # the kernel's verdict afterwards
    warm: bool = False                               # a warm verdict was written for the next start
    says: str | None = None                          # a line the user sees
    check: object = None                             # more: check(world, run)
    pins: object = None                              # the pins (default the shipped ones)


def _repair_is_the_policys(world, run):
    (installed,) = world.installed_decisions
    planned = run.plan["tilelang"]
    assert installed == planned.repair and installed.action == REPAIR and installed.steps == planned.repair_steps
    assert installed.rule == "tilelang.ok.repair" and dict(installed.target) == {"apache-tvm-ffi": "0.1.12",
                                                                               "tilelang": "0.1.15"}
    assert run.outcome.reason == "aborted at import (SIGABRT); repaired"


def _numbers_blocked(world, run):
    from fastpath_hooks.decide.common import NUMERIC_FIX

    assert run.decision.on_failure == "block" and run.decision.fix == NUMERIC_FIX, run.decision
    assert run.outcome.reason == MEASURED and "Fix: pin a release that fixes it" in run.outcome.block
    assert not world.installed_decisions or world.installed_decisions[0].rule == "causal.wheel"


def _numbers_planned(world, run):
    """The verification is handed the kernel's numeric plan: its checks, skipped on a posed GPU (no device here)."""
    (plan,) = world.numeric_plans
    assert plan.kernel == "causal-conv1d" and plan.archs == ("sm_80",) and plan.device is None
    assert [c.name for c in plan.checks] == ["causal_conv1d_fn", "causal_conv1d_fn_channel_last", "causal_conv1d_update"]


def _installed_the_plan(world, run):
    (installed,) = world.installed_decisions
    assert installed == run.plan["fla"] and dict(installed.target) == FLA


ROWS = [
    Row("uncontended install: the world read once, the verdict and a warm verdict in one write",
        "fla", OutcomeState.INSTALLED, INSTALLED,
        calls={"read": 1, "probe": 1, "decide": 1, "lock": 1, "install": 1, "settle": 1, "recover": 1, "stamp": 3},
        verdict="good", warm=True, says="fla: installed fla-core 0.6.0, flash-linear-attention 0.6.0",
        check=_installed_the_plan),
    Row("contended lock, nothing changed meanwhile: not read again",
        "fla", OutcomeState.INSTALLED, INSTALLED, world={"meanwhile": lambda w: None},
        calls={"read": 1, "probe": 1, "decide": 1, "lock": 1, "install": 1, "settle": 1, "recover": 1, "stamp": 3},
        verdict="good", warm=True),
    Row("contended lock, another process installed it meanwhile: read again, its verdict, no install",
        "fla", OutcomeState.OK, (S.CONTEXT, S.READ, S.NEEDS, S.CACHED, S.LOCK, S.CHECK, S.RECORD),
        world={"meanwhile": other_installs_fla},
        calls={"read": 2, "probe": 2, "decide": 2, "lock": 1, "recover": 1, "stamp": 2}, verdict="good", warm=True,
        says="fla: ready - done by another process while this one waited"),
    Row("contended lock, another process failed meanwhile: its verdict, not a second attempt",
        "fla", OutcomeState.FAILED, (S.CONTEXT, S.READ, S.NEEDS, S.CACHED, S.LOCK, S.CHECK),
        world={"meanwhile": other_fails_fla}, calls={"read": 1, "probe": 1, "decide": 1, "lock": 1, "recover": 1,
                                                     "stamp": 2},
        verdict="failed", says="s ago: could not install - index unreachable (tried again in 60 min; now: fastpath-hooks install fla)"),
    Row("the environment changed while waiting: read again, decided again (no GPU now: skipped)",
        "fla", OutcomeState.SKIPPED, (S.CONTEXT, S.READ, S.NEEDS, S.CACHED, S.LOCK, S.CHECK),
        world={"meanwhile": other_takes_the_gpu}, calls={"read": 2, "probe": 2, "decide": 2, "lock": 1, "recover": 1,
                                                         "stamp": 2}),
    Row("the lock's first holder in this environment (its state directory moved site-packages' mtime): not read again",
        "fla", OutcomeState.INSTALLED, INSTALLED, world={"first_lock": True},
        calls={"read": 1, "probe": 1, "decide": 1, "lock": 1, "install": 1, "settle": 1, "recover": 1, "stamp": 3},
        verdict="good", warm=True),
    Row("installed but unverified: checked under the lock, remembered",
        "tilelang", OutcomeState.OK, VERIFIED, env=HOPPER, dists={**TILELANG_PAIR, **FLA},
        calls={"read": 1, "probe": 1, "decide": 1, "lock": 1, "verify": 1, "recover": 1, "stamp": 2},
        verdict="good", warm=True),
    Row("contended check: another process verified it meanwhile - not verified twice",
        "tilelang", OutcomeState.OK, (S.CONTEXT, S.READ, S.NEEDS, S.CACHED, S.LOCK, S.CHECK, S.RECORD),
        env=HOPPER, dists={**TILELANG_PAIR, **FLA}, world={"meanwhile": other_verifies_tilelang},
        calls={"read": 1, "probe": 1, "decide": 1, "lock": 1, "recover": 1, "stamp": 2}, verdict="good", warm=True),
    Row("verification fails: the policy's repair runs under the same lock",
        "tilelang", OutcomeState.REPAIRED, REPAIRED, env=HOPPER, dists={**TILELANG_PAIR, **FLA},
        world={"verifications": [(False, "aborted at import (SIGABRT)")]},
        calls={"read": 1, "probe": 1, "decide": 1, "lock": 1, "verify": 1, "install": 1, "settle": 1, "recover": 1,
               "stamp": 3},
        verdict="good", warm=True, says="tilelang: check failed - aborted at import (SIGABRT) (repairing)", check=_repair_is_the_policys),
    Row("verification fails in report mode: not repaired, remembered as failed, blocked (it would abort)",
        "tilelang", OutcomeState.BLOCKED, (S.CONTEXT, S.READ, S.NEEDS, S.CACHED, S.VERIFY, S.RECORD),
        env=HOPPER, dists={**TILELANG_PAIR, **FLA}, settings={"mode": "report"},
        world={"verifications": [(False, "aborted at import (SIGABRT)")]},
        calls={"read": 1, "probe": 1, "decide": 1, "verify": 1, "stamp": 1}, verdict="failed",
        says="tilelang: blocked - aborted at import (SIGABRT)"),
    Row("a failure remembered for FASTPATH_HOOKS_RETRY_AFTER: no lock, no install",
        "fla", OutcomeState.FAILED, (S.CONTEXT, S.READ, S.NEEDS, S.CACHED),
        world={"remembered": ("fla", "failed", "could not install - index unreachable")},
        calls={"read": 1, "probe": 1, "decide": 1, "stamp": 1}, verdict="failed",
        says="s ago: could not install - index unreachable (tried again in 60 min; now: fastpath-hooks install fla)"),
    Row("report mode: says what it would do, takes no lock, installs nothing",
        "fla", OutcomeState.REPORTED, (S.CONTEXT, S.READ, S.NEEDS, S.CACHED, S.REPORT), settings={"mode": "report"},
        calls={"read": 1, "probe": 1, "decide": 1, "stamp": 1},
        says="fla: would install fla-core 0.6.0 + flash-linear-attention 0.6.0; nothing is installed"),
    Row("a need that is pending (asked for from inside its own decision): not installed, the torch path stays",
        "fla", OutcomeState.SKIPPED, (S.CONTEXT, S.READ, S.NEEDS), env=HOPPER,
        world={"needs": lambda other: Outcome(other, OutcomeState.PENDING, "being decided by this thread")},
        calls={"read": 1, "probe": 1, "decide": 1, "stamp": 1},
        says="fla: not installed - fla needs tilelang here and tilelang is not usable (being decided by this thread) "
             "(fix tilelang first: its line says how)"),
    Row("a pending need of an installed kernel that would compute wrongly without it: blocked (the policy's on_failure)",
        "fla", OutcomeState.BLOCKED, (S.CONTEXT, S.READ, S.NEEDS), env=HOPPER, dists=FLA,
        world={"needs": lambda other: Outcome(other, OutcomeState.PENDING, "being decided by this thread")},
        calls={"read": 1, "probe": 1, "decide": 1, "stamp": 1},
        says="fla: blocked - fla needs tilelang here and tilelang is not usable (being decided by this thread) "
             "(fix tilelang first: its line says how)"),
    # fla's check waits for its first call (transformers 5.15+): its warm verdict is written once that passes
    Row("a need decided first by the same world: one read for both kernels (the reading is shared)",
        "fla", OutcomeState.INSTALLED, INSTALLED, env=HOPPER,
        calls={"read": 2, "probe": 2, "decide": 2, "lock": 2, "install": 2, "settle": 2, "recover": 2, "stamp": 6},
        verdict="good", warm=False,
        check=lambda world, run: [d.kernel for d in world.installed_decisions] == ["tilelang", "fla"]
        and run.outcome.first_call is not None and run.outcome.first_call.payload["check"]["first_call"]),
    Row("the lock cannot be had for an install: failed, nothing installed",
        "fla", OutcomeState.FAILED, (S.CONTEXT, S.READ, S.NEEDS, S.CACHED, S.LOCK), world={"lock_unavailable": True},
        calls={"read": 1, "probe": 1, "decide": 1, "lock": 1, "stamp": 1}, says="fla: could not install"),
    Row("the lock cannot be had for a check: verified without it",
        "tilelang", OutcomeState.OK, (S.CONTEXT, S.READ, S.NEEDS, S.CACHED, S.LOCK, S.VERIFY, S.RECORD),
        env=HOPPER, dists={**TILELANG_PAIR, **FLA}, world={"lock_unavailable": True},
        calls={"read": 1, "probe": 1, "decide": 1, "lock": 1, "verify": 1, "stamp": 1}, verdict="good", warm=True),
    Row("no installer here: failed, and not remembered (installing uv takes effect at the next start)",
        "fla", OutcomeState.FAILED, (S.CONTEXT, S.READ, S.NEEDS, S.CACHED, S.LOCK, S.CHECK, S.INSTALL),
        world={"installer_answer": (None, "no installer: no uv found, no pip here")},
        calls={"read": 1, "probe": 1, "decide": 1, "lock": 1, "recover": 1, "stamp": 2},
        says="fla: not installed - no installer"),
    Row("the install fails: remembered as failed (rolled back by the installer)",
        "fla", OutcomeState.FAILED, INSTALLED, world={"install_error": "verification failed: ImportError: boom"},
        calls={"read": 1, "probe": 1, "decide": 1, "lock": 1, "install": 1, "recover": 1, "stamp": 2},
        verdict="failed", says="fla: could not install - verification failed: ImportError: boom"),
    Row("an install's journal at the start: waited for and rolled back under the lock, then read once",
        "fla", OutcomeState.INSTALLED, INSTALLED, world={"journal": True},
        calls={"read": 1, "probe": 1, "decide": 1, "lock": 2, "install": 1, "settle": 1, "recover": 2, "stamp": 4},
        verdict="good", warm=True),
    Row("an installed kernel's check hands the verification its numeric plan; good: remembered",
        "causal-conv1d", OutcomeState.OK, VERIFIED, dists=CAUSAL,
        calls={"read": 1, "probe": 1, "decide": 1, "lock": 1, "verify": 1, "recover": 1, "stamp": 2},
        verdict="good", warm=True, check=_numbers_planned),
    Row("its numbers differ from torch's in the check: no repair, blocked with the measured error, remembered",
        "causal-conv1d", OutcomeState.BLOCKED, VERIFIED, dists=CAUSAL, world={"verifications": [(False, MEASURED, True)]},
        calls={"read": 1, "probe": 1, "decide": 1, "lock": 1, "verify": 1, "recover": 1, "stamp": 2},
        verdict="failed", says=BLOCKED_LINE, check=_numbers_blocked),
    Row("the install is rolled back on its numbers: blocked with the measured error, remembered",
        "causal-conv1d", OutcomeState.BLOCKED, INSTALLED, dists={"ninja": "1.13.0"}, world={"install_numeric": MEASURED},
        calls={"read": 1, "probe": 1, "decide": 1, "lock": 1, "install": 1, "recover": 1, "stamp": 2},
        verdict="failed", says=BLOCKED_LINE, check=_numbers_blocked),
    Row("a build without mamba-ssm's opt-in CUDA extension, only Mamba-2 in use: verified, never a warm verdict",
        "mamba-ssm", OutcomeState.OK, VERIFIED, env={"model_types": ("mamba2",)}, pins=NEXT_MAMBA,
        dists={**CAUSAL, "mamba-ssm": "2.4.0+fph.torch2.10.0.cu128.abi1.py"},
        calls={"read": 1, "probe": 1, "decide": 1, "lock": 1, "verify": 1, "recover": 1, "stamp": 2},
        verdict="good", warm=False, check=lambda world, run: run.decision.rule == "mamba.ok.triton-only"),
    Row("FASTPATH_HOOKS_SKIP names it: the world is not even read", "fla", OutcomeState.SKIPPED, (S.CONTEXT,),
        settings={"skip": frozenset({"fla"})}),
    Row("invalid settings (report mode said once): decided, never remembered as warm",
        "tilelang", OutcomeState.OK, (S.CONTEXT, S.READ, S.NEEDS, S.CACHED, S.VERIFY, S.RECORD),
        env=HOPPER, dists={**TILELANG_PAIR, **FLA}, settings={"mode": "report"},
        world={"invalid": "a FASTPATH_HOOKS_* variable is invalid (see above)"},
        calls={"read": 1, "probe": 1, "decide": 1, "verify": 1, "stamp": 1}, verdict="good", warm=False),
    Row("nothing to do (no accelerator): skipped after one read, no lock", "fla", OutcomeState.SKIPPED,
        (S.CONTEXT, S.READ), env={"gpus": ()}, calls={"read": 1, "probe": 1, "decide": 1, "stamp": 1}),
]


@pytest.fixture
def quiet_world(tmp_path, monkeypatch):
    """Lines said once per environment go to a temporary cache; variables a decision sets are undone."""
    monkeypatch.setenv("FASTPATH_HOOKS_CACHE_DIR", str(tmp_path / "said"))
    saved = dict(os.environ)
    events.forget()
    seen = []
    events.add_listener(seen.append)
    yield seen
    events.clear_listeners()
    events.forget()
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_engine_transition(row, tmp_path, quiet_world):
    world = TableWorld(environment(row.dists, **row.env), tmp_path, settings=Settings(**row.settings),
                       invalid=row.world.get("invalid"), pins=row.pins or PINS)
    needs = None
    for key, value in row.world.items():
        if key == "remembered":
            world.verdict(*value)
        elif key == "needs":
            needs = value
        elif key != "invalid":
            setattr(world, key, value)
    run = world.run(row.kernel, needs=needs)

    assert run.outcome.state == row.state, run.outcome
    assert run.trail == row.trail, [s.value for s in run.trail]
    assert {k: v for k, v in world.calls.items() if v} == row.calls
    assert world.held == 0, "the lock is released whatever state the run ends in"
    cache = world.cache(world.settings)
    entry = cache.entries().get(row.kernel)
    assert (entry or {}).get("state") == row.verdict, entry
    assert bool(cache.warm_entries().get(row.kernel)) == row.warm
    if row.says:
        said = [e["message"] for e in quiet_world]
        assert any(row.says in m for m in said), said
    if row.check is not None:
        assert row.check(world, run) is not False


def test_a_warm_verdict_is_written_under_the_stamp_after_the_install(tmp_path, quiet_world):
    """The next start's signature is the one after the install: the warm verdict must be filed under it."""
    world = TableWorld(environment(), tmp_path)
    run = world.run("fla")
    warm = world.cache(world.settings).warm_entries()["fla"]
    assert list(warm) == [f"signature{world.generation}"] and world.generation == 1
    assert warm[f"signature{world.generation}"]["fingerprint"] == run.fingerprint


def test_the_repair_is_the_policys_decision_not_the_engines():
    """Decision.repair: decided with the decision (steps, target, rule), the engine only runs it."""
    from fastpath_hooks.decide.policy import decide

    env = environment({**TILELANG_PAIR, **FLA}, **HOPPER)
    decision = decide(env, Settings(), TableWorld.__init__.__globals__["PINS"])["tilelang"]
    assert decision.action == OK and decision.verify and decision.repair_steps
    repair = decision.repair
    assert repair is decision.repair                       # made once
    assert (repair.action, repair.steps, repair.repair_steps, repair.verify) == (REPAIR, decision.repair_steps, (), False)
    assert repair.on_failure == decision.on_failure and repair.needs == decision.needs
    ok_without = decide(environment(**HOPPER), Settings(), TableWorld.__init__.__globals__["PINS"])["fla"]
    assert not ok_without.repair_steps and ok_without.repair is None
