"""The plan: per kernel one immutable decision, the installer command lines of its steps (pip and uv get the
same protections: a constraints file, `--no-deps` for kernels, binary only unless a build is allowed), and the
gated-delta-rule check a decision hands its verification child (act/check_child.py), which also warms the JIT.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields, replace
from functools import cached_property

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

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
    BUILD = "build"        # a source build into a wheel, then that wheel installed


OK, INSTALL, REPAIR, SKIP, BLOCK = Action.OK, Action.INSTALL, Action.REPAIR, Action.SKIP, Action.BLOCK

# The JSON schemas (docs/json-schema.md): fields are only added within a version; any other change bumps it.
PLAN_SCHEMA = "fastpath-hooks.plan/2"
DOCTOR_SCHEMA = "fastpath-hooks.doctor/2"


@dataclass(frozen=True)
class Want:
    """One requirement of a step, parsed once (the installer and the engine read these, never the text)."""
    name: str                          # canonical distribution name
    specifier: FrozenSpecifierSet      # a wheel file: ==its version

    @property
    def exact(self) -> str | None:
        specs = list(self.specifier)
        if len(specs) == 1 and specs[0].operator == "==" and not specs[0].version.endswith(".*"):
            return specs[0].version
        return None


def _want(kind: str, raw: str) -> Want:
    if not raw.endswith(".whl"):
        try:
            req = Requirement(raw)   # a wheel step's dependency by name, too (act/installer.py: a batch's wheels' call)
            return Want(canonical_name(req.name), FrozenSpecifierSet(str(req.specifier)))
        except InvalidRequirement:
            if kind != StepKind.WHEEL:
                raise
    parsed = parse_wheel(raw)
    if parsed is None:  # not a standard name: its distribution is what comes before the version
        return Want(wheel_distribution(raw), FrozenSpecifierSet())
    return Want(parsed.distribution, FrozenSpecifierSet(f"=={parsed.version}"))


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
    helpers: tuple = ()              # build steps: what the build imports or runs that the environment lacks (pins:
    #                                  build_deps), installed into the build's own directory - never the environment
    variant: tuple = ()              # build steps: what a trimmed build keeps, for its label (facts/wheels.py)

    _freezes_itself = True

    def __post_init__(self):
        object.__setattr__(self, "kind", StepKind(self.kind))
        freeze_fields(self)

    @cached_property
    def wants(self) -> tuple:
        """Parsed at the first ask (a replaced step parses its own)."""
        return tuple(_want(self.kind, raw) for raw in self.requirements)

    @property
    def names(self) -> tuple:
        return tuple(w.name for w in self.wants)

    @property
    def exact(self) -> FrozenMap:
        """name -> version for the requirements that pin one exact version."""
        return FrozenMap((w.name, w.exact) for w in self.wants if w.exact is not None)

    def to_json(self) -> dict:
        return {**{f.name: thaw(getattr(self, f.name)) for f in fields(self)}, "env": dict(self.env)}


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
    wants: tuple = ()                 # backends ensured right after it, before its import (whatever their outcome)
    env: tuple = ()                   # ((NAME, VALUE), ...) set in this process before import
    off: tuple = ()                   # ((NAME, VALUE), ...) set when it ends unusable: keeps the served kernel off it
    check: FrozenMap = field(default_factory=FrozenMap)   # the gated-delta-rule check and warm-up its verification runs
    verify: bool = False              # OK but a child-process check is due (unverified combination)
    repair_steps: tuple = ()          # what to run if that check fails
    on_failure: OnFailure = OnFailure.PROCEED   # what the import does if the action fails
    fix: str = ""                     # how the user can change the outcome
    transformers_uses: str = ""
    expected_seconds: float | None = None
    # the start-up line's short form (decide/messages.py); `reason` and `fix` stay whole for doctor and plan
    facts: FrozenMap = field(default_factory=FrozenMap)   # slot -> value only this decision's rule knows
    short_reason: str = ""
    short_fix: str = ""

    _freezes_itself = True

    def __post_init__(self):
        object.__setattr__(self, "action", Action(self.action))
        object.__setattr__(self, "on_failure", OnFailure(self.on_failure))
        freeze_fields(self)

    @property
    def acts(self) -> bool:
        return self.action in (INSTALL, REPAIR)

    @cached_property
    def repair(self) -> "Decision | None":
        """Its `repair_steps` as a REPAIR, run when its check fails (the engine runs it, never makes it)."""
        if not self.repair_steps:
            return None
        target = target_of(self.repair_steps)
        return replace(self, action=REPAIR, steps=self.repair_steps, repair_steps=(), verify=False,
                       rule=self.rule + ".repair", target=target,
                       reason="its check failed; replacing it with " + ", ".join(f"{k} {v}" for k, v in target.items()),
                       short_reason=self.facts.get("repair_reason", ""), short_fix=self.facts.get("repair_fix", ""))

    def to_json(self) -> dict:   # every field but `facts` (the short form's slots)
        skip = ("facts", "steps", "repair_steps")
        out = {f.name: thaw(getattr(self, f.name)) for f in fields(self) if f.name not in skip}
        return dict(out, env=dict(self.env), off=dict(self.off), steps=[s.to_json() for s in self.steps],
                    repair_steps=[s.to_json() for s in self.repair_steps])


def target_of(steps) -> dict:
    """dist -> version the kernel/replace steps pin."""
    return {k: v for step in steps if step.kind in (StepKind.KERNEL, StepKind.REPLACE) for k, v in step.exact.items()}


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
        return {"schema": PLAN_SCHEMA, "environment": self.environment.to_json(), "notes": list(self.notes),
                "decisions": [d.to_json() for d in self.decisions.values()]}


# -- the installers' command lines ----------------------------------------------------------------

CONSTRAINTS_PLACEHOLDER = "<constraints.txt>"


@dataclass(frozen=True)
class Invocation:
    argv: tuple
    env: tuple          # extra environment for the installer process
    step: Step

    def to_json(self) -> dict:
        return {"argv": list(self.argv), "env": dict(self.env), "kind": self.step.kind}


def installer_choice(settings, env) -> tuple:
    """(uv, pip or None, why). Auto prefers uv, except where pip's configuration names an index or find-links and
    ours names none: uv ignores it and would resolve from PyPI. None: `why` is `<what is missing>; <the fix>`."""
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


def protected_constraints(installed: dict, protected) -> list[str]:
    """`name==version` for each protected distribution that is installed (real versions, never posed ones)."""
    return [f"{name}=={installed[name]}" for name in protected if name in installed]


def constraints(installed: dict, protected, named=()) -> list[str]:
    """The constraints for steps naming `named`: every other installed distribution pinned as it is, the protected
    first - a resolve must not change what the transaction does not back up. Real versions only, never posed."""
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
    """What is installed when `kernel`'s own steps run: `installed`, then the targets of the kernels it needs, depth
    first as the engine installs them; a wheel's version is its file's (local label included)."""
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
                wheel = parse_wheel(step.url or step.requirements[0])
                if wheel is not None:   # its version as spelled (`abiTRUE`), as installed
                    out[wheel.distribution] = wheel.filename.split("-")[1]

    add(kernel)
    return out


def step_names(steps) -> set:
    return {name for step in steps for name in step.names}


def invocation(step: Step, *, installer: str, settings, python: str | None = None, uv: str | None = None,
               constraints_file: str = CONSTRAINTS_PLACEHOLDER, local_files=()) -> Invocation:
    """The argv that runs `step`; `local_files`: the wheel files one call installs (a request's wheels)."""
    python = python or sys.executable
    if step.kind == StepKind.BUILD:  # builds the wheel (installed next, from the work directory, and cached)
        return Invocation(argv=tuple(build_argv(step, settings=settings, out_dir="<work>/built", python=python)),
                          env=tuple(step.env), step=step)
    reqs = list(step.requirements)
    if step.kind == StepKind.WHEEL:   # a wheel step may carry dependencies by name (act/installer.py)
        named = [r for r in step.requirements if not r.endswith(".whl") and r not in local_files]
        files = [r for r in step.requirements if r not in named]
        reqs = named + (list(local_files) or [step.url or files[0]])
    is_uv = installer == "uv"
    argv = ([uv or "uv", "pip", "install", "--python", python] if is_uv else
            [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--progress-bar", "off"])
    if step.no_deps:
        argv.append("--no-deps")
    if step.binary_only:
        argv += ["--only-binary", ":all:"] if is_uv else ["--only-binary=:all:"]
    if step.force:
        argv += [a for name in step.names for a in ("--reinstall-package", name)] if is_uv else ["--force-reinstall"]
    if not step.build_isolation:
        argv.append("--no-build-isolation")
    argv += ["--constraints" if is_uv else "--constraint", constraints_file, *index_flags(settings), *reqs]
    return Invocation(argv=tuple(argv), env=tuple(step.env), step=step)


def index_flags(settings) -> list:
    """Where pip/uv may look: no index offline, else the one set; the wheelhouses either way."""
    flags = ["--no-index"] if settings.offline else ["--index-url", settings.index_url] if settings.index_url else []
    for link in settings.find_links:
        flags += ["--find-links", link]
    return flags


def build_argv(step, *, settings, out_dir: str, python: str | None = None) -> list:
    """`pip wheel` of a build step's sdist: against the installed torch (no build isolation), never through
    pip's wheel cache (keyed by the sdist alone, it would hand an old build back under a new torch)."""
    argv = [python or sys.executable, "-m", "pip", "wheel", "-v", "--disable-pip-version-check", "--no-input",
            "--progress-bar", "off", "--no-deps", "--no-build-isolation", "--no-cache-dir"]
    for name in step.names:
        argv += ["--no-binary", name]
    return argv + index_flags(settings) + ["-w", out_dir, *step.requirements]


def helpers_argv(step, *, settings, target: str, python: str | None = None) -> list:
    """`pip install --target` of a build step's helpers into the build's own directory (its PYTHONPATH; their
    scripts, ninja, on its PATH): the environment is never changed by a build. --no-deps: exactly the allow-listed
    distributions the pins name (their own needs, packaging for wheel, are fastpath-hooks' and installed)."""
    return [python or sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
            "--progress-bar", "off", "--no-deps", "--only-binary=:all:", "--target", target, *index_flags(settings),
            *step.helpers]


def requirements_for(plan, kernels=None) -> tuple[list, list, list]:
    """(binary requirements, wheel steps, source-build requirements) of the acting decisions of
    `kernels` (all when None) and of the kernels they need: what `fastpath-hooks download` fetches."""
    needed = {n for kernel in kernels or () for n in plan.decisions[kernel].needs}
    binary, wheels, builds = [], [], []
    for kernel, decision in plan.decisions.items():
        if kernels and kernel not in kernels and kernel not in needed:
            continue
        if not decision.acts:
            continue
        for step in decision.steps:
            if step.kind == StepKind.WHEEL:
                wheels.append(step)
            elif step.kind == StepKind.BUILD:
                builds.extend(step.requirements)
                binary.extend(r for r in step.helpers if r not in binary)   # what the build needs: offline too
            else:
                binary.extend(r for r in step.requirements if r not in binary)
    return binary, wheels, builds


# -- the gated-delta-rule check ---------------------------------------------------------------------


def model_shapes(rows, warm, transformers=None) -> tuple:
    """((key heads, value heads, K, V), ...) to check and warm, and where they come from: `rows` (the imported
    models' configs), else the pins' defaults; a transformers outside `gva_transformers` repeats q and k."""
    shapes, names = [], []
    heads = warm.heads if warm is not None else (None, None)
    repeat = (warm is not None and transformers is not None
              and not warm.gva_transformers.contains(transformers, prereleases=True))
    rows = tuple(rows) or ((("pins", warm.dims[0], warm.dims[1], None, None),) if warm is not None else ())
    for name, k, v, hk, hv in rows:
        if k is None or v is None:
            continue
        hk, hv = hk or heads[0], hv or heads[1]
        shape = (hv if repeat else hk, hv, k, v)
        if shape not in shapes:
            shapes.append(shape)
        if name not in names:
            names.append(name)
    if not shapes:
        return (), "no model known yet"
    source = "the pins' defaults, no model known yet" if names == ["pins"] else f"the {' and '.join(names)} config"
    repeated = f", q and k repeated to the value heads by transformers {transformers}" if repeat else ""
    return tuple(shapes), source + repeated


JIT_HELPERS_MAX = 7   # helper processes of a check's parallel JIT (act/jit_share.py): half the cores, at most 7


def jit_helpers(cpus) -> int:
    """Helper processes that compile beside a check: half this machine's cores less the check's own, at most
    JIT_HELPERS_MAX (a build running beside has the rest)."""
    return max(0, min(JIT_HELPERS_MAX, (cpus or 1) // 2 - 1))


def gdr_check(env, pins, kernel: str, *, served: str, shapes: tuple, shapes_from: str, dtype: str | None = None,
              first_call: bool = False) -> dict:
    """`served` forward + backward in ONE pass at `shapes`, `dtype` and the pins' variant (act/check_child.py); for
    a backend also its own path, compared. `first_call`: transformers (5.15+) calls the kernel through a function
    the hooks can hold: the check then waits for the kernel's first call, whose shapes, dtype, length and variant
    it takes (hooks/first_call.py); else it runs at install, at these."""
    spec = pins.kernel(kernel)
    warm = spec.warm
    check = {
        "kind": "gated-delta-rule", "kernel": kernel, "served": served,
        "own": {s.switch.variable: s.switch.off for s in pins.kernels.values()   # `served` on its own path
                if s.kind == "backend" and served in s.serves and s.switch is not None},
        "check_seq": warm.check_seq, "tune_seq": warm.tune_seq or None, "final_state": warm.final_state,
        "dtype": dtype or warm.dtype, "varlen": False,
        "shapes": [list(s) for s in shapes], "shapes_from": shapes_from,
        "tolerances": dict(warm.tolerances), "slack": warm.slack,
        "jit": {"procs": jit_helpers(env.cpus), "threads": 0},
        "first_call": first_call,
        # what its pass computes with, the key of a remembered one (act/store.recall_pass): its distributions, its
        # backends' (tilelang, flash-qla), torch's and triton's
        "compute": sorted({*spec.distributions, *pins.triton_distributions, "torch",
                           *(d for k in _backends(pins, kernel) for d in pins.kernel(k).distributions)}),
    }
    if spec.kind == "backend":
        module, _, function = next((a for a in spec.verify_attributes if a.startswith(spec.module + ":")),
                                   f"{spec.module}:").partition(":")
        # on: the variable unset (the served kernel's default is on), off: the switch's value
        check["compare"] = {"module": module, "function": function, "switch": spec.switch.variable}
    return check




def _backends(pins, kernel: str) -> set:
    """The kernels a pass of `kernel` may run through: its releases' backends (fla: tilelang, flash-qla), or the
    kernels a backend serves."""
    spec = pins.kernel(kernel)
    return {b for r in (spec.releases or ()) for b in getattr(r, "backends", ())} | set(spec.serves)


def jit_env(env, pins, kernel: str) -> tuple:
    """((variable, directory), ...) of the kernel's JIT caches (pins `jit_caches`) the user has not set."""
    return tuple((var, env.jit_caches[var]) for var in pins.kernel(kernel).jit_caches
                 if var in env.jit_caches and var not in env.jit_caches_given)
