"""Packed-sequence (padding-free) training step of a tiny Qwen3.5: per-document losses, packed vs unpacked.

    python benchmarks/packed_sequences.py --path fastpath --out packed.json   # fastpath-hooks first
    python benchmarks/packed_sequences.py --path torch                        # kernels made unimportable

Three documents are packed into one row: `position_ids` restart at every document, and
the kernels get the boundaries the way transformers passes them (`cu_seq_lens_q` to fla's
chunk_gated_delta_rule, `seq_idx` to causal_conv1d_fn; the full-attention layer finds them
from the restarting position_ids). Each document is also run on its own (unpacked). With
fla + causal-conv1d, each document's loss in the packed row equals its unpacked loss (up to
bf16 rounding); on the torch path the convolution and the recurrence leak state from one
document into the next (transformers <= 5.19 silently; 5.20+ raises ValueError instead).

One training step = forward of the packed row + loss + backward. Printed (one JSON object):
the per-document losses both ways, their largest difference, each document's largest logit
difference packed vs unpacked (relative to its largest logit: the sensitive check, as a
random-init model's loss hardly moves when state leaks in), the packed step's median time,
peak memory, and which implementation each kernel function resolved to.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_speedup import _Blocker, _resolved as resolved  # noqa: E402 - the same torch-path blocker and report


def doc_losses(logits, ids, lengths):
    """Mean next-token loss of each document, predicting only inside the document."""
    import torch.nn.functional as F

    out, start = [], 0
    for n in lengths:
        lg = logits[0, start:start + n - 1].float()
        tg = ids[0, start + 1:start + n]
        out.append(F.cross_entropy(lg, tg))
        start += n
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--path", choices=("fastpath", "torch"), default="fastpath")
    p.add_argument("--lengths", default="1000,1500,1596", help="document lengths packed into one row")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args()

    events = []
    if args.path == "torch":
        sys.meta_path.insert(0, _Blocker())
    else:
        import fastpath_hooks

        fastpath_hooks.install(on_event=events.append)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    lengths = [int(x) for x in args.lengths.split(",")]
    layers = args.layers
    heads = max(args.hidden // 128, 2)
    cfg = AutoConfig.for_model(
        "qwen3_5_text", hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4, num_hidden_layers=layers,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        num_attention_heads=heads, num_key_value_heads=max(heads // 8, 1), vocab_size=args.vocab)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(device, dtype)
    gen = torch.Generator(device=device).manual_seed(1234)
    ids = torch.randint(0, args.vocab, (1, sum(lengths)), device=device, generator=gen)
    position_ids = torch.cat([torch.arange(n, device=device) for n in lengths])[None]
    bounds = torch.tensor([0] + lengths, device=device).cumsum(0)
    seq_idx = torch.cat([torch.full((n,), i, dtype=torch.int32, device=device) for i, n in enumerate(lengths)])[None]
    # use_cache=False as in training: with a cache, transformers does not look for packed
    # sequences in position_ids and the full-attention layer would attend across documents
    packed_kw = {"use_cache": False, "position_ids": position_ids, "cu_seq_lens_q": bounds.to(torch.int64),
                 "cu_seq_lens_k": bounds.to(torch.int64), "max_length_q": max(lengths), "max_length_k": max(lengths),
                 "seq_idx": seq_idx}
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    result = {"path": args.path, "lengths": lengths, "device": device, "resolved": resolved(model)}
    try:
        with torch.no_grad():
            packed_logits = model(input_ids=ids, **packed_kw).logits
            packed = [x.item() for x in doc_losses(packed_logits, ids, lengths)]
            unpacked, logit_diff, start = [], [], 0
            for n in lengths:
                piece = ids[:, start:start + n]
                logits = model(input_ids=piece, use_cache=False).logits
                unpacked.append(doc_losses(logits, piece, [n])[0].item())
                # a random-init model's loss hardly moves when state leaks in; its logits do
                diff = (packed_logits[:, start:start + n].float() - logits.float()).abs().max().item()
                logit_diff.append(diff / logits.float().abs().max().item())
                start += n
        result.update(packed_losses=packed, unpacked_losses=unpacked,
                      max_abs_diff=max(abs(a - b) for a, b in zip(packed, unpacked)),
                      max_rel_logit_diff=logit_diff)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        times = []
        for i in range(args.warmup + args.steps):
            sync()
            t0 = time.perf_counter()
            losses = doc_losses(model(input_ids=ids, **packed_kw).logits, ids, lengths)
            loss = torch.stack(losses).mean()
            loss.backward()
            model.zero_grad(set_to_none=True)
            sync()
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
        result.update(packed_step_ms=statistics.median(times) * 1e3, step_loss=loss.item(),
                      peak_mem_gb=torch.cuda.max_memory_allocated() / 1e9 if cuda else 0.0)
    except Exception as exc:  # transformers >= 5.20 on the torch path: packed sequences are refused
        result["error"] = f"{type(exc).__name__}: {exc}"[:300]
    result["events"] = [e["message"] for e in events if e.get("type") in ("status", "warning", "error")][-12:]
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
