"""The `fastpath-hooks` command. Exit codes: 0 fine, 1 something failed (or is blocked), 2 bad input.

Each command imports what it uses when it runs: `enable` and `disable` must work where the dependencies
(packaging, filelock) are gone or broken - the way out of a start-up entry must never need them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ._names import VERSION as __version__
from ._registry import listed, registry


def main(argv=None) -> int:
    for stream in (sys.stdout, sys.stderr):   # a path the output's encoding lacks is said escaped, never a traceback
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except _UsageError as exc:
        for line in str(exc).splitlines():
            _error(line)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:   # the reader went away (`doctor --json | head`): stop quietly, like other tools
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


class _UsageError(Exception):
    pass


def _error(message: str, *, whole: str | None = None) -> None:
    """One line on stderr, fitted to events.MAX_LINE characters - whole (`whole`, the longer text of a line short
    by design) under FASTPATH_HOOKS_LOG=debug."""
    from ._names import log_level
    from .events import PREFIX, fit

    print(PREFIX + (whole or message) if log_level() == "debug" else fit(message), file=sys.stderr)


def _parser():
    known = registry()   # the shipped kernels and those a FASTPATH_HOOKS_PINS file adds
    kernels = ", ".join(listed(known))
    compiled = " or ".join(k for k in listed(known) if known[k]["kind"] == "compiled")
    p = argparse.ArgumentParser(prog="fastpath-hooks", description="Make transformers' fast kernel paths just work.")
    p.add_argument("--version", action="version", version=f"fastpath-hooks {__version__}")
    sub = p.add_subparsers(dest="command")

    d = sub.add_parser("doctor", help="the facts, and per kernel what install() would do and why")
    d.add_argument("--json", action="store_true", help="machine-readable report (schema fastpath-hooks.doctor/2)")
    _target_option(d, "pose as another machine (like FASTPATH_HOOKS_TARGET)")
    d.add_argument("--refresh", action="store_true",
                   help="forget cached verdicts, remembered checks and the lines said once first")
    d.add_argument("--smoke", action="store_true",
                   help="on a GPU: run a gated-delta-rule forward+backward with the installed kernels vs a torch "
                        "reference")
    d.set_defaults(func=_doctor)

    pl = sub.add_parser("plan", help="the exact requirements and installer commands that would run")
    pl.add_argument("kernels", nargs="*", metavar="KERNEL")
    pl.add_argument("--json", action="store_true", help="machine-readable plan (schema fastpath-hooks.plan/2)")
    _target_option(pl, "pose as another machine (like FASTPATH_HOOKS_TARGET)")
    pl.set_defaults(func=_plan)

    i = sub.add_parser("install", help="install/repair now (e.g. in a Docker build), verified, with rollback")
    i.add_argument("kernels", nargs="*", metavar="KERNEL",
                   help=f"{kernels} (default: all). Exit 1 when a named kernel ends skipped, blocked or failed; "
                        "with none named, when a kernel this machine needs does")
    i.add_argument("--dry-run", action="store_true", help="print the plan's commands, change nothing")
    _target_option(i, "plan for another machine, e.g. in an image built without a GPU")
    i.set_defaults(func=_install)

    dl = sub.add_parser("download", help="fetch the planned wheels for a target into a wheelhouse")
    dl.add_argument("kernels", nargs="*", metavar="KERNEL")
    dl.add_argument("--dest", required=True, metavar="DIR")
    _target_option(dl, "the machine the wheels are for")
    dl.set_defaults(func=_download)

    b = sub.add_parser("build",
                       help="build a compiled kernel from source now, for given GPU archs, into the wheel cache")
    b.add_argument("kernel", metavar="KERNEL", help=compiled)
    b.add_argument("--arch", metavar="ARCHS",
                   help="comma list such as sm_90,sm_80 or gfx942 (default: this machine's GPUs); all: every arch "
                        "the sdist knows (long)")
    b.add_argument("--dest", metavar="DIR",
                   help="also copy the wheel into this wheelhouse (for FASTPATH_HOOKS_FIND_LINKS)")
    b.add_argument("--rebuild", action="store_true", help="build even when the cache holds a fitting wheel")
    _target_option(b, "facts of the machine the wheel is for")
    b.set_defaults(func=_build)

    c = sub.add_parser("cache", help="the local wheel cache of built and downloaded kernel wheels")
    csub = c.add_subparsers(dest="cache_command")
    cl = csub.add_parser("list", help="what is cached, with each wheel's key")
    cl.add_argument("--json", action="store_true")
    cl.set_defaults(func=_cache_list)
    cc = csub.add_parser("clear", help="remove cached wheels (all, or one kernel's)")
    cc.add_argument("kernel", nargs="?", metavar="KERNEL")
    cc.set_defaults(func=_cache_clear)
    c.set_defaults(func=lambda args: (c.print_help(), 2)[1])

    e = sub.add_parser("enable", help="activate fastpath-hooks at every interpreter start in this environment")
    e.add_argument("--method", choices=("auto", "pth", "sitecustomize"), default="auto",
                   help="auto (default): sitecustomize where this environment owns it (cheapest), else pth")
    e.set_defaults(func=_activation)
    sub.add_parser("disable", help="remove the start-up entry written by enable").set_defaults(func=_activation)
    return p


def _target_option(parser, what: str) -> None:
    parser.add_argument("--target", metavar="SPEC", help=(
        f"{what}: a comma list of key=value facts, the rest probed, e.g. gpu=sm_90,cuda=12.8,torch=2.10.0 (a CPU "
        "torch here needs cuda=, hip= or xpu=yes for a GPU to count); keys: gpu (sm_XY, gfxNNN, several with +), "
        "torch, cuda, hip, xpu, triton, python, nvcc, glibc ... (docs/settings.md#posing-as-another-machine)"))


def _context(args):
    from .facts.pins import PinsError
    from .engine import value_once, load_context
    from .facts.settings import SettingsError

    try:
        return load_context(getattr(args, "target", None), strict=True)
    except SettingsError as exc:  # one line per bad variable
        # the value said once ("unknown kernel 'x'": it was just said), so that the whole reason fits a line
        raise _UsageError("\n".join(f"{var}={value!r} is not valid: {value_once(value, why).replace(f' {value!r}', '')}"
                                     for var, value, why in exc.problems)) from None
    except PinsError as exc:
        raise _UsageError(str(exc)) from None


def _kernels(names):
    from .facts.settings import normalize_kernel

    try:
        return [normalize_kernel(n) for n in names]
    except ValueError as exc:
        raise _UsageError(str(exc)) from None


def _snapshot(settings, pins, *, sources: bool = False):
    """(env, plan, installed). `sources` (doctor, plan): where transformers 5.25+ on an accelerator takes kernels
    from the hub, its mapping is imported and the world read again, so that the probe sees what the hub serves
    here (the other commands need no torch import)."""
    from .facts.distributions import installed_versions
    from .engine import snapshot

    env, plan = snapshot(settings, pins)
    hub = "transformers.integrations.hub_kernels"
    version = env.dist_version("transformers") if sources and env.accelerator and not env.hub_entries else None
    if version is not None and version.release[:2] >= (5, 25) and hub not in sys.modules:
        try:
            import transformers.integrations.hub_kernels  # noqa: F401
        except Exception:   # noqa: BLE001 - a broken transformers: the rest of doctor still says what it can
            pass
        else:
            env, plan = snapshot(settings, pins)
    return env, plan, installed_versions()


def _doctor(args) -> int:
    from . import report
    from ._names import cache_root
    from .act.store import VerdictCache
    from .hooks import activation

    settings, pins = _context(args)
    cache, root = VerdictCache(settings), cache_root(settings)
    if args.refresh:
        from .act import store
        from .events import forget_said

        cache.forget()
        store.forget(root)   # the remembered checks, shared by the user's environments
        forget_said()   # the lines said once per environment are said again
    env, plan, real = _snapshot(settings, pins, sources=True)
    act = activation.status()
    verdicts = cache.entries()
    interrupted = _interrupted(settings)
    smoke = None
    if args.smoke:
        from .act.verify import run_smoke

        smoke = run_smoke(settings, env)
    wheels, jit = report.wheel_cache_json(root), report.jit_json(env, root)
    if args.json:
        data = report.doctor_json(plan, settings, pins=pins, activation=act, verdicts=verdicts, real_installed=real)
        data.update(interrupted_install=interrupted, wheel_cache=wheels, jit=jit)
        if smoke is not None:
            data["smoke"] = smoke
        print(json.dumps(data, indent=2))
    else:
        print(report.doctor_text(plan, settings, pins=pins, activation=act, verdicts=verdicts, interrupted=interrupted))
        print("\n" + report.wheel_cache_text(wheels))
        print("\n" + report.jit_text(jit))
        if smoke is not None:
            from .act.verify import smoke_text

            print("\n" + smoke_text(smoke))
    return 1 if smoke is not None and smoke.get("status") == "fail" else 0


def _interrupted(settings) -> dict | None:
    """The install a journal says is running now or was killed half-way (doctor shows it)."""
    from .engine.world import interrupted

    return interrupted(settings)


def _plan(args) -> int:
    from . import report

    settings, pins = _context(args)
    wanted = _kernels(args.kernels)
    env, plan, real = _snapshot(settings, pins, sources=True)
    if wanted:
        plan = _only(plan, wanted)
    print(json.dumps(report.plan_json(plan, settings, real_installed=real, pins=pins), indent=2) if args.json
          else report.plan_text(plan, settings, real_installed=real, pins=pins))
    return 0


def _only(plan, kernels):
    """The plan restricted to `kernels`, in the plan's order."""
    from dataclasses import replace

    return replace(plan, decisions={k: v for k, v in plan.decisions.items() if k in kernels})


def _with_needs(plan, kernels) -> set:
    """`kernels` and every kernel they need first (install fla on Hopper: tilelang too)."""
    out, todo = set(), list(kernels)
    while todo:
        kernel = todo.pop()
        if kernel not in out:
            out.add(kernel)
            todo.extend(plan.decisions[kernel].needs)
    return out


def _install(args) -> int:
    """Exit 1 when a kernel named (with none named: one the plan installs, repairs or keeps) does not end
    usable, or one is blocked; FASTPATH_HOOKS_MODE=report installing nothing is fine."""
    from . import engine, report
    from .decide import messages as short
    from .decide.plan import BLOCK, SKIP
    from .engine.outcome import GOOD, OutcomeState

    settings, pins = _context(args)
    named = _kernels(args.kernels)
    wanted = named or list(listed(registry()))
    if args.dry_run:
        env, plan, real = _snapshot(settings, pins)
        print(report.plan_text(_only(plan, _with_needs(plan, wanted)), settings, real_installed=real, pins=pins))
        return 0
    needed = set(wanted)
    if not named:   # the kernels this machine needs: what the plan (for --target's machine) installs or keeps
        _, plan, _ = _snapshot(settings, pins)
        needed = {k for k in wanted if k in plan.decisions and plan.decisions[k].action not in (SKIP, BLOCK)}
    missing, states = [], []
    engine.expect(wanted)   # the compiled ones among them install together (builds side by side, one check)
    for kernel in wanted:
        outcome = engine.ensure(kernel, target=args.target, now=True)   # a remembered failure is tried again
        print(f"{kernel}: {outcome.state} - {outcome.reason}")
        fine = outcome.state in GOOD or outcome.state == OutcomeState.REPORTED   # MODE=report asked for no install
        if outcome.state == OutcomeState.BLOCKED or (kernel in needed and not fine):
            missing.append(kernel)
            states.append(f"{kernel} ({outcome.state})")
    if missing:
        from .events import first_fitting

        tail = f" - {'named' if named else 'needed here'} but not usable (the reasons are above); exit 1"
        _error(first_fitting(f"not installed: {', '.join(states)}{tail}", f"not installed: {', '.join(missing)}{tail}",
                             f"not installed: {short.few(missing, 40)}{tail}"))
        return 1
    return 0


def _download(args) -> int:
    from .engine import jobs
    from .engine.world import InstallFailed

    settings, pins = _context(args)
    if settings.offline:
        raise _UsageError("download needs the network: unset FASTPATH_HOOKS_OFFLINE")
    _writable_dir(args.dest)
    plan = jobs.plan_download(settings=settings, pins=pins, kernels=_kernels(args.kernels) or None)
    if plan.nothing:
        _error(plan.nothing_line, whole=f"nothing to download for this target ({plan.nothing})")
        return 1
    try:
        files = jobs.download(plan, args.dest)
    except InstallFailed as exc:
        _error(str(exc))
        return 1
    if plan.builds:
        how = "; ".join(f"`fastpath-hooks build {k} --arch ARCH --dest {args.dest}`" for k in plan.build_kernels)
        print(f"note: source builds are not downloaded ({', '.join(plan.builds)}); build the wheel for the target's "
              f"GPUs into the wheelhouse on a machine with its torch and nvcc: {how}", file=sys.stderr)
    for f in files:
        print(f)
    print(f"wheelhouse {os.path.abspath(args.dest)}: {len(files)} files. Install from it with "
          f"FASTPATH_HOOKS_FIND_LINKS={os.path.abspath(args.dest)} FASTPATH_HOOKS_OFFLINE=1")
    return 0


def _build(args) -> int:
    from .decide.plan import SKIP
    from .engine import jobs
    from .engine.world import InstallFailed

    settings, pins = _context(args)
    kernel = _kernels([args.kernel])[0]
    try:
        plan = jobs.plan_build(kernel, settings=settings, pins=pins, archs=args.arch, rebuild=args.rebuild)
    except jobs.Refused as exc:
        raise _UsageError(str(exc)) from None
    if plan.cached:
        print(f"{kernel}: {os.path.basename(plan.cached)} is already in the wheel cache ({plan.cached}); "
              "--rebuild builds it again")
        return _export(plan.cached, args.dest)
    decision = plan.decision
    if decision.action == SKIP:
        from .decide.messages import line

        print(f"fastpath-hooks: {line(decision, outcome_word='not built')}", file=sys.stderr)   # the whole: `plan`
        return 1
    print(f"{kernel}: {decision.reason}")
    if args.dest:
        _writable_dir(args.dest)  # before minutes of building, not after
    try:
        paths = jobs.build(plan)
    except InstallFailed as exc:
        _error(f"{kernel}: build failed - {exc}")   # fitted: never cut before its log's path ends
        return 1
    for path in paths:
        print(f"{kernel}: built {path}")
        code = _export(path, args.dest)
        if code:
            return code
    return 0


def _export(path: str, dest) -> int:
    from .act import fetch as wheelcache

    if not dest:
        return 0
    try:
        target = wheelcache.export(path, dest)
    except OSError as exc:
        print(f"fastpath-hooks: cannot copy {os.path.basename(path)} into --dest {dest}: {exc}", file=sys.stderr)
        return 1
    print(f"copied to {target}; install it anywhere with FASTPATH_HOOKS_FIND_LINKS={os.path.abspath(dest)} "
          "(with FASTPATH_HOOKS_OFFLINE=1 on machines without network)")
    return 0


def _cache_list(args) -> int:
    from . import report
    from ._names import cache_root

    settings, _ = _context(args)
    data = report.wheel_cache_json(cache_root(settings))
    print(json.dumps(data, indent=2) if args.json else report.wheel_cache_text(data))
    return 0


def _cache_clear(args) -> int:
    from .act import fetch as wheelcache
    from ._names import cache_root

    settings, pins = _context(args)
    dist = None
    if args.kernel:
        kernel = _kernels([args.kernel])[0]
        dist = pins.kernel(kernel).distributions[0]
    root = cache_root(settings)
    try:
        removed = wheelcache.clear(root, dist)
    except (OSError, TimeoutError) as exc:  # filelock.Timeout is a TimeoutError
        _error(f"cannot clear the wheel cache {wheelcache.directory(root)}: {exc}")
        return 1
    for name in removed:
        print(f"removed {name}")
    print(f"wheel cache {wheelcache.directory(root)}: removed {len(removed)} wheel{'s' if len(removed) != 1 else ''}"
          + (f" of {dist}" if dist else ""))
    return 0


def _writable_dir(dest: str) -> None:
    """--dest must be a directory this process can write (made if absent): one line otherwise."""
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise _UsageError(f"--dest {dest!r} is a file; give a directory for the wheelhouse")
    try:
        os.makedirs(dest, exist_ok=True)
        probe = os.path.join(dest, f".fastpath-hooks-write-test-{os.getpid()}")
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as exc:
        raise _UsageError(f"--dest {dest!r}: cannot write there ({exc.strerror or exc}); "
                          "give a writable directory") from None


def _activation(args) -> int:
    from .hooks import activation

    try:
        done = activation.enable(args.method) if args.command == "enable" else activation.disable()
    except activation.ActivationError as exc:   # e.g. a sitecustomize.py that would not compile: nothing changed
        raise _UsageError(str(exc)) from None
    for line in done:
        print(line)
    if args.command == "enable":
        print("fastpath-hooks now activates at interpreter start in this environment "
              "(FASTPATH_HOOKS_DISABLE=1 turns it off for one run; `fastpath-hooks disable` removes it).")
    elif not done:
        print("nothing to remove: fastpath-hooks was not enabled in this environment")
    return 0
