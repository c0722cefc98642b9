"""The first training step of a fresh process, once fastpath-hooks has installed the kernels and warmed their
JIT caches (issue #21): how long it takes against a warm step, and where the time goes.

    python benchmarks/first_step.py one --path fla --model qwen3_5 --seq 4096 --out a.json   # one fresh process
        [--profile]            # cProfile over the first step: its biggest entries, imports, Triton, TileLang
        [--primer cuda]        # before the clock: plain torch work every training process does (a bf16 matmul
                               # forward + backward, cross-entropy, causal SDPA at the model's sizes)
        [--preload M1,M2]      # before the clock: import these modules
    python benchmarks/first_step.py series --python ENV/bin/python --out-dir DIR   # the cases, each a fresh process
    python benchmarks/first_step.py report DIR/*.json --out first-step.json
    python benchmarks/first_step.py dry-run                                         # the logic, on a CPU

Paths: `fla` (fastpath-hooks on: install() before the model, whose modeling import then finds fla and tilelang
installed and remembered) and `torch` (hooks off, fla blocked: transformers' torch path). The models are those
of benchmarks/qla_speedup.py (tiny Qwen3.5 / Qwen3-Next, hidden 2048, K = V = 128, bf16, batch 1); one step
is forward, loss and backward, synchronized. The clock of the first step starts after the model is on the GPU.

Target (issue #21): the first step within 2x of a warm one.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import json
import os
import pstats
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qla_speedup as qla  # noqa: E402  (its models, config and the torch-path blocker)

TARGET_FIRST = qla.TARGET_FIRST
# fla's Hopper backward through TileLang (fla/ops/common/backends/tilelang): fla imports it, and with it
# tilelang, inside the first backward
TILELANG_BACKWARD = "tilelang,fla.ops.common.backends.tilelang.chunk_bwd"


def _sync(args):
    import torch

    if args.device == "cuda":
        torch.cuda.synchronize()


def _top_modules(names) -> list:
    return sorted({n.split(".")[0] for n in names})


def primer(args) -> None:
    """Plain torch work any training step of these models does, kernels or not: cuBLAS (bf16 matmul forward
    and backward), cross-entropy, causal SDPA at the model's sizes."""
    import torch
    import torch.nn.functional as F

    dev, dt = args.device, torch.bfloat16 if args.device == "cuda" else torch.float32
    x = torch.randn(args.seq, args.hidden, device=dev, dtype=dt, requires_grad=True)
    w = torch.randn(args.hidden, args.vocab, device=dev, dtype=dt, requires_grad=True)
    labels = torch.randint(0, args.vocab, (args.seq,), device=dev)
    F.cross_entropy((x @ w).float(), labels).backward()
    head = args.hidden // args.heads
    q = torch.randn(1, args.heads, args.seq, head, device=dev, dtype=dt, requires_grad=True)
    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    _sync(args)


def _profile_summary(prof: cProfile.Profile, top: int = 25) -> dict:
    """The first step's profile: its biggest entries by cumulative and by own time, and the totals of what a
    fresh process pays once (imports; Triton compiling or loading a kernel; TileLang)."""
    stats = pstats.Stats(prof).stats

    def name(key):
        path, line, func = key
        short = "/".join(path.split("/")[-3:]) if "/" in path else path
        return f"{short}:{line}({func})"

    def total(match):
        hits = [(v[1], v[3]) for k, v in stats.items() if match(k)]
        return {"calls": sum(c for c, _ in hits), "cum_s": round(max((t for _, t in hits), default=0.0), 4)}

    rows = sorted(stats.items(), key=lambda kv: kv[1][3], reverse=True)
    own = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)
    return {
        "by_cumulative": [(name(k), v[1], round(v[3], 4)) for k, v in rows[:top]],
        "by_own_time": [(name(k), v[1], round(v[2], 4)) for k, v in own[:top]],
        "imports": total(lambda k: k[2] == "_find_and_load"),
        "triton_compile": total(lambda k: k[0].endswith("triton/compiler/compiler.py") and k[2] == "compile"),
        # a real compile (compile() also answers cache hits): the NVIDIA backend's PTX -> cubin stage
        "triton_make_cubin": total(lambda k: k[2] == "make_cubin"),
        # processes started in the step: tilelang's nvcc on a cache miss (and anything else that forks)
        "subprocesses": total(lambda k: k[0].endswith("subprocess.py") and k[2] == "_execute_child"),
        "triton_load_binary": total(lambda k: k[2] == "_init_handles"),
        "triton_jit_run": total(lambda k: k[0].endswith("triton/runtime/jit.py") and k[2] == "run"),
        "tilelang": total(lambda k: "/tilelang/" in k[0]),
    }


def one(args) -> dict:
    """One fresh process: the model on the device, then the first step (forward and backward apart) and
    warm steps."""
    t0 = time.perf_counter()
    out = {"path": args.path, "model": args.model, "seq": args.seq, "primer": args.primer,
           "preload": args.preload, "profile": args.profile, "timings_s": {}}
    timings = out["timings_s"]
    events = []
    if args.path == "torch":
        sys.meta_path.insert(0, qla._Blocker())
    else:
        import fastpath_hooks

        fastpath_hooks.install(on_event=events.append)
    import torch

    start = time.perf_counter()
    torch.zeros(1, device=args.device)
    _sync(args)
    timings["device_context"] = time.perf_counter() - start
    start = time.perf_counter()
    model = qla.build(args.model, args)   # imports the modeling module: fastpath-hooks decides there
    _sync(args)
    timings["build"] = time.perf_counter() - start
    for module in filter(None, (args.preload or "").split(",")):
        start = time.perf_counter()
        try:
            importlib.import_module(module)
        except ImportError as exc:       # not installed here (a CPU dry run): said, and the case goes on
            out.setdefault("preload_missing", []).append(f"{module}: {exc}")
            continue
        timings[f"import {module}"] = time.perf_counter() - start
    if args.primer == "cuda":
        start = time.perf_counter()
        primer(args)
        timings["primer"] = time.perf_counter() - start
    gen = torch.Generator(device=args.device).manual_seed(1234)
    ids = torch.randint(0, args.vocab, (1, args.seq), device=args.device, generator=gen)

    def step(record: bool):
        _sync(args)
        before = set(sys.modules)
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        _sync(args)
        mid = time.perf_counter()
        during_fwd = set(sys.modules) - before
        loss.backward()
        model.zero_grad(set_to_none=True)
        _sync(args)
        end = time.perf_counter()
        if record:
            out["first_forward_s"], out["first_backward_s"] = mid - start, end - mid
            out["imported_in_forward"] = _top_modules(during_fwd)
            out["imported_in_backward"] = _top_modules(set(sys.modules) - before - during_fwd)
            out["modules_imported_in_step"] = len(set(sys.modules) - before)
            out["first_loss"] = loss.item()
        return end - start

    prof = cProfile.Profile() if args.profile else None
    if prof:
        prof.enable()
    out["first_step_s"] = step(True)
    if prof:
        prof.disable()
        out["profile_summary"] = _profile_summary(prof)
    warm = [step(False) for _ in range(args.steps)]
    out["warm_step_ms"] = [t * 1e3 for t in warm]
    out["median_warm_ms"] = statistics.median(warm) * 1e3 if warm else None
    out["first_over_warm"] = out["first_step_s"] / (out["median_warm_ms"] / 1e3) if warm else None
    out["resolved"] = qla.resolved(model)
    out["events"] = [e["message"] for e in events if e.get("type") in ("status", "warning", "error")][-20:]
    out["env"] = {k: os.environ.get(k) for k in ("TRITON_CACHE_DIR", "TILELANG_CACHE_DIR", "FASTPATH_HOOKS_CACHE_DIR",
                                                 "FASTPATH_HOOKS_DISABLE", "CUDA_MODULE_LOADING")}
    out["versions"] = qla.versions()
    out["seconds"] = time.perf_counter() - t0
    return out


# name -> (arguments, environment): each case in its own fresh process, in this order
CASES = (
    ("torch-1", ["--path", "torch"], {"FASTPATH_HOOKS_DISABLE": "1"}),
    ("fla-1", ["--path", "fla"], {}),
    ("fla-2", ["--path", "fla"], {}),
    ("fla-3", ["--path", "fla"], {}),
    ("torch-2", ["--path", "torch"], {"FASTPATH_HOOKS_DISABLE": "1"}),
    ("fla-profile", ["--path", "fla", "--profile"], {}),
    ("torch-profile", ["--path", "torch", "--profile"], {"FASTPATH_HOOKS_DISABLE": "1"}),
    ("fla-primer", ["--path", "fla", "--primer", "cuda"], {}),
    ("torch-primer", ["--path", "torch", "--primer", "cuda"], {"FASTPATH_HOOKS_DISABLE": "1"}),
    ("fla-primer-preload", ["--path", "fla", "--primer", "cuda", "--preload", TILELANG_BACKWARD], {}),
    ("fla-next", ["--path", "fla", "--model", "qwen3_next"], {}),
    ("torch-next", ["--path", "torch", "--model", "qwen3_next"], {"FASTPATH_HOOKS_DISABLE": "1"}),
    # a longer sequence than the default case: the warm-up's kernels are not compiled per length (T is dynamic)
    ("fla-16k", ["--path", "fla", "--seq", "16384"], {}),
    ("torch-16k", ["--path", "torch", "--seq", "16384"], {"FASTPATH_HOOKS_DISABLE": "1"}),
    # without the warm-up: empty JIT caches of the user's own (fastpath-hooks leaves a cache the user set alone),
    # so the first step compiles what the install's check would have - last, it takes minutes on the H200
    ("fla-cold", ["--path", "fla"], {"TRITON_CACHE_DIR": "{cold}/triton", "TILELANG_CACHE_DIR": "{cold}/tilelang"}),
)


# the fresh processes of each path with nothing added before the clock, at the default size: the verdict's
PLAIN = {"fla": ("fla-1", "fla-2", "fla-3"), "torch": ("torch-1", "torch-2")}


def series(args, extra: list) -> int:
    os.makedirs(args.out_dir, exist_ok=True)
    only = set(filter(None, (args.cases or "").split(",")))
    failed = 0
    for name, case_args, env in CASES:
        if only and name not in only:
            continue
        out = os.path.join(args.out_dir, f"{name}.json")
        cmd = [args.python, os.path.abspath(__file__), "one", *case_args, *extra, "--out", out]
        cold = os.path.join(os.path.abspath(args.out_dir), f"{name}.jit")     # a case's own empty JIT caches
        env = {k: v.format(cold=cold) for k, v in env.items()}
        try:
            proc = subprocess.run(cmd, env=dict(os.environ, **env), capture_output=True, text=True,
                                  timeout=args.timeout)
            rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-1500:]
        except subprocess.TimeoutExpired:
            rc, tail = 124, f"timed out after {args.timeout} s"
        if rc != 0:
            failed += 1
            print(f"{name}: exit {rc}\n{tail}", flush=True)
            continue
        with open(out) as fh:
            data = json.load(fh)
        print(f"{name:<20} first {data['first_step_s']:7.3f} s (fwd {data['first_forward_s']:.3f} / bwd "
              f"{data['first_backward_s']:.3f})  warm {data['median_warm_ms']:7.1f} ms  "
              f"{data['first_over_warm']:6.1f}x  imported in step: {data['modules_imported_in_step']}", flush=True)
    return 1 if failed else 0


def report(runs: list) -> dict:
    """The table: every case, and the verdict from the plain fresh processes of the default path."""
    order = [name for name, _, _ in CASES]
    runs = sorted(runs, key=lambda r: order.index(r["case"]) if r.get("case") in order else len(order))
    rows = []
    for r in runs:
        rows.append({k: r.get(k) for k in ("case", "path", "model", "seq", "primer", "preload", "profile",
                                           "first_step_s", "first_forward_s", "first_backward_s", "median_warm_ms",
                                           "first_over_warm", "modules_imported_in_step", "imported_in_backward")}
                    | {"before_clock_s": {k: v for k, v in r["timings_s"].items() if k != "build"}})

    verdict = {}
    for path in ("fla", "torch"):
        cases = [r for r in rows if r["case"] in PLAIN[path]]
        if cases:
            verdict[f"{path}_first_s"] = statistics.median(r["first_step_s"] for r in cases)
            verdict[f"{path}_warm_ms"] = statistics.median(r["median_warm_ms"] for r in cases)
            verdict[f"{path}_first_over_warm"] = verdict[f"{path}_first_s"] / (verdict[f"{path}_warm_ms"] / 1e3)
    if "fla_first_over_warm" in verdict:
        verdict["first_within_2x"] = verdict["fla_first_over_warm"] <= TARGET_FIRST
    if "fla_first_s" in verdict and "torch_first_s" in verdict:
        # what the fast path's first step costs beyond a warm step, next to what the torch path's does
        verdict["fla_first_extra_s"] = verdict["fla_first_s"] - verdict["fla_warm_ms"] / 1e3
        verdict["torch_first_extra_s"] = verdict["torch_first_s"] - verdict["torch_warm_ms"] / 1e3
    by_case = {r["case"]: r for r in rows}
    for name, key in (("fla-cold", "fla_cold"), ("fla-16k", "fla_16k"), ("torch-16k", "torch_16k")):
        if name in by_case:
            verdict[f"{key}_first_s"] = by_case[name]["first_step_s"]
            verdict[f"{key}_first_over_warm"] = by_case[name]["first_over_warm"]
    return {"rows": rows, "verdict": verdict, "runs": runs}


def table(rep: dict) -> str:
    def f(x, spec):
        return "-" if x is None else format(x, spec)

    lines = ["| case | path | model | before the clock | first step (s) | forward / backward (s) | warm (ms) | "
             "first / warm | modules imported in the step |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rep["rows"]:
        before = ", ".join(f"{k} {v:.2f} s" for k, v in r["before_clock_s"].items())
        lines.append(f"| {r['case']} | {r['path']} | {r['model']} | {before} | {f(r['first_step_s'], '.3f')} | "
                     f"{f(r['first_forward_s'], '.3f')} / {f(r['first_backward_s'], '.3f')} | "
                     f"{f(r['median_warm_ms'], '.1f')} | {f(r['first_over_warm'], '.1f')}x | "
                     f"{r['modules_imported_in_step']} ({', '.join(r['imported_in_backward'] or [])}) |")
    v = rep["verdict"]
    if "first_within_2x" in v:
        lines += ["", f"fla + tilelang, fresh process: first step {v['fla_first_s']:.2f} s = "
                      f"{v['fla_first_over_warm']:.1f}x a warm step (target <= {TARGET_FIRST}x): "
                      f"{'met' if v['first_within_2x'] else 'not met'}"]
    if "fla_cold_first_s" in v:
        lines.append(f"without the warm-up (empty JIT caches): first step {v['fla_cold_first_s']:.2f} s = "
                     f"{v['fla_cold_first_over_warm']:.0f}x a warm step")
    if "torch_first_extra_s" in v:
        lines.append(f"beyond a warm step, the first step costs {v['fla_first_extra_s']:.2f} s on fla + tilelang and "
                     f"{v['torch_first_extra_s']:.2f} s on the torch path ({v['torch_first_over_warm']:.1f}x its warm step)")
    return "\n".join(lines)


def _common(p):
    p.add_argument("--model", default="qwen3_5", choices=sorted(qla.MODELS))
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--linear", type=lambda s: tuple(int(x) for x in s.split("x")), default=None)
    p.add_argument("--device", default="cuda")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("one")
    _common(o)
    o.add_argument("--path", choices=("fla", "torch"), default="fla")
    o.add_argument("--primer", choices=("cuda",), default=None)
    o.add_argument("--preload", default=None)
    o.add_argument("--profile", action="store_true")
    o.add_argument("--case", default=None)
    o.add_argument("--out")
    s = sub.add_parser("series")
    s.add_argument("--python", default=sys.executable)
    s.add_argument("--out-dir", required=True)
    s.add_argument("--cases", default=None, help="comma-separated names of CASES (default: all)")
    s.add_argument("--timeout", type=float, default=300)
    r = sub.add_parser("report")
    r.add_argument("inputs", nargs="+")
    r.add_argument("--out")
    d = sub.add_parser("dry-run")
    d.add_argument("--timeout", type=float, default=300)
    args, extra = p.parse_known_args(argv)
    if args.cmd == "series":
        return series(args, extra)
    if extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.cmd == "dry-run":
        return dry_run(args)
    if args.cmd == "one":
        data = one(args)
        data["case"] = args.case or os.path.splitext(os.path.basename(args.out or "one"))[0]
    else:
        runs = []
        for path in args.inputs:
            with open(path) as fh:
                runs.append(json.load(fh))
        data = report(runs)
        print(table(data))
    if args.out:
        qla.write_json(args.out, data)
    return 0


def dry_run(args) -> int:
    """Every case on a CPU with tiny models, each in its fresh process as on the GPU, then the report: the
    script's logic (arguments, cases, profile, JSON, table), not its figures. fastpath-hooks is off (nothing is
    installed on a CPU), so the `fla` cases run the torch path too."""
    import glob
    import tempfile

    work = tempfile.mkdtemp(prefix="first-step-dry-")
    tiny = ["--device", "cpu", "--hidden", "64", "--intermediate", "128", "--heads", "2", "--vocab", "128",
            "--linear", "2x2x16", "--seq", "64", "--steps", "2"]
    os.environ["FASTPATH_HOOKS_DISABLE"] = "1"
    rc = main(["series", "--out-dir", work, "--timeout", str(args.timeout), *tiny])
    if rc != 0:
        return rc
    return main(["report", *sorted(glob.glob(os.path.join(work, "*.json"))), "--out", os.path.join(work, "report.json")])


if __name__ == "__main__":
    sys.exit(main())
