"""The one device driver: every GPU benchmark case is a few lines of data (CASES); one call runs any set of them in
the background on the GPU machine (no network there), the next calls wait for them and bring the results back.

    python3 benchmarks/device.py facts start wait --cases qwen3_5-cold,qwen3_5-by-hand-cold   # call 1
    python3 benchmarks/device.py wait                                                          # call 2, 3 ...
    python3 benchmarks/device.py list                                                          # the cases
    python3 benchmarks/device.py start wait --cases qwen3_5-cold --work /tmp/d --dry   # a CPU check of the driver

A case runs in a fresh venv over the image's packages (torch, triton, transformers 5.17 there), with the HOME and
fastpath-hooks cache of its `group` (emptied first for a `cold` case: empty Triton / TileLang / CUDA caches), from
the carried wheelhouse (FASTPATH_HOOKS_OFFLINE=1). Kinds:
  step   benchmarks/time_to_step.py: the seconds from a training script's start to the end of its first step, the
         phases on the way (summary.json `phases`), the step time and first loss
  jit    benchmarks/parallel_jit.py: fla's gated-delta-rule check at the model's shapes from empty JIT caches, the
         compiling shared out or not, then a training process reading those caches
  era_d  benchmarks/era_d.py: `from_pretrained(dir, device_map="cuda")` on transformers 5.25 (issue 32's cases)
Carried in (gitignored; made on the CPU machine, see KEEP): .whl-qla/ (the kernels: PYTHON=.venv/bin/python bash
../shared/tools/gpu-wheelhouse.sh .whl-qla fla-core==0.6.0 flash-linear-attention==0.6.0 tilelang==0.1.15
apache-tvm-ffi==0.1.12 z3-solver==4.15.4.0 torch-c-dlpack-ext==0.1.5 sdist:causal-conv1d==1.7.0
sdist:mamba-ssm==2.3.2.post1) and .whl/ (this checkout's fastpath-hooks wheel; for 5.25 cases transformers 5.25.0,
kernels 0.19.1 and what they need, cp312: `pip download --no-deps`). Where one call cannot carry both (64 MiB),
`stash` in one call and `start` in the next: what each call carried is kept in KEEP.
Results (files_at): summary.json, log.txt, cases.tgz - commit them under benchmarks/results/<date>-<what>/.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.environ.get("WORK", "/tmp/device-work")
KEEP = os.environ.get("KEEP", "/tmp/device-carried")
OUT = os.environ.get("OUT", "/tmp/device-out")
BASE = next((p for p in ("/opt/torch/.venv/bin/python3",) if os.path.exists(p)), sys.executable)

QWEN, GRANITE = "qwen3_5", "granitemoehybrid"
KERNEL_WHEELS = ("fla_core-*.whl", "flash_linear_attention-*.whl", "tilelang-*.whl", "apache_tvm_ffi-*.whl",
                 "z3_solver-*.whl", "torch_c_dlpack_ext-*.whl")
T525 = ("transformers-5.25*.whl", "kernels-0.19*.whl", "huggingface_hub-*.whl", "httpx2-*.whl", "httpcore2-*.whl",
        "truststore-*.whl", "tomlkit-*.whl", "click-*.whl", "idna-*.whl", "anyio-*.whl", "h11-*.whl", "hf_xet-*.whl",
        "regex-*.whl", "typing_extensions-*.whl")


def _step(model, group, **kw):
    return {"kind": "step", "model": model, "group": group, "via": "install", "env": "hooks", **kw}


# name -> case; the order here is the order of a run (most important first)
CASES = {
    # issue 39: time to the first training step, tiny models at 4096 tokens, transformers of the image (5.17)
    "qwen3_5-cold": _step(QWEN, QWEN, cold=True),
    "qwen3_5-by-hand-cold": _step(QWEN, "by-hand", cold=True, via="none", env="by-hand"),
    "qwen3_5-later": _step(QWEN, QWEN),
    "qwen3_5-by-hand-later": _step(QWEN, "by-hand", via="none", env="by-hand"),
    "granitemoehybrid-cold": _step(GRANITE, GRANITE, cold=True),
    "granitemoehybrid-later": _step(GRANITE, GRANITE),
    # the parallel JIT: the check from empty caches, shared out over helper processes / compile threads, or not
    "jit-procs7": dict(kind="jit", group="jit-procs7", cold=True, procs=7, threads=0),
    "jit-threads8": dict(kind="jit", group="jit-threads8", cold=True, procs=0, threads=8),
    "jit-serial": dict(kind="jit", group="jit-serial", cold=True, procs=0, threads=0),
    # transformers 5.25: its own torch path and the package (after the cold cases above: caches warm), 4096 / 16384
    **{f"t525-{m}-{via}-{seq}": _step(m, m, via=via, env="hooks-5.25" if via == "install" else "5.25", seq=seq,
                                      steps=5)
       for m in (GRANITE, QWEN) for seq in (4096, 16384) for via in ("none", "install")},
    # issue 32: transformers 5.25 from_pretrained, offline (HF_HUB_OFFLINE=1) or with no network, hub kernels
    **{f"era-d-{via}-{'off' if off else 'on'}-{m}": dict(kind="era_d", model=m, group=m, via=via, env="hooks-5.25",
                                                         offline=off)
       for via, off in (("enable", 0), ("enable", 1), ("install", 0)) for m in (QWEN, GRANITE)},
}


def log(*parts) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *parts, flush=True)


def run(argv, env=None, out=None, timeout=None) -> int:
    with open(out, "a") if out else open(os.devnull, "w") as fh:
        try:
            return subprocess.run([str(a) for a in argv], env=env, stdout=fh, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return 124


def wheels(patterns) -> list:
    found = []
    for pattern in patterns:
        hits = sorted(glob.glob(os.path.join(KEEP, "wh", pattern)))
        if not hits:
            raise SystemExit(f"the wheelhouse {KEEP}/wh lacks {pattern}: carry it (the header says how)")
        found.append(hits[-1])
    return found


def fresh_env(path: str, kind: str, logfile: str) -> float:
    """A venv over the image's packages with what `kind` needs; the seconds its installs took."""
    shutil.rmtree(path, ignore_errors=True)
    if run([BASE, "-m", "venv", "--system-site-packages", "--without-pip", path], out=logfile):
        raise RuntimeError(f"could not make {path}")
    py = os.path.join(path, "bin", "python")
    base_site = subprocess.check_output([BASE, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                        text=True).strip()
    own_site = subprocess.check_output([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                       text=True).strip()
    if base_site != own_site:   # the image's python is itself a venv, which --system-site-packages misses
        with open(os.path.join(own_site, "zz-image-site.pth"), "w") as fh:
            fh.write(base_site + "\n")
    need = {"hooks": ["fastpath_hooks-*.whl"], "by-hand": list(KERNEL_WHEELS), "5.25": list(T525),
            "hooks-5.25": ["fastpath_hooks-*.whl", *T525]}[kind]
    start = time.time()
    if run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", *wheels(need)], out=logfile):
        raise RuntimeError(f"pip could not install {need} into {path}")
    return round(time.time() - start, 2)


def one_case(name: str, case: dict, dry: bool) -> None:
    group = os.path.join(WORK, "groups", case["group"])
    home, cache = os.path.join(group, "home"), os.path.join(group, "cache")
    if case.get("cold"):
        shutil.rmtree(group, ignore_errors=True)
    os.makedirs(home, exist_ok=True)
    os.makedirs(cache, exist_ok=True)
    os.makedirs(os.path.join(WORK, "cases"), exist_ok=True)
    logfile, result = os.path.join(WORK, "cases", f"{name}.log"), os.path.join(WORK, "cases", f"{name}.json")
    venv = os.path.join(WORK, "venvs", name)
    kind = "by-hand" if case["kind"] == "jit" else case["env"]
    setup = {"pip_install_kernels_s" if kind == "by-hand" else "pip_install_env_s": fresh_env(venv, kind, logfile)}
    py = os.path.join(venv, "bin", "python")
    env = {**os.environ, "HOME": home, "FASTPATH_HOOKS_CACHE_DIR": cache, "FASTPATH_HOOKS_FIND_LINKS": f"{KEEP}/wh",
           "FASTPATH_HOOKS_OFFLINE": "1", "FASTPATH_HOOKS_INSTALLER": "pip", "PYTHONUNBUFFERED": "1",
           **case.get("env_vars", {})}
    for var in ("TRITON_CACHE_DIR", "TILELANG_CACHE_DIR"):
        env.pop(var, None)
    if case.get("via") == "none":
        env.update(FASTPATH_HOOKS_DISABLE="1", USE_HUB_KERNELS="0")
    dry_args = ["--device", "cpu", "--tiny", "--seq", "64", "--steps", "2"] if dry else []
    start = time.time()
    if case["kind"] == "step":
        code = run([py, os.path.join(HERE, "time_to_step.py"), "case", "--model", case["model"], "--via",
                    "none" if case.get("via") == "none" else "install", "--name", name, "--setup", json.dumps(setup),
                    "--out", result, *(["--seq", str(case["seq"])] if case.get("seq") and not dry else []),
                    *(["--steps", str(case["steps"])] if case.get("steps") and not dry else []), *dry_args],
                   env={**env, "BENCH_T0": str(time.time())}, out=logfile, timeout=900)
    elif case["kind"] == "jit":
        env = {**env, "TRITON_CACHE_DIR": os.path.join(home, "triton"), "TILELANG_CACHE_DIR": os.path.join(home, "tl")}
        check = os.path.join(WORK, "cases", f"{name}.check.json")
        code = run([py, os.path.join(HERE, "parallel_jit.py"), "check", "--procs", case["procs"], "--threads",
                    case["threads"], "--out", check, *(["--device", "cpu", "--tiny"] if dry else [])],
                   env=env, out=logfile, timeout=900)
        run([py, os.path.join(HERE, "time_to_step.py"), "case", "--model", QWEN, "--via", "none", "--name", name,
             "--setup", json.dumps(setup), "--out", result, *dry_args],
            env={**env, "BENCH_T0": str(time.time()), "FASTPATH_HOOKS_DISABLE": "1"}, out=logfile, timeout=900)
        _merge(result, {"check": _read(check)})
    else:   # era_d: a tiny model saved once, loaded as a user loads it
        models = os.path.join(WORK, "models")
        if not os.path.isdir(os.path.join(models, case["model"])):
            run([py, os.path.join(HERE, "era_d.py"), "save", "--dir", models, *(["--tiny"] if dry else [])],
                env=env, out=logfile)
        if case["via"] == "enable":
            run([os.path.join(venv, "bin", "fastpath-hooks"), "enable"], env=env, out=logfile)
        code = run([py, os.path.join(HERE, "era_d.py"), "case", "--model", os.path.join(models, case["model"]),
                    "--via", case["via"], "--offline", str(case["offline"]), "--out", result,
                    *(["--device", "cpu", "--seq", "64", "--steps", "2"] if dry else [])],
                   env={**env, **({"HF_HUB_OFFLINE": "1"} if case["offline"] else {})}, out=logfile, timeout=900)
        if case["via"] == "enable":
            run([os.path.join(venv, "bin", "fastpath-hooks"), "disable"], env=env, out=logfile)
        _merge(result, {"case": name})
    _merge(result, {"case": name, "exit": code, "outside_s": round(time.time() - start, 2), "spec": case})
    log(f"case {name}: exit {code} in {time.time() - start:.1f} s")


def _read(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _merge(path: str, extra: dict) -> None:
    data = _read(path) or {}
    data.update(extra)
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1)


def summary() -> None:
    files = sorted(glob.glob(os.path.join(WORK, "cases", "*.json")))
    files = [f for f in files if not f.endswith(".check.json")]
    if files:
        run([BASE, os.path.join(HERE, "time_to_step.py"), "summary", *files, "--out", os.path.join(WORK, "summary.json")])


def background(names, dry: bool) -> None:
    with open(os.path.join(WORK, "bg.pid"), "w") as fh:
        fh.write(str(os.getpid()))
    for name in names:
        try:
            one_case(name, CASES[name], dry)
        except Exception as exc:   # the next case still runs
            log(f"case {name}: {type(exc).__name__}: {exc}")
        summary()
    with open(os.path.join(WORK, "bg.done"), "w") as fh:
        fh.write("done\n")


def facts() -> None:
    for argv in (["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"], ["nproc"],
                 [BASE, "-c", "import torch, triton, transformers, sys; print(torch.__version__, triton.__version__, "
                              "transformers.__version__, sys.version.split()[0])"]):
        try:
            log(subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout.strip())
        except (OSError, subprocess.TimeoutExpired) as exc:
            log(f"{argv[0]}: {exc}")


def stash() -> None:
    """What this call carried (.whl-qla, .whl; CARRIED: other folders) and the scripts, kept for the background and
    later calls."""
    os.makedirs(os.path.join(KEEP, "wh"), exist_ok=True)
    folders = os.environ.get("CARRIED", "").split(os.pathsep) if os.environ.get("CARRIED") else \
        [os.path.join(HERE, "..", f) for f in (".whl-qla", ".whl")]
    for folder in folders:
        for path in glob.glob(os.path.join(folder, "*")):
            shutil.copy(path, os.path.join(KEEP, "wh"))
    src = os.path.join(KEEP, "src")
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(os.path.join(HERE, ".."), src, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".whl*", "__pycache__", "results", ".gl"))
    log("carried: " + ", ".join(sorted(os.listdir(os.path.join(KEEP, "wh")))))


def running() -> bool:
    try:
        with open(os.path.join(WORK, "bg.pid")) as fh:
            os.kill(int(fh.read()), 0)
    except (OSError, ValueError):
        return False
    return not os.path.exists(os.path.join(WORK, "bg.done"))


def start(names, dry: bool) -> None:
    if running():
        raise SystemExit("the background is running already: `wait` for it")
    stash()
    for f in ("bg.done", "bg.pid"):
        with_path = os.path.join(WORK, f)
        if os.path.exists(with_path):
            os.remove(with_path)
    os.makedirs(WORK, exist_ok=True)
    with open(os.path.join(WORK, "bg.log"), "a") as out:
        subprocess.Popen([BASE, os.path.join(KEEP, "src", "benchmarks", "device.py"), "_bg", "--cases", ",".join(names),
                          *(["--dry"] if dry else [])], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True, env={**os.environ, "WORK": WORK, "KEEP": KEEP})
    for _ in range(100):   # until it has said its pid (`wait` reads it)
        if os.path.exists(os.path.join(WORK, "bg.pid")):
            break
        time.sleep(0.1)
    log(f"started in the background: {', '.join(names)} (log {WORK}/bg.log)")


def wait(until: float, t0: float) -> None:
    while running() and time.time() - t0 < until:
        time.sleep(10)
        try:
            with open(os.path.join(WORK, "bg.log")) as fh:
                tail = [ln.rstrip() for ln in fh if ln.strip()][-1:]
        except OSError:
            tail = []
        log(f"{time.time() - t0:.0f} s: {tail[0][:160] if tail else ''}")
    os.makedirs(OUT, exist_ok=True)
    for name in ("bg.log", "summary.json"):
        if os.path.exists(os.path.join(WORK, name)):
            shutil.copy(os.path.join(WORK, name), OUT)
    with tarfile.open(os.path.join(OUT, "cases.tgz"), "w:gz") as tar:
        if os.path.isdir(os.path.join(WORK, "cases")):
            tar.add(os.path.join(WORK, "cases"), arcname="cases")
        for path in glob.glob(os.path.join(WORK, "groups", "*", "cache")):   # the package's own records
            tar.add(path, arcname=os.path.relpath(path, WORK),
                    filter=lambda ti: None if ti.name.endswith((".whl", ".so", ".o")) or "/jit/" in ti.name else ti)
    log("background: " + ("done" if os.path.exists(os.path.join(WORK, "bg.done")) else
                          "still running - call `wait` again at once" if running() else "gone without finishing"))


def main(argv=None) -> int:
    t0 = time.time()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("phases", nargs="+", choices=("facts", "stash", "start", "wait", "list", "_bg"))
    p.add_argument("--cases", default=",".join(n for n in CASES if not n.startswith(("jit-", "t525-", "era-d-"))))
    p.add_argument("--until", type=float, default=560, help="seconds into this call to stop waiting")
    p.add_argument("--dry", action="store_true", help="tiny shapes on the CPU: checks the driver")
    args = p.parse_args(argv)
    names = [n for n in args.cases.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown cases: {', '.join(unknown)} (`list` names them)")
    for phase in args.phases:
        if phase == "list":
            for name, case in CASES.items():
                print(name, json.dumps(case))
        elif phase == "facts":
            facts()
        elif phase == "stash":
            stash()
        elif phase == "start":
            start(names, args.dry)
        elif phase == "wait":
            wait(args.until, t0)
        else:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            background(names, args.dry)
    return 0


if __name__ == "__main__":
    sys.exit(main())
