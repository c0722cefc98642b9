"""The one check child, run by path (a bad build can crash it: a wrong tilelang/apache-tvm-ffi pair aborts the
importing process, a wrong-arch build segfaults); torch and the kernels only, nothing of the package.

`python check_child.py '<kernels JSON>'`: per kernel its import, its numeric checks (seeded inputs of the pins'
shapes, the kernel's forward and backward against plain float32 torch written from the packages' own references),
then its decision's gated-delta-rule check and JIT warm-up. `python check_child.py smoke`: `doctor --smoke`.
Every result is a JSON line after MARK, printed as soon as it is known: a crash names the kernel it happened in.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time

MARK = "FASTPATH_HOOKS_CHECK "
OUTPUT_TOL = 2e-2   # doctor --smoke: bf16 rounds ~4e-3 per element; the chunked kernel re-associates sums
GRAD_TOL = 5e-2
TENSORS = ("o", "dq", "dk", "dv", "dbeta", "dg")


# -- references: plain torch, float32 --------------------------------------------------------

def conv_ref(x, weight, bias, activation):
    """causal_conv1d_ref (causal-conv1d's causal_conv1d_interface.py), in float32."""
    import torch.nn.functional as F

    dim, width = weight.shape
    out = F.conv1d(x.float(), weight.float().unsqueeze(1), None if bias is None else bias.float(),
                   padding=width - 1, groups=dim)[..., : x.shape[-1]]
    return F.silu(out) if activation else out


def conv_update_ref(x, conv_state, weight, bias, activation):
    """causal_conv1d_update_ref without cache_seqlens: (out, the new conv_state), float32."""
    import torch
    import torch.nn.functional as F

    state_len = conv_state.shape[-1]
    x_new = torch.cat([conv_state.float(), x.float().unsqueeze(-1)], dim=-1)
    out = F.conv1d(x_new, weight.float().unsqueeze(1), None if bias is None else bias.float(), padding=0,
                   groups=weight.shape[0])[:, :, -1]
    return (F.silu(out) if activation else out), x_new[:, :, -state_len:]


def ssd_ref(x, dt, A, B, C, D, dt_bias):
    """Mamba-2's scan as the recurrence it computes (mamba-ssm's ssd_minimal / selective_state_update_ref,
    step by step), float32: x (b,l,h,p), dt (b,l,h), A (h), B/C (b,l,g,n), D (h) -> y (b,l,h,p), state (b,h,p,n)."""
    import torch
    import torch.nn.functional as F

    b, l, h, p = x.shape
    g = B.shape[2]
    xf = x.float()
    dtf = F.softplus(dt.float() + dt_bias.float())
    Bf = B.float().repeat_interleave(h // g, dim=2)
    Cf = C.float().repeat_interleave(h // g, dim=2)
    state = xf.new_zeros(b, h, p, B.shape[3])
    ys = []
    for t in range(l):
        dA = torch.exp(dtf[:, t] * A.float())                                   # (b,h)
        state = state * dA[..., None, None] + (dtf[:, t][..., None] * xf[:, t])[..., None] * Bf[:, t][:, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", state, Cf[:, t]))
    y = torch.stack(ys, dim=1) + D.float()[:, None] * xf
    return y, state


def state_update_ref(state, x, dt, A, B, C, D, z, dt_bias):
    """selective_state_update_ref (mamba-ssm), with heads, float32: (out, the new state)."""
    import torch
    import torch.nn.functional as F

    h, g = state.shape[1], B.shape[1]
    dtf = F.softplus(dt.float() + dt_bias.float())                                # (b,h,p)
    dA = torch.exp(dtf[..., None] * A.float())                                  # (b,h,p,n)
    Bf = B.float().repeat_interleave(h // g, dim=1)
    Cf = C.float().repeat_interleave(h // g, dim=1)
    new = state.float() * dA + (dtf * x.float())[..., None] * Bf[:, :, None, :]
    out = torch.einsum("bhpn,bhn->bhp", new, Cf) + D.float() * x.float()
    return out * F.silu(z.float()), new


def selective_scan_ref(u, delta, A, B, C, D, z, delta_bias):
    """selective_scan_ref (mamba-ssm's selective_scan_interface.py), variable B/C, float32: (out, last state)."""
    import torch
    import torch.nn.functional as F

    uf = u.float()
    df = F.softplus(delta.float() + delta_bias.float()[..., None])              # (b,d,l)
    b, d, l = uf.shape
    state = uf.new_zeros(b, d, A.shape[1])
    ys = []
    for t in range(l):
        dA = torch.exp(df[:, :, t, None] * A.float())
        state = state * dA + df[:, :, t, None] * B.float()[:, None, :, t] * uf[:, :, t, None]
        ys.append((state * C.float()[:, None, :, t]).sum(-1))
    y = torch.stack(ys, dim=2) + uf * D.float()[:, None]
    return y * F.silu(z.float()), state


def gdr_ref(q, k, v, g, beta):
    """The gated delta rule as a float32 recurrence (fla's naive_recurrent_gated_delta_rule) with the q/k
    l2-norm the kernel is asked to do and fla's default scale K^-0.5; value heads grouped over key heads
    (GVA: value head i reads key head i // (value heads / key heads)): (o, final state)."""
    import torch
    import torch.nn.functional as F

    q = F.normalize(q.float(), p=2, dim=-1)
    k = F.normalize(k.float(), p=2, dim=-1)
    v, g, beta = v.float(), g.float(), beta.float()
    B, T, H, K = k.shape
    if v.shape[2] != H:
        q = q.repeat_interleave(v.shape[2] // H, dim=2)
        k = k.repeat_interleave(v.shape[2] // H, dim=2)
    q = q * K ** -0.5
    h = q.new_zeros(B, v.shape[2], K, v.shape[-1])
    outs = []
    for t in range(T):
        h = h * g[:, t].exp()[..., None, None]
        delta = (v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], h)) * beta[:, t][..., None]
        h = h + k[:, t][..., None] * delta[..., None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], h))
    return torch.stack(outs, dim=1), h


def attention_ref(q, k, v, causal: bool):
    """Attention as torch computes it: scaled_dot_product_attention in float32, (batch, seq, heads, dim) in and
    out, the key/value heads grouped over the query heads (GQA), causal aligned to the top left (equal lengths)."""
    import torch.nn.functional as F

    q, k, v = (x.float().transpose(1, 2) for x in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1]).transpose(1, 2)


# -- the checks: inputs, the kernel's call, the reference's --------------------------------------

def _leaf(t):
    return t.detach().clone().requires_grad_(True)


def _backward(backward: bool, pairs, out, ref, names, leaves, refs) -> list:
    """`pairs` and, where asked, after one backward of both with the same random gradient, each leaf's gradient."""
    import torch

    if not backward:
        return pairs
    grad = torch.randn_like(ref)
    out.backward(grad.to(out.dtype))
    ref.backward(grad)
    return pairs + [(name, a.grad, r.grad) for name, a, r in zip(names, leaves, refs)]


def _conv(fn, s, opt, dtype, device, backward):
    import torch

    b, d, l, w = s["batch"], s["dim"], s["seqlen"], s["width"]
    if opt.get("channel_last"):
        x = torch.randn(b, l, d, device=device, dtype=dtype).transpose(1, 2)
    else:
        x = torch.randn(b, d, l, device=device, dtype=dtype)
    x = x.detach().requires_grad_(backward)
    weight = torch.randn(d, w, device=device, dtype=dtype).requires_grad_(backward)
    bias = torch.randn(d, device=device, dtype=dtype).requires_grad_(backward)
    out = fn(x, weight, bias, activation="silu")
    refs = [_leaf(t) for t in (x, weight, bias)]
    ref = conv_ref(*refs, True)
    return _backward(backward, [("forward", out, ref)], out, ref, ("dx", "dweight", "dbias"), (x, weight, bias), refs)


def _conv_update(fn, s, opt, dtype, device, backward):
    import torch

    b, d, w = s["batch"], s["dim"], s["width"]
    x = torch.randn(b, d, device=device, dtype=dtype)
    conv_state = torch.randn(b, d, s.get("state_len", w), device=device, dtype=dtype)
    weight = torch.randn(d, w, device=device, dtype=dtype)
    bias = torch.randn(d, device=device, dtype=dtype)
    ref, ref_state = conv_update_ref(x, conv_state.clone(), weight, bias, True)
    out = fn(x, conv_state, weight, bias, activation="silu")   # updates conv_state in place
    return [("forward", out, ref), ("conv_state", conv_state, ref_state)]


def _ssd(fn, s, opt, dtype, device, backward):
    import torch

    b, l, h, p, g, n = s["batch"], s["seqlen"], s["nheads"], s["headdim"], s["ngroups"], s["dstate"]
    x = torch.randn(b, l, h, p, device=device, dtype=dtype)
    dt = torch.randn(b, l, h, device=device, dtype=dtype)
    A = -torch.exp(torch.rand(h, device=device, dtype=torch.float32))
    B = torch.randn(b, l, g, n, device=device, dtype=dtype) / 4
    C = torch.randn(b, l, g, n, device=device, dtype=dtype) / 4
    D = torch.randn(h, device=device, dtype=torch.float32)
    dt_bias = torch.rand(h, device=device, dtype=torch.float32) - 4.0
    leaves = [t.requires_grad_(backward) for t in (x, dt, A, B, C, D, dt_bias)]
    y, state = fn(x, dt, A, B, C, s["chunk_size"], D=D, dt_bias=dt_bias, dt_softplus=True, return_final_states=True)
    refs = [_leaf(t) for t in leaves]
    ry, rstate = ssd_ref(*refs)
    return _backward(backward, [("forward", y, ry), ("final_states", state, rstate)], y, ry,
                     ("dx", "ddt", "dA", "dB", "dC", "dD", "ddt_bias"), leaves, refs)


def _state_update(fn, s, opt, dtype, device, backward):
    import torch

    b, h, p, g, n = s["batch"], s["nheads"], s["headdim"], s["ngroups"], s["dstate"]
    state = torch.randn(b, h, p, n, device=device, dtype=dtype)
    x = torch.randn(b, h, p, device=device, dtype=dtype)
    dt = torch.randn(b, h, device=device, dtype=dtype)[..., None].expand(b, h, p)       # tied over headdim,
    dt_bias = (torch.rand(h, device=device) - 4.0)[:, None].expand(h, p)               # as transformers' Mamba-2
    A = (-torch.rand(h, device=device) - 1.0)[:, None, None].expand(h, p, n)
    B = torch.randn(b, g, n, device=device, dtype=dtype)
    C = torch.randn(b, g, n, device=device, dtype=dtype)
    D = torch.randn(h, device=device)[:, None].expand(h, p)
    z = torch.randn(b, h, p, device=device, dtype=dtype)
    ref, ref_state = state_update_ref(state.clone(), x, dt, A, B, C, D, z, dt_bias)
    out = fn(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=True)    # updates state in place
    return [("forward", out, ref), ("state", state, ref_state)]


def _selective_scan(fn, s, opt, dtype, device, backward):
    import torch

    b, d, n, l = s["batch"], s["dim"], s["dstate"], s["seqlen"]
    u = torch.randn(b, d, l, device=device, dtype=dtype)
    delta = 0.5 * torch.rand(b, d, l, device=device, dtype=dtype)
    A = -0.5 * torch.rand(d, n, device=device, dtype=torch.float32)
    B = torch.randn(b, n, l, device=device, dtype=dtype)
    C = torch.randn(b, n, l, device=device, dtype=dtype)
    D = torch.randn(d, device=device, dtype=torch.float32)
    z = torch.randn(b, d, l, device=device, dtype=dtype)
    delta_bias = 0.5 * torch.rand(d, device=device, dtype=torch.float32)
    leaves = [t.requires_grad_(backward) for t in (u, delta, A, B, C, D, z, delta_bias)]
    out, last = fn(u, delta, A, B, C, D, z=z, delta_bias=delta_bias, delta_softplus=True, return_last_state=True)
    refs = [_leaf(t) for t in leaves]
    ref, ref_last = selective_scan_ref(*refs)
    return _backward(backward, [("forward", out, ref), ("last_state", last, ref_last)], out, ref,
                     ("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias"), leaves, refs)


def _gdr(fn, s, opt, dtype, device, backward):
    import torch
    import torch.nn.functional as F

    b, t, h, d = s["batch"], s["seqlen"], s["heads"], s["head_dim"]
    q = torch.rand(b, t, h, d, device=device, dtype=dtype)
    k = torch.rand(b, t, h, d, device=device, dtype=dtype)
    v = torch.rand(b, t, h, d, device=device, dtype=dtype)
    g = F.logsigmoid(torch.rand(b, t, h, device=device, dtype=torch.float32))
    beta = torch.rand(b, t, h, device=device, dtype=torch.float32).sigmoid()
    leaves = [x.requires_grad_(backward) for x in (q, k, v, g, beta)]
    o, ht = fn(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
    refs = [_leaf(x) for x in leaves]
    ro, rht = gdr_ref(*refs)
    pairs = [("forward", o, ro), ("final_state", ht, rht)]
    if backward:
        do, dht = torch.randn_like(ro), torch.randn_like(rht)
        ((o.float() * do).sum() + (ht.float() * dht).sum()).backward()   # the state's backward too (fla PR #1262)
        ((ro * do).sum() + (rht * dht).sum()).backward()
        for name, a, r in zip(("dq", "dk", "dv", "dg", "dbeta"), leaves, refs):
            pairs.append((name, a.grad, r.grad))
    return pairs


def _attention(fn, s, opt, dtype, device, backward):
    """flash_attn_func / flash_attn_varlen_func (FA2's and FA3's, the same call): causal, GQA; `varlen`: each row
    packed as two documents of unequal length, cu_seqlens naming them, each document attending to itself only."""
    import torch

    b, t, h, hk, d = s["batch"], s["seqlen"], s["heads"], s["kv_heads"], s["head_dim"]
    causal = bool(opt.get("causal", True))
    q = torch.randn(b, t, h, d, device=device, dtype=dtype)
    k = torch.randn(b, t, hk, d, device=device, dtype=dtype)
    v = torch.randn(b, t, hk, d, device=device, dtype=dtype)
    leaves = [x.requires_grad_(backward) for x in (q, k, v)]
    refs = [_leaf(x) for x in leaves]
    if opt.get("varlen"):
        cut = max(1, t // 3)
        bounds = [(r * t + a, r * t + e) for r in range(b) for a, e in ((0, cut), (cut, t))]
        cu = torch.tensor([0] + [e for _, e in bounds], dtype=torch.int32, device=device)
        longest = max(e - a for a, e in bounds)
        out = fn(q.reshape(b * t, h, d), k.reshape(b * t, hk, d), v.reshape(b * t, hk, d), cu, cu, longest, longest,
                 causal=causal)
        out = (out[0] if isinstance(out, tuple) else out).reshape(b, t, h, d)
        flat = [x.reshape(1, b * t, *x.shape[2:]) for x in refs]
        ref = torch.cat([attention_ref(*(x[:, a:e] for x in flat), causal) for a, e in bounds], dim=1).reshape(b, t, h, d)
    else:
        out = fn(q, k, v, causal=causal)
        out = out[0] if isinstance(out, tuple) else out
        ref = attention_ref(*refs, causal)
    return _backward(backward, [("forward", out, ref)], out, ref, ("dq", "dk", "dv"), leaves, refs)


REFERENCES = {"attention": _attention, "causal_conv1d": _conv, "causal_conv1d_update": _conv_update, "ssd": _ssd,
              "selective_state_update": _state_update, "selective_scan": _selective_scan, "gated_delta_rule": _gdr}


# -- comparing -------------------------------------------------------------------------------

def compare(name, out, ref, tol) -> dict:
    """Figures of one tensor against its reference, and whether they are within `tol`."""
    import torch

    if out is None or ref is None:
        return {"tensor": name, "ok": False, "why": "no value (no gradient)" if out is None else "no reference"}
    a, r = out.detach().float(), ref.detach().float()
    if a.shape != r.shape:
        return {"tensor": name, "ok": False, "why": f"shape {tuple(a.shape)}, torch's {tuple(r.shape)}"}
    if not torch.isfinite(a).all():
        return {"tensor": name, "ok": False, "why": "not finite (nan or inf)"}
    diff = (a - r).abs()
    max_abs = diff.max().item() if diff.numel() else 0.0
    ratio = ((a - r).square().mean().sqrt() / (r.square().mean().sqrt() + 1e-8)).item() if diff.numel() else 0.0
    ok, why = True, ""
    if "atol" in tol and "rtol" in tol:
        excess = (diff - (tol["atol"] + tol["rtol"] * r.abs())).max().item() if diff.numel() else 0.0
        if excess > 0:   # the tolerance as torch.allclose reads it: atol + rtol * |torch's|
            ok, why = False, f"differs from torch by {max_abs:.2g} (tolerance {tol['atol']:g} + {tol['rtol']:.0%})"
    if ok and "ratio" in tol and ratio > tol["ratio"]:
        ok, why = False, f"differs from torch by {max_abs:.2g}, relative error {ratio:.2g} (tolerance {tol['ratio']:g})"
    return {"tensor": name, "ok": ok, "why": why, "max_abs": max_abs, "ratio": ratio}


def _attribute(item: str):
    modname, _, attr = item.partition(":")
    obj = importlib.import_module(modname)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _function(check: dict):
    """`module:attribute`, or the layer of a hub kernel loaded through HF kernels as transformers' kernelize
    loads it (LOCAL_KERNELS, the cache, the hub); a hub kernel without a layer: its module's function."""
    hub = check.get("hub")
    if not hub:
        return _attribute(check["function"])
    import kernels

    module = kernels.get_kernel(hub["repo"], version=hub.get("version"),
                                revision=None if hub.get("version") else hub.get("revision"),
                                check_arch=bool(check.get("check_arch")))
    if not hub.get("layer"):
        return getattr(module, check["function"].rpartition(":")[2])
    layer = getattr(module.layers, hub["layer"])
    instance = layer()
    return lambda *args, **kwargs: layer.forward(instance, *args, **kwargs)


def _first_line(exc) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def run_check(check: dict, device: str) -> dict:
    import torch

    start = time.monotonic()
    out = {"name": check["name"], "function": check["function"]}
    for module in check.get("requires", ()):
        try:
            importlib.import_module(module)
        except Exception as exc:   # noqa: BLE001 - a build without it: nothing of this check can run
            out.update(state="skipped", why=f"{module} does not import ({type(exc).__name__})")
            return out
    try:
        fn = _function(check)
    except Exception as exc:   # noqa: BLE001 - the import check passed: this is the function's own module
        out.update(state="error", why=f"does not import: {type(exc).__name__}: {exc}"[:300])
        return out
    torch.manual_seed(0)
    try:
        pairs = REFERENCES[check["reference"]](fn, check["shapes"], check.get("options", {}),
                                               getattr(torch, check["dtype"]), device, check["backward"])
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:   # noqa: BLE001 - a kernel that raises (no code for this GPU...) fails its check
        out.update(state="error", why=f"raised {_first_line(exc)}"[:300])
        return out
    results = [compare(name, a, r, check["backward_tolerance"] if name.startswith("d") and
                       check.get("backward_tolerance") else check["tolerance"]) for name, a, r in pairs]
    bad = [r for r in results if not r["ok"]]
    out.update(state="mismatch" if bad else "ok", tensors=results, seconds=round(time.monotonic() - start, 3),
               max_abs=max((r.get("max_abs", 0.0) for r in results), default=0.0))
    if bad:
        out["why"] = f"{bad[0]['tensor']} {bad[0]['why']}"
    return out


# -- the gated-delta-rule check and JIT warm-up --------------------------------------------------

def _inputs(torch, shape, seq: int, device: str, seed: int, dtype=None, varlen: bool = False) -> dict:
    hk, hv, dk, dv = shape
    dtype = dtype or torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*size):
        return torch.randn(*size, generator=gen, device=device)

    x = {"q": rnd(1, seq, hk, dk).to(dtype), "k": rnd(1, seq, hk, dk).to(dtype), "v": rnd(1, seq, hv, dv).to(dtype),
         # as transformers' Qwen3.5 / Qwen3-Next compute them: g = -exp(A_log) * softplus(...) in float32
         "g": -torch.nn.functional.softplus(rnd(1, seq, hv)).float() * 0.5,
         "beta": torch.sigmoid(rnd(1, seq, hv)).to(dtype), "do": rnd(1, seq, hv, dv).to(dtype)}
    if varlen:   # packed rows: two documents in the one row, as a collator's cu_seq_lens give them
        x["cu_seqlens"] = torch.tensor([0, seq // 2, seq], dtype=torch.int32, device=device)
    return x


def _rel(torch, a, b) -> float:
    a, b = a.float(), b.float()
    if not torch.isfinite(a).all():
        return float("inf")
    base = b.square().mean().sqrt().item()
    return (a - b).square().mean().sqrt().item() / (base if base > 0 else 1.0)


KEY_HEADS = ("q", "k", "dq", "dk")                                           # inputs and results, by head
VALUE_HEADS = ("v", "g", "beta", "do", "o", "dv", "dg", "dbeta")


def _heads(x: dict) -> tuple:
    """(key heads, value heads) the reference computes: heads are independent, so a few stand for all - the first
    key head and the value heads that read it (grouped value heads), or the first two where they are as many."""
    hk, hv = x["k"].shape[2], x["v"].shape[2]
    return (2, 2) if hk == hv and hk >= 2 else (1, max(1, hv // hk))


def _few(x: dict, heads: tuple) -> dict:
    """`x` (or a result) cut to the reference's heads."""
    hk, hv = heads
    return {n: (t[:, :, :hk] if n in KEY_HEADS else t[:, :, :hv] if n in VALUE_HEADS else t)
            if hasattr(t, "shape") and t.dim() >= 3 else t for n, t in x.items()}


def _reference(torch, x: dict) -> dict:
    """The float32 recurrence's output and gradients for `x` (each packed document on its own) - on the heads of
    _heads() only: its memory grows with the length, the kernel's check length must not (see _gdr_check)."""
    x = _few(x, _heads(x))
    leaves = {n: x[n].float().clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta")}
    cu = x.get("cu_seqlens")
    bounds = [0, leaves["q"].shape[1]] if cu is None else cu.tolist()
    outs = [gdr_ref(**{n: t[:, a:b] for n, t in leaves.items()})[0] for a, b in zip(bounds, bounds[1:])]
    ref = torch.cat(outs, dim=1)
    ref.backward(x["do"].float())
    return {"o": ref.detach(), **{f"d{n}": t.grad for n, t in leaves.items()}}


def _gdr_check(check: dict) -> dict:
    """One pass at the model's shapes, dtype and variant: where the training length is known (`tune_seq`), the
    served kernel runs at it first - Triton compiles and tunes there, into the caches the training reads -, then at
    `check_seq` against the float32 recurrence (nothing compiles again: T is not specialised). `jit` shares the
    compiling out (jit_share.py). A backend (`compare`) is also run against the served kernel's own path."""
    import torch

    from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # the served kernel's entry point

    served, kernel, check_seq, compare = check["served"], check.get("kernel"), check["check_seq"], check.get("compare")
    device = check.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, check.get("dtype") or "bfloat16")
    final, varlen = bool(check.get("final_state", True)), bool(check.get("varlen", False))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    calls = [0]
    if compare:
        module = importlib.import_module(compare["module"])
        original = getattr(module, compare["function"])

        def counted(*args, **kwargs):   # the served kernel looks the function up at each call: this one runs
            calls[0] += 1
            return original(*args, **kwargs)

        setattr(module, compare["function"], counted)

    def step(x: dict, on: bool) -> tuple:
        """The served kernel as training runs it (with its backends), or on its own path (every backend off)."""
        if not on:
            for var, off in check["own"].items():
                os.environ[var] = off
        elif compare:
            os.environ.pop(compare["switch"], None)
        leaves = {n: x[n].detach().clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta")}
        extra = {"cu_seqlens": x["cu_seqlens"]} if "cu_seqlens" in x else {}
        sync()
        start = time.perf_counter()
        out = chunk_gated_delta_rule(leaves["q"], leaves["k"], leaves["v"], g=leaves["g"], beta=leaves["beta"],
                                     use_qk_l2norm_in_kernel=True, output_final_state=final, **extra)
        out = out[0] if isinstance(out, tuple) else out
        out.backward(x["do"])
        sync()
        return {"o": out.detach(), **{f"d{n}": t.grad for n, t in leaves.items()}}, time.perf_counter() - start

    started = time.perf_counter()
    result = {"device": device, "served": served, "check_seq": check_seq, "tune_seq": check.get("tune_seq"),
              "shapes": check["shapes"], "dtype": str(dtype).replace("torch.", ""), "final_state": final,
              "varlen": varlen, "errors": {}, "first_call_s": {}}
    helpers = _share_jit(check, device)
    worst, failed = None, []
    tolerances = check.get("tolerances") or {}
    try:
        for i, shape in enumerate(check["shapes"]):
            tune = check.get("tune_seq")
            if tune and tune != check_seq and device != "cpu":   # compile and tune at the training length
                x = _inputs(torch, shape, tune, device, 99, dtype, varlen)
                result["first_call_s"][f"{served} {shape} T={tune}"] = round(step(x, bool(compare))[1], 3)
                del x
            x = _inputs(torch, shape, check_seq, device, 1234 + i, dtype, varlen)
            ref_t = _reference(torch, x)
            got, seconds = step(x, bool(compare))
            got = _few(got, _heads(x))
            result["first_call_s"].setdefault(f"{served} {shape}", round(seconds, 3))
            label = f"{kernel if compare else served} {shape}"
            mine = result["errors"][label] = {n: _rel(torch, t, ref_t[n]) for n, t in got.items()}
            own = None
            if compare:
                if calls[0] == 0:
                    return {**result, "status": "fail", "reason": f"{served} did not dispatch to {kernel} at "
                            f"K x V = {shape[2]} x {shape[3]} on {device} (its verifier sent the call to its own path)"}
                got_own, result["first_call_s"][f"own {shape}"] = step(x, False)
                got_own = _few(got_own, _heads(x))
                own = result["errors"][f"{served} {shape}"] = {n: _rel(torch, t, ref_t[n]) for n, t in got_own.items()}
            for name in TENSORS:
                error = mine.get(name, float("inf"))
                limit = max(tolerances.get(name, float("inf")), check.get("slack", 1.0) * own[name] if own else 0.0)
                if not error <= limit:
                    failed.append(f"{name} {error:.2e} > {limit:.2e}" if limit < float("inf")
                                  else f"{name} not finite")
                room = error / limit if limit and limit < float("inf") else 0.0
                if limit < float("inf") and (worst is None or room > worst["room"]):
                    worst = {"tensor": name, "error": error, "limit": limit, "room": room}
            del x
    except Exception as exc:   # its JIT (nvcc), its import: fla does not catch them - here they are the verdict
        return {**result, "status": "fail", "reason": f"{kernel or served} raised {_first_line(exc)}"[:400]}
    finally:
        _stop_share(helpers)
    if failed:
        return {**result, "status": "fail", "reason": f"at T={check_seq}: " + "; ".join(failed[:3])}
    return dict(result, worst=worst, seconds=time.perf_counter() - started, status="pass")


def _jit_module():
    """jit_share.py beside this file, loaded by path (the child imports nothing of the package)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jit_share.py")
    spec = importlib.util.spec_from_file_location("fastpath_hooks_jit_share", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _share_jit(check: dict, device: str) -> list:
    """The check's `jit` {"procs": K, "threads": M} on a GPU: K helper processes, M compile threads here."""
    jit = check.get("jit") or {}
    if device == "cpu" or not (jit.get("procs") or jit.get("threads")):
        return []
    share = _jit_module()
    share.patch_autotuner(threads=int(jit.get("threads") or 0))
    if not jit.get("procs"):
        return []
    helper = {k: v for k, v in check.items() if k != "jit"}
    return share.start_helpers(json.dumps(helper), int(jit["procs"]), os.path.abspath(__file__))


def _stop_share(helpers: list) -> None:
    if helpers:
        _jit_module().stop_helpers(helpers)


def share(check: dict, index: int, count: int) -> None:
    """A helper of the check's parallel JIT: the same pass, compiling only its share of each kernel's
    configurations (jit_share.py); its numbers are not looked at."""
    _jit_module().patch_autotuner(share=(index, count))
    try:
        _gdr_check({**check, "jit": None, "compare": None})
    except BaseException:   # noqa: BLE001 - a helper's failure only loses its share
        pass


def check_here(check: dict) -> dict:
    """The check in this process: its failure (a JIT / nvcc error, an import error) is its result."""
    try:
        return _gdr_check(check)
    except BaseException as exc:   # noqa: BLE001
        return {"status": "fail", "reason": _first_line(exc)[:400]}


def smoke(seq: int = 256, heads: int = 4, dim: int = 64) -> dict:
    """`doctor --smoke`: fla's kernel on its own path in bf16 on the GPU against the float32 reference."""
    import torch

    if not torch.cuda.is_available():
        return {"status": "skipped", "reason": "no CUDA device visible to torch"}
    shape = [heads, heads, dim, dim]
    result = check_here({"served": "fla", "kernel": "fla", "check_seq": seq, "shapes": [shape], "own": {},
                         "seqs": [], "device": "cuda"})
    if result["status"] != "pass":
        return {"status": "fail", "reason": result["reason"]}
    errors = result["errors"][f"fla {shape}"]
    failed = [n for n, e in errors.items() if not e <= (OUTPUT_TOL if n == "o" else GRAD_TOL)]

    def version(name):
        try:
            return getattr(importlib.import_module(name), "__version__", "?")
        except Exception:   # noqa: BLE001
            return None

    return {"status": "fail" if failed else "pass", "errors": errors, "failed": failed,
            "tolerances": {"output": OUTPUT_TOL, "gradients": GRAD_TOL},
            "shape": {"B": 1, "T": seq, "H": heads, "K": dim},
            "fla": version("fla"), "triton": version("triton"), "tilelang": version("tilelang"),
            "gpu": torch.cuda.get_device_name(), "capability": "sm_%d%d" % torch.cuda.get_device_capability()}


def _say(item: dict) -> None:
    sys.stdout.write("\n" + MARK + json.dumps(item) + "\n")
    sys.stdout.flush()


def check_kernels(specs: list) -> None:
    """Each kernel (a kernel after those it imports): its import, then where asked its numeric checks (`numeric`),
    then its gated-delta-rule check (`gdr`); a phase line before each check names what a crash happened in."""
    for i, spec in enumerate(specs):
        out = {"index": i, "ok": True, "error": None}
        start = time.monotonic()
        try:
            for name in spec["modules"]:
                importlib.import_module(name)
            for item in spec["attributes"]:
                if not callable(_attribute(item)):
                    raise TypeError(f"{item} is not callable")
        except BaseException as exc:   # noqa: BLE001 - the verdict on this kernel
            out.update(ok=False, error=f"{type(exc).__name__}: {exc}", origin=_origin(spec["modules"]))
        out["seconds"] = round(time.monotonic() - start, 3)
        if out["ok"] and spec.get("numeric"):
            _say({"index": i, "phase": "numeric"})
            payload, results, began = spec["numeric"], [], time.monotonic()
            try:
                for check in payload["checks"]:
                    results.append(run_check(check, payload["device"]))
                out["numeric"] = {"ok": True, "results": results}
            except BaseException as exc:   # noqa: BLE001 - a device that is not there
                out["numeric"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:400], "results": results}
            out["numeric_seconds"] = round(time.monotonic() - began, 3)
        numbers_ok = "numeric" not in out or (out["numeric"]["ok"] and not any(
            r.get("state") in ("mismatch", "error") for r in out["numeric"]["results"]))
        if out["ok"] and numbers_ok and spec.get("gdr"):
            _say({"index": i, "phase": "gdr"})
            saved = dict(os.environ)   # the check switches the kernel's backends
            try:
                out["gdr"] = check_here(spec["gdr"])
            finally:
                os.environ.clear()
                os.environ.update(saved)
        _say(out)
    _say({"loaded": _loaded()})


def _origin(modules) -> str | None:
    """Where the kernel's top-level package was imported from (its directory, or its file), if it was: an `fla/`
    earlier on sys.path than the installed one shadows it (the parent names it)."""
    module = sys.modules.get(modules[0].split(".")[0]) if modules else None
    where = getattr(module, "__file__", None)
    if where:
        return os.path.dirname(where) if os.path.basename(where).startswith("__init__.") else where
    paths = list(getattr(module, "__path__", None) or ())   # a namespace package: a directory without __init__
    return paths[0] if paths else None


def _loaded() -> dict:
    """The distributions whose modules these imports loaded (act/store.py keys the memory on them)."""
    try:
        import importlib.metadata as md

        tops = {name.split(".")[0] for name, mod in list(sys.modules.items()) if getattr(mod, "__file__", None)}
        owners = md.packages_distributions()
        return {dist: md.version(dist) for top in sorted(tops) for dist in owners.get(top, ())}
    except Exception:   # noqa: BLE001 - only the memory's key is lost: a check next time
        return {}


def main(argv) -> None:
    sys.path[0] = ""   # as under `python -c`: this script's directory (act/) is no place to import kernels from
    if argv[1:2] == ["share"]:
        share(json.loads(argv[2]), int(argv[3]), int(argv[4]))
        return
    if argv[1:] == ["smoke"]:
        try:
            _say(smoke())
        except Exception as exc:   # noqa: BLE001 - report, do not traceback
            _say({"status": "fail", "reason": f"{type(exc).__name__}: {exc}"})
        return
    check_kernels(json.loads(argv[1]))


if __name__ == "__main__":
    main(sys.argv)
