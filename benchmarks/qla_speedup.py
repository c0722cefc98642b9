"""flash-qla under fla (issue #21): tiny Qwen3.5 and Qwen3-Next training steps on the torch path, on
fla + tilelang, and on fla + tilelang + flash-qla; and the first training step from a cold JIT cache with
and without the warm-up fastpath-hooks runs in its verification child.

    python benchmarks/qla_speedup.py torch --out torch.json   # transformers' torch path (fla blocked)
    python benchmarks/qla_speedup.py fast  --out fast.json    # fastpath-hooks on: at the first modeling import it
                                                            # installs tilelang, fla, flash-qla (if missing),
                                                            # checks and warms them; then every mode, one process
    python benchmarks/qla_speedup.py cold  --out cold.json    # FASTPATH_HOOKS_DISABLE=1 and empty JIT caches: the
                                                            # first steps as they are without the warm-up
    python benchmarks/qla_speedup.py report torch.json fast.json cold.json --out flash_qla.json
    python benchmarks/qla_speedup.py dry-run                  # the same logic on a CPU (tiny models): the script's check

Models (random init, bf16, batch 1, one step = forward + loss + backward, no optimizer: every mode sees
the same weights): qwen3_5_text as benchmarks/gpu_speedup.py (hidden 2048, intermediate 5632, 3 linear +
1 full attention layers, 16 heads / 2 KV heads, vocab 32000; its gated delta rule: 16 key heads, 32 value
heads, K = V = 128 - what flash-qla computes) and qwen3_next with the same sizes and 8 experts (2 per
token, 512 wide). Modes in the fast phase, in one process (fla reads FLA_FLASH_QLA at every call):
`qla` (flash-qla on), `fla` (FLA_FLASH_QLA=0: fla's Triton path with its tilelang backward on Hopper).
Which implementation ran is recorded (transformers' resolved function; flash-qla's entry point counted).

(Not named flash_qla.py: run as a script, its directory comes first on sys.path, and the file would stand
in for the `flash_qla` package that fla imports.)

Targets (issue #21): >= 1.3x per step of `qla` over `fla` at 16384 tokens; the first step after the
warm-up within 2x of a warm step; first losses of all modes within 1e-3 (relative). The report says
whether pins `pays.hazard` stays true, and the line to change if not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODES = {"qla": {"FLA_FLASH_QLA": "1"}, "fla": {"FLA_FLASH_QLA": "0"}}
FUNCTIONS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn")
TARGET_SPEEDUP, TARGET_FIRST, LOSS_RTOL = 1.3, 2.0, 1e-3


# --models names -> (transformers model type, what it is): both are in transformers 5.17.0 (the H200 image's:
# qwen3_5_text -> Qwen3_5ForCausalLM, qwen3_next -> Qwen3NextForCausalLM) and later; a transformers without
# one skips that model with a line saying so
MODELS = {"qwen3_5": ("qwen3_5_text", "Qwen3.5"), "qwen3_next": ("qwen3_next", "Qwen3-Next")}


def missing(kind: str, causal_lm_names, version: str):
    """Why `kind` cannot be built with this transformers (its causal-LM model names: the auto mapping's
    keys), or None."""
    if kind not in MODELS:
        return f"{kind}: not a model of this benchmark (choose from {', '.join(MODELS)})"
    model_type, what = MODELS[kind]
    if model_type not in causal_lm_names:
        return f"{kind}: transformers {version} has no {what} causal-LM model ({model_type!r}): skipped"
    return None


def _missing_here(kind: str):
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return missing(kind, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, transformers.__version__)


class _Blocker:
    """The torch-path measurement: fla, causal_conv1d and flash_qla cannot be imported in that process."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("fla", "causal_conv1d", "flash_qla"):
            raise ModuleNotFoundError(f"{name} blocked for the torch-path measurement", name=name)
        return None


def config(kind: str, args):
    from transformers import AutoConfig

    layers = args.layers
    common = dict(hidden_size=args.hidden, intermediate_size=args.intermediate, num_hidden_layers=layers,
                  layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
                  num_attention_heads=args.heads, num_key_value_heads=2, vocab_size=args.vocab)
    if args.linear:   # a CPU dry run: small linear-attention heads (the real sizes are the configs' defaults)
        hk, hv, dim = args.linear
        common.update(linear_num_key_heads=hk, linear_num_value_heads=hv, linear_key_head_dim=dim,
                      linear_value_head_dim=dim, head_dim=args.hidden // args.heads)
    if kind == "qwen3_5":
        return AutoConfig.for_model(MODELS[kind][0], **common)
    return AutoConfig.for_model(MODELS[kind][0], num_experts=8, num_experts_per_tok=2, moe_intermediate_size=512,
                                shared_expert_intermediate_size=512, mlp_only_layers=[], decoder_sparse_step=1, **common)


def resolved(model) -> dict:
    import inspect

    module = sys.modules[type(model).__module__]
    out = {}
    for name in FUNCTIONS:
        fn = getattr(module, name, None)
        if fn is not None:
            if getattr(fn, "__code__", None) is None and callable(getattr(type(fn), "forward", None)):
                fn = inspect.getclosurevars(type(fn).forward).nonlocals.get("func", fn)   # HF kernels' Func (5.25)
            impl = inspect.getclosurevars(fn).nonlocals.get("implementation", fn) if hasattr(fn, "__wrapped__") else fn
            out[name] = f"{getattr(impl, '__module__', '?')}.{getattr(impl, '__qualname__', '?')}"
    return out


def count_flash_qla() -> list:
    """flash-qla's entry point, counted (fla looks it up at every call): [calls], or None without it."""
    try:
        import flash_qla
    except Exception:
        return None
    calls = [0]
    original = flash_qla.chunk_gated_delta_rule

    def counted(*a, **kw):
        calls[0] += 1
        return original(*a, **kw)

    flash_qla.chunk_gated_delta_rule = counted
    return calls


def steps(model, args, seq: int, warmup: int, count: int) -> dict:
    import torch

    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    gen = torch.Generator(device=args.device).manual_seed(1234)
    ids = torch.randint(0, args.vocab, (1, seq), device=args.device, generator=gen)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for _ in range(warmup + count):
        sync()
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    timed = times[warmup:] or times[-1:]
    return {"seq": seq, "first_step_s": times[0], "median_step_ms": statistics.median(timed) * 1e3,
            "step_ms": [t * 1e3 for t in times], "first_loss": losses[0], "last_loss": losses[-1],
            "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else 0.0}


def build(kind: str, args):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cuda = args.device == "cuda"
    return AutoModelForCausalLM.from_config(config(kind, args)).to(args.device, torch.bfloat16 if cuda else torch.float32)


def phase(args) -> dict:
    """One process: the torch path, the fast path (fastpath-hooks on), or the cold one (hooks off)."""
    t0 = time.perf_counter()
    events = []
    if args.phase == "torch":
        sys.meta_path.insert(0, _Blocker())
    elif args.phase == "fast":
        import fastpath_hooks

        fastpath_hooks.install(on_event=events.append)
    out = {"phase": args.phase, "runs": [], "errors": [], "skipped": []}
    modes = ["torch"] if args.phase == "torch" else ["qla", "fla"] if args.phase == "fast" else ["qla"]
    calls = None
    for kind in args.models.split(","):
        why = _missing_here(kind)
        if why is not None:
            out["skipped"].append(why)
            print(f"{args.phase:>5} {why}", flush=True)
            continue
        try:
            start = time.perf_counter()
            model = build(kind, args)   # imports the modeling module: where fla (and flash-qla) are decided
            built_s = time.perf_counter() - start
        except Exception as exc:
            out["errors"].append(f"{kind}: build failed: {type(exc).__name__}: {exc}")
            continue
        out.setdefault("setup_s", time.perf_counter() - t0)    # the first build: install + checks + warm-up
        if calls is None and args.phase != "torch":
            calls = count_flash_qla()
        for seq in [int(s) for s in args.seqs.split(",")]:
            for mode in modes:
                os.environ.update(MODES.get(mode, {}))
                before = calls[0] if calls else 0
                warmup, count = ((args.torch_warmup, args.torch_steps) if mode == "torch" else (args.warmup, args.steps))
                if mode == "torch" and seq >= args.torch_short_from:
                    warmup, count = 0, 1         # ~1.4 s a step at 16384 on the H200: its first loss and one step
                try:
                    run = steps(model, args, seq, warmup, count)
                except Exception as exc:
                    out["errors"].append(f"{kind} {seq} {mode}: {type(exc).__name__}: {str(exc)[:300]}")
                    continue
                run.update(model=kind, mode=mode, build_s=built_s, resolved=resolved(model),
                           flash_qla_calls=(calls[0] - before) if calls else None)
                out["runs"].append(run)
                print(f"{args.phase:>5} {kind:<10} {seq:>6} {mode:<5} median {run['median_step_ms']:8.1f} ms  first "
                      f"{run['first_step_s']:7.2f} s  loss {run['first_loss']:.5f}  flash-qla calls "
                      f"{run['flash_qla_calls']}", flush=True)
        del model
    out["events"] = [e["message"] for e in events if e.get("type") in ("status", "warning", "error")][-40:]
    out["seconds"] = time.perf_counter() - t0
    out["versions"] = versions()
    out["env"] = {k: os.environ.get(k) for k in ("TRITON_CACHE_DIR", "TILELANG_CACHE_DIR", "FLA_FLASH_QLA",
                                                 "FASTPATH_HOOKS_CACHE_DIR", "FASTPATH_HOOKS_DISABLE")}
    return out


def versions() -> dict:
    import importlib.metadata as md

    out = {}
    for name in ("torch", "triton", "transformers", "fla-core", "tilelang", "apache-tvm-ffi", "flash-qla",
                 "fastpath-hooks"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    try:
        import torch

        out["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except Exception:
        pass
    out["python"] = sys.version.split()[0]
    return out


# -- the report --------------------------------------------------------------------------------

def _find(runs, model, seq, mode):
    return next((r for r in runs if r["model"] == model and r["seq"] == seq and r["mode"] == mode), None)


def report(phases: dict) -> dict:
    """The table and the verdicts from the phases' JSON (torch / fast / cold; a missing one leaves gaps)."""
    # step times from the torch and fast phases only: the cold phase times its first steps (JIT included)
    runs = [r for name, p in phases.items() if name != "cold" for r in p.get("runs", [])]
    cold = phases.get("cold", {}).get("runs", [])
    rows = []
    for model in sorted({r["model"] for r in runs}):
        for seq in sorted({r["seq"] for r in runs if r["model"] == model}):
            t, f, q = (_find(runs, model, seq, m) for m in ("torch", "fla", "qla"))
            c = _find(cold, model, seq, "qla")
            row = {"model": model, "seq": seq}
            for name, r in (("torch", t), ("fla", f), ("qla", q)):
                row[f"{name}_ms"] = r["median_step_ms"] if r else None
                row[f"{name}_loss"] = r["first_loss"] if r else None
                row[f"{name}_first_s"] = r["first_step_s"] if r else None
            row["cold_first_s"] = c["first_step_s"] if c else None
            row["qla_over_fla"] = f["median_step_ms"] / q["median_step_ms"] if f and q else None
            row["qla_over_torch"] = t["median_step_ms"] / q["median_step_ms"] if t and q else None
            row["qla_dispatched"] = bool(q and q.get("flash_qla_calls"))
            losses = [x for x in (row["torch_loss"], row["fla_loss"], row["qla_loss"]) if x is not None]
            row["loss_spread"] = (max(losses) - min(losses)) / abs(losses[0]) if len(losses) > 1 else None
            rows.append(row)
    fast = phases.get("fast", {})
    first = next((r for r in fast.get("runs", [])), None)
    verdict = {}
    big = [r for r in rows if r["seq"] == max((x["seq"] for x in rows), default=0) and r["qla_over_fla"]]
    if big:
        worst = min(r["qla_over_fla"] for r in big)
        verdict["speedup_at_longest"] = worst
        verdict["pays"] = worst >= TARGET_SPEEDUP and all(r["qla_dispatched"] for r in big)
        verdict["pins"] = ("keep kernels.flash-qla.pays.hazard = true" if verdict["pays"] else
                           'set "hazard": false in kernels.flash-qla.pays (fastpath_hooks/facts/pins.json)')
    if first:
        verdict["first_step_after_warmup_s"] = first["first_step_s"]
        verdict["warm_step_s"] = first["median_step_ms"] / 1e3
        verdict["first_over_warm"] = first["first_step_s"] / (first["median_step_ms"] / 1e3)
        verdict["first_within_2x"] = verdict["first_over_warm"] <= TARGET_FIRST
        verdict["setup_s"] = fast.get("setup_s")
    spreads = [r["loss_spread"] for r in rows if r["loss_spread"] is not None]
    verdict["losses_agree"] = bool(spreads) and max(spreads) <= LOSS_RTOL
    return {"rows": rows, "verdict": verdict, "errors": [e for p in phases.values() for e in p.get("errors", [])],
            "skipped": sorted({s for p in phases.values() for s in p.get("skipped", [])})}


def table(rep: dict) -> str:
    def f(x, spec):
        return "-" if x is None else format(x, spec)

    lines = ["| model | seq | torch (ms) | fla + tilelang (ms) | + flash-qla (ms) | flash-qla / fla | vs torch | "
             "first loss torch / fla / qla | first step: cold, no warm-up / after warm-up (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rep["rows"]:
        lines.append(f"| {r['model']} | {r['seq']} | {f(r['torch_ms'], '.1f')} | {f(r['fla_ms'], '.1f')} | "
                     f"{f(r['qla_ms'], '.1f')} | {f(r['qla_over_fla'], '.2f')}x | {f(r['qla_over_torch'], '.1f')}x | "
                     f"{f(r['torch_loss'], '.4f')} / {f(r['fla_loss'], '.4f')} / {f(r['qla_loss'], '.4f')} | "
                     f"{f(r['cold_first_s'], '.1f')} / {f(r['qla_first_s'], '.2f')} |")
    v = rep["verdict"]
    lines.append("")
    if "pays" in v:
        lines.append(f"flash-qla over fla + tilelang at the longest sequence: {v['speedup_at_longest']:.2f}x "
                     f"(target {TARGET_SPEEDUP}x): {'pays' if v['pays'] else 'does not pay'} -> {v['pins']}")
    if "first_over_warm" in v:
        lines.append(f"first step after the warm-up: {v['first_step_after_warmup_s']:.2f} s = {v['first_over_warm']:.1f}x "
                     f"a warm step (target <= {TARGET_FIRST}x); install + checks + warm-up before it: "
                     f"{f(v.get('setup_s'), '.1f')} s")
    lines.append(f"first losses agree within {LOSS_RTOL}: {v.get('losses_agree')}")
    for e in rep.get("skipped", []):
        lines.append(f"skipped: {e}")
    for e in rep["errors"]:
        lines.append(f"error: {e}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("phase", choices=("torch", "fast", "cold", "report", "dry-run"))
    p.add_argument("inputs", nargs="*", help="report: the phases' JSON files")
    p.add_argument("--models", default="qwen3_5,qwen3_next")
    p.add_argument("--seqs", default="4096,16384")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--torch-steps", type=int, default=2)
    p.add_argument("--torch-warmup", type=int, default=1)
    p.add_argument("--torch-short-from", type=int, default=16384, help="torch path at this length and up: one step")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--linear", type=lambda s: tuple(int(x) for x in s.split("x")), default=None,
                   help="KEYHEADSxVALUEHEADSxDIM of the linear attention (default: the configs' 16x32x128)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--timeout", type=float, default=560)
    p.add_argument("--out", help="write the JSON here")
    args = p.parse_args(argv)
    if args.phase == "dry-run":
        return dry_run(args)
    if args.phase == "report":
        phases = {}
        for path in args.inputs:
            with open(path) as fh:
                data = json.load(fh)
            phases[data["phase"]] = data
        rep = report(phases)
        rep["phases"] = phases
        print(table(rep))
        data = rep
    else:
        data = phase(args)
        print(json.dumps({k: data[k] for k in ("phase", "seconds", "setup_s", "errors", "skipped") if k in data}))
    if args.out:
        write_json(args.out, data)
    return 0


def write_json(path: str, data) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1)


def dry_run(args) -> int:
    """Every phase on a CPU with tiny models, in child processes as on the GPU, then the report: the script's
    logic (arguments, phases, JSON, table), not its figures."""
    import tempfile

    work = tempfile.mkdtemp(prefix="flash-qla-dry-")
    tiny = ["--device", "cpu", "--hidden", "64", "--intermediate", "128", "--heads", "2", "--vocab", "128",
            "--linear", "2x2x16", "--seqs", "32,64", "--steps", "1", "--warmup", "1", "--torch-short-from", "64"]
    outs = []
    for name in ("torch", "fast", "cold"):
        out = os.path.join(work, f"{name}.json")
        env = dict(os.environ, **({"FASTPATH_HOOKS_DISABLE": "1"} if name != "fast" else {}))
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), name, *tiny, "--out", out], env=env,
                              capture_output=True, text=True, timeout=args.timeout)
        print(proc.stdout.strip())
        if proc.returncode != 0:
            print(proc.stderr[-2000:], file=sys.stderr)
            return proc.returncode
        outs.append(out)
    return main(["report", *outs, "--out", os.path.join(work, "report.json")])


if __name__ == "__main__":
    sys.exit(main())
