"""Helpers for the guarded-installer tests: environments, 'untouched' checks, the asking process.

The tests drive fastpath-hooks only through its public surfaces (the CLI in a
venv, `fastpath_hooks.install()` + an import in a script) and pose as a GPU
machine only through FASTPATH_HOOKS_TARGET.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import zipfile

from . import venvs

KERNEL_DISTS = ("fla-core", "flash-linear-attention", "tilelang", "apache-tvm-ffi", "causal-conv1d")
# What a test may leave behind: the kernels, fla's deps a test may add, and the strangers some tests offer.
RESET_DISTS = KERNEL_DISTS + ("einops", "evilpkg")


def uv_dir(base: str) -> str:
    """A directory holding only a `uv` link, to put uv on PATH without the dev venv's python."""
    path = os.path.join(base, "uv-bin")
    os.makedirs(path, exist_ok=True)
    link = os.path.join(path, "uv")
    if not os.path.lexists(link):
        os.symlink(venvs.uv(), link)
    return path


def capturing_uv(base: str, captured: str) -> str:
    """A directory holding a `uv` in front of the real one that keeps a copy of every constraints file
    it is passed (`captured/<pid>.txt`): the files a real install wrote, for `plan` to be compared with."""
    path = os.path.join(base, "capturing-uv")
    os.makedirs(path, exist_ok=True)
    os.makedirs(captured, exist_ok=True)
    exe = os.path.join(path, "uv")
    with open(exe, "w") as fh:
        fh.write('#!/bin/sh\nprev=""\nfor a in "$@"; do\n'
                 f'  if [ "$prev" = "--constraints" ]; then cp "$a" "{captured}/$$.txt"; fi\n'
                 '  prev="$a"\ndone\n'
                 f'exec "{venvs.uv()}" "$@"\n')
    os.chmod(exe, 0o755)
    return path


def without_uv_path() -> str:
    """PATH without any directory that holds a uv executable (so auto mode really means pip)."""
    keep = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and not os.path.exists(os.path.join(p, "uv"))]
    return os.pathsep.join(keep)


def kernel_env(*, target: str, cache_dir: str, wheelhouse: str | None = None, offline: bool = True,
               installer: str | None = None, pins: str | None = None, uv: str | None = None, **extra) -> dict:
    """The environment of a process posing as `target`. `uv`: a directory put first on PATH
    (see `uv_dir`); without it, PATH holds no uv, so `auto` means pip."""
    env = venvs.clean_env(FASTPATH_HOOKS_TARGET=target, FASTPATH_HOOKS_CACHE_DIR=cache_dir)
    env["PATH"] = (uv + os.pathsep if uv else "") + without_uv_path()
    # Let these processes write bytecode (as on most machines; this one sets PYTHONDONTWRITEBYTECODE=1):
    # torch and transformers are then compiled once per venv, not in every process that imports them.
    # The caches are not in any RECORD, so the protected-file checks do not see them.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update({k: str(v) for k, v in extra.items()})
    if wheelhouse:
        env["FASTPATH_HOOKS_FIND_LINKS"] = wheelhouse
    if offline:
        env["FASTPATH_HOOKS_OFFLINE"] = "1"
    if installer:
        env["FASTPATH_HOOKS_INSTALLER"] = installer
    if pins:
        env["FASTPATH_HOOKS_PINS"] = pins
    return env


def stat_state(venv, names=venvs.PROTECTED) -> dict:
    """name -> [version, digest of (path, size, mtime, inode) of every RECORD file].

    Cheap enough for every test (content hashes of torch take seconds): an installer that
    rewrites or replaces a file changes its inode or mtime. Content hashes
    (`Venv.file_hashes`) are compared at the start and end of each module."""
    out = {}
    for dist in importlib.metadata.distributions(path=[venv.site]):
        name = dist.metadata["Name"].lower().replace("_", "-")
        if name not in names:
            continue
        h = hashlib.sha256()
        for f in sorted(dist.files or [], key=str):
            try:
                st = os.stat(f.locate())
                h.update(f"{f}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}\n".encode())
            except OSError:
                h.update(f"{f}|missing\n".encode())
        out[name] = [dist.version, h.hexdigest()]
    return out


def site_entries(venv, prefixes=("fla", "tilelang", "tvm_ffi", "apache_tvm_ffi", "causal_conv1d", "~")) -> list:
    """Top-level site-packages entries that belong to the kernels (or are an installer's stash)."""
    return sorted(e for e in os.listdir(venv.site) if e.startswith(prefixes))


def reset_kernels(venv) -> None:
    """Back to the venv as made: no kernel distributions, no state of an earlier test."""
    subprocess.run([venvs.uv(), "pip", "uninstall", "-q", "--python", venv.python, *RESET_DISTS],
                   check=True, env=venvs.clean_env(), capture_output=True, text=True)
    shutil.rmtree(os.path.join(venv.site, ".fastpath-hooks"), ignore_errors=True)
    leftovers = site_entries(venv)
    assert not leftovers, f"reset left {leftovers}"


def kernel_versions(venv) -> dict:
    versions = venv.versions()
    return {k: versions[k] for k in KERNEL_DISTS if k in versions}


def lzma_copy(wheel: str) -> str:
    """Re-pack `wheel` in place with LZMA compression (as gpu-wheelhouse.sh packs big wheels); uv rejects those."""
    tmp = wheel + ".tmp"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_LZMA) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    os.replace(tmp, wheel)
    return wheel


# The asking process: a user script that turns fastpath-hooks on and imports fla (era C of
# transformers does exactly this import when a modeling module is imported), optionally
# building a tiny Qwen3.5 afterwards.
ASKING_SCRIPT = r'''
import json, os, sys
events = []
import fastpath_hooks
fastpath_hooks.install(on_event=events.append)

def runs():
    return sum(1 for e in events if e["message"].startswith("running:"))

def try_import(name):
    try:
        mod = __import__(name)
        return "ok " + str(getattr(mod, "__version__", ""))
    except ImportError as exc:
        return type(exc).__name__ + ": " + str(exc)

out = {"first": try_import(sys.argv[1])}
out["runs_first"] = runs()
out["second"] = try_import(sys.argv[1])
out["runs_second"] = runs() - out["runs_first"]
out["events"] = [e["message"] for e in events]   # for a failing assert's message
if "--model" in sys.argv:
    import inspect
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.for_model("qwen3_5_text", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               layer_types=["linear_attention", "full_attention"], num_attention_heads=2,
                               num_key_value_heads=1, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=2,
                               linear_key_head_dim=16, linear_value_head_dim=16, vocab_size=128)
    model = AutoModelForCausalLM.from_config(cfg)
    module = sys.modules[type(model.model.layers[0].linear_attn).__module__]
    resolved = {}
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"):
        fn = getattr(module, name)
        if getattr(fn, "__code__", None) is None and callable(getattr(type(fn), "forward", None)):   # HF kernels' Func
            fn = inspect.getclosurevars(type(fn).forward).nonlocals.get("func", fn)
        impl = inspect.getclosurevars(fn).nonlocals.get("implementation", fn) if hasattr(fn, "__wrapped__") else fn
        resolved[name] = impl.__module__
    with torch.no_grad():
        logits = model(torch.randint(0, 128, (1, 8))).logits
    out["resolved"] = resolved
    out["logits_finite"] = bool(torch.isfinite(logits).all())
out["alive"] = True
print("RESULT " + json.dumps(out))
'''


def ask(venv, module: str, env: dict, *, model: bool = False, timeout: float = 600):
    """Run the asking process; returns (result dict or None, CompletedProcess)."""
    args = [module] + (["--model"] if model else [])
    proc = venv.run(ASKING_SCRIPT, env=env, args=args, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):]), proc
    return None, proc
