"""The Mamba / state-space families of transformers: what each era binds, and the table of
docs/transformers.md made from what tests/test_mamba_families.py observed on the real transformers.

Read from the released sources (`pip download --no-deps transformers==X`, then `ast`):
- era A, 4.57.6: module-level `if is_mamba_ssm_available() / is_mamba_2_ssm_available() /
  is_causal_conv1d_available(): from mamba_ssm... / from causal_conv1d import ...` blocks;
  mamba and falcon_mamba cache the causal-conv1d pair in `_causal_conv1d_cache` at the first layer.
- era B, 5.14.1: the names each mixer's `__init__` declares `global` and binds from
  `lazy_load_kernel("causal-conv1d")` / `lazy_load_kernel("mamba-ssm")`.
- era C, 5.24.0: the module globals made by `use_kernel_func_from_hub_with_fallback(func, package)`.
"""

from __future__ import annotations

import ast

FAMILIES = ("mamba", "falcon_mamba", "mamba2", "jamba", "bamba", "falcon_h1", "granitemoehybrid", "nemotron_h",
            "zamba", "zamba2")
ERAS = {"A": "4.57.6", "B": "5.14.1", "C": "latest"}
# One family per era for the late pass (install() after the modeling import): Granite-4.0-H's where it
# chooses at import or construction alike; era A's bamba binds its two scans only when the gate says yes.
LATE_FAMILY = {"A": "bamba", "B": "granitemoehybrid", "C": "granitemoehybrid"}
ABSENT = {("A", "nemotron_h")}   # NemotronH arrived in transformers 5.0

_CONV = ("causal_conv1d_fn", "causal_conv1d_update")
_SSM1 = ("selective_state_update", "selective_scan_fn", "mamba_inner_fn")
_SSM2 = ("selective_state_update", "mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined")
_FALCON_B = ("selective_state_update", "selective_scan_fn", "falcon_mamba_inner_fn")

# Eras A/B: the module globals a family binds behind the gates (era A's `_causal_conv1d_cache` stands for
# the causal-conv1d pair it caches).
GATED = {
    "A": {"mamba": _SSM1 + ("_causal_conv1d_cache",), "falcon_mamba": _SSM1 + ("_causal_conv1d_cache",),
          "mamba2": _SSM2 + _CONV, "jamba": _SSM1 + _CONV, "zamba": _SSM1 + _CONV, "zamba2": _SSM2 + _CONV,
          "bamba": _SSM2 + _CONV, "falcon_h1": _SSM2 + _CONV, "granitemoehybrid": _SSM2 + _CONV},
    "B": {"mamba": _CONV + _SSM1, "falcon_mamba": _CONV + _FALCON_B, "mamba2": _CONV + _SSM2, "jamba": _CONV + _SSM1,
          "zamba": _CONV + _SSM1, "zamba2": _CONV + _SSM2, "bamba": _CONV + _SSM2, "falcon_h1": _CONV + _SSM2,
          "granitemoehybrid": _CONV + _SSM2, "nemotron_h": _CONV + _SSM2},
}
# Era B's falcon_mamba asks lazy_load_kernel("falcon_mamba-ssm"): no `is_falcon_mamba_ssm_available` gate
# exists, so without the hub's `kernels` these stay None whatever is installed.
NEVER_ASKED = {("B", "falcon_mamba"): _FALCON_B}

_DECO_CONV = {"causal_conv1d_update": ("causal_conv1d_update", "causal_conv1d"),
              "causal_conv1d_fn": ("causal_conv1d_fn", "causal_conv1d")}
_DECO_SSM1 = {"mamba_inner_fn": ("mamba_inner_fn", "mamba_ssm"),
              "mamba_selective_state_update": ("selective_state_update", "mamba_ssm"),
              "mamba_selective_scan": ("selective_scan_fn", "mamba_ssm")}
_DECO_SSM2 = {"mamba2_split_conv1d_scan_combined": ("mamba_split_conv1d_scan_combined", "mamba_ssm"),
              "mamba2_selective_state_update": ("selective_state_update", "mamba_ssm"),
              "mamba2_chunk_scan": ("mamba_chunk_scan_combined", "mamba_ssm")}
# Eras C/D (the newest tested: 5.25.0): module global -> (func_name, package) of its decorator. 5.25 no longer
# decorates jamba's and falcon_mamba's mamba_inner_fn (5.24.0 did).
_SSM1_NO_INNER = {k: v for k, v in _DECO_SSM1.items() if k != "mamba_inner_fn"}
DECORATED = {
    "mamba": {**_DECO_CONV, **_DECO_SSM1}, "falcon_mamba": {**_DECO_CONV, **_SSM1_NO_INNER},
    "jamba": {**_DECO_CONV, **_SSM1_NO_INNER},
    "zamba": {**_DECO_CONV, "mamba_selective_state_update": _DECO_SSM1["mamba_selective_state_update"],
              "mamba_selective_scan": _DECO_SSM1["mamba_selective_scan"]},
    **{f: {**_DECO_CONV, **_DECO_SSM2} for f in ("mamba2", "bamba", "falcon_h1", "granitemoehybrid", "nemotron_h",
                                                 "zamba2")},
}

KERNEL_OF_PACKAGE = {"mamba_ssm": "mamba-ssm", "causal_conv1d": "causal-conv1d"}


def kernel_of_package(package: str) -> str:
    return KERNEL_OF_PACKAGE[package]


def expected_gated(era: str, family: str) -> dict:
    """Eras A/B: each gated name -> the kernel it must be bound to after install() (None: never asked)."""
    names = []
    for name in GATED[era][family]:
        names += list(_CONV[::-1]) if name == "_causal_conv1d_cache" else [name]
    never = NEVER_ASKED.get((era, family), ())
    return {n: None if n in never else "causal-conv1d" if n in _CONV else "mamba-ssm" for n in names}


def decorated_in_source(path: str) -> dict:
    """Module global -> (func_name, package) for every use_kernel_func_from_hub_with_fallback in a modeling
    file: `@deco(func, package)` functions and `x = deco(func, package)(torch_x)` assignments."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())

    def args(call):
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "use_kernel_func_from_hub_with_fallback":
            return tuple(a.value for a in call.args[:2])
        return None

    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                if args(deco):
                    out[node.name] = args(deco)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and args(node.value.func):
            out[node.targets[0].id] = args(node.value.func)
    return out


# -- the table in docs/transformers.md ---------------------------------------------------------------

BEGIN, END = "<!-- mamba-families:begin (made by tests/test_mamba_families.py) -->", "<!-- mamba-families:end -->"
COLUMNS = (("A", "4.57.x: at modeling import (gates)"), ("B", "5.0 - 5.14: at model construction (`lazy_load_kernel`)"),
           ("C", "5.15 - {latest}: at modeling import (decorated functions; 5.25+: hub kernels first at from_pretrained)"))
KERNELS = ("causal-conv1d", "mamba-ssm")


def cell(choice) -> str:
    """One family in one era, from what was observed: the kernels its functions resolved to, and the
    functions left on the torch path (by transformers, whatever is installed)."""
    if choice == "absent":
        return "not in this version"
    kernels = sorted({kind for kind in choice.values() if kind in KERNELS})
    text = " + ".join(kernels) if kernels else "torch path"
    rest = sorted(name for name, kind in choice.items() if kind not in KERNELS)
    if kernels and rest:
        text += f" (torch path: {', '.join(f'`{n}`' for n in rest)})"
    return text


def table(observed: dict, latest: str | None = None) -> str:
    """observed: era -> family -> the choice the test saw. A markdown table between the markers."""
    if latest is None:
        from . import venvs

        latest = venvs.latest_transformers() or "newest"
    head = "| family | " + " | ".join(title.format(latest=latest) for _, title in COLUMNS) + " |"
    lines = [BEGIN, head, "|" + "---|" * (len(COLUMNS) + 1)]
    for family in FAMILIES:
        lines.append(f"| {family} | " + " | ".join(cell(observed[era][family]) for era, _ in COLUMNS) + " |")
    lines.append(END)
    return "\n".join(lines)


def documented_table(text: str) -> str | None:
    """The table block of a document (markers included), or None when it has none."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < 0:
        return None
    return text[start:end + len(END)]
