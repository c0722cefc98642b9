"""transformers' eras (shared notes: transformers-eras.md) and what one means for a kernel: the one
answer the policy, the reports and the late pass (hooks/late.py) share.

- A: 4.x (read from 4.56 - 4.57.6): plain gates, kernels bound at modeling import behind them;
- B: 5.0 - 5.14: cached gates; some families bind their kernels when a model is built;
- C: 5.15 - 5.24: no gate - a kernel function is chosen once, when the modeling module is
  imported, by whether `import <module>` succeeds;
- D: 5.25 and later: as C for the packages (used for the devices transformers lists for each), and
  HF `kernels` is required: from_pretrained on a GPU replaces the decorated functions with hub kernels
  (kernelize), where the hub has a build for this torch. Versions newer than the tables are taken as D.
A pre-release is its release's era (5.15.0rc1 is C: it carries 5.15's code). Anything else (no
version, or older than 4): None.

Would packed-sequence (padding-free) training fail here, for which kernels, and what fixes it.

transformers 5.20+ raises `ValueError: <function> can't keep packed sequences apart without
<package>` when cu_seqlens or seq_idx reaches a kernel function on its torch path (pins.json
`packed_sequences` says which versions and packages). A pure function of the plan: `doctor`
reports it; nothing here acts.
"""

from __future__ import annotations

from .commands import installer_choice
from .plan import BLOCK, INSTALL, OK, REPAIR


def era(version) -> str | None:
    """A / B / C for a transformers version: text (`transformers.__version__`), a packaging Version,
    or None."""
    major_minor = _release(version)
    if major_minor is None or major_minor[0] < 4:
        return None
    if major_minor[0] == 4:
        return "A"
    if major_minor < (5, 15):
        return "B"
    return "C" if major_minor < (5, 25) else "D"


def _release(version) -> tuple | None:
    if version is None:
        return None
    release = getattr(version, "release", None)   # a packaging Version
    if release is not None:
        return tuple(release[:2]) + (0,) * (2 - len(release[:2]))
    parts = str(version).strip().split(".")
    numbers = []
    for part in parts[:2]:
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        numbers.append(int(digits))
        if len(digits) < len(part):   # 5rc1: the rest of the text is the pre-release
            break
    if not numbers:
        return None
    return tuple(numbers) + (0,) * (2 - len(numbers))


def uses(env, pins, kernel: str) -> str:
    """Whether and how the installed transformers uses `kernel` here (a decision's `transformers_uses`)."""
    version = env.version("transformers")
    if version is None:
        return "transformers is not installed"
    spec = pins.kernel(kernel)
    if spec.serves:
        why = sorted({h.id for h in pins.hazards if h.needs == kernel})
        return f"not directly: {' and '.join(spec.serves)} uses it" + (f" (where {', '.join(why)} applies)" if why else "")
    module = spec.module
    if not spec.gates:
        return f"no transformers gate names it: whatever imports `{module}` uses it"
    which = era(env.dist_version("transformers"))
    if which is None:
        return f"transformers {version} is older than the eras fastpath-hooks knows (4.x and later)"
    if which == "C":
        return (f"transformers {version} (era C) imports {module} with a modeling module and uses it whenever "
                "that import succeeds, GPU or not")
    if which == "D":
        return (f"transformers {version} (era D) imports {module} with a modeling module and uses it for GPU inputs "
                "where no hub kernel replaces it (from_pretrained on a GPU asks the hub first)")
    yes = env.accelerator in ("cuda", "rocm")  # eras A/B gate on CUDA (ROCm torch reports as CUDA); XPU from 5.15 = era C
    where = "accelerator" if env.accelerator else "machine (no accelerator)"
    gates = " / ".join(f"{g}()" for g in spec.gates)
    also = f", which also need {' and '.join(spec.with_kernels)}" if spec.with_kernels else ""
    return f"transformers {version} (era {which}) asks {gates}{also}: {'yes' if yes else 'no'} on this {where}"


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
