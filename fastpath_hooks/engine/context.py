"""What a decision is made from: the settings and pins (`load_context`), the plan completed with
nvcc's release where a build needs it (`complete`), and the fingerprint of the facts a kernel's
verdict depends on. Shared by the World, the CLI and the reports."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace

from packaging.requirements import Requirement

from .. import events
from .._names import CACHE_DIR, PREFIX, VERSION as __version__
from ..decide.messages import NVCC_RELEASE, lookup
from ..decide.policy import decide as policy_decide
from ..events import first_fitting, fitted, shown_path
from ..facts.distributions import canonical_name
from ..facts.pins import PinsError, load as load_pins
from ..facts.probe import with_nvcc_version
from ..facts.settings import Settings, SettingsError, parse_bool
from ..facts.wheels import wheel_distribution


def load_context(target: str | None = None, *, strict: bool = False):
    """(settings, pins). Bad settings or pins: report-only mode with every valid variable kept
    (a posed target, a skip list...), so decisions - blocks included - stay right; or raise, strict."""
    settings, pins, _ = load(target, strict=strict)
    return settings, pins


def load(target: str | None = None, *, strict: bool = False):
    """(settings, pins, invalid): `invalid` says why the run is in report mode although nobody asked for
    it (a bad variable or pins file, said above), else None."""
    invalid = None
    try:
        settings = Settings.from_env().with_target(target)
        unusable_cache_dir(settings)
    except SettingsError as exc:
        if strict:
            raise
        bad_settings(exc)
        settings = _valid_part(os.environ, exc.problems)
        invalid = "a FASTPATH_HOOKS_* variable is invalid (see above)"
    try:
        pins = load_pins(settings.pins_file)
    except PinsError as exc:
        if strict:
            raise
        events.error(f"{exc}. Using the shipped pins in report mode (nothing is installed)", once="pins")
        pins = load_pins(None)
        settings = replace(settings, mode="report", pins_file=None)
        invalid = "the pins file is invalid (see above)"
    return settings, pins, invalid


def check_settings() -> bool:
    """install()'s check of the FASTPATH_HOOKS_* variables: a bad one said now, once (the engine stays
    quiet about it later), and an unusable cache directory too; True when they are valid."""
    try:
        unusable_cache_dir(Settings.from_env())
    except SettingsError as exc:
        bad_settings(exc)
        return False
    return True


def unusable_cache_dir(settings) -> None:
    """An unusable FASTPATH_HOOKS_CACHE_DIR falls back to the default root: said once per environment."""
    if settings.cache_dir_unusable:
        given, problem, instead = settings.cache_dir_refused or (None, None, None)
        fix = (" (set it to an absolute path)" if problem == "is a relative path"
               else " (set it to a directory you can write)")
        line = settings.cache_dir_unusable + fix
        if given is not None:   # the long paths are details: said short, or left to doctor
            line = first_fitting(line, f"{CACHE_DIR}={given} {problem}; using {shown_path(instead)} instead{fix}",
                                 f"{CACHE_DIR}={given} {problem}; using the default cache instead{fix}",
                                 f"{CACHE_DIR}={given} {problem.split(' (')[0]}; using the default cache instead{fix}",
                                 f"{CACHE_DIR} {problem}; using {shown_path(instead)} instead{fix}",
                                 f"{CACHE_DIR} {problem}; using the default cache instead{fix}")
        events.warning(line, once="cache-dir", persist=f"cache-dir:{settings.cache_dir_unusable}",
                       detail=settings.cache_dir_unusable)


SHORT_VALUE = 24   # characters of a quoted value the invalid-setting line always shows


def bad_settings(exc) -> None:
    """The one line for invalid FASTPATH_HOOKS_* variables: said by install() or here, once."""
    var, value, why = exc.problems[0]
    more = f" (and {len(exc.problems) - 1} more)" if len(exc.problems) > 1 else ""
    # the value once (a short line), what it means before why: a long reason may be cut at the end
    whole = f"{var}={value!r} is not valid, so nothing is installed{more}: {value_once(value, why)}"
    said_twice = value_once(value, why).replace(f" {value!r}", "")   # "unknown kernel 'x'": the value was just said
    with_value = f"{var}={value!r} is not valid, so nothing is installed{more}: "
    without = f"{var} is not valid, so nothing is installed{more}: "
    # a reason ending in the list of what is accepted ("unknown kernel 'x'; known: fla, ...") too long for the line:
    # its head and where the list is, whole
    listed = f"{with_value}{said_twice.split('; ')[0]} (`fastpath-hooks doctor` lists them)" if "; " in said_twice \
        else None
    if len(repr(value)) <= SHORT_VALUE:   # a short value stays on the line unless only the reason without it fits
        line = first_fitting(whole, with_value + said_twice, without + value_once(value, why),   # whole (it names
                             *([listed] if listed else ()),
                             fitted(with_value, said_twice))        # the bad item: "unknown kernel 'x'"), else cut
    else:                                 # a long one (a path) is a detail: the reason and its fix stay whole
        line = first_fitting(whole, with_value + said_twice, without + value_once(value, why), without + why,
                             fitted(without, value_once(value, why)))
    events.error(line, once="settings", detail=whole)


def value_once(value, why: str) -> str:
    """A reason that starts by quoting the value again ("'/x' is not a directory") says "it" instead."""
    quoted = repr(value)
    if why.startswith(quoted + ": "):    # a target's "'gpu=sm_999': sm_999 is not ...": the value was just said
        return why[len(quoted) + 2:]
    return "it" + why[len(quoted):] if why.startswith(quoted + " ") else why


def _valid_part(environ, problems=()):
    """Settings from every variable but the bad ones (`problems`), in report mode: what it decides - and
    says at debug - respects the other settings (a skip list, a target, offline with a bad wheelhouse)."""
    bad = {var for var, _, _ in problems}
    valid = {name: value for name, value in environ.items() if name.startswith(PREFIX) and name not in bad}
    settings = Settings()
    for _ in range(len(valid) + 1):   # a variable valid alone may be invalid without a dropped one
        try:
            settings = Settings.from_env(valid)
            break
        except SettingsError as exc:
            for var, _, _ in exc.problems:
                valid.pop(var, None)
    try:   # FASTPATH_HOOKS_OFFLINE=1 without a (valid) wheelhouse still means: never reach an index
        offline = settings.offline or parse_bool(environ.get("FASTPATH_HOOKS_OFFLINE") or "0")
    except ValueError:
        offline = False
    return replace(settings, offline=offline, mode="report")


def fingerprint(env, settings, pins, kernel: str) -> str:
    """The probed facts one kernel's verdict depends on (installing fla leaves tilelang's alone). nvcc's release
    only where it is read for this kernel (`complete`: a compiled kernel's build): whether another kernel of the
    request read it (a script's model asks for causal-conv1d too) must not change fla's key."""
    spec = pins.kernel(kernel)
    builds = any(pins.kernel(k).kind == "compiled" for k in (kernel, *spec.with_kernels))
    facts = {
        "fastpath_hooks": __version__,
        "pins": pins.digest,
        "prefix": env.prefix,
        "python": env.python, "implementation": env.implementation, "platform": env.platform, "glibc": env.glibc,
        "torch": env.torch, "cuda": env.torch_cuda, "hip": env.torch_hip, "xpu": env.torch_xpu,
        "abi": env.cxx11_abi, "gpus": list(env.gpus), "triton": env.triton, "triton_dist": env.triton_dist,
        "nvcc": bool(env.nvcc), "nvcc_version": env.nvcc_version if builds else None, "hipcc": bool(env.hipcc),
        "switches": dict(env.switches),
        # only the cached wheels of this kernel's distributions: another kernel's (or another torch's) new
        # wheel in a shared cache must not make every verdict re-check
        "cached_wheels": hashlib.sha256("\n".join(
            w for w in env.cached_wheels
            if wheel_distribution(w) in spec.distributions).encode()).hexdigest()[:16],
        "transformers": env.version("transformers"), "numpy": env.version("numpy"),
        "dists": {d: env.version(d) for d in verdict_distributions(pins, kernel)},
        "half_installed": list(env.half_installed),
        "settings": [sorted(settings.skip), settings.allow_build, settings.offline, list(settings.find_links),
                     settings.index_url, settings.target, sorted(settings.wheel_urls.items())],
        "wheelhouse": hashlib.sha256("\n".join(env.wheelhouse).encode()).hexdigest()[:16],
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def verdict_distributions(pins, kernel: str) -> tuple:
    """The distributions a kernel's verdict depends on: its own, its runtime dependencies and nvcc wheels, and
    those of the kernels a hazard makes it need (fla on Hopper: tilelang), it is used `with`, whose import runs
    inside its own (a broken tilelang pair aborts `import mamba_ssm`) and - a backend - that it serves."""
    spec = pins.kernel(kernel)
    reqs = tuple(spec.runtime_deps) + tuple((spec.nvcc_packages or {}).get("requirements", ()))
    kernels = [h.needs for h in pins.hazards if h.kernel == kernel and h.needs]
    kernels += [*spec.with_kernels, *spec.imports_optional, *(spec.serves if spec.kind == "backend" else ())]
    names = [*spec.distributions, *(canonical_name(Requirement(r).name) for r in reqs)]
    return tuple(sorted({*names, *(d for k in kernels for d in pins.kernel(k).distributions)}))


def complete(env, plan, settings, pins, *, decide=None, kernel=None):
    """(env, plan), with nvcc's release asked (`nvcc --version`) only where a source build is considered - for
    `kernel`, its decision and its `with` kernels' (mamba-ssm depends on causal-conv1d's build), so a start that
    ensures fla spawns nothing for another kernel's build."""
    decide = decide or policy_decide
    considered = plan.decisions.values() if kernel is None else \
        [plan[k] for k in (kernel, *pins.kernel(kernel).with_kernels) if k in plan.decisions]
    if any(NVCC_RELEASE in getattr(lookup(pins, d.rule), "needs", ()) for d in considered):
        fuller = with_nvcc_version(env)
        if fuller is not env:
            return fuller, decide(fuller, settings, pins)
    return env, plan
