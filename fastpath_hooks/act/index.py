"""A prebuilt kernel wheel from a package index (PEP 503 / PEP 691), made local and hash-checked.

The policy names the exact version it wants, local label included (an index step:
`causal-conv1d==1.6.2.post1+cu.13.0.torch.2.11` at `https://<host>/simple/cu130/causal-conv1d/`,
decide/rules/compiled.py); here the project page is read - JSON (`application/vnd.pypi.simple.v1+json`,
api 1.x: `files[].filename/url/hashes.sha256`) or the HTML page (`<a href="URL#sha256=...">`) -
and the one file of that version whose tags fit this Python and platform is downloaded and checked
against the sha256 the index lists. A file without one is not taken; one whose bytes do not match
is deleted and refused (`IndexMiss`, one line), and the installer goes on to the step's fallback (the
next index, or the source build). Never offline (the policy does not plan it; this refuses too).
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

from .. import events
from ..facts.wheels import choose, wheel_version as _version_of
from .files import sha256_of

ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.latest+html;q=0.2, text/html;q=0.1"


class IndexMiss(Exception):
    """No usable file on the index (none of that version fits, the index is unreachable, a hash is
    missing or wrong); the message is one line that says which and where, `short` the same in
    words that fit a human line (the message is logged whole)."""

    def __init__(self, message: str, short: str | None = None):
        super().__init__(message)
        self.short = short or message


def fetch(step, settings, env, dest: str) -> str:
    """The local path of the index step's wheel, downloaded into `dest` and checked; IndexMiss otherwise."""
    from packaging.requirements import Requirement

    if settings.offline:
        raise IndexMiss(f"{step.url}: not asked, FASTPATH_HOOKS_OFFLINE=1")
    req = Requirement(step.requirements[0])
    want = next(iter(req.specifier)).version
    files = project_files(step.url, timeout=min(settings.timeout, 60))
    chosen = choose(files, req.name, want, python=env.python, arch=env.arch, glibc=env.glibc)
    host = urlsplit(step.url).netloc or step.url
    py = "cp" + "".join(env.python.split(".")[:2])
    if chosen is None:
        have = sorted({f["filename"] for f in files if _version_of(f["filename"]) is not None})[:4]
        raise IndexMiss(f"{step.url} has no {req.name} {want} wheel for {py} {env.platform}" +
                        (f" (it lists {', '.join(have)}{' ...' if len(files) > 4 else ''})" if have
                         else " (it lists no wheel)"),
                        f"the {host} index has no {want} wheel for {py} {env.platform}")
    sha = (chosen.get("hashes") or {}).get("sha256")
    if not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha)):
        raise IndexMiss(f"{chosen['filename']} on {step.url} has no sha256 on the index: not taken (it cannot be checked)",
                        f"the {host} index lists no sha256 for its {want} wheel: not taken, it cannot be checked")
    target = os.path.join(dest, chosen["filename"])
    events.status(f"downloading {chosen['url']}")
    try:
        with urllib.request.urlopen(chosen["url"], timeout=min(settings.timeout, 120)) as resp, open(target, "wb") as out:
            while True:
                chunk = resp.read(1 << 20)
                if not chunk:
                    break
                out.write(chunk)
        digest = sha256_of(target)
    except OSError as exc:
        _remove(target)
        raise IndexMiss(f"could not download {chosen['url']}: {exc}", f"could not download its wheel from {host}: {exc}") \
            from None
    if digest != sha:
        _remove(target)
        raise IndexMiss(f"{chosen['filename']} from {host}: sha256 {digest} does not match the index's {sha} "
                        "(a corrupt or substituted file); refused, nothing installed",
                        "the index's wheel fails its listed sha256 (corrupt or substituted): refused, nothing installed")
    return target


def project_files(url: str, *, timeout: float) -> list:
    """The files a project page lists: dicts with filename, url (absolute) and hashes."""
    request = urllib.request.Request(url, headers={"Accept": ACCEPT})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            body = resp.read(16 << 20)
            kind = resp.headers.get("Content-Type", "")
            base = resp.geturl()
    except OSError as exc:
        raise IndexMiss(f"could not read {url}: {exc}", f"could not read the {urlsplit(url).netloc or url} index: {exc}") \
            from None
    text = body.decode("utf-8", errors="replace")
    if "json" in kind or text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
            raw = data["files"]
        except (ValueError, KeyError, TypeError):
            raise IndexMiss(f"{url} is not a PEP 691 project page (no `files` list)",
                            f"the {urlsplit(url).netloc} index's page is not a PEP 691 one") from None
        out = []
        for item in raw if isinstance(raw, list) else ():
            if isinstance(item, dict) and isinstance(item.get("filename"), str) and isinstance(item.get("url"), str):
                hashes = item.get("hashes") if isinstance(item.get("hashes"), dict) else {}
                out.append({"filename": item["filename"], "url": urljoin(base, item["url"]), "hashes": hashes})
        return out
    parser = _Anchors()
    parser.feed(text)
    out = []
    for href, name in parser.links:
        link, _, fragment = href.partition("#")
        algo, _, digest = fragment.partition("=")
        filename = (name or "").strip() or os.path.basename(urlsplit(link).path)
        out.append({"filename": filename, "url": urljoin(base, link), "hashes": {algo: digest} if digest else {}})
    return out


class _Anchors(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list = []
        self._href = None
        self._text = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href = dict(attrs).get("href")
            self._text = []

    def handle_data(self, data):
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text)))
            self._href = None


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
