"""Installer command lines for plan steps (pure: no process is started here).

Both installers get the same protections: a constraints file that pins every
protected distribution to the version installed now, `--no-deps` for the kernel
distributions, binary wheels only unless a source build was allowed, and the
user's FIND_LINKS / OFFLINE / INDEX_URL choices. Anything not set here comes from
pip's or uv's own configuration.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from ..facts.distributions import canonical_name
from .plan import Step, StepKind

CONSTRAINTS_PLACEHOLDER = "<constraints.txt>"


@dataclass(frozen=True)
class Invocation:
    argv: tuple
    env: tuple          # extra environment for the installer process
    step: Step

    def to_json(self) -> dict:
        return {"argv": list(self.argv), "env": dict(self.env), "kind": self.step.kind}


def choose_installer(settings, env) -> str:
    """The installer to run (pip where none is available: `installer_choice` says why it cannot work)."""
    return installer_choice(settings, env)[0] or "pip"


def installer_choice(settings, env) -> tuple:
    """(uv, pip or None, why). Auto mode prefers uv, except where pip is configured with its own index or
    find-links and fastpath-hooks is given none: uv ignores pip's configuration and would resolve
    the unpinned dependencies from public PyPI instead of the site's index. None: no installer can
    run here (`uv venv` makes no pip, and uv may not be on PATH; site-packages cannot be written); `why` is
    `<what is missing>; <the fix>`."""
    if env.unwritable_site:
        return None, (f"site-packages is not writable ({env.unwritable_site}); install as the environment's owner, "
                      "or set FASTPATH_HOOKS_SKIP")
    if settings.installer == "uv" and not env.uv:
        return None, ("FASTPATH_HOOKS_INSTALLER=uv but no uv found; put uv on PATH, or unset it and run "
                      "`python -m ensurepip`")
    if settings.installer == "pip" and not env.pip:
        return None, "FASTPATH_HOOKS_INSTALLER=pip but no pip here; run `python -m ensurepip`, or put uv on PATH"
    if settings.installer != "auto":
        return settings.installer, f"FASTPATH_HOOKS_INSTALLER={settings.installer}"
    if not env.uv:
        if not env.pip:
            return None, ("no installer: no uv found, no pip here; put uv on PATH (FASTPATH_HOOKS_INSTALLER=uv) "
                          "or run `python -m ensurepip`")
        return "pip", "auto: uv not found"
    own_index = settings.offline or settings.index_url
    if env.pip_index_config and not own_index and env.pip:
        return "pip", (f"auto: pip's configuration names an index or find-links ({env.pip_index_config}), "
                       "which uv would ignore")
    return "uv", "auto: uv found"


def uv_executable(env) -> str | None:
    """The uv to run: None when uv is absent or only posed by a target (`uv=yes`)."""
    return None if env.uv in (None, "posed") else env.uv


def protected_constraints(installed: dict, protected) -> list[str]:
    """`name==version` for each protected distribution that is installed (real versions, never posed ones)."""
    return [f"{name}=={installed[name]}" for name in protected if name in installed]


def constraints(installed: dict, protected, named=()) -> list[str]:
    """The constraints file's lines, as the installer writes them for steps that name `named`
    (and as `fastpath-hooks plan` prints them): every installed distribution the steps do not name
    pinned to its current version, the protected ones (torch, triton, numpy, transformers) first.
    The rest keep a dependency resolve from upgrading anything the user has that the transaction
    does not back up (only the named distributions are). Real versions only, never posed ones."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version


    lines = protected_constraints(installed, protected)
    free = {canonical_name(n) for n in named}
    for name in sorted(installed):
        if name in free or name in protected or name.startswith("~"):
            continue
        line = f"{name}=={installed[name]}"
        try:
            Requirement(line)
            Version(installed[name])
        except (InvalidRequirement, InvalidVersion):
            continue
        lines.append(line)
    return lines


def installed_after_needs(decisions, kernel: str, installed: dict) -> dict:
    """What the installer finds installed when `kernel`'s own steps run: `installed`, then the
    targets of the kernels it needs, in the order the engine installs them (depth first:
    causal-conv1d before mamba-ssm, tilelang before fla). A wheel step's version is its file's
    (local label included); a build's is its public version, which `==` matches whatever local
    label the build adds. A dependency's version the resolver picks cannot be known in advance."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename


    out, seen = dict(installed), set()

    def add(name: str) -> None:
        for dep in decisions[name].needs:
            if dep in seen or dep not in decisions:
                continue
            seen.add(dep)
            add(dep)
            decision = decisions[dep]
            if not decision.acts:
                continue
            out.update((canonical_name(d), v) for d, v in decision.target.items())
            for step in decision.steps:
                if step.kind != "wheel":
                    continue
                filename = os.path.basename(step.url or step.requirements[0])
                try:
                    dist = parse_wheel_filename(filename)[0]
                except InvalidWheelFilename:
                    continue
                out[canonical_name(dist)] = filename.split("-")[1]   # as spelled (`abiTRUE`), as installed

    add(kernel)
    return out


def step_names(steps) -> set:
    """The canonical distribution names the steps install (a wheel step: its file's distribution)."""
    return {name for step in steps for name in step.names}


def invocation(step: Step, *, installer: str, settings, python: str | None = None, uv: str | None = None,
               constraints_file: str = CONSTRAINTS_PLACEHOLDER, local_file: str | None = None,
               local_files=()) -> Invocation:
    """The argv that runs `step`. `local_file`: for wheel steps, the downloaded/wheelhouse path;
    `local_files`: several wheel files installed by one call (the cached kernels of one request)."""
    python = python or sys.executable
    if step.kind == StepKind.BUILD:  # builds the wheel (installed next, from the work directory, and cached)
        return Invocation(argv=tuple(build_argv(step, settings=settings, out_dir="<work>/built", python=python)),
                          env=tuple(step.env), step=step)
    reqs = list(step.requirements)
    if step.kind in (StepKind.WHEEL, StepKind.INDEX):   # a wheel step may carry dependencies by name (act/batch.py)
        named = [r for r in step.requirements
                 if step.kind == StepKind.WHEEL and not r.endswith(".whl") and r not in local_files]
        files = [r for r in step.requirements if r not in named]
        reqs = named + (list(local_files) or [local_file or step.url or files[0]])
    if installer == "uv":
        argv = [uv or "uv", "pip", "install", "--python", python]
        if step.no_deps:
            argv.append("--no-deps")
        if step.binary_only:
            argv += ["--only-binary", ":all:"]
        if step.force:
            for name in step.names:
                argv += ["--reinstall-package", name]
        if not step.build_isolation:
            argv.append("--no-build-isolation")
        argv += ["--constraints", constraints_file]
    else:
        argv = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--progress-bar", "off"]
        if step.no_deps:
            argv.append("--no-deps")
        if step.binary_only:
            argv.append("--only-binary=:all:")
        if step.force:
            argv.append("--force-reinstall")
        if not step.build_isolation:
            argv.append("--no-build-isolation")
        argv += ["--constraint", constraints_file]
    argv += index_flags(settings) + list(reqs)
    return Invocation(argv=tuple(argv), env=tuple(step.env), step=step)


def index_flags(settings) -> list:
    """Where pip/uv may look: no index offline, else the one set; the wheelhouses either way."""
    flags = ["--no-index"] if settings.offline else ["--index-url", settings.index_url] if settings.index_url else []
    for link in settings.find_links:
        flags += ["--find-links", link]
    return flags


def build_argv(step, *, settings, out_dir: str, python: str | None = None) -> list:
    """`pip wheel` of a build step's sdist: against the installed torch (no build isolation), never
    through pip's wheel cache (keyed by the sdist alone, it would hand an old build back under a
    new torch), never a wheel instead of the sdist (--no-binary)."""
    argv = [python or sys.executable, "-m", "pip", "wheel", "-v", "--disable-pip-version-check", "--no-input",
            "--progress-bar", "off", "--no-deps", "--no-build-isolation", "--no-cache-dir"]
    for name in step.names:
        argv += ["--no-binary", name]
    return argv + index_flags(settings) + ["-w", out_dir, *step.requirements]


def requirements_for(plan, kernels=None) -> tuple[list, list, list]:
    """(binary requirements, wheel steps, source-build requirements) of the acting decisions of
    `kernels` (all when None) and of the kernels they need: what `fastpath-hooks download` fetches."""
    needed = set()
    for kernel in kernels or ():
        needed.update(plan.decisions[kernel].needs)
    binary, wheels, builds = [], [], []
    for kernel, decision in plan.decisions.items():
        if kernels and kernel not in kernels and kernel not in needed:
            continue
        if not decision.acts:
            continue
        for step in decision.steps:
            if step.kind == StepKind.WHEEL:
                wheels.append(step)
            elif step.kind == StepKind.INDEX:
                continue   # looked up on the index at install time, for the machine installing it
            elif step.kind == StepKind.BUILD:
                builds.extend(step.requirements)
            else:
                binary.extend(r for r in step.requirements if r not in binary)
    return binary, wheels, builds
