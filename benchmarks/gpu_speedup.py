"""Speed of a tiny Qwen3.5 training step: transformers' torch path vs the path fastpath-hooks sets up.

    python benchmarks/gpu_speedup.py --out benchmarks/results/run.json

Model (as in ../shared/notes/gpu-findings.md): random-init qwen3_5_text, bf16, hidden
2048, intermediate 5632, 4 layers (3 linear_attention + 1 full_attention), 16 heads,
2 KV heads, vocab 32000, batch 1. One step = forward + loss + backward. Median of
--steps timed steps after --warmup steps; peak memory from torch.cuda.

Each (path, sequence length) runs in its own process:
- torch: fla and causal_conv1d are made unimportable in that process (a meta-path
  blocker installed before transformers), so transformers takes its torch path
  whatever is installed;
- fastpath: `import fastpath_hooks; fastpath_hooks.install()` first - the first
  run installs and verifies the kernels (FASTPATH_HOOKS_FIND_LINKS/OFFLINE as set
  by the caller), later ones find them.
Printed: median step time, peak memory, first-step loss of both, the speedup, and
which implementation each decorated kernel function resolved to.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

KERNEL_FUNCTIONS = ("causal_conv1d_fn", "causal_conv1d_update", "torch_chunk_gated_delta_rule",
                    "torch_recurrent_gated_delta_rule")


class _Blocker:
    """Benchmark-only: make the kernel packages unimportable so the torch path is measured."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("fla", "causal_conv1d"):
            raise ModuleNotFoundError(f"{name} blocked for the torch-path measurement", name=name)
        return None


def _resolved(model) -> dict:
    import inspect

    module = sys.modules[type(model).__module__]
    out = {}
    for name in KERNEL_FUNCTIONS:
        fn = getattr(module, name, None)
        if fn is None:
            continue
        if getattr(fn, "__code__", None) is None and callable(getattr(type(fn), "forward", None)):
            fn = inspect.getclosurevars(type(fn).forward).nonlocals.get("func", fn)   # HF kernels' Func (5.25)
        impl = inspect.getclosurevars(fn).nonlocals.get("implementation", fn) if hasattr(fn, "__wrapped__") else fn
        out[name] = f"{getattr(impl, '__module__', '?')}.{getattr(impl, '__qualname__', '?')}"
    return out


def child(args) -> dict:
    events = []
    t0 = time.perf_counter()
    if args.child == "torch":
        sys.meta_path.insert(0, _Blocker())
    else:
        import fastpath_hooks

        fastpath_hooks.install(on_event=events.append)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    layers = args.layers
    cfg = AutoConfig.for_model(
        "qwen3_5_text", hidden_size=args.hidden, intermediate_size=args.intermediate, num_hidden_layers=layers,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        num_attention_heads=16, num_key_value_heads=2, vocab_size=args.vocab)
    torch.manual_seed(0)
    cuda = args.device == "cuda"
    model = AutoModelForCausalLM.from_config(cfg).to(args.device, torch.bfloat16 if cuda else torch.float32)
    setup_s = time.perf_counter() - t0
    resolved = _resolved(model)
    gen = torch.Generator(device=args.device).manual_seed(1234)
    ids = torch.randint(0, args.vocab, (1, args.seq), device=args.device, generator=gen)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    first_step_s = None
    for i in range(args.warmup + args.steps):
        sync()
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        sync()
        elapsed = time.perf_counter() - start
        losses.append(loss.item())
        if i == 0:
            first_step_s = elapsed
        if i >= args.warmup:
            times.append(elapsed)
    return {
        "path": args.child, "seq": args.seq, "median_step_ms": statistics.median(times) * 1e3,
        "step_ms": [t * 1e3 for t in times], "first_step_s": first_step_s, "setup_s": setup_s,
        "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else 0.0, "first_loss": losses[0], "last_loss": losses[-1],
        "resolved": resolved,
        "events": [e["message"] for e in events if e.get("type") in ("status", "warning", "error")][-20:],
    }


def versions() -> dict:
    import importlib.metadata as md

    out = {}
    for name in ("torch", "triton", "transformers", "fla-core", "flash-linear-attention", "tilelang",
                 "apache-tvm-ffi", "causal-conv1d", "fastpath-hooks"):
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


def run_child(args, path: str, seq: int) -> dict:
    argv = [sys.executable, os.path.abspath(__file__), "--child", path, "--seq", str(seq), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--hidden", str(args.hidden), "--intermediate", str(args.intermediate),
            "--layers", str(args.layers), "--vocab", str(args.vocab), "--device", args.device]
    env = dict(os.environ)
    if path == "torch":
        env["FASTPATH_HOOKS_DISABLE"] = "1"
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            result["stderr_tail"] = proc.stderr.strip().splitlines()[-8:]
            return result
    return {"path": path, "seq": seq, "error": f"exit {proc.returncode}", "stderr_tail": proc.stderr.strip().splitlines()[-15:]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", choices=("torch", "fastpath"))
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--seqs", default="4096,16384")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--device", default="cuda", help="cuda (the measurement); cpu only checks the script")
    p.add_argument("--out", help="write all results as JSON here")
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0

    results = []
    for seq in [int(s) for s in args.seqs.split(",")]:
        for path in ("torch", "fastpath"):
            r = run_child(args, path, seq)
            results.append(r)
            if "error" in r:
                print(f"{path} seq {seq}: FAILED {r['error']}\n  " + "\n  ".join(r["stderr_tail"]), flush=True)
            else:
                print(f"{path:>8} seq {seq:>6}: median {r['median_step_ms']:8.1f} ms  peak {r['peak_mem_gb']:5.1f} GB  "
                      f"first loss {r['first_loss']:.4f}  (first step {r['first_step_s']:.1f} s)", flush=True)
    table = []
    for seq in [int(s) for s in args.seqs.split(",")]:
        t = next((r for r in results if r["seq"] == seq and r["path"] == "torch" and "error" not in r), None)
        f = next((r for r in results if r["seq"] == seq and r["path"] == "fastpath" and "error" not in r), None)
        if t and f:
            table.append({"seq": seq, "torch_ms": t["median_step_ms"], "fastpath_ms": f["median_step_ms"],
                          "speedup": t["median_step_ms"] / f["median_step_ms"], "torch_peak_gb": t["peak_mem_gb"],
                          "fastpath_peak_gb": f["peak_mem_gb"], "torch_first_loss": t["first_loss"],
                          "fastpath_first_loss": f["first_loss"]})
    print("\n| seq | torch path (ms) | fastpath-hooks (ms) | speedup | peak mem torch / fast (GB) | first loss torch / fast |")
    print("|---|---|---|---|---|---|")
    for row in table:
        print(f"| {row['seq']} | {row['torch_ms']:.1f} | {row['fastpath_ms']:.1f} | {row['speedup']:.1f}x | "
              f"{row['torch_peak_gb']:.1f} / {row['fastpath_peak_gb']:.1f} | "
              f"{row['torch_first_loss']:.4f} / {row['fastpath_first_loss']:.4f} |")
    for r in results:
        if "resolved" in r:
            print(f"\n{r['path']} seq {r['seq']} resolved:")
            for name, impl in r["resolved"].items():
                print(f"  {name} -> {impl}")
    if args.out:
        data = {"date": time.strftime("%Y-%m-%d"), "versions": versions(), "args": vars(args), "table": table,
                "results": results}
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(data, fh, indent=2)
        print(f"\nwrote {args.out}")
    return 0 if table else 1


if __name__ == "__main__":
    sys.exit(main())
