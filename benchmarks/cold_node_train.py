"""The training script of benchmarks/cold_node.sh: a tiny Mamba-2 hybrid (granitemoehybrid, Mamba-2 mixers
and one attention layer) that calls `fastpath_hooks.install()` first, then imports the modeling module,
builds the model and runs training steps. It says when the kernels were ready.

    python benchmarks/cold_node_train.py --out env1.json            # on the GPU machine, in a fresh venv
    python benchmarks/cold_node_train.py --device cpu --out x.json   # checks the script (the torch path)

Times (seconds from the script's start, `time.perf_counter`):
- `install_s`: fastpath_hooks.install() returned;
- `ready_s`: the modeling module imported and the model built: transformers >= 5.15 imports
  causal_conv1d and mamba_ssm while its modeling module executes, so every install, build and
  verification is over by then (the first watched import is inside this interval);
- `first_step_s`: the first training step done (forward + backward + AdamW).
`kernels` says what every kernel-decorated global of the modeling module resolved to; `ready` is true
when none of the mamba/conv ones stayed on its torch function. `events` are fastpath-hooks' lines with
their times. The JSON goes to --out (and the last line printed starts with RESULT).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

T0 = time.perf_counter()
HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--out")
    args = p.parse_args()

    events = []

    def said(event):
        events.append({"t": round(time.perf_counter() - T0, 2), "type": event.get("type"),
                       "message": event.get("message")})

    import fastpath_hooks

    fastpath_hooks.install(on_event=said)
    install_s = time.perf_counter() - T0

    sys.path.insert(0, HERE)
    import mamba_hybrid   # build_config, resolved(): the same model family as the speed benchmark
    import torch
    from transformers import AutoModelForCausalLM

    shape = argparse.Namespace(hidden=256, layers=4, vocab=1024, mlp=512, head_dim=64, d_state=64, chunk=64)
    cfg = mamba_hybrid.build_config(shape)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    cuda = args.device == "cuda"
    model = model.to(args.device, torch.bfloat16 if cuda else torch.float32).train()
    ready_s = time.perf_counter() - T0
    kernels = mamba_hybrid.resolved(model)
    unresolved = mamba_hybrid.unresolved_kernels(kernels)

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, shape.vocab, (1, args.seq), generator=torch.Generator().manual_seed(1)).to(args.device)
    steps = []
    for _ in range(args.steps):
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        steps.append(round(time.perf_counter() - start, 4))
        if len(steps) == 1:
            first_step_s = time.perf_counter() - T0
    out = {"install_s": round(install_s, 2), "ready_s": round(ready_s, 2), "first_step_s": round(first_step_s, 2),
           "step_s": steps, "loss": float(loss.detach()), "ready": not unresolved, "unresolved": unresolved, "kernels": kernels,
           "torch": torch.__version__, "device": args.device, "events": events}
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=1)
    print("RESULT " + json.dumps({k: out[k] for k in ("install_s", "ready_s", "first_step_s", "ready", "unresolved")}),
          flush=True)
    return 0 if out["ready"] or args.device != "cuda" else 3


if __name__ == "__main__":
    sys.exit(main())
