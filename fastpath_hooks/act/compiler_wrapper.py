"""The compiler wrapper of a source build (run as a script; stdlib only, imports nothing of the package).

torch's ninja build takes the host compiler from `CXX` and nvcc (hipcc on ROCm) from `PYTORCH_NVCC`;
act/build.py points them at a two-line `/bin/sh` shim that runs this file with a JSON config:

    {"real": ["/usr/local/cuda/bin/nvcc"], "kind": "nvcc" | "hipcc" | "cxx",
     "keep": ["sm_90"] or null, "std": "c++20" or null}

- `keep` (nvcc): only the `-gencode`/`--generate-code` pairs whose code is one of these archs are
  handed on (the sdists hard-code one pair per arch the nvcc knows and ignore TORCH_CUDA_ARCH_LIST).
- `std`: every `-std`/`--std` the sdist passes is dropped (nvcc refuses two) - for nvcc also those
  it would forward with `-Xcompiler`/`--compiler-options` - and `-std=<std>` is appended LAST to
  every compile (`-c`, `-E`, ...; a link or `-v` is left alone), whatever the sdist hard-codes.

Each change is said on stderr (the build's log), one line per call, starting with MARK: the build
labels its wheel from what these lines say was kept (not from what was asked).
"""

from __future__ import annotations

import json
import os
import sys

MARK = "fastpath-hooks nvcc wrapper:"       # the arch lines (act/build.py reads them back)
STD_MARK = "fastpath-hooks compiler wrapper:"
_COMPILE_FLAGS = ("-c", "--compile", "-E", "-S", "-dc", "--device-c", "-fsyntax-only", "-cuda", "--cuda")
_STD_PREFIXES = ("-std=", "--std=")


def codes(spec: str) -> set:
    """'arch=compute_90,code=sm_90' or 'arch=compute_90,code=[sm_90,compute_90]' -> {'sm_90'}."""
    _, _, code = spec.partition("code=")
    out = set()
    for item in code.strip("[]\"'").split(","):
        item = item.strip().strip("[]\"'").replace("compute_", "sm_")
        while item and item[-1].isalpha() and not item.endswith("sm_"):
            item = item[:-1]   # sm_90a / sm_100f: the family
        if item:
            out.add(item)
    return out


def filter_gencode(args: list, keep) -> tuple:
    """(args without the pairs of other archs, kept pairs, dropped pairs)."""
    out, kept, dropped, i = [], [], [], 0
    while i < len(args):
        arg = args[i]
        for flag in ("-gencode", "--generate-code"):
            if arg == flag and i + 1 < len(args):
                pair, pieces, i = args[i + 1], [arg, args[i + 1]], i + 2
                break
            if arg.startswith(flag + "="):
                pair, pieces, i = arg[len(flag) + 1:], [arg], i + 1
                break
        else:
            out.append(arg)
            i += 1
            continue
        if codes(pair) & set(keep):
            out.extend(pieces)
            kept.append(pair)
        else:
            dropped.append(pair)
    return out, kept, dropped


def _host_parts(value: str) -> tuple:
    """A -Xcompiler value without its -std parts: (what is left, the dropped parts)."""
    parts = value.split(",")
    left = [p for p in parts if not p.strip().startswith(_STD_PREFIXES)]
    return ",".join(left), [p for p in parts if p not in left]


def strip_std(args: list, nvcc: bool) -> tuple:
    """(args without any C++ standard option, the options dropped)."""
    out, dropped, i = [], [], 0
    while i < len(args):
        arg = args[i]
        if arg in ("-std", "--std") and i + 1 < len(args):     # nvcc's `-std c++17`
            dropped.append(f"{arg} {args[i + 1]}")
            i += 2
            continue
        if arg.startswith(_STD_PREFIXES):
            dropped.append(arg)
            i += 1
            continue
        if nvcc and arg in ("-Xcompiler", "--compiler-options") and i + 1 < len(args):
            left, gone = _host_parts(args[i + 1])
            dropped += [f"{arg} {g}" for g in gone]
            if left:
                out += [arg, left]
            i += 2
            continue
        if nvcc and arg.startswith(("-Xcompiler=", "--compiler-options=")):
            flag, _, value = arg.partition("=")
            left, gone = _host_parts(value)
            dropped += [f"{flag} {g}" for g in gone]
            if left:
                out.append(f"{flag}={left}")
            i += 1
            continue
        out.append(arg)
        i += 1
    return out, dropped


def rewrite(args: list, config: dict) -> tuple:
    """(the argv handed to the real compiler, the lines to say)."""
    kind, keep, std = config.get("kind"), config.get("keep"), config.get("std")
    said = []
    if keep is not None and kind == "nvcc":
        args, kept, dropped = filter_gencode(args, keep)
        if dropped and not kept:
            raise SystemExit(f"{MARK} none of the -gencode pairs {dropped} is for {', '.join(keep)}")
        if kept or dropped:
            said.append(f"{MARK} kept {' '.join(kept)}; dropped {' '.join(dropped) or 'none'}")
    if std:
        args, dropped = strip_std(args, nvcc=kind == "nvcc")
        if dropped or any(a in _COMPILE_FLAGS for a in args):
            args = args + [f"-std={std}"]
            said.append(f"{STD_MARK} {kind} gets -std={std} last"
                        f"{' (dropped ' + ', '.join(dropped) + ')' if dropped else ''}")
    return args, said


def main(argv: list) -> None:
    with open(argv[1], encoding="utf-8") as fh:
        config = json.load(fh)
    try:
        args, said = rewrite(argv[2:], config)
    except SystemExit as exc:
        sys.stderr.write(f"{exc}\n")
        sys.exit(2)
    for line in said:
        sys.stderr.write(line + "\n")
    sys.stderr.flush()
    real = list(config["real"])
    os.execvp(real[0], real + args)


if __name__ == "__main__":
    main(sys.argv)
