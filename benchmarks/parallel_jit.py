"""Issue 39's parallel JIT on a GPU: fla's gated-delta-rule check at a model's shapes (the package's own check,
act/check_child.py, loaded by path as the package runs it), from empty JIT caches, compiled one configuration at a
time or shared out (act/jit_share.py: helper processes, compile threads); then a training process that reads the
same caches (benchmarks/time_to_step.py's tiny Qwen3.5) - its first step shows what the check left to compile.

    python benchmarks/parallel_jit.py check --procs 7 --threads 0 --tune-seq 4096 --out check.json
    python benchmarks/parallel_jit.py check ... --device cpu --tiny     # checks the script on a CPU (stand-in fla)

The caller gives each case fresh TRITON_CACHE_DIR / TILELANG_CACHE_DIR (benchmarks/h200_time_to_step.sh, case
`jit-*`). The shapes are the tiny Qwen3.5's as transformers 5.17 calls fla (q and k repeated to the 32 value heads).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

T0 = time.perf_counter()
HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "..", "fastpath_hooks", "act", "check_child.py")


def load_child():
    spec = importlib.util.spec_from_file_location("fastpath_hooks_check_child", CHILD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check(args) -> dict:
    child = load_child()
    shape = [4, 4, 32, 32] if args.tiny else [args.heads_k, args.heads_v, args.dim, args.dim]
    spec = {"kind": "gated-delta-rule", "kernel": "fla", "served": "fla", "own": {"FLA_FLASH_QLA": "0"},
            "check_seq": args.check_seq, "tune_seq": args.tune_seq or None, "shapes": [shape], "dtype": args.dtype,
            "final_state": True, "varlen": False, "tolerances": {}, "slack": 1.0, "device": args.device,
            "jit": {"procs": args.procs, "threads": args.threads}}
    began = time.perf_counter()
    import torch  # noqa: F401  (its import is not the check's: the package's child has it imported already)
    import fla.ops.gated_delta_rule  # noqa: F401
    imported = time.perf_counter() - began
    start = time.perf_counter()
    result = child.check_here(spec)
    return {"procs": args.procs, "threads": args.threads, "tune_seq": args.tune_seq, "check_seq": args.check_seq,
            "shape": shape, "dtype": args.dtype, "import_s": round(imported, 2),
            "check_s": round(time.perf_counter() - start, 2), "status": result.get("status"),
            "reason": result.get("reason"), "errors": result.get("errors"), "first_call_s": result.get("first_call_s"),
            "cache_entries": _entries(os.environ.get("TRITON_CACHE_DIR"))}


def _entries(directory) -> int | None:
    try:
        return len(os.listdir(directory)) if directory else None
    except OSError:
        return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("--procs", type=int, default=0)
    c.add_argument("--threads", type=int, default=0)
    c.add_argument("--tune-seq", type=int, default=4096)
    c.add_argument("--check-seq", type=int, default=256)
    c.add_argument("--heads-k", type=int, default=32)
    c.add_argument("--heads-v", type=int, default=32)
    c.add_argument("--dim", type=int, default=128)
    c.add_argument("--dtype", default="bfloat16")
    c.add_argument("--device", default="cuda")
    c.add_argument("--tiny", action="store_true")
    c.add_argument("--out", required=True)
    args = p.parse_args(argv)
    out = check(args)
    out["wall_s"] = round(time.perf_counter() - T0, 2)
    print("RESULT " + json.dumps({k: out[k] for k in ("procs", "threads", "check_s", "status", "reason")}), flush=True)
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
    return 0 if out["status"] == "pass" else 3


if __name__ == "__main__":
    sys.exit(main())
