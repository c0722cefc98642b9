"""Numbers, not just imports: a kernel's tiny forward (and backward) against torch, in the check child.

Remembered per installed files (their RECORD digest), GPU arch and torch build for every environment of the
user; a mismatch blocks that release there (`<p>.block.numeric`). A posed GPU skips it unless `numeric=cpu`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, replace

from .. import events
from ..facts.frozen import FrozenMap
from ..facts.memory import GOOD, MISMATCH, numeric_path as cache_path, read_numeric as read, torch_build
from . import check_child
from .store import update_records
from .runner import child_environ, ended, run

CHILD = check_child.__file__


def run_child(arg: str, *, timeout: float, environ: dict, **how) -> tuple:
    """Run the check child (`arg`: its kernels as JSON, or `smoke`): (its Ran, the items it printed, the rest of
    its output)."""
    ran = run([sys.executable, CHILD, arg], timeout=timeout, environ=environ, **how)
    items, other = [], []
    for line in ran.output.splitlines():
        if line.startswith(check_child.MARK):
            with contextlib.suppress(ValueError):
                items.append(json.loads(line[len(check_child.MARK):]))
        else:
            other.append(line)
    return ran, [i for i in items if isinstance(i, dict)], "\n".join(other)


@dataclass(frozen=True)
class NumericPlan:
    kernel: str
    checks: tuple            # NumericCheck that apply to these GPUs
    device: str | None       # "cuda" (torch's device for CUDA and ROCm), "cpu" (numeric=cpu), None: skipped
    archs: tuple             # the GPU archs it speaks for
    torch_build: str         # torch version + its CUDA/HIP build, part of the key
    root: str | None = None  # the cache root the results are remembered under
    skip: str = ""           # why it does not run here
    env: tuple = ()          # the kernel's backends switched off (FLA_FLASH_QLA=0): its own numbers, not theirs
    head_dims: tuple = ()    # the models' attention head dims its checks run at, where not the checks' own


@dataclass(frozen=True)
class NumericResult:
    ok: bool
    detail: str


def plan_for(kernel: str, env, pins, root: str | None = None, *, hub: bool = False) -> NumericPlan | None:
    """None when the kernel has no check for these GPUs (or there is no accelerator); `hub`: for a hub kernel
    replacing the package's function (its `hub_only` checks too)."""
    checks = tuple(c for c in pins.kernel(kernel).numeric_checks if c.runs_on(env.gpus) and (hub or not c.hub_only))
    if not checks or env.accelerator not in ("cuda", "rocm"):
        return None
    checks, head_dims = _at_model_head_dims(checks, env, pins.kernel(kernel))
    archs = tuple(sorted({g for c in checks for g in c.runs_on(env.gpus)}))
    # remembered under the kernel's own files: a backend it would dispatch to (fla to flash-qla) is
    # checked against the kernel's own path by the backend's gated-delta-rule check, not here
    off = tuple((s.switch.variable, s.switch.off) for s in pins.kernels.values()
                if s.kind == "backend" and kernel in s.serves and s.switch is not None)
    device = "cuda" if env.gpu_source != "target" else "cpu" if env.numeric_device == "cpu" else None
    skip = "" if device else (f"the GPU ({'+'.join(archs)}) is posed by FASTPATH_HOOKS_TARGET and none is here to "
                              "run them on (numeric=cpu in the target checks CPU stand-ins)")
    return NumericPlan(kernel, checks, device, archs, torch_build(env), root, skip=skip, env=off, head_dims=head_dims)


def _at_model_head_dims(checks: tuple, env, spec) -> tuple:
    """(the checks, the head dims they run at): an attention kernel's (compiled, with `head_dims`) at each head dim
    of the imported models (`env.attention_shapes`; a check's own where one is unknown), else as pinned - ()."""
    rows = env.attention_shapes if spec.kind == "compiled" and spec.head_dims is not None else ()
    out, dims = [], set()
    for check in checks:
        own = check.shapes.get("head_dim")
        wanted = sorted({row[1] or own for row in rows}) if own is not None else []
        if not wanted or wanted == [own]:
            out.append(check)
            continue
        dims.update(wanted)
        out.extend(replace(check, name=f"{check.name} at head dim {d}",
                           shapes=FrozenMap({**check.shapes, "head_dim": d})) for d in wanted)
    return tuple(out), tuple(sorted(dims))


def _key(plan: NumericPlan, digest: str, arch: str) -> str:
    dims = f"|head dims {plan.head_dims}" if plan.head_dims else ""
    return hashlib.sha256(f"{digest}|{arch}|{plan.torch_build}|{plan.device}{dims}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Pending:
    """A numeric check to run: the child's payload, and what its result is remembered under."""
    plan: NumericPlan
    payload: dict            # {"device": ..., "checks": [...]}: check_child.py's argument
    keys: dict               # arch -> cache key (empty: the installed files could not be named)
    digest: str | None
    version: str | None


def skipped(plan: NumericPlan) -> NumericResult | None:
    if plan.device is not None:
        return None
    events.status(f"{plan.kernel}: numbers not checked ({_names(plan)}): {plan.skip}", plan.kernel, human=False)
    return NumericResult(True, f"numbers not checked: {plan.skip}")


def prepare(plan: NumericPlan, digest: str | None, version: str | None, extra=None):
    """A NumericResult remembered for these files (their `digest`), else the Pending check for the child."""
    keys = {arch: _key(plan, digest, arch) for arch in plan.archs} if digest else {}
    known = _known(plan.root, plan.kernel, keys)
    if known is not None:
        return NumericResult(True, f"numbers checked before on {'+'.join(plan.archs)} ({_names(plan)}), "
                                   f"{known.get('detail', '')}") if known["state"] == GOOD else \
            NumericResult(False, known["detail"])
    payload = {"device": plan.device, "checks": [dict(_payload(c), **(extra or {})) for c in plan.checks]}
    return Pending(plan, payload, keys, digest, version)


def conclude(pending: Pending, report, problem, seconds: float, label: str | None = None) -> NumericResult:
    """The result of a Pending check from the child's report (or why there is none), remembered."""
    plan = pending.plan
    kernel, root, keys, digest, version = plan.kernel, plan.root, pending.keys, pending.digest, pending.version
    where = "+".join(plan.archs) + ("" if plan.device == "cuda" else " (CPU tensors)") + \
        (f" at head dim {'/'.join(map(str, plan.head_dims))}" if plan.head_dims else "")
    if problem is None and not report.get("ok"):
        problem = f"{kernel}'s numeric check failed: {report.get('error')}"
    if problem is not None:   # the child could not run the checks (a crash is a verdict on the build too)
        return NumericResult(False, problem)
    results = report.get("results", [])
    failed = [r for r in results if r.get("state") in ("mismatch", "error")]
    if failed:   # short: the engine's line says `<kernel>: blocked - <this>` within one line
        state, detail = MISMATCH, f"on {where}, {_short(failed[0]['function'])} {failed[0].get('why')}"
    else:
        worst = max((r.get("max_abs", 0.0) for r in results), default=0.0)
        not_run = [f"{r['name']} ({r.get('why')})" for r in results if r.get("state") == "skipped"]
        ran = [r for r in results if r.get("state") == "ok"]
        state, detail = GOOD, (f"numbers match torch on {where}: {len(ran)} check{'s' if len(ran) != 1 else ''}, "
                               f"max abs diff {worst:.2g}, in {seconds:.1f} s"
                               + (f"; not run: {', '.join(not_run)}" if not_run else ""))
        events.status(f"{label or kernel}: {detail}", kernel)   # once per installed files, GPU arch and torch build
    if root and digest:
        update_records(cache_path(root, kernel), {k: {
            "state": state, "detail": detail, "version": version, "arch": arch, "torch_build": plan.torch_build,
            "device": plan.device, "ts": time.time(), **({"results": results} if failed else {})}
            for arch, k in keys.items()})
    return NumericResult(state == GOOD, detail)


def remember_mismatch(root: str | None, kernel: str, *, digest: str | None, version: str | None, archs,
                      build: str, detail: str) -> None:
    """A kernel's numbers measured wrong outside a NumericPlan (its gated-delta-rule check at the first call):
    remembered as a numeric check's mismatch, so the policy blocks that release on these GPUs under this torch."""
    if not (root and digest):
        return
    update_records(cache_path(root, kernel), {
        hashlib.sha256(f"{digest}|{arch}|{build}|cuda".encode()).hexdigest()[:32]: {
            "state": MISMATCH, "detail": detail, "version": version, "arch": arch, "torch_build": build,
            "device": "cuda", "ts": time.time()} for arch in archs})


def _known(root: str | None, kernel: str, keys: dict) -> dict | None:
    """The remembered entry: a GOOD one where every arch passed, a MISMATCH one where one failed, else None."""
    known = read(root, kernel)
    if keys and all(known.get(k, {}).get("state") == GOOD for k in keys.values()):
        return known[next(iter(keys.values()))]
    return next((known[k] for k in keys.values() if known.get(k, {}).get("state") == MISMATCH), None)


def _payload(check) -> dict:
    return {"name": check.name, "function": check.function, "reference": check.reference, "shapes": dict(check.shapes),
            "options": dict(check.options), "dtype": check.dtype, "tolerance": dict(check.tolerance),
            "backward_tolerance": dict(check.backward_tolerance) if check.backward_tolerance else None,
            "backward": check.backward, "requires": list(check.requires)}


def _short(function: str) -> str:
    return function.rpartition(":")[2]


def _names(plan) -> str:
    return ", ".join(f"{_short(c.function)} {'fwd+bwd' if c.backward else 'fwd'}" for c in plan.checks)


# -- a hub kernel (transformers 5.25+: engine/hub.py) ------------------------------------------------------

def verify_hub(entry, *, env, pins, root: str | None, timeout: float) -> tuple:
    """(ok, detail): the numeric checks of the package function `entry` replaces, run on the hub's kernel
    (loaded through kernels, as kernelize will), remembered like a package's. An entry without a layer is a module
    of functions (flash attention): every check of its kernel, on the hub module's function of the same name."""
    plan = plan_for(entry.kernel, env, pins, root, hub=True)
    leaf = f":{entry.name}"
    checks = tuple(c for c in plan.checks if not entry.layer or c.function.endswith(leaf)
                   or c.function.endswith("." + entry.name)) if plan is not None else ()
    if not checks:
        return True, f"no numeric check of {entry.name} for {'+'.join(env.gpus) or 'this machine'}"
    hub = {"repo": entry.repo_id, "version": entry.version, "revision": entry.revision, "layer": entry.layer}
    checks = tuple(replace(c, function=f"hub:{entry.ref}:{entry.layer or c.function.rpartition(':')[2]}")
                   for c in checks)
    plan = replace(plan, kernel=entry.kernel, checks=checks)
    if plan.device is None:
        return True, f"numbers not checked: {plan.skip}"
    digest = _hub_digest(entry)
    if digest is None:
        return False, f"{entry.ref} does not load here"
    pending = prepare(plan, digest, entry.ref, {"hub": hub, "check_arch": plan.device == "cuda"})
    if isinstance(pending, NumericResult):
        return pending.ok, pending.detail
    ran, items, other = run_child(json.dumps([{"modules": [], "attributes": [], "numeric": pending.payload}]),
                                  timeout=timeout, environ=child_environ(plan.env, drop=("FASTPATH_HOOKS_TARGET",)))
    report = next((i["numeric"] for i in items if i.get("index") == 0 and "numeric" in i), None)   # not the phase
    problem = None if isinstance(report, dict) else ended(ran, f"{entry.ref}'s numeric check", timeout, other)
    result = conclude(pending, report, problem, ran.seconds, label=f"{entry.kernel} from {entry.ref}")
    return result.ok, result.detail


def _hub_digest(entry) -> str | None:
    """The digest of the files of the build kernels would load for `entry` here (LOCAL_KERNELS or the cache:
    content-named), without importing it; None when it cannot be located."""
    try:
        from kernels import install_kernel

        local = dict(p.partition("=")[::2] for p in os.environ.get("LOCAL_KERNELS", "").split(":") if "=" in p)
        path = local.get(entry.repo_id) or str(install_kernel(entry.repo_id, version=entry.version,
                                                               revision=None if entry.version else entry.revision))
    except Exception:   # noqa: BLE001 - no build for this machine, or the hub is not reachable
        return None
    rows = []
    for base, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            full = os.path.join(base, name)
            try:
                st = os.stat(full)
            except OSError:
                continue
            rows.append(f"{os.path.relpath(full, path)}|{st.st_size}|{st.st_mtime_ns}")
    return hashlib.sha256(f"{entry.ref}|{path}\n".encode() + "\n".join(rows).encode()).hexdigest() if rows else None
