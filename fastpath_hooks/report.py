"""Human and JSON renderings of the environment, the plan and the doctor report."""

from __future__ import annotations

import shlex
import time

from ._names import MASKED_ATTENTION, VERSION as __version__
from .act import fetch as wheelcache
from .act.verify import cache_listing, warm_records
from .decide.common import Context
from .decide.plan import (BLOCK, DOCTOR_SCHEMA, INSTALL, OK, REPAIR, SKIP, Step, StepKind, installed_after_needs,
                          installer_choice, protected_constraints, step_names)
from .decide.messages import PACKED_LEAK
from .decide.policy import Commands, batches
from .decide.transformers import era as transformers_era, packed_sequences, sources

VERBS = {
    OK: "nothing to do",
    INSTALL: "install",
    REPAIR: "repair",
    SKIP: "leave it alone",
    BLOCK: "block its import",
}


def commands_for(plan, settings, *, real_installed: dict, pins) -> dict:
    """kernel -> list of invocation dicts, as `install` would run them (the Commands the engine hands
    act/installer.py); kernels installed together have their batch's commands under the first."""
    env = plan.environment
    installer, why = installer_choice(settings, env)
    commands = Commands.of(settings, env, pins)
    out, files = {}, {}
    for kernel, decision in plan.decisions.items():
        steps = decision.steps or (decision.repair_steps if decision.verify else ())
        out[kernel] = [inv.to_json() for s in steps for inv in commands.invocations(s)]
        # the constraints file's lines, after the kernels this one needs are installed
        before = installed_after_needs(plan.decisions, kernel, real_installed)
        files[kernel] = commands.constraints(before, step_names(steps)) if steps else []
    together = batches(plan, pins)
    for members in together:
        lead = members[0].kernel
        out[lead] = _batch_commands(members, commands)
        names = set().union(*(step_names(d.steps) for d in members))
        files[lead] = commands.constraints(installed_after_needs(plan.decisions, lead, real_installed), names)
        for d in members[1:]:
            out[d.kernel], files[d.kernel] = [], []
    return {"installer": installer, "installer_reason": why,
            "constraints": protected_constraints(real_installed, pins.protected),
            "kernel_constraints": files, "commands": out, "batches": [[d.kernel for d in m] for m in together]}


def _batch_commands(members, commands) -> list:
    """What act/installer.py runs for a batch: the dependencies in one call where a member builds, each
    one's builds (side by side), then every wheel in one call (with the dependencies where none builds)."""
    reqs, out, wheels = [], [], []
    for d in members:
        reqs += [r for s in d.steps if s.kind == StepKind.DEPS for r in s.requirements if r not in reqs]
    with_wheels = commands.deps_with_wheels(members)
    if reqs and not with_wheels:
        out.append(commands.invocation(Step(kind=StepKind.DEPS, requirements=tuple(reqs), no_deps=False)).to_json())
    for d in members:
        out += [inv.to_json() for s in d.steps if s.kind == StepKind.BUILD for inv in commands.invocations(s)]
        wheel = next((s for s in d.steps if s.kind == StepKind.WHEEL), None)
        wheels.append(f"<the {d.kernel} wheel built above>" if wheel is None else wheel.url or wheel.requirements[0])
    named = tuple(reqs) if with_wheels else ()
    step = Step(kind=StepKind.WHEEL, requirements=named + tuple(wheels), no_deps=True)
    out.append(commands.invocation(step, local_files=tuple(wheels)).to_json())
    return out


def plan_json(plan, settings, *, real_installed, pins) -> dict:
    """Schema fastpath-hooks.plan/2, documented field by field in docs/json-schema.md."""
    return {**plan.to_json(), "fastpath_hooks": __version__, "settings": settings.public(), "pins": list(pins.origins),
            "summary": summary(plan, settings), "sources": function_sources(plan, settings, pins),
            **commands_for(plan, settings, real_installed=real_installed, pins=pins)}


def function_sources(plan, settings, pins) -> list:
    """What serves each function transformers decorates here (decide/transformers.py: the hub, the package, torch)."""
    return sources(plan, pins, Context(plan.environment, settings, pins, False).hazards)


def summary(plan, settings) -> str:
    """One line; the reasons are in the per-kernel lines above it."""
    acting = [d for d in plan.decisions.values() if d.acts]
    if plan.notes and not acting:
        return f"nothing will be installed: {plan.notes[0]}."
    if not acting:
        left = ", ".join(f"{d.kernel} ({VERBS[d.action]})" for d in plan.decisions.values())
        return f"nothing will be installed: {left}."
    by_action = {}
    for d in acting:   # one version per kernel (its own distribution's, else the first it installs)
        version = d.target.get(d.kernel) or next(iter(d.target.values()), "")
        by_action.setdefault(d.action, []).append(f"{d.kernel} {version}".strip())
    parts = [f"{action} {', '.join(kernels)}" for action, kernels in by_action.items()]
    installer, why = installer_choice(settings, plan.environment)
    if installer is None and settings.mode != "report":
        return f"install() would {'; '.join(parts)} but cannot: {why}."
    if settings.mode == "report":
        return "FASTPATH_HOOKS_MODE=report: would " + "; ".join(parts) + " - nothing will be installed."
    return "install() would " + "; ".join(parts) + "."


def doctor_json(plan, settings, *, pins, activation: dict, verdicts: dict, real_installed: dict) -> dict:
    """Schema fastpath-hooks.doctor/2, documented field by field in docs/json-schema.md."""
    env = plan.environment
    return {
        "schema": DOCTOR_SCHEMA,
        "fastpath_hooks": __version__,
        "environment": env.to_json(),
        "transformers_era": transformers_era(env.version("transformers")),
        "settings": settings.public(),
        "pins": list(pins.origins),
        "activation": activation,
        "verdicts": verdicts,
        "decisions": [d.to_json() for d in plan.decisions.values()],
        "notes": list(plan.notes),
        "summary": summary(plan, settings),
        "sources": function_sources(plan, settings, pins),
        "packed_sequences": _packed(plan, settings, pins, activation),
        **commands_for(plan, settings, real_installed=real_installed, pins=pins),
    }


def _enabled(activation: dict) -> bool:
    """An entry that runs at start (a block in a shadowed sitecustomize.py never does)."""
    shadowed = activation.get("shadowed") or {}
    return bool(activation.get("pth") or [p for p in activation.get("sitecustomize", ()) if p not in shadowed])


def _packed(plan, settings, pins, activation: dict) -> dict:
    """Packed-sequence training here, where the kernels are installed at start-up (enabled, with an installer
    that can run here) or not."""
    enabled = _enabled(activation) and installer_choice(settings, plan.environment)[0] is not None
    return packed_sequences(plan, settings, pins, enabled=enabled)


def doctor_text(plan, settings, *, pins, activation: dict, verdicts: dict, interrupted: dict | None = None) -> str:
    env = plan.environment
    lines = [f"fastpath-hooks {__version__} doctor", "", "Environment"]

    def row(name, value):
        lines.append(f"  {name:<14}{value}")

    row("python", f"{env.python} ({env.implementation}), {env.platform}"
        + (f", glibc {env.glibc}" if env.glibc else ""))
    row("torch", f"{env.torch} ({env.torch_build} build)" if env.torch else "not installed")
    row("accelerator", env.accelerator or ("none - " + plan.notes[0] if plan.notes else "none"))
    row("GPUs", (", ".join(env.gpus) if env.gpus else "none") + f" ({env.gpu_source})")
    row("triton", f"{env.triton} ({env.triton_dist})" if env.triton else "not installed")
    row("nvcc", env.nvcc or "not found")
    tv = env.version("transformers")
    row("transformers", f"{tv} (era {transformers_era(tv)})" if tv else "not installed")
    installer, why = installer_choice(settings, env)
    row("installer", f"{installer or 'none'}" + (f" at {env.uv}" if installer == "uv" and env.uv else "") + f" - {why}")
    shadowed = activation.get("shadowed") or {}
    if _enabled(activation):
        where = ([activation["pth"]] if activation.get("pth") else []) + [
            p for p in activation.get("sitecustomize", []) if p not in shadowed]
        row("start-up", "enabled: " + ", ".join(where))
    elif shadowed:
        ours, runs = next(iter(shadowed.items()))
        row("start-up", f"shadowed, so off at start: {runs} (earlier on sys.path: PYTHONPATH?) runs instead of "
            f"the block in {ours} (use `fastpath-hooks enable --method pth`)")
    else:
        row("start-up", "not enabled (`fastpath-hooks enable`, or call fastpath_hooks.install() in your script)")
    if settings.cache_dir_unusable:
        row("cache", settings.cache_dir_unusable)
    if settings.mode == "report":
        row("mode", "report: decide and report, never install")
    if env.posed:
        row("posed", f"{', '.join(env.posed)} (from FASTPATH_HOOKS_TARGET / --target)")
    if interrupted:
        row("interrupted", interrupted_text(interrupted))
    if env.half_installed:
        row("half-installed", ", ".join(env.half_installed) + " (two dist-info in one directory)")
    if len(pins.origins) > 1:
        row("pins", f"shipped + {pins.origins[-1]}")

    lines += ["", "Kernels"]
    shared = _shared_fixes((kernel, d.fix) for kernel, d in plan.decisions.items()
                           if d.fix and d.action in (SKIP, BLOCK))
    machine_fix = _machine_fix(plan)   # no GPU (or no torch) here: its one fix is said once, in the summary
    for kernel, d in plan.decisions.items():
        have = (", ".join(f"{k} {v}" for k, v in d.installed.items()) or "no") + \
            _left_by(interrupted, pins.kernel(kernel).distributions)
        lines += [f"  {kernel}", f"    installed      {have}", f"    transformers   {d.transformers_uses}"]
        what = VERBS[d.action]
        if d.action in (INSTALL, REPAIR):
            what += " " + ", ".join(f"{k}=={v}" for k, v in d.target.items())
            if installer is None and settings.mode != "report":
                what = f"would {what}, but no installer can run (see installer above)"
        lines.append(f"    install()      {what} - {d.reason}")
        if d.needs:
            lines.append(f"    needs          {', '.join(d.needs)}")
        if d.env:
            lines.append(f"    sets           {', '.join(f'{k}={v}' for k, v in d.env)}")
        if d.fix and d.action in (SKIP, BLOCK) and d.fix not in shared:
            lines.append(f"    to change it   {d.fix}")
        verdict = verdicts.get(kernel)
        if verdict:
            lines.append(f"    last verdict   {verdict.get('state')}: {verdict.get('reason')}")
    lines += _shared_lines(shared, "to change it   ", said=machine_fix)
    rows = function_sources(plan, settings, pins)
    if rows:
        lines += ["", "Sources (what serves each function transformers decorates)"]
        for source in rows:
            lines.append(f"  {source['function']:<34}{source['source']}"
                         + ("" if source["source"].startswith(("hub ", "package ")) else f" - {source['reason']}"))
    lines += packed_text(_packed(plan, settings, pins, activation), said=machine_fix)
    lines += packed_rows_text(tv)
    lines += ["", "Summary: " + summary(plan, settings)] + ([f"To change it: {machine_fix}."] if machine_fix else [])
    return "\n".join(lines)


def interrupted_text(interrupted: dict) -> str:
    """doctor's line for a pending install journal: what, and what happens to it."""
    when = interrupted.get("started")
    since = (f", started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(when))}"
             if isinstance(when, (int, float)) else "")
    pid = interrupted.get("pid")
    what = f"{interrupted.get('description') or 'an install'} (pid {pid if pid is not None else '?'}{since})"
    if interrupted.get("running"):
        return f"{what}: running now (journal {interrupted['journal']})"
    return (f"{what}: killed half-way - rolled back at the next start, install() or `fastpath-hooks install` "
            f"(journal {interrupted['journal']})")


def _left_by(interrupted: dict | None, distributions) -> str:
    """What an install running now or killed half-way has on disk of these distributions, not verified (after a
    kill the plan is made as after its rollback)."""
    left = [f"{d} {v}" for d, v in sorted((interrupted or {}).get("left", {}).items()) if d in distributions]
    if not left:
        return ""
    if interrupted.get("running"):
        return f" ({', '.join(left)} on disk: the install running now, not verified yet)"
    return f" ({', '.join(left)} on disk, never verified: an interrupted install's, rolled back at the next start)"


def _machine_fix(plan) -> str | None:
    """The fix of a skip that holds for every kernel (no accelerator, no torch: `plan.notes`), else None."""
    fixes = {d.fix for d in plan.decisions.values()}
    if plan.notes and len(fixes) == 1 and all(d.action == SKIP for d in plan.decisions.values()):
        return next(iter(fixes)) or None
    return None


def packed_text(packed: dict, said: str | None = None) -> list:
    """Doctor's packed-sequence section: nothing when that training would not fail here. `said`: a fix
    the report gives elsewhere (left out here)."""
    if not packed["failures"]:
        return []
    names = ", ".join(f["package"] for f in packed["failures"])
    lines = ["", "Packed sequences",
             f"  padding-free training (cu_seqlens / seq_idx) would fail here: transformers {packed['transformers']} "
             f"raises ValueError without {names}"]
    shared = _shared_fixes((f["package"], f["fix"]) for f in packed["failures"])
    for f in packed["failures"]:
        models = f["models"]
        lines += [f"  {f['package']}", f"    why          {f['problem']}"]
        if f["fix"] not in shared and f["fix"] != said:
            lines.append(f"    to fix it    {f['fix']}")
        lines.append(f"    models       {', '.join(models[:6])}"
                     + (f" and {len(models) - 6} more" if len(models) > 6 else ""))
    return lines + _shared_lines(shared, "to fix it    ", said=said)


def packed_rows_text(transformers: str | None) -> list:
    """Doctor's section on packed rows under the attention implementations whose mask transformers builds
    (hooks/packed.py says a leak at the first training forward that has one); nothing without transformers."""
    if not transformers:
        return []
    return ["", "Packed rows (documents packed in one row, their position_ids restarting)",
            f"  leak when      under {', '.join(MASKED_ATTENTION)} transformers {transformers} keeps them apart only "
            "with no attention mask and no cache; an attention mask (all ones too) or a cache (use_cache defaults to the "
            "config's, True, outside Trainer) lets them attend to each other, silently",
            '  to fix it      attention_mask=None and use_cache=False, or attn_implementation="flash_attention_2" with '
            "one row per batch and no padding (as DataCollatorWithFlattening makes them)",
            f"  said           once, at the first forward that could leak ({PACKED_LEAK}); nothing is changed"]


def _shared_fixes(pairs) -> dict:
    """fix -> the names it is the fix of, for each fix shared by more than one (said once, after them)."""
    by_fix: dict = {}
    for name, fix in pairs:
        by_fix.setdefault(fix, []).append(name)
    return {fix: names for fix, names in by_fix.items() if len(names) > 1}


def _shared_lines(shared: dict, label: str, said: str | None) -> list:
    """A fix of several names said once, after them (`said`: one the report gives elsewhere)."""
    return [line for fix, names in shared.items() if fix != said
            for line in (f"  {', '.join(names)}", f"    {label}{fix}")]


def plan_text(plan, settings, *, real_installed, pins) -> str:
    data = commands_for(plan, settings, real_installed=real_installed, pins=pins)
    lines = [f"installer: {data['installer'] or 'none'} - {data['installer_reason']}",
             "constraints: " + (", ".join(data["constraints"]) or "(none installed)")]
    led = {b[0]: b[1:] for b in data["batches"]}
    joined = {k: b[0] for b in data["batches"] for k in b[1:]}
    for kernel, d in plan.decisions.items():
        lines.append(f"{kernel}: {d.action} - {d.reason}")
        if kernel in led:
            lines.append(f"    with {', '.join(led[kernel])} in one batch: builds side by side, one installer call, "
                         "one check")
        if kernel in joined:
            lines.append(f"    installed in {joined[kernel]}'s batch (its commands)")
        for inv in data["commands"][kernel]:
            env = " ".join(f"{k}={v}" for k, v in inv["env"].items())
            lines.append("    " + (env + " " if env else "") + " ".join(shlex.quote(a) for a in inv["argv"]))
        if data["kernel_constraints"][kernel]:
            lines.append("    <constraints.txt>: " + " ".join(data["kernel_constraints"][kernel]))
    lines.append("Summary: " + summary(plan, settings))
    return "\n".join(lines)


def wheel_cache_json(root: str) -> dict:
    """The wheel cache for `doctor --json` and `cache list --json` (docs/json-schema.md: wheel_cache)."""
    return {"directory": wheelcache.directory(root), "wheels": wheelcache.entries(root)}


def wheel_cache_text(data: dict) -> str:
    wheels = data["wheels"]
    lines = [f"Wheel cache   {data['directory']}: " + (f"{len(wheels)} wheel{'s' if len(wheels) != 1 else ''}"
                                                       if wheels else "empty")]
    for w in wheels:
        size = f"{w['size'] / 1e6:.1f} MB" if isinstance(w.get("size"), int) else "size unknown"
        how = w.get("origin") or "?"
        if how == "built" and w.get("log"):
            how += f", log {w['log']}"
        lines.append(f"  {w['file']} ({size}, {how})" + ("" if w["ok"] else f" - ignored: {w['problem']}"))
    if wheels:
        lines.append("  (`fastpath-hooks cache clear [KERNEL]` removes them)")
    return "\n".join(lines)


def jit_json(env, root: str) -> dict:
    """The JIT caches (`doctor --json`: jit): each pins variable's directory - yours or fastpath-hooks' -
    what is in it, and the warm-ups the verification children ran into them (docs/json-schema.md)."""
    caches = {var: {**cache_listing(path), "set_by": "you" if var in env.jit_caches_given else "fastpath-hooks"}
              for var, path in env.jit_caches.items()}
    return {"caches": caches, "warmed": warm_records(root)}


def jit_text(data: dict) -> str:
    lines = ["JIT caches (compiled by the verification children for the training process)"]
    for var, c in data["caches"].items():
        what = (f"{c['entries']} entries, {c['bytes'] / 1e6:.1f} MB, newest {c['newest']}"
                if c["exists"] and c["entries"] else "empty" if c["exists"] else "not made yet")
        lines.append(f"  {var:<19}{c['directory']} ({c['set_by']}): {what}")
    for kernel, w in sorted(data["warmed"].items()):
        shapes = ", ".join("x".join(str(n) for n in s) for s in (w.get("shapes") or []))
        tuned = f"tuned at {w['tune_seq']} tokens" if w.get("tune_seq") else "checked at its check length"
        lines.append(f"  {kernel}: compiled {w.get('at')}, {tuned}, at {shapes} (heads x heads x K x V)"
                     f"{', ' + w['dtype'] if w.get('dtype') else ''} in {(w.get('seconds') or 0):.1f} s on "
                     f"{w.get('device')}")
    if not data["warmed"]:
        lines.append("  nothing compiled yet (fla's check compiles them at the model's shapes, at its first call)")
    return "\n".join(lines)
