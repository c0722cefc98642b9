"""What a wrapped transformers gate costs per call after its first query, vs the original.

    python benchmarks/gate_cost.py [--number 200000] [--repeat 7]

Issue 3: "later queries cost about what the original cached gate costs". Each case runs in
a fresh interpreter with the transformers and torch of the running environment, on this
machine as it is (no accelerator: the first query decides "skip", nothing is installed):

- original: `is_flash_linear_attention_available` / `is_causal_conv1d_available` as
  transformers defines them (lru_cache hits after the first call);
- wrapped: the same gates after `fastpath_hooks.install()`, as later callers find them in
  the module after the first query (the wrapper has stepped aside: the original is back);
- posed: FASTPATH_HOOKS_TARGET poses a GPU this machine lacks and FASTPATH_HOOKS_MODE=report
  (nothing is installed): every call lets the gate see the posed accelerator for its
  duration. Only dry runs and tests do this; shown for completeness.

Figures: the best of --repeat timeit runs of --number calls, in ns per call, and the
wrapped/original ratio. While a wrapper is in place (before the first query; blocked or
posed kernels) it adds one Python call (~100-150 ns here).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r'''
import json, sys, timeit
number, repeat, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if mode != "original":
    import fastpath_hooks
    fastpath_hooks.install()
from transformers.utils import import_utils
out = {"transformers": __import__("transformers").__version__}
for name in ("is_flash_linear_attention_available", "is_causal_conv1d_available"):
    gate = getattr(import_utils, name)
    out[name + ".wrapped"] = hasattr(gate, "_fastpath_hooks_original")
    out[name + ".answer"] = gate()          # the first query (the wrapper decides here)
    gate = getattr(import_utils, name)      # what later callers find in the module (the wrapper steps aside)
    out[name + ".stepped_aside"] = not hasattr(gate, "_fastpath_hooks_original")
    gate()
    best = min(timeit.repeat(gate, number=number, repeat=repeat))
    out[name] = best / number * 1e9
print(json.dumps(out))
'''


def run(mode: str, number: int, repeat: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPATH_HOOKS_")}
    env["FASTPATH_HOOKS_LOG"] = "off"
    if mode == "posed":
        env.update(FASTPATH_HOOKS_TARGET="gpu=sm_80,cuda=12.8,torch=2.10.0,triton=3.6.0", FASTPATH_HOOKS_MODE="report")
    proc = subprocess.run([sys.executable, "-c", CHILD, str(number), str(repeat), mode], capture_output=True, text=True,
                          env=env)
    if proc.returncode != 0:
        sys.exit(f"{mode}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    results = {mode: run(mode, args.number, args.repeat) for mode in ("original", "wrapped", "posed")}
    print(f"transformers {results['original']['transformers']}, python {sys.version.split()[0]}; "
          f"ns per call, best of {args.repeat} x {args.number:,d} calls")
    for gate in ("is_flash_linear_attention_available", "is_causal_conv1d_available"):
        original, wrapped, posed = (results[m][gate] for m in ("original", "wrapped", "posed"))
        assert results["wrapped"][gate + ".wrapped"] and not results["original"][gate + ".wrapped"]
        assert results["wrapped"][gate + ".answer"] == results["original"][gate + ".answer"]
        print(f"  {gate}")
        print(f"    original (lru_cache hit)  {original:8.1f} ns")
        aside = "stepped aside" if results["wrapped"][gate + ".stepped_aside"] else "still wrapped"
        print(f"    wrapped, after 1st query  {wrapped:8.1f} ns   ratio {wrapped / original:.2f}  (+{wrapped - original:.0f} ns; {aside})")
        print(f"    posed GPU (dry runs/tests){posed:8.1f} ns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
