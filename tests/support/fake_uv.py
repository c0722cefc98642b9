"""A stand-in `uv` for fast installer and transaction tests: `uv pip install ...` into FAKE_UV_SITE.

It does what an installer does to a site directory, in milliseconds: `name==version` gets a
dist-info directory (METADATA, RECORD, top_level.txt) and a module `name_module/__init__.py`
that says its version; a wheel file is unpacked as a wheel is; an installed other version of
the same distribution (or one named by --reinstall-package) is removed first, files and all.
Misbehaviour on request, as real installers show it:

- FAKE_UV_FAIL=name: `name` is half written (its files, no dist-info) and the call exits 1;
- FAKE_UV_ALSO=name==version: that distribution comes along (a resolver pulling a dependency);
- FAKE_UV_LOG=path: one JSON line per call - the argv and the constraints file's lines.

`install_fake_uv(directory)` writes it as an executable `uv` there and returns its path.
"""

import json
import os
import shutil
import sys
import zipfile

VALUE_FLAGS = {"--python", "--only-binary", "--reinstall-package", "--constraints", "--index-url", "--find-links"}


def install_fake_uv(directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "uv")
    with open(__file__, encoding="utf-8") as fh:
        source = fh.read()
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(f"#!{sys.executable} -SE\n" + source)   # one shebang argument
    os.chmod(path, 0o755)
    return path


def _stem(name: str) -> str:
    return name.replace("-", "_").replace(".", "_").lower()


def _remove(site: str, name: str) -> None:
    for entry in os.listdir(site):
        if entry.endswith(".dist-info") and _stem(entry.rsplit("-", 1)[0]) == _stem(name):
            info = os.path.join(site, entry)
            try:
                with open(os.path.join(info, "RECORD"), encoding="utf-8") as fh:
                    for line in fh:
                        rel = line.split(",")[0]
                        target = os.path.join(site, rel)
                        if rel and os.path.isfile(target):
                            os.unlink(target)
            except OSError:
                pass
            shutil.rmtree(info, ignore_errors=True)


def _write(site: str, name: str, version: str, *, half: bool = False) -> None:
    _remove(site, name)
    module = _stem(name) + "_module"
    files = {f"{module}/__init__.py": f"__version__ = {version!r}\n"}
    for rel, text in files.items():
        os.makedirs(os.path.join(site, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(site, rel), "w", encoding="utf-8") as fh:
            fh.write(text)
    if half:
        return
    info = os.path.join(site, f"{_stem(name)}-{version}.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as fh:
        fh.write(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    with open(os.path.join(info, "top_level.txt"), "w", encoding="utf-8") as fh:
        fh.write(module + "\n")
    base = os.path.basename(info)
    with open(os.path.join(info, "RECORD"), "w", encoding="utf-8") as fh:
        fh.write("".join(f"{rel},,\n" for rel in files) + f"{base}/METADATA,,\n{base}/top_level.txt,,\n{base}/RECORD,,\n")


def _unpack(site: str, wheel: str) -> None:
    name = os.path.basename(wheel).split("-")[0]
    _remove(site, name)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)


def main(argv) -> int:
    site = os.environ["FAKE_UV_SITE"]
    args, i, values = [], 0, {}
    while i < len(argv):
        arg = argv[i]
        if arg in VALUE_FLAGS:
            values.setdefault(arg, []).append(argv[i + 1])
            i += 2
            continue
        if not arg.startswith("-"):
            args.append(arg)
        i += 1
    if args[:2] != ["pip", "install"]:
        print(f"error: the stand-in uv only does `pip install`, not {args[:2]}", file=sys.stderr)
        return 2
    requirements = args[2:]
    log = os.environ.get("FAKE_UV_LOG")
    if log:
        lines = []
        for path in values.get("--constraints", []):
            with open(path, encoding="utf-8") as fh:
                lines += [ln.strip() for ln in fh if ln.strip()]
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"argv": argv, "requirements": requirements, "constraints": lines}) + "\n")
    for name in values.get("--reinstall-package", []):
        _remove(site, name)
    also = os.environ.get("FAKE_UV_ALSO")
    if also:
        requirements = requirements + [also]
    fail = os.environ.get("FAKE_UV_FAIL")
    for req in requirements:
        if req.endswith(".whl"):
            _unpack(site, req)
            continue
        name, _, version = req.partition("==")
        if not version:
            continue    # a range (a dependency already satisfied here): nothing to do
        if fail and _stem(name) == _stem(fail):
            _write(site, name, version, half=True)
            print(f"error: Failed to install {name}=={version}: disk quota exceeded (stand-in)", file=sys.stderr)
            return 1
        _write(site, name, version)
    print(f"Installed {len(requirements)} packages (stand-in)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
