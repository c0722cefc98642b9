"""Write the registry index from facts/pins.json into the sources that must not parse it.

install(), the start-up hand-over and the gates read the kernels' names without loading pins.json (a JSON
parse at every start): _registry.REGISTRY, _names' KERNELS / KERNEL_MODULES / SERVES / ASKED and the watched
names of hooks/startup.py are generated here from the pins' `kernels` entries. After changing a kernel in
pins.json run `python tools/registry_index.py`; tests/test_registry.py runs it with --check.

usage: registry_index.py [--check] [--root DIR]   (DIR: the directory holding fastpath_hooks; default the repo)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

BEGIN = "# -- generated from facts/pins.json by tools/registry_index.py: do not edit --\n"
END = "# -- end of generated --\n"


def lit(value) -> str:
    """`value` (str, None, tuple, dict of those) as a Python literal with double quotes."""
    if isinstance(value, tuple):
        return "(" + ", ".join(map(lit, value)) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{lit(k)}: {lit(v)}" for k, v in value.items()) + "}"
    return json.dumps(value) if isinstance(value, str) else repr(value)


def packed(head: str, items: list, tail: str, indent: int) -> str:
    """`head` + items joined by ", " + `tail`, wrapped at 116 columns with continuation lines at `indent`."""
    lines, line = [], head
    for i, item in enumerate(items):
        piece = item + (", " if i < len(items) - 1 else tail)
        if len(line) + len(piece.rstrip()) > 116 and line.strip():
            lines.append(line.rstrip())
            line = " " * indent
        line += piece
    return "\n".join(lines + [line]) + "\n"


def dict_literal(name: str, mapping: dict) -> str:
    return packed(f"{name} = {{", [f"{lit(k)}: {lit(v)}" for k, v in mapping.items()], "}", len(name) + 4)


def blocks(root: str) -> dict:
    """path -> the text of its generated block, from the pins at `root`."""
    sys.path.insert(0, root)
    from fastpath_hooks import _registry
    from fastpath_hooks.hooks import activation

    with open(os.path.join(root, "fastpath_hooks", "facts", "pins.json"), encoding="utf-8") as fh:
        registry = _registry.from_pins_data(json.load(fh)["kernels"])
    names = (f"KERNELS = {lit(_registry.listed(registry))}\n" + dict_literal("KERNEL_MODULES", _registry.kernel_modules(registry))
             + dict_literal("SERVES", _registry.served_modules(registry))
             + dict_literal("ASKED", {k: e["attn_implementation"] for k, e in registry.items()
                                      if e.get("attn_implementation")}))
    index = "".join(packed(f"    {lit(kernel)}: {{", [f"{lit(k)}: {lit(v)}" for k, v in entry.items()], "},",
                           len(kernel) + 9) for kernel, entry in registry.items())
    return {"fastpath_hooks/_registry.py": "REGISTRY = {\n" + index + "}\n",
            "fastpath_hooks/_names.py": names,
            "fastpath_hooks/hooks/startup.py": activation.watched_line(_registry.watched_modules(registry))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a generated block is stale")
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = parser.parse_args(argv)
    os.environ.pop("FASTPATH_HOOKS_PINS", None)   # the shipped kernels only
    stale = []
    for rel, block in blocks(args.root).items():
        path = os.path.join(args.root, rel)
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        if rel.endswith("startup.py"):
            new = re.sub(r"^.*# _names\.WATCHED\n", lambda m: block, text, count=1, flags=re.M)
        else:
            head, rest = text.split(BEGIN)
            new = head + BEGIN + block + END + rest.split(END, 1)[1]
        if new != text:
            stale.append(rel)
            if not args.check:
                with open(path, "w", encoding="utf-8") as fh:
                    fh.write(new)
    if stale and args.check:
        print(f"stale: {', '.join(stale)}; run `python tools/registry_index.py`", file=sys.stderr)
        return 1
    for rel in stale:
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
