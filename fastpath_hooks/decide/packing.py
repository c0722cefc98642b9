"""Would packed-sequence (padding-free) training fail here, for which kernels, and what fixes it.

transformers 5.20+ raises `ValueError: <function> can't keep packed sequences apart without
<package>` when cu_seqlens or seq_idx reaches a kernel function on its torch path (pins.json
`packed_sequences` says which versions and packages). A pure function of the plan: `doctor`
reports it; nothing here acts.
"""

from __future__ import annotations

from .commands import installer_choice
from .plan import BLOCK, INSTALL, OK, REPAIR


def packed_sequences(plan, settings, pins, *, enabled: bool) -> dict:
    """{"transformers", "raises", "failures": [...]}; `enabled`: fastpath-hooks runs at interpreter
    start here (then a planned install happens before transformers needs the kernel)."""
    facts = pins.packed_sequences
    env = plan.environment
    version = env.version("transformers")
    parsed = env.dist_version("transformers")   # a 5.25 dev build raises too: pre-releases count
    raises = facts is not None and parsed is not None and facts.transformers.contains(parsed, prereleases=True)
    failures = []
    for package in facts.packages if raises else ():
        failure = _failure(package, plan, settings, enabled)
        if failure is not None:
            failures.append(dict(failure, package=package.kernel or package.distribution, kernel=package.kernel,
                                 models=list(package.models)))
    return {"transformers": version, "raises": raises, "failures": failures}


def _failure(package, plan, settings, enabled: bool) -> dict | None:
    if package.kernel is None:  # a distribution fastpath-hooks does not manage: only whether it is installed
        if plan.environment.version(package.distribution):
            return None
        return {"action": None, "problem": f"{package.distribution} is not installed (fastpath-hooks does not manage it)",
                "fix": f"install {package.distribution} (pip install {package.distribution})"}
    decision = plan.decisions.get(package.kernel)
    if decision is None or decision.action == OK:
        return None
    kernel = package.kernel
    if decision.action in (INSTALL, REPAIR):
        what = f"{decision.action} " + ", ".join(f"{k}=={v}" for k, v in decision.target.items())
        if decision.action == REPAIR:
            problem = f"{kernel} is broken here: {decision.reason}"
        elif decision.installed:
            problem = f"{kernel} " + ", ".join(f"{k} {v}" for k, v in decision.installed.items()) + \
                f" is not usable here: {decision.reason}"
        else:
            problem = f"{kernel} is not installed"
        if settings.mode == "report":
            return {"action": decision.action, "problem": problem + " and FASTPATH_HOOKS_MODE=report installs nothing",
                    "fix": f"unset FASTPATH_HOOKS_MODE: fastpath-hooks would then {what}"}
        installer, why = installer_choice(settings, plan.environment)
        if installer is None:   # no command of ours can do it here: the fix is what lets one run
            return {"action": decision.action, "problem": problem + ", and no installer can run here",
                    "fix": f"{why}; fastpath-hooks would then {what}"}
        if enabled:
            return None  # done at the first import, before transformers needs it
        return {"action": decision.action, "problem": problem,
                "fix": f"fastpath-hooks would {what} at the first import once active: `fastpath-hooks enable` "
                       f"(or fastpath_hooks.install() in the script); `fastpath-hooks install {kernel}` does it now"}
    verb = "blocked" if decision.action == BLOCK else "left alone"
    return {"action": decision.action, "problem": f"{kernel} is {verb} here: {decision.reason}",
            "fix": decision.fix or "none on this machine"}
