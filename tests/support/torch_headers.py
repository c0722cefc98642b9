"""torch's C++ headers of a release the index has no CPU build of (2.14.1: only the ~555 MB CUDA wheel),
fetched once without downloading the wheel: three HTTP range requests on PyPI's file (the zip's end
record, its central directory, then the one contiguous span holding every torch/include/ member -
about 11 MB for 2.14.1), each member inflated and checked against the central directory's CRC-32.
Cached under $XDG_CACHE_HOME/fastpath-hooks-tests (default ~/.cache), so later runs read the disk.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import urllib.request
import zipfile
import zlib

_UA = {"User-Agent": "fastpath-hooks-tests"}


class Unreachable(Exception):
    """PyPI (or the file host) cannot be reached: the caller skips, saying so."""


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fastpath-hooks-tests")


def torch_include(version: str, timeout: float = 120) -> str:
    """The torch/include directory of torch `version` (cached); Unreachable when the network is not there."""
    dest = os.path.join(cache_dir(), f"torch-{version}-headers")
    include = os.path.join(dest, "torch", "include")
    if os.path.isfile(os.path.join(dest, "COMPLETE")):
        return include
    url = _wheel_url(version, timeout)
    tmp = dest + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    _extract_include(url, tmp, timeout)
    with open(os.path.join(tmp, "COMPLETE"), "w") as fh:
        fh.write(url + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return include


def _get(url: str, timeout: float, byte_range: str | None = None, accept: str | None = None) -> bytes:
    headers = dict(_UA)
    if accept:
        headers["Accept"] = accept
    if byte_range:
        headers["Range"] = f"bytes={byte_range}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
            if byte_range and resp.status != 206:
                raise Unreachable(f"{url} ignores range requests (HTTP {resp.status})")
            return resp.read()
    except OSError as exc:   # URLError, timeouts, DNS
        raise Unreachable(f"{url}: {exc}") from None


def _wheel_url(version: str, timeout: float) -> str:
    """The first manylinux x86_64 wheel of that release, from PyPI's simple index (PEP 691 JSON)."""
    data = json.loads(_get("https://pypi.org/simple/torch/", timeout, accept="application/vnd.pypi.simple.v1+json"))
    names = [f for f in data["files"] if f["filename"].startswith(f"torch-{version}-") and f["filename"].endswith(".whl")
             and "manylinux" in f["filename"] and "x86_64" in f["filename"]]
    if not names:
        raise Unreachable(f"torch {version} has no manylinux x86_64 wheel on PyPI")
    return sorted(names, key=lambda f: f["filename"])[0]["url"]


def _extract_include(url: str, dest: str, timeout: float) -> None:
    tail = _get(url, timeout, "-65536")
    end = tail.rfind(b"PK\x05\x06")
    _, _, _, _, count, cd_size, cd_offset, _ = struct.unpack("<IHHHHIIH", tail[end:end + 22])
    directory = _get(url, timeout, f"{cd_offset}-{cd_offset + cd_size - 1}")
    # zipfile reads a central directory followed by its end record as an archive of its own
    fake = directory + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count, cd_size, 0, 0)
    members = [m for m in zipfile.ZipFile(io.BytesIO(fake)).infolist() if m.filename.startswith("torch/include/")]
    low = min(m.header_offset for m in members)
    last = max(members, key=lambda m: m.header_offset)
    high = last.header_offset + 30 + len(last.filename.encode()) + 1024 + last.compress_size   # the extra field's slack
    blob = _get(url, timeout, f"{low}-{high - 1}")
    for m in members:
        if m.filename.endswith("/"):
            continue
        at = m.header_offset - low
        name_len, extra_len = struct.unpack("<HH", blob[at + 26:at + 30])
        start = at + 30 + name_len + extra_len
        data = blob[start:start + m.compress_size]
        raw = zlib.decompress(data, -15) if m.compress_type == zipfile.ZIP_DEFLATED else data
        if zlib.crc32(raw) != m.CRC:
            raise ValueError(f"{m.filename}: CRC mismatch (a changed or truncated file)")
        path = os.path.join(dest, m.filename)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(raw)
