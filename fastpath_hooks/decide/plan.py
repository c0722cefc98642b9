"""The plan: per kernel one decision, as immutable values the policy returns."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property


from packaging.requirements import InvalidRequirement, Requirement

from ..events import TextEnum
from ..facts.distributions import canonical_name
from ..facts.frozen import FrozenMap, FrozenSpecifierSet, freeze_fields, thaw
from ..facts.wheels import parse_wheel, wheel_distribution


class Action(TextEnum):
    OK = "ok"            # already good: nothing to install
    INSTALL = "install"  # install these exact requirements
    REPAIR = "repair"    # replace what is installed (broken pair, incompatible version)
    SKIP = "skip"        # leave alone; transformers keeps whatever it would use
    BLOCK = "block"      # installed but would crash/compute wrongly here: make its import fail


class OnFailure(TextEnum):
    """What the import does when the decided action (or its child-process check) fails."""
    PROCEED = "proceed"  # let the import go on: transformers finds whatever is there
    BLOCK = "block"      # make the import fail: transformers keeps its torch path


class StepKind(TextEnum):
    """What one installer invocation does."""
    DEPS = "deps"          # the kernel's runtime dependencies, resolved (never torch & co: constraints)
    KERNEL = "kernel"      # the kernel's pinned distributions, without their dependencies
    REPLACE = "replace"    # a broken companion replaced in place (tilelang's apache-tvm-ffi)
    WHEEL = "wheel"        # one wheel file (a release wheel, or one from the cache)
    INDEX = "index"        # one wheel of an exact version looked up on a package index (`url`: its project page);
                           # when none fits, the next index step or the build step of that distribution runs instead
    BUILD = "build"        # a source build into a wheel, then that wheel installed


OK, INSTALL, REPAIR, SKIP, BLOCK = Action.OK, Action.INSTALL, Action.REPAIR, Action.SKIP, Action.BLOCK

# The JSON schemas, documented field by field in docs/json-schema.md (checked by tests/test_cli.py).
# Fields are only added within a version; removing, renaming or changing one bumps the number.
PLAN_SCHEMA = "fastpath-hooks.plan/1"
DOCTOR_SCHEMA = "fastpath-hooks.doctor/1"


@dataclass(frozen=True)
class Want:
    """One requirement of a step, parsed once when the step is made (the installer, the commands
    and the engine read these, never the requirement text)."""
    name: str                          # canonical distribution name
    specifier: FrozenSpecifierSet      # a wheel file: ==its version

    @property
    def exact(self) -> str | None:
        """The version an `==X` requirement pins, else None."""
        specs = list(self.specifier)
        if len(specs) == 1 and specs[0].operator == "==" and not specs[0].version.endswith(".*"):
            return specs[0].version
        return None


def _want(kind: str, raw: str) -> Want:
    if raw.endswith(".whl") or (kind == StepKind.WHEEL and not _requirement(raw)):
        parsed = parse_wheel(raw)
        if parsed is None:  # not a standard name: its distribution is what comes before the version
            return Want(wheel_distribution(raw), FrozenSpecifierSet())
        return Want(parsed.distribution, FrozenSpecifierSet(f"=={parsed.version}"))
    req = Requirement(raw)   # a wheel step's dependency by name, too (act/batch.py: its wheels' call)
    return Want(canonical_name(req.name), FrozenSpecifierSet(str(req.specifier)))


def _requirement(raw: str) -> bool:
    try:
        Requirement(raw)
        return True
    except InvalidRequirement:
        return False


@dataclass(frozen=True)
class Step:
    """One installer invocation."""
    kind: StepKind
    requirements: tuple
    no_deps: bool = True
    force: bool = False
    binary_only: bool = True
    build_isolation: bool = True
    env: tuple = ()                  # ((NAME, VALUE), ...) for the installer process
    url: str | None = None           # wheel steps: where the file is fetched from
    sha256: str | None = None        # wheel steps: expected digest, when the pins know it
    note: str = ""
    archs: tuple = ()                # build steps: the GPU archs compiled for (("all",): every arch the sdist knows)
    cxx_std: str | None = None       # build steps: the C++ standard both compilers get last (pins: cxx_standard)

    _freezes_itself = True

    def __post_init__(self):
        object.__setattr__(self, "kind", StepKind(self.kind))
        freeze_fields(self)

    @cached_property
    def wants(self) -> tuple:
        """One Want per requirement, in order: parsed once, when the installer first asks (a
        replaced step, dataclasses.replace, parses its own)."""
        return tuple(_want(self.kind, raw) for raw in self.requirements)

    @property
    def names(self) -> tuple:
        """The canonical distribution names this step installs, in order."""
        return tuple(w.name for w in self.wants)

    @property
    def exact(self) -> FrozenMap:
        """name -> version for the requirements that pin one exact version."""
        return FrozenMap((w.name, w.exact) for w in self.wants if w.exact is not None)

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "requirements": list(self.requirements),
            "no_deps": self.no_deps,
            "force": self.force,
            "binary_only": self.binary_only,
            "build_isolation": self.build_isolation,
            "env": dict(self.env),
            "url": self.url,
            "sha256": self.sha256,
            "note": self.note,
            "archs": list(self.archs),
            "cxx_std": self.cxx_std,
        }


@dataclass(frozen=True)
class Decision:
    kernel: str
    action: Action
    reason: str
    rule: str                         # id of the rule that decided (tests, debugging)
    steps: tuple = ()
    target: FrozenMap = field(default_factory=FrozenMap)      # dist -> exact version after the steps
    installed: FrozenMap = field(default_factory=FrozenMap)   # dist -> version now
    needs: tuple = ()                 # kernels that must be good first
    wants: tuple = ()                 # backends ensured right after it, before its import (their outcome does not matter)
    env: tuple = ()                   # ((NAME, VALUE), ...) set in this process before import
    off: tuple = ()                   # ((NAME, VALUE), ...) set when it ends unusable: what keeps the kernel it serves off it
    check: FrozenMap = field(default_factory=FrozenMap)   # the gated-delta-rule check and warm-up its verification runs
    verify: bool = False              # OK but a child-process check is due (unverified combination)
    repair_steps: tuple = ()          # what to run if that check fails
    on_failure: OnFailure = OnFailure.PROCEED   # what the import does if the action fails
    fix: str = ""                     # how the user can change the outcome
    transformers_uses: str = ""
    expected_seconds: float | None = None
    # The short form the start-up line says (decide/messages.py, from the rule's templates in
    # decide/messages.py): `reason` and `fix` above stay whole for doctor, plan and the debug log.
    facts: FrozenMap = field(default_factory=FrozenMap)   # slot -> value only this decision's rule knows
    short_reason: str = ""
    short_fix: str = ""

    _freezes_itself = True

    def __post_init__(self):
        # a plain string from an older caller (or a test) becomes the member it names
        object.__setattr__(self, "action", Action(self.action))
        object.__setattr__(self, "on_failure", OnFailure(self.on_failure))
        freeze_fields(self)

    @property
    def acts(self) -> bool:
        return self.action in (INSTALL, REPAIR)

    @cached_property
    def repair(self) -> "Decision | None":
        """What runs when this decision's child-process check fails: its `repair_steps` as a REPAIR,
        decided with it (the engine executes it, never makes it); None without repair steps."""
        if not self.repair_steps:
            return None
        target = target_of(self.repair_steps)
        return replace(self, action=REPAIR, steps=self.repair_steps, repair_steps=(), verify=False,
                       rule=self.rule + ".repair", target=target,
                       reason="its check failed; replacing it with " + ", ".join(f"{k} {v}" for k, v in target.items()),
                       short_reason=self.facts.get("repair_reason", ""), short_fix=self.facts.get("repair_fix", ""))

    def to_json(self) -> dict:
        return {
            "kernel": self.kernel,
            "action": self.action,
            "reason": self.reason,
            "rule": self.rule,
            "installed": dict(self.installed),
            "target": dict(self.target),
            "needs": list(self.needs),
            "wants": list(self.wants),
            "env": dict(self.env),
            "off": dict(self.off),
            "check": thaw(self.check),
            "verify": self.verify,
            "on_failure": self.on_failure,
            "fix": self.fix,
            "transformers_uses": self.transformers_uses,
            "expected_seconds": self.expected_seconds,
            "short_reason": self.short_reason,
            "short_fix": self.short_fix,
            "steps": [s.to_json() for s in self.steps],
            "repair_steps": [s.to_json() for s in self.repair_steps],
        }


def target_of(steps) -> dict:
    """dist -> version the kernel/replace steps pin (read from the steps' parsed requirements)."""
    out = {}
    for step in steps:
        if step.kind in (StepKind.KERNEL, StepKind.REPLACE):
            out.update(step.exact)
    return out


@dataclass(frozen=True)
class Plan:
    environment: object               # facts.environment.Environment
    decisions: FrozenMap              # kernel -> Decision, in display order
    notes: tuple = ()

    _freezes_itself = True

    def __post_init__(self):
        freeze_fields(self)

    def __getitem__(self, kernel: str) -> Decision:
        return self.decisions[kernel]

    def to_json(self) -> dict:
        return {
            "schema": PLAN_SCHEMA,
            "environment": self.environment.to_json(),
            "notes": list(self.notes),
            "decisions": [d.to_json() for d in self.decisions.values()],
        }
