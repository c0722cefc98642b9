"""The transformers models this process uses, read from sys.modules only (nothing is imported): the
model types whose modeling module is imported, and the head shapes (config class defaults) of the
gated-delta-rule models whose configuration module is."""

from __future__ import annotations

import sys


def imported_model_types() -> tuple:
    """The model types whose transformers modeling module this process has imported (or is importing: a
    kernel's decision runs inside that import), e.g. ("mamba2",): which families are in use, when known."""
    out = set()
    for name in list(sys.modules):
        if name.startswith("transformers.models."):
            parts = name.split(".")
            if len(parts) == 4 and parts[3] == f"modeling_{parts[2]}":
                out.add(parts[2])
    return tuple(sorted(out))


def model_shapes(pins, modules=None) -> tuple:
    """((model type, K, V, key heads, value heads), ...) of the models whose transformers configuration
    module is imported (a modeling module imports its own before it chooses its kernels): the class
    defaults of the config attributes the pins name (a backend's `head_dims.config`). Reads
    sys.modules only; a default that is not an int (derived at run time) is None."""
    attrs: dict = {}
    for spec in pins.kernels.values():
        if spec.head_dims is not None:
            for key, names in spec.head_dims.config.items():
                attrs.setdefault(key, [])
                attrs[key] += [n for n in names if n not in attrs[key]]
    if not attrs.get("k") or not attrs.get("v"):
        return ()
    modules = sys.modules if modules is None else modules
    out = []
    for name, module in list(modules.items()):
        parts = name.split(".")
        if len(parts) != 4 or parts[:2] != ["transformers", "models"] or not parts[3].startswith("configuration_"):
            continue
        for obj in list(vars(module).values()):
            if not isinstance(obj, type) or getattr(obj, "__module__", None) != name:
                continue
            values = []
            for key in ("k", "v", "heads_k", "heads_v"):
                found = next((getattr(obj, a) for a in attrs.get(key, ()) if hasattr(obj, a)), None)
                values.append(found if isinstance(found, int) and not isinstance(found, bool) else None)
            if not any(hasattr(obj, a) for a in attrs["k"]):
                continue
            row = (parts[2], *values)
            if row not in out:
                out.append(row)
    return tuple(sorted(out, key=str))
