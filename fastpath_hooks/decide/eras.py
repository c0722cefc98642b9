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
"""

from __future__ import annotations


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
