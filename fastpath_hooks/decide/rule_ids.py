"""Every rule id the policy can emit, declared once (like pip's error codes or ruff's rule registry):
how its outcome is said and what it needs. The engine reads severities and needs from here, never
from the id's text; the policy makes its ids through `rule_id`, which accepts only declared ones.

An id is `<scope>.<suffix>`. The rules every kernel shares have the scope `skip`; the others the
kernel's rule prefix (its registry entry's `rule_prefix`: fla, tilelang, causal, mamba, qla) and a suffix
declared for the kernel's kind. Three families take their last part from the kernel's data:
`{accelerator}` (cuda, rocm, xpu), `{with}` (the rule prefix of a kernel it is used with) and
`{import}` (a distribution its import needs, `imports_installed`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..events import Severity

NVCC_RELEASE = "nvcc-release"   # needs nvcc's CUDA release: asked for (`nvcc --version`), then decided again
SHARED_SCOPE = "skip"


@dataclass(frozen=True)
class Rule:
    severity: Severity            # how its outcome is said: status, warning or error
    meaning: str                  # what it decides, in one line (a natural home for the fix a user reads)
    needs: frozenset = frozenset()   # NVCC_RELEASE
    machine_wide: bool = False    # said once for the machine and every kernel (no torch, no accelerator)
    engine: bool = False          # made by the engine (the repair of a failed check), not by a rule
    requires: tuple = ()          # KernelSpec fields that must be set for a kernel to get it (releases, switch)
    warm: bool = True             # a good outcome is remembered for the next start (False: decided again at each)


_S, _W = Severity.STATUS, Severity.WARNING

# every kind: a kernel with numeric checks (pins: numeric_checks) whose numbers were measured wrong here
NUMERIC = {
    "block.numeric": Rule(_W, "its numbers were measured wrong on a visible GPU under this torch build: blocked",
                          requires=("numeric_checks",)),
}
# a compiled kernel whose CUDA extension is opt-in (pins: source_build.cuda_switch): where only model families
# that use its Triton ops are in use, nothing is compiled - good for those families only, so never a warm verdict
_SWITCH = ("cuda_switch",)

SHARED = {
    "user": Rule(_S, "the kernel is in FASTPATH_HOOKS_SKIP"),
    "no-torch": Rule(_S, "torch is not installed", machine_wide=True),
    "no-accelerator": Rule(_S, "torch sees no GPU it can use", machine_wide=True),
    "python": Rule(_S, "Python is outside the kernel's support"),
    "platform": Rule(_S, "the kernel has no builds for this OS and CPU"),
    "glibc": Rule(_S, "the kernel's wheels need a newer glibc"),
    "torch": Rule(_S, "torch is outside the kernel's support"),
    "accelerator.{accelerator}": Rule(_S, "the kernel does not run on this kind of GPU"),
}

PURE = {
    "install": Rule(_S, "a pinned release fits torch, triton and transformers: install it"),
    "repair": Rule(_S, "the installed release is broken, unsafe or half-installed here: replace it"),
    "ok": Rule(_S, "installed and fine here"),
    "ok.with-problems": Rule(_S, "installed with problems nothing pinned can fix here: left as it is"),
    "hazard.block": Rule(_W, "installed, but wrong here without the kernel a hazard needs: its import is blocked"),
    "hazard.skip": Rule(_W, "a hazard needs a serving kernel that cannot be had: not installed"),
    "unsafe.block": Rule(_W, "installed without the backend a hazard needs, nothing to replace it with: blocked"),
    "incompatible.block": Rule(_W, "installed and does not import with this triton, nothing to replace it: blocked"),
    "no-release": Rule(_S, "no pinned release fits here"),
    "offline-missing": Rule(_S, "offline, and the wheelhouse lacks the release's wheels"),
    "xpu.old-transformers": Rule(_S, "this transformers uses the kernel on CUDA only", requires=("gates",)),
    "no-{import}": Rule(_S, "a distribution its import needs (never installed by fastpath-hooks) is missing"),
    **NUMERIC,
}

PAIR = {
    "install": Rule(_S, "a served kernel needs it here: install a known-good pair"),
    "install.nvcc": Rule(_S, "the pair is there but nvcc is not: install the nvcc wheel", requires=("nvcc_packages",)),
    "ok": Rule(_S, "a known-good pair is installed; checked once in a child process"),
    "ok.unverified": Rule(_S, "an installed pair the pins do not know; checked once in a child process"),
    "ok.not-needed": Rule(_S, "installed; nothing here needs it"),
    "not-needed": Rule(_S, "nothing here needs it: not installed"),
    "user-disabled": Rule(_S, "the served kernel is told (its switch variable) not to use it", requires=("switch",)),
    "no-nvcc": Rule(_W, "it compiles at run time and there is no nvcc", requires=("needs_nvcc",)),
    "offline-missing": Rule(_S, "offline, and the wheelhouse lacks a known-good pair"),
    "repair.{problem}": Rule(_S, "the installed pair is broken, half-installed or incomplete: repair it"),
    "repair.{problem}.offline-missing": Rule(_W, "a broken pair, offline, the wheelhouse lacks the repair: blocked"),
    "repair.{problem}.unrepairable": Rule(_W, "a broken pair the pins know no repair for: blocked"),
    "install.for-backend": Rule(_S, "a backend kernel that runs on it is on by default here: install a known-good pair"),
    "ok.repair": Rule(_S, "the check of a known-good pair failed: repaired", engine=True),
    "ok.unverified.repair": Rule(_S, "the check of an unknown pair failed: repaired to a known-good one", engine=True),
    **NUMERIC,
}
PAIR_PROBLEMS = ("half-installed", "broken-pair", "missing-companion")

COMPILED = {
    "ok": Rule(_S, "installed; checked once in a child process (a wrong-arch build can crash at import)"),
    "ok.half-installed": Rule(_S, "half-installed and cannot be reinstalled here: checked as it is"),
    "repair.half-installed": Rule(_S, "half-installed: reinstalled"),
    "block.arch": Rule(_W, "an installed build has no code for a visible GPU, or code an arch rule says is wrong there"),
    "cache": Rule(_S, "a fitting wheel in the local wheel cache: installed from it"),
    "wheelhouse": Rule(_S, "a wheel built for this machine in the wheelhouse: installed from it"),
    "wheel": Rule(_S, "the release wheel for this torch, CUDA, ABI and Python: installed"),
    "index": Rule(_S, "a wheel from a package index the settings allow, else a source build for the visible GPUs",
                  requires=("wheel_indexes",)),
    "index.only": Rule(_S, "a wheel from a package index the settings allow; no source build is possible here",
                       requires=("wheel_indexes",), needs=frozenset({NVCC_RELEASE})),   # a build may be once nvcc's release is known
    "build": Rule(_S, "a source build for the visible GPUs"),
    "build.all-archs": Rule(_S, "a source build for every arch the sdist knows (asked for)"),
    "rocm.build": Rule(_S, "a source build with hipcc for the visible GPUs"),
    "no-release": Rule(_S, "no pinned release fits here", requires=("releases",)),
    "offline-missing": Rule(_S, "offline, and the wheelhouse lacks what the install needs"),
    "no-wheel": Rule(_W, "no prebuilt wheel fits and source builds are off"),
    "rocm.no-build": Rule(_S, "no ROCm wheels and source builds are off"),
    "build.no-pip": Rule(_S, "a source build runs pip, which this environment lacks"),
    "rocm.no-hipcc": Rule(_S, "a ROCm source build needs hipcc, which is not found"),
    "no-nvcc": Rule(_W, "a source build needs a CUDA toolkit's nvcc, which is not found"),
    "nvcc-unknown": Rule(_S, "nvcc's CUDA release cannot be told, so a build is not started unasked",
                         needs=frozenset({NVCC_RELEASE})),
    "nvcc-mismatch": Rule(_S, "nvcc's CUDA major differs from torch's"),
    "build.no-arch": Rule(_S, "the sdist compiles no code for a visible GPU"),
    "build.unrestricted": Rule(_S, "a build cannot be restricted to the visible GPUs, and one for all takes long"),
    "build.timeout": Rule(_S, "the build would take longer than FASTPATH_HOOKS_TIMEOUT"),
    "without.{with}": Rule(_S, "a kernel it is only useful with is not installed here"),
    "no-{import}": Rule(_S, "a distribution its import needs (never installed by fastpath-hooks) is missing"),
    "build.triton-only": Rule(_S, "only families that use its Triton ops are in use: built without its CUDA extension",
                              requires=_SWITCH, warm=False),
    "ok.triton-only": Rule(_S, "installed without its CUDA extension, only families that do not call it in use",
                           requires=_SWITCH, warm=False),
    "repair.cuda": Rule(_S, "installed without its CUDA extension and a family in use calls it: rebuilt with it",
                        requires=_SWITCH),
    "block.no-cuda": Rule(_W, "installed without its CUDA extension, a family in use calls it, no rebuild here: blocked",
                          requires=_SWITCH),
    **NUMERIC,
}

BACKEND = {
    "install": Rule(_S, "the fastest correct path here: install it; checked against the served kernel's own path"),
    "ok": Rule(_S, "installed; checked once against the served kernel's own path (and its JIT warmed)"),
    "not-used": Rule(_S, "the kernel it serves is not used here: not installed"),
    "no-backend": Rule(_S, "the served kernel's release does not dispatch to it"),
    "user-disabled": Rule(_S, "the served kernel is told (its switch variable) not to use it", requires=("switch",)),
    "arch": Rule(_S, "a visible GPU cannot train with it (no kernels, or a forward only)"),
    "no-nvcc": Rule(_W, "its kernels compile at first use and there is no nvcc", requires=("needs_nvcc",)),
    "without.{with}": Rule(_S, "a kernel it runs on is not used here"),
    "old.{with}": Rule(_S, "a kernel it runs on is at a version its release does not support"),
    "off": Rule(_S, "not on by default here (pins `pays`: not measured to pay)"),
    "head-dims": Rule(_S, "the imported models' head dims are not the ones it computes"),
    "no-release": Rule(_S, "no pinned release fits torch here"),
    "offline-missing": Rule(_S, "offline, and the wheelhouse lacks its wheel"),
}

KINDS = {"pure": PURE, "pair": PAIR, "compiled": COMPILED, "backend": BACKEND}
ACCELERATORS = ("cuda", "rocm", "xpu")


def _expand(template: str, spec, pins) -> list:
    # skip.accelerator.<a>: only for an accelerator some kernel does not support
    unsupported = tuple(a for a in ACCELERATORS if pins is None or any(a not in k.accelerators for k in pins.kernels.values()))
    values = {"{accelerator}": unsupported, "{problem}": PAIR_PROBLEMS,
              "{with}": tuple(pins.kernel(k).rule_prefix for k in spec.with_kernels) if spec else (),
              "{import}": spec.imports_installed if spec else ()}
    for field, options in values.items():
        if field in template:
            return [template.replace(field, option) for option in options]
    return [template]


_declared: dict = {}   # pins digest -> {rule id: Rule}


def declared(pins) -> dict:
    """Every rule id these pins' kernels can get -> its Rule (the shared ones once)."""
    found = _declared.get(pins.digest)
    if found is None:
        found = {}
        for template, rule in SHARED.items():
            for suffix in _expand(template, None, pins):
                found[f"{SHARED_SCOPE}.{suffix}"] = rule
        for spec in pins.kernels.values():
            for template, rule in KINDS[spec.kind].items():
                if not all(getattr(spec, field) for field in rule.requires):
                    continue
                for suffix in _expand(template, spec, pins):
                    found[f"{spec.rule_prefix}.{suffix}"] = rule
        _declared[pins.digest] = found
    return found


def rule_id(pins, kernel: str, suffix: str) -> str:
    """`<kernel's rule prefix>.<suffix>`; a suffix not declared for the kernel's kind is a bug (KeyError)."""
    rule = f"{pins.kernel(kernel).rule_prefix}.{suffix}"
    if rule not in declared(pins):
        raise KeyError(f"rule {rule!r} is not declared for {kernel} ({pins.kernel(kernel).kind}) in decide/rule_ids.py")
    return rule


def shared(suffix: str) -> str:
    rule = f"{SHARED_SCOPE}.{suffix}"
    if not any(rule == f"{SHARED_SCOPE}.{s}" for t in SHARED for s in _expand(t, None, None)):
        raise KeyError(f"rule {rule!r} is not declared in decide/rule_ids.py")
    return rule


def lookup(pins, rule: str) -> Rule | None:
    """The declared Rule of an id these pins' policy emitted (None for one it cannot have)."""
    return declared(pins).get(rule)
