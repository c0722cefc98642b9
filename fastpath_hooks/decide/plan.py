"""The plan: per kernel one decision, as immutable values the policy returns."""

from __future__ import annotations

from dataclasses import dataclass, field

OK = "ok"            # already good: nothing to install
INSTALL = "install"  # install these exact requirements
REPAIR = "repair"    # replace what is installed (broken pair, incompatible version)
SKIP = "skip"        # leave alone; transformers keeps whatever it would use
BLOCK = "block"      # installed but would crash/compute wrongly here: make its import fail
ACTIONS = (OK, INSTALL, REPAIR, SKIP, BLOCK)

# The JSON schemas, documented field by field in docs/json-schema.md (checked by tests/test_cli.py).
# Fields are only added within a version; removing, renaming or changing one bumps the number.
PLAN_SCHEMA = "fastpath-hooks.plan/1"
DOCTOR_SCHEMA = "fastpath-hooks.doctor/1"


@dataclass(frozen=True)
class Step:
    """One installer invocation."""
    kind: str                        # deps | kernel | replace | wheel | build
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
        }


@dataclass(frozen=True)
class Decision:
    kernel: str
    action: str
    reason: str
    rule: str                         # id of the rule that decided (tests, debugging)
    steps: tuple = ()
    target: dict = field(default_factory=dict)      # dist -> exact version after the steps
    installed: dict = field(default_factory=dict)   # dist -> version now
    needs: tuple = ()                 # kernels that must be good first
    env: tuple = ()                   # ((NAME, VALUE), ...) set in this process before import
    verify: bool = False              # OK but a child-process check is due (unverified combination)
    repair_steps: tuple = ()          # what to run if that check fails
    on_failure: str = "proceed"       # proceed | block: what the import does if the action fails
    fix: str = ""                     # how the user can change the outcome
    transformers_uses: str = ""
    expected_seconds: float | None = None

    @property
    def acts(self) -> bool:
        return self.action in (INSTALL, REPAIR)

    def to_json(self) -> dict:
        return {
            "kernel": self.kernel,
            "action": self.action,
            "reason": self.reason,
            "rule": self.rule,
            "installed": dict(self.installed),
            "target": dict(self.target),
            "needs": list(self.needs),
            "env": dict(self.env),
            "verify": self.verify,
            "on_failure": self.on_failure,
            "fix": self.fix,
            "transformers_uses": self.transformers_uses,
            "expected_seconds": self.expected_seconds,
            "steps": [s.to_json() for s in self.steps],
            "repair_steps": [s.to_json() for s in self.repair_steps],
        }


@dataclass(frozen=True)
class Plan:
    environment: object               # probe.Environment
    decisions: dict                   # kernel -> Decision, in display order
    notes: tuple = ()

    def __getitem__(self, kernel: str) -> Decision:
        return self.decisions[kernel]

    def to_json(self) -> dict:
        return {
            "schema": PLAN_SCHEMA,
            "environment": self.environment.to_json(),
            "notes": list(self.notes),
            "decisions": [d.to_json() for d in self.decisions.values()],
        }
