"""Parallel JIT for the check child: Triton compiles one kernel configuration at a time per process, so the
check shares the compiling out. Loaded by path inside the check child (it imports nothing of the package).

Two levers, both ending in the one Triton cache (TRITON_CACHE_DIR) the training process reads:
- threads: before an autotuned kernel is timed, its configurations are compiled side by side through Triton's own
  AsyncCompileMode (Triton >= 3.5; elsewhere nothing changes);
- helper processes: `python check_child.py share '<check>' I K` runs the same pass, compiling only every K-th
  configuration of each autotuned kernel (from the I-th) and taking the first without timing it - they never
  write a tuning result (FLA_CACHE_RESULTS=0), so the check process alone times and chooses. Running ahead of the
  check (no timing), they compile the later kernels (the backward, tilelang's) before it reaches them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

SHARE_ENV = {"FLA_CACHE_RESULTS": "0", "TRITON_CACHE_AUTOTUNING": "0"}   # a helper's choice is never kept


def patch_autotuner(share: tuple | None = None, threads: int = 0) -> bool:
    """Compile an untuned kernel's configurations first: `share` (i, k) only every k-th from the i-th, then run with
    the first of them untimed; else all of them in `threads` threads before Triton times them. False where this
    Triton has no Autotuner to patch (the check then runs as it would)."""
    try:
        from triton.runtime import autotuner
    except Exception:   # noqa: BLE001 - no Triton: nothing to share
        return False
    original = autotuner.Autotuner.run
    if getattr(original, "_fastpath_hooks", False):
        return True
    seen: set = set()

    def run(self, *args, **kwargs):
        if len(self.configs) <= 1:
            return original(self, *args, **kwargs)
        try:
            self.nargs = dict(zip(self.arg_names, args))
            configs = list(self.prune_configs(kwargs))
        except Exception:   # noqa: BLE001 - pruning needs what only Triton's own run sets: leave it to it
            return original(self, *args, **kwargs)
        mine = configs[share[0]::share[1]] if share else configs
        key = (id(self), _signature(args, kwargs))
        if key not in seen:
            seen.add(key)
            _compile(self, args, kwargs, mine, 0 if share else threads)
        if not share or not mine:
            return original(self, *args, **kwargs)
        saved = self.configs
        self.configs = [mine[0]]   # one configuration: Triton runs it untimed, and keeps no tuning result
        try:
            return original(self, *args, **kwargs)
        finally:
            self.configs = saved

    run._fastpath_hooks = True
    autotuner.Autotuner.run = run
    return True


def _signature(args, kwargs) -> tuple:
    """What makes two calls compile alike: shapes and dtypes of tensors, the other values as they are."""
    def one(v):
        shape = getattr(v, "shape", None)
        return (tuple(shape), str(getattr(v, "dtype", ""))) if shape is not None else repr(v)[:64]
    return tuple(one(a) for a in args) + tuple((k, one(v)) for k, v in sorted(kwargs.items()) if k != "grid")


def _compile(tuner, args, kwargs, configs, threads: int) -> None:
    """Compile `configs` without launching them (Triton's warmup), in `threads` threads where Triton can."""
    base = {k: v for k, v in kwargs.items() if k != "warmup"}

    def one(config):
        extra = config.all_kwargs()
        if base.keys() & extra.keys():
            return
        try:
            tuner.fn.run(*args, warmup=True, **base, **extra)
        except Exception:   # noqa: BLE001 - a configuration this GPU cannot run: Triton's timing skips it too
            pass

    mode = None
    if threads > 1:
        try:
            from concurrent.futures import ThreadPoolExecutor

            from triton.runtime._async_compile import AsyncCompileMode
            mode = AsyncCompileMode(ThreadPoolExecutor(threads), ignore_errors=True)
        except Exception:   # noqa: BLE001 - an older Triton: one at a time
            mode = None
    if mode is None:
        for config in configs:
            one(config)
        return
    with mode:
        for config in configs:
            one(config)


def start_helpers(check_json: str, count: int, script: str) -> list:
    """`count` helper processes running `script share <check> i count+1` (i = 1 ... count), their output dropped.
    Each compiles TileLang's kernels (fla's Hopper backward) into a directory of its own, dropped with it: TileLang
    is not known to write its cache safely from several processes - the check compiles its own."""
    procs = []
    for i in range(1, count + 1):
        own = tempfile.mkdtemp(prefix="fastpath-hooks-jit-")
        env = {**os.environ, **SHARE_ENV, "TILELANG_CACHE_DIR": own}
        try:
            proc = subprocess.Popen([sys.executable, script, "share", check_json, str(i), str(count + 1)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    env=env)
        except OSError:
            shutil.rmtree(own, ignore_errors=True)
            break
        proc.own = own
        procs.append(proc)
    return procs


def stop_helpers(procs) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except Exception:   # noqa: BLE001
            pass
        shutil.rmtree(getattr(proc, "own", ""), ignore_errors=True)
