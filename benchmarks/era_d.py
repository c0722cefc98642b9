"""transformers 5.25 (era D) on a GPU: `from_pretrained(path, device_map="cuda")` of tiny saved models, with and
without the hub reachable (here: HF_HUB_OFFLINE=1, or no network at all), through `install()` and through the
start-up entry (`fastpath-hooks enable`), trains a few steps; the torch path's first loss beside it; a stand-in
hub kernel in LOCAL_KERNELS chosen and checked (issue 32).

    python benchmarks/era_d.py save --dir DIR                        # the tiny models (Qwen3.5, Granite-4.0-H)
    python benchmarks/era_d.py case --model DIR/qwen3_5 --via install --offline 1 --out case.json
    python benchmarks/era_d.py summary case*.json --out summary.json
    python benchmarks/era_d.py save --dir DIR --tiny && ... --device cpu     # checks the script on a CPU

A case is one fresh process: the hooks first (`--via install`: `fastpath_hooks.install()` at the top; `enable`:
nothing in the script, the start-up entry does it; `torch`: FASTPATH_HOOKS_DISABLE=1 and USE_HUB_KERNELS=0, the
reference), then the load as a user writes it, `model.train()`, `--steps` steps of forward + loss + backward +
AdamW at `--seq` tokens. It records the first loss, the step times, the error if the load or a step raised, what
served each kernel function (the hub's kernel kernelize put in, the package, torch: examples/train_tiny_qwen3_5.py's
report) and fastpath-hooks' choices of the hub's mapping.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

QWEN = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=2,
            vocab_size=32000, layer_types=["linear_attention"] * 3 + ["full_attention"])
GRANITE = dict(vocab_size=32000, hidden_size=2048, num_hidden_layers=4,
               layer_types=["mamba", "mamba", "mamba", "attention"], num_attention_heads=16, num_key_value_heads=4,
               shared_intermediate_size=8192, intermediate_size=8192, num_local_experts=0, position_embedding_type=None,
               mamba_expand=2, mamba_d_head=64, mamba_n_heads=64, mamba_d_state=128, mamba_n_groups=1, mamba_d_conv=4,
               mamba_chunk_size=256, use_cache=False, tie_word_embeddings=False)
TINY = {"hidden_size": 64, "intermediate_size": 128, "vocab_size": 256}


MODELS = {"qwen3_5": ("qwen3_5_text", QWEN), "granitemoehybrid": ("granitemoehybrid", GRANITE)}



def train_steps(model, device: str, seq: int, steps: int, first_done=None) -> tuple:
    """(losses, seconds of each step) of `steps` AdamW steps (forward, loss, backward) on one random batch of `seq`
    tokens, synchronized; `first_done()` is called right after the first step."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device=device).manual_seed(1234)
    ids = torch.randint(0, model.config.vocab_size, (1, seq), device=device, generator=gen)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    losses, times = [], []
    for _ in range(steps):
        sync()
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(round(time.perf_counter() - start, 4))
        losses.append(loss.item())
        if first_done is not None and len(times) == 1:
            first_done()
    return losses, times

def model_config(name: str, tiny: bool = False):
    """The transformers config of a model of MODELS (its modeling module is not imported yet)."""
    from transformers import AutoConfig

    model_type, config = MODELS[name]
    config = dict(config)
    if tiny:
        config.update(TINY)
        if model_type == "granitemoehybrid":
            config.update(shared_intermediate_size=128, mamba_n_heads=4, mamba_d_head=32, mamba_d_state=16,
                          mamba_chunk_size=64, num_attention_heads=4, num_key_value_heads=2)
    return AutoConfig.for_model(model_type, **config)


def save(args) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    for name in MODELS:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(model_config(name, args.tiny))
        model.to(torch.bfloat16).save_pretrained(os.path.join(args.dir, name))
        print(f"saved {name} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters)")


def case(args) -> dict:
    out = {"model": os.path.basename(args.model.rstrip("/")), "via": args.via, "offline": args.offline, "seq": args.seq,
           "hub": os.environ.get("LOCAL_KERNELS", "") and "LOCAL_KERNELS", "error": None, "loss0": None}
    t0 = time.perf_counter()
    events = []
    if args.via == "install":
        import fastpath_hooks

        fastpath_hooks.install(on_event=events.append)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    from train_tiny_qwen3_5 import resolved_kernels   # what serves each kernel function

    out["transformers"] = transformers.__version__
    out["fastpath_hooks"] = sys.modules["fastpath_hooks"].__version__ if "fastpath_hooks" in sys.modules else None
    try:
        placed = {"device_map": args.device} if args.device != "cpu" else {}   # (a CPU check has no accelerate)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, **placed)
        out["load_s"] = round(time.perf_counter() - t0, 2)
        model.train()
        out["kernels"] = _kernels(model, resolved_kernels)
        losses, times = train_steps(model, args.device, args.seq, args.steps)
        out.update(loss0=losses[0], losses=losses, step_s=times, first_step_done_s=round(time.perf_counter() - t0, 2))
    except Exception as exc:   # the load (a kernel lookup) or a step: the case's result
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        out["error"] = f"{type(exc).__name__}: {text}"[:400]
    hub = sys.modules.get("fastpath_hooks.engine.hub")
    if hub is not None:
        out["hub_choices"] = {c.entry.name: [c.serve, c.source, c.reason] for c in hub.chosen()
                              if c.entry.kernel is not None}
    out["said"] = [e["message"] for e in events]
    return out


def _kernels(model, resolved) -> dict:
    """resolved_kernels (the conv and gated-delta-rule functions) and the Mamba-2 scans where the model has them."""
    import inspect

    module = sys.modules[type(model).__module__]
    hub = {name: f"hub {fn.__dict__['_kernel_repo']}" for layer in model.modules()
           for name, fn in getattr(layer, "_kernel_funcs", {}).items() if "_kernel_repo" in fn.__dict__}
    out = resolved(model)
    for name in ("mamba2_split_conv1d_scan_combined", "mamba2_chunk_scan", "mamba2_selective_state_update"):
        fn = module.__dict__.get(name)
        if fn is None:
            continue
        if getattr(fn, "__code__", None) is None:
            fn = inspect.getclosurevars(type(fn).forward).nonlocals.get("func", fn)
        impl = inspect.getclosurevars(fn).nonlocals.get("implementation", fn)
        from fastpath_hooks._names import DECORATED

        served = hub.get(DECORATED[name][0])
        out[name] = served or (f"{'torch' if impl.__module__ == module.__name__ else 'package'} "
                               f"{impl.__module__}.{impl.__name__}")
    return out


def summary(args) -> dict:
    cases = []
    for path in args.files:
        with open(path) as fh:
            cases.append(json.load(fh))
    # the torch path's first loss of the same model at the same length (a case at another length has none)
    reference = {(c["model"], c.get("seq")): c["loss0"] for c in cases if c["via"] == "torch" and c.get("loss0") is not None}
    rows = []
    for c in cases:
        ref = reference.get((c["model"], c.get("seq", 2048)))
        rows.append({"case": f"{c['model']} via {c['via']}, {'offline' if c['offline'] else 'hub unreachable'}"
                             + (", stand-in hub kernel" if c.get("hub") else ""),
                     "transformers": c.get("transformers"), "offline": bool(c["offline"]), "error": c.get("error"),
                     "loss0": c.get("loss0"), "torch_loss0": ref,
                     "same_loss0": None if ref is None or c.get("loss0") is None else abs(c["loss0"] - ref) < 1e-2,
                     "step_ms": round(1000 * sorted(c["step_s"][1:] or c["step_s"])[len(c["step_s"][1:] or c["step_s"]) // 2], 1)
                     if c.get("step_s") else None,
                     "kernels": c.get("kernels"), "hub_choices": c.get("hub_choices")})
    return {"cases": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save")
    s.add_argument("--dir", required=True)
    s.add_argument("--tiny", action="store_true")
    c = sub.add_parser("case")
    c.add_argument("--model", required=True)
    c.add_argument("--via", choices=("install", "enable", "torch"), required=True)
    c.add_argument("--offline", type=int, default=1)
    c.add_argument("--steps", type=int, default=5)
    c.add_argument("--seq", type=int, default=2048)
    c.add_argument("--device", default="cuda")
    c.add_argument("--out", required=True)
    m = sub.add_parser("summary")
    m.add_argument("files", nargs="+")
    m.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.cmd == "save":
        save(args)
        return 0
    result = case(args) if args.cmd == "case" else summary(args)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps(result)[:2000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
