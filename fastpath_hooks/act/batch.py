"""Several kernels of one request installed together: one transaction, their dependencies in one
installer call, their source builds side by side, their wheels in one installer call, one
verification child for all of them.

The engine hands over the acting decisions of a request in dependency order (causal-conv1d before
mamba-ssm), with the environment lock held. The steps run as the guarded installer runs one
kernel's (act/installer.py: allow-list, constraints, a check after every step, a journal that a
killed run is rolled back from), only fewer processes start:

- the DEPS steps of every member: one call, first - where a member builds (its build imports them);
- each member's wheel made local: a cached or wheelhouse file, a download, an index lookup (its
  fallback the build after it), or a source build - the builds run at the same time, each with its
  share of the cores (decide.builds.core_budget), so the wall time is the longest build's, not the sum;
- the wheels: one installer call - with the dependencies they lack where nothing builds
  (decide.batches.deps_with_wheels: a later environment's cached kernels in one call), `--no-deps`,
  then a resolving call for those dependencies only where one of them lacks what it needs;
- one child imports every member's modules in dependency order and runs the numeric checks of
  those that have one here (act/verify.verify_many; act/numeric.py: remembered per installed files,
  GPU arch and torch build, so a later environment runs none).

A member whose build, lookup or check fails is dropped, with the members that need it; everything
is rolled back and the rest installed again in a new transaction from the wheels already made (no
second build), so one kernel's failure never costs another its install. Nothing of a dropped member
stays installed.
"""

from __future__ import annotations

import importlib
import os
import shutil
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement

from .. import events
from .._names import cache_root
from ..decide.builds import core_budget, split_allowed
from ..decide.messages import minutes
from ..decide.plan import Step, StepKind, choose_installer, constraints, step_names
from ..decide.policy import deps_with_wheels
from ..facts.distributions import canonical_name, scan, site_packages
from ..facts.frozen import FrozenMap, freeze_fields
from .fetch import FetchError, fetch_wheel
from .installer import (InstallError, InstallResult, REMEMBERED, _build_step, _cache_wheel, _check_changes,
                        _check_result, _restart_advised, _run_step, _versions, allowed_steps, index_wheel)
from .numeric import plan_for
from .runner import kill_group
from .transaction import Transaction, WORK_PREFIX
from .verify import verify_many

# a member whose import the cache remembers for these very files and this environment: no child checked it


@dataclass(frozen=True)
class BatchResult:
    """kernel -> InstallResult of the members installed; kernel -> why, of those that were not."""
    results: FrozenMap
    failed: FrozenMap
    seconds: float
    children: int       # the processes it started (installer calls, builds, verification children)
    numeric: tuple = ()  # the failed ones whose numbers differ from torch's here (blocked there, as one install is)

    _freezes_itself = True

    def __post_init__(self):
        freeze_fields(self)


class _Dropped(Exception):
    def __init__(self, failed: dict, numeric=()):
        self.failed = failed
        self.numeric = set(numeric)   # those that failed on their numbers (act/numeric.py): blocked on this GPU


def run_batch(decisions, *, settings, env, pins, state_dir: str, site: str | None = None,
              estimates: dict | None = None) -> BatchResult:
    """Install the acting `decisions` (dependency order) together; see the module docstring.
    `estimates`: kernel -> the build's expected seconds (its share of the cores follows them)."""
    members = list(decisions)
    failed: dict = {}
    numeric: set = set()
    made: dict = {}   # kernel -> [(distribution names, local wheel, cache entry or None)], kept across retries
    start = time.monotonic()
    counter = {"children": 0}
    work = os.path.join(state_dir, WORK_PREFIX + uuid.uuid4().hex[:12])   # outlives one transaction; recover() removes it
    os.makedirs(work, exist_ok=True)
    try:
        while members:
            try:
                results = _transaction(members, made, settings=settings, env=env, pins=pins, state_dir=state_dir,
                                       site=site, work=work, estimates=estimates or {}, counter=counter)
                return BatchResult(results, failed, time.monotonic() - start, counter["children"], tuple(sorted(numeric)))
            except _Dropped as exc:
                failed.update(exc.failed)
                numeric |= exc.numeric
                members = _survivors(members, failed)
        return BatchResult({}, failed, time.monotonic() - start, counter["children"], tuple(sorted(numeric)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _survivors(members, failed: dict) -> list:
    """The members not failed and not needing a failed one (said as their reason)."""
    out = []
    for d in members:
        if d.kernel in failed:
            continue
        lost = [k for k in d.needs if k in failed]
        if lost:
            failed[d.kernel] = f"not installed: it needs {lost[0]}, which failed ({failed[lost[0]]})"
            continue
        out.append(d)
    return out


def _transaction(members, made: dict, *, settings, env, pins, state_dir, site, work, estimates, counter) -> dict:
    real_before = _versions(scan()[0])
    steps = {d.kernel: allowed_steps(d.steps, pins, real_before) for d in members}
    site = site or site_packages()
    if not os.access(site, os.W_OK):
        raise InstallError(f"{site} is not writable: install the kernels as the environment's owner "
                           f"(`fastpath-hooks install`) or set FASTPATH_HOOKS_SKIP")
    installer = choose_installer(settings, env)
    protected_before = {n: real_before.get(n) for n in pins.protected}
    names = set().union(*(step_names(s) for s in steps.values()))
    kernels = ", ".join(d.kernel for d in members)
    tx = Transaction(state_dir, site, names, description=f"install {kernels} together")
    tx_work = tx.work_dir
    scratch = (("TMPDIR", tx_work), ("TEMP", tx_work), ("TMP", tx_work))
    lead = members[0].kernel
    began = time.monotonic()
    try:
        try:
            tx.begin()
        except OSError as exc:
            tx.commit()
            raise InstallError(f"could not back up the current state before installing ({exc}); nothing was changed") \
                from None
        try:
            os.makedirs(tx_work, exist_ok=True)
            cfile = os.path.join(tx_work, "constraints.txt")
            with open(cfile, "w", encoding="utf-8") as fh:
                fh.write("\n".join(constraints(real_before, pins.protected, names)) + "\n")
            now = None
            deps = _merged(s for k in steps for s in steps[k] if s.kind == StepKind.DEPS)
            with_wheels = deps is not None and deps_with_wheels(members)
            if deps is not None and not with_wheels:
                counter["children"] += 1
                installer = _run_step(deps, installer=installer, settings=settings, env=env, cfile=cfile, local=None,
                                      kernel=lead, work=tx_work, scratch=scratch, started=tx.record_group)
                now = scan()
                _check_changes(_versions(now[0]), protected_before, real_before, pins)
            dropped = _make_wheels(members, steps, made, settings=settings, env=env, pins=pins, work=work, tx=tx,
                                   estimates=estimates, counter=counter)
            if dropped:
                raise _Dropped(dropped)
            files = [path for d in members for path, _ in made[d.kernel]]
            named = tuple(deps.requirements) if with_wheels else ()
            wheel = Step(kind=StepKind.WHEEL, requirements=named + tuple(os.path.basename(p) for p in files), no_deps=True,
                         force=any(s.force for k in steps for s in steps[k]))
            counter["children"] += 1
            installer = _run_step(wheel, installer=installer, settings=settings, env=env, cfile=cfile, local=None,
                                  kernel=lead, work=tx_work, scratch=scratch, started=tx.record_group,
                                  local_files=tuple(files))
            now = scan()
            if with_wheels and _unmet(deps.names, now[0]):   # what they need in turn: resolved, only now
                counter["children"] += 1
                installer = _run_step(deps, installer=installer, settings=settings, env=env, cfile=cfile, local=None,
                                      kernel=lead, work=tx_work, scratch=scratch, started=tx.record_group)
                now = scan()
            after = _versions(now[0])
            _check_changes(after, protected_before, real_before, pins)
            for d in members:
                _check_result(d, after, protected_before, real_before, pins, env)
            kernel_env = tuple(pair for d in members for pair in d.env)
            counter["children"] += 1
            root = cache_root(settings)
            checks = verify_many([pins.kernel(d.kernel) for d in members], timeout=settings.timeout,
                                 env_extra=kernel_env + scratch, started=tx.record_group,
                                 numeric=[plan_for(d.kernel, env, pins, root) for d in members], root=root,
                                 gpus=env.gpus)
            bad = {d.kernel: r.detail if r.numeric else f"verification failed: {r.detail}"
                   for d, r in zip(members, checks) if not r.ok and not r.detail.startswith("not checked")}
            if bad:
                raise _Dropped(bad, numeric={d.kernel for d, r in zip(members, checks) if not r.ok and r.numeric})
            for d, r in zip(members, checks):
                events.status(f"verified {d.kernel}: {r.detail}", d.kernel, human=False)
            for d in members:
                for path, entry in made[d.kernel]:
                    if entry is not None:
                        _cache_wheel(settings, path, entry[0], entry[1], d.kernel, env)
        except BaseException as exc:
            done = tx.rollback()
            events.status("rolled back: " + ("; ".join(done) if done else "nothing had changed"), lead, human=bool(done))
            if isinstance(exc, (_Dropped, KeyboardInterrupt, SystemExit)):
                raise
            detail = str(exc) if isinstance(exc, InstallError) else f"{type(exc).__name__}: {exc}"
            raise InstallError(detail) from None
        tx.commit()
    finally:
        shutil.rmtree(tx_work, ignore_errors=True)

    importlib.invalidate_caches()
    changed = {n: v for n, v in after.items() if real_before.get(n) != v}
    restart = _restart_advised(changed, now[0])
    seconds = time.monotonic() - began
    owner: dict = {}   # a distribution is said with the first member (dependency order) that names it
    for d in members:
        for name in step_names(steps[d.kernel]):
            owner.setdefault(name, d.kernel)
    return {d.kernel: InstallResult(d.kernel, {n: v for n, v in changed.items() if owner.get(n) == d.kernel},
                                    seconds, installer, restart, scan=now,
                                    checked="verified in a child process" if r.child else REMEMBERED)
            for d, r in zip(members, checks)}


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
    """The Requires-Dist lines of a dist-info's METADATA (its header, up to the first blank line)."""
    out = []
    try:
        with open(os.path.join(info, "METADATA"), encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    break
                if line.startswith("Requires-Dist:"):
                    out.append(line.split(":", 1)[1].strip())
    except OSError:
        pass
    return out


def _merged(steps) -> Step | None:
    """One DEPS step for all of them (their requirements in order, each once)."""
    reqs: list = []
    for step in steps:
        reqs += [r for r in step.requirements if r not in reqs]
    if not reqs:
        return None
    return Step(kind=StepKind.DEPS, requirements=tuple(reqs), no_deps=False,
                note="the runtime dependencies (and build needs) of the kernels installed together")


def _make_wheels(members, steps, made: dict, *, settings, env, pins, work, tx, estimates, counter) -> dict:
    """Each member's wheels made local (into `made`, kept for a later round): files and downloads at
    once, then every source build at the same time. Returns kernel -> why, for the members that failed."""
    failed, builds, pending = {}, [], {}
    for d in members:
        if d.kernel in made:
            continue
        out, brought, todo = [], set(), list(steps[d.kernel])
        try:
            for i, step in enumerate(todo):
                if step.kind in (StepKind.DEPS, StepKind.KERNEL, StepKind.REPLACE):
                    continue
                if step.kind in (StepKind.INDEX, StepKind.BUILD) and set(step.names) <= brought:
                    continue
                if step.kind == StepKind.INDEX:
                    local = index_wheel(step, todo[i + 1:], settings=settings, env=env, work=work, kernel=d.kernel)
                    if local is None:
                        continue
                    brought |= set(step.names)
                    out.append([local, (os.path.basename(local), {"origin": "index", "url": step.url})])
                elif step.kind == StepKind.WHEEL:
                    local = _wheel_file(step, settings, work)
                    downloaded = step.url and not step.url.startswith("file:") and os.path.dirname(local) == work
                    out.append([local, (step.requirements[0], {"origin": "downloaded", "url": step.url})
                                if downloaded else None])
                elif step.kind == StepKind.BUILD:
                    builds.append((d, step))
                    out.append([None, None])          # filled in once the build is done
                    pending[d.kernel] = len(out) - 1
        except InstallError as exc:
            failed[d.kernel] = str(exc)
            continue
        made[d.kernel] = out
    builds = [(d, step) for d, step in builds if d.kernel not in failed]
    if builds:
        spec_of = {d.kernel: pins.build(d.kernel, next(iter(step.exact.values()), None)) for d, step in builds}
        budget = core_budget([(d.kernel, spec_of[d.kernel], estimates.get(d.kernel, d.expected_seconds),
                               split_allowed(spec_of[d.kernel], settings, env.nvcc_version)) for d, _ in builds],
                             cpus=env.cpus, memory_gib=env.memory_gib, settings=settings, jobs_given=_jobs_given())
        if len(builds) > 1:
            longest = max((d.expected_seconds or 0) for d, _ in builds)
            events.status(f"{' and '.join(d.kernel for d, _ in builds)}: building from source side by side, about "
                          f"{minutes(longest)} in all (the longest build's estimate; `fastpath-hooks build` or "
                          "examples/Dockerfile does it ahead of time)", builds[0][0].kernel)
        results = _build_all(builds, budget, settings=settings, env=env, pins=pins, work=work, tx=tx)
        counter["children"] += len(builds)
        for d, _ in builds:
            got = results.get(d.kernel)
            if not isinstance(got, tuple):
                failed[d.kernel] = str(got) if got is not None else "the build did not run"
                made.pop(d.kernel, None)
                continue
            _, path, (_, name, meta) = got
            made[d.kernel][pending[d.kernel]] = [path, (name, meta)]
    return failed


def _build_all(builds, budget, *, settings, env, pins, work, tx) -> dict:
    """Every build at the same time, each in a thread with its own work directory and its process
    group journalled (a killed run's recovery stops them all); kernel -> _build_step's result or
    the exception. Ctrl-C (or anything else here) kills every build's group before it propagates."""
    results: dict = {}
    live: dict = {}
    lock = threading.Lock()
    together = [d.kernel for d, _ in builds]

    def one(d, step):
        own = os.path.join(work, "build-" + d.kernel)
        os.makedirs(own, exist_ok=True)
        scratch = (("TMPDIR", own), ("TEMP", own), ("TMP", own))
        mine: list = []

        def started(pgid):
            with lock:
                if pgid is not None:
                    mine.append(pgid)
                    tx.record_side_group(pgid, True)
                    live[pgid] = tx.groups.get(pgid)
                else:
                    for g in mine:
                        tx.record_side_group(g, False)
                        live.pop(g, None)

        try:
            results[d.kernel] = _build_step(step, settings=settings, env=env, pins=pins, work=own, kernel=d.kernel,
                                            scratch=scratch, started=started, share=budget[d.kernel],
                                            expected=d.expected_seconds, together=[k for k in together if k != d.kernel])
        except Exception as exc:   # noqa: BLE001 - handed to the caller, which says it
            results[d.kernel] = exc

    threads = [threading.Thread(target=one, args=(d, step), name=f"fastpath-hooks build {d.kernel}", daemon=True)
               for d, step in builds]
    try:
        with _import_lock_released():
            for th in threads:
                th.start()
            for th in threads:
                while th.is_alive():
                    th.join(0.5)
    except BaseException:
        with lock:
            groups = [g for g in live.values() if g]
        for g in groups:
            kill_group(g)
        for th in threads:
            th.join(15)
        raise
    return results


@contextmanager
def _import_lock_released():
    """The global import lock let go while the builds run. The import hook decides inside a finder's
    find_spec, which CPython calls holding that lock (importlib._bootstrap._find_spec): a build thread's
    first import (the build module, the runner...) would wait for it while this thread waits for the
    builds - for ever. Taken again as often as it was held."""
    import _imp

    held = 0
    try:
        while True:
            _imp.release_lock()   # RuntimeError once this thread holds it no more
            held += 1
    except RuntimeError:
        pass
    try:
        yield
    finally:
        for _ in range(held):
            _imp.acquire_lock()


def _wheel_file(step, settings, work) -> str:
    try:
        return fetch_wheel(step, settings, work)
    except FetchError as exc:
        raise InstallError(str(exc)) from None


def _jobs_given() -> int | None:
    given = os.environ.get("MAX_JOBS")
    return int(given) if given and given.isdigit() and int(given) > 0 else None

