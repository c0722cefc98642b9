"""The gated-delta-rule check and JIT warm-up of a verification child (the policy decides it:
decide/plan.py, a Decision's `check`).

In the verification child (act/verify.py: one child process for an install's import, numeric and this
check; a bad kernel must not take the caller down, and a JIT can abort it), through the
served kernel's own entry point (`fla.ops.gated_delta_rule.chunk_gated_delta_rule`, as transformers
calls it: q, k [1, T, key heads, K], v [1, T, value heads, V] in bf16, g in float32, beta in bf16,
the q/k l2-norm in the kernel), forward + backward:

1. the check, at `check_seq` tokens: a float32 recurrence on the same (bf16) inputs; the served
   kernel's own path (its backends switched off: FLA_FLASH_QLA=0); for a backend, the same call with
   it switched on - and it must really be the backend that ran (its entry point is counted). A
   backend passes when every output and gradient is within the tolerance of the reference
   (relative RMS error, as fla's tests measure it) or within `slack` times the error of the served
   kernel's own path on the same inputs. The served kernel's own check (fla on Hopper) must finish
   with finite results; its errors are reported.
2. the warm-up: the same call at each of `seqs` (the JIT variants long sequences reach), own path
   and backend, timed. The JIT caches are whatever the child's environment names: the decision's
   `env` sets TRITON_CACHE_DIR / TILELANG_CACHE_DIR under fastpath-hooks' cache where the user set
   neither, for this child and for the training process alike.

The device is CUDA when torch sees one, else the CPU (stand-in kernels in the CPU tests compute there;
the real ones fail their import or first call on a CPU, which is a failed check); on a CPU the
warm-up is left out (nothing is compiled there) unless the check names the device (`device: cpu`).
It runs after the kernel's import and numeric checks (act/numeric.py, pins `numeric_checks`: fla's own
numbers at a tiny shape, remembered per installed files, with its backends switched off) in the same
child, on the same imported kernel: those speak for the kernel's build, this one for a backend against the served
kernel's own path, and it warms the JIT at the model's shapes.
The parent keeps the last warm-up per kernel in <cache>/jit/warm.json for `fastpath-hooks doctor`.
"""

from __future__ import annotations

import json
import os
import time

WARM_FILE = "warm.json"
TENSORS = ("o", "dq", "dk", "dv", "dbeta", "dg")


# -- the parent side ---------------------------------------------------------------------------

def summary(result: dict) -> str:
    """One clause: how far from its limit the check came, and what the warm-up cost."""
    parts = []
    worst = result.get("worst")
    if worst:
        parts.append(f"{worst['tensor']} {worst['error']:.1e} (limit {worst['limit']:.1e}) at T={result['check_seq']}")
    warm = result.get("warm", [])
    if warm:
        seqs = sorted({w["seq"] for w in warm})      # each length once: its variants (a final state or not) too
        parts.append(f"JIT warmed for {', '.join(map(str, seqs))} tokens")
    parts.append(f"{result.get('seconds', 0):.1f} s")
    return ", ".join(parts)


def warm_path(root: str) -> str:
    return os.path.join(root, "jit", WARM_FILE)


def record_warm(root: str, kernel: str, result: dict, environ: dict) -> None:
    """Keep the warm-up of `kernel` under the cache root (what, when, how long, into which cache
    directories); best effort."""
    from .transaction import atomic_write_json

    path = warm_path(root)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    data[kernel] = {"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": result.get("seconds"),
                    "shapes": result.get("shapes"), "seqs": sorted({w["seq"] for w in result.get("warm", [])}),
                    "first_call_s": result.get("first_call_s"), "device": result.get("device"),
                    "dirs": {v: environ.get(v) for v in ("TRITON_CACHE_DIR", "TILELANG_CACHE_DIR") if environ.get(v)}}
    try:
        atomic_write_json(path, data)
    except OSError:
        pass


def warm_records(root: str) -> dict:
    try:
        with open(warm_path(root), encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def cache_listing(directory: str) -> dict:
    """Entries, bytes and the newest change in a JIT cache directory (doctor)."""
    entries, size, newest = 0, 0, None
    try:
        names = os.listdir(directory)
    except OSError:
        return {"directory": directory, "exists": False, "entries": 0, "bytes": 0, "newest": None}
    entries = len(names)
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            size += st.st_size
            newest = st.st_mtime if newest is None else max(newest, st.st_mtime)
    return {"directory": directory, "exists": True, "entries": entries, "bytes": size,
            "newest": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(newest)) if newest else None}


# -- the child side ----------------------------------------------------------------------------

def _reference():
    """The one gated-delta-rule reference (act/numeric_check.py's `gdr_ref`), whether this file was imported
    with the package or loaded by its path in the verification child."""
    import importlib.util
    import sys

    name = "fastpath_hooks_numeric_check"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(os.path.dirname(os.path.abspath(__file__)), "numeric_check.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return module.gdr_ref


def _inputs(torch, shape, seq: int, device: str, seed: int) -> dict:
    hk, hv, dk, dv = shape
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*size):
        return torch.randn(*size, generator=gen, device=device)

    return {"q": rnd(1, seq, hk, dk).bfloat16(), "k": rnd(1, seq, hk, dk).bfloat16(), "v": rnd(1, seq, hv, dv).bfloat16(),
            # as transformers' Qwen3.5 / Qwen3-Next compute them: g = -exp(A_log) * softplus(...) in float32, beta bf16
            "g": -torch.nn.functional.softplus(rnd(1, seq, hv)).float() * 0.5,
            "beta": torch.sigmoid(rnd(1, seq, hv)).bfloat16(), "do": rnd(1, seq, hv, dv).bfloat16()}


def _rel(torch, a, b) -> float:
    a, b = a.float(), b.float()
    if not torch.isfinite(a).all():
        return float("inf")
    base = b.square().mean().sqrt().item()
    return (a - b).square().mean().sqrt().item() / (base if base > 0 else 1.0)


def _child(check: dict) -> dict:
    """The check, then the warm-up; a result dict (`status`: pass / fail, `reason`, the errors, the times)."""
    import torch

    served = check["served"]
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # the served kernel's entry point

    device = check.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    compare = check.get("compare")
    calls = [0]
    if compare:
        import importlib

        module = importlib.import_module(compare["module"])
        original = getattr(module, compare["function"])

        def counted(*args, **kwargs):   # the served kernel looks the function up at each call: this one runs
            calls[0] += 1
            return original(*args, **kwargs)

        setattr(module, compare["function"], counted)

    def path(on: bool) -> None:
        """The served kernel's own path (every backend switched off), or with the backend switched on."""
        for var, off in check["own"].items():
            os.environ[var] = off
        if on:
            os.environ.pop(compare["switch"], None)

    finals = check.get("final_state") or [False]

    def step(x: dict, final: bool = finals[0]) -> tuple:
        leaves = {n: x[n].detach().clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta")}
        sync()
        start = time.perf_counter()
        out = chunk_gated_delta_rule(leaves["q"], leaves["k"], leaves["v"], g=leaves["g"], beta=leaves["beta"],
                                     use_qk_l2norm_in_kernel=True, output_final_state=final)
        out = out[0] if isinstance(out, tuple) else out
        out.backward(x["do"])
        sync()
        return out.detach(), {f"d{n}": t.grad for n, t in leaves.items()}, time.perf_counter() - start

    started = time.perf_counter()
    result = {"device": device, "served": served, "check_seq": check["check_seq"], "shapes": check["shapes"],
              "errors": {}, "first_call_s": {}}
    worst, failed = None, []
    for i, shape in enumerate(check["shapes"]):
        x = _inputs(torch, shape, check["check_seq"], device, 1234 + i)
        leaves = {n: x[n].float().clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta")}
        ref, _ = _reference()(**leaves)
        ref.backward(x["do"].float())
        ref_t = {"o": ref.detach(), **{f"d{n}": t.grad for n, t in leaves.items()}}
        path(False)
        out, grads, seconds = step(x)
        result["first_call_s"][f"own {shape}"] = seconds
        own = {"o": _rel(torch, out, ref_t["o"]), **{n: _rel(torch, grads[n], ref_t[n]) for n in grads}}
        result["errors"][f"{served} {shape}"] = own
        if not all(e < float("inf") for e in own.values()):
            failed.append(f"{served}'s own path gave non-finite {[n for n, e in own.items() if e == float('inf')]}")
        if not compare:
            continue
        before = calls[0]
        path(True)
        try:
            out_b, grads_b, seconds = step(x)
        except Exception as exc:   # its JIT (nvcc), its import: fla does not catch them - here they are the verdict
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return {**result, "status": "fail", "reason": f"{check['kernel']} raised {type(exc).__name__}: {first}"[:400]}
        result["first_call_s"][f"{check['kernel']} {shape}"] = seconds
        if calls[0] == before:
            return {**result, "status": "fail", "reason": f"{served} did not dispatch to {check['kernel']} at "
                    f"K x V = {shape[2]} x {shape[3]} on {device} (its verifier sent the call to its own path)"}
        mine = {"o": _rel(torch, out_b, ref_t["o"]), **{n: _rel(torch, grads_b[n], ref_t[n]) for n in grads_b}}
        result["errors"][f"{check['kernel']} {shape}"] = mine
        for name in TENSORS:
            limit = max(check["tolerances"][name], check["slack"] * own[name])
            if not mine[name] <= limit:
                failed.append(f"{name} {mine[name]:.2e} > {limit:.2e} (fla's own path: {own[name]:.2e})")
            room = mine[name] / limit if limit else float("inf")
            if worst is None or room > worst["room"]:
                worst = {"tensor": name, "error": mine[name], "limit": limit, "room": room}
    if failed:
        return {**result, "status": "fail", "reason": f"at T={check['check_seq']}: " + "; ".join(failed[:3])}
    result["worst"] = worst
    warm = []
    # nothing is compiled for a CPU (stand-in kernels): the warm-up runs on the GPU, or where asked for
    seqs = check["seqs"] if device != "cpu" or check.get("device") == "cpu" else []
    if not seqs and check["seqs"]:
        result["warm_skipped"] = "no JIT on a CPU"
    for seq in seqs:
        for shape in check["shapes"]:
            x = _inputs(torch, shape, seq, device, 99)
            for final in finals:   # transformers' output_final_state: a cache made (use_cache) or not
                row = {"seq": seq, "shape": shape, "final_state": final}
                path(False)
                row["own_s"] = step(x, final)[2]
                if compare:
                    path(True)
                    row["backend_s"] = step(x, final)[2]
                warm.append(row)
            del x
    result["warm"] = warm
    result["seconds"] = time.perf_counter() - started
    result["status"] = "pass"
    return result


def check_here(check: dict) -> dict:
    """The check in this process (the verification child, act/verify.py): its failure - a JIT / nvcc error,
    an import error - is its result."""
    try:
        return _child(check)
    except BaseException as exc:   # noqa: BLE001
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return {"status": "fail", "reason": f"{type(exc).__name__}: {first}"[:400]}
