"""The guarded installer: run a decision's steps, check, verify, or roll back.

Protections, in order: the environment lock is held by the caller; an
interrupted earlier install is rolled back first; only allow-listed
distributions are named, and a protected one (torch, triton, numpy,
transformers) the user has is never named at all - an allow-listed one that is
absent (numpy, for tilelang) may be installed; a constraints file pins the
protected distributions and every other installed one the steps do not name,
so a dependency resolve can only add; after every step, before any other
interpreter starts (a stranger's .pth file would run in it), only allow-listed
distributions may have changed and the protected ones that were there not at
all; every step has a timeout and a heartbeat every 30 s; in auto mode a step
uv rejects (e.g. an LZMA-compressed wheel) is retried with pip; resolved
versions are checked (a range dependency can pull a broken one back); the
kernel is imported in a child process; any failure - Ctrl-C included, after the
installer's process group is killed - restores exactly what was there before
(see transaction.py).

Scratch files (the constraints file, downloads, the installer's output and
its TMPDIR) live in a work directory inside the environment's state directory,
so a run killed half-way leaves nothing in /tmp, and the next run's `recover()`
removes it under the lock.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import shutil
import sys
import time
import uuid
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from .. import events
from .._names import cache_root
from ..decide.plan import StepKind, choose_installer, constraints, invocation, step_names, uv_executable
from ..events import fitted, shown_path
from ..facts.distributions import canonical_name, scan, site_packages
from ..facts.frozen import FrozenMap, freeze_fields, thaw
from ..facts.wheels import wheel_distribution
from . import wheelcache
from .build import BuildError, run_build
from .fetch import FetchError, IndexMiss, fetch_from_index, fetch_wheel
from .numeric import plan_for
from .runner import execute
from .transaction import Transaction, WORK_PREFIX
from .verify import verify_many



class InstallError(Exception):
    """An install step, a check or the verification failed; the environment was restored."""


class NumericMismatch(InstallError):
    """The kernel imported but its numbers differ from torch's on this GPU (act/numeric.py): rolled back,
    and the kernel is blocked on that arch (the message has the measured error)."""


REMEMBERED = "import check remembered"   # an install's line where no child checked it (act/store.py)


@dataclass(frozen=True)
class InstallResult:
    kernel: str
    installed: FrozenMap     # dist -> version now present that was not before (or changed)
    seconds: float
    installer: str
    restart_advised: tuple   # modules imported before their distribution changed
    scan: tuple = ()         # sys.path's (distributions, duplicates) afterwards: the engine settles its env from it
    checked: str = "verified in a child process"   # how, for its line (a batch's remembered import: no child)

    _freezes_itself = True

    def __post_init__(self):
        freeze_fields(self)


def allowed_steps(steps, pins, installed: dict) -> tuple:
    """The steps as they will run, or InstallError.

    Only allow-listed distributions; a protected one never unless it is also allowed (numpy, a
    tilelang dependency) and absent. A protected one the user has is left out of the steps when
    it satisfies the requirement (the constraints file pins it anyway; naming it would back it
    up, or with --force rewrite it) and refused when it does not.
    """
    names = step_names(steps)
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
        have = Version(version)
    except InvalidVersion:
        return False
    return specifier.contains(have.public, prereleases=True)


def recover(state_dir: str) -> list:
    """Roll back an interrupted install found in `state_dir` and remove what killed runs left
    there (backups, work directories). Call with the lock held."""
    tx = Transaction.pending(state_dir)
    done = []
    if tx is not None:
        # Its writer died; its installer may not have (it runs in its own session): stop it first.
        stopped = tx.stop_group()
        still = f"; stopped its installer ({stopped} processes still running)" if stopped else ""
        whole = f"an earlier install was interrupted ({tx.description or tx.id}){still}; restoring the state before it"
        events.warning(fitted(f"an earlier install was interrupted{still}: ", tx.description or tx.id,
                              "restoring the state before it", whole_at="FASTPATH_HOOKS_LOG=debug"), detail=whole)
        done = tx.rollback()
        whole = "recovered: " + ("; ".join(done) if done else "nothing to restore")
        events.status(fitted("recovered: ", "; ".join(_counted(done)) if done else "nothing to restore",
                             whole_at="FASTPATH_HOOKS_LOG=debug"), detail=whole)
    Transaction.discard_stale(state_dir)
    return done


def _counted(done: list) -> list:
    """A rollback's steps for its line: many leftovers removed are one count (the debug log names them)."""
    leftovers = [d for d in done if d.startswith("removed leftover ")]
    if len(leftovers) <= 2:
        return done
    return [d for d in done if d not in leftovers] + [f"removed {len(leftovers)} leftover files"]


def run_steps(decision, *, settings, env, pins, state_dir: str, verify_specs=(), kernel_env=(),
              site: str | None = None) -> InstallResult:
    """Execute `decision.steps` in one transaction; verify; roll back on any failure. `site`: the
    directory installs go to (default this interpreter's site-packages; it must be on sys.path)."""
    real_before = _versions(scan()[0])
    steps = allowed_steps(decision.steps, pins, real_before)
    site = site or site_packages()
    if not os.access(site, os.W_OK):
        raise InstallError(f"{site} is not writable: install the kernels as the environment's owner "
                           f"(`fastpath-hooks install`) or set FASTPATH_HOOKS_SKIP")
    installer = choose_installer(settings, env)
    protected_before = {n: real_before.get(n) for n in pins.protected}
    names = step_names(steps)
    tx = Transaction(state_dir, site, names, description=f"{decision.action} {decision.kernel}: {decision.reason}")
    start = time.monotonic()
    # The work directory exists only while the journal does: a run killed at any point leaves a
    # journal, and the next start's recover() removes both (under the lock).
    work = tx.work_dir
    scratch = (("TMPDIR", work), ("TEMP", work), ("TMP", work))  # the installer's and verifier's temp files
    try:
        try:
            tx.begin()
        except OSError as exc:
            tx.commit()  # nothing was installed yet: drop the partial backup
            raise InstallError(f"could not back up the current state before installing ({exc}); "
                               "nothing was changed") from None
        try:
            os.makedirs(work, exist_ok=True)
            cfile = os.path.join(work, "constraints.txt")
            with open(cfile, "w", encoding="utf-8") as fh:
                # the same lines `fastpath-hooks plan` prints for this decision
                fh.write("\n".join(constraints(real_before, pins.protected, names)) + "\n")
            to_cache = []   # (wheel path, cache file name, sidecar) kept once the kernel is verified
            now = None      # sys.path's distributions after the last step (one scan per step, reused below)
            brought: set = set()   # distributions an index step brought: their fallback steps are skipped
            for i, step in enumerate(steps):
                local = None
                if step.kind in (StepKind.INDEX, StepKind.BUILD) and set(step.names) <= brought:
                    continue
                if step.kind == StepKind.INDEX:
                    local = index_wheel(step, steps[i + 1:], settings=settings, env=env, work=work,
                                        kernel=decision.kernel)
                    if local is None:
                        continue   # the next index or the build
                    brought |= set(step.names)
                    to_cache.append((local, os.path.basename(local), {"origin": "index", "url": step.url}))
                    step = dataclasses.replace(step, kind=StepKind.WHEEL, requirements=(os.path.basename(local),), url=None)
                elif step.kind == StepKind.BUILD:
                    step, local, entry = _build_step(step, settings=settings, env=env, pins=pins, work=work,
                                                     kernel=decision.kernel, scratch=scratch, started=tx.record_group,
                                                     expected=decision.expected_seconds)
                    to_cache.append(entry)
                elif step.kind == StepKind.WHEEL:
                    try:
                        local = fetch_wheel(step, settings, work)
                    except FetchError as exc:
                        raise InstallError(str(exc)) from None
                    if step.url and not step.url.startswith("file:") and os.path.dirname(local) == work:
                        to_cache.append((local, step.requirements[0], {"origin": "downloaded", "url": step.url}))
                installer = _run_step(step, installer=installer, settings=settings, env=env, cfile=cfile,
                                      local=local, kernel=decision.kernel, work=work, scratch=scratch,
                                      started=tx.record_group)
                # Before the next interpreter starts (installer or verification), which would run a
                # stranger's .pth file: only allow-listed distributions may have changed.
                now = scan()
                _check_changes(_versions(now[0]), protected_before, real_before, pins)
            now = now or scan()
            after = _versions(now[0])
            _check_result(decision, after, protected_before, real_before, pins, env)
            children = []   # whether each check ran a child (False: the whole check remembered, act/store.py)
            specs = list(verify_specs)
            results = verify_many(specs, timeout=settings.timeout, env_extra=tuple(kernel_env) + scratch,
                                  started=tx.record_group,
                                  numeric=[plan_for(spec.name, env, pins, cache_root(settings)) for spec in specs],
                                  checks=[decision.check if spec.name == decision.kernel else None for spec in specs],
                                  root=cache_root(settings), gpus=env.gpus)
            for spec, result in zip(specs, results):
                if not result.ok:
                    if result.numeric:
                        raise NumericMismatch(result.detail)
                    raise InstallError(f"verification failed: {result.detail}")
                events.status(f"verified {spec.name}: {result.detail}", decision.kernel, human=False)
                children.append(result.child)
            for path, name, meta in to_cache:
                _cache_wheel(settings, path, name, meta, decision.kernel, env)
        except BaseException as exc:
            done = tx.rollback()
            detail = str(exc) if isinstance(exc, InstallError) else f"{type(exc).__name__}: {exc}"
            events.status("rolled back: " + ("; ".join(done) if done else "nothing had changed"), decision.kernel, human=bool(done))
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise (type(exc) if isinstance(exc, InstallError) else InstallError)(detail) from None
        tx.commit()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    importlib.invalidate_caches()
    changed = {n: v for n, v in after.items() if real_before.get(n) != v}   # commit() leaves site-packages alone
    return InstallResult(decision.kernel, changed, time.monotonic() - start, installer,
                         _restart_advised(changed, now[0]), scan=now,
                         **({"checked": REMEMBERED} if children and not any(children) else {}))


def _versions(found: dict) -> dict:
    return {name: dist.version for name, dist in found.items()}


def build_to_cache(decision, *, settings, env, pins, state_dir: str) -> list:
    """`fastpath-hooks build`: the decision's dependencies installed (a transaction, as always),
    then its source builds run into the wheel cache - not installed here, and so not verified:
    every environment that installs one checks it in a child process. Returns the cached paths.
    Call with the environment lock held."""
    deps = tuple(s for s in decision.steps if s.kind != StepKind.BUILD)
    if deps:
        run_steps(dataclasses.replace(decision, steps=deps, target={}), settings=settings, env=env, pins=pins,
                  state_dir=state_dir)
    work = os.path.join(state_dir, WORK_PREFIX + uuid.uuid4().hex[:12])  # a killed run's is removed by recover()
    os.makedirs(work)
    scratch = (("TMPDIR", work), ("TEMP", work), ("TMP", work))
    out = []
    try:
        for step in decision.steps:
            if step.kind != StepKind.BUILD:
                continue
            _, path, (_, name, meta) = _build_step(step, settings=settings, env=env, pins=pins, work=work,
                                                   kernel=decision.kernel, scratch=scratch)
            try:
                out.append(wheelcache.store(cache_root(settings), path, meta=meta, filename=name))
            except Exception as exc:
                raise InstallError(f"could not keep {name} in the wheel cache "
                                   f"{wheelcache.directory(cache_root(settings))}: {exc}") from None
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
                raise InstallError(f"resolved to {first} {have} + {second} {companion}, a broken pair ({broken.effect})")


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


def index_wheel(step, later, *, settings, env, work, kernel) -> str | None:
    """The index step's wheel, downloaded and checked (act/fetch.py); None when the index has none
    that fits (or a bad one: refused, said in one line) and a later step of the same distribution -
    the next index, the source build - takes over; InstallError when none does."""
    try:
        return fetch_from_index(step, settings, env, work)
    except IndexMiss as exc:
        fallback = next((s for s in later if s.kind in (StepKind.INDEX, StepKind.BUILD)
                         and set(s.names) & set(step.names)), None)
        if fallback is None:
            raise InstallError(str(exc)) from None
        then = "building from source instead" if fallback.kind == StepKind.BUILD else "trying the next index"
        events.debug(f"{kernel}: {exc}", kernel)
        events.warning(f"{kernel}: {exc.short}; {then}", kernel)
        return None


def _build_step(step, *, settings, env, pins, work, kernel, scratch, started=None, share=None, expected=None,
                together=()):
    """Run a build step: (the step that installs the built wheel, its path, its cache entry)."""
    try:
        built = run_build(step, settings=settings, env=env, pins=pins, work=work, kernel=kernel, scratch=scratch,
                          started=started, share=share, expected=expected, together=together)
    except BuildError as exc:
        raise InstallError(str(exc)) from None
    name = os.path.basename(built.path)
    install = dataclasses.replace(step, kind=StepKind.WHEEL, requirements=(name,), binary_only=True, build_isolation=True,
                                  env=(), url=None, sha256=None, archs=(), cxx_std=None)
    meta = {"origin": "built", "key": thaw(built.key), "log": built.log, "build_seconds": round(built.seconds, 1),
            "distribution": built.key["distribution"], "version": built.key["version"], "build": thaw(built.record)}
    return install, built.path, (built.path, name, meta)


def _cache_wheel(settings, path: str, name: str, meta: dict, kernel: str, env) -> None:
    """Keep a built or downloaded wheel in the wheel cache; a cache that cannot be written costs
    only the next environment's build (said at warning)."""
    root = cache_root(settings)
    meta = dict(meta)

    meta.setdefault("distribution", wheel_distribution(name))
    meta.setdefault("key", {"torch": env.torch, "cuda": env.torch_cuda, "python": env.python, "platform": env.platform})
    try:
        cached = wheelcache.store(root, path, meta=meta, filename=name)
    except Exception as exc:  # OSError, a lock timeout: the install stands
        events.warning(fitted(f"{kernel}: could not keep its wheel in the wheel cache: ", exc, "the install stands"),
                       kernel, detail=f"{kernel}: could not keep {name} in the wheel cache {wheelcache.directory(root)} "
                                      f"({exc})")
        return
    events.status(f"{kernel}: kept the wheel in {shown_path(wheelcache.directory(root))}: environments here with this "
                  "cache install it without building", kernel, human=meta.get("origin") == "built",
                  detail=f"{kernel}: kept {name} in the wheel cache ({cached}); environments on this machine with the "
                         "same FASTPATH_HOOKS_CACHE_DIR install it without building")


def _run_step(step, *, installer, settings, env, cfile, local, kernel, work, scratch=(), started=None,
              local_files=()) -> str:
    """Run one step; in auto mode a failing uv step is retried with pip. Returns the installer used."""
    inv = invocation(step, installer=installer, settings=settings, uv=uv_executable(env),
                     constraints_file=cfile, local_file=local, local_files=local_files)
    label = _step_label(step)
    ran = execute(inv, settings.timeout, kernel, label, work=work, extra_env=scratch, started=started)
    code, tail, seconds = ran.code, ran.tail, ran.seconds
    if code == 0:
        events.status(f"{label}: done in {seconds:.1f} s ({installer})", kernel, human=False)
        return installer
    if code is None:
        raise InstallError(f"{label} did not finish within {settings.timeout:.0f} s (FASTPATH_HOOKS_TIMEOUT)")
    if installer == "uv" and settings.installer == "auto":
        # e.g. an LZMA-compressed wheel (gpu-wheelhouse.sh packs big ones that way), which uv rejects
        events.status(f"uv failed ({tail}); retrying with pip", kernel)
        return _run_step(step, installer="pip", settings=settings, env=env, cfile=cfile, local=local, kernel=kernel,
                         work=work, scratch=scratch, started=started, local_files=local_files)
    hint = ""
    if code == 127 and installer == "uv":
        hint = " (install uv, or set FASTPATH_HOOKS_INSTALLER=pip or auto)"
    raise InstallError(f"{label} failed ({installer} exit {code}): {tail}{hint}")


def _step_label(step) -> str:
    """`installing einops, packaging` (versions and flags are in the debug `running:` line)."""
    if step.kind == StepKind.WHEEL:
        return f"installing {', '.join(step.requirements)}"
    names = ", ".join(step.names)
    return f"{'building' if step.kind == StepKind.BUILD else 'installing'} {names}"


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
            from ..facts.distributions import record_files

            for path in record_files(dist):
                rel = os.path.relpath(path, dist.site)
                if not rel.startswith("..") and not rel.endswith((".dist-info", ".pth")):
                    top = rel.split(os.sep, 1)[0]
                    if not top.endswith(".dist-info"):
                        tops.add(top[:-3] if top.endswith(".py") else top)
        out.extend(t for t in sorted(tops) if t in sys.modules and t not in out)
    return tuple(out)
