"""Call the five mamba-ssm functions transformers decorates on small CUDA tensors; compare each to a reference.

    python benchmarks/mamba_ops_check.py          # on a GPU, after mamba-ssm + causal-conv1d are installed

mamba_chunk_scan_combined, selective_state_update and selective_scan_fn are checked against a
plain sequential recurrence written here in float32 torch (independent of mamba-ssm's code);
mamba_split_conv1d_scan_combined and mamba_inner_fn against mamba-ssm's own references
(`*_ref`: unfused, causal_conv1d_fn for the convolution, selective_scan_fn for the scan - checked
above - and, for the first, mamba-ssm's Triton gated RMSNorm). The fused functions also run
backward. Prints one line per function (error relative to the reference's largest magnitude,
tolerance) and exits 1 on any failure. An argument `cpu` runs it on the CPU, which only makes
sense with the kernels swapped for their `*_ref` stand-ins (a check of the script itself).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F


def naive_ssd(x, dt, A, B, C, D):
    """Mamba-2 recurrence, one token at a time. x (b,l,h,p), dt (b,l,h) after softplus, A (h), B/C (b,l,g,n)."""
    b, l, h, p = x.shape
    g, n = B.shape[2:]
    B, C = B.repeat_interleave(h // g, dim=2), C.repeat_interleave(h // g, dim=2)
    state = x.new_zeros(b, h, p, n)
    ys = []
    for t in range(l):
        da = torch.exp(dt[:, t] * A)[:, :, None, None]
        state = state * da + (dt[:, t, :, None, None] * x[:, t, :, :, None]) * B[:, t, :, None, :]
        ys.append((state * C[:, t, :, None, :]).sum(-1) + D[None, :, None] * x[:, t])
    return torch.stack(ys, dim=1), state


def naive_selective_scan(u, delta, A, B, C, D):
    """Mamba-1 recurrence. u/delta (b,d,l) after softplus, A (d,n), B/C (b,n,l), D (d)."""
    b, d, l = u.shape
    state = u.new_zeros(b, d, A.shape[1])
    ys = []
    for t in range(l):
        state = state * torch.exp(delta[:, :, t, None] * A) + (delta[:, :, t] * u[:, :, t])[..., None] * B[:, None, :, t]
        ys.append((state * C[:, None, :, t]).sum(-1) + D * u[:, :, t])
    return torch.stack(ys, dim=-1)


def _strided8(t):
    """The same values in storage whose row stride is a multiple of 8: the reference passes a slice of it
    channel-last to causal_conv1d_fn, which requires that."""
    width = -(-t.shape[-1] // 8) * 8
    padded = t.new_zeros(*t.shape[:-1], width)
    padded[..., :t.shape[-1]] = t
    return padded[..., :t.shape[-1]]


def main() -> int:
    import mamba_ssm
    from mamba_ssm.ops.selective_scan_interface import mamba_inner_fn, mamba_inner_ref, selective_scan_fn
    from mamba_ssm.ops.triton.selective_state_update import selective_state_update
    from mamba_ssm.ops.triton.ssd_combined import (mamba_chunk_scan_combined, mamba_split_conv1d_scan_combined,
                                                   mamba_split_conv1d_scan_ref)

    dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"  # cpu: only with stand-ins for the kernels (a script check)
    torch.manual_seed(0)
    failures = []

    def report(name, got, ref, tol):
        """Max abs error relative to the reference's largest magnitude (Triton's dots run in TF32)."""
        err = (got.float() - ref.float()).abs().max().item()
        rel = err / max(ref.float().abs().max().item(), 1e-6)
        ok = rel <= tol and torch.isfinite(got).all().item()
        print(f"{'ok  ' if ok else 'FAIL'} {name:<34} max abs err {err:.2e}, relative {rel:.1e} (tol {tol:.0e})",
              flush=True)
        if not ok:
            failures.append(name)

    print(f"mamba_ssm {mamba_ssm.__version__} from {mamba_ssm.__file__}; torch {torch.__version__}; "
          f"{torch.cuda.get_device_name() if dev == 'cuda' else dev}", flush=True)

    # Mamba-2 chunked scan (Triton), against the sequential recurrence; then backward.
    b, l, h, p, g, n = 2, 192, 4, 32, 2, 16
    x = torch.randn(b, l, h, p, device=dev)
    dt_raw = torch.randn(b, l, h, device=dev) - 1
    dt_bias = torch.rand(h, device=dev) * 0.5
    A = -torch.rand(h, device=dev) - 0.5
    B, C = torch.randn(b, l, g, n, device=dev), torch.randn(b, l, g, n, device=dev)
    D = torch.randn(h, device=dev)
    y = mamba_chunk_scan_combined(x, dt_raw, A, B, C, chunk_size=64, D=D, dt_bias=dt_bias, dt_softplus=True)
    y_ref, last = naive_ssd(x, F.softplus(dt_raw + dt_bias), A, B, C, D)
    report("mamba_chunk_scan_combined", y, y_ref, 1e-2)
    xg = x.clone().requires_grad_()
    mamba_chunk_scan_combined(xg, dt_raw, A, B, C, chunk_size=64, D=D, dt_bias=dt_bias, dt_softplus=True).sum().backward()
    xr = x.clone().requires_grad_()
    naive_ssd(xr, F.softplus(dt_raw + dt_bias), A, B, C, D)[0].sum().backward()
    report("mamba_chunk_scan_combined backward", xg.grad, xr.grad, 1e-2)

    # One decoding step (Triton), continuing the state the recurrence left.
    state = last.clone()
    xt, dtt = torch.randn(b, h, p, device=dev), torch.randn(b, h, device=dev) - 1
    Bt, Ct = torch.randn(b, g, n, device=dev), torch.randn(b, g, n, device=dev)
    out = selective_state_update(state, xt, dtt[..., None].expand(b, h, p), A[:, None, None].expand(h, p, n), Bt, Ct,
                                 D=D[:, None].expand(h, p), dt_bias=dt_bias[:, None].expand(h, p), dt_softplus=True)
    y2, s2 = naive_ssd(torch.cat([x, xt[:, None]], 1), F.softplus(torch.cat([dt_raw, dtt[:, None]], 1) + dt_bias), A,
                       torch.cat([B, Bt[:, None]], 1), torch.cat([C, Ct[:, None]], 1), D)
    report("selective_state_update", out, y2[:, -1], 1e-3)
    report("selective_state_update (state)", state, s2, 1e-3)

    # Mamba-1 selective scan (the compiled selective_scan_cuda).
    bd, dd, ll, nn = 2, 64, 128, 8
    u, dl = torch.randn(bd, dd, ll, device=dev), torch.randn(bd, dd, ll, device=dev) - 1
    A1 = -torch.rand(dd, nn, device=dev) - 0.5
    B1, C1 = torch.randn(bd, nn, ll, device=dev), torch.randn(bd, nn, ll, device=dev)
    D1, db1 = torch.randn(dd, device=dev), torch.rand(dd, device=dev) * 0.5
    y1 = selective_scan_fn(u, dl, A1, B1, C1, D=D1, delta_bias=db1, delta_softplus=True)
    report("selective_scan_fn", y1, naive_selective_scan(u, F.softplus(dl + db1[:, None]), A1, B1, C1, D1), 1e-3)

    # The fused training op transformers' Mamba-2 mixers call (conv + scan + gated norm + out proj), bf16 as in training.
    dim, ng, ds, nh, width = h * p, 1, 32, h, 4
    zxbcdt = torch.randn(b, l, 2 * dim + 2 * ng * ds + nh, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(dim + 2 * ng * ds, width, device=dev) * 0.3).bfloat16()
    bias = torch.randn(dim + 2 * ng * ds, device=dev).bfloat16()
    norm_w, out_w = torch.ones(dim, device=dev).bfloat16(), (torch.randn(64, dim, device=dev) / dim ** 0.5).bfloat16()
    dt_b16, D_b16 = dt_bias.bfloat16(), D.bfloat16()  # as a bf16 model passes them (A stays float32)
    kw = dict(chunk_size=64, rmsnorm_weight=norm_w, rmsnorm_eps=1e-6, outproj_weight=out_w, headdim=p, ngroups=ng,
              norm_before_gate=False)
    o = mamba_split_conv1d_scan_combined(zxbcdt, w, bias, dt_b16, A, D_b16, **kw)
    o.float().sum().backward()
    report("mamba_split_conv1d_scan_combined", o, mamba_split_conv1d_scan_ref(_strided8(zxbcdt.detach()), w, bias, dt_b16.float(), A, D_b16.float(), **kw),
           3e-2)
    print(f"     (its backward ran: grad finite {torch.isfinite(zxbcdt.grad).all().item()})", flush=True)

    # Mamba-1's fused block (causal-conv1d + selective_scan_cuda), against mamba-ssm's reference.
    dm, dr = 64, 4
    xz = torch.randn(bd, 2 * dm, ll, device=dev, requires_grad=True)
    cw, cb = torch.randn(dm, 1, 4, device=dev) * 0.3, torch.randn(dm, device=dev)
    xpw, dpw = torch.randn(dr + 2 * nn, dm, device=dev) / 8, torch.randn(dm, dr, device=dev) / 2
    opw = torch.randn(32, dm, device=dev) / 8
    Am = -torch.rand(dm, nn, device=dev) - 0.5
    mo = mamba_inner_fn(xz, cw, cb, xpw, dpw, opw, None, Am, D=D1[:dm], delta_bias=db1[:dm], delta_softplus=True)
    mo.sum().backward()
    report("mamba_inner_fn", mo, mamba_inner_ref(xz.detach(), cw, cb, xpw, dpw, opw, None, Am, D=D1[:dm],
                                                 delta_bias=db1[:dm], delta_softplus=True), 1e-2)
    print("all five mamba-ssm functions ran and match" if not failures else f"FAILED: {', '.join(failures)}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
