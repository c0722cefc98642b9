"""Stand-in hub kernels for transformers 5.25 (HF kernels' local layout, served through LOCAL_KERNELS).

A directory with `metadata.json` and `__init__.py` whose `layers` hold one nn.Module per function of a
kernels-community repo (a flash attention's: its functions, `attention_standin`). kernels checks a function layer against transformers' decorated function (the
number and kinds of the forward's parameters), so each forward is written from the signature the installed
transformers gives that function (`signatures`, read in the venv). The forward hands what transformers passed
to the stand-in packages' code (tests/support/wheels.py: plain torch, correct numbers) and counts its calls
in `CALLS`; `broken=True` makes it raise instead (a layer that must never run).
"""

from __future__ import annotations

import json
import os

from . import sdists, wheels

# what each repo's stand-in computes with: func_name -> the stand-in package function that computes it
REPOS = {
    "kernels-community/mamba-ssm": (5, {
        "causal_conv1d_fn": "causal_conv1d_fn", "causal_conv1d_update": "causal_conv1d_update",
        "mamba_chunk_scan_combined": "mamba_chunk_scan_combined",
        "mamba_split_conv1d_scan_combined": "mamba_split_conv1d_scan_combined",
        "selective_state_update": "selective_state_update", "selective_scan_fn": "selective_scan_fn",
        "mamba_inner_fn": "mamba_inner_fn"}),
    "kernels-community/fla": (3, {
        "chunk_gated_delta_rule": "chunk_gated_delta_rule", "recurrent_gated_delta_rule": "fused_recurrent_gated_delta_rule",
        "chunk_kimi_delta_attention": None, "recurrent_kimi_delta_attention": None}),
}
# the layer name in a repo -> the decorated function transformers maps to it (hub_kernels' mapping)
FUNCTION_OF_LAYER = {"recurrent_gated_delta_rule": "fused_recurrent_gated_delta_rule",
                     "chunk_kimi_delta_attention": "chunk_kda", "recurrent_kimi_delta_attention": "fused_recurrent_kda"}

# Read in a venv: {func_name: [[parameter, kind, has a default]]} of the torch function each decorated global wraps
SIGNATURES = r'''
import importlib, inspect, json, sys
from fastpath_hooks._names import DECORATED
out = {}


def decorated_function(fn):   # the function transformers' decorator made (under kernels: the one its Func calls)
    if getattr(fn, "__code__", None) is None:
        fn = inspect.getclosurevars(type(fn).forward).nonlocals["func"]
    return fn


for model in sys.argv[1:]:
    module = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    for name, (func, package) in DECORATED.items():
        if name in module.__dict__ and func not in out:
            torch_function = decorated_function(module.__dict__[name]).__wrapped__
            out[func] = [[p.name, p.kind.name, p.default is not inspect.Parameter.empty]
                         for p in inspect.signature(torch_function).parameters.values()]
print(json.dumps(out))
'''


def signatures(venv, models=("qwen3_5", "granitemoehybrid", "mamba", "kimi_linear")) -> dict:
    proc = venv.run(SIGNATURES, args=list(models), check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _sources(repo: str) -> str:
    """The stand-in packages' code as one module (their absolute imports of each other made local)."""
    if repo == "kernels-community/fla":
        return wheels._GDR.replace('CALLS = {"chunk": 0, "recurrent": 0, "flash_qla": 0}', "")
    files = wheels.mamba_ssm_files("2.3.2.post1")
    parts = []
    for path in ("mamba_ssm/ops/triton/ssd_combined.py", "mamba_ssm/ops/triton/selective_state_update.py",
                 "mamba_ssm/ops/selective_scan_interface.py"):
        text = files[path]
        for line in ("from mamba_ssm.ops._calls import CALLS\n",
                     "import selective_scan_cuda  # noqa: F401  (the compiled extension, as in the real module)\n"):
            text = text.replace(line, "")
        parts.append(text)
    # last: the scans' modules bind causal_conv1d_fn to None where the causal-conv1d package is missing
    parts.append(wheels.conv_module("1.7.0").replace('CALLS = {"fn": 0, "update": 0}', ""))
    return "\n".join(parts)


# as a hub kernel does: the keyword arguments transformers passes that the computation has no use for are dropped
_CALL = """

def _call(function, *args, **kwargs):
    params = inspect.signature(function).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return function(*args, **kwargs)
"""


def standin(dest: str, repo: str, sigs: dict, *, broken: bool = False) -> str:
    """Write the stand-in of `repo` into `dest` (a LOCAL_KERNELS directory) and return it."""
    version, layers = REPOS[repo]
    _metadata(dest, repo, version)
    body = ["import collections\nimport inspect\nimport torch\nfrom torch import nn\n\nCALLS = collections.Counter()\n",
            _sources(repo), _CALL, "\n\nclass layers:\n"]
    for layer, impl in layers.items():
        params = sigs.get(FUNCTION_OF_LAYER.get(layer, layer))
        if params is None:
            continue
        head, required, optional, rest = ["self"], [], [], []
        for pname, kind, default in params:
            if kind == "VAR_KEYWORD":
                head.append(f"**{pname}")
                rest.append(f"**{pname}")
            elif kind == "VAR_POSITIONAL":
                head.append(f"*{pname}")
                rest.append(f"*{pname}")
            elif default:
                head.append(f"{pname}=_MISSING")
                optional.append(pname)
            else:
                head.append(pname)
                required.append(pname)
        # what transformers passed, as the package gets it: the leading arguments by position, the others by name
        given = "{" + ", ".join(f"{n!r}: {n}" for n in optional) + "}"
        args = ", ".join(required + [f"**{{k: v for k, v in {given}.items() if v is not _MISSING}}"] + rest)
        if broken or impl is None:
            run = f"raise RuntimeError('stand-in hub kernel {layer} must not run here')"
        else:
            run = f"CALLS[{layer!r}] += 1\n            return _call({impl}, {args})"
        body.append(f"    class {layer}(nn.Module):\n"
                    f"        def forward({', '.join(head)}):\n"
                    f"            {run}\n\n")
    text = "_MISSING = object()\n" + "".join(body)
    with open(os.path.join(dest, "__init__.py"), "w") as fh:
        fh.write(text)
    return dest


def _metadata(dest: str, repo: str, version: int) -> None:
    os.makedirs(dest, exist_ok=True)
    name = repo.split("/")[1].replace("-", "_")
    with open(os.path.join(dest, "metadata.json"), "w") as fh:
        json.dump({"name": repo.split("/")[1], "id": f"_{name}_standin", "version": version, "license": "MIT",
                   "python-depends": [], "backend": {"type": "cuda"}}, fh)


# the flash attentions transformers 5.25 loads from the hub where the package is missing (its
# FLASH_ATTN_KERNEL_FALLBACK and FLASH_ATTN_KERNEL_VERSIONS)
ATTENTION_REPOS = {"kernels-community/flash-attn2": 4, "kernels-community/vllm-flash-attn3": 1}


def attention_standin(dest: str, repo: str, *, wrong: bool = False) -> str:
    """A flash attention hub kernel (module-level flash_attn_func / flash_attn_varlen_func, computing in torch as
    the stand-in packages do, counting its calls in CALLS) in `dest`; wrong=True: 0.5 off."""
    _metadata(dest, repo, ATTENTION_REPOS[repo])
    module = sdists.ATTENTION_MODULE.replace("WRONG_VALUE", repr(wrong)).replace("VERSION", f"{repo} (stand-in)")
    with open(os.path.join(dest, "__init__.py"), "w") as fh:
        fh.write(module)
    return dest
