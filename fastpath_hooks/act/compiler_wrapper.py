"""The compiler wrapper of a source build (run as a script; stdlib only, nothing of the package).

act/build.py points torch's `PYTORCH_NVCC` and `CXX` at a shim running this with a JSON config: `keep` (nvcc: the
archs whose `-gencode` pairs stay, said after MARK), `std` (every `-std` dropped - nvcc refuses two - and
`-std=<std>` last), `split` (`--split-compile`), `launcher` (ccache, sccache), `calls` (a JSON line per compile),
`parts` (a file one compile cannot spread - causal-conv1d's backward - as N copies side by side, `ld -r` linked).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time

MARK = "fastpath-hooks nvcc wrapper:"       # the arch lines (act/build.py reads them back)
STD_MARK = "fastpath-hooks compiler wrapper:"
SPEED_MARK = "fastpath-hooks nvcc speed:"   # the split, the compiler cache, the seconds of one compile
_SPLIT_FLAGS = ("-c", "--compile", "-dc", "--device-c")
_COMPILE_FLAGS = ("-c", "--compile", "-E", "-S", "-dc", "--device-c", "-fsyntax-only", "-cuda", "--cuda")
_STD_PREFIXES = ("-std=", "--std=")
# one whole explicit instantiation on one line: `template void f<float>(P &p);` (not `template<...>`)
_INSTANTIATION = re.compile(r"^\s*template\s+(?!<)[^{};]*;\s*$")
_SOURCES = (".cu", ".cpp", ".cc", ".c", ".hip")


def codes(spec: str) -> set:
    """'arch=compute_90,code=[sm_90,compute_90]' -> {'sm_90'} (sm_90a, sm_100f: the family)."""
    _, _, code = spec.partition("code=")
    out = set()
    for item in code.strip("[]\"'").split(","):
        item = item.strip().strip("[]\"'").replace("compute_", "sm_")
        while item and item[-1].isalpha() and not item.endswith("sm_"):
            item = item[:-1]
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
    split = int(config.get("split") or 1)
    if kind == "nvcc" and split > 1 and any(a in _SPLIT_FLAGS for a in args) and \
            not any(a.startswith(("--split-compile", "-split-compile")) for a in args):
        args = args + [f"--split-compile={split}"]   # before -std, which stays last
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
    compiling = any(a in _SPLIT_FLAGS for a in args)   # not -E/-M/--version: nothing to cache or time
    launcher, calls = config.get("launcher"), config.get("calls")
    parts = _parts_for(args, config) if compiling else 1
    if parts > 1 and _in_parts(real, args, parts, config, [launcher] if launcher else []) == 0:
        sys.exit(0)
    if not compiling or not (launcher or calls):
        os.execvp(real[0], real + args)
    sys.exit(_timed([launcher] if launcher else [], real, args, config))


def _source(args: list) -> str | None:
    return next((a for a in args if a.endswith(_SOURCES) and not a.startswith("-")), None)


def _parts_for(args: list, config: dict) -> int:
    source = _source(args)
    if config.get("kind") != "nvcc" or source is None or "-o" not in args:
        return 1
    return max(1, int((config.get("parts") or {}).get(os.path.basename(source), 1)))


def split_source(text: str, parts: int) -> list:
    """Up to `parts` copies of a source, each with its share of the one-line explicit instantiations (the others
    blanked: line numbers stay); [] with fewer than two."""
    lines = text.split("\n")
    found = [i for i, line in enumerate(lines) if _INSTANTIATION.match(line)]
    if len(found) < 2:
        return []
    parts = min(parts, len(found))
    shares = [set(found[k::parts]) for k in range(parts)]   # interleaved: the heavy and the light ones spread evenly
    return ["\n".join("" if i in found and i not in mine else line for i, line in enumerate(lines)) for mine in shares]


def _in_parts(real: list, args: list, parts: int, config: dict, front: list) -> int:
    """Compile the file as parts side by side, linked into the object asked for; the exit status (not 0: nothing
    is left behind and the caller compiles the file whole)."""
    source = _source(args)
    obj = args[args.index("-o") + 1]
    try:
        with open(source, encoding="utf-8") as fh:
            texts = split_source(fh.read(), parts)
    except (OSError, UnicodeDecodeError):
        texts = []
    if not texts:
        return 1
    stem, ext = os.path.splitext(source)
    made, children, start = [], [], time.time()
    depfile = args[args.index("--dependency-output") + 1] if "--dependency-output" in args[:-1] else None
    try:
        for k, text in enumerate(texts):
            part_src, part_obj = f"{stem}.fph-part{k}{ext}", f"{obj}.fph-part{k}.o"
            made += [part_src, part_obj, part_obj + ".d"]
            with open(part_src, "w", encoding="utf-8") as fh:
                fh.write(text)
            argv = []
            for i, a in enumerate(args):
                prev = args[i - 1] if i else None
                argv.append(part_src if a == source else part_obj if prev == "-o" else
                            part_obj + ".d" if prev == "--dependency-output" else a)
            # the parts are the threads
            argv = [a for a in argv if not a.startswith(("--split-compile", "-split-compile"))]
            children.append(subprocess.Popen(front + real + argv))
        codes = [c.wait() for c in children]
        code = max(codes, key=abs)
        if code == 0:
            code = subprocess.call([config.get("ld") or "ld", "-r", "-o", obj] +
                                   [f"{obj}.fph-part{k}.o" for k in range(len(texts))])
        if code == 0 and depfile:
            with open(f"{obj}.fph-part0.o.d", encoding="utf-8") as fh:
                deps = fh.read().replace(f"{obj}.fph-part0.o", obj, 1).replace(f"{stem}.fph-part0{ext}", source)
            with open(depfile, "w", encoding="utf-8") as fh:
                fh.write(deps)
    except OSError as exc:
        sys.stderr.write(f"{SPEED_MARK} {source} in parts: {exc}\n")
        code = 1
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        for path in made:
            with contextlib.suppress(OSError):
                os.remove(path)
    said = "" if code == 0 else "; compiling it whole instead"
    _record(config, args, real, front, start, code, f"{len(texts)} parts side by side", said, split=1, parts=len(texts))
    return code


def _timed(front: list, real: list, args: list, config: dict) -> int:
    """One compile as a child (behind the compiler cache, if any), recorded."""
    command = front + real + args
    start = time.time()
    try:
        code = subprocess.call(command)
    except OSError as exc:
        sys.stderr.write(f"{SPEED_MARK} could not run {command[0]}: {exc}\n")
        code = 127
    split = next((int(a.partition("=")[2]) for a in args if a.startswith("--split-compile=")
                  and a.partition("=")[2].isdigit()), 1)
    how = (f"--split-compile={split}" if split > 1 else "no split") + \
        (f", {os.path.basename(front[0])}" if front else "")
    _record(config, args, real, front, start, code, how, split=split)
    return code


def _record(config: dict, args: list, real: list, front: list, start: float, code: int, how: str, said: str = "",
            **more) -> None:
    """One compile's line in the log and its JSON record (act/build.py reads them back)."""
    seconds, source = time.time() - start, _source(args) or "?"
    sys.stderr.write(f"{SPEED_MARK} {source} in {seconds:.1f} s ({how}), exit {code}{said}\n")
    sys.stderr.flush()
    if config.get("calls"):
        record = {"source": source, "seconds": round(seconds, 2), "real": real[0], "code": code, "argv": args,
                  "launcher": os.path.basename(front[0]) if front else None, "cwd": os.getcwd(),
                  "start": round(start, 2), **more}
        try:
            with open(config["calls"], "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
        except OSError:
            pass


if __name__ == "__main__":
    main(sys.argv)
