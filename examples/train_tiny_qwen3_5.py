"""Train a tiny, randomly initialised Qwen3.5 for a few steps - with fastpath-hooks.

    python examples/train_tiny_qwen3_5.py --steps 5                 # CPU: the torch path
    python examples/train_tiny_qwen3_5.py --steps 20 --device cuda  # GPU: the fast path
    torchrun --nproc-per-node 4 examples/train_tiny_qwen3_5.py      # DDP (gloo on CPU, nccl on GPU)

The first two lines are all a training script needs: the first time transformers
asks for fla / causal-conv1d, fastpath-hooks decides whether this machine can
use them, installs pinned known-good versions (verified in a child process), or
leaves the run on transformers' torch path with one line saying why. It prints what
serves each kernel function: a hub kernel (transformers 5.25+ on a GPU), the package,
or torch.
"""

import fastpath_hooks

fastpath_hooks.install()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402


def tiny_config(hidden: int, layers: int, vocab: int):
    # 3 linear-attention layers per full-attention layer, like Qwen3.5 itself.
    heads = max(hidden // 128, 2)
    return AutoConfig.for_model(
        "qwen3_5_text",
        hidden_size=hidden,
        intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        num_attention_heads=heads,
        num_key_value_heads=max(heads // 8, 1),
        head_dim=hidden // heads,
        linear_num_key_heads=heads,
        linear_num_value_heads=heads,
        linear_key_head_dim=hidden // heads,
        linear_value_head_dim=hidden // heads,
        vocab_size=vocab,
    )


def resolved_kernels(model) -> dict:
    """What serves each kernel function of the modeling module: the hub's kernel kernelize put in (transformers
    5.25+ on a GPU), else what the decorated function chose at import - the package, or the torch path."""
    import inspect

    module = sys.modules[type(model).__module__]
    hub = {}
    for layer in model.modules():   # 5.25: kernelize swaps the forward of each model's private wrappers
        for name, fn in getattr(layer, "_kernel_funcs", {}).items():
            repo = fn.__dict__.get("_kernel_repo")
            if repo is not None:
                hub[name] = f"hub {repo}"
    out = {}
    for name, func in (("causal_conv1d_fn", "causal_conv1d_fn"), ("causal_conv1d_update", "causal_conv1d_update"),
                       ("torch_chunk_gated_delta_rule", "chunk_gated_delta_rule"),
                       ("torch_recurrent_gated_delta_rule", "fused_recurrent_gated_delta_rule")):
        fn = getattr(module, name, None)
        if fn is None:
            continue
        if func in hub or name in hub:
            out[name] = hub.get(func) or hub[name]
            continue
        if getattr(fn, "__code__", None) is None and callable(getattr(type(fn), "forward", None)):
            fn = inspect.getclosurevars(type(fn).forward).nonlocals.get("func", fn)   # HF kernels' Func module
        impl = inspect.getclosurevars(fn).nonlocals.get("implementation", fn) if hasattr(fn, "__wrapped__") else fn
        where = getattr(impl, "__module__", "?")
        kind = "torch" if where == module.__name__ else "package"
        out[name] = f"{kind} {where}.{getattr(impl, '__name__', '?')}"
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="bfloat16 (GPU default) or float32 (CPU default)")
    p.add_argument("--json", action="store_true", help="print one JSON line with the results")
    args = p.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if world > 1:
        backend = "nccl" if args.device == "cuda" else "gloo"
        torch.distributed.init_process_group(backend)
    device = torch.device(args.device, local_rank) if args.device == "cuda" else torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(args.hidden, args.layers, args.vocab)).to(device, dtype)
    if device.type == "cuda" and hasattr(model, "set_use_kernels") and os.environ.get("USE_HUB_KERNELS", "1") != "0":
        # transformers 5.25+: what from_pretrained(..., device_map="cuda") does - the hub's kernels where they may
        # serve here (fastpath-hooks decides which), the packages or torch for the rest
        model.set_use_kernels(True, device_map={"": str(device)})
    model.train()
    kernels = resolved_kernels(model)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1234 + rank)

    losses, times = [], []
    for _ in range(args.steps):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen).to(device)
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    result = {"rank": rank, "world": world, "device": str(device), "losses": losses,
              "step_seconds": times, "kernels": kernels}
    if args.json:
        print(json.dumps(result), flush=True)
    elif rank == 0:
        print(f"trained {args.steps} steps on {device}: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
        for name, impl in kernels.items():
            print(f"  {name} -> {impl}")
    if world > 1:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
