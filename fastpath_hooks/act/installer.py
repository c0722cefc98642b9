"""The guarded installer: the acting decisions of one request (a lone kernel is a batch of one) in ONE
transaction, checked, verified in one child, committed or rolled back.

Only allow-listed distributions are named, never a protected one the user has; a constraints file pins every
installed distribution the steps do not name, so a resolve can only add; after every installer call, before
another interpreter starts (a stranger's .pth file would run in it), only allow-listed distributions may have
changed; in auto mode a call uv rejects (an LZMA-compressed wheel) is retried with pip; any failure, Ctrl-C
included, restores what was there. A kernel whose wheel, build or check fails is dropped with those that need
it, and the rest installed again from the wheels already made (no second build). Scratch files live in the
environment's state directory: a killed run leaves nothing in /tmp.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import shutil
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from email.parser import HeaderParser

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from .. import events
from .._names import cache_root
from ..decide.plan import Step, StepKind
from ..events import fitted, shown_path
from ..facts.distributions import canonical_name, record_files, scan, site_packages
from ..facts.frozen import FrozenMap, freeze_fields, thaw
from ..facts.wheels import wheel_distribution
from .build import BuildError, Built, build_all, import_lock_released, run_build
from .fetch import FetchError, directory, fetch_wheel, store
from .numeric import plan_for
from .runner import execute
from .transaction import Transaction, WORK_PREFIX
from .verify import verify_many


class InstallError(Exception):
    """An installer call or a check of the whole transaction failed; the environment was restored."""


REMEMBERED = "import check remembered"   # an install's line where no child checked it (act/store.py)
CHILD = "verified in a child process"
_REQUIREMENTS = (StepKind.DEPS, StepKind.KERNEL, StepKind.REPLACE)   # installer calls by name, no file


@dataclass(frozen=True)
class InstallResult:
    kernel: str
    installed: FrozenMap     # dist -> version now present that was not before (or changed)
    seconds: float
    installer: str
    restart_advised: tuple   # modules imported before their distribution changed
    scan: tuple = ()         # sys.path's (distributions, duplicates) afterwards: the engine settles its env from it
    checked: str = CHILD     # how, for its line
    added: tuple = ()        # the distributions of `installed` that were absent before (an undo removes them)

    _freezes_itself = True

    def __post_init__(self):
        freeze_fields(self)


@dataclass(frozen=True)
class Installed:
    """kernel -> InstallResult of the kernels installed; kernel -> why, of those that were not."""
    results: FrozenMap
    failed: FrozenMap
    seconds: float
    children: int        # the processes it started (installer calls, builds, verification children)
    numeric: tuple = ()  # the failed ones whose numbers differ from torch's here (blocked on this GPU)

    _freezes_itself = True

    def __post_init__(self):
        freeze_fields(self)


class _Dropped(Exception):
    def __init__(self, failed: dict, numeric=()):
        self.failed = failed
        self.numeric = set(numeric)


def install(decisions, *, settings, env, pins, commands, state_dir: str, site: str | None = None,
            verify: bool = True) -> Installed:
    """The acting `decisions` (dependency order) in one transaction, run as `commands` (decide.policy.Commands)
    says; `site` must be on sys.path. InstallError when the transaction as a whole failed (rolled back)."""
    members = list(decisions)
    failed: dict = {}
    numeric: set = set()
    made: dict = {}   # kernel -> [[local wheel, (cache file name, sidecar) or None]], kept across rounds
    start = time.monotonic()
    counter = {"children": 0}
    work = os.path.join(state_dir, WORK_PREFIX + uuid.uuid4().hex[:12])   # outlives one transaction
    os.makedirs(work, exist_ok=True)
    try:
        while members:
            try:
                results = _transaction(members, made, settings=settings, env=env, pins=pins, commands=commands,
                                       state_dir=state_dir, site=site, work=work, counter=counter, verify=verify)
                return Installed(results, failed, time.monotonic() - start, counter["children"], tuple(sorted(numeric)))
            except _Dropped as exc:
                failed.update(exc.failed)
                numeric |= exc.numeric
                members = _survivors(members, failed, pins)
        return Installed({}, failed, time.monotonic() - start, counter["children"], tuple(sorted(numeric)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _survivors(members, failed: dict, pins) -> list:
    """The members not failed, not needing a failed one, and not there only for failed ones (tilelang for fla, in a
    batch beside a build) - said as their reason."""
    out = []
    for d in members:
        if d.kernel in failed:
            continue
        lost = [k for k in d.needs if k in failed]
        if lost:
            failed[d.kernel] = f"not installed: it needs {lost[0]}, which failed ({failed[lost[0]]})"
            continue
        served = [k for k in pins.kernel(d.kernel).serves if any(m.kernel == k for m in members)]
        if served and all(k in failed for k in served):
            failed[d.kernel] = f"not installed: it is there for {served[0]}, which failed"
            continue
        out.append(d)
    return out


def _transaction(members, made: dict, *, settings, env, pins, commands, state_dir, site, work, counter, verify) -> dict:
    real_before = _versions(scan()[0])
    steps = {d.kernel: allowed_steps(d.steps, pins, real_before) for d in members}
    site = site or site_packages()
    if not os.access(site, os.W_OK):
        raise InstallError(f"{site} is not writable: install the kernels as the environment's owner "
                           f"(`fastpath-hooks install`) or set FASTPATH_HOOKS_SKIP")
    installer = commands.installer
    protected_before = {n: real_before.get(n) for n in pins.protected}
    names = {n for kernel_steps in steps.values() for s in kernel_steps for n in s.names}
    lead = members[0].kernel
    targets = ", ".join(f"{n} {v}" for d in members for n, v in d.target.items())
    description = (f"{members[0].action} of {lead}" if len(members) == 1
                   else f"install of {', '.join(d.kernel for d in members)} together") + (f" ({targets})" if targets else "")
    tx = Transaction(state_dir, site, names, description=description)
    tx_work = tx.work_dir   # exists only while the journal does: a killed run's is removed by recover()
    scratch = (("TMPDIR", tx_work), ("TEMP", tx_work), ("TMP", tx_work))   # the installers' and checks' temp files
    began = time.monotonic()
    try:
        try:
            tx.begin()
        except OSError as exc:
            tx.commit()   # nothing was installed yet: drop the partial backup
            raise InstallError(f"could not back up the current state before installing ({exc}); nothing was changed") \
                from None
        try:
            os.makedirs(tx_work, exist_ok=True)
            cfile = os.path.join(tx_work, "constraints.txt")
            with open(cfile, "w", encoding="utf-8") as fh:   # the lines `fastpath-hooks plan` prints
                fh.write("\n".join(commands.constraints(real_before, names)) + "\n")
            now = None

            def call(step, files=()):
                nonlocal installer, now
                counter["children"] += 1
                installer = _run_step(step, installer=installer, commands=commands, cfile=cfile, kernel=lead,
                                      work=tx_work, scratch=scratch, started=tx.record_group, local_files=files)
                now = scan()   # before the next interpreter starts: only allow-listed distributions changed
                _check_changes(_versions(now[0]), protected_before, real_before, pins)

            deps = _merged(s for k in steps for s in steps[k] if s.kind == StepKind.DEPS)
            with_wheels = deps is not None and len(members) > 1 and commands.deps_with_wheels(members)
            if len(members) == 1:
                calls = [s for s in steps[lead] if s.kind in _REQUIREMENTS]
            else:
                calls = [deps] if deps is not None and not with_wheels else []
                calls += [s for d in members for s in steps[d.kernel] if s.kind in (StepKind.KERNEL, StepKind.REPLACE)]
            root = cache_root(settings)

            def check(group) -> list:
                counter["children"] += 1
                return verify_many([pins.kernel(d.kernel) for d in group], timeout=settings.timeout,
                                   env_extra=tuple(p for d in group for p in d.env) + scratch,
                                   envs=[d.env for d in group], started=tx.record_group,
                                   checks=[d.check for d in group], root=root, gpus=env.gpus, keyed=pins.keyed,
                                   numeric=[plan_for(d.kernel, env, pins, root) for d in group])

            def make():
                return _make_wheels(members, steps, made, settings=settings, env=env, pins=pins, commands=commands,
                                    work=work, tx=tx, counter=counter)

            # where a member builds, the others (pure wheels: tilelang, fla) go in and are checked meanwhile
            beside = _beside(members, steps, made)
            early: dict = {}
            if not beside:
                for step in calls:
                    call(step)
                dropped = make()
            else:
                for step in (s for s in calls if s.kind == StepKind.DEPS):
                    call(step)    # what a build needs is there before it starts
                with import_lock_released():   # the build threads may import (see build.py)
                    builder = _Beside(make)
                    for step in (s for s in calls if s.kind != StepKind.DEPS):
                        call(step)
                    if verify:
                        early = dict(zip((d.kernel for d in beside), check(beside)))
                        for kernel, r in early.items():
                            if r.ok:   # said now: the builds go on
                                events.status(f"verified {kernel}: {r.detail}", kernel, human=False)
                    dropped = builder.result()
                dropped.update({k: _why(r) for k, r in early.items()
                                if not r.ok and not r.detail.startswith("not checked")})
            if dropped:
                raise _Dropped(dropped, numeric={k for k, r in early.items() if not r.ok and r.numeric})
            files = [path for d in members for path, _ in made[d.kernel]]
            named = tuple(deps.requirements) if with_wheels else ()
            if files:
                call(Step(kind=StepKind.WHEEL, requirements=named + tuple(os.path.basename(p) for p in files),
                          no_deps=True, force=any(s.force for k in steps for s in steps[k])), tuple(files))
                if with_wheels and _unmet(deps.names, now[0]):   # what they need in turn: resolved, only now
                    call(deps)
            now = now or scan()
            after = _versions(now[0])
            for d in members:
                _check_result(d, after, protected_before, real_before, pins, env)
            checks = []
            if verify:
                later = [d for d in members if d.kernel not in early]
                late = dict(zip((d.kernel for d in later), check(later) if later else ()))
                checks = [early.get(d.kernel) or late[d.kernel] for d in members]
                bad = {d.kernel: _why(r) for d, r in zip(members, checks)
                       if not r.ok and not r.detail.startswith("not checked")}
                if bad:
                    raise _Dropped(bad, numeric={d.kernel for d, r in zip(members, checks) if not r.ok and r.numeric})
                for d, r in zip(members, checks):
                    if d.kernel not in early:
                        events.status(f"verified {d.kernel}: {r.detail}", d.kernel, human=False)
            for d in members:
                for path, entry in made[d.kernel]:
                    if entry is not None:
                        _cache_wheel(settings, path, entry[0], entry[1], d.kernel, env)
        except BaseException as exc:
            done = tx.rollback()
            events.status("rolled back: " + ("; ".join(done) or "nothing had changed"), lead, human=bool(done))
            if isinstance(exc, (_Dropped, KeyboardInterrupt, SystemExit)):
                raise
            detail = str(exc) if isinstance(exc, InstallError) else f"{type(exc).__name__}: {exc}"
            raise InstallError(detail) from None
        tx.commit()
    finally:
        shutil.rmtree(tx_work, ignore_errors=True)

    importlib.invalidate_caches()
    changed = {n: v for n, v in after.items() if real_before.get(n) != v}   # commit() leaves site-packages alone
    restart = _restart_advised(changed, now[0])
    seconds = time.monotonic() - began
    owner: dict = {}   # a distribution is said with the first member (dependency order) that names it
    for d in members:
        for name in (n for s in steps[d.kernel] for n in s.names):
            owner.setdefault(name, d.kernel)
    child = [r.child for r in checks] or [True] * len(members)
    return {d.kernel: InstallResult(d.kernel, {n: v for n, v in changed.items() if owner.get(n, lead) == d.kernel},
                                    seconds, installer, restart, scan=now, checked=CHILD if c else REMEMBERED,
                                    added=tuple(sorted(n for n in changed if owner.get(n, lead) == d.kernel
                                                       and real_before.get(n) is None)))
            for d, c in zip(members, child)}


def _beside(members, steps, made) -> list:
    """The members installed and checked while the others build (none where nothing builds)."""
    if not any(s.kind == StepKind.BUILD for d in members if d.kernel not in made for s in steps[d.kernel]):
        return []
    beside = [d for d in members if not any(s.kind in (StepKind.BUILD, StepKind.WHEEL) for s in steps[d.kernel])]
    return beside if len(beside) < len(members) else []


def _why(result) -> str:
    return result.detail if result.numeric else f"verification failed: {result.detail}"


class _Beside:
    """`make()` in a thread of its own (the builds) while this one installs and checks the rest; its exception is
    raised by `result()`, which waits for it."""

    def __init__(self, make):
        self._value, self._error = None, None
        self._thread = threading.Thread(target=self._run, args=(make,), daemon=True, name="fastpath-hooks builds")
        self._thread.start()

    def _run(self, make):
        try:
            self._value = make()
        except BaseException as exc:   # noqa: BLE001 - handed to the waiting thread
            self._error = exc

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def uninstall(names, *, state_dir: str, description: str, site: str | None = None) -> list:
    """Remove the distributions `names` - all added by an install of this request, for a kernel that failed -
    in a transaction: whole, or restored. What was done; InstallError when it was restored."""
    site = site or site_packages()
    before = _versions(scan()[0])
    tx = Transaction(state_dir, site, names, description=description)
    try:
        tx.begin()
        done = tx.remove()
        after = _versions(scan()[0])
        left = sorted(n for n in tx.names if n in after)
        if left:
            raise InstallError(f"{', '.join(left)} could not be removed")
        gone = {n: v for n, v in before.items() if n not in tx.names and after.get(n) != v}
        if gone:   # never: tx.remove() leaves other distributions' files alone
            raise InstallError(f"removing {', '.join(tx.names)} changed {', '.join(sorted(gone))}")
    except BaseException as exc:
        tx.rollback()
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise InstallError(str(exc) if isinstance(exc, InstallError) else f"{type(exc).__name__}: {exc}") from None
    tx.commit()
    importlib.invalidate_caches()
    return done


def _versions(found: dict) -> dict:
    return {name: dist.version for name, dist in found.items()}


def allowed_steps(steps, pins, installed: dict) -> tuple:
    """The steps as they will run, or InstallError: a protected distribution the user has is left out when it
    satisfies the requirement (the constraints file pins it; naming it would back it up, or with --force
    rewrite it) and refused when it does not; an allowed absent one (numpy for tilelang) may be installed."""
    names = {n for s in steps for n in s.names}
    bad = sorted(n for n in names if n not in pins.allowed)
    if bad:
        raise InstallError(f"refusing to install {', '.join(bad)}: not on the pins' allow-list")
    protected = sorted(n for n in names if n in pins.protected and n not in pins.allowed)
    if protected:
        raise InstallError(f"refusing to install {', '.join(protected)}: protected (never changed by fastpath-hooks)")
    out = []
    for step in steps:
        if step.kind == StepKind.WHEEL:
            out.append(step)
            continue
        keep = []
        for raw, want in zip(step.requirements, step.wants):
            name = want.name
            have = installed.get(name)
            if name not in pins.protected or have is None:
                keep.append(raw)
            elif not _satisfies(have, want.specifier):
                raise InstallError(f"refusing to install {raw}: {name} {have} is installed and protected "
                                   f"(fastpath-hooks never changes it); install a matching {name} yourself "
                                   "or set FASTPATH_HOOKS_SKIP")
        if keep:
            out.append(dataclasses.replace(step, requirements=tuple(keep)))
    return tuple(out)


def _satisfies(version: str, specifier) -> bool:
    try:
        return specifier.contains(Version(version).public, prereleases=True)
    except InvalidVersion:
        return False


def build_to_cache(decision, *, settings, env, pins, commands, state_dir: str) -> list:
    """`fastpath-hooks build` (lock held): the source builds into the wheel cache, not installed (every environment
    that installs one checks it in a child); the cached paths. The environment is left as it was: what a build
    needs and it lacks is installed into the build's own directory (act/build.py)."""
    work = os.path.join(state_dir, WORK_PREFIX + uuid.uuid4().hex[:12])  # a killed run's is removed by recover()
    os.makedirs(work)
    scratch = (("TMPDIR", work), ("TEMP", work), ("TMP", work))
    out = []
    try:
        for step in (s for s in decision.steps if s.kind == StepKind.BUILD):
            try:
                built = run_build(step, settings=settings, env=env, pins=pins, commands=commands, work=work,
                                  kernel=decision.kernel, scratch=scratch)
            except BuildError as exc:
                raise InstallError(str(exc)) from None
            name, meta = _cache_entry(built)
            try:
                out.append(store(cache_root(settings), built.path, meta=meta, filename=name))
            except Exception as exc:
                raise InstallError(f"could not keep {name} in the wheel cache "
                                   f"{directory(cache_root(settings))}: {exc}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _check_changes(after: dict, protected_before: dict, before: dict, pins) -> None:
    for name, version in protected_before.items():
        if after.get(name) == version or (version is None and name in pins.allowed):
            continue  # unchanged, or absent before and allowed to be added (numpy for tilelang)
        raise InstallError(f"the installer changed protected {name} ({version or 'absent'} -> "
                           f"{after.get(name) or 'removed'})")
    changed = set(after) | set(before)
    strangers = sorted(n for n in changed if before.get(n) != after.get(n) and n not in pins.allowed)
    if strangers:
        what = ", ".join(f"{n} ({before.get(n) or 'absent'} -> {after.get(n) or 'removed'})" for n in strangers)
        raise InstallError(f"the installer changed {what}, which is not on the pins' allow-list")


def _check_result(decision, after: dict, protected_before: dict, before: dict, pins, env) -> None:
    _check_changes(after, protected_before, before, pins)
    for name, version in decision.target.items():
        have = after.get(canonical_name(name))
        if not same_release(have, version):
            raise InstallError(f"{name} resolved to {have}, not the pinned {version}")
    for kernel in pins.of_kind("pair"):   # a pair kernel's (tilelang + apache-tvm-ffi) result is never a broken pair
        first, second = pins.kernel(kernel).distributions
        have, companion = after.get(first), after.get(second)
        if have and companion and first in decision.target:
            broken = pins.broken_for(kernel, have, companion, env.gpus)
            if broken is not None:
                raise InstallError(f"resolved to {first} {have} + {second} {companion}, a broken pair "
                                   f"({broken.effect})")


def same_release(have: str | None, pinned: str) -> bool:
    """`have` is the pinned version. A pin without a local label accepts any local build of that
    version (the causal-conv1d release wheel 1.6.2.post1+cu12torch2.10cxx11abiTRUE is 1.6.2.post1);
    a pin with one must match it exactly."""
    if have is None:
        return False
    try:
        got, want = Version(have), Version(pinned)
    except InvalidVersion:
        return have == pinned
    if want.local is not None:
        return got == want
    return Version(got.public) == want


def _unmet(names, found: dict) -> list:
    """The requirements of the distributions `names` - installed without theirs (`--no-deps`) - that
    nothing installed satisfies: their METADATA's Requires-Dist, markers evaluated, extras' aside."""
    out = []
    for name in names:
        dist = found.get(canonical_name(name))
        for raw in _requires_dist(dist.path) if dist is not None else ():
            try:
                req = Requirement(raw)
            except InvalidRequirement:
                out.append(raw)
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            have = found.get(canonical_name(req.name))
            if have is None or not req.specifier.contains(have.version, prereleases=True):
                out.append(str(req))
    return out


def _requires_dist(info: str) -> list:
    """The Requires-Dist values of a dist-info's METADATA."""
    try:
        with open(os.path.join(info, "METADATA"), encoding="utf-8", errors="replace") as fh:
            return HeaderParser().parse(fh).get_all("Requires-Dist") or []
    except OSError:
        return []


def _merged(steps) -> Step | None:
    """One DEPS step for all of them (their requirements in order, each once)."""
    reqs = tuple(dict.fromkeys(r for step in steps for r in step.requirements))
    return Step(kind=StepKind.DEPS, requirements=reqs, no_deps=False,
                note="the runtime dependencies (and build needs) of the kernels installed together") if reqs else None


def _make_wheels(members, steps, made: dict, *, settings, env, pins, commands, work, tx, counter) -> dict:
    """Each member's wheels made local (into `made`, kept for a later round): files and downloads at
    once, then every source build at the same time. Returns kernel -> why, for the members that failed."""
    failed, builds, pending = {}, [], {}
    for d in members:
        if d.kernel in made:
            continue
        out = []
        try:
            for step in steps[d.kernel]:
                if step.kind == StepKind.WHEEL:
                    local = fetch_wheel(step, settings, work)
                    downloaded = step.url and not step.url.startswith("file:") and os.path.dirname(local) == work
                    out.append([local, (step.requirements[0], {"origin": "downloaded", "url": step.url})
                                if downloaded else None])
                elif step.kind == StepKind.BUILD:
                    builds.append((d, step))
                    out.append([None, None])          # filled in once the build is done
                    pending[d.kernel] = len(out) - 1
        except FetchError as exc:
            failed[d.kernel] = str(exc)
            continue
        made[d.kernel] = out
    builds = [(d, step) for d, step in builds if d.kernel not in failed]
    if builds:
        results = build_all([(d.kernel, step, d.expected_seconds) for d, step in builds], settings=settings, env=env,
                            pins=pins, commands=commands, work=work, tx=tx)
        counter["children"] += len(builds)
        for d, _ in builds:
            got = results.get(d.kernel)
            if isinstance(got, Built):
                made[d.kernel][pending[d.kernel]] = [got.path, _cache_entry(got)]
            else:
                failed[d.kernel] = str(got) if got is not None else "the build did not run"
                made.pop(d.kernel, None)
    return failed


def _cache_entry(built) -> tuple:
    """A built wheel's (cache file name, sidecar)."""
    return os.path.basename(built.path), {
        "origin": "built", "key": thaw(built.key), "log": built.log, "build_seconds": round(built.seconds, 1),
        "distribution": built.key["distribution"], "version": built.key["version"], "build": thaw(built.record)}


def _cache_wheel(settings, path: str, name: str, meta: dict, kernel: str, env) -> None:
    """Keep a built or downloaded wheel in the wheel cache; one that cannot be written costs only the next
    environment's build."""
    root = cache_root(settings)
    meta = dict(meta)
    meta.setdefault("distribution", wheel_distribution(name))
    meta.setdefault("key", {"torch": env.torch, "cuda": env.torch_cuda, "python": env.python, "platform": env.platform})
    try:
        cached = store(root, path, meta=meta, filename=name)
    except Exception as exc:  # OSError, a lock timeout: the install stands
        events.warning(fitted(f"{kernel}: could not keep its wheel in the wheel cache: ", exc, "the install stands"),
                       kernel, detail=f"{kernel}: could not keep {name} in the wheel cache {directory(root)} "
                                      f"({exc})")
        return
    events.status(f"{kernel}: kept the wheel in {shown_path(directory(root))}: environments here with this "
                  "cache install it without building", kernel, human=meta.get("origin") == "built",
                  detail=f"{kernel}: kept {name} in the wheel cache ({cached}); environments on this machine with the "
                         "same FASTPATH_HOOKS_CACHE_DIR install it without building")


def _run_step(step, *, installer, commands, cfile, kernel, work, scratch=(), started=None, local_files=()) -> str:
    """Run one installer call; in auto mode a failing uv call is retried with pip. Returns the installer used."""
    settings = commands.settings
    inv = commands.invocation(step, installer=installer, constraints_file=cfile, local_files=local_files)
    label = f"installing {', '.join(step.requirements if step.kind == StepKind.WHEEL else step.names)}"
    ran = execute(inv, settings.timeout, kernel, label, work=work, extra_env=scratch, started=started)
    if ran.code == 0:
        events.status(f"{label}: done in {ran.seconds:.1f} s ({installer})", kernel, human=False)
        return installer
    if ran.code is None:
        raise InstallError(f"{label} did not finish within {settings.timeout:.0f} s (FASTPATH_HOOKS_TIMEOUT)")
    if installer == "uv" and settings.installer == "auto":
        # e.g. an LZMA-compressed wheel (gpu-wheelhouse.sh packs big ones that way), which uv rejects
        events.status(f"uv failed ({ran.tail}); retrying with pip", kernel)
        return _run_step(step, installer="pip", commands=commands, cfile=cfile, kernel=kernel, work=work,
                         scratch=scratch, started=started, local_files=local_files)
    hint = " (install uv, or set FASTPATH_HOOKS_INSTALLER=pip or auto)" if ran.code == 127 and installer == "uv" else ""
    raise InstallError(f"{label} failed ({installer} exit {ran.code}): {ran.tail}{hint}")


def _restart_advised(changed: dict, found: dict) -> tuple:
    """Modules already imported in this process whose distribution just changed (`found`: sys.path now)."""
    out = []
    for name in changed:
        dist = found.get(name)
        if dist is None:
            continue
        tops = set()
        try:
            with open(os.path.join(dist.path, "top_level.txt"), encoding="utf-8") as fh:
                tops.update(line.strip() for line in fh if line.strip())
        except OSError:
            for path in record_files(dist):
                rel = os.path.relpath(path, dist.site)
                top = rel.split(os.sep, 1)[0]
                if not rel.startswith("..") and not rel.endswith(".pth") and not top.endswith(".dist-info"):
                    tops.add(top.removesuffix(".py"))
        out.extend(t for t in sorted(tops) if t in sys.modules and t not in out)
    return tuple(out)
