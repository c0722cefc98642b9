"""Training step of a tiny Granite-4.0-H (granitemoehybrid): transformers' torch path vs mamba-ssm through fastpath-hooks.

    python benchmarks/mamba_hybrid.py --out benchmarks/results/mamba-h200.json      # on a GPU
    python benchmarks/mamba_hybrid.py --device cpu --tiny                           # checks the script

Model: random-init granitemoehybrid shaped like Granite-4.0-H-Micro cut to 4 layers: bf16,
hidden 2048, layers [mamba2, mamba2, mamba2, attention]; Mamba-2 mixers with expand 2
(intermediate 4096), 64 heads of 64, d_state 128, n_groups 1, conv 4, chunk 256; attention
16 heads / 4 KV heads, no position embedding (NoPE, as Granite-4.0-H); a dense SwiGLU MLP of
8192 in every layer (num_local_experts 0: no MoE, so the figure is the mixers' and not a
router's); vocab 32000; batch 1. n_groups stays 1: transformers <= 5.17's torch path normalises
the gated RMSNorm over the whole width while the kernel groups it, so with n_groups > 1 the two
paths would compute different models.

One step = forward + loss + backward + AdamW step (model.train(), use_cache=False: the
training branch of the mixer, where the fused `mamba_split_conv1d_scan_combined` runs when
mamba-ssm is there and the chunked torch scan when it is not). Median of --steps timed steps
after --warmup steps, CUDA-synchronised; peak memory is torch.cuda.max_memory_allocated over
all steps (weights, AdamW state and activations). An out-of-memory step is a result, recorded
as such.

Each (mode, sequence length) runs in its own process, with the same seed, so both modes
start from the same weights and tokens (the first-step losses differ only by the kernels):
- torch: fla, causal_conv1d and mamba_ssm are made unimportable in that process (the
  benchmark's meta-path blocker, installed before transformers) and FASTPATH_HOOKS_DISABLE=1;
- fastpath: `import fastpath_hooks; fastpath_hooks.install()` before the modeling import
  (FASTPATH_HOOKS_FIND_LINKS / OFFLINE / CACHE_DIR as the caller set them).
Every kernel-decorated global of the modeling module is reported with what it resolved to;
in fastpath mode, a mamba_ssm or causal_conv1d global left on its torch function is reported
loudly and the run exits non-zero (the speedup would mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_speedup import _Blocker  # noqa: E402 - the torch-path blocker of the fla benchmarks

KERNEL_PACKAGES = ("mamba_ssm", "causal_conv1d")
BLOCKED = ("fla", "causal_conv1d", "mamba_ssm", "selective_scan_cuda", "causal_conv1d_cuda")
TINY = {"hidden": 128, "vocab": 512, "seqs": "256", "steps": 2, "warmup": 1, "mlp": 256, "d_state": 16, "chunk": 64,
        "head_dim": 32}


class _MambaBlocker(_Blocker):
    """Benchmark-only: also mamba-ssm and the compiled extension modules, for the torch-path measurement."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{name} blocked for the torch-path measurement", name=name)
        return super().find_spec(name, path, target)


def resolved(model) -> dict:
    """What every kernel-decorated global of the model's modeling module resolved to.

    Found by shape, not by name (the names differ between transformers releases): a global whose
    `__wrapped__` chain holds the closure of `use_kernel_func_from_hub_with_fallback` (nonlocals
    `implementation` and `torch_function`).
    """
    import inspect

    module = sys.modules[type(model).__module__]
    out = {}
    for name, fn in sorted(vars(module).items()):
        if getattr(fn, "__code__", None) is None and callable(getattr(type(fn), "forward", None)):
            fn = inspect.getclosurevars(type(fn).forward).nonlocals.get("func", fn)   # HF kernels' Func (5.25)
        f, seen = fn, 0
        while callable(f) and seen < 5:
            try:
                nl = inspect.getclosurevars(f).nonlocals
            except (TypeError, ValueError):
                nl = {}
            if "implementation" in nl and "torch_function" in nl:
                impl = nl["implementation"]
                out[name] = {"package": nl.get("package"),
                             "impl": f"{getattr(impl, '__module__', '?')}.{getattr(impl, '__qualname__', '?')}",
                             "kernel": impl is not nl["torch_function"]}
                break
            f, seen = getattr(f, "__wrapped__", None), seen + 1
    return out


def unresolved_kernels(res: dict) -> list:
    """The mamba/conv globals that stayed on their torch function (fastpath mode must have none)."""
    return sorted(n for n, r in res.items()
                  if (r["package"] in KERNEL_PACKAGES or r["package"] is None) and not r["kernel"])


def build_config(args):
    from transformers import AutoConfig

    h = args.hidden
    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(args.layers)]
    return AutoConfig.for_model(
        "granitemoehybrid", vocab_size=args.vocab, hidden_size=h, num_hidden_layers=args.layers, layer_types=layer_types,
        num_attention_heads=max(h // 128, 1), num_key_value_heads=max(h // 512, 1), shared_intermediate_size=args.mlp,
        intermediate_size=args.mlp, num_local_experts=0, position_embedding_type=None,
        mamba_expand=2, mamba_d_head=args.head_dim, mamba_n_heads=2 * h // args.head_dim, mamba_d_state=args.d_state,
        mamba_n_groups=1, mamba_d_conv=4, mamba_chunk_size=args.chunk, use_cache=False, tie_word_embeddings=False)


def child(args) -> dict:
    events = []
    t0 = time.perf_counter()
    if args.child == "torch":
        sys.meta_path.insert(0, _MambaBlocker())
    else:
        import fastpath_hooks

        fastpath_hooks.install(on_event=events.append)
    import torch
    from transformers import AutoModelForCausalLM

    cfg = build_config(args)
    cuda = args.device == "cuda"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")  # fp32 on CPU: the same weights in both modes
    model = model.to(args.device, torch.bfloat16 if cuda else torch.float32).train()
    setup_s = time.perf_counter() - t0
    res = resolved(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cpu").manual_seed(1234)
    ids = torch.randint(0, args.vocab, (1, args.seq), generator=gen).to(args.device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times, losses, first_step_s, error = [], [], None, None
    for i in range(args.warmup + args.steps):
        try:
            sync()
            start = time.perf_counter()
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
        except torch.OutOfMemoryError as exc:
            error = f"out of memory at step {i}: {str(exc).splitlines()[0]}"
            break
        elapsed = time.perf_counter() - start
        losses.append(loss.item())
        del loss
        if i == 0:
            first_step_s = elapsed
        if i >= args.warmup:
            times.append(elapsed)
    out = {
        "path": args.child, "seq": args.seq, "setup_s": setup_s, "first_step_s": first_step_s,
        "median_step_ms": statistics.median(times) * 1e3 if times else None, "step_ms": [t * 1e3 for t in times],
        "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else 0.0,
        "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6, "resolved": res,
        "unresolved_kernels": unresolved_kernels(res) if args.child == "fastpath" else [],
        "events": [e["message"] for e in events if e.get("type") in ("status", "warning", "error")][-20:],
    }
    if error:
        out["oom"] = True
        out["error"] = error
    elif not times:
        out["error"] = "no timed steps (--steps 0?)"
    return out


def versions() -> dict:
    import importlib.metadata as md

    out = {}
    for name in ("torch", "triton", "transformers", "mamba-ssm", "causal-conv1d", "tilelang", "apache-tvm-ffi",
                 "flash-linear-attention", "einops", "fastpath-hooks"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    try:
        import torch

        out["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
        out["cuda"] = torch.version.cuda
    except Exception:
        pass
    out["python"] = sys.version.split()[0]
    return out


CHILD_ARGS = ("steps", "warmup", "hidden", "layers", "vocab", "mlp", "d_state", "chunk", "head_dim", "device")


def run_child(args, mode: str, seq: int) -> dict:
    argv = [sys.executable, os.path.abspath(__file__), "--child", mode, "--seq", str(seq)]
    for name in CHILD_ARGS:
        argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    env = dict(os.environ)
    if mode == "torch":
        env["FASTPATH_HOOKS_DISABLE"] = "1"
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=args.timeout)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return {"path": mode, "seq": seq, "error": f"timed out after {args.timeout:.0f} s",
                "stderr_tail": tail.strip().splitlines()[-15:]}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            result["stderr_tail"] = proc.stderr.strip().splitlines()[-8:]
            return result
    oom = "OutOfMemoryError" in proc.stderr or "out of memory" in proc.stderr
    return {"path": mode, "seq": seq, "error": ("out of memory: " if oom else "") + f"exit {proc.returncode}",
            "oom": oom, "stderr_tail": proc.stderr.strip().splitlines()[-15:]}


def summary(seqs, results) -> list:
    """One row per sequence length: both modes side by side, and the speedup where both ran."""
    table = []
    for seq in seqs:
        row = {"seq": seq}
        for key in ("torch", "fastpath"):
            r = next((r for r in results if r["seq"] == seq and r["path"] == key), None)
            if r is not None:
                row.update({f"{key}_ms": r.get("median_step_ms"), f"{key}_peak_gb": r.get("peak_mem_gb"),
                            f"{key}_first_loss": r.get("first_loss"), f"{key}_error": r.get("error")})
                if key == "fastpath":
                    row["fastpath_on_kernels"] = not r.get("unresolved_kernels")
        if row.get("torch_ms") and row.get("fastpath_ms") and row.get("fastpath_on_kernels"):
            row["speedup"] = row["torch_ms"] / row["fastpath_ms"]
        table.append(row)
    return table


def write_json(args, modes, table, results, bad) -> None:
    data = {"date": time.strftime("%Y-%m-%d"), "versions": versions(), "args": vars(args), "table": table,
            "kernels_resolved": not bad if "fastpath" in modes else None, "results": results}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(data, fh, indent=2)


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", choices=("torch", "fastpath"), help=argparse.SUPPRESS)
    p.add_argument("--seq", type=int, default=4096, help=argparse.SUPPRESS)
    p.add_argument("--seqs", help="sequence lengths, comma-separated (default 4096,16384)")
    p.add_argument("--modes", default="torch,fastpath", help="torch, fastpath or both (default both)")
    p.add_argument("--steps", type=int, help="timed steps (default 10)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default 3)")
    p.add_argument("--hidden", type=int, help="hidden size (default 2048)")
    p.add_argument("--layers", type=int, default=4, help="layers; every 4th is attention (default 4)")
    p.add_argument("--vocab", type=int, help="vocabulary (default 32000)")
    p.add_argument("--mlp", type=int, help="dense MLP width (default 4 x hidden)")
    p.add_argument("--d-state", dest="d_state", type=int, help="Mamba-2 state size (default 128)")
    p.add_argument("--chunk", type=int, help="Mamba-2 chunk size (default 256)")
    p.add_argument("--head-dim", dest="head_dim", type=int, help="Mamba-2 head dim (default 64)")
    p.add_argument("--device", default="cuda", help="cuda (the measurement); cpu only checks the script")
    p.add_argument("--tiny", action="store_true", help="tiny dimensions and a few steps (a smoke test, e.g. on CPU)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per child process")
    p.add_argument("--out", help="write all results as JSON here")
    args = p.parse_args()
    defaults = dict(TINY) if args.tiny else {"hidden": 2048, "vocab": 32000, "seqs": "4096,16384", "steps": 10,
                                             "warmup": 3, "d_state": 128, "chunk": 256, "head_dim": 64}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.mlp is None:
        args.mlp = 4 * args.hidden
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0

    seqs = [int(s) for s in args.seqs.split(",")]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not set(modes) <= {"torch", "fastpath"}:
        p.error(f"--modes: {args.modes!r}: use torch, fastpath or torch,fastpath")
    results, bad = [], []
    for seq in seqs:
        for mode in modes:
            r = run_child(args, mode, seq)
            results.append(r)
            if r.get("median_step_ms") is None:
                print(f"{mode:>8} seq {seq:>6}: FAILED {r.get('error')}\n  " + "\n  ".join(r.get("stderr_tail", [])),
                      flush=True)
            else:
                print(f"{mode:>8} seq {seq:>6}: median {r['median_step_ms']:9.1f} ms  peak {r['peak_mem_gb']:6.1f} GB  "
                      f"first loss {r['first_loss']:.4f}  (first step {r['first_step_s']:.1f} s, "
                      f"{r['params_m']:.0f}M params)", flush=True)
            if r.get("unresolved_kernels"):
                bad.append(r)
                print("!" * 100 + f"\n!! fastpath seq {seq}: NOT ON THE KERNELS: {', '.join(r['unresolved_kernels'])} "
                      "stayed on transformers' torch functions - this run measured the torch path, its figures "
                      "mean nothing\n" + "!" * 100, flush=True)
            if args.out:  # after every child: a call cut short keeps what it measured
                write_json(args, modes, summary(seqs, results), results, bad)
    table = summary(seqs, results)
    print("\n| seq | torch path (ms) | fastpath-hooks (ms) | speedup | peak mem torch / fast (GB) | first loss torch / fast |")
    print("|---|---|---|---|---|---|")
    for row in table:
        tms = _fmt(row.get("torch_ms"), ".1f") if not row.get("torch_error") else row["torch_error"][:40]
        fms = _fmt(row.get("fastpath_ms"), ".1f") if not row.get("fastpath_error") else row["fastpath_error"][:40]
        sp = f"{row['speedup']:.1f}x" if "speedup" in row else "-"
        if row.get("fastpath_on_kernels") is False:
            sp = "NONE: fastpath not on the kernels"
        print(f"| {row['seq']} | {tms} | {fms} | {sp} | {_fmt(row.get('torch_peak_gb'), '.1f')} / "
              f"{_fmt(row.get('fastpath_peak_gb'), '.1f')} | {_fmt(row.get('torch_first_loss'), '.4f')} / "
              f"{_fmt(row.get('fastpath_first_loss'), '.4f')} |")
    for r in results:
        if r.get("resolved"):
            print(f"\n{r['path']} seq {r['seq']} resolved:")
            for name, info in r["resolved"].items():
                print(f"  {name} ({info['package']}) -> {info['impl']}{'' if info['kernel'] else '  [torch]'}")
    if args.out:
        print(f"\nwrote {args.out}")
    if bad:
        return 2
    return 0 if any(r.get("median_step_ms") is not None for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
