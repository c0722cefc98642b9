"""Small fake kernel wheels, built with zipfile (real wheels: METADATA, WHEEL, RECORD).

The fakes behave like the real packages where the tests look: the module layout
transformers resolves (`fla.ops.gated_delta_rule.chunk_gated_delta_rule`,
`causal_conv1d.causal_conv1d_fn`, ...), signatures it inspects, versions it
reads, and - computed with plain torch - results a forward/backward can use.
Misbehaviour is baked in per wheel: an fla whose import raises, a tilelang that
aborts the process when paired with a broken apache-tvm-ffi.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile


def _dist_name(name: str) -> str:
    return name.replace("-", "_")


def build_wheel(dest: str, name: str, version: str, files: dict, *, requires=(), tag: str = "py3-none-any",
                filename: str | None = None) -> str:
    """Write `{name}-{version}-{tag}.whl` with `files` (path -> text) and return its path."""
    os.makedirs(dest, exist_ok=True)
    dist = _dist_name(name)
    info = f"{dist}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", "Summary: fake kernel for fastpath-hooks tests"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    contents = dict(files)
    contents[f"{info}/METADATA"] = "\n".join(meta) + "\n"
    contents[f"{info}/WHEEL"] = f"Wheel-Version: 1.0\nGenerator: fastpath-hooks-tests\nRoot-Is-Purelib: true\nTag: {tag}\n"
    tops = sorted({p.split("/", 1)[0] for p in files if not p.endswith(".dist-info")})
    contents[f"{info}/top_level.txt"] = "\n".join(t[:-3] if t.endswith(".py") else t for t in tops) + "\n"
    record_lines = []
    for path, text in contents.items():
        data = text.encode() if isinstance(text, str) else text
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record_lines.append(f"{path},sha256={digest},{len(data)}")
    record_lines.append(f"{info}/RECORD,,")
    contents[f"{info}/RECORD"] = "\n".join(record_lines) + "\n"
    path = os.path.join(dest, filename or f"{dist}-{version}-{tag}.whl")
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name_, text in contents.items():
            zf.writestr(name_, text)
    return path


def sha256_of(path: str) -> str:
    """The tests' own digest of a file (hashlib's file_digest: not the package's reading)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


# -- fla ---------------------------------------------------------------------------

_GDR = '''
"""Fake fla gated delta rule: a float32 torch recurrence with fla's signature. Its chunk entry point
dispatches like fla 0.6.0's backend registry (fla/backends.py, ops/gated_delta_rule/backends/flash_qla.py):
to flash_qla whenever find_spec("flash_qla") finds it (cached, as fla's find_spec_cached) and FLA_FLASH_QLA
is not 0, for calls its verifier accepts (bf16/fp16, q/k/v one dtype, K = V = 128; the GPU-arch test is left
out: a CPU poses the GPU) - without catching flash_qla's import or JIT errors."""
import functools
import importlib.util
import logging
import os

import torch

CALLS = {"chunk": 0, "recurrent": 0, "flash_qla": 0}
FAKE_FLA = True
WRONG = False   # a build that computes wrongly: its output 1.5 times fla's (fake_fla(broken="wrong"))
logger = logging.getLogger("fla.backends")
_find_spec_cached = functools.cache(importlib.util.find_spec)


def _flash_qla_verifier(q, k, v):
    if q.dtype not in (torch.float16, torch.bfloat16):
        return False, f"FlashQLA requires dtype float16 or bfloat16, got {q.dtype}"
    if not (q.dtype == k.dtype == v.dtype):
        return False, "FlashQLA requires q, k, v to have the same dtype"
    if q.shape[-1] != 128:
        return False, f"FlashQLA requires K=128, got {q.shape[-1]}"
    if v.shape[-1] != 128:
        return False, f"FlashQLA requires V=128, got {v.shape[-1]}"
    return True, None


def _flash_qla(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens):
    """The backend's turn, or None: availability, the switch, the verifier - then the call, unguarded."""
    if _find_spec_cached("flash_qla") is None or os.environ.get("FLA_FLASH_QLA", "1") == "0":
        return None
    accepted, reason = _flash_qla_verifier(q, k, v)
    if not accepted:
        logger.info("[FLA Backend] gated_delta_rule.chunk_gated_delta_rule -> flash_qla rejected: %s", reason)
        return None
    import flash_qla

    CALLS["flash_qla"] += 1
    return flash_qla.chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, scale=scale, initial_state=initial_state,
                                            output_final_state=output_final_state,
                                            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
                                            auto_cp=True)


def _run(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel):
    dtype = v.dtype
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q = torch.nn.functional.normalize(q, dim=-1)
        k = torch.nn.functional.normalize(k, dim=-1)
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[-1]
    if HV != H:
        q = q.repeat_interleave(HV // H, dim=2)
        k = k.repeat_interleave(HV // H, dim=2)
    scale = K ** -0.5 if scale is None else scale
    q = q * scale
    state = q.new_zeros(B, HV, K, V) if initial_state is None else initial_state.float()
    outs = []
    for t in range(T):
        state = state * g[:, t].exp()[..., None, None]
        kt, vt = k[:, t], v[:, t]
        delta = (vt - torch.einsum("bhk,bhkv->bhv", kt, state)) * beta[:, t][..., None]
        state = state + kt[..., None] * delta[..., None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    out = torch.stack(outs, dim=1).to(dtype)
    return out, (state if output_final_state else None)


def _log(q, k, v, output_final_state, cu_seqlens):
    """Each call's facts as a JSON line in $FAKE_FLA_LOG (tests read what a check ran, and in which process)."""
    path = os.environ.get("FAKE_FLA_LOG")
    if path:
        import json
        import sys

        with open(path, "a") as fh:
            fh.write(json.dumps({"pid": os.getpid(), "argv0": sys.argv[0][-40:], "heads_k": k.shape[2],
                                 "heads_v": v.shape[2], "K": k.shape[3], "V": v.shape[3], "T": q.shape[1],
                                 "dtype": str(q.dtype), "final_state": bool(output_final_state),
                                 "varlen": cu_seqlens is not None}) + "\\n")


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           cu_seqlens=None, use_qk_l2norm_in_kernel=False, **kwargs):
    _log(q, k, v, output_final_state, cu_seqlens)
    out = _flash_qla(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens)
    if out is not None:
        return out
    CALLS["chunk"] += 1
    bounds = [0, q.shape[1]] if cu_seqlens is None else [int(b) for b in cu_seqlens]
    parts = [_run(*(x[:, a:b] for x in (q, k, v, g, beta)), scale, initial_state, output_final_state,
                  use_qk_l2norm_in_kernel) for a, b in zip(bounds, bounds[1:])]   # packed rows: each document alone
    out = torch.cat([o for o, _ in parts], dim=1)
    state = torch.cat([s for _, s in parts]) if output_final_state else None
    return (out * 1.5 if WRONG else out), state


def fused_recurrent_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                                     cu_seqlens=None, use_qk_l2norm_in_kernel=False):
    CALLS["recurrent"] += 1
    return _run(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel)
'''

_MODULES = '''
"""Fake fla.modules: FusedRMSNormGated in plain torch."""
import torch


class FusedRMSNormGated(torch.nn.Module):
    FAKE_FLA = True

    def __init__(self, hidden_size, eps=1e-5, activation="swish", device=None, dtype=None, **kwargs):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))

    def forward(self, x, g=None, **kwargs):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = self.weight * x.to(dtype)
        if g is not None:
            x = x * torch.nn.functional.silu(g.float()).to(dtype)
        return x
'''


# fla 0.6.0's fla/layers/mamba2.py (and mamba.py, mamba3.py): an optional import of mamba_ssm
_FLA_MAMBA2 = '''
try:
    from mamba_ssm.ops.triton.selective_state_update import selective_state_update
except ImportError:
    selective_state_update = None
'''


def fake_fla(dest: str, version: str = "0.6.0", *, broken: str | None = None, padding_files: int = 0,
             check_seconds: float = 0) -> list[str]:
    """fla-core + flash-linear-attention at `version`.

    broken="raise": `import fla` raises ImportError (a bad install); "wrong": its gated delta rule computes wrongly.
    padding_files: extra small modules, to make an install take measurable time (crash tests).
    check_seconds: `import fla.modules` (what the check imports, not `import fla`) takes this long (waiters).
    """
    # as fla 0.6.0: the package root loads the layers (flash-linear-attention's), whose Mamba layers try mamba_ssm
    init = f'__version__ = "{version}"\nFAKE_FLA = True\ntry:\n    import fla.layers  # noqa: F401\nexcept ImportError:\n    pass\n'
    if broken == "raise":
        init += 'raise ImportError("fake fla {0}: broken on purpose (tests)")\n'.format(version)
    files = {
        "fla/__init__.py": init,
        "fla/ops/__init__.py": "from .gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule\n",
        "fla/ops/gated_delta_rule/__init__.py": _GDR.replace("WRONG = False", f"WRONG = {broken == 'wrong'}"),
        "fla/modules/__init__.py": (f"import time\ntime.sleep({check_seconds})\n" if check_seconds else "") + _MODULES,
    }
    for i in range(padding_files):
        files[f"fla/_padding/m{i:05d}.py"] = f"X = {i}\n" + "# padding\n" * 200
    core = build_wheel(dest, "fla-core", version, files, requires=("einops",))
    layers = build_wheel(dest, "flash-linear-attention", version,
                         {"fla/layers/__init__.py": "FAKE_LAYERS = True\nfrom . import mamba2  # noqa: F401\n",
                          "fla/layers/mamba2.py": _FLA_MAMBA2},
                         requires=(f"fla-core=={version}",))
    return [core, layers]


# -- flash-qla --------------------------------------------------------------------------

_QLA = '''
"""Stand-in flash-qla VERSION: fla's chunk_gated_delta_rule backend, computed in torch (float64, so it
differs from fla's own float32 path by rounding only). As the real one, `import flash_qla` imports tilelang
(its JIT). Baked-in misbehaviour (tests): MODE = "ok" | "jit" (the first call raises, as a failed nvcc
JIT) | "import" (the import raises, as on a GPU it does not support) | "wrong" (a wrong output)."""
import torch

import tilelang  # noqa: F401

__version__ = "VERSION"
MODE = "MODE_VALUE"
CALLS = {"chunk": 0}
FAKE_FLASH_QLA = True
if MODE == "import":
    raise ValueError("FlashQLA now support sm90, sm100, sm103, sm120 and sm121 only. Found compute version: 8.0")


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None, head_first=False, state_v_first=False,
                           auto_cp=True, **kwargs):
    CALLS["chunk"] += 1
    if MODE == "jit":
        raise RuntimeError("tilelang: nvcc fatal : Unsupported gpu architecture 'compute_90a' (stand-in)")
    dtype = v.dtype
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q = torch.nn.functional.normalize(q, dim=-1)
        k = torch.nn.functional.normalize(k, dim=-1)
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[-1]
    if HV != H:
        q = q.repeat_interleave(HV // H, dim=2)
        k = k.repeat_interleave(HV // H, dim=2)
    q = q * (K ** -0.5 if scale is None else scale)
    state = q.new_zeros(B, HV, K, V) if initial_state is None else initial_state.double()
    outs = []
    for t in range(T):
        state = state * g[:, t].exp()[..., None, None]
        kt = k[:, t]
        delta = (v[:, t] - torch.einsum("bhk,bhkv->bhv", kt, state)) * beta[:, t][..., None]
        state = state + kt[..., None] * delta[..., None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    out = torch.stack(outs, dim=1)
    if MODE == "wrong":
        out = out * 1.1
    return out.to(dtype), (state.float() if output_final_state else None)
'''


def fake_flash_qla(dest: str, version: str = "0.1.3", *, mode: str = "ok") -> str:
    """flash-qla `version` (pure Python, Requires-Dist torch and tilelang, as the real wheel); `mode`: see _QLA."""
    body = _QLA.replace("MODE_VALUE", mode).replace("VERSION", version)
    return build_wheel(dest, "flash-qla", version, {"flash_qla/__init__.py": body},
                       requires=("torch>=2.8", "tilelang>=0.1.12"))


# -- causal-conv1d --------------------------------------------------------------------

_CONV = '''
"""Fake causal_conv1d with the real signatures, computed with torch.conv1d."""
import torch
import torch.nn.functional as F

__version__ = "VERSION"
CALLS = {"fn": 0, "update": 0}
FAKE_CAUSAL_CONV1D = True
OFFSET = 0.0   # a miscompiled build (causal-conv1d#105) returns numbers this far off: wrong=True


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                     final_states_out=None, activation=None):
    CALLS["fn"] += 1
    width = weight.shape[-1]
    out = F.conv1d(x, weight.unsqueeze(1), bias, padding=width - 1, groups=x.shape[1])[..., : x.shape[-1]]
    return (F.silu(out) if activation in ("silu", "swish") else out) + OFFSET


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None):
    CALLS["update"] += 1
    squeeze = x.dim() == 2
    if squeeze:
        x = x.unsqueeze(-1)
    state = torch.cat([conv_state, x], dim=-1)
    conv_state.copy_(state[..., -conv_state.shape[-1]:])
    out = torch.sum(state[..., -weight.shape[-1]:] * weight.unsqueeze(0), dim=-1)
    if bias is not None:
        out = out + bias
    out = F.silu(out) if activation in ("silu", "swish") else out
    return out if squeeze else out.unsqueeze(-1)
'''


def conv_module(version: str, *, wrong: bool = False) -> str:
    """The fake causal_conv1d/__init__.py; wrong=True: causal_conv1d_fn's results are 0.5 off (imports fine)."""
    body = _CONV.replace("VERSION", version)
    return body.replace("OFFSET = 0.0", "OFFSET = 0.5") if wrong else body


def fake_causal_conv1d(dest: str, filename: str, *, version: str = "1.6.2.post1", crash: bool = False,
                       wrong: bool = False) -> str:
    """A wheel with the release file name (e.g. causal_conv1d-1.6.2.post1+cu12torch2.10cxx11abiTRUE-cp311-...)."""
    stem = filename[: -len(".whl")]
    parts = stem.split("-")
    wheel_version, tag = parts[1], "-".join(parts[2:])
    body = conv_module(wheel_version, wrong=wrong)
    if crash:
        body = "import os\nos.abort()\n" + body
    return build_wheel(dest, "causal-conv1d", wheel_version, {"causal_conv1d/__init__.py": body},
                       tag=tag, filename=filename)


# -- tilelang / apache-tvm-ffi ------------------------------------------------------------

def fake_tvm_ffi(dest: str, version: str) -> str:
    return build_wheel(dest, "apache-tvm-ffi", version, {"tvm_ffi/__init__.py": f'__version__ = "{version}"\n'})


def fake_tilelang(dest: str, version: str, *, aborts_with=(), fails_with=(), always_abort: bool = False) -> str:
    """A tilelang that checks the installed apache-tvm-ffi like the real one's native library does:
    `aborts_with` versions kill the process (SIGABRT), `fails_with` versions raise ImportError."""
    body = (
        "import os\n"
        "import tvm_ffi\n"
        f'__version__ = "{version}"\n'
        f"_ABORTS = {tuple(aborts_with)!r}\n"
        f"_FAILS = {tuple(fails_with)!r}\n"
        f"if {always_abort!r} or tvm_ffi.__version__ in _ABORTS:\n"
        "    os.abort()\n"
        "if tvm_ffi.__version__ in _FAILS:\n"
        f'    raise ImportError("fake tilelang {version}: incompatible apache-tvm-ffi " + tvm_ffi.__version__)\n'
    )
    return build_wheel(dest, "tilelang", version, {"tilelang/__init__.py": body}, requires=("apache-tvm-ffi",))


def fake_tilelang_from_pins(dest: str, version: str, pins) -> str:
    """A fake tilelang whose bad partners are exactly the pins data's broken list."""
    aborts, fails = [], []
    for entry in pins.kernel("tilelang").broken:
        if entry.version != version or entry.arch != "*":
            continue
        (aborts if "abort" in entry.effect.lower() else fails).extend(entry.companions)
    return fake_tilelang(dest, version, aborts_with=aborts, fails_with=fails)


# -- a PEP 503 index on disk ----------------------------------------------------------------

def simple_index(wheel_dir: str, index_dir: str) -> str:
    """Write a file:// simple index of the wheels in `wheel_dir`; return its URL."""
    from packaging.utils import canonicalize_name, parse_wheel_filename

    by_name: dict = {}
    for fname in sorted(os.listdir(wheel_dir)):
        if fname.endswith(".whl"):
            name = canonicalize_name(parse_wheel_filename(fname)[0])
            by_name.setdefault(name, []).append(fname)
    os.makedirs(index_dir, exist_ok=True)
    with open(os.path.join(index_dir, "index.html"), "w") as fh:
        fh.write("<html><body>" + "".join(f'<a href="{n}/">{n}</a>' for n in by_name) + "</body></html>")
    for name, files in by_name.items():
        os.makedirs(os.path.join(index_dir, name), exist_ok=True)
        with open(os.path.join(index_dir, name, "index.html"), "w") as fh:
            links = "".join(
                f'<a href="file://{os.path.abspath(os.path.join(wheel_dir, f))}#sha256={sha256_of(os.path.join(wheel_dir, f))}">{f}</a>'
                for f in files)
            fh.write(f"<html><body>{links}</body></html>")
    return "file://" + os.path.abspath(index_dir) + "/"


# -- mamba-ssm ------------------------------------------------------------------------------

# The real wheels' Requires-Dist (read from the sdists' PKG-INFO): 2.3.2 / 2.3.2.post1 pin the
# Mamba-3 tilelang pair (guarded import); 2.3.1 declares neither.
MAMBA_REQUIRES = {
    "2.3.2.post1": ("torch", "tilelang==0.1.8", "apache-tvm-ffi<=0.1.9", "quack-kernels>=0.3.4", "triton>=3.5.0",
                    "ninja", "einops", "transformers", "packaging", "setuptools>=61.0.0"),
    "2.3.1": ("torch", "triton", "ninja", "einops", "transformers", "packaging", "setuptools>=61.0.0"),
}
MAMBA_REQUIRES["2.3.2"] = MAMBA_REQUIRES["2.3.2.post1"]

_MAMBA_INIT = '''
__version__ = "VERSION"
FAKE_MAMBA_SSM = True
# The real package imports its compiled selective_scan_cuda here (unconditionally).
from mamba_ssm.ops.selective_scan_interface import selective_scan_fn, mamba_inner_fn  # noqa: E402,F401
# the real root imports Mamba / Mamba2, whose modules load the triton ops: era B reaches them from the root
import mamba_ssm.ops.triton.selective_state_update  # noqa: E402,F401
import mamba_ssm.ops.triton.ssd_combined  # noqa: E402,F401
# as the real one, for its Mamba-3 kernels: a missing tilelang is fine, a broken one is not caught
try:
    import tilelang  # noqa: F401
except ImportError:
    pass
'''

_MAMBA_CALLS = '''
"""Counts of the fake kernels' calls (tests read these to see the kernel path ran)."""
CALLS = {"chunk_scan": 0, "split_conv1d_scan": 0, "state_update": 0, "selective_scan": 0, "inner": 0}
'''

_SSD = '''
"""Fake mamba_ssm.ops.triton.ssd_combined: the Mamba-2 scan as a float32 torch recurrence."""
import torch
import torch.nn.functional as F

from mamba_ssm.ops._calls import CALLS

try:   # as the real module: the split conv1d scan uses causal-conv1d when it is there
    from causal_conv1d import causal_conv1d_fn
except ImportError:
    causal_conv1d_fn = None

FAKE_MAMBA_SSM = True


def _dt(dt, dt_bias, dt_softplus, dt_limit):
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    if dt_softplus:
        dt = F.softplus(dt)
    lo, hi = dt_limit
    if lo > 0.0 or hi != float("inf"):
        dt = dt.clamp(min=lo, max=hi)
    return dt


def _scan(x, dt, A, B, C, D, z, initial_states):
    """x (b,l,h,p), dt (b,l,h) already processed, A (h), B/C (b,l,g,n) -> y (b,l,h,p), state (b,h,p,n)."""
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    xf = x.float()
    Bf = B.float().repeat_interleave(h // g, dim=2)
    Cf = C.float().repeat_interleave(h // g, dim=2)
    state = x.new_zeros(b, h, p, n, dtype=torch.float32) if initial_states is None else initial_states.float()
    outs = []
    for t in range(l):
        dA = torch.exp(dt[:, t] * A.float())                                     # (b,h)
        state = state * dA[..., None, None] + (dt[:, t][..., None] * xf[:, t])[..., None] * Bf[:, t][:, :, None, :]
        outs.append(torch.einsum("bhpn,bhn->bhp", state, Cf[:, t]))
    y = torch.stack(outs, dim=1)
    if D is not None:
        Df = D.float()
        y = y + (Df[..., None] if Df.dim() == 1 else Df) * xf
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(x.dtype), state


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, chunk_indices=None, chunk_offsets=None, cu_seqlens=None,
                              dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                              return_varlen_states=False):
    CALLS["chunk_scan"] += 1
    y, state = _scan(x, _dt(dt, dt_bias, dt_softplus, dt_limit), A, B, C, D, z, initial_states)
    return (y, state) if return_final_states else y


def mamba_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                                     initial_states=None, seq_idx=None, dt_limit=(0.0, float("inf")),
                                     return_final_states=False, activation="silu", rmsnorm_weight=None,
                                     rmsnorm_eps=1e-6, outproj_weight=None, outproj_bias=None, headdim=None,
                                     ngroups=1, norm_before_gate=True):
    CALLS["split_conv1d_scan"] += 1
    b, l, _ = zxbcdt.shape
    nheads = A.shape[0]
    dim = conv1d_weight.shape[0]                      # d_inner + 2 * ngroups * d_state
    d_inner = nheads * headdim if headdim is not None else (D.shape[0] if D.dim() > 1 else None)
    dstate = (dim - d_inner) // (2 * ngroups)
    z, xbc, dt = torch.split(zxbcdt, [d_inner, dim, nheads], dim=-1)
    width = conv1d_weight.shape[-1]
    if causal_conv1d_fn is not None:
        weight = conv1d_weight if conv1d_weight.dim() == 2 else conv1d_weight[:, 0]
        xbc = causal_conv1d_fn(xbc.transpose(1, 2), weight, conv1d_bias, activation=activation).transpose(1, 2)
    else:
        xbc = F.conv1d(xbc.transpose(1, 2), conv1d_weight.unsqueeze(1) if conv1d_weight.dim() == 2 else conv1d_weight,
                       conv1d_bias, padding=width - 1, groups=dim)[..., :l].transpose(1, 2)
        if activation in ("silu", "swish"):
            xbc = F.silu(xbc)
    x, B, C = torch.split(xbc, [d_inner, ngroups * dstate, ngroups * dstate], dim=-1)
    p = d_inner // nheads
    y, state = _scan(x.reshape(b, l, nheads, p), _dt(dt, dt_bias, True, dt_limit), A,
                     B.reshape(b, l, ngroups, dstate), C.reshape(b, l, ngroups, dstate), D,
                     None, initial_states)
    y = y.reshape(b, l, d_inner).float()
    if rmsnorm_weight is not None:
        zf = F.silu(z.float())
        if not norm_before_gate:
            y = y * zf
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + rmsnorm_eps) * rmsnorm_weight.float()
        if norm_before_gate:
            y = y * zf
    else:
        y = y * F.silu(z.float())
    y = y.to(zxbcdt.dtype)
    if outproj_weight is not None:
        y = F.linear(y, outproj_weight, outproj_bias)
    return (y, state) if return_final_states else y
'''

_STATE_UPDATE = '''
"""Fake mamba_ssm.ops.triton.selective_state_update: one recurrent step in torch, state updated in place."""
import torch
import torch.nn.functional as F

from mamba_ssm.ops._calls import CALLS

FAKE_MAMBA_SSM = True


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None, pad_slot_id=-1, out=None, **kwargs):
    CALLS["state_update"] += 1
    heads = state.dim() == 4
    if not heads:                                       # (b, d, n): one "head"
        state, x, dt, A, B, C = state[:, None], x[:, None], dt[:, None], A[None], B[:, None], C[:, None]
        D = D[None] if D is not None else None
        z = z[:, None] if z is not None else None
        dt_bias = dt_bias[None] if dt_bias is not None else None
    h = state.shape[1]
    g = B.shape[1]
    dtf = dt.float() + (dt_bias.float() if dt_bias is not None else 0.0)
    if dt_softplus:
        dtf = F.softplus(dtf)
    Bf = B.float().repeat_interleave(h // g, dim=1)     # (b,h,n)
    Cf = C.float().repeat_interleave(h // g, dim=1)
    dA = torch.exp(dtf[..., None] * A.float())          # (b,h,p,n)
    new = state.float() * dA + (dtf * x.float())[..., None] * Bf[:, :, None, :]
    state.copy_(new.to(state.dtype))
    y = torch.einsum("bhpn,bhn->bhp", new, Cf)
    if D is not None:
        y = y + D.float() * x.float()
    if z is not None:
        y = y * F.silu(z.float())
    y = y.to(x.dtype)
    if not heads:
        y = y[:, 0]
    if out is not None:
        out.copy_(y)
    return y
'''

_SELECTIVE = '''
"""Fake mamba_ssm.ops.selective_scan_interface: Mamba-1's selective scan (the reference recurrence)."""
import selective_scan_cuda  # noqa: F401  (the compiled extension, as in the real module)
import torch
import torch.nn.functional as F
from einops import rearrange   # the real module's runtime need (mamba-ssm's pins: runtime_deps)

from mamba_ssm.ops._calls import CALLS

try:   # as the real module: mamba_inner_fn uses causal-conv1d when it is there
    from causal_conv1d import causal_conv1d_fn
except ImportError:
    causal_conv1d_fn = None

FAKE_MAMBA_SSM = True


def _selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                    return_last_state=False):
    dtype = u.dtype
    u, delta = u.float(), delta.float()
    if delta_bias is not None:
        delta = delta + delta_bias[..., None].float()
    if delta_softplus:
        delta = F.softplus(delta)
    b, d, l = u.shape
    n = A.shape[1]

    def per_step(M):                                      # (d,n) | (b,n,l) | (b,g,n,l) -> (b|1, d|1, n, l|1)
        M = M.float()
        if M.dim() == 2:
            return M[None, :, :, None]
        if M.dim() == 3:
            return M[:, None]
        return M.repeat_interleave(d // M.shape[1], dim=1)

    Bf, Cf = per_step(B), per_step(C)
    state = u.new_zeros(b, d, n)
    ys = []
    for t in range(l):
        dA = torch.exp(delta[:, :, t, None] * A.float())
        Bt, Ct = Bf[..., min(t, Bf.shape[-1] - 1)], Cf[..., min(t, Cf.shape[-1] - 1)]
        state = state * dA + delta[:, :, t, None] * Bt * u[:, :, t, None]
        ys.append((state * Ct).sum(-1))
    y = torch.stack(ys, dim=2)
    if D is not None:
        y = y + u * D.float()[:, None]
    if z is not None:
        y = y * F.silu(z.float())
    y = y.to(dtype)
    return (y, state) if return_last_state else y


def selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                      return_last_state=False):
    CALLS["selective_scan"] += 1
    return _selective_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)


def mamba_inner_fn(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight,
                   out_proj_bias, A, B=None, C=None, D=None, delta_bias=None, B_proj_bias=None,
                   C_proj_bias=None, delta_softplus=True, checkpoint_lvl=1, b_rms_weight=None,
                   c_rms_weight=None, dt_rms_weight=None, b_c_dt_rnorm_eps=1e-6):
    CALLS["inner"] += 1
    l = xz.shape[-1]
    d_state = A.shape[-1]
    delta_rank = delta_proj_weight.shape[1]
    x, z = xz.chunk(2, dim=1)
    width = conv1d_weight.shape[-1]
    if causal_conv1d_fn is not None:
        weight = rearrange(conv1d_weight, "d 1 w -> d w") if conv1d_weight.dim() == 3 else conv1d_weight
        x = causal_conv1d_fn(x, weight, conv1d_bias, activation="silu")
    else:
        weight = conv1d_weight if conv1d_weight.dim() == 3 else conv1d_weight.unsqueeze(1)
        x = F.silu(F.conv1d(x, weight, conv1d_bias, padding=width - 1, groups=x.shape[1])[..., :l])
    x_dbl = F.linear(rearrange(x, "b d l -> (b l) d"), x_proj_weight)      # (b*l, r + 2n)
    delta = rearrange(F.linear(x_dbl[:, :delta_rank], delta_proj_weight), "(b l) d -> b d l", l=l)
    B = rearrange(x_dbl[:, delta_rank:delta_rank + d_state], "(b l) n -> b n l", l=l) if B is None else B
    C = rearrange(x_dbl[:, -d_state:], "(b l) n -> b n l", l=l) if C is None else C
    y = _selective_scan(x, delta, A, B, C, D, z, delta_bias, delta_softplus)
    return F.linear(y.transpose(1, 2), out_proj_weight, out_proj_bias)
'''


_SELECTIVE_OPT_IN = (
    "try:   # mamba-ssm main (#977): the CUDA extension is built only with MAMBA_KEEP_CUDA_BUILD=TRUE\n"
    "    import selective_scan_cuda  # noqa: F401\n"
    "except ImportError:\n"
    "    selective_scan_cuda = None\n")


def mamba_ssm_files(version: str, *, opt_in_cuda: bool = False) -> dict:
    """The stand-in `mamba_ssm` package (path -> text); wheels and the stand-in sdist share it.
    opt_in_cuda: selective_scan_cuda is optional (the Mamba-1 functions raise at their first call)."""
    selective = _SELECTIVE
    if opt_in_cuda:
        selective = selective.replace("import selective_scan_cuda  # noqa: F401  (the compiled extension, as in the real module)\n",
                                      _SELECTIVE_OPT_IN)
        for fn in ("def selective_scan_fn(", "def mamba_inner_fn("):
            head = selective.index(fn)
            body = selective.index("\n    CALLS[", head)
            selective = (selective[:body] + "\n    if selective_scan_cuda is None:\n        raise RuntimeError("
                         "\"selective_scan_cuda is not built (MAMBA_KEEP_CUDA_BUILD=TRUE builds it)\")" + selective[body:])
    return {
        "mamba_ssm/__init__.py": _MAMBA_INIT.replace("VERSION", version),
        "mamba_ssm/ops/__init__.py": "",
        "mamba_ssm/ops/_calls.py": _MAMBA_CALLS,
        "mamba_ssm/ops/triton/__init__.py": "",
        "mamba_ssm/ops/triton/ssd_combined.py": _SSD,
        "mamba_ssm/ops/triton/selective_state_update.py": _STATE_UPDATE,
        "mamba_ssm/ops/selective_scan_interface.py": selective,
        # as the real wheel: a fused layer norm transformers 4.57's kernels/falcon_mamba imports, and the
        # top-level compiled extension
        "mamba_ssm/ops/triton/layer_norm.py": '"""Stand-in fused layer norm."""\nFAKE_MAMBA_SSM = True\n\n\n'
                                              'def _layer_norm_fwd(*args, **kwargs):\n'
                                              '    raise NotImplementedError("stand-in mamba_ssm")\n',
        "selective_scan_cuda.py": '"""Stand-in of mamba-ssm\'s compiled extension module."""\nFAKE_MAMBA_SSM = True\n',
    }


def mamba_ssm_wheel(dest: str, version: str = "2.3.2.post1", *, filename: str | None = None,
                    requires=None, crash: bool = False) -> str:
    """A stand-in mamba-ssm wheel: the five kernel functions transformers imports, in plain torch.

    Its metadata declares the real release's Requires-Dist (MAMBA_REQUIRES: 2.3.2.post1 pins
    tilelang==0.1.8 and apache-tvm-ffi<=0.1.9), unless `requires` says otherwise. `filename`: a
    release-style name (mamba_ssm-2.3.2.post1+cu12torch2.10cxx11abiTRUE-cp311-cp311-linux_x86_64.whl);
    default py3-none-any. crash=True: `import mamba_ssm` aborts the process (a broken build).
    """
    if requires is None:
        requires = MAMBA_REQUIRES.get(version, MAMBA_REQUIRES["2.3.2.post1"])
    files = mamba_ssm_files(version)
    tag = "py3-none-any"
    if filename:
        stem = filename[: -len(".whl")]
        parts = stem.split("-")
        version, tag = parts[1], "-".join(parts[2:])
        files["mamba_ssm/__init__.py"] = _MAMBA_INIT.replace("VERSION", version)
    if crash:
        files["mamba_ssm/__init__.py"] = "import os\nos.abort()\n" + files["mamba_ssm/__init__.py"]
    return build_wheel(dest, "mamba-ssm", version, files, requires=tuple(requires), tag=tag, filename=filename)
