"""The engine's jobs beside `ensure()`, each through the World under the environment lock: rolling back
an install killed half-way before any kernel is imported (install(), the start-up hand-over, the import
of a kernel install(kernels=...) leaves out), and `fastpath-hooks build` / `download`, each a pure
planning step and an acting step, so the CLI can say what it will do before minutes of building.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace

from packaging.requirements import Requirement

from .. import events
from .._names import JOURNAL, STATE_DIR_NAME, cache_root
from ..act import fetch as wheelcache
from ..decide.builds import decide_build
from ..decide.plan import requirements_for
from ..decide.policy.compiled import built_fits
from ..events import fitted
from ..facts.environment import parse_target
from . import current_world
from .machine import roll_back


LABEL = "an interrupted install"   # who waits, in the lock's "waiting for another process" line


def pending_journal() -> str | None:
    """The journal hooks.install() looks for (the same rule, as a function), or None."""
    prefix = sys.prefix + os.sep
    for entry in sys.path:
        if entry.endswith("-packages") and entry.startswith(prefix):
            journal = os.path.join(entry, STATE_DIR_NAME, JOURNAL)
            if os.path.exists(journal):
                return journal
    return None


def recover_now(wait: bool = True) -> None:
    """Roll back this environment's interrupted install, if any, with the settings a decision reads.
    wait=False (install()): only when the lock is free now - an install holding it is running, not
    interrupted, and whoever imports its kernel waits for it there."""
    world = current_world()
    settings, _, invalid = world.context()
    failed = roll_back(world, settings, invalid, LABEL, wait=wait)[0] if world.pending(settings) else None
    if failed is not None:
        again = "the next kernel import tries again"
        events.error(fitted(f"{LABEL} here could not be rolled back yet: ", failed, again), once="recover-now",
                     detail=f"{LABEL} in this environment could not be rolled back yet: {failed}; {again}")


class Refused(ValueError):
    """Bad input for `build`: one line naming the problem and the fix."""


@dataclass(frozen=True)
class BuildPlan:
    kernel: str
    settings: object
    env: object                 # the probed facts, the GPUs replaced by the archs asked for
    pins: object
    decision: object = None     # the build's Decision (SKIP: not built, its reason and fix)
    cached: str | None = None   # a fitting wheel already in the wheel cache: nothing to build


def plan_build(kernel: str, *, settings, pins, archs: str | None = None, rebuild: bool = False) -> BuildPlan:
    """What `fastpath-hooks build KERNEL [--arch ARCHS] [--rebuild]` would do; Refused for bad input."""
    if kernel not in pins.source_builds:
        raise Refused(f"{kernel} is not built from source (its wheels are prebuilt); `build` knows "
                      f"{', '.join(pins.source_builds)}")
    env = current_world().probe(settings, pins, nvcc=True)
    if not (env.torch_cuda or env.torch_hip):   # what a build needs, no GPU among it; then nvcc (decide_build)
        have = f"torch {env.torch} is a {env.torch_build} build" if env.torch else "torch is not installed"
        raise Refused(f"a build needs CUDA (or ROCm) torch and nvcc, no GPU: {have} (install the torch it runs with, "
                      "or --target cuda=12.8)")
    if archs:
        wanted = [a.strip() for a in archs.split(",") if a.strip()]
        if wanted == ["all"]:
            gpus, settings = (), replace(settings, allow_build="1")
        else:
            spec = "gpu=" + "+".join(wanted)
            try:
                gpus = parse_target(spec)["gpus"]
            except ValueError as exc:   # the arch once: "--arch sm_999: sm_999 is not ..."
                raise Refused(f"--arch {archs}: {str(exc).removeprefix(repr(spec) + ': ')}") from None
            settings = replace(settings, allow_build="auto")
    elif env.gpus:
        gpus, settings = env.gpus, replace(settings, allow_build="auto")
    else:
        raise Refused(f"no GPU found here ({env.gpu_source}): name the archs to build for, e.g. --arch sm_90")
    env = replace(env, gpus=tuple(gpus))
    if gpus and not rebuild:
        have = [n for n in env.cached_wheels if built_fits(env, pins, n, kernel=kernel)]
        if have:
            return BuildPlan(kernel, settings, env, pins,
                             cached=os.path.join(wheelcache.directory(cache_root(settings)), have[0]))
    return BuildPlan(kernel, settings, env, pins, decision=decide_build(env, settings, pins, kernel))


def build(plan: BuildPlan) -> list:
    """The wheels of a BuildPlan into the cache, under the lock (an interrupted install rolled back
    first: its backup must not be overwritten); their paths, or InstallFailed (LockUnavailable too)."""
    world = current_world()
    lock = world.lock(plan.settings, plan.kernel)
    lock.acquire()
    try:
        world.recover(plan.settings)
        return world.build(plan.decision, settings=plan.settings, env=plan.env, pins=plan.pins)
    finally:
        lock.release()


@dataclass(frozen=True)
class DownloadPlan:
    env: object
    settings: object
    binary: tuple = ()          # requirements `pip download` fetches
    wheels: tuple = ()          # wheel steps (release wheels, the wheel cache)
    builds: tuple = ()          # source builds: not downloaded - `fastpath-hooks build ... --dest` makes them
    build_kernels: tuple = ()   # the kernels of those builds
    nothing: str | None = None  # why there is nothing to download (every decision's reason)
    nothing_line: str = ""      # the same, short: one line with its fix


def plan_download(*, settings, pins, kernels=None) -> DownloadPlan:
    """What `fastpath-hooks download` fetches: the plan for a fresh machine of the target's kind."""
    world = current_world()
    env = world.probe(settings, pins)
    plan = world.decide(env, settings, pins, fresh=True)
    binary, wheels, builds = requirements_for(plan, kernels)
    if not (binary or wheels):
        return DownloadPlan(env, settings, nothing="; ".join(f"{k}: {d.reason}" for k, d in plan.decisions.items()),
                            nothing_line=_nothing_line(plan, settings.target))
    built = tuple(pins.build_for_distribution(Requirement(r).name)[0] or Requirement(r).name for r in builds)
    return DownloadPlan(env, settings, tuple(binary), tuple(wheels), tuple(builds), built)


def _nothing_line(plan, target: str | None) -> str:
    """Why nothing is to be downloaded, in one line with its fix: the decisions' short forms (one reason said once
    where every kernel has it), else a pointer to `plan`, which says each kernel's reason."""
    head = "nothing to download for this target: "
    said = list(dict.fromkeys((d.short_reason or d.reason, d.short_fix if d.short_reason else d.fix)
                              for d in plan.decisions.values()))
    each = "; ".join(f"{k}: {d.short_reason or d.reason}" + (f" ({d.short_fix})" if d.short_fix else "")
                     for k, d in plan.decisions.items())
    options = [head + said[0][0] + (f" ({said[0][1]})" if said[0][1] else "")] if len(said) == 1 else []
    return events.first_fitting(*options, head + each, head + "no kernel is to be installed there (why: fastpath-hooks "
                                f"plan{' --target ' + target if target else ''})")


def download(plan: DownloadPlan, dest: str) -> list:
    """The files of a DownloadPlan into `dest`; InstallFailed when they cannot be had."""
    return current_world().download(dest, env=plan.env, settings=plan.settings, binary=plan.binary,
                                    wheels=plan.wheels)
