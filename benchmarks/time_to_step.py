"""Issue 33's time to the first training step: a training script as a user writes it (`fastpath_hooks.install()`
first, or nothing: the by-hand baseline), the model built from its config, steps of forward + loss + backward +
AdamW; the seconds from the script's start to the end of its first step. benchmarks/h200_time_to_step.sh runs
the cases (cold node, later environment, by hand) and writes the summary.

    python benchmarks/time_to_step.py case --model qwen3_5 --via install --out case.json   # one fresh process
    python benchmarks/time_to_step.py summary case*.json --out summary.json
    python benchmarks/time_to_step.py case --model qwen3_5 --via none --device cpu --tiny --seq 64 --out x.json
                                                                                      # checks the script on a CPU

The clock starts at $BENCH_T0 (epoch seconds, set by the caller just before the interpreter starts), else at
this file's first line. Models: benchmarks/era_d.py's tiny Qwen3.5 and Granite-4.0-H (hidden 2048, 3 linear /
Mamba-2 + 1 attention layers), random init, bf16, batch 1. `installed`: the distributions in the environment's
own site-packages (not the image's), fastpath-hooks and pip left out.
"""

import time

T0 = time.perf_counter()
WALL0 = time.time()

import argparse  # noqa: E402  (after the clock)
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# issue 39's targets: seconds to the first step's end - against the by-hand case of the same run (x 1.00, + 3 s),
# or absolute
TARGETS = {"qwen3_5-cold": ("qwen3_5-by-hand-cold", 1.0, 0.0), "qwen3_5-later": ("qwen3_5-by-hand-later", 1.0, 3.0),
           "granitemoehybrid-cold": (None, 0.0, 200.0), "granitemoehybrid-later": (None, 0.0, 30.0)}


def _since_start() -> float:
    given = os.environ.get("BENCH_T0")
    return time.time() - float(given) if given else time.perf_counter() - T0


def _installed() -> list:
    """name==version of the distributions in this environment's own site-packages."""
    import sysconfig
    from importlib import metadata

    own = os.path.realpath(sysconfig.get_path("purelib"))
    names = set()
    for dist in metadata.distributions():
        path = getattr(dist, "_path", None)
        if path is None or os.path.realpath(os.path.dirname(str(path))) != own:
            continue
        name = dist.metadata["Name"]
        if name and name.lower().replace("_", "-") not in ("fastpath-hooks", "pip"):
            names.add(f"{name}=={dist.version}")
    return sorted(names, key=str.lower)


def case(args) -> dict:
    out = {"model": args.model, "via": args.via, "seq": args.seq, "error": None}
    events = []
    if args.via == "install":
        import fastpath_hooks

        fastpath_hooks.install(on_event=lambda e: events.append(
            {"t": round(_since_start(), 1), "type": e.get("type"), "message": e.get("message")}))
        out["install_returned_s"] = round(_since_start(), 2)
    sys.path.insert(0, HERE)
    import era_d   # the models' configs and what serves each kernel function
    import torch
    from transformers import AutoModelForCausalLM

    cuda = args.device == "cuda"
    try:
        torch.manual_seed(0)
        config = era_d.model_config(args.model, args.tiny)
        out["imported_s"] = round(_since_start(), 2)   # python, torch, transformers (and fastpath-hooks)
        AutoModelForCausalLM._model_mapping[type(config)]   # the modeling import: kernels asked for, installed, built
        out["modeling_imported_s"] = round(_since_start(), 2)
        model = AutoModelForCausalLM.from_config(config)
        out["model_built_s"] = round(_since_start(), 2)
        model = model.to(args.device, torch.bfloat16 if cuda else torch.float32).train()
        out["on_device_s"] = round(_since_start(), 2)
        losses, times = era_d.train_steps(model, args.device, args.seq, args.steps,
                                          lambda: out.update(first_step_done_s=round(_since_start(), 2)))
        losses = [round(x, 5) for x in losses]
        out.update(step_s=times, losses=losses, first_step_s=times[0],
                   step_ms=round(1000 * statistics.median(times[1:] or times), 1))
        held = [o.first_call for o in (sys.modules["fastpath_hooks"].engine.outcomes().values()
                                       if "fastpath_hooks" in sys.modules else ()) if getattr(o, "first_call", None)]
        out["first_calls"] = [r for h in held for r in h.ran]   # the checks the kernels' first calls waited for
        try:   # (the example imports fastpath_hooks, which the by-hand environment lacks: no report there)
            sys.path.insert(0, os.path.join(HERE, "..", "examples"))
            from train_tiny_qwen3_5 import resolved_kernels

            out["kernels"] = era_d._kernels(model, resolved_kernels)
        except Exception as exc:   # the report of what served, not the case
            out["kernels"] = f"not read: {type(exc).__name__}: {exc}"
    except Exception as exc:   # the model's import (an install), the load or a step: the case's result
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        out["error"] = f"{type(exc).__name__}: {text}"[:400]
    out["installed"] = _installed()
    out["events"] = events
    out["versions"] = {"torch": torch.__version__, "python": sys.version.split()[0],
                       "transformers": sys.modules["transformers"].__version__,
                       "fastpath_hooks": getattr(sys.modules.get("fastpath_hooks"), "__version__", None)}
    out["env"] = {k: os.environ.get(k) for k in ("HOME", "FASTPATH_HOOKS_CACHE_DIR", "FASTPATH_HOOKS_DISABLE",
                                                 "TRITON_CACHE_DIR", "TILELANG_CACHE_DIR") if os.environ.get(k)}
    return out


PHASE_LINES = (("build_s", r"built for sm_\d+ in ([\d.]+) s"), ("check_s", r"gated-delta-rule check: .*, ([\d.]+) s$"),
               ("install_s", r"installed .* in ([\d.]+) s with"))


def phases(c: dict) -> dict:
    """Seconds per phase from the script's start: imports, the modeling import (kernels installed, built, checked:
    from the lines, which overlap), the model's build and move to the GPU, the first step (with the wait of a
    kernel's first call for its check), and for by hand the pip install before the script."""
    import re

    def span(a, b):
        return None if c.get(a) is None or c.get(b) is None else round(c[b] - c[a], 2)

    out = {"pip_install_s": (c.get("setup_s") or {}).get("pip_install_kernels_s"), "imports_s": c.get("imported_s"),
           "modeling_import_s": span("imported_s", "modeling_imported_s"),
           "model_build_s": span("modeling_imported_s", "model_built_s"),
           "to_device_s": span("model_built_s", "on_device_s"),
           "first_step_s": c.get("first_step_s"),
           "first_call_wait_s": round(sum(r.get("waited_s") or 0 for r in c.get("first_calls") or ()), 2)}
    for name, pattern in PHASE_LINES:   # per kernel, as its lines say (they overlap: a build beside the checks)
        found = {}
        for e in c.get("events", []):
            m = re.search(pattern, e.get("message") or "")
            if m and e.get("message", "").split(":")[0] not in found:
                found[e["message"].split(":")[0].replace("verified ", "")] = float(m.group(1))
        out[name] = found
    return {k: v for k, v in out.items() if v not in (None, {})}


def summary(files: list) -> dict:
    cases = []
    for path in files:
        with open(path) as fh:
            c = json.load(fh)
        setup = c.get("setup_s") or {}
        by_hand = c.get("via") == "none"
        done = c.get("first_step_done_s")
        # by hand, the user's pip install of the kernels is part of the time to the first step (issue 33's 127.2 s)
        total = None if done is None else round(done + (setup.get("pip_install_kernels_s", 0) if by_hand else 0), 2)
        row = {"case": c.get("case"), "first_step_done_s": total, "step_ms": c.get("step_ms"),
               "installed": c.get("installed"), "script_first_step_done_s": done,
               "first_step_s": c.get("first_step_s"), "setup_s": setup, "error": c.get("error"),
               "loss0": (c.get("losses") or [None])[0], "kernels": c.get("kernels"), "phases": phases(c),
               "transformers": (c.get("versions") or {}).get("transformers"), "seq": c.get("seq")}
        row["target"] = TARGETS.get(c.get("case") or "")
        row["lines"] = [f"{e['t']:>7.1f} s {e['message']}" for e in c.get("events", [])
                        if e.get("type") in ("status", "warning", "error")]
        cases.append(row)
    done = {r["case"]: r["first_step_done_s"] for r in cases}
    for row in cases:   # against the same run's by-hand case, where the target is relative
        target = row.pop("target")
        if target is None:
            continue
        base, times, plus = target
        if base is not None and done.get(base) is None:
            continue
        row["target_s"] = round((done[base] if base else 0.0) * times + plus, 2)
        row["target_met"] = row["first_step_done_s"] is not None and row["first_step_done_s"] <= row["target_s"]
    return {"cases": cases}


def table(rep: dict) -> str:
    lines = ["| case | first step done (s) | target | step (ms) | first step (s) | installed |",
             "|---|---|---|---|---|---|"]
    for r in rep["cases"]:
        target = f"<= {r['target_s']} s: {'met' if r['target_met'] else 'NOT met'}" if "target_s" in r else "-"
        first = r.get("first_step_s")
        lines.append(f"| {r['case']} | {r['first_step_done_s']} | {target} | {r['step_ms']} | "
                     f"{'-' if first is None else round(first, 2)} | {', '.join(r['installed'] or []) or '-'} |"
                     + (f" error: {r['error']}" if r.get("error") else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("case")
    c.add_argument("--model", choices=("qwen3_5", "granitemoehybrid"), required=True)
    c.add_argument("--via", choices=("install", "none"), required=True)
    c.add_argument("--name", help="the case's name in the summary (default: the --out file's stem)")
    c.add_argument("--setup", default="{}", help="JSON {what: seconds} done before this process (pip installs)")
    c.add_argument("--steps", type=int, default=6)
    c.add_argument("--seq", type=int, default=4096)
    c.add_argument("--device", default="cuda")
    c.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU check of the script)")
    c.add_argument("--out", required=True)
    s = sub.add_parser("summary")
    s.add_argument("files", nargs="+")
    s.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.cmd == "case":
        result = case(args)
        result["case"] = args.name or os.path.splitext(os.path.basename(args.out))[0]
        result["setup_s"] = json.loads(args.setup)
        print("RESULT " + json.dumps({k: result.get(k) for k in ("case", "first_step_done_s", "step_ms", "error",
                                                                "installed")}), flush=True)
    else:
        result = summary(args.files)
        print(table(result))
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    return 0 if args.cmd == "summary" or result.get("error") is None else 3


if __name__ == "__main__":
    sys.exit(main())
