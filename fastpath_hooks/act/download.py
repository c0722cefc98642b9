"""`fastpath-hooks download`: the planned wheels for a target machine, into a wheelhouse.

The plan is made for a fresh machine of the target's kind (kernel packages
treated as absent), then every requirement it would install is fetched for the
target's Python and architecture with `pip download --only-binary=:all:
--no-deps`. Afterwards `FASTPATH_HOOKS_FIND_LINKS=DIR FASTPATH_HOOKS_OFFLINE=1`
installs from the directory alone.
"""

from __future__ import annotations

import os
import shutil
import sys

from ..decide.plan import INSTALL, REPAIR, StepKind


class DownloadError(Exception):
    pass


def platform_tags(arch: str) -> list[str]:
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(39, 16, -1)]
    return tags + [f"manylinux2014_{arch}", f"linux_{arch}"]


def requirements_for(plan, kernels=None) -> tuple[list, list, list]:
    """(binary requirements, wheel steps, source-build requirements) of the acting decisions."""
    binary, wheels, builds = [], [], []
    for kernel, decision in plan.decisions.items():
        if kernels and kernel not in kernels and kernel not in _needed_by(plan, kernels):
            continue
        if decision.action not in (INSTALL, REPAIR):
            continue
        for step in decision.steps:
            if step.kind == StepKind.WHEEL:
                wheels.append(step)
            elif step.kind == StepKind.BUILD:
                builds.extend(step.requirements)
            else:
                binary.extend(r for r in step.requirements if r not in binary)
    return binary, wheels, builds


def _needed_by(plan, kernels) -> set:
    out = set()
    for k in kernels:
        out.update(plan.decisions[k].needs)
    return out


def download(settings, pins, *, dest: str, kernels=None) -> list[str]:
    from ..decide.policy import decide
    from ..facts.probe import probe

    env = probe(settings, pins=pins)
    plan = decide(env, settings, pins, fresh=True)
    binary, wheels, builds = requirements_for(plan, kernels)
    if not (binary or wheels):
        reasons = "; ".join(f"{k}: {d.reason}" for k, d in plan.decisions.items())
        raise DownloadError(f"nothing to download for this target ({reasons})")
    os.makedirs(dest, exist_ok=True)
    before = set(os.listdir(dest))
    if binary:
        py = ".".join(env.python.split(".")[:2])
        argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-input",
                "--no-deps", "--only-binary=:all:", "--dest", dest, "--python-version", py,
                "--implementation", "cp"]
        for tag in platform_tags(env.arch):
            argv += ["--platform", tag]
        if settings.index_url:
            argv += ["--index-url", settings.index_url]
        for link in settings.find_links:
            argv += ["--find-links", link]
        argv += binary
        from .runner import run

        ran = run(argv, timeout=settings.timeout, label=f"downloading {', '.join(binary)}")
        if ran.timed_out:
            raise DownloadError(f"pip download of {' '.join(binary)} did not finish within {settings.timeout:.0f} s "
                                "(FASTPATH_HOOKS_TIMEOUT)")
        if ran.code != 0:
            tail = " | ".join(ran.output.strip().splitlines()[-3:])
            if "No module named pip" in ran.output:
                tail += f" (download runs `pip download` with {sys.executable}: `{sys.executable} -m ensurepip` adds pip)"
            raise DownloadError(f"pip download failed for {' '.join(binary)}: {tail}")
    for step in wheels:
        _fetch(step, dest, settings)
    if builds:
        from packaging.requirements import Requirement

        kernels_built = [pins.build_for_distribution(Requirement(r).name)[0] or Requirement(r).name for r in builds]
        how = "; ".join(f"`fastpath-hooks build {k} --arch ARCH --dest {dest}`" for k in kernels_built)
        print(f"note: source builds are not downloaded ({', '.join(builds)}); build the wheel for the target's "
              f"GPUs into the wheelhouse on a machine with its torch and nvcc: {how}", file=sys.stderr)
    return sorted(os.path.join(dest, n) for n in set(os.listdir(dest)) - before) or \
        sorted(os.path.join(dest, n) for n in os.listdir(dest))


def _fetch(step, dest: str, settings) -> None:
    """The step's wheel into `dest` (copied from FASTPATH_HOOKS_FIND_LINKS or the wheel cache where it lies)."""
    from .fetch import FetchError, fetch_wheel

    try:
        local = fetch_wheel(step, settings, dest)
    except FetchError as exc:
        raise DownloadError(str(exc)) from None
    target = os.path.join(dest, os.path.basename(local))
    if os.path.abspath(local) != os.path.abspath(target):
        shutil.copy2(local, target)
