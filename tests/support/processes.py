"""Helpers for tests that run the user's side as real processes: counting installer
invocations, seeing which subprocesses a decision starts, tiny user scripts.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import time

from . import venvs

# Prepended to a user script: counts every process the interpreter starts from here on
# (subprocess, os.posix_spawn, fork, exec*) - PEP 578 audit hooks see them all.
AUDIT_PRELUDE = r'''
import sys as _sys
SPAWNS = []
def _count_spawns(event, args):
    if event in ("subprocess.Popen", "os.posix_spawn", "os.fork", "os.forkpty", "os.exec", "os.system", "os.spawn"):
        SPAWNS.append(event)
_sys.addaudithook(_count_spawns)
'''

# A tiny Qwen3.5 (2 linear-attention layers + 1 full) - the modeling module transformers
# 5.15+ resolves fla / causal-conv1d in at import time (era C).
TINY_MODEL = r'''
def build_tiny_model():
    import inspect
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(
        "qwen3_5_text", hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        layer_types=["linear_attention", "linear_attention", "full_attention"], num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=2,
        linear_key_head_dim=32, linear_value_head_dim=32, vocab_size=128)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    ids = torch.randint(0, 128, (1, 6))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    module = sys.modules[type(model).__module__]
    kernels = {}
    for name in ("causal_conv1d_fn", "torch_chunk_gated_delta_rule"):
        fn = getattr(module, name)
        if getattr(fn, "__code__", None) is None and callable(getattr(type(fn), "forward", None)):   # HF kernels' Func
            fn = inspect.getclosurevars(type(fn).forward).nonlocals.get("func", fn)
        impl = inspect.getclosurevars(fn).nonlocals.get("implementation", fn) if hasattr(fn, "__wrapped__") else fn
        kernels[name] = impl.__module__
    return {"loss": loss.item(), "kernels": kernels}
'''
TORCH_IMPLEMENTATION = "transformers.models.qwen3_5.modeling_qwen3_5"


def run_env(**extra) -> dict:
    """clean_env() that lets Python write bytecode: every test venv then compiles transformers
    once instead of in every process (PYTHONDONTWRITEBYTECODE is set on some machines)."""
    env = venvs.clean_env(**extra)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def real_uv() -> str:
    return shutil.which("uv") or os.path.join(os.path.dirname(sys.executable), "uv")


def link_uv(venv) -> str:
    """Make uv available in the venv's bin, where fastpath-hooks looks for it first."""
    path = os.path.join(venv.bin, "uv")
    if not os.path.exists(path):
        os.symlink(real_uv(), path)
    return path


def counting_uv(venv, log: str) -> str:
    """Put a `uv` into the venv's bin (where fastpath-hooks looks first) that logs each call
    (parent pid + arguments) to `log` and then runs the real uv."""
    real = real_uv()
    path = os.path.join(venv.bin, "uv")
    with open(path, "w") as fh:
        fh.write(f'#!/bin/sh\necho "$PPID $*" >> "{log}"\nexec "{real}" "$@"\n')
    os.chmod(path, 0o755)
    return path


def installer_calls(log: str) -> list[tuple[int, str]]:
    """[(pid of the process that ran the installer, its arguments)] from a counting_uv log."""
    try:
        with open(log) as fh:
            rows = [line.rstrip("\n").split(" ", 1) for line in fh if line.strip()]
    except FileNotFoundError:
        return []
    return [(int(pid), args) for pid, args in rows]


# Started by start_together(): waits for the `go` file after install(), so all decide at once.
IMPORT_FLA_TOGETHER = r'''
import json, os, sys, time
import fastpath_hooks
fastpath_hooks.install()
open(sys.argv[1] + ".ready", "w").close()
while not os.path.exists(sys.argv[2]):
    time.sleep(0.002)
import fla
from fastpath_hooks import engine
print(json.dumps({"pid": os.getpid(), "version": fla.__version__, "fake": fla.FAKE_FLA,
                  "state": engine.outcomes()["fla"].state}))
'''


def start_together(python: str, script: str, n: int, env: dict, workdir: str, timeout: float = 300) -> list:
    """Run `script` in `n` processes released at the same moment (each signals it is ready,
    then waits for a `go` file); [(pid, stdout, stderr, exit code)]."""
    go = os.path.join(workdir, "go")
    procs = []
    for i in range(n):
        marker = os.path.join(workdir, f"p{i}")
        procs.append(subprocess.Popen([python, "-c", script, marker, go], env=env, cwd=workdir,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + 120
    while len(glob.glob(os.path.join(workdir, "p*.ready"))) < n:
        assert time.monotonic() < deadline, "the processes did not start"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
        time.sleep(0.01)
    open(go, "w").close()
    return [(p.pid, *p.communicate(timeout=timeout), p.returncode) for p in procs]


def closed_port() -> int:
    """A localhost port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def silent_server() -> socket.socket:
    """A localhost 'index' that accepts connections (the kernel completes the handshake from
    the backlog) and never answers a byte. Close it to stop it."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    return s


def processes_with(text: str) -> list:
    """(pid, command line) of every running process whose command line contains `text`."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            out.append((int(pid), cmd))
    return out


def running(pid: int) -> bool:
    """Running (a zombie is done: it can no longer write anything)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return False
    return data[data.rindex(b")") + 2:].split()[0] not in (b"Z", b"X")
