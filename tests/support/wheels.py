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
    meta = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", "Summary: fake kernel for fastpath-hooks tests"]
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
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# -- fla ---------------------------------------------------------------------------

_GDR = '''
"""Fake fla gated delta rule: a float32 torch recurrence with fla's signature."""
import torch

CALLS = {"chunk": 0, "recurrent": 0}
FAKE_FLA = True


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


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           cu_seqlens=None, use_qk_l2norm_in_kernel=False):
    CALLS["chunk"] += 1
    return _run(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel)


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


def fake_fla(dest: str, version: str = "0.6.0", *, broken: str | None = None, padding_files: int = 0) -> list[str]:
    """fla-core + flash-linear-attention at `version`.

    broken="raise": `import fla` raises ImportError (a bad install).
    padding_files: extra small modules, to make an install take measurable time (crash tests).
    """
    init = f'__version__ = "{version}"\nFAKE_FLA = True\n'
    if broken == "raise":
        init += 'raise ImportError("fake fla {0}: broken on purpose (tests)")\n'.format(version)
    files = {
        "fla/__init__.py": init,
        "fla/ops/__init__.py": "from .gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule\n",
        "fla/ops/gated_delta_rule/__init__.py": _GDR,
        "fla/modules/__init__.py": _MODULES,
    }
    for i in range(padding_files):
        files[f"fla/_padding/m{i:05d}.py"] = f"X = {i}\n" + "# padding\n" * 200
    core = build_wheel(dest, "fla-core", version, files, requires=("einops",))
    layers = build_wheel(dest, "flash-linear-attention", version,
                         {"fla/layers/__init__.py": "FAKE_LAYERS = True\n"},
                         requires=(f"fla-core=={version}",))
    return [core, layers]


# -- causal-conv1d --------------------------------------------------------------------

_CONV = '''
"""Fake causal_conv1d with the real signatures, computed with torch.conv1d."""
import torch
import torch.nn.functional as F

__version__ = "VERSION"
CALLS = {"fn": 0, "update": 0}
FAKE_CAUSAL_CONV1D = True


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                     final_states_out=None, activation=None):
    CALLS["fn"] += 1
    width = weight.shape[-1]
    out = F.conv1d(x, weight.unsqueeze(1), bias, padding=width - 1, groups=x.shape[1])[..., : x.shape[-1]]
    return F.silu(out) if activation in ("silu", "swish") else out


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


def fake_causal_conv1d(dest: str, filename: str, *, version: str = "1.6.2.post1", crash: bool = False) -> str:
    """A wheel with the release file name (e.g. causal_conv1d-1.6.2.post1+cu12torch2.10cxx11abiTRUE-cp311-...)."""
    stem = filename[: -len(".whl")]
    parts = stem.split("-")
    wheel_version, tag = parts[1], "-".join(parts[2:])
    body = _CONV.replace("VERSION", wheel_version)
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
    for entry in pins.tilelang_broken:
        if entry.tilelang != version or entry.arch != "*":
            continue
        (aborts if "abort" in entry.effect.lower() else fails).extend(entry.tvm_ffi)
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


# -- mamba-ssm --------------------------------------------------------------------------

# The real package's layout where transformers looks (read from the mamba-ssm 2.3.2.post1 sdist): the root
# re-exports selective_scan_fn / mamba_inner_fn and loads the triton ops (era B reads them there); selective_scan_interface imports
# the compiled `selective_scan_cuda` and triton.layer_norm (so does transformers 4.57's kernels/falcon_mamba).
# The functions keep their real names and count their calls; they compute nothing (resolution tests).
_MAMBA_FUNCTION = '''
def NAME(*args, **kwargs):
    CALLS["NAME"] += 1
    raise NotImplementedError("stand-in mamba_ssm: NAME is resolved, not computed")
'''


def _mamba_module(doc: str, names, head: str = "") -> str:
    body = f'"""{doc}"""\n{head}CALLS = {{{", ".join(f"{n!r}: 0" for n in names)}}}\nFAKE_MAMBA_SSM = True\n'
    return body + "".join(_MAMBA_FUNCTION.replace("NAME", n) for n in names)


def mamba_ssm_wheel(dest: str, version: str = "2.3.2.post1", *, requires=(), tag: str = "py3-none-any",
                    filename: str | None = None) -> str:
    """A stand-in mamba-ssm wheel: mamba_ssm.ops.triton.ssd_combined (mamba_chunk_scan_combined,
    mamba_split_conv1d_scan_combined), .ops.triton.selective_state_update, .ops.selective_scan_interface
    (selective_scan_fn, mamba_inner_fn), the root's `__version__` and re-exports, and the top-level
    `selective_scan_cuda` extension module the real wheel ships."""
    files = {
        # the real root imports Mamba / Mamba2, whose modules load ops.triton.selective_state_update and
        # ssd_combined: era B reaches them from the root by attribute (`resolve_internal_import`)
        "mamba_ssm/__init__.py": (f'__version__ = "{version}"\nFAKE_MAMBA_SSM = True\n\n'
                                  "from mamba_ssm.ops.selective_scan_interface import selective_scan_fn, mamba_inner_fn\n"
                                  "import mamba_ssm.ops.triton.selective_state_update  # noqa: F401\n"
                                  "import mamba_ssm.ops.triton.ssd_combined  # noqa: F401\n"),
        "mamba_ssm/ops/__init__.py": "",
        "mamba_ssm/ops/triton/__init__.py": "",
        "mamba_ssm/ops/triton/ssd_combined.py": _mamba_module(
            "Stand-in Mamba-2 chunked scans.", ("mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined")),
        "mamba_ssm/ops/triton/selective_state_update.py": _mamba_module(
            "Stand-in decoding step.", ("selective_state_update",)),
        "mamba_ssm/ops/triton/layer_norm.py": _mamba_module("Stand-in fused layer norm.", ("_layer_norm_fwd",)),
        "mamba_ssm/ops/selective_scan_interface.py": _mamba_module(
            "Stand-in selective scan (Mamba-1).", ("selective_scan_fn", "mamba_inner_fn"),
            head="import selective_scan_cuda  # noqa: F401  (the compiled extension, as in the real module)\n"
                 "from mamba_ssm.ops.triton.layer_norm import _layer_norm_fwd  # noqa: F401\n"),
        "selective_scan_cuda.py": '"""Stand-in of mamba-ssm\'s compiled extension module."""\nFAKE_MAMBA_SSM = True\n',
    }
    return build_wheel(dest, "mamba-ssm", version, files, requires=tuple(requires), tag=tag, filename=filename)
