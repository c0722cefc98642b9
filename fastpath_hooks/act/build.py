"""Source builds of compiled kernels: restricted to the GPU archs asked for, fast, logged, keyed.

causal-conv1d's and mamba-ssm's setup.py hard-code a `-gencode` pair per arch nvcc knows and ignore
TORCH_CUDA_ARCH_LIST (an all-arch build outlasts most timeouts): act/compiler_wrapper.py, as torch's
`PYTORCH_NVCC`, keeps the asked archs and speeds the compiles up. `pip wheel --no-cache-dir`: pip's wheel cache is
keyed by the sdist alone. The wheel is relabelled with its key; the figures go to the build history.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import dataclass

from packaging.requirements import Requirement

from .. import events
from .._names import cache_root
from ..events import minutes, shown_path
from ..facts import memory, wheels as cached_wheels
from ..facts.distributions import canonical_name
from ..facts.frozen import FrozenMap, freeze_fields
from ..facts.host import find_hipcc, find_nvcc
from ..facts.wheels import parse_wheel, with_local_label
from . import compiler_wrapper, store
from .compiler_wrapper import MARK as WRAPPER_MARK, SPEED_MARK, STD_MARK, codes as _pair_codes
from .runner import child_environ, kill_group, run
from .transaction import atomic_write


class BuildError(Exception):
    """The build failed; the message names the log file."""


@dataclass(frozen=True)
class Built:
    path: str          # the relabelled wheel, in the work directory
    log: str
    seconds: float
    key: FrozenMap     # what the binary depends on (also in the file name)
    record: FrozenMap = FrozenMap()   # how it was built (facts/memory.py's fields)

    _freezes_itself = True

    def __post_init__(self):
        freeze_fields(self)


def _for(archs) -> str:
    """`for sm_90`, `for every arch`, or no GPU code at all (a Triton-only build)."""
    if tuple(archs) == ("py",):
        return "without its CUDA extension"
    return "for every arch" if tuple(archs) == ("all",) else f"for {', '.join(archs)}"


def log_path(root: str, distribution: str, version: str, archs) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    name = f"{distribution}-{version}-{'+'.join(archs) or 'all'}-{stamp}-{os.getpid()}.log"
    return os.path.join(root, "logs", name)


def write_wrapper(work: str, name: str, *, real, kind: str, keep=None, std: str | None = None, speed=None) -> str:
    """A `/bin/sh` shim running act/compiler_wrapper.py with its config (a `#!python` line breaks on interpreter
    paths with spaces or past the kernel's shebang limit)."""
    config = os.path.join(work, name + ".json")
    with open(config, "w", encoding="utf-8") as fh:
        json.dump({"real": list(real), "kind": kind, "keep": list(keep) if keep is not None else None, "std": std,
                   **(speed.config() if speed is not None else {})}, fh)
    path = os.path.join(work, name)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(f"#!/bin/sh\n# fastpath-hooks' {kind} wrapper for one source build (its config: {config})\n"
                 f"exec {shlex.quote(sys.executable)} {shlex.quote(compiler_wrapper.__file__)} {shlex.quote(config)} "
                 '"$@"\n')
    os.chmod(path, 0o755)
    return path


def build_environ(step, *, env, work: str, jobs: int, split: int = 1, parts=(), helpers: str | None = None) -> tuple:
    """(the build's extra environment, its Speed or None): the pins' variables, the compiler wrappers, MAX_JOBS,
    the `helpers` directory (its installed build needs) first on PYTHONPATH and its scripts and ninja's directory
    first on PATH (torch uses ninja only when on PATH; only its ninja build honours the wrappers). The real
    compilers whatever the target poses: a posed `nvcc=13.0` names a release, not a compiler."""
    extra = dict(step.env)
    path = os.environ.get("PATH", "")
    tools = ([os.path.join(helpers, "bin")] if helpers else []) + _tool_dirs()
    extra["PATH"] = os.pathsep.join([d for d in tools if d not in path.split(os.pathsep)] + [path])
    if helpers:
        extra["PYTHONPATH"] = os.pathsep.join([helpers] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    if "MAX_JOBS" not in os.environ:
        extra["MAX_JOBS"] = str(jobs)
    std = getattr(step, "cxx_std", None)
    restricted = bool(step.archs) and step.archs not in (("all",), ("py",))
    speed = None
    if env.torch_cuda:
        # the facts' own search, the nvcc wheel left out (torch's build does not look there)
        nvcc = env.nvcc if env.nvcc and os.path.isfile(env.nvcc) else find_nvcc({})
        if nvcc is not None:
            extra.setdefault("CUDA_HOME", os.path.dirname(os.path.dirname(nvcc)))
            speed = plan(work, split=split, path_var=extra["PATH"], parts=parts)
            extra.update(launcher_environ(speed, work))
            extra["PYTORCH_NVCC"] = command(extra, write_wrapper(work, "nvcc-restricted", real=[nvcc], kind="nvcc",
                                                                 keep=step.archs if restricted else None, std=std,
                                                                 speed=speed))
    elif env.torch_hip and std:
        hipcc = env.hipcc if env.hipcc and os.path.isfile(env.hipcc) else find_hipcc()
        if hipcc is not None:
            extra["PYTORCH_NVCC"] = command(extra, write_wrapper(work, "hipcc-std", real=[hipcc], kind="hipcc",
                                                                 std=std))
    if std:
        host = shlex.split(os.environ.get("CXX", "")) or ["c++"]   # torch: CXX, else c++
        extra["CXX"] = command(extra, write_wrapper(work, "cxx-std", real=host, kind="cxx", std=std))
    return extra, speed


def command(extra: dict, path: str) -> str:
    """How the build's environment names a wrapper: by its path, or - where the path needs shell quoting (a venv
    under `/tmp/v é/`) - by its name, its directory first on the build's PATH: torch's ninja build puts
    PYTORCH_NVCC into its command lines as given (it may be `ccache nvcc`), setuptools splits CXX at spaces."""
    if shlex.quote(path) == path:
        return path
    extra["PATH"] = os.pathsep.join([os.path.dirname(path), extra["PATH"]])
    return os.path.basename(path)


HELPERS = "helpers"   # the work directory's folder of what the build needs and the environment lacks


def install_helpers(step, *, settings, pins, commands, work: str, kernel: str, log: str, started=None) -> str | None:
    """The step's helpers (the pins' build_deps the environment lacks) installed into `<work>/helpers` - never
    into the environment, so a build, failed or not, leaves it as it was; the directory, or None (none needed).
    BuildError when one is not on the pins' allow-list or cannot be installed (the log has the installer's words)."""
    if not step.helpers:
        return None
    names = [canonical_name(Requirement(r).name) for r in step.helpers]
    refused = [n for n in names if n not in pins.allowed]
    if refused:
        raise BuildError(f"refusing to install {', '.join(refused)} for the build: not on the pins' allow-list")
    target = os.path.join(work, HELPERS)
    with open(log, "w", encoding="utf-8") as fh:
        fh.write(f"# what the build needs and the environment lacks, into {target} (never the environment)\n")
    ran = run(commands.helpers_argv(step, target), timeout=settings.timeout, environ=child_environ(), kernel=kernel,
              label=f"installing {', '.join(names)} for the build of {kernel}", work=work, log=log, started=started)
    if not ran.ok:
        why = (f"did not finish within {settings.timeout:.0f} s (FASTPATH_HOOKS_TIMEOUT)" if ran.timed_out
               else f"failed (pip exit {ran.code}): {ran.tail}")
        raise BuildError(f"installing {', '.join(names)} for the build {why}; log: {log}")
    return target


def _tool_dirs() -> list:
    """The interpreter's bin and wherever a `ninja` of its distributions lives (an environment layered over
    another's site-packages sees its ninja package, not its bin directory)."""
    out = [os.path.dirname(sys.executable)]
    for entry in (e for e in sys.path if e.endswith("site-packages")):
        for candidate in (os.path.join(entry, "ninja", "data", "bin"),
                          os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(entry))), "bin")):
            if os.path.isfile(os.path.join(candidate, "ninja")) and candidate not in out:
                out.append(candidate)
    return out


def run_build(step, *, settings, env, pins, commands, work: str, kernel: str, scratch=(), started=None, share=None,
              expected: float | None = None, together=()) -> Built:
    """Build the step's sdist into a wheel labelled with its key; BuildError names the log. `share`: its part
    of the machine when other builds (`together`) run at the same time; `expected`: the estimate in seconds."""
    if kernel not in pins.source_builds:
        raise BuildError(f"{kernel} has no source build in the pins (kernels.{kernel}.source_build)")
    pinned = [s.version for s in Requirement(step.requirements[0]).specifier if s.operator == "=="]
    spec = pins.build(kernel, pinned[0] if pinned else None)
    archs = tuple(step.archs) or ("all",)
    root = cache_root(settings)
    log = log_path(root, spec.distribution, spec.version or "", archs)
    out_dir = os.path.join(work, "built")
    for directory in (os.path.dirname(log), out_dir):
        os.makedirs(directory, exist_ok=True)
    if share is None:
        share = shares([(kernel, spec, expected)], commands)[kernel]
    jobs = int(os.environ.get("MAX_JOBS") or share.jobs)
    helpers = install_helpers(step, settings=settings, pins=pins, commands=commands, work=work, kernel=kernel, log=log,
                              started=started)
    extra, speed = build_environ(step, env=env, work=work, jobs=jobs, split=share.split, helpers=helpers,
                                 parts=[(unit, share.parts) for unit in spec.split_units])
    what = f"{spec.requirement} for {', '.join(archs)}"
    shown = shown_path(log)   # short on the line, still a path the shell expands; whole in the event's detail
    how = f"MAX_JOBS={jobs}" + (f", --split-compile={share.split}" if speed is not None and share.split > 1 else "") + \
        (f", {share.cores} of {env.cpus} cores" if together and env.cpus else "")
    parted = f"; {' '.join(spec.split_units)} in {share.parts} parts" if speed is not None and speed.parts else ""
    events.status(f"{kernel}: building {_for(archs)} ({how}); log: {shown}", kernel,
                  detail=f"{kernel}: building {what} from source ({how}{parted}){_expected(expected)}; log: {log}")
    argv = commands.build_argv(step, out_dir)
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"# fastpath-hooks source build of {what}\n# started: {time.time():.2f}\n# argv: {' '.join(argv)}\n")
        fh.write("".join(f"# env: {k}={v}\n" for k, v in sorted(extra.items()) if k != "PATH"))
    sccache_before = sccache_counts(speed.launcher) if speed is not None else None
    ran = run(argv, timeout=settings.timeout, environ=child_environ(tuple(sorted(extra.items())) + tuple(scratch)),
              kernel=kernel, label=f"building {kernel} for {', '.join(archs)} (log: {shown})", work=work, log=log,
              started=started, expected=expected)
    seconds = ran.seconds
    compiled, info = summary(speed, work, sccache_before) if speed is not None else ("", {})
    if compiled:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"# {SPEED_MARK} {compiled}\n")
        with contextlib.suppress(OSError):   # the records kept beside the log (the work directory goes)
            shutil.copyfile(speed.calls, calls_path(log))
    if ran.code is None:
        raise BuildError(f"the source build of {what} did not finish within {settings.timeout:.0f} s "
                         f"(FASTPATH_HOOKS_TIMEOUT); log: {log}")
    wheels = [n for n in os.listdir(out_dir) if n.endswith(".whl")]
    if ran.code != 0 or len(wheels) != 1:
        first = first_compiler_error(log)
        raise BuildError(f"the source build of {what} failed (pip exit {ran.code})" + (f": {first}" if first else "")
                         + f"; full log: {log}" + ("" if first else f"; {ran.tail}"))
    built = _built_archs(log, archs, env=env, kernel=kernel, spec=spec, wrapped="PYTORCH_NVCC" in extra, shown=shown)
    if step.cxx_std and not any(STD_MARK in line for line in _log_lines(log)):
        events.warning(f"{kernel}: the build never ran the wrapper handing -std={step.cxx_std} last (no ninja on "
                       f"PATH?); it built anyway; log: {shown}", kernel,
                       detail=f"{kernel}: the build never ran the compiler wrapper that hands -std={step.cxx_std} last "
                              f"(no ninja on PATH? torch's other build ignores CXX and PYTORCH_NVCC); it built anyway; "
                              f"log: {log}")
    key = {"distribution": spec.distribution, "version": spec.version, "torch": env.torch, "cuda": env.torch_cuda,
           "hip": env.torch_hip, "python": env.python, "cxx11_abi": commands.abi, "platform": env.platform,
           "archs": list(built), "nvcc": env.nvcc_version, "cxx_std": step.cxx_std}
    lab = cached_wheels.label(torch=env.torch, cuda=env.torch_cuda, hip=env.torch_hip, abi=key["cxx11_abi"],
                              archs=built, variant=step.variant)
    path = relabel(os.path.join(out_dir, wheels[0]), lab, work)
    record = {"distribution": spec.distribution, "version": spec.version, "kernel": kernel, "archs": list(built),
              "n_archs": len(built) if built != ("all",) else commands.codes(spec),
              "cores": share.cores, "cpus": env.cpus, "jobs": jobs, "split": share.split if speed is not None else 1,
              "parts": share.parts if speed is not None and speed.parts else 1,
              "seconds": round(seconds, 1), "nvcc": env.nvcc_version, "launcher": info.get("launcher"),
              "concurrent": sorted(together), "cache": info.get("cache"), "slowest": info.get("slowest")}
    remember_build(root, record)
    events.status(f"{kernel}: built {_for(built)} in {seconds:.0f} s; log: {shown}", kernel,
                  detail=f"{kernel}: built {os.path.basename(path)} in {seconds:.0f} s" +
                         (f" ({compiled})" if compiled else "") + f"; log: {log}")
    return Built(path=path, log=log, seconds=seconds, key=key, record=record)


def build_all(jobs, *, settings, env, pins, commands, work: str, tx) -> dict:
    """`jobs` = [(kernel, step, expected seconds)] built side by side, each in a thread with its own work
    directory and share, its group journalled in `tx`; kernel -> its Built or the exception. Ctrl-C (or anything
    else here) kills every build's group before it propagates."""
    budget = shares([(k, pins.build(k, next(iter(step.exact.values()), None)), expected) for k, step, expected in jobs],
                    commands)
    if len(jobs) > 1:
        longest = max((expected or 0) for _, _, expected in jobs)
        events.status(f"{' and '.join(k for k, _, _ in jobs)}: building from source side by side, about "
                      f"{minutes(longest)} in all (the longest build's estimate; `fastpath-hooks build` or "
                      "examples/Dockerfile does it ahead of time)", jobs[0][0])
    results: dict = {}
    lock = threading.Lock()

    def one(kernel, step, expected):
        own = os.path.join(work, "build-" + kernel)
        os.makedirs(own, exist_ok=True)
        mine: list = []

        def started(pgid):
            with lock:
                if pgid is not None:
                    mine.append(pgid)
                    tx.record_side_group(pgid, True)
                else:
                    for g in mine:
                        tx.record_side_group(g, False)

        try:
            results[kernel] = run_build(step, settings=settings, env=env, pins=pins, commands=commands, work=own,
                                        kernel=kernel, scratch=(("TMPDIR", own), ("TEMP", own), ("TMP", own)),
                                        started=started, share=budget[kernel], expected=expected,
                                        together=[k for k, _, _ in jobs if k != kernel])
        except Exception as exc:   # noqa: BLE001 - handed to the caller, which says it
            results[kernel] = exc

    threads = [threading.Thread(target=one, args=job, name=f"fastpath-hooks build {job[0]}", daemon=True)
               for job in jobs]
    try:
        with import_lock_released():
            for th in threads:
                th.start()
            for th in threads:
                while th.is_alive():
                    th.join(0.5)
    except BaseException:
        with lock:
            groups = list(tx.groups.values())
        for g in groups:
            kill_group(g)
        for th in threads:
            th.join(15)
        raise
    return results


@contextlib.contextmanager
def import_lock_released():
    """The global import lock let go while the builds run: the import hook decides inside find_spec, which
    CPython calls holding it - a build thread's first import would wait for it while this thread waits."""
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


def shares(builds, commands) -> dict:
    """kernel -> its Share of the machine for `builds` = [(kernel, spec, expected seconds)] side by side."""
    given = os.environ.get("MAX_JOBS")
    return commands.shares(builds, int(given) if given and given.isdigit() and int(given) > 0 else None)


def _expected(seconds) -> str:
    return (f", about {minutes(seconds)} (an estimate; `fastpath-hooks build` or examples/Dockerfile does it ahead "
            "of time)") if seconds else ""


def remember_build(root: str, record: dict) -> None:
    """Append to the build history (the newest KEEP * 2 kept); one not written costs only later estimates."""
    path = memory.builds_path(root)
    entry = dict(record, host=memory.host(), when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def append():
        with open(path, "a+", encoding="utf-8", errors="replace") as fh:
            fh.write(json.dumps(entry, sort_keys=True) + "\n")
            fh.seek(0)
            lines = fh.readlines()
        if len(lines) > memory.KEEP * 4:
            atomic_write(path, lambda out: out.write("".join(lines[-memory.KEEP * 2:])))

    store.locked(path, append)


def _built_archs(log: str, archs: tuple, *, env, kernel: str, spec, wrapped: bool, shown: str = "") -> tuple:
    """The archs the wheel really holds: the codes the wrapper kept (its log lines); `all` where it never ran -
    refused where an arch rule says nvcc's code for a visible GPU is wrong."""
    if not env.torch_cuda or archs in (("all",), ("py",)):
        return archs
    kept = wrapper_codes(log) if wrapped else None
    if kept:
        return tuple(sorted(kept, key=lambda c: cached_wheels.compute_capability(c) or (0, 0)))
    bad = [(g, r) for r in spec.arch_rules for g in env.gpus if r.applies(g, env.nvcc_version)]
    if bad:
        gpu, rule = bad[0]
        raise BuildError(f"the source build of {spec.requirement} never ran the arch-restricting nvcc wrapper, so it "
                         f"holds {gpu} code from nvcc {env.nvcc_version or '(release unknown)'}, which {rule.effect} "
                         f"({rule.id}); not installed; log: {log}")
    events.warning(f"{kernel}: the build never ran the arch-restricting nvcc wrapper (no ninja on PATH?): every "
                   f"arch compiled, the wheel runs (labelled `all`); log: {shown or log}", kernel,
                   detail=f"{kernel}: the build never ran the arch-restricting nvcc wrapper (no ninja on PATH? torch's "
                          "other build ignores PYTORCH_NVCC), so it compiled every arch its setup.py names; the wheel "
                          f"still runs here and is labelled `all`; log: {log}")
    return ("all",)


def _log_lines(log: str) -> list:
    try:
        with open(log, encoding="utf-8", errors="replace") as fh:
            return fh.readlines()
    except OSError:
        return []


def wrapper_codes(log: str) -> set:
    out: set = set()
    for line in _log_lines(log):
        _, found, rest = line.partition(WRAPPER_MARK + " kept ")   # pip -v indents the build's output
        if found:
            out.update(*map(_pair_codes, rest.split(";", 1)[0].split()))
    return out


# gcc/clang `file:12:3: error:` (fatal too), nvcc's `file.cu(42): error:`, `nvcc fatal :`, `c++: error:` -
# not pip's or setuptools' own `error:` lines
_ERROR_LINES = re.compile(r"(\S+:\d+(:\d+)?: (fatal |catastrophic )?error: .*"
                          r"|\S+\(\d+\): (catastrophic )?error: .*"
                          r"|nvcc fatal\s*:.*"
                          r"|(\S*/)?(c\+\+|g\+\+|gcc|cc|clang\+\+|clang|cc1plus|hipcc|nvcc): (fatal )?error: .*)")


def first_compiler_error(log: str) -> str | None:
    text = next((m.group(0).strip() for m in map(_ERROR_LINES.search, map(str.strip, _log_lines(log))) if m), None)
    return text if text is None or len(text) <= 240 else text[:237] + "..."


def relabel(wheel: str, local: str, dest: str) -> str:
    """A copy of `wheel` with the local label `local` (name, dist-info, METADATA and RECORD agree)."""
    new_name = with_local_label(os.path.basename(wheel), local)
    new_version = str(parse_wheel(new_name).version)
    target = os.path.join(dest, new_name)
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as zout:
        infos = zin.infolist()
        old_info = next(i.filename.split("/", 1)[0] for i in infos if i.filename.endswith(".dist-info/METADATA"))
        new_info = f"{old_info.split('-', 1)[0]}-{new_version}.dist-info"
        record = []
        for info in infos:
            name = info.filename
            if name.split("/", 1)[0] == old_info:
                name = new_info + name[len(old_info):]
            if name == f"{new_info}/RECORD":
                continue
            data = zin.read(info)
            if name == f"{new_info}/METADATA":
                data = "\n".join(f"Version: {new_version}" if ln.startswith("Version:") else ln
                                 for ln in data.decode("utf-8").split("\n")).encode("utf-8")
            out = zipfile.ZipInfo(name, date_time=info.date_time)
            out.external_attr, out.compress_type = info.external_attr, zipfile.ZIP_DEFLATED
            zout.writestr(out, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        zout.writestr(f"{new_info}/RECORD", "\n".join(record + [f"{new_info}/RECORD,,"]) + "\n")
    return target


CALLS = "nvcc-calls.jsonl"
CCACHE_STATS = "ccache-stats.log"


@dataclass(frozen=True)
class Speed:
    """What the wrapper of one build does for speed."""
    split: int               # threads per compile (1: none)
    launcher: str | None     # the compiler cache (None: none found)
    calls: str               # where each compile is recorded
    parts: tuple = ()        # (file name, N): compiled as N parts side by side (pins `parallel.split_units`)

    def config(self) -> dict:
        return {"split": self.split, "launcher": self.launcher, "calls": self.calls, "parts": dict(self.parts)}


def plan(work: str, *, split: int, path_var: str | None = None, parts=()) -> Speed:
    """The speed part of one build's nvcc wrapper: ccache, else sccache, on the build's PATH."""
    found = (shutil.which(name, path=path_var) for name in ("ccache", "sccache"))
    return Speed(split=max(1, int(split)), launcher=next((f for f in found if f), None),
                 calls=os.path.join(work, CALLS),
                 parts=tuple((name, int(n)) for name, n in parts if int(n) > 1))


def launcher_environ(speed: Speed, work: str) -> dict:
    """ccache's stats log, and paths made relative to the scratch directory pip unpacks the sdist in anew."""
    if speed.launcher is None or os.path.basename(speed.launcher) != "ccache":
        return {}
    return {"CCACHE_STATSLOG": os.path.join(work, CCACHE_STATS), "CCACHE_BASEDIR": work}


def sccache_counts(path: str | None) -> dict | None:
    """sccache's hit/miss counters now (`sccache --show-stats --stats-format=json`), or None."""
    if path is None or os.path.basename(path) != "sccache":
        return None
    try:
        out = subprocess.run([path, "--show-stats", "--stats-format=json"], capture_output=True, text=True, timeout=30)
        stats = json.loads(out.stdout).get("stats", {})
    except (OSError, ValueError, subprocess.SubprocessError, AttributeError):
        return None

    def total(key):
        value = stats.get(key)
        if isinstance(value, dict):
            value = value.get("counts", value)
            return sum(v for v in value.values() if isinstance(v, int)) if isinstance(value, dict) else 0
        return value if isinstance(value, int) else 0

    return {"hits": total("cache_hits"), "misses": total("cache_misses")}


def calls(speed: Speed) -> list:
    try:
        return [json.loads(line) for line in _log_lines(speed.calls) if line.strip()]
    except ValueError:
        return []


def calls_path(log: str) -> str:
    return (log[:-len(".log")] if log.endswith(".log") else log) + ".nvcc.jsonl"


def ccache_result(work: str) -> dict | None:
    """Hits, misses and uncacheable compiles from this build's ccache stats log, or None."""
    path = os.path.join(work, CCACHE_STATS)
    if not os.path.isfile(path):
        return None
    lines = [ln.strip() for ln in _log_lines(path) if ln.strip() and not ln.startswith("#")]
    hits = sum(1 for ln in lines if ln.endswith("_hit"))
    misses = sum(1 for ln in lines if ln == "cache_miss")
    return {"hits": hits, "misses": misses, "uncacheable": len(lines) - hits - misses}


def summary(speed: Speed, work: str, sccache_before: dict | None = None) -> tuple:
    """(one line for the log and the build's message, a dict for the build record)."""
    done = calls(speed)
    slowest = max(done, key=lambda c: c.get("seconds", 0), default=None)
    info = {"compiles": len(done), "split": speed.split,
            "launcher": os.path.basename(speed.launcher) if speed.launcher else None,
            "slowest": {"source": slowest.get("source"), "seconds": slowest.get("seconds")} if slowest else None}
    cache = ccache_result(work) if info["launcher"] == "ccache" else None
    after = sccache_counts(speed.launcher) if sccache_before is not None else None   # None unless sccache
    if after is not None:
        cache = {k: after[k] - sccache_before.get(k, 0) for k in ("hits", "misses")}
    info["cache"] = cache
    parts = [f"{len(done)} nvcc compile{'s' if len(done) != 1 else ''}",
             f"--split-compile={speed.split}" if speed.split > 1 else "no --split-compile"]
    if slowest:
        parts.append(f"slowest {os.path.basename(str(slowest.get('source')))} {slowest.get('seconds', 0):.0f} s")
    if info["launcher"] is None:
        parts.append("no compiler cache")   # ccache or sccache on the build's PATH would keep the compiles
    elif cache is None:
        parts.append(f"{info['launcher']}: hits unknown")
    else:
        scope = " (server-wide)" if info["launcher"] == "sccache" else ""
        parts.append(f"{info['launcher']}: {cache['hits']} hit{'s' if cache['hits'] != 1 else ''}, "
                     f"{cache['misses']} miss{'es' if cache['misses'] != 1 else ''}{scope}")
    return ", ".join(parts), info
