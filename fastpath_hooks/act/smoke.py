"""`fastpath-hooks doctor --smoke`: the installed fla kernel against a torch reference.

Runs in a child process (a crashing kernel must not take the caller down): one
gated-delta-rule forward + backward with `fla.ops.gated_delta_rule.
chunk_gated_delta_rule` in bf16 on the GPU, and the same computation as a plain
float32 recurrence in torch on the same (bf16-rounded) inputs. Reported: the
relative error ||fla - ref|| / ||ref|| of the output and of every input gradient.

Tolerances (bf16 inputs and outputs, float32 reference): output <= 2e-2,
gradients <= 5e-2. bf16 itself carries ~4e-3 relative rounding per element; the
chunked kernel re-associates sums, so gradients drift further than outputs.
"""

from __future__ import annotations

import json
import sys

from .numeric_check import gdr_ref
from .runner import run

OUTPUT_TOL = 2e-2
GRAD_TOL = 5e-2
_MARK = "FASTPATH_HOOKS_SMOKE "


def _child(seq: int = 256, heads: int = 4, dim: int = 64) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"status": "skipped", "reason": "no CUDA device visible to torch"}
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as exc:
        return {"status": "fail", "reason": f"cannot import fla's chunk_gated_delta_rule: {type(exc).__name__}: {exc}"}
    device = "cuda"
    gen = torch.Generator(device=device).manual_seed(1234)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    B, T, H, K = 1, seq, heads, dim
    inputs = {
        "q": rnd(B, T, H, K).bfloat16(),
        "k": rnd(B, T, H, K).bfloat16(),
        "v": rnd(B, T, H, K).bfloat16(),
        "g": torch.nn.functional.logsigmoid(rnd(B, T, H)).bfloat16(),
        "beta": torch.sigmoid(rnd(B, T, H)).bfloat16(),
    }
    scale = K ** -0.5
    grad_out = rnd(B, T, H, K).bfloat16()
    fast_in = {n: t.clone().requires_grad_(True) for n, t in inputs.items()}
    ref_in = {n: t.float().clone().requires_grad_(True) for n, t in inputs.items()}
    try:
        out = chunk_gated_delta_rule(fast_in["q"], fast_in["k"], fast_in["v"], g=fast_in["g"], beta=fast_in["beta"],
                                     scale=scale, use_qk_l2norm_in_kernel=True)
        out = out[0] if isinstance(out, tuple) else out
        out.backward(grad_out)
        torch.cuda.synchronize()
    except Exception as exc:
        return {"status": "fail", "reason": f"fla forward/backward raised {type(exc).__name__}: {exc}"}
    ref, _ = gdr_ref(ref_in["q"], ref_in["k"], ref_in["v"], ref_in["g"], ref_in["beta"])   # scale: fla's default
    ref.backward(grad_out.float())

    def rel(a, b):
        a, b = a.float(), b.float()
        if not torch.isfinite(a).all():
            return float("inf")
        return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-12)).item()

    errors = {"output": rel(out, ref)}
    for name in inputs:
        errors[f"d{name}"] = rel(fast_in[name].grad, ref_in[name].grad)
    failed = [n for n, e in errors.items() if not e <= (OUTPUT_TOL if n == "output" else GRAD_TOL)]
    import fla

    info = {"fla": getattr(fla, "__version__", "?"), "gpu": torch.cuda.get_device_name(),
            "capability": "sm_%d%d" % torch.cuda.get_device_capability()}
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:
        pass
    try:
        import tilelang

        info["tilelang"] = getattr(tilelang, "__version__", "?")
    except Exception:
        info["tilelang"] = None
    return {"status": "fail" if failed else "pass", "errors": errors, "failed": failed,
            "tolerances": {"output": OUTPUT_TOL, "gradients": GRAD_TOL},
            "shape": {"B": B, "T": T, "H": H, "K": K}, **info}


def run_smoke(settings, env) -> dict:
    if env.accelerator != "cuda":
        return {"status": "skipped", "reason": f"needs a CUDA GPU (accelerator here: {env.accelerator or 'none'})"}

    ran = run([sys.executable, "-m", "fastpath_hooks.act.smoke"], timeout=settings.timeout, label="running the smoke test")
    if ran.timed_out:
        return {"status": "fail", "reason": f"did not finish within {settings.timeout:.0f} s"}
    for line in ran.output.splitlines():
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK):])
    tail = " | ".join(ln for ln in ran.output.strip().splitlines()[-3:])
    return {"status": "fail", "reason": f"the smoke process exited with {ran.code}: {tail}"}


def smoke_text(result: dict) -> str:
    if result.get("status") == "skipped":
        return f"Smoke test: skipped - {result.get('reason')}"
    if "errors" not in result:
        return f"Smoke test: FAIL - {result.get('reason')}"
    lines = [f"Smoke test: {result['status'].upper()} (fla {result.get('fla')}, triton {result.get('triton')}, "
             f"tilelang {result.get('tilelang')}, {result.get('gpu')} {result.get('capability')})",
             f"  relative error vs float32 torch reference (tolerance: output {OUTPUT_TOL}, gradients {GRAD_TOL}):"]
    for name, err in result["errors"].items():
        mark = "FAIL" if name in result.get("failed", []) else "ok"
        lines.append(f"    {name:<8}{err:.2e}  {mark}")
    return "\n".join(lines)


if __name__ == "__main__":
    try:
        result = _child()
    except Exception as exc:  # report, do not traceback
        result = {"status": "fail", "reason": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write("\n" + _MARK + json.dumps(result) + "\n")
